/* GPU read staging (DESIGN §1): each object of a multi-buffer read is received whole into one
 * reusable staging buffer, then the objects of a buffer fill are scattered to the caller's
 * fragments with one launch. The planner (eligibility, fills, lease checks, fallbacks) is here;
 * how memory is allocated and scattered belongs to a backend: the host backend (memcpy; tests
 * and CI, selected only by MC_STORE_GPU_STAGING_BACKEND=host), the CUDA backend (next), or
 * none, which stages nothing. */
#ifndef KVS_STAGING_INT_H
#define KVS_STAGING_INT_H

#include "../gpu/scatter.h"
#include "../gpu/scatter_pages.h"
#include "../transport/transport_int.h"

#include <stdatomic.h>

/* kvstash v1 has only complete memory replicas and no hot cache; the eligibility rules that
 * depend on them stay as these constants so that adding either later cannot be missed. */
#define KVS_STAGING_REPLICA_IS_MEMORY true
#define KVS_STAGING_HOT_CACHE_ON      false

/* Keys are placed at this alignment in the buffer; padding counts against the budget. */
#define KVS_STAGING_ALIGN 16u

typedef struct {
    bool enabled;          /* MC_STORE_GPU_STAGING (default off): 1 or auto */
    bool adaptive;         /* MC_STORE_GPU_STAGING=auto: staging_policy.c chooses per call */
    uint64_t buffer_bytes; /* MC_STORE_GPU_STAGING_BUFFER_BYTES (default 256 MiB) */
    uint64_t busy_wait_us; /* MC_STORE_GPU_STAGING_BUSY_WAIT_US (default 0) */
    bool half_fills;       /* MC_STORE_GPU_STAGING_HALF_FILLS (default on): see staging.c */
    bool pipelined_lookup; /* MC_STORE_GPU_STAGING_PIPELINED_LOOKUP (default on): a read larger
                            * than a fill looks up the rest beside its first (docs/staging.md) */
    const char *backend;   /* MC_STORE_GPU_STAGING_BACKEND: "host", or NULL for the GPU one */
} kvs__staging_config_t;

/* Reads the MC_STORE_GPU_STAGING* variables (once, at client setup). */
int kvs__staging_config_init(kvs__staging_config_t *cfg);

/* How the CUDA backend launches its scatters beside other GPU work (issue 29), for the process:
 * its lanes are shared by every client. */
typedef struct {
    uint32_t blocks;    /* MC_STORE_GPU_STAGING_SCATTER_BLOCKS: at most this many blocks per
                         * launch (persistent warps); 0 (default) fills the GPU */
    bool high_priority; /* MC_STORE_GPU_STAGING_SCATTER_PRIORITY=high: the scatter streams take
                         * the device's greatest stream priority (default normal) */
} kvs__scatter_options_t;

/* Reads those two variables: KVS_INVALID_PARAMS (with the reason) for a malformed one, whose
 * default is kept. */
int kvs__staging_scatter_options(kvs__scatter_options_t *o);

/* Why a call did not stage. The first reason found is counted. */
#define KVS_STAGING_FALLBACKS(X)                                                                   \
    X(busy)                                                                                        \
    X(too_large)                                                                                   \
    X(overlap)                                                                                     \
    X(other_domain)                                                                                \
    X(other_gpu)                                                                                   \
    X(alloc_failed)

typedef enum {
#define KVS_FB_ENUM_(name) KVS_FALLBACK_##name,
    KVS_STAGING_FALLBACKS(KVS_FB_ENUM_)
#undef KVS_FB_ENUM_
        KVS_FALLBACK_COUNT_
} kvs__fallback_t;

typedef struct {
    atomic_uint_fast64_t staged_reads, staged_keys, fills, scatter_launches;
    atomic_uint_fast64_t plan_ns; /* eligibility and fill planning, before the first fill */
    atomic_uint_fast64_t fallback[KVS_FALLBACK_COUNT_];
    atomic_uint_fast64_t held_bytes;         /* the buffer's size once allocated */
    atomic_uint_fast64_t device;             /* the buffer's domain (CUDA: device ordinal) */
    atomic_uint_fast64_t last_fills;         /* fills of the last staged call */
    atomic_uint_fast64_t plan_overlapped_ns; /* page plans built while the first fill ran */
    atomic_uint_fast64_t transfers;          /* fill transfers (adjacent keys merged) */
    /* adaptive mode: calls by the mode chosen; why a call that could stage did not */
    atomic_uint_fast64_t auto_calls[3];
    atomic_uint_fast64_t auto_model_slower, auto_measured_slower, auto_explored, calibrations;
} kvs__staging_stats_t;

