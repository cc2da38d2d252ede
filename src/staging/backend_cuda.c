/* The CUDA staging backend: device memory is its domain (id = device ordinal), the staging
 * buffer is cudaMalloc'd on the first staged call's device, transfers land in it through the
 * transports' GPU paths (shm: the copy engine reads the registered mapping; tcp: pinned bounce
 * buffers), and each fill is scattered by one launch of the scatter kernel (src/gpu/scatter.cu)
 * on a stream of that device, waited for (until the call's deadline, then aborted) before the
 * fill's keys are reported. Builds without CUDA have no such backend (staging then uses
 * backend_none). */
#define _GNU_SOURCE
#include "staging_int.h"
#include "../gpu/gpu_copy.h"

#ifdef KVS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#define MAX_DEVICES 64

/* How long a wait polls its event before it starts sleeping between polls, and the sleep: a
 * staged fill's scatter usually ends within a few hundred microseconds, and sleeping through
 * that would add to every call. */
#define SPIN_NS  2000000ull
#define SLEEP_NS 50000ull

/* One scatter context with its own stream and completion event. A context is not thread-safe and
 * a launch on it may wait for its earlier kernels, so each is used by one call at a time, taken
 * from its device's pool and given back once its scatter has ended: launches and waits never
 * happen under a lock, and calls on one device do not queue behind each other's waits. */
typedef struct lane {
    struct lane *next;
    int device;
    kvs__scatter_t *ctx;
    cudaStream_t stream;
    cudaEvent_t done;
    kvs__scatter_ticket_t ticket; /* the streamed kernels of the lane's scatter in flight */
} lane_t;

/* Idle lanes per device, kept for the process (as many as calls ever ran on it at once). The
 * lock guards the list only. */
typedef struct {
    pthread_mutex_t lock;
    lane_t *idle;
} device_t;

static device_t devices[MAX_DEVICES];
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static kvs__scatter_options_t scatter_opts; /* read once, for every lane */

static void devices_init(void)
{
    for (int i = 0; i < MAX_DEVICES; i++)
        pthread_mutex_init(&devices[i].lock, NULL);
    if (kvs__staging_scatter_options(&scatter_opts) != KVS_OK)
        kvs_warn("staging: %s", kvs_last_error());
}

/* A lane's stream: non-blocking, at the greatest priority when so configured. */
static cudaError_t lane_stream(cudaStream_t *s_p)
{
    int least = 0, greatest = 0;
    if (!scatter_opts.high_priority)
        return cudaStreamCreateWithFlags(s_p, cudaStreamNonBlocking);
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    return e != cudaSuccess ? e
                            : cudaStreamCreateWithPriority(s_p, cudaStreamNonBlocking, greatest);
}

static int cuda_domain_of(int reg_domain)
{
    return reg_domain >= 0 && reg_domain < MAX_DEVICES ? reg_domain : -1;
}

static int cuda_alloc(int domain, uint64_t bytes, void **buf_p)
{
    if (cuda_domain_of(domain) < 0 || buf_p == NULL)
        return KVS_INVALID_PARAMS;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(domain);
    if (e == cudaSuccess)
        e = cudaMalloc(buf_p, (size_t)bytes);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        kvs_warn("staging: cudaMalloc of %llu bytes on GPU %d: %s", (unsigned long long)bytes,
                 domain, cudaGetErrorString(e));
        cudaGetLastError();
        return KVS_NO_MEMORY;
    }
    return KVS_OK;
}

static void cuda_free(int domain, void *buf)
{
    if (cuda_domain_of(domain) < 0 || buf == NULL)
        return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(domain);
    cudaFree(buf);
    cudaSetDevice(prev);
}

static void lane_destroy(lane_t *l)
{
    if (l == NULL)
        return;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(l->device) == cudaSuccess) {
        if (l->stream != NULL)
            cudaStreamSynchronize(l->stream);
        if (l->done != NULL)
            cudaEventDestroy(l->done);
        if (l->stream != NULL)
            cudaStreamDestroy(l->stream);
    }
    cudaSetDevice(prev);
    kvs__scatter_destroy(l->ctx);
    kvs__free(l);
}

/* An idle lane of `device`, made when none is (outside the lock: it allocates with the
 * driver). */
