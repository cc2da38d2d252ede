/* The staging planner: eligibility per call, greedy fills, one submission and one scatter per
 * fill, lease checks before scattering, and every fallback decided before anything is
 * submitted. Backends (host memcpy, CUDA) only allocate and scatter. */
#define _GNU_SOURCE
#include "staging_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_BUFFER_BYTES (256ull << 20)

/* The working arrays a call keeps in the staging object (see scratch()). */
enum {
    SCR_BITS,
    SCR_SPANS,
    SCR_TMP,
    SCR_COUNT,
    SCR_OFF,
    SCR_FILL_END,
    SCR_REQS,
    SCR_SUB,
    SCR_BUFV,
    SCR_FRAGS,
    SCR_COUNT_
};

typedef struct {
    void *p;
    size_t cap;
} scratch_t;

struct kvs__staging {
    kvs__staging_config_t cfg;
    const kvs__staging_backend_t *be;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool busy;      /* a call (or the hold hook) owns the buffer */
    bool disabled;  /* the allocation failed: never again */
    void *buf;      /* allocated on the first staged call */
    int buf_domain; /* the domain it was allocated in */
    kvs__staging_hooks_t hooks;
    kvs__staging_stats_t st;
    scratch_t scr[SCR_COUNT_]; /* owned by the call that holds the buffer */
};

static const char *const fallback_names[] = {
#define KVS_FB_NAME_(name) #name,
    KVS_STAGING_FALLBACKS(KVS_FB_NAME_)
#undef KVS_FB_NAME_
};

const char *kvs__staging_fallback_name(kvs__fallback_t f)
{
    return (unsigned)f < KVS_FALLBACK_COUNT_ ? fallback_names[f] : "unknown";
}

