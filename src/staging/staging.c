/* The staging planner: eligibility per call, greedy fills, one submission and one scatter per
 * fill, lease checks before scattering, and every fallback decided before anything is
 * submitted. Backends (host memcpy, CUDA) only allocate and scatter. */
#define _GNU_SOURCE
#include "staging_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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
    SCR_BACK,
    SCR_RUNS,
    SCR_TS,
    SCR_PLAN,
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
    bool busy;            /* a call (or the hold hook) owns the buffer */
    atomic_bool disabled; /* the allocation failed: never again (read by calls not holding it) */
    void *buf;            /* allocated on the first staged call */
    int buf_domain;       /* the domain it was allocated in */
    kvs__staging_hooks_t hooks;
    kvs__staging_stats_t st;
    scratch_t scr[SCR_COUNT_]; /* owned by the call that holds the buffer */
    void *plan_dev;            /* page-table plans, in the buffer's domain (grown as needed) */
    size_t plan_cap;
    kvs__policy_t *policy; /* MC_STORE_GPU_STAGING=auto */
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

int kvs__staging_scatter_options(kvs__scatter_options_t *o)
{
    /* A full grid at normal priority: bench/interference.py on the H200 found a bound grid
     * slower for the read and no kinder to a co-running GEMM, and priority a tie (scatter.md). */
    *o = (kvs__scatter_options_t){.blocks = 0, .high_priority = false};
    int rc = KVS_OK;
    uint64_t blocks = 0;
    if (kvs__env_u64("MC_STORE_GPU_STAGING_SCATTER_BLOCKS", 65535, &blocks) != KVS_OK)
        rc = kvs__fail(KVS_INVALID_PARAMS,
                       "MC_STORE_GPU_STAGING_SCATTER_BLOCKS wants 0 (a full grid) to 65535 "
                       "blocks; a full grid is used");
    else
        o->blocks = (uint32_t)blocks;
    const char *prio = getenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY");
    if (prio != NULL && *prio != '\0' && strcasecmp(prio, "normal") != 0) {
        if (strcasecmp(prio, "high") == 0)
            o->high_priority = true;
        else
            rc = kvs__fail(KVS_INVALID_PARAMS,
                           "MC_STORE_GPU_STAGING_SCATTER_PRIORITY=%s is not 'normal' or 'high'; "
                           "normal is used",
                           prio);
    }
    return rc;
}

