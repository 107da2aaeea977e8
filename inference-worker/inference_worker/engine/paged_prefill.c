/* Prefill attention over block tables on a CPU, flash-attention shaped: each sequence's new
 * query rows against its context's K and V read in place from the paged pool (the new
 * tokens' own K and V already written there), causal inside the new tokens, all sequences
 * of a layer in one call. Built and loaded by prefill_kernel.py (plain C, as paged_decode.c;
 * OpenMP is torch's own libgomp).
 *
 * A task is (sequence, KV head, tile of query tokens): the tile's query rows of all the KV
 * head's grouped heads, ROWS of them at most (48 / group tokens: SmolLM2's group of 3 takes
 * 16), held transposed, Qt [head_dim][ROWS], so that every product runs along the rows: a
 * key's element is broadcast against 16 rows at once, each key row is read once per tile
 * (not once per query head), and nothing sums across vector lanes. Keys go by in chunks of
 * CHUNK: the chunk's scores St [keys][ROWS], an online softmax (a running max and sum per
 * row, as flash-attention), and the output, also transposed, Ot [head_dim][ROWS] += V^T P.
 * With fewer tasks than PARTS_PER_THREAD a thread (a short chunk: 14 new tokens of SmolLM2 are
 * 3 tasks, and 3 equal tasks take two threads two tasks' time), each task's keys are split
 * into parts, computed as separate items and merged by their maxima and sums
 * (flash-decoding's reduction): one thread's CPU the same, the threads evenly loaded.
 *
 * Shapes (row-major, contiguous):
 *   q, out      [tokens, heads, head_dim]      sequence s's rows: firsts[s] .. + news[s]
 *   k, v        [kv_heads, blocks, block_tokens, head_dim]   one layer of the pool
 *   tables      [sequences, max_blocks]        int32, a sequence's pool blocks in order
 *   starts      [sequences]                    int32, its tokens before the new ones
 * Query row i of sequence s sits at position starts[s] + i and sees keys 0 .. that position
 * (no sliding window: the caller keeps a windowed layer whose context exceeds the window).
 * float32; q, k, v, out must not overlap. Returns 0, 1 (unsupported heads), 2 (no memory).
 *
 * span_prefill_f32: one sequence's new rows over keys that lie in separate runs (segments)
 * instead of a block table: a prompt's module spans where each module's read left them, then
 * the rows' own K and V. A segment's keys may sit at other positions than they were encoded
 * at (a module served elsewhere): instead of rotating its keys by the shift (a copy of every
 * span per layer and turn), the tile's queries are rotated back by it (q . R k = R^T q . k,
 * RoPE's rotations being orthogonal), once per segment a task meets.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "row_ops.h" /* rotate_pair */

#define ROWS 48  /* query rows of a tile: three vectors of 16 */
#define CHUNK 32 /* keys per online-softmax step */
#define PARTS_PER_THREAD 4 /* fewer tasks than this a thread: their keys are split (below) */
#define MIN_PART_KEYS 256  /* the fewest earlier keys a split part takes */

typedef struct { /* a run of keys (span_prefill_f32): where its K and V rows lie */
    const float *k, *v;
    int64_t k_head, k_row, v_head, v_row; /* strides in floats */
    const float *cos, *sin;               /* [head_dim]: the keys' shift, undone on the queries; NULL: none */
} Segment;

typedef struct { /* one task's view of its sequence's KV head */
    const float *k, *v;
    const int32_t *table;
    int64_t head_base; /* (h * blocks) */
    int block_tokens, head_dim;
    /* span_prefill_f32's instead of the pool's: segment s holds keys [begins[s], begins[s + 1]) */
    const Segment *segments;
    const int64_t *begins;
    int n_segments, h;
} Context;

static inline const float *row_of(const Context *c, const float *pool, int t) {
    return pool + ((c->head_base + c->table[t / c->block_tokens]) * c->block_tokens +
                   t % c->block_tokens) * c->head_dim;
}

