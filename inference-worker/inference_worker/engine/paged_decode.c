/* Decode attention over block tables on a CPU: every decoding sequence's one query token
 * against its context's K and V read in place from the paged pool (no gather), all the
 * sequences of a layer in one call, grouped query heads reading their KV head once.
 * Built and loaded by decode_kernel.py (plain C: no torch headers, so it builds in about a
 * second); OpenMP is torch's own libgomp, already loaded under the same soname.
 *
 * Shapes (row-major, contiguous):
 *   q, out      [tokens, heads, head_dim]      rows[s]: sequence s's row
 *   k, v        [kv_heads, blocks, block_tokens, head_dim]   one layer of the pool
 *   tables      [sequences, max_blocks]        int32, a sequence's pool blocks in order
 *   lens        [sequences]                    int32, its context tokens (the new one last)
 * window > 0: only the last `window` keys are seen (sliding-window layers). threads: OpenMP
 * threads (torch's count: the calling thread may not be the one torch set it in).
 * Element types: float32 (f32) or bfloat16 (bf16, read as the upper half of a float32);
 * accumulation in float32. Softmax is exact (max, exp, sum), not online. q, k, v, out, lse
 * must not overlap (they are `restrict`).
 * paged_decode_lse_*: the same, also writing lse [sequences, heads] float32, the log-sum-exp
 * of each head's scaled scores (DistAttention merges the pool's partial with the far KV's). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAX_GROUP 16 /* query heads per KV head handled in one pass */

/* a * b + c. -std=c11 turns floating-point contraction off (row_ops.c needs torch's
 * rounding), which left every product here a multiply and an add: one fused instruction
 * where the CPU has it (rounded once: no less exact), the plain expression elsewhere. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MULADD(a, b, c) fmaf(a, b, c)
#else
#define MULADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* e^x for x <= 0 (a score minus the largest), in plain arithmetic the compiler vectorizes
 * (glibc's expf is one call per score: ~20% of a SmolLM2 layer's decode attention):
 * e^x = 2^n e^r, n = round(x log2 e) (rounded by adding 1.5 * 2^23), r = x - n ln 2 (ln 2 in
 * two parts), e^r by Cephes' expf polynomial; relative error at most 8e-8 on [-87, 0]. */
static inline float exp_nonpositive(float x) {
    x = x < -87.f ? -87.f : x; /* e^-87 is near FLT_MIN: 2^n stays a normal float */
    const float shifted = x * 1.44269504088896341f + 12582912.f, n = shifted - 12582912.f;
    int32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    const int32_t scale_bits = (bits - 0x4B400000 + 127) << 23; /* 2^n */
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

/* Blocks lie anywhere in the pool, each a few pages at most: the hardware prefetcher stops
 * at a page's end, so the rows a block ahead are asked for while these are read, and a
 * (sequence, KV head)'s first rows before its pass starts. Into L2 (hint 2, prefetcht1): in
 * the engine's step (16 SmolLM2 sequences, 30 layers of KV from DRAM) the non-temporal hint 0
 * read at 9.7-10.5 GB/s, hints 1-2 at 11.7-13.4 and hint 3 (L1) at 11.0; the first rows'
 * prefetch took it to 12.4. */
#define AHEAD 16 /* tokens; 16, 32, 64 measured: 23.3, 23.3, 23.7 ms for those 30 layers */
static inline void prefetch_rows(const void *start, int bytes) {
    for (int i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)start + i, 0, 2);
}

/* Token t's K or V row of the sequence's KV head h, through its block table. Where the block
 * size is a power of two (`shift` its log2, else -1), the block and the offset in it are a
 * shift and a mask, not an integer division each (the kernel alone, 16 SmolLM2 sequences, 30
 * layers, one thread: 0.91-0.97x; docs/inference-worker.md). */
#define ROW(pool, t)                                                                               \
    ((pool) + (((int64_t)h * blocks +                                                              \
                table[shift >= 0 ? (t) >> shift : (t) / block_tokens]) * block_tokens +            \
               (shift >= 0 ? (t) & (block_tokens - 1) : (t) % block_tokens)) * head_dim)

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Scores of 16 keys at a time without a horizontal sum per key (by instruction count the K
 * pass's largest cost: ~8 shuffles and adds per (key, query head) after 4 multiply-adds at
 * head_dim 64): each key's products stay one 16-lane vector, and one tree of 45 shuffles and
 * adds turns 16 such vectors into the 16 scores (0.83x the K and V passes' time with the KV in
 * cache; from DRAM the wait for memory hides most of it). AVX-512 only; elsewhere (and for
 * bf16) the plain loop below does all keys. Returns the first key it left to that loop. */
