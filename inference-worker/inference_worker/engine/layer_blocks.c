/* A decoder layer's two blocks around attention over a few float32 rows (3 to MAX_ROWS: a
 * 16-sequence decode step, a doc-QA question), each in one call and one parallel region:
 *   pre_attention_f32:  RMSNorm -> fused q/k/v panels (+ bias) -> RoPE of q and k, k and v
 *                       written into the pool layer
 *   post_attention_f32: o panels + residual -> RMSNorm -> fused gate/up panels -> SiLU(gate) * up
 *                       -> down panels + residual
 *   between_layers_f32: a layer's post_attention then the next layer's pre_attention, in one
 *                       region: two regions a layer with attention's, where there were five
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
 * contiguous): a layer's weights as `struct layer` says, hidden and y [rows, width], attn [rows,
 * heads head_dim], the attention's inputs as `struct attention_inputs` says.
 * Returns 1 when rows is not in [1, MAX_ROWS], 2 for a slot outside the pool, 3 when scratch
 * memory is not had (nothing written for 1 and 2). */
#include <stdlib.h>

#include "panels.h"
#include "row_ops.h"

#define SILU_COLUMNS 256 /* columns of SiLU(gate) * up a task takes (a multiple of 16) */

/* One decoder layer's weights (layer_blocks.py's LayerWeights): the linears packed as
 * panel_linear.c's panels, q/k/v and gate/up each concatenated; a bias may be NULL. */
struct layer {
    const float *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down, *down_bias;
    float input_eps, post_eps;
    int width, heads, kv_heads, head_dim, intermediate;
};

/* What pre_attention writes for attention: qkv [rows, (heads + 2 kv_heads) head_dim] (v read
 * from it), q [rows, heads, head_dim] and k [rows, kv_heads, head_dim] rotated by cos, sin
 * [rows, head_dim], and k and v into the pool layer (k_pool, v_pool [kv_heads, pool_slots,
 * head_dim]) at slots [rows]. */
struct attention_inputs {
    const float *cos, *sin;
    float *qkv, *q, *k, *k_pool, *v_pool;
    const int64_t *slots;
    int64_t pool_slots;
};

/* The steps of pre_attention, in the calling region (orphaned `omp for`s); normed [rows, width]
 * scratch. */
static void pre_steps(const struct layer *w, const float *hidden, const struct attention_inputs *io, int rows,
                      float *normed) {
    const int per_tile = tile_rows(rows);
    const int64_t q_width = (int64_t)w->heads * w->head_dim, kv_width = (int64_t)w->kv_heads * w->head_dim;
    const int64_t out = q_width + 2 * kv_width, panels = panels_of(out);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++)
        rms_norm_row(hidden + (int64_t)r * w->width, w->input_norm, normed + (int64_t)r * w->width, w->width,
                     w->input_eps);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        panel_columns(w->qkv, normed, w->qkv_bias, NULL, io->qkv, rows, out, w->width, p, per_tile);
#pragma omp for schedule(static)
    for (int t = 0; t < rows; t++) {
        const float *row = io->qkv + t * out;
        rope_token(row, row + q_width, row + q_width + kv_width, io->cos + (int64_t)t * w->head_dim,
                   io->sin + (int64_t)t * w->head_dim, io->q + t * q_width, io->k + t * kv_width, w->heads,
                   w->kv_heads, w->head_dim, io->k_pool, io->v_pool, io->slots[t], io->pool_slots);
    }
}

/* The steps of post_attention, in the calling region; scratch: 2 rows * width + 3 rows *
 * intermediate floats. */
static void post_steps(const struct layer *w, const float *attn, const float *hidden, float *y, int rows,
                       float *scratch) {
    const int per_tile = tile_rows(rows), width = w->width, inter = w->intermediate;
    const int attn_width = w->heads * w->head_dim;
    const int64_t n = (int64_t)rows * width, pair = 2 * (int64_t)inter;
    /* the attention block's output (the MLP's residual), its norm, gate and up, SiLU(gate) * up */
    float *mid = scratch, *normed = mid + n, *gate_up = normed + n, *act = gate_up + rows * pair;
    const int64_t out_panels = panels_of(width), gate_up_panels = panels_of(pair);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < out_panels; p++)
        panel_columns(w->o, attn, w->o_bias, hidden, mid, rows, width, attn_width, p, per_tile);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++)
        rms_norm_row(mid + (int64_t)r * width, w->post_norm, normed + (int64_t)r * width, width, w->post_eps);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < gate_up_panels; p++)
        panel_columns(w->gate_up, normed, w->gate_up_bias, NULL, gate_up, rows, pair, width, p, per_tile);
    const int chunks = (inter + SILU_COLUMNS - 1) / SILU_COLUMNS;
#pragma omp for schedule(static)
    for (int i = 0; i < rows * chunks; i++) {
        const int r = i / chunks, c = i % chunks * SILU_COLUMNS;
        const int n = inter - c < SILU_COLUMNS ? inter - c : SILU_COLUMNS;
        silu_mul(gate_up + r * pair + c, gate_up + r * pair + inter + c, act + (int64_t)r * inter + c, n);
    }
#pragma omp for schedule(static)
    for (int64_t p = 0; p < out_panels; p++)
        panel_columns(w->down, act, w->down_bias, mid, y, rows, width, inter, p, per_tile);
}

/* 0, or the status of rows or slots out of range */
static int refused(int rows, const struct attention_inputs *io) {
    if (rows < 1 || rows > MAX_ROWS) return 1;
    if (io != NULL)
        for (int t = 0; t < rows; t++)
            if (io->slots[t] < 0 || io->slots[t] >= io->pool_slots) return 2;
    return 0;
}

static size_t post_scratch(const struct layer *w, int rows) {
    return sizeof(float) * (size_t)rows * (2 * (size_t)w->width + 3 * (size_t)w->intermediate);
}

int pre_attention_f32(const struct layer *w, const float *hidden, const struct attention_inputs *io, int rows,
                      int threads) {
    const int status = refused(rows, io);
    if (status) return status;
    float *normed = malloc(sizeof(float) * (size_t)rows * (size_t)w->width);
    if (normed == NULL) return 3;
#pragma omp parallel num_threads(threads) if (threads > 1)
    pre_steps(w, hidden, io, rows, normed);
    free(normed);
    return 0;
}

int post_attention_f32(const struct layer *w, const float *attn, const float *hidden, float *y, int rows,
                       int threads) {
    const int status = refused(rows, NULL);
    if (status) return status;
    float *scratch = malloc(post_scratch(w, rows));
    if (scratch == NULL) return 3;
#pragma omp parallel num_threads(threads) if (threads > 1)
    post_steps(w, attn, hidden, y, rows, scratch);
    free(scratch);
    return 0;
}

/* post_attention of layer w into y, then pre_attention of layer next on y */
int between_layers_f32(const struct layer *w, const float *attn, const float *hidden, float *y,
                       const struct layer *next, const struct attention_inputs *io, int rows, int threads) {
    const int status = refused(rows, io);
    if (status) return status;
    float *scratch = malloc(post_scratch(w, rows)); /* pre's normed rows fit in post's */
    if (scratch == NULL) return 3;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        post_steps(w, attn, hidden, y, rows, scratch);
        pre_steps(next, y, io, rows, scratch); /* the post's last `omp for` ended in a barrier */
    }
    free(scratch);
    return 0;
}
