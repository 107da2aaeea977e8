/* The per-row arithmetic of row_ops.c, which panel_linear.c's layer blocks run too (included;
 * c_build.py hashes an included header with its source). Rounds like transformers' ops, op by
 * op (row_ops.c says how). */
#ifndef ATTNSTORE_ROW_OPS_H
#define ATTNSTORE_ROW_OPS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* o = weight * (row * (1 / sqrt(sum(row * row) / dim + eps)))  (LlamaRMSNorm) */
static inline void rms_norm_row(const float *row, const float *weight, float *o, int dim, float eps) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < dim; d++) sum += row[d] * row[d];
    const float scale = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
    for (int d = 0; d < dim; d++) o[d] = weight[d] * (row[d] * scale);
}

static inline void rotate(const float *x, const float *c, const float *s, float *o, int half) {
#pragma omp simd
    for (int i = 0; i < half; i++) {
        o[i] = x[i] * c[i] + (-x[i + half]) * s[i];
        o[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
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
#endif