/* Key t's segment (a handful: searched from the last; once a chunk, which lies within one). */
static inline int segment_of(const Context *c, int t) {
    int s = c->n_segments - 1;
    while (s > 0 && c->begins[s] > t) s--;
    return s;
}

/* The K and V rows of keys [key, key + n): in the pool, or in `segment` (holding them all). */
static void chunk_rows(const Context *c, int segment, int key, int n, const float **keys, const float **values) {
    if (c->n_segments == 0) {
        for (int j = 0; j < n; j++) keys[j] = row_of(c, c->k, key + j), values[j] = row_of(c, c->v, key + j);
        return;
    }
    const Segment *g = c->segments + segment;
    const int64_t i = key - c->begins[segment];
    const float *k = g->k + c->h * g->k_head + i * g->k_row, *v = g->v + c->h * g->v_head + i * g->v_row;
    for (int j = 0; j < n; j++) keys[j] = k + j * g->k_row, values[j] = v + j * g->v_row;
}

typedef struct { /* a thread's scratch, reused by its tasks */
    float *q0, *qt, *ot, *st, *m, *l, *alpha; /* q0: Qt unrotated, qt: rotated for a segment */
    int32_t *pos;
} Scratch;

#if defined(__AVX512F__)
/* Keeps v in a register: GCC otherwise folds the three row vectors, reused by eight
 * multiply-adds each, into every multiply-add as a memory operand, and the loop waits on
 * loads (24 vector loads for 24 multiply-adds: 1 load a cycle of 512 bits on Zen 4; one layer
 * of 250 new tokens on 800: 7.7 -> 6.0 ms with OWN_REGISTERS below). */
#define IN_REGISTER(v) __asm__("" : "+v"(v))
/* Not inlined into the task: there exp16's constants, hoisted out of the loops, took the
 * registers these loops need (GCC spilled the row vectors to the stack). */
#define OWN_REGISTERS __attribute__((noinline))

/* A tile's row vectors at p, `nv` of them (1 to 3: the tile's valid rows, 16 a vector; a
 * constant in each variant below), and a += b x those rows (one multiply-add per vector). */
typedef struct {
    __m512 v[3];
} Rows;

#define INLINE static inline __attribute__((always_inline))

INLINE Rows load_rows(const float *p, int nv) {
    Rows r = {0};
    for (int x = 0; x < nv; x++) {
        r.v[x] = _mm512_load_ps(p + 16 * x);
        IN_REGISTER(r.v[x]);
    }
    return r;
}

INLINE void store_rows(float *p, Rows r, int nv) {
    for (int x = 0; x < nv; x++) _mm512_store_ps(p + 16 * x, r.v[x]);
}

INLINE void madd_rows(Rows *a, float b, Rows rows, int nv) {
    const __m512 broadcast = _mm512_set1_ps(b);
    for (int x = 0; x < nv; x++) a->v[x] = _mm512_fmadd_ps(broadcast, rows.v[x], a->v[x]);
}

/* St[j][:] = the scores of keys[j] against the tile's rows, eight keys at a time (8 x nv
 * accumulators: each step loads nv query vectors for 8 x nv multiply-adds), then one. */
INLINE void scores_rows(const float *restrict qt, const float *const *keys, int n, int head_dim,
                        float *restrict st, int nv) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        Rows acc[8] = {0};
        for (int d = 0; d < head_dim; d++) {
            const Rows q = load_rows(qt + d * ROWS, nv);
            for (int i = 0; i < 8; i++) madd_rows(&acc[i], keys[j + i][d], q, nv);
        }
        for (int i = 0; i < 8; i++) store_rows(st + (j + i) * ROWS, acc[i], nv);
    }
    for (; j < n; j++) {
        Rows acc = {0};
        for (int d = 0; d < head_dim; d++) madd_rows(&acc, keys[j][d], load_rows(qt + d * ROWS, nv), nv);
        store_rows(st + j * ROWS, acc, nv);
    }
}

/* The chunk's scores into probabilities against each row's running max (updated), the
 * rows' sums rescaled and grown, `alpha` the factor that rescales what Ot holds. Keys after
 * a row's position (only where `masked`: a chunk reaching past the tile's first position)
 * get probability 0. */