#if defined(__AVX512F__)
/* Lane j of the result: the sum of v[4 (j % 4) + j / 4]'s lanes (the tree leaves input
 * c + 4 m in lane 4 c + m, so the caller stores key j at that index: the order is its own
 * inverse). */
static inline __m512 sum_lanes16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* 256-bit halves: a[i] = v[2i]'s in chunks 0-1, v[2i+1]'s in 2-3 */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit chunks: chunk c of b[i] is input 4i + c's */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(b[2 * i], b[2 * i + 1]),
                             _mm512_unpackhi_ps(b[2 * i], b[2 * i + 1]));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));
}

static ALWAYS_INLINE int paged_decode_f32_tiles(
    const float *restrict query, const float *restrict k, const int32_t *restrict table, int h,
    int first, int len, int64_t blocks, int block_tokens, int shift, float *restrict scores, int n,
    int group, int head_dim) {
    if (head_dim % 16) return first;
    const int row_bytes = head_dim * (int)sizeof(float);
    int t = first;
    for (; t + 16 <= len; t += 16) {
        const float *rows[16];
        for (int j = 0; j < 16; j++) rows[j] = ROW(k, t + j);
        if (t + AHEAD + 16 <= len)
            for (int j = 0; j < 16; j++) prefetch_rows(ROW(k, t + AHEAD + j), row_bytes);
        for (int g = 0; g < group; g++) {
            const float *qg = query + g * head_dim;
            __m512 v[16];
            for (int j = 0; j < 16; j++) {
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(rows[j]));
                for (int d = 16; d < head_dim; d += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + d), _mm512_loadu_ps(rows[j] + d), acc);
                v[4 * (j % 4) + j / 4] = acc;
            }
            _mm512_storeu_ps(scores + g * n + t - first, sum_lanes16(v));
        }
    }
    return t;
}
#else
#define paged_decode_f32_tiles(query, k, table, h, first, ...) (first)
#endif
#define paged_decode_bf16_tiles(query, k, table, h, first, ...) (first)

/* One sequence's query heads of KV head h (`group` of them, head_dim wide) against its
 * context [first, len). Inlined into one copy per common (group, head_dim) below: with both
 * known the dot products are unrolled, a key row is loaded once for the whole group, and
 * no loop peels for a runtime length. */