static int lane_take(int device, lane_t **l_p)
{
    pthread_once(&devices_once, devices_init);
    device_t *d = &devices[device];
    pthread_mutex_lock(&d->lock);
    lane_t *l = d->idle;
    if (l != NULL)
        d->idle = l->next;
    pthread_mutex_unlock(&d->lock);
    if (l != NULL) {
        *l_p = l;
        return KVS_OK;
    }
    l = kvs__calloc(1, sizeof(*l));
    if (l == NULL)
        return KVS_NO_MEMORY;
    l->device = device;
    kvs__scatter_config_t cfg = {.device = device, .max_blocks = scatter_opts.blocks};
    int rc = kvs__scatter_create(&cfg, &l->ctx);
    if (rc == KVS_OK) {
        int prev = 0;
        cudaGetDevice(&prev);
        cudaError_t e = cudaSetDevice(device);
        if (e == cudaSuccess)
            e = lane_stream(&l->stream);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming);
        cudaSetDevice(prev);
        if (e != cudaSuccess) {
            kvs_warn("staging: scatter stream on GPU %d: %s", device, cudaGetErrorString(e));
            cudaGetLastError();
            rc = KVS_TRANSFER_FAIL;
        }
    }
    if (rc != KVS_OK) {
        lane_destroy(l);
        return rc;
    }
    *l_p = l;
    return KVS_OK;
}

/* Gives back a lane whose stream has nothing left to run. */
static void lane_give(lane_t *l)
{
    device_t *d = &devices[l->device];
    pthread_mutex_lock(&d->lock);
    l->next = d->idle;
    d->idle = l;
    pthread_mutex_unlock(&d->lock);
}

/* Polls `ev` until it completes or deadline_ns passes (0 or UINT64_MAX: no deadline): OK,
 * TIMED_OUT, or TRANSFER_FAIL when CUDA reports an error. cudaEventSynchronize has no bound. */
static int event_wait_until(cudaEvent_t ev, uint64_t deadline_ns, int device)
{
    bool bounded = deadline_ns != 0 && deadline_ns != UINT64_MAX;
    uint64_t start = kvs__now_ns();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return KVS_OK;
        if (e != cudaErrorNotReady) {
            kvs_warn("staging: scatter on GPU %d failed: %s", device, cudaGetErrorString(e));
            cudaGetLastError();
            return KVS_TRANSFER_FAIL;
        }
        uint64_t now = kvs__now_ns();
        if (bounded && now >= deadline_ns)
            return KVS_TIMED_OUT;
        if (now - start < SPIN_NS) {
            sched_yield();
            continue;
        }
        uint64_t ns = bounded ? KVS_MIN(SLEEP_NS, deadline_ns - now) : SLEEP_NS;
        struct timespec ts = {0, (long)ns};
        nanosleep(&ts, NULL);
    }
}

/* Records the lane's completion event after what it enqueued; on failure the lane's work is
 * stopped (a streamed kernel aborted) and waited for, and the lane goes back. */
static int lane_started(lane_t *l, int domain, int rc, void **done_p)
{
    int prev = 0;
    cudaGetDevice(&prev);
    if (rc == KVS_OK) {
        cudaError_t e = cudaSetDevice(domain);
        if (e == cudaSuccess)
            e = cudaEventRecord(l->done, l->stream);
        if (e != cudaSuccess) {
            kvs_warn("staging: scatter event on GPU %d: %s", domain, cudaGetErrorString(e));
            cudaGetLastError();
            rc = KVS_TRANSFER_FAIL;
        }
    }
    if (rc != KVS_OK) {
        /* A kernel may have started before the failure: stop it and let it end before the call
         * reports the keys (nothing may write them afterwards). It stops at its next check. */
        kvs__scatter_abort(l->ctx, &l->ticket);
        if (cudaSetDevice(domain) == cudaSuccess)
            cudaStreamSynchronize(l->stream);
        cudaGetLastError();
        cudaSetDevice(prev);
        lane_give(l);
        return rc;
    }
    cudaSetDevice(prev);
    *done_p = l;
    return KVS_OK;
}