int kvs__staging_config_init(kvs__staging_config_t *cfg)
{
    *cfg = (kvs__staging_config_t){
        .buffer_bytes = DEFAULT_BUFFER_BYTES, .half_fills = true, .pipelined_lookup = true};
    int rc = KVS_OK;
    const char *mode = getenv("MC_STORE_GPU_STAGING");
    if (mode != NULL && strcasecmp(mode, "auto") == 0)
        cfg->enabled = cfg->adaptive = true;
    else if (kvs__env_bool("MC_STORE_GPU_STAGING", &cfg->enabled) != KVS_OK)
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
    if (kvs__env_bool("MC_STORE_GPU_STAGING_PIPELINED_LOOKUP", &cfg->pipelined_lookup) != KVS_OK)
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
    kvs__scatter_options_t so; /* read here too, so that a malformed one is told at setup */
    if (cfg->enabled && kvs__staging_scatter_options(&so) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
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
    st->hooks.fail_receive_key = st->hooks.fail_transfer_key = -1;
    if (cfg->adaptive && (st->policy = kvs__policy_create()) == NULL) {
        kvs__free(st);
        return KVS_NO_MEMORY;
    }
    pthread_mutex_init(&st->lock, NULL);
    kvs__cond_init(&st->cond);
    if (st->be == &kvs__staging_backend_none)
        kvs_warn("GPU read staging was asked for, but this build has no GPU staging backend: "
                 "reads take the direct path");
    else
        kvs_info("GPU read staging %s: %s backend, %llu-byte buffer (allocated on first use)",
                 cfg->adaptive ? "adaptive (auto)" : "on", st->be->name,
                 (unsigned long long)cfg->buffer_bytes);
    *st_p = st;
    return KVS_OK;
}

void kvs__staging_destroy(kvs__staging_t *st)
{
    if (st == NULL)
        return;
    if (st->buf != NULL)
        st->be->free(st->buf_domain, st->buf);
    if (st->plan_dev != NULL)
        st->be->free(st->buf_domain, st->plan_dev);
    for (int i = 0; i < SCR_COUNT_; i++)
        kvs__free(st->scr[i].p);
    kvs__policy_destroy(st->policy);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    kvs__free(st);
}

const kvs__staging_stats_t *kvs__staging_stats(const kvs__staging_t *st)
{
    return &st->st;
}

kvs__policy_t *kvs__staging_policy(kvs__staging_t *st)
{
    return st != NULL ? st->policy : NULL;
}

uint64_t kvs__staging_fills_for(const kvs__staging_t *st, uint64_t bytes)
{
    return (bytes + st->cfg.buffer_bytes - 1) / st->cfg.buffer_bytes;
}

kvs__read_mode_t kvs__staging_choose(kvs__staging_t *st, int domain, kvs__read_shape_t *sh,
                                     bool can_stage)
{
    int d = st->be->domain_of(domain);
    can_stage = can_stage && d >= 0 && !atomic_load(&st->disabled);
    if (can_stage && kvs__policy_calibrate_once(st->policy, st->be, d))
        atomic_fetch_add(&st->st.calibrations, 1);
    sh->fills = kvs__staging_fills_for(st, sh->bytes);
    kvs__policy_why_t why;
    kvs__read_mode_t m = kvs__policy_choose(st->policy, sh, can_stage, &why);
    atomic_fetch_add(&st->st.auto_calls[m], 1);
    if (why == KVS_POLICY_EXPLORE)
        atomic_fetch_add(&st->st.auto_explored, 1);
    else if (why == KVS_POLICY_MODEL_SLOWER)
        atomic_fetch_add(&st->st.auto_model_slower, 1);
    else if (why == KVS_POLICY_MEASURED_SLOWER)
        atomic_fetch_add(&st->st.auto_measured_slower, 1);
    kvs_debug("staging: auto mode reads %llu bytes in %llu fragments %s",
              (unsigned long long)sh->bytes, (unsigned long long)sh->frags,
              kvs__read_mode_names[m]);
    return m;
}

bool kvs__staging_would_stage(kvs__staging_t *st, int domain, kvs__read_shape_t *sh)
{
    int d = st->be->domain_of(domain);
    if (st->policy == NULL || d < 0 || atomic_load(&st->disabled))
        return false;
    if (kvs__policy_calibrate_once(st->policy, st->be, d))
        atomic_fetch_add(&st->st.calibrations, 1);
    sh->fills = kvs__staging_fills_for(st, sh->bytes);
    return kvs__policy_peek(st->policy, sh, true) == KVS_READ_STAGED;
}

void kvs__staging_unchoose(kvs__staging_t *st, kvs__read_mode_t m)
{
    if ((unsigned)m < KVS_READ_MODES_)
        atomic_fetch_sub(&st->st.auto_calls[m], 1);
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
/* A byte per page id (the dense case) while the ids span at most this many per page named. */
#define OVERLAP_BYTES_PER_PAGE 8u

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

/* The page-id map of a page-table call's overlap rule, kept so that its keys are checked in
 * parts: the first fill's before anything is submitted, the rest's while that fill's transfers
 * run (pages_rest). */
typedef struct {
    void *map; /* np bytes, or np bits when `bits` */
    bool bits;
    uint64_t np;
    uint32_t done; /* keys checked */
} ids_check_t;

static bool ids_repeat(const ids_check_t *ic, const kvs__staged_key_t *keys, uint32_t n)
{
    return ic->bits ? kvs__pt_ids_repeat(keys, n, ic->map, ic->np)
                    : kvs__pt_ids_repeat_bytes(keys, n, ic->map, ic->np);
}

/* Page-table keys: the same rule from ids and region geometry, for keys [0, upto) now (*ic keeps
 * the map for the rest). Ids are usually a pool's dense block numbers: a byte per id up to the
 * largest while that costs at most 8 bytes a page, else a bit per id; sparse ones are sorted,
 * all keys at once. */
static bool pages_overlap(kvs__staging_t *st, const kvs__page_layout_t *L,
                          const kvs__staged_key_t *keys, uint32_t n, uint32_t upto, ids_check_t *ic,
                          bool *oom_p)
{
    uint64_t np = L->max_id + 1, pages = 0;
    for (uint32_t i = 0; i < n; i++)
        pages += keys[i].pages.npages;
    *ic = (ids_check_t){.np = np, .done = n};
    if (kvs__pt_regions_overlap(L, np))
        return true;
    size_t bytes = (size_t)np;
    if (np > pages * OVERLAP_BYTES_PER_PAGE) {
        if (np > KVS_MAX((uint64_t)OVERLAP_BITS_MIN, pages * OVERLAP_BITS_PER_FRAG)) {
            uint32_t *tmp = scratch(st, SCR_SPANS, (size_t)pages * sizeof(*tmp));
            if (tmp != NULL)
                return kvs__pt_ids_repeat_sorted(keys, n, tmp);
            *oom_p = true;
            return false;
        }
        ic->bits = true;
        bytes = (size_t)((np + 63) / 64) * sizeof(uint64_t);
    }
    if ((ic->map = scratch(st, SCR_BITS, bytes)) == NULL) {
        *oom_p = true;
        return false;
    }
    memset(ic->map, 0, bytes);
    ic->done = upto;
    return ids_repeat(ic, keys, upto);
}

/* ---- fills ----------------------------------------------------------------------------------- */

/* A fill's scatter while it may still run: the part of the buffer it reads is not reused until
 * fill_finish. */
typedef struct {
    bool launched;
    void *done; /* the backend's token */
    uint32_t a, b, keys;
} pending_t;

/* A fill's transfers: transfer r carries keys [run[r], run[r + 1]), one batch per transport. */
typedef struct {
    kvs__xfer_group_t g;
    kvs_xfer_req_t *reqs;
    kvs_transport_t **ts;
    uint32_t *run, nruns;
    int rc; /* the whole fill's failure (no memory, too many transports), else OK */
} fill_io_t;

/* One call's plan, shared by its fills. */
typedef struct {
    kvs__staged_key_t *keys;
    uint32_t n;
    const kvs__page_layout_t *layout; /* page-table form, else NULL */
    uint32_t nslices;
    uint64_t row;
    kvs__pt_plan_t plan;            /* in the domain's memory, once uploaded */
    const kvs__pt_key_t *host_keys; /* the plan's key table in host memory */
    bool plan_ready;                /* uploaded; false until the first fill is in flight */
    uint64_t *off;                  /* key i's offset in its fill */
    uint32_t *fill_end;
    uint32_t nfills;
    bool halves;
    uint64_t half;
    uint64_t deadline_ns;
    kvs__staging_late_t *late; /* keys [late->ready, n) routed by late->more, else NULL */
    bool late_done;
    bool aborted;     /* the rest's lookup or ids made the call ineligible: nothing is scattered */
    uint32_t counted; /* fills that carried a key (a pipelined first fill may carry none) */
    ids_check_t ids;  /* the overlap rule's page map (page-table form) */
} call_plan_t;

static void rest_resolve(kvs__staging_t *st, call_plan_t *cp, bool inflight);

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

/* Whether key i continues key i - 1's transfer of `len` bytes: the same owner and segment, the
 * next bytes of it, and the next bytes of the buffer (objects put in one call usually lie so). */
static bool continues(const call_plan_t *cp, uint32_t i, uint64_t len)
{
    const kvs__staged_key_t *k = &cp->keys[i], *p = &cp->keys[i - 1];
    return k->t == p->t && k->ep == p->ep && k->segment_id == p->segment_id &&
           k->offset == p->offset + p->size && cp->off[i] == cp->off[i - 1] + p->size &&
           len + k->size > len && len + k->size <= SIZE_MAX;
}

/* Builds and submits fill [a, b)'s reads into the buffer at `base`: keys that follow each other
 * in a segment and in the buffer are one transfer (fewer, larger copies), one batch per
 * transport. */
static void fill_submit(kvs__staging_t *st, const call_plan_t *cp, uint32_t a, uint32_t b,
                        uint64_t base, fill_io_t *io)
{
    *io = (fill_io_t){.rc = KVS_OK};
    uint32_t nk = b - a;
    kvs_xfer_req_t *reqs = io->reqs = scratch(st, SCR_REQS, nk * sizeof(*reqs));
    struct iovec *bufv = scratch(st, SCR_BUFV, nk * sizeof(*bufv));
    io->ts = scratch(st, SCR_TS, nk * sizeof(*io->ts));
    io->g.sub = scratch(st, SCR_SUB, nk * sizeof(*io->g.sub));
    io->g.back = scratch(st, SCR_BACK, nk * (sizeof(*io->g.back) + 1));
    io->run = scratch(st, SCR_RUNS, (nk + 1) * sizeof(*io->run));
    if (reqs == NULL || bufv == NULL || io->ts == NULL || io->g.sub == NULL || io->g.back == NULL ||
        io->run == NULL) {
        io->rc = KVS_NO_MEMORY;
        return;
    }
    io->g.tk = (uint8_t *)(io->g.back + nk);
    char *buf = (char *)st->buf + base;
    uint32_t nr = 0;
    for (uint32_t i = a; i < b; i++) {
        const kvs__staged_key_t *k = &cp->keys[i];
        if (k->t == NULL)
            continue; /* absent: its status is the caller's */
        if (nr > 0 && continues(cp, i, reqs[nr - 1].length)) {
            reqs[nr - 1].length += k->size;
            bufv[nr - 1].iov_len += (size_t)k->size;
            continue;
        }
        io->run[nr] = i;
        io->ts[nr] = k->t;
        bufv[nr] = (struct iovec){buf + cp->off[i], (size_t)k->size};
        reqs[nr] =
            (kvs_xfer_req_t){.op = KVS_XFER_READ,
                             .ep = k->ep,
                             .segment_id = k->segment_id,
                             .offset = k->offset,
                             .length = k->size,
                             .iov = &bufv[nr],
                             .iovcnt = 1,
                             .status = KVS_OK,
                             .gpu = st->be->device_memory ? (uint32_t)st->buf_domain + 1 : 0};
        nr++;
    }
    io->run[nr] = b;
    io->nruns = nr;
    if (kvs__now_ns() >= cp->deadline_ns) {
        io->rc = KVS_TIMED_OUT;
        return;
    }
    io->rc = kvs__xfer_group_submit(&io->g, reqs, io->ts, nr, cp->deadline_ns);
}

/* Waits for the fill's transfers (each wait cancels at the deadline) and sets its keys' status:
 * a key received after its lease ran out is never scattered. Returns the keys to scatter. */
static uint32_t fill_wait(kvs__staging_t *st, call_plan_t *cp, uint32_t a, uint32_t b,
                          fill_io_t *io)
{
    for (uint32_t i = a; i < b; i++) {
        if (cp->keys[i].t != NULL)
            cp->keys[i].status = io->rc != KVS_OK ? io->rc : KVS_NO_MEMORY;
    }
    if (io->rc == KVS_OK) {
        kvs__xfer_group_wait(&io->g, io->reqs, cp->deadline_ns);
        for (uint32_t r = 0; r < io->nruns; r++) {
            int s = io->reqs[r].status;
            if (st->hooks.fail_transfer_key >= io->run[r] &&
                st->hooks.fail_transfer_key < io->run[r + 1])
                s = KVS_TRANSFER_FAIL;
            for (uint32_t i = io->run[r]; i < io->run[r + 1]; i++) {
                if (cp->keys[i].t != NULL) /* absent keys between runs keep theirs */
                    cp->keys[i].status = s;
            }
        }
    }
    bool any = false;
    for (uint32_t i = a; i < b && !any; i++)
        any = cp->keys[i].t != NULL;
    if (cp->aborted || !any)
        return 0; /* drained, the call reads direct; or a pipelined first fill of absent keys */
    atomic_fetch_add(&st->st.fills, 1);
    cp->counted++;
    atomic_fetch_add(&st->st.transfers, io->rc == KVS_OK ? io->nruns : 0);
    uint64_t now = kvs__now_ns();
    uint32_t ok = 0;
    for (uint32_t i = a; i < b; i++) {
        if (cp->keys[i].t == NULL)
            continue;
        int s = cp->keys[i].status;
        if ((int64_t)i == st->hooks.fail_receive_key)
            s = KVS_TRANSFER_FAIL;
        if (s == KVS_OK && now > cp->keys[i].lease_until_ns)
            s = KVS_LEASE_EXPIRED; /* the owner may have reused the space: never scatter */
        else if (s != KVS_OK && s != KVS_TIMED_OUT)
            s = KVS_TRANSFER_FAIL;
        cp->keys[i].status = s;
        ok += s == KVS_OK;
    }
    return ok;
}

/* A failed scatter start fails the keys it carried that were still OK. */
static void scatter_failed(kvs__staged_key_t *keys, uint32_t a, uint32_t b, uint32_t nkeys, int rc)
{
    kvs_warn("staging: scatter failed (%s); %u key(s) fail", kvs_status_str(rc), nkeys);
    for (uint32_t i = a; i < b; i++)
        if (keys[i].status == KVS_OK)
            keys[i].status = KVS_TRANSFER_FAIL;
}

/* Fragment form: one launch over every fragment of the fill, failed keys' bytes skipped. */
static void scatter_frags(kvs__staging_t *st, call_plan_t *cp, uint32_t a, uint32_t b,
                          const char *buf, uint32_t nok, pending_t *p)
{
    kvs__scatter_frag_t *frags = scratch(st, SCR_FRAGS, 0); /* sized by the planner */
    uint32_t nf = 0;
    uint64_t pos = 0;
    for (uint32_t i = a; i < b; i++) {
        const kvs__staged_key_t *k = &cp->keys[i];
        if (k->t == NULL)
            continue; /* absent: no room in the buffer */
        if (cp->off[i] > pos)
            frags[nf++] = (kvs__scatter_frag_t){NULL, cp->off[i] - pos}; /* padding */
        if (k->status == KVS_OK) {
            for (uint32_t j = 0; j < k->iovcnt; j++)
                frags[nf++] = (kvs__scatter_frag_t){k->iov[j].iov_base, k->iov[j].iov_len};
        } else {
            frags[nf++] = (kvs__scatter_frag_t){NULL, k->size};
        }
        pos = cp->off[i] + k->size;
    }
    void *done = NULL;
    int rc = st->hooks.fail_scatter
                 ? KVS_TRANSFER_FAIL
                 : st->be->scatter(st->buf_domain, buf, frags, nf, cp->deadline_ns,
                                   st->hooks.stall_scatter, &done);
    atomic_fetch_add(&st->st.scatter_launches, 1);
    *p = (pending_t){rc == KVS_OK, done, a, b, nok};
    if (rc != KVS_OK)
        scatter_failed(cp->keys, a, b, nok, rc);
}

/* Page-table form: one launch per run of received keys (one per fill unless a key failed); all
 * but the last run are waited for here. */
static void scatter_pages(kvs__staging_t *st, call_plan_t *cp, uint32_t a, uint32_t b,
                          const char *buf, pending_t *p)
{
    for (uint32_t i = a; i < b;) {
        if (cp->keys[i].status != KVS_OK) {
            i++;
            continue;
        }
        uint32_t e = i + 1;
        while (e < b && cp->keys[e].status == KVS_OK)
            e++;
        fill_finish(st, cp->keys, p, cp->deadline_ns); /* the run before, if any */
        void *done = NULL;
        int rc = st->hooks.fail_scatter ? KVS_TRANSFER_FAIL
                                        : st->be->scatter_pages(st->buf_domain, buf, &cp->plan, i,
                                                                e, cp->host_keys[i].unit_start,
                                                                cp->host_keys[e].unit_start,
                                                                st->hooks.stall_scatter, &done);
        atomic_fetch_add(&st->st.scatter_launches, 1);
        *p = (pending_t){rc == KVS_OK, done, i, e, e - i};
        if (rc != KVS_OK)
            scatter_failed(cp->keys, i, e, e - i, rc);
        i = e;
    }
}

/* Builds the call's page plan and uploads it into the domain's memory (grown as needed); run while
 * the first fill's transfers are in flight. A failure fails the page form's keys (TRANSFER_FAIL,
 * NO_MEMORY) before anything is scattered. */
static int plan_upload(kvs__staging_t *st, call_plan_t *cp)
{
    uint64_t t0 = kvs__now_ns();
    size_t bytes =
        kvs__pt_plan_bytes(cp->layout, cp->nslices, &cp->keys[0].pages, sizeof(*cp->keys), cp->n);
    void *blob = scratch(st, SCR_PLAN, bytes);
    if (blob == NULL)
        return KVS_NO_MEMORY;
    if (bytes > st->plan_cap) { /* doubling: cudaFree synchronises the device, so rarely */
        if (st->plan_dev != NULL)
            st->be->free(st->buf_domain, st->plan_dev);
        size_t cap = KVS_MAX(KVS_MAX(bytes, 2 * st->plan_cap), (size_t)1 << 20);
        st->plan_cap = 0;
        int rc = st->be->alloc(st->buf_domain, cap, &st->plan_dev);
        if (rc != KVS_OK) {
            st->plan_dev = NULL;
            return rc;
        }
        st->plan_cap = cap;
    }
    int brc =
        kvs__pt_plan_build(cp->layout, cp->nslices, cp->row, &cp->keys[0].pages, sizeof(*cp->keys),
                           cp->n, cp->off, blob, (uintptr_t)st->plan_dev, &cp->plan);
    if (brc != KVS_OK)
        return kvs__fail(brc, "staging: page ids changed while the read ran; its keys fail");
    cp->host_keys = (const kvs__pt_key_t *)((const char *)blob +
                                            ((uintptr_t)cp->plan.keys - (uintptr_t)st->plan_dev));
    int rc = st->be->upload(st->buf_domain, st->plan_dev, blob, bytes);
    cp->plan_ready = rc == KVS_OK;
    atomic_fetch_add(&st->st.plan_overlapped_ns, kvs__now_ns() - t0);
    return rc;
}

/* Receives keys [a, b) into the buffer at `base` and starts the scatter of the ones that arrived
 * in time (*p, finished by fill_finish). The first fill of a page-table call builds the plan
 * while its transfers run. */
static void run_fill(kvs__staging_t *st, call_plan_t *cp, uint32_t a, uint32_t b, uint64_t base,
                     pending_t *p)
{
    fill_io_t io;
    uint64_t t0 = kvs__now_ns();
    fill_submit(st, cp, a, b, base, &io);
    uint64_t t1 = kvs__now_ns();
    if (io.rc == KVS_TIMED_OUT) { /* past the deadline: nothing was submitted */
        for (uint32_t i = a; i < b; i++) {
            if (cp->keys[i].t != NULL)
                cp->keys[i].status = KVS_TIMED_OUT;
        }
        rest_resolve(st, cp, false);
        return;
    }
    /* The rest of a pipelined read's lookup and of the overlap rule, while this fill's copies
     * run; the lookup places the later fills, which the page plan's offsets come from. */
    rest_resolve(st, cp, io.rc == KVS_OK && io.nruns > 0);
    uint64_t t2 = kvs__now_ns();
    int plan_rc =
        cp->layout == NULL || cp->plan_ready || cp->aborted ? KVS_OK : plan_upload(st, cp);
    uint64_t t3 = kvs__now_ns();
    uint32_t nok = fill_wait(st, cp, a, b, &io);
    if (cp->aborted)
        return;
    /* Where a fill's time goes (KVS_LOG_LEVEL=debug): what docs/store_bench.md's serial steps
     * were measured with. */
    kvs_debug("staging: fill of keys [%u, %u): submit %.1f us, late lookup %.1f us, plan %.1f "
              "us, receive %.1f us",
              a, b, (double)(t1 - t0) / 1e3, (double)(t2 - t1) / 1e3, (double)(t3 - t2) / 1e3,
              (double)(kvs__now_ns() - t3) / 1e3);
    if (plan_rc != KVS_OK) {
        scatter_failed(cp->keys, a, b, nok, plan_rc);
        return;
    }
    if (nok == 0)
        return;
    const char *buf = (const char *)st->buf + base;
    if (cp->layout != NULL)
        scatter_pages(st, cp, a, b, buf, p);
    else
        scatter_frags(st, cp, a, b, buf, nok, p);
}

/* Places the keys in fills: greedy, in call order, a key that does not fit closing its fill.
 * Half fills (the default; MC_STORE_GPU_STAGING_HALF_FILLS=0 turns them off): when every key fits
 * half the buffer and is read by a transport whose submissions cost no ramp-up (shm), fills take
 * half each, in turn, so a fill's receive overlaps the previous fill's scatter (DESIGN §1 allows
 * reusing parts of the buffer so). Otherwise fills take the whole buffer one after another. On
 * the H200 (docs/store_bench.md, run 4) half fills took shm page-table reads from 1.06x to 1.04x
 * of the H2D limit (96 x 12 MiB) and from 1.17x to 1.15x (1536 x 384 KiB), once shm issued its
 * copies at submit on pooled streams; before that, each extra fill's stream set-up made them
 * lose at 1536 x 384 KiB (1.29x -> 1.41x). Over tcp every fill ends in a drain where connections
 * idle, and halving fills doubled those (0.83x -> 0.88x of raw tcp), so tcp never takes them. */
static uint64_t half_of(const kvs__staging_t *st)
{
    return st->cfg.buffer_bytes / 2 / KVS_STAGING_ALIGN * KVS_STAGING_ALIGN;
}

/* Whether the fills take half the buffer each (above). Keys from `ready` on have no transport
 * yet (a pipelined read) and are taken to be read over a cheap one when `cheap`; absent keys'
 * transports do not count. */
static bool takes_halves(const kvs__staging_t *st, const kvs__staged_key_t *keys, uint32_t n,
                         uint32_t ready, bool cheap)
{
    uint64_t half = half_of(st);
    bool halves = st->cfg.half_fills && half > 0;
    for (uint32_t i = 0; i < n && halves; i++) {
        const kvs_transport_t *t = keys[i].t;
        halves =
            keys[i].size <= half &&
            (i >= ready ? cheap : t == NULL || (t->ops->caps & KVS_TRANSPORT_CAP_CHEAP_SUBMIT));
    }
    return halves;
}

/* The fill that key i of `size` bytes after `*cur` bytes opens or continues in a buffer part of
 * `cap` bytes: its offset in it, or UINT64_MAX when it closes the current fill (then at 0). */
static uint64_t fill_place(uint64_t *cur, uint32_t i, uint64_t size, uint64_t cap)
{
    uint64_t at = KVS_ALIGN_UP(*cur, KVS_STAGING_ALIGN);
    bool closes = i > 0 && at + size > cap;
    *cur = (closes ? 0 : at) + size;
    return closes ? UINT64_MAX : at;
}

/* Places keys [from, n) in fills from fill cp->nfills on, the first starting empty. Absent keys
 * take no room. A pipelined read's first fill never reaches past its routed keys: its lead is
 * that fill, so this only guards against a lead planned otherwise. */
static void place_fills(const kvs__staging_t *st, call_plan_t *cp, uint32_t from)
{
    uint32_t ready = cp->late != NULL && !cp->late_done ? cp->late->ready : cp->n;
    uint64_t cap = cp->halves ? cp->half : st->cfg.buffer_bytes, cur = 0;
    bool empty = true;
    for (uint32_t i = from; i < cp->n; i++) {
        if (cp->keys[i].t == NULL && i < ready) {
            cp->off[i] = KVS_ALIGN_UP(cur, KVS_STAGING_ALIGN);
            continue;
        }
        if (cp->nfills == 0 && i == ready && i > from) { /* even with no key present in it */
            cp->fill_end[cp->nfills++] = i;
            cur = 0;
            empty = true;
        }
        uint64_t at = fill_place(&cur, empty ? 0 : 1, cp->keys[i].size, cap);
        if (at == UINT64_MAX) {
            cp->fill_end[cp->nfills++] = i;
            at = 0;
        }
        cp->off[i] = at;
        empty = false;
    }
    if (empty && cp->nfills > 0)
        cp->fill_end[cp->nfills - 1] = cp->n; /* trailing absent keys: no fill of their own */
    else
        cp->fill_end[cp->nfills++] = cp->n;
}

static void plan_fills(const kvs__staging_t *st, call_plan_t *cp)
{
    uint32_t ready = cp->late != NULL ? cp->late->ready : cp->n;
    cp->half = half_of(st);
    cp->halves = takes_halves(st, cp->keys, cp->n, ready, true);
    cp->nfills = 0;
    place_fills(st, cp, 0);
}

/* Keys [ready, n) of a pipelined read get their routes now, once, before any is submitted; the
 * fills after the first are placed again without the keys the lookup found absent. */
static void late_resolve(const kvs__staging_t *st, call_plan_t *cp, bool inflight)
{
    if (cp->late == NULL || cp->late_done)
        return;
    cp->late_done = true;
    cp->aborted = !cp->late->more(cp->late->ctx, cp->keys, cp->late->ready, cp->n, inflight);
    if (cp->late->deadline_ns != 0)
        cp->deadline_ns = cp->late->deadline_ns;
    if (!cp->aborted && cp->fill_end[0] < cp->n) {
        cp->nfills = 1;
        place_fills(st, cp, cp->fill_end[0]);
    }
}

/* The overlap rule for a page-table call's keys after its first fill, checked while that fill's
 * transfers run (before anything is scattered). A page named twice makes the call ineligible as
 * a later key that does not fit does (late_resolve): the first fill is drained, nothing is
 * scattered, and the call reads direct (docs/staging.md, item 5). */
static void pages_rest(kvs__staging_t *st, call_plan_t *cp, bool inflight)
{
    ids_check_t *ic = &cp->ids;
    if (cp->layout == NULL || ic->done >= cp->n)
        return;
    uint32_t from = ic->done;
    ic->done = cp->n;
    if (cp->aborted)
        return; /* already ineligible: the first reason counts */
    uint64_t t0 = kvs__now_ns();
    bool again = ids_repeat(ic, cp->keys + from, cp->n - from);
    /* Serial planning when nothing was in flight (the first fill timed out or had no key). */
    atomic_fetch_add(inflight ? &st->st.plan_overlapped_ns : &st->st.plan_ns, kvs__now_ns() - t0);
    if (again) {
        cp->aborted = true;
        fall_back(st, KVS_FALLBACK_overlap);
    }
}

/* What the first fill's transfers hide: the rest of a pipelined read's lookup, and the rest of
 * the overlap rule. */
static void rest_resolve(kvs__staging_t *st, call_plan_t *cp, bool inflight)
{
    late_resolve(st, cp, inflight);
    pages_rest(st, cp, inflight);
}

uint32_t kvs__staging_lead(const kvs__staging_t *st, const kvs__staged_key_t *keys, uint32_t n,
                           bool cheap)
{
    int domain = -1;
    if (st == NULL || n == 0 || !st->cfg.pipelined_lookup ||
        check_keys(st, keys, n, &domain) >= 0 || atomic_load(&st->disabled) ||
        (atomic_load(&st->st.held_bytes) != 0 && atomic_load(&st->st.device) != (uint64_t)domain))
        return 0;
    uint64_t cap = takes_halves(st, keys, n, 0, cheap) ? half_of(st) : st->cfg.buffer_bytes;
    uint64_t cur = 0;
    uint32_t i = 0;
    while (i < n && fill_place(&cur, i, keys[i].size, cap) != UINT64_MAX)
        i++;
    return i;
}

/* The buffer, allocated on the first staged call in the call's domain. -1 when it is there, else
 * the fallback reason. */
static int buffer_ready(kvs__staging_t *st, int domain)
{
    if (atomic_load(&st->disabled))
        return KVS_FALLBACK_alloc_failed;
    if (st->buf != NULL)
        return domain == st->buf_domain ? -1 : KVS_FALLBACK_other_gpu;
    int rc = st->hooks.fail_alloc ? KVS_NO_MEMORY
                                  : st->be->alloc(domain, st->cfg.buffer_bytes, &st->buf);
    if (rc != KVS_OK) {
        st->buf = NULL;
        atomic_store(&st->disabled, true);
        kvs_warn("staging: cannot allocate the %llu-byte %s staging buffer (%s); staging is off "
                 "for this client",
                 (unsigned long long)st->cfg.buffer_bytes, st->be->name, kvs_status_str(rc));
        return KVS_FALLBACK_alloc_failed;
    }
    st->buf_domain = domain;
    atomic_store(&st->st.held_bytes, st->cfg.buffer_bytes);
    atomic_store(&st->st.device, (uint64_t)domain);
    return -1;
}

/* Everything a call decides before its first submission, with the buffer held: the fills, the
 * overlap rule (a page-table call's first fill only: pages_rest checks the rest), the buffer and
 * the working arrays. -1 when the call stages, else the fallback reason. */
static int plan_call(kvs__staging_t *st, call_plan_t *cp, int domain)
{
    cp->off = scratch(st, SCR_OFF, cp->n * sizeof(*cp->off));
    cp->fill_end = scratch(st, SCR_FILL_END, cp->n * sizeof(*cp->fill_end));
    if (cp->off == NULL || cp->fill_end == NULL)
        return KVS_FALLBACK_alloc_failed;
    plan_fills(st, cp);
    bool oom = false;
    bool overlap = cp->layout != NULL ? pages_overlap(st, cp->layout, cp->keys, cp->n,
                                                      cp->fill_end[0], &cp->ids, &oom)
                                      : fragments_overlap(st, cp->keys, cp->n, &oom);
    if (overlap)
        return KVS_FALLBACK_overlap;
    if (oom)
        return KVS_FALLBACK_alloc_failed;
    int why = buffer_ready(st, domain);
    if (why >= 0)
        return why;
    size_t maxf = 0;
    for (uint32_t i = 0; i < cp->n && cp->layout == NULL; i++)
        maxf += cp->keys[i].iovcnt + 1;
    if (scratch(st, SCR_FRAGS, KVS_MAX(maxf, 1) * sizeof(kvs__scatter_frag_t)) == NULL)
        return KVS_FALLBACK_alloc_failed;
    return -1;
}

int kvs__staging_read(kvs__staging_t *st, kvs__staged_key_t *keys, uint32_t n,
                      const kvs__page_layout_t *layout, kvs__staging_late_t *late,
                      uint64_t deadline_ns)
{
    if (st == NULL || n == 0 || (late != NULL && (late->more == NULL || late->ready > n)))
        return KVS_UNSUPPORTED;
    uint64_t t_enter = kvs__now_ns();
    call_plan_t cp = {
        .keys = keys, .n = n, .layout = layout, .deadline_ns = deadline_ns, .late = late};
    if (layout != NULL && kvs__pt_slices(layout, &cp.nslices, &cp.row) != KVS_OK)
        return kvs__fail(KVS_INVALID_PARAMS, "staging: a page layout the page scatter cannot take");
    int domain = -1;
    int why = check_keys(st, keys, n, &domain);
    if (why >= 0)
        return fall_back(st, (kvs__fallback_t)why);
    uint64_t t_wait = kvs__now_ns();
    if (!buffer_acquire(st))
        return fall_back(st, KVS_FALLBACK_busy);
    /* From here the call owns the buffer and the scratch arrays. */
    uint64_t t_held = kvs__now_ns();
    why = plan_call(st, &cp, domain);
    if (why >= 0) {
        fall_back(st, (kvs__fallback_t)why);
        buffer_release(st);
        return KVS_UNSUPPORTED;
    }
    kvs_debug("staging: %u key(s) in %u fill(s)", n, cp.nfills);
    /* Planning time, the busy wait excluded. */
    atomic_fetch_add(&st->st.plan_ns, (t_wait - t_enter) + (kvs__now_ns() - t_held));
    pending_t pend[2] = {{0}};
    uint64_t scatter_wait_ns = 0;
    for (uint32_t f = 0, a = 0; f < cp.nfills; a = cp.fill_end[f++]) {
        pending_t *p = &pend[cp.halves ? f % 2 : 0];
        uint64_t t = kvs__now_ns();
        fill_finish(st, keys, p, cp.deadline_ns); /* the scatter that last read this part */
        scatter_wait_ns += kvs__now_ns() - t;
        run_fill(st, &cp, a, cp.fill_end[f], cp.halves ? (f % 2) * cp.half : 0, p);
        if (cp.aborted)
            break; /* only the first fill ran, and it scattered nothing */
    }
    uint64_t t_last = kvs__now_ns();
    fill_finish(st, keys, &pend[0], cp.deadline_ns);
    fill_finish(st, keys, &pend[1], cp.deadline_ns);
    if (cp.aborted) {
        kvs_debug("staging: the rest of the lookup or of the ids made the call ineligible; it "
                  "reads direct");
        buffer_release(st);
        return KVS_UNSUPPORTED;
    }
    uint32_t present = 0;
    for (uint32_t i = 0; i < n; i++)
        present += keys[i].t != NULL;
    atomic_fetch_add(&st->st.staged_reads, 1);
    atomic_fetch_add(&st->st.staged_keys, present);
    atomic_store(&st->st.last_fills, cp.counted);
    kvs_debug("staging: %u fill(s), %.1f us waiting for scatters before fills, %.1f us for the "
              "last; %.1f us in all",
              cp.nfills, (double)scatter_wait_ns / 1e3, (double)(kvs__now_ns() - t_last) / 1e3,
              (double)(kvs__now_ns() - t_enter) / 1e3);
    buffer_release(st);
    return KVS_OK;
}
