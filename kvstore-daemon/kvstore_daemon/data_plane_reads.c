/* The daemon's data-plane reads of DRAM chunks, answered in C (data_plane_reads.py).

A connection's thread calls dpr_serve with its socket: it receives each request frame,
answers an unheld keyed read of registered chunks itself (reply, payload straight from the
arena, trailer) and loops; any other frame it hands back to Python whole, which answers it
exactly as before (so every refusal is Python's). The GIL is never taken: ctypes releases it
for the call, and nothing here calls into Python.

The table maps (namespace, key) to where a chunk lay in the arena when it was committed or
promoted to DRAM (or when Python last sent it unheld), until it leaves (dpr_forget): its
extents, its blocks and their versions, its header's length and its layers' offsets (a few
hundred bytes an entry; the header itself is read from the arena). An entry is trusted
only while its blocks keep those versions (the daemon bumps a block's version
before it frees or invalidates it, shm_arena.BlockVersions): checked after the headers are
copied into the reply and before it is sent (a mismatch hands the frame to Python), and
after the payload (the trailer's "valid"), the seqlock read of the Python path. Freed
blocks stay mapped, so a raced send reads the new owner's bytes and says valid=false; it
never touches unmapped memory: dpr_close waits, under the table's lock, until no serve is
inside the arena (`active`).

Entries are copied out under the lock, so another thread may drop or replace one meanwhile. */

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_KEYS 64      /* per request served here; more go to Python */
#define MAX_EXTENTS 16   /* per chunk */
#define MAX_BLOCKS 64    /* per chunk */
#define MAX_LAYERS 256
#define MAX_NAME 64      /* namespace and key bytes */
#define IOV_BATCH 1024   /* IOV_MAX on Linux */
#define IOV_CAP 8192     /* iovecs of one answer; more go to Python */
#define REPLY_CAP (256 * 1024)

enum { SERVE_CLOSED = 0, SERVE_FRAME = 1, SERVE_TOO_LONG = 2, SERVE_CLOSING = 3 };

typedef struct entry {
    struct entry *next;
    uint8_t ns_len, key_len;
    uint8_t name[2 * MAX_NAME];
    uint32_t num_extents, num_blocks, num_layers;
    uint64_t header_len;
    uint64_t *extents;  /* (arena offset, length) pairs */
    uint64_t *blocks, *versions;
    uint64_t *layers;   /* layer i: chunk bytes [layers[i], layers[i+1]) */
    uint64_t arrays[];  /* what the four point into, sized to this chunk */
} entry;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t idle;
    uint8_t *arena;
    uint64_t arena_bytes, num_blocks;
    volatile uint64_t *versions;
    entry **buckets;
    uint32_t num_buckets, count, capacity, max_keys;
    int active, closing;
    /* served reads the event loop has yet to note: (ns_len, ns, key_len, key) records */
    uint8_t *reads;
    uint64_t reads_len, reads_cap, reads_dropped, bytes_sent, chunks_sent;
    int wake_fd, wake_armed;
} table;

/* ---- the table -------------------------------------------------------------------- */

static uint64_t hash(const uint8_t *ns, size_t ns_len, const uint8_t *key, size_t key_len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < ns_len; i++) h = (h ^ ns[i]) * 1099511628211ull;
    for (size_t i = 0; i < key_len; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

static entry **slot(table *t, const uint8_t *ns, size_t ns_len, const uint8_t *key, size_t key_len) {
    entry **at = &t->buckets[hash(ns, ns_len, key, key_len) % t->num_buckets];
    for (; *at; at = &(*at)->next) {
        entry *e = *at;
        if (e->ns_len == ns_len && e->key_len == key_len && !memcmp(e->name, ns, ns_len)
            && !memcmp(e->name + ns_len, key, key_len))
            return at;
    }
    return at;
}

static void unlink_entry(table *t, entry **at) {
    entry *e = *at;
    *at = e->next;
    free(e);
    t->count--;
}

static int versions_match(const table *t, const uint64_t *blocks, const uint64_t *versions, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&t->versions[blocks[i]], __ATOMIC_ACQUIRE) != versions[i]) return 0;
    return 1;
}

