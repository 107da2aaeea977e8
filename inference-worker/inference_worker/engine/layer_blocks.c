/* A decoder layer's two blocks around attention over a few float32 rows (3 to MAX_ROWS: a
 * 16-sequence decode step, a doc-QA question), each in one call and one parallel region:
 *   pre_attention_f32:  RMSNorm -> fused q/k/v panels (+ bias) -> RoPE of q and k, k and v
 *                       written into the pool layer
 *   post_attention_f32: o panels + residual -> RMSNorm -> fused gate/up panels -> SiLU(gate) * up
 *                       -> down panels + residual
 * Built and loaded by layer_blocks.py like paged_decode.c.
 *
 * Why: at these rows the runner called ~8 C and torch ops a layer from Python, 5 of them
 * parallel regions, and only the calling (master) thread ran the Python, the bindings, the
 * allocations and the serial ops between them while the other thread slept: at two threads the
 * master was the critical path (2000x14: 80 of 85 ms wall; docs/inference-worker.md, eighteenth
 * pass). Here the steps are `omp for` loops of one region, the threads meeting at its barriers,
 * and the norms, SiLU and RoPE split too.
 *
 * Each step rounds as its own kernel does (panels.h, row_ops.h; SiLU as torch's x / (1 + exp(-x))
 * then the product), so a row gives the same bits alone or batched. Shapes (row-major,
 * contiguous): panels as panel_linear.c packs them, hidden and y [rows, width], attn [rows,
 * attn_width], cos, sin [rows, head_dim], qkv [rows, (heads + 2 kv_heads) head_dim], q_out
 * [rows, heads, head_dim], k_out [rows, kv_heads, head_dim], the pool layer as in row_ops.c.
 * Returns 1 when rows is not in [1, MAX_ROWS], 2 for a slot outside the pool, 3 when scratch
 * memory is not had (nothing written for 1 and 2). */
#include <stdlib.h>

#include "panels.h"
#include "row_ops.h"

int pre_attention_f32(const float *hidden, const float *norm_weight, float eps, const float *qkv_panels,
                      const float *qkv_bias, const float *cos, const float *sin, float *qkv, float *q_out,
                      float *k_out, float *k_pool, float *v_pool, const int64_t *slots, int64_t pool_slots,
                      int rows, int width, int heads, int kv_heads, int head_dim, int threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    for (int t = 0; t < rows; t++)
        if (slots[t] < 0 || slots[t] >= pool_slots) return 2;
    float *normed = malloc(sizeof(float) * (size_t)rows * (size_t)width);
    if (normed == NULL) return 3;
    const int per_tile = tile_rows(rows);
    const int64_t q_width = (int64_t)heads * head_dim, kv_width = (int64_t)kv_heads * head_dim;
    const int64_t out = q_width + 2 * kv_width, panels = panels_of(out);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++)
            rms_norm_row(hidden + (int64_t)r * width, norm_weight, normed + (int64_t)r * width, width, eps);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++)
            panel_columns(qkv_panels, normed, qkv_bias, NULL, qkv, rows, out, width, p, per_tile);
#pragma omp for schedule(static)
        for (int t = 0; t < rows; t++) {
            const float *row = qkv + t * out;
            rope_token(row, row + q_width, row + q_width + kv_width, cos + (int64_t)t * head_dim,
                       sin + (int64_t)t * head_dim, q_out + t * q_width, k_out + t * kv_width, heads, kv_heads,
                       head_dim, k_pool, v_pool, slots[t], pool_slots);
        }
    }
    free(normed);
    return 0;
}

int post_attention_f32(const float *attn, const float *o_panels, const float *o_bias, const float *hidden,
                       const float *norm_weight, float eps, const float *gate_up_panels,
                       const float *gate_up_bias, const float *down_panels, const float *down_bias, float *y,
                       int rows, int width, int attn_width, int inter, int threads) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    const int64_t n = (int64_t)rows * width, pair = 2 * (int64_t)inter;
    /* the attention block's output (the MLP's residual), its norm, gate and up, SiLU(gate) * up */
    float *mid = malloc(sizeof(float) * (size_t)(2 * n + rows * pair + (int64_t)rows * inter));
    if (mid == NULL) return 3;
    float *normed = mid + n, *gate_up = normed + n, *act = gate_up + rows * pair;
    const int per_tile = tile_rows(rows);
    const int64_t o_panels_n = panels_of(width), gate_up_panels_n = panels_of(pair), down_panels_n = o_panels_n;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < o_panels_n; p++)
            panel_columns(o_panels, attn, o_bias, hidden, mid, rows, width, attn_width, p, per_tile);
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++)
            rms_norm_row(mid + (int64_t)r * width, norm_weight, normed + (int64_t)r * width, width, eps);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < gate_up_panels_n; p++)
            panel_columns(gate_up_panels, normed, gate_up_bias, NULL, gate_up, rows, pair, width, p, per_tile);
#pragma omp for collapse(2) schedule(static)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < inter; c++) {
                const float gate = gate_up[r * pair + c], up = gate_up[r * pair + inter + c];
                act[(int64_t)r * inter + c] = gate / (1.0f + expf(-gate)) * up;
            }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < down_panels_n; p++)
            panel_columns(down_panels, act, down_bias, mid, y, rows, width, inter, p, per_tile);
    }
    free(mid);
    return 0;
}