static void softmax_step(float *restrict st, int n, int first_key, int masked, Scratch *s, int nv) {
    for (int x = 0; x < 16 * nv; x += 16) {
        const __m512i pos = _mm512_load_si512(s->pos + x);
        const __m512 old = _mm512_load_ps(s->m + x);
        __m512 top = old;
        for (int j = 0; j < n; j++) {
            __m512 score = _mm512_load_ps(st + j * ROWS + x);
            if (masked) {
                const __mmask16 seen = _mm512_cmple_epi32_mask(_mm512_set1_epi32(first_key + j), pos);
                score = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), score);
                _mm512_store_ps(st + j * ROWS + x, score);
            }
            top = _mm512_max_ps(top, score);
        }
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(st + j * ROWS + x), top));
            if (masked)
                p = _mm512_maskz_mov_ps(_mm512_cmple_epi32_mask(_mm512_set1_epi32(first_key + j), pos), p);
            _mm512_store_ps(st + j * ROWS + x, p);
            sum = _mm512_add_ps(sum, p);
        }
        /* the first chunk: old is -inf, alpha ~e^-87 times an Ot and a sum that are 0 */
        const __m512 alpha = exp16(_mm512_sub_ps(old, top));
        _mm512_store_ps(s->alpha + x, alpha);
        _mm512_store_ps(s->l + x, _mm512_fmadd_ps(_mm512_load_ps(s->l + x), alpha, sum));
        _mm512_store_ps(s->m + x, top);
    }
}

/* Ot's rows of column d times alpha. */
INLINE Rows rescaled(const float *o, Rows alpha, int nv) {
    Rows r = {0};
    for (int x = 0; x < nv; x++) r.v[x] = _mm512_mul_ps(_mm512_load_ps(o + 16 * x), alpha.v[x]);
    return r;
}

/* Ot = Ot * alpha + V^T P, eight of head_dim's columns at a time (8 x nv accumulators), then one. */
INLINE void accumulate_rows(float *restrict ot, const float *restrict alpha, const float *restrict st,
                            const float *const *values, int n, int head_dim, int nv) {
    const Rows scale = load_rows(alpha, nv);
    int d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        Rows acc[8];
        for (int i = 0; i < 8; i++) acc[i] = rescaled(ot + (d + i) * ROWS, scale, nv);
        for (int j = 0; j < n; j++) {
            const Rows p = load_rows(st + j * ROWS, nv);
            for (int i = 0; i < 8; i++) madd_rows(&acc[i], values[j][d + i], p, nv);
        }
        for (int i = 0; i < 8; i++) store_rows(ot + (d + i) * ROWS, acc[i], nv);
    }
    for (; d < head_dim; d++) {
        Rows acc = rescaled(ot + d * ROWS, scale, nv);
        for (int j = 0; j < n; j++) madd_rows(&acc, values[j][d], load_rows(st + j * ROWS, nv), nv);
        store_rows(ot + d * ROWS, acc, nv);
    }
}

/* The two loops for 1, 2 and 3 vectors of rows, each compiled apart (OWN_REGISTERS): a tile's
 * last rows (19 tokens of SmolLM2's group of 3 are 48 + 9 rows) cost a third of a full tile,
 * not a whole one. */
#define ROW_VARIANTS(nv)                                                                                    \
    static OWN_REGISTERS void scores_##nv(const float *restrict qt, const float *const *keys, int n,        \
                                          int head_dim, float *restrict st) {                              \
        scores_rows(qt, keys, n, head_dim, st, nv);                                                         \
    }                                                                                                       \
    static OWN_REGISTERS void accumulate_##nv(float *restrict ot, const float *restrict alpha,              \
                                              const float *restrict st, const float *const *values, int n, \
                                              int head_dim) {                                               \
        accumulate_rows(ot, alpha, st, values, n, head_dim, nv);                                            \
    }
ROW_VARIANTS(1)
ROW_VARIANTS(2)
ROW_VARIANTS(3)