/* Drops entries whose chunks left their blocks (called when the table is full). */
static void sweep(table *t) {
    for (uint32_t b = 0; b < t->num_buckets; b++)
        for (entry **at = &t->buckets[b]; *at;)
            if (!versions_match(t, (*at)->blocks, (*at)->versions, (*at)->num_blocks)) unlink_entry(t, at);
            else at = &(*at)->next;
}

void *dpr_open(uint8_t *arena, uint64_t arena_bytes, uint64_t *versions, uint64_t num_blocks, uint32_t capacity,
               uint32_t max_keys, int wake_fd, uint64_t reads_cap) {
    table *t = calloc(1, sizeof(table));
    if (!t) return NULL;
    t->num_buckets = capacity ? capacity : 1;
    t->buckets = calloc(t->num_buckets, sizeof(entry *));
    t->reads = malloc(reads_cap);
    if (!t->buckets || !t->reads) {
        free(t->buckets);
        free(t->reads);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->idle, NULL);
    t->arena = arena;
    t->arena_bytes = arena_bytes;
    t->versions = versions;
    t->num_blocks = num_blocks;
    t->capacity = capacity;
    t->max_keys = max_keys < MAX_KEYS ? max_keys : MAX_KEYS;
    t->wake_fd = wake_fd;
    t->wake_armed = 1;
    t->reads_cap = reads_cap;
    return t;
}

/* Registers (or replaces) a chunk's place; 0 when registered, -1 when it does not fit the
   table's limits (the chunk stays on the Python path). */
int dpr_register(void *handle, const uint8_t *ns, uint32_t ns_len, const uint8_t *key, uint32_t key_len,
                 uint64_t header_len, const uint64_t *extents, uint32_t num_extents, const uint32_t *blocks,
                 const uint64_t *versions, uint32_t num_blocks, const uint64_t *layers, uint32_t num_layers) {
    table *t = handle;
    if (ns_len > MAX_NAME || key_len > MAX_NAME || num_extents > MAX_EXTENTS || num_blocks > MAX_BLOCKS
        || num_layers > MAX_LAYERS || num_layers == 0)
        return -1;
    uint64_t size = 0;
    for (uint32_t i = 0; i < num_extents; i++) {
        if (extents[2 * i] + extents[2 * i + 1] > t->arena_bytes) return -1;
        size += extents[2 * i + 1];
    }
    for (uint32_t i = 0; i < num_blocks; i++)
        if (blocks[i] >= t->num_blocks) return -1;
    if (layers[num_layers] > size || header_len > size || header_len > REPLY_CAP) return -1;
    size_t words = 2 * (size_t)num_extents + 2 * (size_t)num_blocks + num_layers + 1;
    entry *e = calloc(1, sizeof(entry) + words * sizeof(uint64_t));
    if (!e) return -1;
    e->ns_len = (uint8_t)ns_len;
    e->key_len = (uint8_t)key_len;
    memcpy(e->name, ns, ns_len);
    memcpy(e->name + ns_len, key, key_len);
    e->num_extents = num_extents;
    e->num_blocks = num_blocks;
    e->num_layers = num_layers;
    e->header_len = header_len;
    e->extents = e->arrays;
    e->blocks = e->extents + 2 * num_extents;
    e->versions = e->blocks + num_blocks;
    e->layers = e->versions + num_blocks;
    memcpy(e->extents, extents, 2 * num_extents * sizeof(uint64_t));
    for (uint32_t i = 0; i < num_blocks; i++) e->blocks[i] = blocks[i];
    memcpy(e->versions, versions, num_blocks * sizeof(uint64_t));
    memcpy(e->layers, layers, (num_layers + 1) * sizeof(uint64_t));
    pthread_mutex_lock(&t->lock);
    entry **at = slot(t, ns, ns_len, key, key_len);
    if (*at) unlink_entry(t, at);
    if (t->count >= t->capacity) sweep(t);
    int registered = t->count < t->capacity && !t->closing;
    if (registered) {
        at = slot(t, ns, ns_len, key, key_len);
        *at = e;
        t->count++;
    }
    pthread_mutex_unlock(&t->lock);
    if (!registered) {
        free(e);
        return -1;
    }
    return 0;
}