#define DEFINE_TASK(NAME, T, LOAD, STORE)                                                          \
    static ALWAYS_INLINE void NAME##_task(                                                         \
        const T *restrict q, const T *restrict k, const T *restrict v, T *restrict out,           \
        const int32_t *restrict table, int h, int first, int len, int64_t row, int64_t blocks,    \
        int block_tokens, int shift, float scale, float *restrict scores, float *restrict query,  \
        float *restrict acc, float *restrict lse, int group, int head_dim) {                       \
        const int n = len - first, row_bytes = head_dim * (int)sizeof(T);                         \
        for (int i = 0; i < group * head_dim; i++) query[i] = LOAD(q[row + i]) * scale;           \
        /* the first keys, which no later key's prefetch covers */                                 \
        for (int i = first; i < first + AHEAD && i < len; i++) prefetch_rows(ROW(k, i), row_bytes); \
        /* The keys the tiles left, four at a time: four independent sums per head, not one chain. */ \
        int t = NAME##_tiles(query, k, table, h, first, len, blocks, block_tokens, shift, scores, n, \
                             group, head_dim);                                                     \
        for (; t + 4 <= len; t += 4) {                                                             \
            const T *k0 = ROW(k, t), *k1 = ROW(k, t + 1), *k2 = ROW(k, t + 2), *k3 = ROW(k, t + 3); \
            if (t + AHEAD + 4 <= len) prefetch_rows(ROW(k, t + AHEAD), 4 * row_bytes);             \
            for (int g = 0; g < group; g++) {                                                      \
                const float *qg = query + g * head_dim;                                            \
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;                                      \
                _Pragma("omp simd reduction(+ : a0, a1, a2, a3)") for (int d = 0; d < head_dim;    \
                                                                     d++) {                        \
                    a0 = MULADD(qg[d], LOAD(k0[d]), a0);                                           \
                    a1 = MULADD(qg[d], LOAD(k1[d]), a1);                                           \
                    a2 = MULADD(qg[d], LOAD(k2[d]), a2);                                           \
                    a3 = MULADD(qg[d], LOAD(k3[d]), a3);                                           \
                }                                                                                  \
                float *sg = scores + g * n + t - first;                                            \
                sg[0] = a0, sg[1] = a1, sg[2] = a2, sg[3] = a3;                                    \
            }                                                                                      \
        }                                                                                          \
        for (; t < len; t++) {                                                                     \
            const T *key = ROW(k, t);                                                              \
            for (int g = 0; g < group; g++) {                                                      \
                const float *qg = query + g * head_dim;                                            \
                float dot = 0.f;                                                                   \
                _Pragma("omp simd reduction(+ : dot)") for (int d = 0; d < head_dim; d++) dot =    \
                    MULADD(qg[d], LOAD(key[d]), dot);                                              \
                scores[g * n + t - first] = dot;                                                   \
            }                                                                                      \
        }                                                                                          \
        for (int i = first; i < first + AHEAD && i < len; i++) prefetch_rows(ROW(v, i), row_bytes); \
        for (int g = 0; g < group; g++) {                                                          \
            float *sg = scores + g * n, top = -INFINITY, sum = 0.f;                                \
            _Pragma("omp simd reduction(max : top)") for (int i = 0; i < n; i++) top =             \
                sg[i] > top ? sg[i] : top;                                                         \
            _Pragma("omp simd reduction(+ : sum)") for (int i = 0; i < n; i++) {                   \
                sg[i] = exp_nonpositive(sg[i] - top);                                              \
                sum += sg[i];                                                                      \
            }                                                                                      \
            if (lse != NULL) lse[g] = top + logf(sum);                                             \
            const float inverse = 1.f / sum;                                                       \
            _Pragma("omp simd") for (int i = 0; i < n; i++) sg[i] *= inverse;                      \
        }                                                                                          \
        memset(acc, 0, sizeof(float) * group * head_dim);                                          \
        /* Four values at a time: each accumulator row loaded and stored once per four. */         \
        for (t = first; t + 4 <= len; t += 4) {                                                    \
            const T *v0 = ROW(v, t), *v1 = ROW(v, t + 1), *v2 = ROW(v, t + 2), *v3 = ROW(v, t + 3); \
            if (t + AHEAD + 4 <= len) prefetch_rows(ROW(v, t + AHEAD), 4 * row_bytes);             \
            for (int g = 0; g < group; g++) {                                                      \
                const float *p = scores + g * n + t - first;                                       \
                float *ag = acc + g * head_dim;                                                    \
                _Pragma("omp simd") for (int d = 0; d < head_dim; d++) ag[d] = MULADD(             \
                    p[3], LOAD(v3[d]),                                                             \
                    MULADD(p[2], LOAD(v2[d]), MULADD(p[1], LOAD(v1[d]), MULADD(p[0], LOAD(v0[d]),  \
                                                                             ag[d]))));            \
            }                                                                                      \
        }                                                                                          \
        for (; t < len; t++) {                                                                     \
            const T *value = ROW(v, t);                                                            \
            for (int g = 0; g < group; g++) {                                                      \
                const float p = scores[g * n + t - first];                                         \
                float *ag = acc + g * head_dim;                                                    \
                _Pragma("omp simd") for (int d = 0; d < head_dim; d++) ag[d] =                     \
                    MULADD(p, LOAD(value[d]), ag[d]);                                              \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < group * head_dim; i++) out[row + i] = STORE(acc[i]);                  \
    }

#define TASK_ARGUMENTS q, k, v, out, table, h, first, len, row, blocks, block_tokens, shift, scale, \
                       scores, query, acc, lse_row
#define CALL_TASK(NAME, G, D)                                                                      \
    if (group == (G) && head_dim == (D)) NAME##_task(TASK_ARGUMENTS, G, D);                       \
    else

