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

static int cuda_scatter(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n)
{
    pthread_mutex_lock(&lock);
    int rc = KVS_OK;
    if (ctx[domain] == NULL) {
        kvs__scatter_config_t cfg = {.device = domain, .max_blocks = 0};
        int prev = 0;
        cudaGetDevice(&prev);
        rc = kvs__scatter_create(&cfg, &ctx[domain]);
        if (rc == KVS_OK &&
            (cudaSetDevice(domain) != cudaSuccess ||
             cudaStreamCreateWithFlags(&streams[domain], cudaStreamNonBlocking) != cudaSuccess)) {
            kvs__scatter_destroy(ctx[domain]);
            ctx[domain] = NULL;
            rc = KVS_TRANSFER_FAIL;
        }
        cudaSetDevice(prev);
    }
    kvs__scatter_t *s = ctx[domain];
    cudaStream_t st = streams[domain];
    pthread_mutex_unlock(&lock);
    if (rc != KVS_OK)
        return rc;
    /* One staging buffer per client and one call per buffer at a time: the context and stream
     * are shared between clients of a process, so launches on them are serialised. */
    pthread_mutex_lock(&lock);
    rc = kvs__scatter_launch(s, src, frags, n, st);
    cudaError_t e = rc == KVS_OK ? cudaStreamSynchronize(st) : cudaSuccess;
    pthread_mutex_unlock(&lock);
    if (e != cudaSuccess) {
        kvs_warn("staging: scatter on GPU %d failed: %s", domain, cudaGetErrorString(e));
        rc = KVS_TRANSFER_FAIL;
    }
    return rc;
}

const kvs__staging_backend_t kvs__staging_backend_cuda = {
    .name = "cuda",
    .device_memory = true,
    .domain_of = cuda_domain_of,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .scatter = cuda_scatter,
};

#endif