static void scores(const float *restrict qt, const float *const *keys, int n, int head_dim, float *restrict st,
                   int nv) {
    (nv == 1 ? scores_1 : nv == 2 ? scores_2 : scores_3)(qt, keys, n, head_dim, st);
}

static void accumulate(float *restrict ot, const float *restrict alpha, const float *restrict st,
                       const float *const *values, int n, int head_dim, int nv) {
    (nv == 1 ? accumulate_1 : nv == 2 ? accumulate_2 : accumulate_3)(ot, alpha, st, values, n, head_dim);
}
#else
/* The same steps as plain loops along the rows, for the compiler to vectorize. */
/* (`nv`: the tile's valid row vectors; the plain loops run every row) */
static void scores(const float *restrict qt, const float *const *keys, int n, int head_dim,
                   float *restrict st, int nv) {
    (void)nv;
    for (int j = 0; j < n; j++) {
        float *sj = st + j * ROWS;
        memset(sj, 0, sizeof(float) * ROWS);
        for (int d = 0; d < head_dim; d++) {
            const float key = keys[j][d];
            _Pragma("omp simd") for (int r = 0; r < ROWS; r++) sj[r] += key * qt[d * ROWS + r];
        }
    }
}

static void softmax_step(float *restrict st, int n, int first_key, int masked, Scratch *s, int nv) {
    (void)nv;
    for (int r = 0; r < ROWS; r++) {
        float top = s->m[r], sum = 0.f;
        const int last = masked ? s->pos[r] - first_key : n - 1; /* the row's last key here */
        for (int j = 0; j < n && j <= last; j++) top = st[j * ROWS + r] > top ? st[j * ROWS + r] : top;
        for (int j = 0; j < n; j++) {
            const float p = j <= last ? expf(st[j * ROWS + r] - top) : 0.f;
            st[j * ROWS + r] = p;
            sum += p;
        }
        s->alpha[r] = expf(s->m[r] - top); /* the first chunk: e^-inf = 0 */
        s->l[r] = s->l[r] * s->alpha[r] + sum;
        s->m[r] = top;
    }
}

static void accumulate(float *restrict ot, const float *restrict alpha, const float *restrict st,
                       const float *const *values, int n, int head_dim, int nv) {
    (void)nv;
    for (int d = 0; d < head_dim; d++) {
        float *o = ot + d * ROWS;
        _Pragma("omp simd") for (int r = 0; r < ROWS; r++) o[r] *= alpha[r];
        for (int j = 0; j < n; j++) {
            const float value = values[j][d];
            _Pragma("omp simd") for (int r = 0; r < ROWS; r++) o[r] += value * st[j * ROWS + r];
        }
    }
}
#endif

/* A task's share of its keys, [begin, end) (end past the tile's last position: all of them
 * from begin), whose partial result goes to `part` when given: the output unnormalized
 * (transposed, [head_dim][ROWS]), each row's running max and sum, for `merge`. */
typedef struct {
    int begin, end;
    float *part; /* NULL: the whole task, written normalized into out */
} Keys;

/* Qt's valid rows: the tile's query rows times `scale`. */
static void load_queries(float *restrict qt, const float *restrict q, int64_t first_row, int valid, int heads,
                         int h, int group, int head_dim, float scale) {
    for (int r = 0; r < valid; r++) {
        const float *row = q + ((first_row + r / group) * heads + h * group + r % group) * head_dim;
        for (int d = 0; d < head_dim; d++) qt[d * ROWS + r] = row[d] * scale;
    }
}

/* Qt rotated back by (cos, sin), all rows at once (R^T q: q * cos - rotate_half(q) * sin): one
 * vector pass over Qt where rotating and transposing each query row again for every segment was
 * ~1/10 of the kernel's time outside its products. */
static void rotate_queries(float *restrict qt, const float *restrict q0, const float *cos, const float *sin,
                           int head_dim) {
    const int half = head_dim / 2;
    for (int d = 0; d < half; d++) {
        const float *x1 = q0 + d * ROWS, *x2 = q0 + (d + half) * ROWS;
        float *o1 = qt + d * ROWS, *o2 = qt + (d + half) * ROWS;
        _Pragma("omp simd") for (int r = 0; r < ROWS; r++)
            rotate_pair(x1[r], x2[r], cos[d], sin[d], cos[d + half], sin[d + half], 1, o1 + r, o2 + r);
    }
}