#define DEFINE_PAGED_DECODE(NAME, T, LOAD, STORE)                                                  \
    DEFINE_TASK(NAME, T, LOAD, STORE)                                                              \
    static int NAME##_any(const T *q, const T *k, const T *v, T *out, const int64_t *rows,        \
             const int32_t *tables, const int32_t *lens, int sequences, int heads, int kv_heads,   \
             int head_dim, int64_t blocks, int block_tokens, int max_blocks, int window,           \
             int threads, float scale, float *lse) {                                               \
        const int group = heads / kv_heads;                                                        \
        const int shift = block_tokens & (block_tokens - 1) ? -1 : __builtin_ctz(block_tokens);   \
        if (group > MAX_GROUP || group * kv_heads != heads) return 1;                              \
        int failed = 0;                                                                            \
        _Pragma("omp parallel num_threads(threads)") {                                             \
            float *scores = NULL, *query = malloc(sizeof(float) * group * head_dim);               \
            float *acc = malloc(sizeof(float) * group * head_dim);                                 \
            int capacity = 0;                                                                      \
            _Pragma("omp for schedule(dynamic, 1)") for (int task = 0; task < sequences * kv_heads; \
                                                         task++) {                                 \
                const int s = task / kv_heads, h = task % kv_heads, len = lens[s];                  \
                const int first = window > 0 && len > window ? len - window : 0, n = len - first;  \
                if (n > capacity) {                                                                \
                    free(scores);                                                                  \
                    capacity = n;                                                                  \
                    scores = malloc(sizeof(float) * group * capacity);                             \
                }                                                                                  \
                if (scores == NULL || query == NULL || acc == NULL) {                              \
                    failed = 1;                                                                    \
                    capacity = 0;                                                                  \
                    continue;                                                                      \
                }                                                                                  \
                const int64_t row = (rows[s] * heads + (int64_t)h * group) * head_dim;             \
                const int32_t *table = tables + (int64_t)s * max_blocks;                           \
                float *lse_row = lse == NULL ? NULL : lse + (int64_t)s * heads + h * group;        \
                SPECIALIZED_TASKS(NAME) NAME##_task(TASK_ARGUMENTS, group, head_dim);              \
            }                                                                                      \
            free(scores);                                                                          \
            free(query);                                                                           \
            free(acc);                                                                             \
        }                                                                                          \
        return failed ? 2 : 0;                                                                     \
    }                                                                                              \
    int NAME(const T *q, const T *k, const T *v, T *out, const int64_t *rows,                     \
             const int32_t *tables, const int32_t *lens, int sequences, int heads, int kv_heads,   \
             int head_dim, int64_t blocks, int block_tokens, int max_blocks, int window,           \
             int threads, float scale) {                                                           \
        return NAME##_any(q, k, v, out, rows, tables, lens, sequences, heads, kv_heads, head_dim,  \
                          blocks, block_tokens, max_blocks, window, threads, scale, NULL);         \
    }                                                                                              \
    int NAME##_lse(const T *q, const T *k, const T *v, T *out, const int64_t *rows,               \
             const int32_t *tables, const int32_t *lens, int sequences, int heads, int kv_heads,   \
             int head_dim, int64_t blocks, int block_tokens, int max_blocks, int window,           \
             int threads, float scale, float *lse) {                                               \
        return NAME##_any(q, k, v, out, rows, tables, lens, sequences, heads, kv_heads, head_dim,  \
                          blocks, block_tokens, max_blocks, window, threads, scale, lse);          \
    }

/* The (group, head_dim) pairs of the supported families' common models: SmolLM2-135M and
 * -360M (3, 64), SmolLM2-1.7B (1, 64), Qwen2-0.5B (7, 64), Qwen2-1.5B (6, 128), Llama 3 and
 * Mistral 7-8B (4, 128). Others take the generic copy. */
#define SPECIALIZED_TASKS(NAME)                                                                    \
    CALL_TASK(NAME, 3, 64) CALL_TASK(NAME, 1, 64) CALL_TASK(NAME, 7, 64) CALL_TASK(NAME, 6, 128)  \
    CALL_TASK(NAME, 4, 128)

#define IDENTITY(x) (x)
DEFINE_PAGED_DECODE(paged_decode_f32, float, IDENTITY, IDENTITY)
DEFINE_PAGED_DECODE(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
