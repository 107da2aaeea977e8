/* A vectorized e^x shared by paged_prefill.c (softmax) and layer_blocks.c (SiLU); included
 * (c_build.py hashes an included header with its source). */
#ifndef ATTNSTORE_VECTOR_EXP_H
#define ATTNSTORE_VECTOR_EXP_H
#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x for x <= 88 (above, 2^n overflows: callers clamp), 16 at a time: e^x = 2^n e^r,
 * n = round(x log2 e) (rounded by adding 1.5 * 2^23), r = x - n ln 2 (ln 2 in two parts), e^r by
 * Cephes' expf polynomial (relative error at most ~1e-7 on [-87, 88]; paged_decode.c's scalar
 * exp_nonpositive). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 big = _mm512_set1_ps(12582912.f);
    const __m512 shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), big);
    const __m512 n = _mm512_sub_ps(shifted, big);
    const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                     _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    const __m512i two_n = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B400000)),
                         _mm512_set1_epi32(127)),
        23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
}
#endif
#endif