static int cuda_scatter(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                        uint64_t deadline_ns, bool stall, void **done_p)
{
    if (done_p == NULL || cuda_domain_of(domain) < 0 || src == NULL || (frags == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    *done_p = NULL;
    lane_t *l = NULL;
    int rc = lane_take(domain, &l);
    if (rc != KVS_OK)
        return rc;
    kvs__scatter_opts_t opts = {.deadline_ns = deadline_ns, .test_hold = stall};
    rc = kvs__scatter_launch_opts(l->ctx, src, frags, n, l->stream, &opts, &l->ticket);
    return lane_started(l, domain, rc, done_p);
}

/* The plan goes up on a lane's stream, which then waits for it: the plan is small (4 bytes a
 * page) and this runs while the first fill's transfers are in flight. */
static int cuda_upload(int domain, void *dev, const void *host, size_t bytes)
{
    if (cuda_domain_of(domain) < 0 || dev == NULL || (host == NULL && bytes > 0))
        return KVS_INVALID_PARAMS;
    lane_t *l = NULL;
    int rc = lane_take(domain, &l);
    if (rc != KVS_OK)
        return rc;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(domain);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, l->stream);
    cudaError_t es = cudaStreamSynchronize(l->stream);
    if (e == cudaSuccess)
        e = es;
    cudaSetDevice(prev);
    lane_give(l);
    if (e != cudaSuccess) {
        kvs_warn("staging: page plan upload to GPU %d: %s", domain, cudaGetErrorString(e));
        cudaGetLastError();
        return KVS_TRANSFER_FAIL;
    }
    return KVS_OK;
}

/* The page kernel reads the uploaded plan: no units written by the host, nothing to abort (it
 * waits for nothing on the host). `stall` has no meaning for it. */
static int cuda_scatter_pages(int domain, const void *src, const kvs__pt_plan_t *plan, uint32_t a,
                              uint32_t b, uint64_t first_unit, uint64_t end_unit, bool stall,
                              void **done_p)
{
    KVS_UNUSED(stall);
    if (done_p == NULL || cuda_domain_of(domain) < 0 || src == NULL || plan == NULL)
        return KVS_INVALID_PARAMS;
    *done_p = NULL;
    lane_t *l = NULL;
    int rc = lane_take(domain, &l);
    if (rc != KVS_OK)
        return rc;
    l->ticket = (kvs__scatter_ticket_t){0, {0, 0}, {0, 0}};
    rc = kvs__scatter_pages_launch(l->ctx, src, plan, a, b, first_unit, end_unit, l->stream);
    return lane_started(l, domain, rc, done_p);
}

static int cuda_scatter_wait(int domain, void *done, uint64_t deadline_ns)
{
    if (done == NULL)
        return KVS_OK;
    lane_t *l = done;
    if (l->device != domain)
        return KVS_INVALID_PARAMS;
    int rc = event_wait_until(l->done, deadline_ns, domain);
    if (rc == KVS_TIMED_OUT) {
        /* Past the deadline: the kernel stops waiting for units at once and stops copying at its
         * warps' next chunk, so this wait is short; only then may the call return. */
        kvs__scatter_abort(l->ctx, &l->ticket);
        if (cudaEventSynchronize(l->done) != cudaSuccess) {
            cudaGetLastError();
            rc = KVS_TRANSFER_FAIL;
        }
    }
    if (rc != KVS_TRANSFER_FAIL) {
        kvs__scatter_end_t end = kvs__scatter_result(l->ctx, &l->ticket);
        if (end == KVS_SCATTER_COMPLETE)
            rc = KVS_OK; /* every byte landed, even if only just after the deadline */
        else if (rc == KVS_OK && end != KVS_SCATTER_TIMED_OUT)
            rc = KVS_TRANSFER_FAIL; /* aborted or unknown, though the host did not abort it */
        else
            rc = KVS_TIMED_OUT;
        if (rc != KVS_OK)
            kvs_warn("staging: scatter on GPU %d stopped early (%s)", domain,
                     end == KVS_SCATTER_TIMED_OUT ? "its wait for units timed out" : "aborted");
    }
    lane_give(l);
    return rc;
}

/* Times one scatter of n fragments of `piece` bytes from the start of dev to dev + len, up to
 * its completion event. */
static uint64_t time_scatter(lane_t *l, char *dev, size_t len, uint32_t n, size_t piece,
                             kvs__scatter_frag_t *frags)
{
    for (uint32_t i = 0; i < n; i++)
        frags[i] = (kvs__scatter_frag_t){dev + len + (size_t)(i * 7919u % n) * 2 * piece, piece};
    uint64_t t0 = kvs__now_ns();
    if (kvs__scatter_launch(l->ctx, dev, frags, n, l->stream) != KVS_OK ||
        cudaEventRecord(l->done, l->stream) != cudaSuccess ||
        event_wait_until(l->done, 0, l->device) != KVS_OK)
        return 0;
    return kvs__now_ns() - t0;
}

/* The adaptive mode's model on this device: the transports' own GPU copy (kvs__gpu_copy_slice)
 * of one 4 KiB fragment (a submission) and of 256 (per fragment), from pinned memory; and the
 * scatter of one fragment (a fill's fixed cost) and of 1024 x 4 KiB (per byte). Each timing is
 * the best of three. */
static int cuda_calibrate(int domain, kvs__staging_calib_t *cal)
{
    enum { N = 256, NS = 1024 };
    const size_t piece = 4096, len = NS * piece;
    void *host = NULL;
    char *dev = NULL;
    kvs__gpu_stream_t *gs = NULL;
    lane_t *l = NULL;
    struct iovec *iov = kvs__malloc(N * sizeof(*iov));
    kvs__scatter_frag_t *frags = kvs__malloc(NS * sizeof(*frags));
    int prev = 0;
    cudaGetDevice(&prev);
    int rc = iov != NULL && frags != NULL ? kvs__gpu_alloc_pinned(len, &host) : KVS_NO_MEMORY;
    if (rc == KVS_OK)
        rc = cuda_alloc(domain, 3 * len, (void **)&dev);
    if (rc == KVS_OK)
        rc = kvs__gpu_stream_create(domain, &gs);
    if (rc == KVS_OK)
        rc = lane_take(domain, &l);
    uint64_t one = UINT64_MAX, many = UINT64_MAX, s1 = UINT64_MAX, sn = UINT64_MAX;
    for (int rep = 0; rc == KVS_OK && rep < 4; rep++) { /* the first round warms up */
        for (uint32_t i = 0; i < N; i++)
            iov[i] = (struct iovec){dev + (size_t)(i * 7919u % N) * 2 * piece, piece};
        uint64_t t0 = kvs__now_ns();
        rc = kvs__gpu_copy_slice(gs, true, host, iov, 1, 0, piece);
        if (rc == KVS_OK)
            rc = kvs__gpu_sync(gs);
        uint64_t t1 = kvs__now_ns();
        if (rc == KVS_OK)
            rc = kvs__gpu_copy_slice(gs, true, host, iov, N, 0, N * piece);
        if (rc == KVS_OK)
            rc = kvs__gpu_sync(gs);
        uint64_t t2 = kvs__now_ns();
        uint64_t a = time_scatter(l, dev, len, 1, piece, frags);
        uint64_t b = time_scatter(l, dev, len, NS, piece, frags);
        if (a == 0 || b == 0)
            rc = KVS_TRANSFER_FAIL;
        if (rep > 0 && rc == KVS_OK) {
            one = KVS_MIN(one, t1 - t0);
            many = KVS_MIN(many, t2 - t1);
            s1 = KVS_MIN(s1, a);
            sn = KVS_MIN(sn, b);
        }
    }
    if (rc == KVS_OK) {
        cal->call_ns = (double)one;
        cal->frag_ns = KVS_MAX((double)many - (double)one, 1.0) / N;
        cal->fill_ns = (double)s1;
        cal->scatter_ns_per_byte = KVS_MAX((double)sn - (double)s1, 1.0) / (double)len;
    }
    if (l != NULL)
        lane_give(l);
    kvs__gpu_stream_destroy(gs);
    cuda_free(domain, dev);
    kvs__gpu_free_pinned(host);
    kvs__free(iov);
    kvs__free(frags);
    cudaSetDevice(prev);
    cudaGetLastError();
    return rc;
}

const kvs__staging_backend_t kvs__staging_backend_cuda = {
    .name = "cuda",
    .device_memory = true,
    .domain_of = cuda_domain_of,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .scatter = cuda_scatter,
    .scatter_wait = cuda_scatter_wait,
    .upload = cuda_upload,
    .scatter_pages = cuda_scatter_pages,
    .calibrate = cuda_calibrate,
};

#endif