struct kvs__staging_calib; /* the adaptive mode's model (below) */

/* A memory backend. Domains: the backend's id for a registered buffer's memory (host backend:
 * 0 for host memory; CUDA backend: the device ordinal), or -1 when the memory is not its. */
typedef struct {
    const char *name;
    bool device_memory; /* the buffer is GPU memory: transfers into it use the GPU paths */
    int (*domain_of)(int reg_domain);
    int (*alloc)(int domain, uint64_t bytes, void **buf_p);
    void (*free)(int domain, void *buf);
    /* Starts copying src to the fragments (dst NULL: skip those source bytes); *done_p is the
     * token scatter_wait takes (NULL when the copy already ended). A failure here means nothing
     * runs any more. `frags` is borrowed for the call only. deadline_ns (kvs__now_ns() clock, 0:
     * none) bounds how long the copy may wait on the host. `stall` (tests only): the copy starts
     * but never finishes by itself, like a kernel whose host stopped publishing its units. */
    int (*scatter)(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                   uint64_t deadline_ns, bool stall, void **done_p);
    /* Waits for a started scatter until deadline_ns (0: none), then aborts it and waits for it to
     * stop, so nothing writes the destinations once this returns; releases the token. OK when
     * every byte was copied, TIMED_OUT when the deadline stopped it, else TRANSFER_FAIL. */
    int (*scatter_wait)(int domain, void *done, uint64_t deadline_ns);
    /* Page-table form. Copies `bytes` of a plan blob from host memory into `dev`, memory of the
     * domain that alloc returned, and waits for the copy (host backend: memcpy). */
    int (*upload)(int domain, void *dev, const void *host, size_t bytes);
    /* Starts copying keys [a, b) of `plan` (its tables in the domain's memory, as uploaded) from
     * src; tokens and failures as scatter. */
    int (*scatter_pages)(int domain, const void *src, const kvs__pt_plan_t *plan, uint32_t a,
                         uint32_t b, uint64_t first_unit, uint64_t end_unit, bool stall,
                         void **done_p);
    /* Times the adaptive mode's model parameters in `domain` (staging_policy.c); NULL: none. */
    int (*calibrate)(int domain, struct kvs__staging_calib *cal_p);
} kvs__staging_backend_t;

extern const kvs__staging_backend_t kvs__staging_backend_host;
extern const kvs__staging_backend_t kvs__staging_backend_none;
#ifdef KVS_HAVE_CUDA
extern const kvs__staging_backend_t kvs__staging_backend_cuda;
#endif

/* One key of a staged read, in call order: where to read it and where it goes. */
typedef struct {
    kvs_transport_t *t; /* how this key is read */
    kvs_endpoint_t *ep;
    uint64_t segment_id, offset, size;
    const struct iovec *iov; /* destination fragments, adding up to size (fragment form) */
    uint32_t iovcnt;
    kvs__pt_pages_t pages;   /* page-table form: the key's page ids in the call's layout */
    int domain;              /* registry domain of every fragment, or KVS_DOMAIN_MIXED */
    uint64_t lease_until_ns; /* the lease from the lookup */
    int status;              /* out: OK, LEASE_EXPIRED, TIMED_OUT, TRANSFER_FAIL */
} kvs__staged_key_t;

typedef struct kvs__staging kvs__staging_t;

/* ---- the adaptive mode (staging_policy.c) --------------------------------------------------- */

typedef enum {
    KVS_READ_DIRECT,
    KVS_READ_GROUPED,
    KVS_READ_STAGED,
    KVS_READ_MODES_
} kvs__read_mode_t;
extern const char *const kvs__read_mode_names[KVS_READ_MODES_];

/* What the model knows of a call: its bytes, fragments (pages x regions in page-table form),
 * keys, owners (distinct endpoints), buffer fills if staged, and whether every key is read over
 * a transport whose submissions are cheap (KVS_TRANSPORT_CAP_CHEAP_SUBMIT). */
