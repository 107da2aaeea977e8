/* The per-row arithmetic of row_ops.c, which layer_blocks.c and paged_prefill.c run too (included;
 * c_build.py hashes an included header with its source). Rounds like transformers' ops, op by
 * op (row_ops.c says how). */
#ifndef ATTNSTORE_ROW_OPS_H
#define ATTNSTORE_ROW_OPS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector_exp.h"

/* o = weight * (row * (1 / sqrt(sum(row * row) / dim + eps)))  (LlamaRMSNorm) */
static inline void rms_norm_row(const float *row, const float *weight, float *o, int dim, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < dim; d++) sum += row[d] * row[d];
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
    for (int d = 0; d < dim; d++) o[d] = weight[d] * (row[d] * scale);
}

/* RoPE's rotation of one pair of elements, x1 = x[i] and x2 = x[i + half], by cos, sin at i (c1,
 * s1) and i + half (c2, s2): x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; `back`
 * (a constant where inlined) rotates by the inverse (R^T x: the sines' signs flipped), which
 * paged_prefill.c applies to queries instead of rotating a re-positioned span's keys. */
static inline void rotate_pair(float x1, float x2, float c1, float s1, float c2, float s2, int back, float *o1,
                               float *o2) {
    *o1 = x1 * c1 + (back ? x2 : -x2) * s1;
    *o2 = x2 * c2 + (back ? -x1 : x1) * s2;
}

static inline void rotate(const float *x, const float *c, const float *s, float *o, int half) {
#pragma omp simd
    for (int i = 0; i < half; i++)
        rotate_pair(x[i], x[i + half], c[i], s[i], c[i + half], s[i + half], 0, o + i, o + i + half);
}

/* One token's q and k heads rotated into q_out, k_out ([heads][head_dim], [kv_heads][head_dim]),
 * and its rotated k and its v written at `slot` of the pool layer when k_pool is not NULL. */
static inline void rope_token(const float *q, const float *k, const float *v, const float *c, const float *s,
                              float *q_out, float *k_out, int heads, int kv_heads, int head_dim, float *k_pool,
                              float *v_pool, int64_t slot, int64_t pool_slots) {
    const int half = head_dim / 2;
    for (int h = 0; h < heads; h++) rotate(q + h * head_dim, c, s, q_out + h * head_dim, half);
    for (int h = 0; h < kv_heads; h++) {
        float *rotated = k_out + h * head_dim;
        rotate(k + h * head_dim, c, s, rotated, half);
        if (k_pool == NULL) continue;
        const int64_t at = ((int64_t)h * pool_slots + slot) * head_dim;
        memcpy(k_pool + at, rotated, sizeof(float) * (size_t)head_dim);
        memcpy(v_pool + at, v + h * head_dim, sizeof(float) * (size_t)head_dim);
    }
}

/* act = SiLU(gate) * up over n columns, as torch's x / (1 + exp(-x)) then the product; a column
 * is computed the same way whatever the row (a row gives the same bits alone or batched). gcc
 * calls the scalar expf here (it vectorizes it only under -ffast-math): ~9 ns a column, ~12%
 * of the block at 14 rows, so 16 columns at a time take exp16 (vector_exp.h) where the CPU has
 * AVX-512 (exp(-x) clamped to e^88: SiLU of x < -88 is ~0 either way). */
static inline void silu_mul(const float *gate, const float *up, float *act, int n) {
    int c = 0;
#if defined(__AVX512F__)
    for (; c + 16 <= n; c += 16) {
        const __m512 g = _mm512_loadu_ps(gate + c);
        const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(88.f)));
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(act + c, _mm512_mul_ps(s, _mm512_loadu_ps(up + c)));
    }
#endif
    for (; c < n; c++) act[c] = gate[c] / (1.0f + expf(-gate[c])) * up[c];
}
#endif