/* Drops a chunk's entry if it still names the copy starting at `first_block` (not a newer
   chunk of the key): called before the copy's blocks go back to the allocator, so no serve
   that starts later takes it (one that took it before is caught by the versions, bumped
   before the blocks are freed). */
void dpr_forget(void *handle, const uint8_t *ns, uint32_t ns_len, const uint8_t *key, uint32_t key_len,
                uint64_t first_block) {
    table *t = handle;
    if (ns_len > MAX_NAME || key_len > MAX_NAME) return;
    pthread_mutex_lock(&t->lock);
    entry **at = slot(t, ns, ns_len, key, key_len);
    if (*at && (*at)->blocks[0] == first_block) unlink_entry(t, at);
    pthread_mutex_unlock(&t->lock);
}

/* Copies the valid reads' records into `out` (reads_cap bytes) and re-arms the wake-up;
   returns their length. Since the last call: `bytes` and `chunks` sent (valid or not), and
   `dropped`, records lost to a full buffer. */
uint64_t dpr_take_reads(void *handle, uint8_t *out, uint64_t *bytes, uint64_t *chunks, uint64_t *dropped) {
    table *t = handle;
    pthread_mutex_lock(&t->lock);
    uint64_t len = t->reads_len;
    memcpy(out, t->reads, len);
    *bytes = t->bytes_sent;
    *chunks = t->chunks_sent;
    *dropped = t->reads_dropped;
    t->reads_len = t->bytes_sent = t->chunks_sent = t->reads_dropped = 0;
    t->wake_armed = 1;
    pthread_mutex_unlock(&t->lock);
    return len;
}

/* Stops serving from the arena: waits until no serve is inside it and drops every entry.
   The table itself stays (a few bytes, once per daemon): a connection's thread may still
   call dpr_serve, which then answers SERVE_CLOSING. */
void dpr_close(void *handle) {
    table *t = handle;
    pthread_mutex_lock(&t->lock);
    t->closing = 1;
    while (t->active) pthread_cond_wait(&t->idle, &t->lock);
    for (uint32_t b = 0; b < t->num_buckets; b++)
        while (t->buckets[b]) unlink_entry(t, &t->buckets[b]);
    pthread_mutex_unlock(&t->lock);
}

/* ---- socket I/O on a non-blocking fd, bounded by the idle timeout -------------------- */

static int wait_fd(int fd, short events, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, timeout_ms);
        if (n > 0) return 0;
        if (n == 0) return -ETIMEDOUT;
        if (errno != EINTR) return -errno;
    }
}

/* 0 when `len` bytes were received; SERVE_CLOSED-style negatives otherwise: -1 on EOF. */
static int recv_all(int fd, uint8_t *buf, size_t len, int timeout_ms) {
    while (len) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, timeout_ms);
            if (rc) return rc;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