typedef struct {
    uint64_t bytes, frags, keys, owners, fills;
    bool cheap_submit;
} kvs__read_shape_t;

/* The model's parameters (ns). */
typedef struct kvs__staging_calib {
    double frag_ns;             /* per destination fragment of a direct read */
    double call_ns;             /* per submission (a key in direct mode, an owner in grouped) */
    double scatter_ns_per_byte; /* the staged scatter */
    double fill_ns;             /* per staged fill: launch and wait */
    double plan_ns_per_frag;    /* staged planning per fragment */
} kvs__staging_calib_t;

typedef enum {
    KVS_POLICY_BEST,            /* the mode estimated fastest */
    KVS_POLICY_EXPLORE,         /* a plausible mode this shape has not measured yet */
    KVS_POLICY_MODEL_SLOWER,    /* not staged: the model predicts staging slower */
    KVS_POLICY_MEASURED_SLOWER, /* not staged: calls of this shape measured it slower */
} kvs__policy_why_t;

typedef struct kvs__policy kvs__policy_t;
kvs__policy_t *kvs__policy_create(void);
void kvs__policy_destroy(kvs__policy_t *p);
/* Runs the backend's calibration the first time (under the policy's lock); true when it ran. */
bool kvs__policy_calibrate_once(kvs__policy_t *p, const kvs__staging_backend_t *be, int domain);
/* The mode for a call of shape `sh` (staged only when can_stage), and why. */
kvs__read_mode_t kvs__policy_choose(kvs__policy_t *p, const kvs__read_shape_t *sh, bool can_stage,
                                    kvs__policy_why_t *why_p);
/* A finished call of shape `sh` read in mode m took ns. */
/* What kvs__policy_choose would pick now, with nothing counted (a pipelined read asks before
 * its lookup whether it will stage). */
kvs__read_mode_t kvs__policy_peek(kvs__policy_t *p, const kvs__read_shape_t *sh, bool can_stage);
void kvs__policy_observe(kvs__policy_t *p, const kvs__read_shape_t *sh, kvs__read_mode_t m,
                         uint64_t ns);
/* Tests: calls observed so far. */
uint64_t kvs__policy_observations(kvs__policy_t *p);
/* Tests: sets the parameters (as if calibrated) and forgets every measurement. */
void kvs__policy_set_calibration(kvs__policy_t *p, const kvs__staging_calib_t *cal);
bool kvs__policy_calibration(kvs__policy_t *p, kvs__staging_calib_t *cal_p);

/* The staging object's policy: NULL unless MC_STORE_GPU_STAGING=auto. */
kvs__policy_t *kvs__staging_policy(kvs__staging_t *st);
/* Auto mode: calibrates on first use (in `domain`), chooses and counts the call's mode. */
kvs__read_mode_t kvs__staging_choose(kvs__staging_t *st, int domain, kvs__read_shape_t *sh,
                                     bool can_stage);
/* Takes back a choice of mode m that the call turned out not to be able to make (a pipelined
 * read the rest of whose lookup made it ineligible), before it chooses again. */
void kvs__staging_unchoose(kvs__staging_t *st, kvs__read_mode_t m);
/* Auto mode: whether kvs__staging_choose would stage the shape now (calibrating on first use;
 * nothing else counted). False when the call could not stage in `domain`. */
bool kvs__staging_would_stage(kvs__staging_t *st, int domain, kvs__read_shape_t *sh);
/* The fills a staged read of `bytes` takes, about (keys are whole in a fill: at least this). */
uint64_t kvs__staging_fills_for(const kvs__staging_t *st, uint64_t bytes);

/* NULL in *st_p when staging is off. */
int kvs__staging_create(const kvs__staging_config_t *cfg, kvs__staging_t **st_p);
/* Frees the buffer. The caller has waited for every read. NULL is a no-op. */
void kvs__staging_destroy(kvs__staging_t *st);

/* A staged read that starts before all of its keys are looked up (client_io.c's pipelined
 * read): keys [0, ready) are routed, and more() routes keys [ready, n) once, while the first
 * fill's transfers run and before any of those keys is submitted. Their destinations (size,
 * domain, fragments or pages) are known from the start, so the call's eligibility and its fills
 * are those of the whole call. A key that more() (or the caller, for a key below `ready`)
 * leaves with t == NULL is absent: it keeps its place in its fill but is never transferred or
 * scattered, and its status is the caller's (never OK). */
