/* The CUDA staging backend: device memory is its domain (id = device ordinal), the staging
 * buffer is cudaMalloc'd on the first staged call's device, transfers land in it through the
 * transports' GPU paths (shm: the copy engine reads the registered mapping; tcp: pinned bounce
 * buffers), and each fill is scattered by one launch of the scatter kernel (src/gpu/scatter.cu)
 * on a stream of that device, waited for before the fill's keys are reported. Builds without
 * CUDA have no such backend (staging then uses backend_none). */
#define _GNU_SOURCE
#include "staging_int.h"

#ifdef KVS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <pthread.h>

#define MAX_DEVICES 64

/* One scatter context and stream per device, made on first use and kept for the process. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kvs__scatter_t *ctx[MAX_DEVICES];
static cudaStream_t streams[MAX_DEVICES];

static int cuda_domain_of(int reg_domain)
{
    return reg_domain >= 0 && reg_domain < MAX_DEVICES ? reg_domain : -1;
}

static int cuda_alloc(int domain, uint64_t bytes, void **buf_p)
{
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
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(domain);
    cudaFree(buf);
    cudaSetDevice(prev);
}

static int cuda_scatter(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                        void **done_p)
{
    *done_p = NULL;
    pthread_mutex_lock(&lock);
    int rc = KVS_OK;
    int prev = 0;
    cudaGetDevice(&prev);
    if (ctx[domain] == NULL) {
        kvs__scatter_config_t cfg = {.device = domain, .max_blocks = 0};
        rc = kvs__scatter_create(&cfg, &ctx[domain]);
        if (rc == KVS_OK &&
            (cudaSetDevice(domain) != cudaSuccess ||
             cudaStreamCreateWithFlags(&streams[domain], cudaStreamNonBlocking) != cudaSuccess)) {
            kvs__scatter_destroy(ctx[domain]);
            ctx[domain] = NULL;
            rc = KVS_TRANSFER_FAIL;
        }
    }
    /* The context and stream are shared by the clients of a process: launches are serialised;
     * each launch records its own event, which the caller waits for outside the lock. */
    cudaEvent_t ev = NULL;
    if (rc == KVS_OK)
        rc = kvs__scatter_launch(ctx[domain], src, frags, n, streams[domain]);
    if (rc == KVS_OK) {
        cudaError_t e = cudaSetDevice(domain);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventRecord(ev, streams[domain]);
        if (e != cudaSuccess) {
            /* Without an event the only safe wait is the whole stream. */
            kvs_warn("staging: scatter event on GPU %d: %s", domain, cudaGetErrorString(e));
            cudaStreamSynchronize(streams[domain]);
            if (ev != NULL)
                cudaEventDestroy(ev);
            ev = NULL;
            rc = KVS_TRANSFER_FAIL;
        }
    }
    cudaSetDevice(prev);
    pthread_mutex_unlock(&lock);
    *done_p = ev;
    return rc;
}

static int cuda_scatter_wait(int domain, void *done)
{
    if (done == NULL)
        return KVS_OK;
    cudaEvent_t ev = done;
    cudaError_t e = cudaEventSynchronize(ev);
    cudaEventDestroy(ev);
    if (e != cudaSuccess) {
        kvs_warn("staging: scatter on GPU %d failed: %s", domain, cudaGetErrorString(e));
        return KVS_TRANSFER_FAIL;
    }
    return KVS_OK;
}

const kvs__staging_backend_t kvs__staging_backend_cuda = {
    .name = "cuda",
    .device_memory = true,
    .domain_of = cuda_domain_of,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .scatter = cuda_scatter,
    .scatter_wait = cuda_scatter_wait,
};

#endif
