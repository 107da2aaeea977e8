/* RMSNorm, rotate-half RoPE and SiLU-mul over float32 rows: one call where torch dispatches ~5
 * ops per norm, ~12 per rotation of q and k and 2 per SiLU-mul (per-op dispatch was ~27% of a
 * one-sequence SmolLM2 decode step, docs/inference-worker.md). Built and loaded by
 * row_kernels.py like paged_decode.c.
 *
 * They round like transformers' code, op by op, so their results match it to the last bit
 * or nearly (SiLU's e^x is vector_exp.h's, within ~1e-7 relative of torch's): the build leaves
 * floating-point contraction off (-std=c11: no fused multiply-adds), each product and sum is
 * rounded where torch rounds it.
 *   rms_norm_f32: out = weight * (x * (1 / sqrt(sum(x * x) / dim + eps)))  (LlamaRMSNorm)
 *   rope_f32:     out = x * cos + rotate_half(x) * sin, for q and k         (apply_rotary_pos_emb)
 *   silu_mul_f32: act = SiLU(gate) * up                                (LlamaMLP's act_fn(gate) * up)
 * Shapes: x, out [rows, dim] (x's rows `x_stride` apart); q [tokens, heads, head_dim] and
 * k [tokens, kv_heads, head_dim] with rows `q_stride`/`k_stride` apart (views of the fused
 * projection's output), heads contiguous; cos, sin [tokens, head_dim]; q_out, k_out contiguous.
 * rope_f32 also writes the rotated k and v (rows `v_stride` apart) into one layer of the paged
 * pool when k_pool is not NULL: k_pool, v_pool [kv_heads, pool_slots, head_dim], token t at
 * slot slots[t]. That was two index_copy_ calls a layer (2.7 ms of a 16-sequence SmolLM2
 * decode step, one thread), now part of this call. Returns 1 for an odd head_dim, 2 for a
 * slot outside the pool (nothing written).
 *   join_span_f32: a stored module span's k and v [kv_heads, tokens, head_dim] (each head's
 *   tokens contiguous, heads `head_stride` apart) copied into a prompt's joined layer (heads
 *   `out_head_stride` apart), k rotated by one cos, sin [head_dim] on the way (a module served
 *   at another position than encoded; cos NULL: copied as is). One pass where torch took a
 *   copy of v and three passes over k (mul, two addcmul_) per span and layer. */
#include "row_ops.h"

/* Rows below this run in the calling thread: a parallel region wakes torch's sleeping OpenMP
 * thread (the worker waits passively, openmp_waiting.py), which cost more than the second
 * thread saved. One call, 1 vs 2 threads, medians of 2,000 (load 6-7): RMSNorm of 16 / 128 /
 * 256 / 512 rows of 576: 3.7 / 14.2 / 25.0 / 54.7 us vs 12.4 / 23.0 / 37.2 / 60.4; RoPE + KV
 * write of 16 / 128 / 512 tokens (9 + 3 heads of 64): 6.0 / 22.0 / 89.1 vs 15.8 / 32.9 / 156.3.
 * A decode step of up to 255 sequences wakes nobody here (90 regions a SmolLM2 step). */
#define PARALLEL_MIN_ROWS 256
/* join_span_f32's rows are one head of one token (a copy, or a rotation and a copy: ~1/12 of a
 * RoPE row of SmolLM2's 9 + 3 heads), so its spans of a few hundred tokens stay on one thread. */
#define JOIN_PARALLEL_MIN_ROWS 4096

int rms_norm_f32(const float *x, int64_t x_stride, const float *weight, float *out, int64_t rows,
                 int dim, float eps, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= PARALLEL_MIN_ROWS) schedule(static)
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * x_stride, weight, out + r * dim, dim, eps);
    return 0;
}

int rope_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *cos,
             const float *sin, float *q_out, float *k_out, int64_t tokens, int heads, int kv_heads,
             int head_dim, int threads, const float *v, int64_t v_stride, float *k_pool,
             float *v_pool, const int64_t *slots, int64_t pool_slots) {
    if (head_dim % 2) return 1;
    if (k_pool != NULL)
        for (int64_t t = 0; t < tokens; t++)
            if (slots[t] < 0 || slots[t] >= pool_slots) return 2;
#pragma omp parallel for num_threads(threads) if (tokens >= PARALLEL_MIN_ROWS) schedule(static)
    for (int64_t t = 0; t < tokens; t++)
        rope_token(q + t * q_stride, k + t * k_stride, v == NULL ? NULL : v + t * v_stride, cos + t * head_dim,
                   sin + t * head_dim, q_out + t * heads * head_dim, k_out + t * kv_heads * head_dim, heads,
                   kv_heads, head_dim, k_pool, v_pool, k_pool == NULL ? 0 : slots[t], pool_slots);
    return 0;
}

int join_span_f32(const float *k, const float *v, int64_t k_head_stride, int64_t v_head_stride, float *k_out,
                  float *v_out, int64_t out_head_stride, const float *cos, const float *sin, int64_t tokens,
                  int kv_heads, int head_dim, int threads) {
    if (head_dim % 2) return 1;
    const int64_t rows = tokens * kv_heads;
#pragma omp parallel for num_threads(threads) if (rows >= JOIN_PARALLEL_MIN_ROWS) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = r / tokens, t = r % tokens;
        const float *key = k + h * k_head_stride + t * head_dim;
        float *out = k_out + h * out_head_stride + t * head_dim;
        if (cos == NULL)
            memcpy(out, key, sizeof(float) * (size_t)head_dim);
        else
            rotate(key, cos, sin, out, head_dim / 2);
        memcpy(v_out + h * out_head_stride + t * head_dim, v + h * v_head_stride + t * head_dim,
               sizeof(float) * (size_t)head_dim);
    }
    return 0;
}

/* Elements below this run in the calling thread: torch's grain for elementwise ops
 * (at::internal::GRAIN_SIZE), so SiLU-mul splits where torch's silu and mul_ did. */
#define SILU_PARALLEL_MIN 32768

/* act [rows, inter] = SiLU(gate) * up, gate and up [rows, inter] with rows `stride` apart (the
 * two halves of the fused gate/up projection's output): one pass where torch's silu then mul_
 * were two, the first writing a [rows, inter] temporary the second read back. */
int silu_mul_f32(const float *gate, const float *up, int64_t stride, float *act, int64_t rows, int inter,
                 int threads) {
#pragma omp parallel for num_threads(threads) if (rows * inter >= SILU_PARALLEL_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) silu_mul(gate + r * stride, up + r * stride, act + r * inter, inter);
    return 0;
}