typedef struct {
    uint32_t ready;
    /* false: the rest of the lookup made the call ineligible (a key's fragments hold more than
     * its object) or failed it: the first fill's receive is drained and dropped, nothing is
     * scattered, and the read returns KVS_UNSUPPORTED. `inflight`: the first fill's transfers
     * run meanwhile. */
    bool (*more)(void *ctx, kvs__staged_key_t *keys, uint32_t from, uint32_t n, bool inflight);
    void *ctx;
    uint64_t deadline_ns; /* more() may set it: the call's deadline from then on (0: as it was) */
} kvs__staging_late_t;

/* Runs keys[0..n) through the staged path (one submission per fill and transport): KVS_OK
 * when it did (each key's status set), else KVS_UNSUPPORTED with nothing submitted (the call
 * falls back; the reason is counted; more() was not called, or it answered false). `layout`
 * non-NULL: the keys are in page-table form. `late` NULL: every key is routed. */
int kvs__staging_read(kvs__staging_t *st, kvs__staged_key_t *keys, uint32_t n,
                      const kvs__page_layout_t *layout, kvs__staging_late_t *late,
                      uint64_t deadline_ns);

/* For a read whose keys' destinations are set in keys[0..n) (no transport yet): how many
 * leading keys its first fill takes, if every key is read over a transport with cheap
 * submissions (`cheap`) or not. 0 when a destination alone makes the call fall back (domain,
 * size), so it cannot start before its lookup has excluded the keys that fail it, when the
 * call falls back whatever its keys (staging disabled, the buffer on another device), or with
 * MC_STORE_GPU_STAGING_PIPELINED_LOOKUP=0. */
uint32_t kvs__staging_lead(const kvs__staging_t *st, const kvs__staged_key_t *keys, uint32_t n,
                           bool cheap);

/* ---- page-table form (staging_pages.c) ------------------------------------------------------ */

/* Whether two regions' pages (ids below np) may share a byte (conservative: see the code). */
bool kvs__pt_regions_overlap(const kvs__page_layout_t *L, uint64_t np);
/* Whether the keys name a page id twice: with `seen`, np bytes, or a bitmap `bm` of np bits (every
 * id below np), or by sorting a copy of the ids in `tmp` (room for all of them). The first two
 * also answer true for an id of np or more (the caller changed it after the call checked it),
 * never indexing past their map. Their map is the caller's to zero, and keeps the ids marked, so
 * that a call's keys can be checked in parts (the first fill's, then the rest's beside it). */
bool kvs__pt_ids_repeat(const kvs__staged_key_t *keys, uint32_t n, uint64_t *bm, uint64_t np);
bool kvs__pt_ids_repeat_bytes(const kvs__staged_key_t *keys, uint32_t n, uint8_t *seen,
                              uint64_t np);
bool kvs__pt_ids_repeat_sorted(const kvs__staged_key_t *keys, uint32_t n, uint32_t *tmp);

const kvs__staging_stats_t *kvs__staging_stats(const kvs__staging_t *st);
const char *kvs__staging_fallback_name(kvs__fallback_t f);

/* ---- test hooks (internal interface; tests only) ------------------------------------------ */

typedef struct {
    int64_t fail_receive_key;  /* index among the staged keys whose receive fails, or -1 */
    int64_t fail_transfer_key; /* the fill transfer carrying this key fails (all its keys), or -1 */
    bool fail_scatter;         /* the next scatters fail */
    bool stall_scatter; /* the next scatters start but never finish: the deadline ends them */
    bool fail_alloc;    /* the buffer allocation fails */
} kvs__staging_hooks_t;

void kvs__staging_set_hooks(kvs__staging_t *st, const kvs__staging_hooks_t *hooks);
/* Takes (on) or gives back (off) the buffer as if another call held it. BUSY-free: returns
 * INVALID_PARAMS when it is already in that state. */
int kvs__staging_hold(kvs__staging_t *st, bool on);
/* The buffer (NULL before the first staged call) and its size. */
void *kvs__staging_buffer(kvs__staging_t *st, uint64_t *bytes_p);

#endif