/* One task: `tokens` query tokens from `t0` of a sequence whose first new row is `first`
 * (position `start`), the `group` heads of KV head h, over `keys`. */
static void tile(const float *restrict q, float *restrict out, const Context *c, int64_t first,
                 int start, int t0, int tokens, int heads, int h, int group, float scale, Keys keys_of,
                 Scratch *s) {
    const int head_dim = c->head_dim, valid = tokens * group, last = start + t0 + tokens - 1;
    const int nv = (valid + 15) / 16; /* the row vectors computed: the rest are padding */
    for (int r = 0; r < ROWS; r++) {
        s->m[r] = -INFINITY;
        s->l[r] = 0.f;
        s->pos[r] = last; /* padding rows: zero queries, their output discarded */
    }
    for (int r = 0; r < valid; r++) s->pos[r] = start + t0 + r / group;
    memset(s->q0, 0, sizeof(float) * head_dim * ROWS);
    load_queries(s->q0, q, first + t0, valid, heads, h, group, head_dim, scale);
    const float *qt = s->q0; /* the chunk's segment's queries */
    int rotated = 0, at = 0;  /* 1 + the segment whose rotation s->qt holds (0: none yet); the chunk's */
    memset(s->ot, 0, sizeof(float) * head_dim * ROWS);
    const float *keys[CHUNK], *values[CHUNK];
    /* a part's first key is at most the tile's first position: every row sees it (a finite max) */
    const int end = keys_of.end < last + 1 ? keys_of.end : last + 1;
    for (int key = keys_of.begin, n; key < end; key += n) {
        n = key + CHUNK <= end ? CHUNK : end - key;
        if (c->n_segments) { /* a chunk within one segment: its rotation of the queries */
            at = segment_of(c, key);
            if (at + 1 < c->n_segments && key + n > c->begins[at + 1]) n = (int)c->begins[at + 1] - key;
            const Segment *g = c->segments + at;
            if (g->cos == NULL)
                qt = s->q0;
            else {
                if (rotated != at + 1) rotate_queries(s->qt, s->q0, g->cos, g->sin, head_dim);
                rotated = at + 1, qt = s->qt;
            }
        }
        chunk_rows(c, at, key, n, keys, values);
        /* the next chunk's K and V rows asked for while this one computes: each block is its own
         * page, where the hardware prefetcher stops. 30 layers of 14 new rows on 2,000 keys in
         * scattered blocks, one thread, CPU: 49.0-51.6 -> 42.4-43.9 ms (32 on 3,500: 174.1 ->
         * 142.8; 250 on 800: 215.4 -> 206.9), bitwise the same; the chunk after next: no better
         * (docs/inference-worker.md, seventeenth pass). A segment's rows are one run, which the
         * hardware prefetcher follows: prefetching them too cost 1-5% (14-32 rows on 1,013 keys,
         * docs/prompt-modules.md). */
        for (int t = key + n; c->n_segments == 0 && t < end && t < key + n + CHUNK; t++) {
            const char *k_row = (const char *)row_of(c, c->k, t), *v_row = (const char *)row_of(c, c->v, t);
            for (int byte = 0; byte < head_dim * (int)sizeof(float); byte += 64) {
                __builtin_prefetch(k_row + byte);
                __builtin_prefetch(v_row + byte);
            }
        }
        scores(qt, keys, n, head_dim, s->st, nv);
        softmax_step(s->st, n, key, key + n - 1 > start + t0, s, nv);
        accumulate(s->ot, s->alpha, s->st, values, n, head_dim, nv);
    }
    if (keys_of.part != NULL) {
        memcpy(keys_of.part, s->ot, sizeof(float) * head_dim * ROWS);
        memcpy(keys_of.part + head_dim * ROWS, s->m, sizeof(float) * ROWS);
        memcpy(keys_of.part + (head_dim + 1) * ROWS, s->l, sizeof(float) * ROWS);
        return;
    }
    for (int r = 0; r < valid; r++) {
        float *row = out + ((first + t0 + r / group) * heads + h * group + r % group) * head_dim;
        const float inverse = 1.f / s->l[r];
        for (int d = 0; d < head_dim; d++) row[d] = s->ot[d * ROWS + r] * inverse;
    }
}

