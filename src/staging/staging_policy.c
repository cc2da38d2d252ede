/* The adaptive read mode (MC_STORE_GPU_STAGING=auto): per call, direct, grouped or staged, from
 * a cost model calibrated once per client on first use and refined by the calls it measures.
 *
 * The model counts only what differs between the modes; the wire (or copy-engine) time of the
 * call's bytes is common to all three and cancels:
 *   direct   F * frag_ns + K * call_ns            (F fragments, K keys: one submission each)
 *   grouped  F * frag_ns + O * call_ns            (O owners: one submission each)
 *   staged   B * scatter_ns_per_byte + fills * (fill_ns + call_ns) + F * plan_ns_per_frag
 *            (a fill is one submission: its keys' transfers go together, adjacent ones merged)
 * frag_ns and call_ns come from timing the transports' own GPU copy (kvs__gpu_copy_slice: one
 * fragment, then 256 fragments of 4 KiB), scatter_ns_per_byte and fill_ns from two scatter
 * launches (the host backend times memcpy instead).
 *
 * Calls are binned by shape (bytes per fragment, bytes per call and keys per call, powers of two,
 * and whether every key is on a transport whose submissions are cheap: calls whose modes the
 * model tells apart never share a cell's measurements). A cell remembers, per mode, the
 * measured ns per byte (an exponential average). A mode a cell has not measured is estimated
 * from a measured one: the measured time minus that mode's model overhead is the common wire
 * time, plus the other mode's overhead. A cell tries a mode it has not measured when its
 * estimate is within EXPLORE of the best; otherwise it takes the best estimate. */
#define _GNU_SOURCE
#include "staging_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FRAG_BUCKETS 17 /* bytes per fragment: 2^8 (and below) .. 2^24 (and above) */
#define SIZE_BUCKETS 24 /* bytes per call: 2^12 (and below) .. 2^35 (and above) */
#define KEY_BUCKETS  14 /* keys per call: 1 .. 2^13 (and above) */
#define EXPLORE      1.25
#define EWMA         0.3
#define RETRY_CALLS  256 /* a cell re-measures its plausible modes this often */

typedef struct {
    double ns_per_byte[KVS_READ_MODES_];
    uint32_t n[KVS_READ_MODES_];
    uint32_t calls;
} cell_t;

struct kvs__policy {
    pthread_mutex_t lock;
    bool calibrated;
    kvs__staging_calib_t cal;
    cell_t cells[2][FRAG_BUCKETS][SIZE_BUCKETS][KEY_BUCKETS]; /* 457 KiB, touched as used */
    uint64_t observations;
};

const char *const kvs__read_mode_names[KVS_READ_MODES_] = {"direct", "grouped", "staged"};

/* Defaults before (or without) calibration: the H200 figures of docs/store_bench.md (shm, 8 KiB
 * pages: direct 2.8 us per fragment; scatter 1.7 TB/s; a fill ~30 us). */
static const kvs__staging_calib_t default_cal = {.frag_ns = 2800,
                                                 .call_ns = 20000,
                                                 .scatter_ns_per_byte = 1.0 / 1700.0,
                                                 .fill_ns = 30000,
                                                 .plan_ns_per_frag = 2.0};

kvs__policy_t *kvs__policy_create(void)
{
    kvs__policy_t *p = kvs__calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->cal = default_cal;
    return p;
}

void kvs__policy_destroy(kvs__policy_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_destroy(&p->lock);
    kvs__free(p);
}

void kvs__policy_set_calibration(kvs__policy_t *p, const kvs__staging_calib_t *cal)
{
    pthread_mutex_lock(&p->lock);
    p->cal = *cal;
    p->calibrated = true;
    memset(p->cells, 0, sizeof(p->cells));
    pthread_mutex_unlock(&p->lock);
}

bool kvs__policy_calibration(kvs__policy_t *p, kvs__staging_calib_t *cal_p)
{
    pthread_mutex_lock(&p->lock);
    *cal_p = p->cal;
    bool done = p->calibrated;
    pthread_mutex_unlock(&p->lock);
    return done;
}

static unsigned log2_clamp(uint64_t v, unsigned lo, unsigned n)
{
    unsigned b = v == 0 ? 0 : 63u - (unsigned)__builtin_clzll(v);
    return b <= lo ? 0 : KVS_MIN(b - lo, n - 1);
}

static cell_t *cell_of(kvs__policy_t *p, const kvs__read_shape_t *sh)
{
    uint64_t per = sh->bytes / KVS_MAX(sh->frags, 1);
    return &p->cells[sh->cheap_submit ? 0 : 1][log2_clamp(per, 8, FRAG_BUCKETS)]
                    [log2_clamp(sh->bytes, 12, SIZE_BUCKETS)][log2_clamp(sh->keys, 0, KEY_BUCKETS)];
}

/* The model's overhead of mode m for the shape, in ns (the common wire time left out). */
static double overhead(const kvs__staging_calib_t *c, const kvs__read_shape_t *sh,
                       kvs__read_mode_t m)
{
    double f = (double)sh->frags, k = (double)sh->keys;
    switch (m) {
    case KVS_READ_DIRECT:
        return f * c->frag_ns + k * c->call_ns;
    case KVS_READ_GROUPED:
        return f * c->frag_ns + (double)KVS_MAX(sh->owners, 1) * c->call_ns;
    default:
        /* one submission per fill and transport (adjacent keys merged), not per key */
        return (double)sh->bytes * c->scatter_ns_per_byte +
               (double)KVS_MAX(sh->fills, 1) * (c->fill_ns + c->call_ns) + f * c->plan_ns_per_frag;
    }
}