static int send_iov(int fd, struct iovec *iov, size_t count, int timeout_ms) {
    while (count) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = count < IOV_BATCH ? count : IOV_BATCH};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(fd, POLLOUT, timeout_ms);
                if (rc) return rc;
                continue;
            }
            if (errno == EINTR) continue;
            return -errno;
        }
        size_t done = (size_t)n;
        while (count && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            count--;
        }
        if (count) {
            iov->iov_base = (uint8_t *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return 0;
}

/* ---- the request: a msgpack map, parsed only as far as a read served here needs ------ */

typedef struct {
    const uint8_t *p, *end;
} reader;

static int take(reader *r, size_t n, const uint8_t **out) {
    if ((size_t)(r->end - r->p) < n) return -1;
    *out = r->p;
    r->p += n;
    return 0;
}

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* A str (fixstr, str8) into (*s, *len). */
static int read_str(reader *r, const uint8_t **s, size_t *len) {
    const uint8_t *tag, *n;
    if (take(r, 1, &tag)) return -1;
    if ((*tag & 0xe0) == 0xa0) *len = *tag & 0x1f;
    else if (*tag == 0xd9 && !take(r, 1, &n)) *len = *n;
    else return -1;
    return take(r, *len, s);
}

/* A bin (bin8, bin16). */
static int read_bin(reader *r, const uint8_t **s, size_t *len) {
    const uint8_t *tag, *n;
    if (take(r, 1, &tag)) return -1;
    if (*tag == 0xc4 && !take(r, 1, &n)) *len = *n;
    else if (*tag == 0xc5 && !take(r, 2, &n)) *len = be(n, 2);
    else return -1;
    return take(r, *len, s);
}

/* A non-negative int (positive fixint, uint8..uint32). */
static int read_uint(reader *r, uint64_t *v) {
    const uint8_t *tag, *n;
    if (take(r, 1, &tag)) return -1;
    if (*tag < 0x80) { *v = *tag; return 0; }
    int width = *tag == 0xcc ? 1 : *tag == 0xcd ? 2 : *tag == 0xce ? 4 : 0;
    if (!width || take(r, (size_t)width, &n)) return -1;
    *v = be(n, width);
    return 0;
}

static int read_len(reader *r, uint8_t fix, uint8_t mask, uint8_t tag16, uint32_t *len) {
    const uint8_t *tag, *n;
    if (take(r, 1, &tag)) return -1;
    if ((*tag & (uint8_t)~mask) == fix) *len = *tag & mask;
    else if (*tag == tag16 && !take(r, 2, &n)) *len = (uint32_t)be(n, 2);
    else return -1;
    return 0;
}

typedef struct {
    const uint8_t *ns, *keys[MAX_KEYS];
    size_t ns_len, key_lens[MAX_KEYS];
    uint32_t num_keys;
    uint64_t layer_start, layer_end;
} read_request;

static int is(const uint8_t *s, size_t len, const char *name) { return len == strlen(name) && !memcmp(s, name, len); }

/* 0 when the frame is an unheld keyed get this file serves, with no field it does not know. */
static int parse(const uint8_t *frame, size_t len, uint32_t max_keys, read_request *q) {
    reader r = {frame, frame + len};
    uint32_t fields;
    int seen = 0; /* bits: op, namespace, keys, layer_start, layer_end, unheld */
    if (read_len(&r, 0x80, 0x0f, 0xde, &fields)) return -1;
    for (uint32_t f = 0; f < fields; f++) {
        const uint8_t *name, *tag;
        size_t name_len;
        int bit;
        if (read_str(&r, &name, &name_len)) return -1;
        if (is(name, name_len, "op")) {
            const uint8_t *op;
            size_t op_len;
            if (read_str(&r, &op, &op_len) || !is(op, op_len, "get")) return -1;
            bit = 1;
        } else if (is(name, name_len, "namespace")) {
            if (read_bin(&r, &q->ns, &q->ns_len)) return -1;
            bit = 2;
        } else if (is(name, name_len, "keys")) {
            if (read_len(&r, 0x90, 0x0f, 0xdc, &q->num_keys) || q->num_keys == 0 || q->num_keys > max_keys) return -1;
            for (uint32_t k = 0; k < q->num_keys; k++)
                if (read_bin(&r, &q->keys[k], &q->key_lens[k])) return -1;
            bit = 4;
        } else if (is(name, name_len, "layer_start")) {
            if (read_uint(&r, &q->layer_start)) return -1;
            bit = 8;
        } else if (is(name, name_len, "layer_end")) {
            if (read_uint(&r, &q->layer_end)) return -1;
            bit = 16;
        } else if (is(name, name_len, "unheld")) {
            if (take(&r, 1, &tag) || *tag != 0xc3) return -1;
            bit = 32;
        } else {
            return -1;
        }
        if (seen & bit) return -1; /* a repeated field: Python decides */
        seen |= bit;
    }
    if (seen != 63 || r.p != r.end) return -1;
    for (uint32_t a = 0; a < q->num_keys; a++) /* a repeated key: Python refuses it */
        for (uint32_t b = a + 1; b < q->num_keys; b++)
            if (q->key_lens[a] == q->key_lens[b] && !memcmp(q->keys[a], q->keys[b], q->key_lens[a])) return -1;
    return 0;
}

/* ---- one read --------------------------------------------------------------------- */

typedef struct {
    uint32_t num_extents, num_blocks, num_layers;
    uint64_t header_len;
    uint64_t extents[2 * MAX_EXTENTS];
    uint64_t blocks[MAX_BLOCKS];
    uint64_t versions[MAX_BLOCKS];
    uint64_t layers[MAX_LAYERS + 1];
} place;

/* Appends iovecs of chunk bytes [start, end) of `c` to iov (a slice of its extents). */
static size_t add_range(const table *t, const place *c, uint64_t start, uint64_t end, struct iovec *iov) {
    size_t n = 0;
    uint64_t position = 0;
    for (uint32_t i = 0; i < c->num_extents && position < end; i++) {
        uint64_t offset = c->extents[2 * i], length = c->extents[2 * i + 1];
        uint64_t lo = start > position ? start : position, hi = end < position + length ? end : position + length;
        if (lo < hi) {
            iov[n].iov_base = t->arena + offset + (lo - position);
            iov[n].iov_len = hi - lo;
            n++;
        }
        position += length;
    }
    return n;
}

static size_t put_bin_header(uint8_t *out, uint32_t len) {
    if (len < 256) { out[0] = 0xc4; out[1] = (uint8_t)len; return 2; }
    if (len < 65536) { out[0] = 0xc5; out[1] = (uint8_t)(len >> 8); out[2] = (uint8_t)len; return 3; }
    out[0] = 0xc6;
    for (int i = 0; i < 4; i++) out[1 + i] = (uint8_t)(len >> (24 - 8 * i));
    return 5;
}

static void put_length(uint8_t *out, uint32_t len) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(len >> (24 - 8 * i));
}