/* A task's `parts` partials merged into out: softmax over all keys = each part's weighted by
 * e^(its max - the overall max) (flash-decoding's reduction). */
static void merge(float *restrict out, const float *parts, int n_parts, int64_t first, int t0, int tokens,
                  int heads, int h, int group, int head_dim) {
    const int stride = (head_dim + 2) * ROWS;
    for (int r = 0; r < tokens * group; r++) {
        float top = -INFINITY, sum = 0.f, weight[n_parts];
        for (int p = 0; p < n_parts; p++) {
            const float m = parts[p * stride + head_dim * ROWS + r];
            top = m > top ? m : top;
        }
        for (int p = 0; p < n_parts; p++) {
            weight[p] = expf(parts[p * stride + head_dim * ROWS + r] - top);
            sum += weight[p] * parts[p * stride + (head_dim + 1) * ROWS + r];
        }
        float *row = out + ((first + t0 + r / group) * heads + h * group + r % group) * head_dim;
        for (int d = 0; d < head_dim; d++) {
            float o = 0.f;
            for (int p = 0; p < n_parts; p++) o += weight[p] * parts[p * stride + d * ROWS + r];
            row[d] = o / sum;
        }
    }
}

static void *scratch_array(size_t floats) { /* 64-byte aligned: the vector loads are aligned */
    return aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
}

/* The tasks of every sequence, over the pool (`base` with a table: sequence s's is row s of
 * `tables`, `max_blocks` wide; KV head h's blocks start at h * `blocks`) or base's segments. */
