/* The panel kernel of panel_linear.c (its comment says what and why), shared with the layer
 * blocks of layer_blocks.c (included; c_build.py hashes an included header with its source):
 * panel_columns computes one panel's output columns for every row. */
#ifndef ATTNSTORE_PANELS_H
#define ATTNSTORE_PANELS_H
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define PANEL 32 /* output columns a panel holds: panel_linear.py's PANEL */
#define MAX_ROWS 32 /* panel_linear.py's MAX_ROWS */
/* rows whose sums stay in registers: 14 x 2 sums, 2 weight vectors and a broadcast are 31 of the
 * 32 zmm registers; 14 rows in one tile read each panel once: 47.6 -> 35.7 ms for the 30 layers
 * at 14 rows against tiles of at most 12 (7 + 7) */
#define TILE_ROWS 14
#define K_BLOCK 64 /* inputs per partial sum (below) */
/* how far ahead of the FMAs the panel's bytes are asked for (at 16 rows, 30 layers: 1 KB 41.1,
 * 4 KB 41.1, 8 KB 39.8 ms) */
#define PREFETCH_BYTES 8192

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* y[r, o0 .. o0 + cols) for `rows` rows (a compile-time constant once inlined) from the
 * panel w [in][PANEL]. */
static ALWAYS_INLINE void tile(const float *restrict w, const float *restrict x, const float *restrict bias,
                               const float *restrict residual, float *restrict y, int rows, int64_t out,
                               int in, int64_t o0, int cols) {
    /* each sum is taken over blocks of K_BLOCK inputs, each block's partial added to a total:
     * a float sum's rounding grows with its length, and these run over up to 1,536 inputs */
    float totals[TILE_ROWS][PANEL] __attribute__((aligned(64))) = {{0}};
#if defined(__AVX512F__)
    for (int k0 = 0; k0 < in; k0 += K_BLOCK) {
        const int k1 = in - k0 < K_BLOCK ? in : k0 + K_BLOCK;
        __m512 acc[TILE_ROWS][2];
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int k = k0; k < k1; k++) {
            const float *wk = w + (int64_t)k * PANEL;
            _mm_prefetch((const char *)wk + PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)wk + PREFETCH_BYTES + 64, _MM_HINT_T0);
            const __m512 w0 = _mm512_load_ps(wk), w1 = _mm512_load_ps(wk + 16);
            for (int r = 0; r < rows; r++) {
                const __m512 b = _mm512_set1_ps(x[(int64_t)r * in + k]);
                acc[r][0] = _mm512_fmadd_ps(b, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(b, w1, acc[r][1]);
            }
        }
        for (int r = 0; r < rows; r++) {
            _mm512_store_ps(totals[r], _mm512_add_ps(_mm512_load_ps(totals[r]), acc[r][0]));
            _mm512_store_ps(totals[r] + 16, _mm512_add_ps(_mm512_load_ps(totals[r] + 16), acc[r][1]));
        }
    }
#else
    for (int k0 = 0; k0 < in; k0 += K_BLOCK) {
        const int k1 = in - k0 < K_BLOCK ? in : k0 + K_BLOCK;
        float block[TILE_ROWS][PANEL] = {{0}};
        for (int k = k0; k < k1; k++) {
            const float *wk = w + (int64_t)k * PANEL;
            for (int r = 0; r < rows; r++) {
                const float b = x[(int64_t)r * in + k];
#pragma omp simd
                for (int c = 0; c < PANEL; c++) block[r][c] += b * wk[c];
            }
        }
        for (int r = 0; r < rows; r++)
#pragma omp simd
            for (int c = 0; c < PANEL; c++) totals[r][c] += block[r][c];
    }
#endif
    for (int r = 0; r < rows; r++) {
        const float *sums = totals[r];
        for (int c = 0; c < cols; c++) {
            float value = sums[c];
            if (bias != NULL) value += bias[o0 + c];
            if (residual != NULL) value += residual[(int64_t)r * out + o0 + c];
            y[(int64_t)r * out + o0 + c] = value;
        }
    }
}

#define TILE_CASE(n) \
    case n: tile(w, x, bias, residual, y, n, out, in, o0, cols); break;

/* One panel's columns for `rows` rows (at most TILE_ROWS). */
static void panel(const float *w, const float *x, const float *bias, const float *residual, float *y, int rows,
                  int64_t out, int in, int64_t o0, int cols) {
    switch (rows) { /* one copy per row count: the sums stay in registers */
        TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
        TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12) TILE_CASE(13)
        TILE_CASE(14)
    default: break;
    }
}

/* Output columns [p * PANEL, (p + 1) * PANEL) of y for every row: the panel's work in either
 * entry below. `per_tile`: rows in each tile of registers (tile_rows). */
static void panel_columns(const float *wp, const float *x, const float *bias, const float *residual, float *y,
                          int rows, int64_t out, int in, int64_t p, int per_tile) {
    const int64_t o0 = p * PANEL;
    const int cols = out - o0 < PANEL ? (int)(out - o0) : PANEL;
    for (int r0 = 0; r0 < rows; r0 += per_tile) {
        const int n = rows - r0 < per_tile ? rows - r0 : per_tile;
        panel(wp + p * (int64_t)in * PANEL, x + (int64_t)r0 * in, bias,
              residual == NULL ? NULL : residual + (int64_t)r0 * out, y + (int64_t)r0 * out, n, out, in, o0,
              cols);
    }
}

/* Rows a tile takes: rows split into equal tiles (16 rows: 8 + 8, not 14 + 2), so that the panel
 * is read from DRAM by the first and from cache by the others. */
static int tile_rows(int rows) {
    const int tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    return (rows + tiles - 1) / tiles;
}

static int64_t panels_of(int64_t out) { return (out + PANEL - 1) / PANEL; }

#endif