static void note_read(table *t, const read_request *q) {
    uint64_t need = 0;
    for (uint32_t k = 0; k < q->num_keys; k++) need += 2 + q->ns_len + q->key_lens[k];
    if (t->reads_len + need > t->reads_cap) {
        t->reads_dropped += q->num_keys;
        return;
    }
    for (uint32_t k = 0; k < q->num_keys; k++) {
        uint8_t *at = t->reads + t->reads_len;
        at[0] = (uint8_t)q->ns_len;
        memcpy(at + 1, q->ns, q->ns_len);
        at[1 + q->ns_len] = (uint8_t)q->key_lens[k];
        memcpy(at + 2 + q->ns_len, q->keys[k], q->key_lens[k]);
        t->reads_len += 2 + q->ns_len + q->key_lens[k];
    }
}

/* Tells the event loop, once per drain, that there is something to take. */
static void wake(table *t) {
    if (t->wake_armed) {
        uint64_t one = 1;
        t->wake_armed = 0;
        if (write(t->wake_fd, &one, sizeof one) < 0) t->wake_armed = 1;
    }
}

/* Copies the places of `q`'s chunks (under the lock); 0 when a chunk is not registered
   or has left its blocks (its entry is then dropped), or the chunks differ in layers. */
static int collect(table *t, const read_request *q, place *places) {
    for (uint32_t k = 0; k < q->num_keys; k++) {
        entry **at = slot(t, q->ns, q->ns_len, q->keys[k], q->key_lens[k]);
        entry *e = *at;
        if (!e) return 0;
        if (!versions_match(t, e->blocks, e->versions, e->num_blocks)) {
            unlink_entry(t, at);
            return 0;
        }
        if (k && e->num_layers != places[0].num_layers) return 0;
        place *c = &places[k];
        c->num_extents = e->num_extents;
        c->num_blocks = e->num_blocks;
        c->num_layers = e->num_layers;
        c->header_len = e->header_len;
        memcpy(c->extents, e->extents, 2 * e->num_extents * sizeof(uint64_t));
        memcpy(c->blocks, e->blocks, e->num_blocks * sizeof(uint64_t));
        memcpy(c->versions, e->versions, e->num_blocks * sizeof(uint64_t));
        memcpy(c->layers, e->layers, (e->num_layers + 1) * sizeof(uint64_t));
    }
    return 1;
}