static int prefill(const Context *base, const float *q, float *out, const int64_t *firsts, const int32_t *news,
                   const int32_t *starts, const int32_t *tables, int sequences, int heads, int kv_heads,
                   int64_t blocks, int max_blocks, int threads, float scale) {
    const int group = heads / kv_heads, head_dim = base->head_dim;
    if (group < 1 || group > ROWS || group * kv_heads != heads) return 1;
    const int tile_tokens = ROWS / group;
    int tasks = 0;
    for (int s = 0; s < sequences; s++) tasks += kv_heads * ((news[s] + tile_tokens - 1) / tile_tokens);
    int32_t *task_sequence = malloc(sizeof(int32_t) * (tasks + 1)), *task_tile = malloc(sizeof(int32_t) * (tasks + 1));
    if (task_sequence == NULL || task_tile == NULL) {
        free(task_sequence);
        free(task_tile);
        return 2;
    }
    /* the last tiles first: they see the most keys, so the threads end together */
    int count = 0;
    for (int s = 0; s < sequences; s++)
        for (int t = (news[s] + tile_tokens - 1) / tile_tokens - 1; t >= 0; t--)
            for (int h = 0; h < kv_heads; h++) task_sequence[count] = s, task_tile[count++] = t * kv_heads + h;
    /* Few tasks for the threads (a short chunk: 14 tokens of SmolLM2 are 3 tasks) leave a
     * thread idle for a task's time: each task's keys before its tile are then split into
     * `n_parts` ranges of at least MIN_PART_KEYS, computed as separate items and merged. */
    int n_parts = 1;
    if (threads > 1 && tasks < PARTS_PER_THREAD * threads) {
        int fewest_start = INT32_MAX;
        for (int s = 0; s < sequences; s++) fewest_start = starts[s] < fewest_start ? starts[s] : fewest_start;
        n_parts = (PARTS_PER_THREAD * threads + tasks - 1) / tasks;
        if (n_parts > fewest_start / MIN_PART_KEYS) n_parts = fewest_start / MIN_PART_KEYS;
        if (n_parts < 1) n_parts = 1;
    }
    float *parts = NULL;
    if (n_parts > 1 && (parts = scratch_array((size_t)tasks * n_parts * (head_dim + 2) * ROWS)) == NULL)
        n_parts = 1;
    int failed = 0;
    _Pragma("omp parallel num_threads(threads)") {
        Scratch s = {scratch_array((size_t)head_dim * ROWS), scratch_array((size_t)head_dim * ROWS),
                     scratch_array((size_t)head_dim * ROWS), scratch_array(CHUNK * ROWS),
                     scratch_array(ROWS), scratch_array(ROWS), scratch_array(ROWS), scratch_array(ROWS)};
        const int ready = s.q0 && s.qt && s.ot && s.st && s.m && s.l && s.alpha && s.pos;
        if (!ready) failed = 1;
        _Pragma("omp for schedule(dynamic, 1)") for (int item = 0; item < tasks * n_parts; item++) {
            if (!ready) continue;
            const int task = item / n_parts, part = item % n_parts;
            const int sequence = task_sequence[task], t = task_tile[task] / kv_heads,
                      h = task_tile[task] % kv_heads, t0 = t * tile_tokens;
            Context c = *base;
            c.h = h;
            if (tables != NULL) c.table = tables + (int64_t)sequence * max_blocks, c.head_base = (int64_t)h * blocks;
            const int tokens = news[sequence] - t0 < tile_tokens ? news[sequence] - t0 : tile_tokens;
            /* split points within [0, start]: each part begins at or before every row's position */
            const int64_t prefix = starts[sequence];
            Keys keys = {(int)(prefix * part / n_parts),
                         part == n_parts - 1 ? INT32_MAX : (int)(prefix * (part + 1) / n_parts),
                         n_parts > 1 ? parts + (size_t)item * (head_dim + 2) * ROWS : NULL};
            tile(q, out, &c, firsts[sequence], starts[sequence], t0, tokens, heads, h, group, scale, keys, &s);
        }
        if (n_parts > 1) {
            _Pragma("omp for schedule(static)") for (int task = 0; task < tasks; task++) {
                if (!ready) continue;
                const int sequence = task_sequence[task], t0 = task_tile[task] / kv_heads * tile_tokens;
                const int tokens = news[sequence] - t0 < tile_tokens ? news[sequence] - t0 : tile_tokens;
                merge(out, parts + (size_t)task * n_parts * (head_dim + 2) * ROWS, n_parts, firsts[sequence], t0,
                      tokens, heads, task_tile[task] % kv_heads, group, head_dim);
            }
        }
        free(s.q0), free(s.qt), free(s.ot), free(s.st), free(s.m), free(s.l), free(s.alpha), free(s.pos);
    }
    free(parts);
    free(task_sequence);
    free(task_tile);
    return failed ? 2 : 0;
}

int paged_prefill_f32(const float *q, const float *k, const float *v, float *out, const int64_t *firsts,
                      const int32_t *news, const int32_t *starts, const int32_t *tables, int sequences,
                      int heads, int kv_heads, int head_dim, int64_t blocks, int block_tokens,
                      int max_blocks, int threads, float scale) {
    const Context pool = {k, v, NULL, 0, block_tokens, head_dim, NULL, NULL, 0, 0};
    return prefill(&pool, q, out, firsts, news, starts, tables, sequences, heads, kv_heads, blocks, max_blocks,
                   threads, scale);
}

/* One sequence's `news` rows from row `first` of q and out, at positions `start`.., over the
 * keys of `n_segments` segments (the last: the rows' own, ending at the last row's position). */
int span_prefill_f32(const float *q, float *out, int64_t first, int32_t news, int32_t start,
                     const Segment *segments, const int64_t *begins, int n_segments, int heads, int kv_heads,
                     int head_dim, int threads, float scale) {
    const Context spans = {NULL, NULL, NULL, 0, 1, head_dim, segments, begins, n_segments, 0};
    return prefill(&spans, q, out, &first, &news, &start, NULL, 1, heads, kv_heads, 0, 0, threads, scale);
}