/* Estimates of each mode's time for the shape (ns); est[m] < 0: the mode is not available. */
static void estimate(const kvs__policy_t *p, const cell_t *cl, const kvs__read_shape_t *sh,
                     bool can_stage, double est[KVS_READ_MODES_])
{
    double wire = -1;
    for (int m = 0; m < KVS_READ_MODES_; m++) /* the wire time a measured mode implies */
        if (cl->n[m] > 0)
            wire = KVS_MAX(wire, cl->ns_per_byte[m] * (double)sh->bytes -
                                     overhead(&p->cal, sh, (kvs__read_mode_t)m));
    for (int m = 0; m < KVS_READ_MODES_; m++) {
        if (m == KVS_READ_STAGED && !can_stage) {
            est[m] = -1;
            continue;
        }
        double model = overhead(&p->cal, sh, (kvs__read_mode_t)m) + KVS_MAX(wire, 0.0);
        est[m] = cl->n[m] > 0 ? cl->ns_per_byte[m] * (double)sh->bytes : model;
    }
}

/* The mode the cell picks for the shape: the best estimate, or a plausible mode it has not
 * measured (or not for RETRY_CALLS calls), which is tried. *best_p: the best estimate's. */
static int pick(const kvs__policy_t *p, const cell_t *cl, const kvs__read_shape_t *sh,
                bool can_stage, int *best_p)
{
    double est[KVS_READ_MODES_];
    estimate(p, cl, sh, can_stage, est);
    int best = -1;
    for (int m = 0; m < KVS_READ_MODES_; m++)
        if (est[m] >= 0 && (best < 0 || est[m] < est[best]))
            best = m;
    int pick = best;
    bool retry = cl->calls > 0 && cl->calls % RETRY_CALLS == 0;
    for (int m = 0; m < KVS_READ_MODES_; m++)
        if (m != best && est[m] >= 0 && est[m] <= EXPLORE * est[best] && (cl->n[m] == 0 || retry))
            pick = m;
    *best_p = best;
    return pick;
}

kvs__read_mode_t kvs__policy_choose(kvs__policy_t *p, const kvs__read_shape_t *sh, bool can_stage,
                                    kvs__policy_why_t *why_p)
{
    pthread_mutex_lock(&p->lock);
    cell_t *cl = cell_of(p, sh);
    int best, m = pick(p, cl, sh, can_stage, &best);
    cl->calls++;
    bool measured = cl->n[KVS_READ_STAGED] > 0;
    pthread_mutex_unlock(&p->lock);
    *why_p = m == best ? KVS_POLICY_BEST : KVS_POLICY_EXPLORE;
    if (m != KVS_READ_STAGED && m == best && can_stage)
        *why_p = measured ? KVS_POLICY_MEASURED_SLOWER : KVS_POLICY_MODEL_SLOWER;
    return (kvs__read_mode_t)m;
}

kvs__read_mode_t kvs__policy_peek(kvs__policy_t *p, const kvs__read_shape_t *sh, bool can_stage)
{
    pthread_mutex_lock(&p->lock);
    int best, m = pick(p, cell_of(p, sh), sh, can_stage, &best);
    pthread_mutex_unlock(&p->lock);
    return (kvs__read_mode_t)m;
}

void kvs__policy_observe(kvs__policy_t *p, const kvs__read_shape_t *sh, kvs__read_mode_t m,
                         uint64_t ns)
{
    if (sh->bytes == 0 || (unsigned)m >= KVS_READ_MODES_)
        return;
    pthread_mutex_lock(&p->lock);
    cell_t *cl = cell_of(p, sh);
    double v = (double)ns / (double)sh->bytes;
    cl->ns_per_byte[m] = cl->n[m] == 0 ? v : (1 - EWMA) * cl->ns_per_byte[m] + EWMA * v;
    cl->n[m]++;
    p->observations++;
    pthread_mutex_unlock(&p->lock);
}

uint64_t kvs__policy_observations(kvs__policy_t *p)
{
    pthread_mutex_lock(&p->lock);
    uint64_t n = p->observations;
    pthread_mutex_unlock(&p->lock);
    return n;
}

bool kvs__policy_calibrate_once(kvs__policy_t *p, const kvs__staging_backend_t *be, int domain)
{
    pthread_mutex_lock(&p->lock);
    bool ran = false;
    if (!p->calibrated) {
        kvs__staging_calib_t cal = default_cal;
        int rc = be->calibrate != NULL ? be->calibrate(domain, &cal) : KVS_UNSUPPORTED;
        if (rc == KVS_OK && cal.frag_ns > 0 && cal.scatter_ns_per_byte > 0 && isfinite(cal.fill_ns))
            p->cal = cal;
        else
            kvs_warn("staging: calibration of the adaptive mode failed (%s); its defaults are used",
                     kvs_status_str(rc));
        kvs_info("staging: adaptive mode calibrated: %.0f ns per fragment, %.0f ns per "
                 "submission, %.3f ns per scattered byte, %.0f ns per fill",
                 p->cal.frag_ns, p->cal.call_ns, p->cal.scatter_ns_per_byte, p->cal.fill_ns);
        p->calibrated = true;
        ran = true;
    }
    pthread_mutex_unlock(&p->lock);
    return ran;
}