/* Whether no block of `q`'s chunks changed since `collect`: the second read of the
   seqlock, so the fence keeps the copies before it (headers, payload) ahead of it. */
static int all_unchanged(const table *t, const read_request *q, const place *places) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (uint32_t k = 0; k < q->num_keys; k++)
        if (!versions_match(t, places[k].blocks, places[k].versions, places[k].num_blocks)) return 0;
    return 1;
}

/* The reply frame, byte for byte what msgpack packs for the Python path's {"headers":
   [bin...], "trailer": true, "ok": true} after its length, with each chunk's header copied
   from the arena; its length, or 0 when it would not fit REPLY_CAP. */
static size_t build_reply(const table *t, const read_request *q, const place *places, uint8_t *reply) {
    static const uint8_t headers[] = {0x83, 0xa7, 'h', 'e', 'a', 'd', 'e', 'r', 's'};
    static const uint8_t trailer_ok[] = {0xa7, 't', 'r', 'a', 'i', 'l', 'e', 'r', 0xc3, 0xa2, 'o', 'k', 0xc3};
    struct iovec pieces[MAX_EXTENTS];
    size_t len = 4;
    memcpy(reply + len, headers, sizeof headers);
    len += sizeof headers;
    if (q->num_keys < 16) {
        reply[len++] = (uint8_t)(0x90 | q->num_keys);
    } else {
        reply[len++] = 0xdc;
        reply[len++] = (uint8_t)(q->num_keys >> 8);
        reply[len++] = (uint8_t)q->num_keys;
    }
    for (uint32_t k = 0; k < q->num_keys; k++) {
        const place *c = &places[k];
        if (len + 5 + c->header_len + sizeof trailer_ok > REPLY_CAP) return 0;
        len += put_bin_header(reply + len, (uint32_t)c->header_len);
        size_t n = add_range(t, c, 0, c->header_len, pieces);
        for (size_t i = 0; i < n; i++) {
            memcpy(reply + len, pieces[i].iov_base, pieces[i].iov_len);
            len += pieces[i].iov_len;
        }
    }
    memcpy(reply + len, trailer_ok, sizeof trailer_ok);
    len += sizeof trailer_ok;
    put_length(reply, (uint32_t)(len - 4));
    return len;
}

/* Serves `q` if every chunk is registered and still in its blocks: 1 when answered, 0 when
   Python must answer it, negative when the connection failed mid-answer. */
