/* A linear layer over one or two float32 rows (a decode step's): y = x W^T (+ bias)
 * (+ residual), reading W [out, in] once, front to back, as one stream, each weight row
 * against every input row while it is in L1. Built and loaded by row_linear.py like paged_decode.c.
 *
 * Why: at one to a few rows a linear only streams its weight; oneDNN's matrix-vector kernel
 * (and its packed GEMM at a few rows) read SmolLM2-135M's 538 MB of fp32 weights at ~12.6
 * GB/s on one core of the development machine while a plain `sum` over them streams at
 * ~20.5 and this loop at ~19.7 (docs/inference-worker.md, thirteenth pass). Four or eight
 * weight rows at a time (streams 2 KB apart) read at 11-12 GB/s, and software prefetching
 * 1 KB ahead slowed this loop (15.1): one stream is what the hardware prefetcher follows best.
 *
 * Shapes (row-major, contiguous): w [out, in], x [rows, in], bias [out] or NULL, residual
 * [rows, out] or NULL, y [rows, out]. Each y[r, o] is one dot product in a fixed order,
 * whatever `rows` and `threads` are: a sequence's row gives the same bits alone or batched.
 * Rounding: ((w[o] . x[r]) + bias[o]) + residual[r, o], as the GEMM then its post-op add.
 * Returns 1 when rows is not in [1, MAX_ROWS]. */
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAX_ROWS 2 /* row_linear.py's MAX_ROWS: from three rows on oneDNN's packed GEMM is as fast */

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* sums[r] = w_row . x[r] for `rows` input rows (a compile-time constant once inlined). */
static ALWAYS_INLINE void dots(const float *restrict w_row, const float *restrict x, int in, int rows,
                               float *restrict sums) {
#if defined(__AVX512F__)
    if (in % 16 == 0) {
        __m512 acc[MAX_ROWS];
        for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
        for (int i = 0; i < in; i += 16) {
            const __m512 weights = _mm512_loadu_ps(w_row + i);
            for (int r = 0; r < rows; r++)
                acc[r] = _mm512_fmadd_ps(weights, _mm512_loadu_ps(x + (int64_t)r * in + i), acc[r]);
        }
        for (int r = 0; r < rows; r++) sums[r] = _mm512_reduce_add_ps(acc[r]);
        return;
    }
#endif
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * in;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < in; i++) sum += w_row[i] * xr[i];
        sums[r] = sum;
    }
}

static ALWAYS_INLINE void linear_rows(const float *restrict w, const float *restrict x,
                                      const float *restrict bias, const float *restrict residual,
                                      float *restrict y, int rows, int64_t out, int in, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t o = 0; o < out; o++) {
        float sums[MAX_ROWS];
        dots(w + o * in, x, in, rows, sums);
        for (int r = 0; r < rows; r++) {
            float value = sums[r];
            if (bias != NULL) value += bias[o];
            if (residual != NULL) value += residual[(int64_t)r * out + o];
            y[(int64_t)r * out + o] = value;
        }
    }
}

int linear_rows_f32(const float *w, const float *x, const float *bias, const float *residual, float *y,
                    int rows, int64_t out, int in, int threads) {
    switch (rows) { /* one copy per row count: the accumulators stay in registers */
    case 1: linear_rows(w, x, bias, residual, y, 1, out, in, threads); return 0;
    case 2: linear_rows(w, x, bias, residual, y, 2, out, in, threads); return 0;
    default: return 1;
    }
}
