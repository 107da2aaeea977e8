/* A linear layer over a few float32 rows (3 to MAX_ROWS: a 16-sequence decode step, a short
 * prefill chunk): y = x W^T (+ bias) (+ residual), W read once, front to back, from a copy
 * packed in panels of PANEL output columns ([panels][in][PANEL], the last panel padded with
 * zeros), each panel against every input row while it is in cache. Built and loaded by
 * panel_linear.py like paged_decode.c.
 *
 * Why: at a few rows a linear mostly streams its weight from DRAM. oneDNN's packed GEMM at
 * 14-16 rows took ~46-52 ms of CPU for SmolLM2-135M's 30 layers (424 MB, 3 GFLOP) with the
 * weights cold against ~30 ms with them in cache; a plain `sum` streams the same bytes in
 * ~17 (docs/inference-worker.md, seventeenth pass). Here each panel is one contiguous
 * stream, asked for PREFETCH_BYTES ahead, while the FMAs of all rows run on the bytes
 * already in.
 *
 * Shapes (row-major, contiguous): wp as above, x [rows, in], bias [out] or NULL, residual
 * [rows, out] or NULL, y [rows, out]. Each y[r, o] is one sum over `in` in a fixed order,
 * whatever `rows` and `threads` are: a sequence's row gives the same bits alone or batched.
 * Rounding: ((w[o] . x[r]) + bias[o]) + residual[r, o], as the GEMM then its post-op add.
 * Returns 1 when rows is not in [1, MAX_ROWS]. */
#include "panels.h"

int linear_panels_f32(const float *wp, const float *x, const float *bias, const float *residual, float *y,
                      int rows, int64_t out, int in, int threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    const int per_tile = tile_rows(rows);
    const int64_t panels = panels_of(out);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t p = 0; p < panels; p++) panel_columns(wp, x, bias, residual, y, rows, out, in, p, per_tile);
    return 0;
}
