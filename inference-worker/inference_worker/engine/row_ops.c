/* RMSNorm and rotate-half RoPE over float32 rows: one call where torch dispatches ~5 ops per
 * norm and ~12 per rotation of q and k (per-op dispatch was ~27% of a one-sequence SmolLM2
 * decode step, docs/inference-worker.md). Built and loaded by row_kernels.py like
 * paged_decode.c.
 *
 * Both round like transformers' code, op by op, so their results match it to the last bit
 * or nearly: the build leaves floating-point contraction off (-std=c11: no fused
 * multiply-adds), each product and sum is rounded where torch rounds it.
 *   rms_norm_f32: out = weight * (x * (1 / sqrt(sum(x * x) / dim + eps)))  (LlamaRMSNorm)
 *   rope_f32:     out = x * cos + rotate_half(x) * sin, for q and k         (apply_rotary_pos_emb)
 * Shapes: x, out [rows, dim] (x's rows `x_stride` apart); q [tokens, heads, head_dim] and
 * k [tokens, kv_heads, head_dim] with rows `q_stride`/`k_stride` apart (views of the fused
 * projection's output), heads contiguous; cos, sin [tokens, head_dim]; q_out, k_out contiguous. */
#include <math.h>
#include <stdint.h>

int rms_norm_f32(const float *x, int64_t x_stride, const float *weight, float *out, int64_t rows,
                 int dim, float eps, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= 8) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_stride;
        float *o = out + r * dim;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int d = 0; d < dim; d++) sum += row[d] * row[d];
        const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
        for (int d = 0; d < dim; d++) o[d] = weight[d] * (row[d] * scale);
    }
    return 0;
}

static inline void rotate(const float *x, const float *c, const float *s, float *o, int half) {
#pragma omp simd
    for (int i = 0; i < half; i++) {
        o[i] = x[i] * c[i] + (-x[i + half]) * s[i];
        o[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
}

int rope_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *cos,
             const float *sin, float *q_out, float *k_out, int64_t tokens, int heads, int kv_heads,
             int head_dim, int threads) {
    if (head_dim % 2) return 1;
    const int half = head_dim / 2;
#pragma omp parallel for num_threads(threads) if (tokens >= 8) schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * head_dim, *s = sin + t * head_dim;
        for (int h = 0; h < heads; h++)
            rotate(q + t * q_stride + h * head_dim, c, s, q_out + (t * heads + h) * head_dim, half);
        for (int h = 0; h < kv_heads; h++)
            rotate(k + t * k_stride + h * head_dim, c, s, k_out + (t * kv_heads + h) * head_dim, half);
    }
    return 0;
}