static int answer(table *t, int fd, const read_request *q, int timeout_ms, place *places, uint8_t *reply,
                  struct iovec *iov) {
    pthread_mutex_lock(&t->lock);
    int found = collect(t, q, places);
    pthread_mutex_unlock(&t->lock);
    if (!found) return 0;
    uint64_t num_layers = places[0].num_layers;
    uint64_t start = q->layer_start, end = q->layer_end ? q->layer_end : num_layers;
    if (!(start < end && end <= num_layers)) return 0; /* Python says OutOfRange */
    size_t reply_len = build_reply(t, q, places, reply);
    /* the headers are the chunks' only if no block changed while they were copied */
    if (!reply_len || !all_unchanged(t, q, places)) return 0;
    size_t n = 0;
    iov[n].iov_base = reply;
    iov[n++].iov_len = reply_len;
    if (q->num_keys == 1) { /* one chunk's layer range is contiguous */
        n += add_range(t, &places[0], places[0].layers[start], places[0].layers[end], iov + n);
    } else {
        uint64_t most = 0; /* a chunk's layers cut its extents into at most layers + extents pieces */
        for (uint32_t k = 0; k < q->num_keys; k++) most += end - start + places[k].num_extents;
        if (most > IOV_CAP) return 0;
        for (uint64_t layer = start; layer < end; layer++)
            for (uint32_t k = 0; k < q->num_keys; k++)
                n += add_range(t, &places[k], places[k].layers[layer], places[k].layers[layer + 1], iov + n);
    }
    uint64_t payload = 0;
    for (size_t i = 1; i < n; i++) payload += iov[i].iov_len;
    int rc = send_iov(fd, iov, n, timeout_ms);
    if (rc) return rc;
    int valid = all_unchanged(t, q, places);
    /* the trailer: {"ok": true, "valid": valid} */
    uint8_t trailer[] = {0, 0, 0, 12, 0x82, 0xa2, 'o', 'k', 0xc3, 0xa5, 'v', 'a', 'l', 'i', 'd', valid ? 0xc3 : 0xc2};
    struct iovec out = {trailer, sizeof trailer};
    rc = send_iov(fd, &out, 1, timeout_ms);
    pthread_mutex_lock(&t->lock);
    t->bytes_sent += payload;
    t->chunks_sent += q->num_keys;
    if (valid) note_read(t, q);
    wake(t);
    pthread_mutex_unlock(&t->lock);
    return rc ? rc : 1;
}

/* Serves frames on `fd` until one Python must answer: SERVE_FRAME with its body in `frame`
   (*frame_len bytes), SERVE_TOO_LONG with the declared length in *frame_len (over
   frame_cap), SERVE_CLOSED when the peer closed between frames, SERVE_CLOSING when the
   table is closing, or -errno (-1: closed mid-frame; -ETIMEDOUT: idle past timeout_ms). */
int dpr_serve(void *handle, int fd, int timeout_ms, uint8_t *frame, uint32_t frame_cap, uint32_t *frame_len) {
    table *t = handle;
    read_request q;
    place *places = malloc(MAX_KEYS * sizeof(place));
    uint8_t *reply = malloc(REPLY_CAP);
    struct iovec *iov = malloc((IOV_CAP + MAX_EXTENTS) * sizeof(struct iovec));
    int rc;
    if (!places || !reply || !iov) {
        rc = -ENOMEM;
        goto done;
    }
    for (;;) {
        uint8_t prefix[4];
        rc = recv_all(fd, prefix, 4, timeout_ms);
        if (rc == -1) {
            rc = SERVE_CLOSED;
            goto done;
        }
        if (rc) goto done;
        *frame_len = (uint32_t)be(prefix, 4);
        if (*frame_len > frame_cap) {
            rc = SERVE_TOO_LONG;
            goto done;
        }
        rc = recv_all(fd, frame, *frame_len, timeout_ms);
        if (rc) goto done;
        memset(&q, 0, sizeof q);
        if (parse(frame, *frame_len, t->max_keys, &q)) {
            rc = SERVE_FRAME;
            goto done;
        }
        pthread_mutex_lock(&t->lock);
        int closing = t->closing;
        if (!closing) t->active++;
        pthread_mutex_unlock(&t->lock);
        if (closing) {
            rc = SERVE_CLOSING;
            goto done;
        }
        rc = answer(t, fd, &q, timeout_ms, places, reply, iov);
        pthread_mutex_lock(&t->lock);
        if (--t->active == 0 && t->closing) pthread_cond_broadcast(&t->idle);
        pthread_mutex_unlock(&t->lock);
        if (rc == 0) {
            rc = SERVE_FRAME;
            goto done;
        }
        if (rc < 0) goto done;
    }
done:
    free(places);
    free(reply);
    free(iov);
    return rc;
}