int kvs__staging_config_init(kvs__staging_config_t *cfg)
{
    *cfg = (kvs__staging_config_t){.buffer_bytes = DEFAULT_BUFFER_BYTES};
    int rc = KVS_OK;
    if (kvs__env_bool("MC_STORE_GPU_STAGING", &cfg->enabled) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
    if (kvs__env_size("MC_STORE_GPU_STAGING_BUFFER_BYTES", &cfg->buffer_bytes) != KVS_OK ||
        cfg->buffer_bytes == 0) {
        cfg->buffer_bytes = DEFAULT_BUFFER_BYTES;
        rc = KVS_INVALID_PARAMS;
    }
    if (kvs__env_u64("MC_STORE_GPU_STAGING_BUSY_WAIT_US", 60000000, &cfg->busy_wait_us) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
    if (kvs__env_bool("MC_STORE_GPU_STAGING_HALF_FILLS", &cfg->half_fills) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
    const char *be = getenv("MC_STORE_GPU_STAGING_BACKEND");
    if (be != NULL && *be != '\0') {
        if (strcmp(be, "host") == 0) {
            cfg->backend = "host";
        } else {
            kvs_warn("MC_STORE_GPU_STAGING_BACKEND=%s is not 'host'; using the GPU backend", be);
            rc = KVS_INVALID_PARAMS;
        }
    }
    if (rc != KVS_OK)
        kvs__fail(rc, "a MC_STORE_GPU_STAGING* variable is malformed; its default is used");
    return rc;
}

int kvs__staging_create(const kvs__staging_config_t *cfg, kvs__staging_t **st_p)
{
    *st_p = NULL;
    if (!cfg->enabled)
        return KVS_OK;
    kvs__staging_t *st = kvs__calloc(1, sizeof(*st));
    if (st == NULL)
        return KVS_NO_MEMORY;
    st->cfg = *cfg;
#ifdef KVS_HAVE_CUDA
    st->be = cfg->backend != NULL ? &kvs__staging_backend_host : &kvs__staging_backend_cuda;
#else
    st->be = cfg->backend != NULL ? &kvs__staging_backend_host : &kvs__staging_backend_none;
#endif
    st->hooks.fail_receive_key = -1;
    pthread_mutex_init(&st->lock, NULL);
    kvs__cond_init(&st->cond);
    if (st->be == &kvs__staging_backend_none)
        kvs_warn("GPU read staging was asked for, but this build has no GPU staging backend: "
                 "reads take the direct path");
    else
        kvs_info("GPU read staging on: %s backend, %llu-byte buffer (allocated on first use)",
                 st->be->name, (unsigned long long)cfg->buffer_bytes);
    *st_p = st;
    return KVS_OK;
}

void kvs__staging_destroy(kvs__staging_t *st)
{
    if (st == NULL)
        return;
    if (st->buf != NULL)
        st->be->free(st->buf_domain, st->buf);
    for (int i = 0; i < SCR_COUNT_; i++)
        kvs__free(st->scr[i].p);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    kvs__free(st);
}

const kvs__staging_stats_t *kvs__staging_stats(const kvs__staging_t *st)
{
    return &st->st;
}

/* ---- the buffer ------------------------------------------------------------------------------ */

/* Takes the buffer, waiting up to busy_wait_us for another call to let go. */
static bool buffer_acquire(kvs__staging_t *st)
{
    pthread_mutex_lock(&st->lock);
    if (st->busy && st->cfg.busy_wait_us > 0) {
        uint64_t until = kvs__now_ns() + st->cfg.busy_wait_us * 1000;
        while (st->busy && kvs__cond_wait_until(&st->cond, &st->lock, until))
            ;
    }
    bool got = !st->busy;
    if (got)
        st->busy = true;
    pthread_mutex_unlock(&st->lock);
    return got;
}

static void buffer_release(kvs__staging_t *st)
{
    pthread_mutex_lock(&st->lock);
    st->busy = false;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

int kvs__staging_hold(kvs__staging_t *st, bool on)
{
    if (st == NULL)
        return KVS_INVALID_PARAMS;
    if (on)
        return buffer_acquire(st) ? KVS_OK : KVS_INVALID_PARAMS;
    buffer_release(st);
    return KVS_OK;
}

void kvs__staging_set_hooks(kvs__staging_t *st, const kvs__staging_hooks_t *hooks)
{
    pthread_mutex_lock(&st->lock);
    st->hooks = *hooks;
    pthread_mutex_unlock(&st->lock);
}

void *kvs__staging_buffer(kvs__staging_t *st, uint64_t *bytes_p)
{
    *bytes_p = st->cfg.buffer_bytes;
    return st->buf;
}

/* ---- scratch ----------------------------------------------------------------------------------
 */

/* Working arrays of a call, kept between calls (a call over 147k fragments would otherwise map,
 * fault in and unmap megabytes each time). Used only by the call that holds the buffer. */
static void *scratch(kvs__staging_t *st, int slot, size_t bytes)
{
    scratch_t *s = &st->scr[slot];
    if (bytes > s->cap) {
        size_t cap = KVS_MAX(bytes, s->cap * 2);
        void *p = kvs__realloc(s->p, cap);
        if (p == NULL)
            return NULL;
        s->p = p;
        s->cap = cap;
    }
    return s->p;
}

/* ---- eligibility ----------------------------------------------------------------------------- */

typedef struct {
    uint64_t start, end;
} span_t;

/* Sorts spans by start: LSD radix sort on 16-bit digits, skipping digits all starts share (a
 * call's fragments usually lie in one buffer, so the high digits are equal). Linear in the
 * number of spans, where qsort cost ~250 ns per fragment at 147k fragments. */
static bool sort_spans(kvs__staging_t *st, span_t *s, size_t n)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = KVS_MIN(lo, s[i].start);
        hi = KVS_MAX(hi, s[i].start);
    }
    span_t *tmp = scratch(st, SCR_TMP, KVS_MAX(n, 1) * sizeof(*tmp));
    size_t *count = scratch(st, SCR_COUNT, 65536 * sizeof(*count));
    if (tmp == NULL || count == NULL)
        return false;
    uint64_t differ = lo ^ hi;
    for (unsigned shift = 0; shift < 64; shift += 16) {
        if ((differ >> shift) == 0)
            break; /* no digit from here up differs */
        if (((differ >> shift) & 0xffff) == 0)
            continue;
        memset(count, 0, 65536 * sizeof(*count));
        for (size_t i = 0; i < n; i++)
            count[(s[i].start >> shift) & 0xffff]++;
        size_t pos = 0;
        for (size_t d = 0; d < 65536; d++) {
            size_t c = count[d];
            count[d] = pos;
            pos += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[(s[i].start >> shift) & 0xffff]++] = s[i];
        memcpy(s, tmp, n * sizeof(*s));
    }
    return true;
}

/* Marks bits [a, b); true when one of them was already set. */
static bool bits_claim(uint64_t *bm, uint64_t a, uint64_t b)
{
    bool hit = false;
    while (a < b) {
        uint64_t lo = a & 63, n = KVS_MIN(64 - lo, b - a);
        uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << lo;
        hit |= (bm[a >> 6] & mask) != 0;
        bm[a >> 6] |= mask;
        a += n;
    }
    return hit;
}

/* Bitmap granules per fragment the overlap check may spend before it sorts instead. */
#define OVERLAP_BITS_PER_FRAG 64u
#define OVERLAP_BITS_MIN      (1u << 20)

/* True when two fragments of the call share a byte; *oom_p when the check could not run.
 * Fragments are usually pages of one pool: when every start and length is a multiple of a
 * granule g (the largest power of two dividing them all) and the fragments span few enough
 * granules, one bit per granule finds a shared byte in one pass (~2 ns per page); otherwise the
 * spans are radix-sorted and neighbours compared. */
static bool fragments_overlap(kvs__staging_t *st, const kvs__staged_key_t *keys, uint32_t n,
                              bool *oom_p)
{
    size_t nf = 0;
    uint64_t lo = UINT64_MAX, hi = 0, bits = 0;
    for (uint32_t i = 0; i < n; i++) {
        nf += keys[i].iovcnt;
        for (uint32_t j = 0; j < keys[i].iovcnt; j++) {
            uint64_t p = (uintptr_t)keys[i].iov[j].iov_base, l = keys[i].iov[j].iov_len;
            lo = KVS_MIN(lo, p);
            hi = KVS_MAX(hi, p + l);
            bits |= p | l;
        }
    }
    if (nf < 2)
        return false;
    unsigned g = (unsigned)__builtin_ctzll(bits | (1ull << 63));
    uint64_t granules = (hi - lo) >> g;
    if (granules <= KVS_MAX((uint64_t)OVERLAP_BITS_MIN, (uint64_t)nf * OVERLAP_BITS_PER_FRAG)) {
        size_t words = (size_t)(granules + 63) / 64;
        uint64_t *bm = scratch(st, SCR_BITS, words * sizeof(*bm));
        if (bm == NULL) {
            *oom_p = true;
            return false;
        }
        memset(bm, 0, words * sizeof(*bm));
        for (uint32_t i = 0; i < n; i++) {
            for (uint32_t j = 0; j < keys[i].iovcnt; j++) {
                uint64_t a = ((uintptr_t)keys[i].iov[j].iov_base - lo) >> g;
                if (bits_claim(bm, a, a + (keys[i].iov[j].iov_len >> g)))
                    return true;
            }
        }
        return false;
    }
    span_t *s = scratch(st, SCR_SPANS, nf * sizeof(*s));
    if (s == NULL) {
        *oom_p = true;
        return false;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < keys[i].iovcnt; j++) {
            uint64_t p = (uintptr_t)keys[i].iov[j].iov_base;
            s[k++] = (span_t){p, p + keys[i].iov[j].iov_len};
        }
    }
    if (!sort_spans(st, s, nf)) {
        *oom_p = true;
        return false;
    }
    for (size_t i = 1; i < nf; i++)
        if (s[i].start < s[i - 1].end)
            return true;
    return false;
}

/* The first reason the call cannot stage that needs no buffer (domain, size), or -1;
 * *domain_p is the call's domain. */
static int check_keys(const kvs__staging_t *st, const kvs__staged_key_t *keys, uint32_t n,
                      int *domain_p)
{
    int domain = -1;
    for (uint32_t i = 0; i < n; i++) {
        const kvs__staged_key_t *k = &keys[i];
        if (!KVS_STAGING_REPLICA_IS_MEMORY || KVS_STAGING_HOT_CACHE_ON)
            return KVS_FALLBACK_other_domain;
        int d = k->domain == KVS_DOMAIN_MIXED ? -1 : st->be->domain_of(k->domain);
        if (d < 0 || (domain >= 0 && d != domain))
            return KVS_FALLBACK_other_domain;
        domain = d;
        if (k->size > st->cfg.buffer_bytes)
            return KVS_FALLBACK_too_large;
    }
    *domain_p = domain;
    return -1;
}

static int fall_back(kvs__staging_t *st, kvs__fallback_t why)
{
    atomic_fetch_add(&st->st.fallback[why], 1);
    kvs_debug("staging: call falls back to direct reads (%s)", fallback_names[why]);
    return KVS_UNSUPPORTED;
}

/* ---- fills ----------------------------------------------------------------------------------- */

/* A fill's scatter while it may still run: the part of the buffer it reads is not reused until
 * fill_finish. */
typedef struct {
    bool launched;
    void *done; /* the backend's token */
    uint32_t a, b, keys;
} pending_t;

/* Waits for a fill's scatter until the call's deadline, where the backend aborts it: either way
 * nothing writes the keys' destinations once this returns. A failed or aborted one fails the keys
 * it carried (never replayed): TIMED_OUT when the deadline stopped it. */
static void fill_finish(kvs__staging_t *st, kvs__staged_key_t *keys, pending_t *p,
                        uint64_t deadline_ns)
{
    if (!p->launched)
        return;
    p->launched = false;
    int rc = st->be->scatter_wait(st->buf_domain, p->done, deadline_ns);
    if (rc != KVS_OK) {
        int fail = rc == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_TRANSFER_FAIL;
        kvs_warn("staging: scatter failed (%s); %u key(s) fail", kvs_status_str(rc), p->keys);
        for (uint32_t i = p->a; i < p->b; i++) {
            if (keys[i].status == KVS_OK)
                keys[i].status = fail;
        }
    }
}

/* Receives keys [a, b) at offsets off[] from `base` in the buffer and starts the scatter of the
 * ones that arrived in time (*p, finished by fill_finish). */
static void run_fill(kvs__staging_t *st, kvs__staged_key_t *keys, uint32_t a, uint32_t b,
                     const uint64_t *off, uint64_t base, uint64_t deadline_ns, kvs_xfer_req_t *reqs,
                     struct iovec *bufv, kvs__scatter_frag_t *frags, pending_t *p)
{
    char *buf = (char *)st->buf + base;
    uint32_t nr = b - a;
    for (uint32_t i = a; i < b; i++) {
        bufv[i - a] = (struct iovec){buf + off[i], (size_t)keys[i].size};
        reqs[i - a] = (kvs_xfer_req_t){KVS_XFER_READ,
                                       keys[i].ep,
                                       keys[i].segment_id,
                                       keys[i].offset,
                                       keys[i].size,
                                       &bufv[i - a],
                                       1,
                                       KVS_OK,
                                       st->be->device_memory ? (uint32_t)st->buf_domain + 1 : 0,
                                       0,
                                       0,
                                       0,
                                       0,
                                       0};
    }
    if (kvs__now_ns() >= deadline_ns) {
        for (uint32_t i = a; i < b; i++)
            keys[i].status = KVS_TIMED_OUT;
        return;
    }
    /* One submission per fill and transport (keys may be read over tcp and shm), both in
     * flight together; each wait drains its batch (cancels at the deadline) before returning. */
    kvs_transport_t *ts[2] = {keys[a].t, NULL};
    for (uint32_t i = a; i < b && ts[1] == NULL; i++)
        if (keys[i].t != ts[0])
            ts[1] = keys[i].t;
    kvs_batch_t *batch[2] = {NULL, NULL};
    kvs_xfer_req_t *sub[2] = {NULL, NULL};
    kvs_xfer_req_t *subs = scratch(st, SCR_SUB, 2 * (size_t)nr * sizeof(*subs));
    int src = KVS_OK;
    for (int k = 0; k < 2 && ts[k] != NULL && src == KVS_OK; k++) {
        sub[k] = subs != NULL ? subs + (size_t)k * nr : NULL;
        uint32_t m = 0;
        for (uint32_t i = a; sub[k] != NULL && i < b; i++)
            if (keys[i].t == ts[k])
                sub[k][m++] = reqs[i - a];
        if (sub[k] == NULL ||
            ts[k]->ops->submit(ts[k], sub[k], m, deadline_ns, &batch[k]) != KVS_OK) {
            batch[k] = NULL;
            src = KVS_NO_MEMORY;
        }
    }
    for (int k = 0; k < 2; k++) {
        if (batch[k] != NULL)
            ts[k]->ops->wait(ts[k], batch[k], deadline_ns);
        uint32_t m = 0;
        for (uint32_t i = a; sub[k] != NULL && i < b; i++)
            if (keys[i].t == ts[k])
                reqs[i - a].status = batch[k] != NULL ? sub[k][m++].status : KVS_NO_MEMORY;
    }
    atomic_fetch_add(&st->st.fills, 1);
    uint64_t now = kvs__now_ns();
    uint32_t nf = 0, scatter_keys = 0;
    uint64_t pos = 0;
    for (uint32_t i = a; i < b; i++) {
        int s = src != KVS_OK ? src : reqs[i - a].status;
        if ((int64_t)i == st->hooks.fail_receive_key)
            s = KVS_TRANSFER_FAIL;
        if (s == KVS_OK && now > keys[i].lease_until_ns)
            s = KVS_LEASE_EXPIRED; /* the owner may have reused the space: never scatter */
        else if (s != KVS_OK && s != KVS_TIMED_OUT)
            s = KVS_TRANSFER_FAIL;
        keys[i].status = s;
        if (off[i] > pos)
            frags[nf++] = (kvs__scatter_frag_t){NULL, off[i] - pos}; /* padding */
        if (s == KVS_OK) {
            for (uint32_t j = 0; j < keys[i].iovcnt; j++)
                frags[nf++] =
                    (kvs__scatter_frag_t){keys[i].iov[j].iov_base, keys[i].iov[j].iov_len};
            scatter_keys++;
        } else {
            frags[nf++] = (kvs__scatter_frag_t){NULL, keys[i].size};
        }
        pos = off[i] + keys[i].size;
    }
    if (scatter_keys == 0)
        return;
    void *done = NULL;
    int rc = st->hooks.fail_scatter ? KVS_TRANSFER_FAIL
                                    : st->be->scatter(st->buf_domain, buf, frags, nf, deadline_ns,
                                                      st->hooks.stall_scatter, &done);
    atomic_fetch_add(&st->st.scatter_launches, 1);
    *p = (pending_t){true, done, a, b, scatter_keys};
    if (rc != KVS_OK) {
        p->launched = false;
        kvs_warn("staging: scatter failed (%s); %u key(s) fail", kvs_status_str(rc), scatter_keys);
        for (uint32_t i = a; i < b; i++) {
            if (keys[i].status == KVS_OK)
                keys[i].status = KVS_TRANSFER_FAIL;
        }
    }
}

int kvs__staging_read(kvs__staging_t *st, kvs__staged_key_t *keys, uint32_t n, uint64_t deadline_ns)
{
    if (st == NULL || n == 0)
        return KVS_UNSUPPORTED;
    uint64_t t_enter = kvs__now_ns();
    int domain = -1;
    int why = check_keys(st, keys, n, &domain);
    if (why >= 0)
        return fall_back(st, (kvs__fallback_t)why);
    uint64_t t_wait = kvs__now_ns();
    if (!buffer_acquire(st))
        return fall_back(st, KVS_FALLBACK_busy);
    /* From here the call owns the buffer and the scratch arrays. */
    uint64_t t_held = kvs__now_ns();
    int ret = KVS_UNSUPPORTED;
    bool oom = false;
    if (fragments_overlap(st, keys, n, &oom)) {
        fall_back(st, KVS_FALLBACK_overlap);
        goto release;
    }
    if (oom || st->disabled) {
        fall_back(st, KVS_FALLBACK_alloc_failed);
        goto release;
    }
    if (st->buf == NULL) {
        int rc = st->hooks.fail_alloc ? KVS_NO_MEMORY
                                      : st->be->alloc(domain, st->cfg.buffer_bytes, &st->buf);
        if (rc != KVS_OK) {
            st->buf = NULL;
            st->disabled = true;
            kvs_warn("staging: cannot allocate the %llu-byte %s staging buffer (%s); staging is "
                     "off for this client",
                     (unsigned long long)st->cfg.buffer_bytes, st->be->name, kvs_status_str(rc));
            fall_back(st, KVS_FALLBACK_alloc_failed);
            goto release;
        }
        st->buf_domain = domain;
        atomic_store(&st->st.held_bytes, st->cfg.buffer_bytes);
    } else if (domain != st->buf_domain) {
        fall_back(st, KVS_FALLBACK_other_gpu);
        goto release;
    }
    /* Plan every fill before the first submission. */
    size_t maxf = 0;
    for (uint32_t i = 0; i < n; i++)
        maxf += keys[i].iovcnt + 1;
    uint64_t *off = scratch(st, SCR_OFF, n * sizeof(*off));
    uint32_t *fill_end = scratch(st, SCR_FILL_END, n * sizeof(*fill_end));
    kvs_xfer_req_t *reqs = scratch(st, SCR_REQS, n * sizeof(*reqs));
    struct iovec *bufv = scratch(st, SCR_BUFV, n * sizeof(*bufv));
    kvs__scatter_frag_t *frags = scratch(st, SCR_FRAGS, maxf * sizeof(*frags));
    if (off == NULL || fill_end == NULL || reqs == NULL || bufv == NULL || frags == NULL) {
        fall_back(st, KVS_FALLBACK_alloc_failed);
        goto release;
    }
    /* Half fills (opt-in, MC_STORE_GPU_STAGING_HALF_FILLS=1): when every key fits half the
     * buffer and is read by a transport whose submissions cost no ramp-up (shm), fills take
     * half each, in turn, so a fill's receive overlaps the previous fill's scatter (DESIGN §1
     * allows reusing parts of the buffer so). Otherwise, and by default, fills take the whole
     * buffer one after another. On the H200 (docs/store_bench.md) half fills moved 96 x 12 MiB
     * over shm from 1.19x to 1.17x of the H2D limit but 1536 x 384 KiB from 1.29x to 1.41x
     * (twice the fills, each with its own synchronised copy batch); over tcp every fill ends in
     * a drain where connections idle, and halving fills doubled those (0.83x -> 0.88x of raw
     * tcp), so tcp never takes them. */
    uint64_t half = st->cfg.buffer_bytes / 2 / KVS_STAGING_ALIGN * KVS_STAGING_ALIGN;
    bool halves = st->cfg.half_fills && half > 0;
    for (uint32_t i = 0; i < n && halves; i++)
        halves = keys[i].size <= half && (keys[i].t->ops->caps & KVS_TRANSPORT_CAP_CHEAP_SUBMIT);
    uint64_t cap = halves ? half : st->cfg.buffer_bytes;
    uint32_t nfills = 0;
    uint64_t cur = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t at = KVS_ALIGN_UP(cur, KVS_STAGING_ALIGN);
        if (i > 0 && at + keys[i].size > cap) {
            fill_end[nfills++] = i; /* a key that does not fit closes the fill */
            at = 0;
        }
        off[i] = at;
        cur = at + keys[i].size;
    }
    fill_end[nfills++] = n;
    atomic_fetch_add(&st->st.staged_reads, 1);
    atomic_fetch_add(&st->st.staged_keys, n);
    kvs_debug("staging: %u key(s) in %u fill(s)", n, nfills);
    /* Planning time, the busy wait excluded. */
    atomic_fetch_add(&st->st.plan_ns, (t_wait - t_enter) + (kvs__now_ns() - t_held));
    pending_t pend[2] = {{0}};
    for (uint32_t f = 0, a = 0; f < nfills; a = fill_end[f++]) {
        pending_t *p = &pend[halves ? f % 2 : 0];
        fill_finish(st, keys, p, deadline_ns); /* the scatter that last read this part */
        run_fill(st, keys, a, fill_end[f], off, halves ? (f % 2) * half : 0, deadline_ns, reqs,
                 bufv, frags, p);
    }
    fill_finish(st, keys, &pend[0], deadline_ns);
    fill_finish(st, keys, &pend[1], deadline_ns);
    ret = KVS_OK;
release:
    buffer_release(st);
    return ret;
}
