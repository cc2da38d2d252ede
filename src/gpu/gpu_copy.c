/* GPU copies for the transports (see gpu_copy.h). With KVS_HAVE_CUDA this calls the CUDA
 * runtime's C API; without it every call reports KVS_UNSUPPORTED. */
#define _GNU_SOURCE
#include "gpu_copy.h"

#include <stdlib.h>
#include <string.h>

#ifdef KVS_HAVE_CUDA
#include <cuda_runtime_api.h>

struct kvs__gpu_stream {
    int device;
    cudaStream_t stream;
    cudaEvent_t ev[KVS_GPU_SLOTS];
};

static int cuda_err(cudaError_t e, const char *what)
{
    kvs_warn("gpu: %s failed: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); /* clear a non-sticky error */
    return e == cudaErrorMemoryAllocation ? KVS_NO_MEMORY : KVS_TRANSFER_FAIL;
}

bool kvs__gpu_built(void)
{
    return true;
}

int kvs__gpu_host_register(void *p, size_t len, bool read_only)
{
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0);
    cudaError_t e = cudaHostRegister(p, len, flags);
    return e == cudaSuccess ? KVS_OK : cuda_err(e, "cudaHostRegister");
}

void kvs__gpu_host_unregister(void *p)
{
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

int kvs__gpu_alloc_pinned(size_t len, void **p_p)
{
    cudaError_t e = cudaMallocHost(p_p, len);
    return e == cudaSuccess ? KVS_OK : cuda_err(e, "cudaMallocHost");
}

void kvs__gpu_free_pinned(void *p)
{
    if (p != NULL)
        cudaFreeHost(p);
}

int kvs__gpu_stream_create(int device, kvs__gpu_stream_t **s_p)
{
    kvs__gpu_stream_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->device = device;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    for (int i = 0; e == cudaSuccess && i < KVS_GPU_SLOTS; i++)
        e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        kvs__free(s);
        return cuda_err(e, "stream setup");
    }
    *s_p = s;
    return KVS_OK;
}

void kvs__gpu_stream_destroy(kvs__gpu_stream_t *s)
{
    if (s == NULL)
        return;
    cudaStreamSynchronize(s->stream);
    for (int i = 0; i < KVS_GPU_SLOTS; i++)
        cudaEventDestroy(s->ev[i]);
    cudaStreamDestroy(s->stream);
    kvs__free(s);
}

/* KVS_GPU_COPY=each|batch (default batch: DESIGN §4 measured cudaMemcpyBatchAsync ahead of one
 * cudaMemcpyAsync per 8 KiB page, and `kvs__bench` compares both again). */
static _Atomic int copy_mode = -1; /* 0 each, 1 batch */

static bool use_batch(void)
{
    if (copy_mode < 0) {
        const char *v = getenv("KVS_GPU_COPY");
        copy_mode = v != NULL && strcmp(v, "each") == 0 ? 0 : 1;
    }
    return copy_mode == 1;
}

void kvs__gpu_set_batched(bool batched)
{
    copy_mode = batched ? 1 : 0;
}

/* One cudaMemcpyBatchAsync for n pieces (the 12.8 and 13.0 signatures differ). */
static cudaError_t copy_batch(void **dsts, const void **srcs, size_t *sizes, size_t n,
                              bool to_device, cudaStream_t stream)
{
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = to_device ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    attr.dstLocHint.type = to_device ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    size_t idx = 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, stream);
#else
    size_t fail = 0;
    return cudaMemcpyBatchAsync(dsts, (void **)srcs, sizes, n, &attr, &idx, 1, &fail, stream);
#endif
}

int kvs__gpu_copy_slice(kvs__gpu_stream_t *s, bool to_device, void *host, const struct iovec *iov,
                        uint32_t cnt, uint64_t off, uint64_t len)
{
    if (use_batch() && cnt > 1) {
        void **dsts = kvs__malloc(cnt * sizeof(*dsts));
        const void **srcs = kvs__malloc(cnt * sizeof(*srcs));
        size_t *sizes = kvs__malloc(cnt * sizeof(*sizes));
        int rc = dsts && srcs && sizes ? KVS_OK : KVS_NO_MEMORY;
        size_t n = 0;
        uint32_t i = 0;
        uint64_t o = off, left = len;
        while (i < cnt && o >= iov[i].iov_len) {
            o -= iov[i].iov_len;
            i++;
        }
        char *h = host;
        for (; rc == KVS_OK && i < cnt && left > 0; i++, n++) {
            uint64_t l = KVS_MIN((uint64_t)iov[i].iov_len - o, left);
            char *frag = (char *)iov[i].iov_base + o;
            dsts[n] = to_device ? (void *)frag : (void *)h;
            srcs[n] = to_device ? (const void *)h : (const void *)frag;
            sizes[n] = l;
            h += l;
            left -= l;
            o = 0;
        }
        if (rc == KVS_OK && left != 0)
            rc = KVS_INVALID_PARAMS;
        if (rc == KVS_OK && n > 0) {
            cudaError_t e = copy_batch(dsts, srcs, sizes, n, to_device, s->stream);
            if (e != cudaSuccess)
                rc = cuda_err(e, "cudaMemcpyBatchAsync");
        }
        kvs__free(dsts);
        kvs__free(srcs);
        kvs__free(sizes);
        return rc;
    }
    uint32_t i = 0;
    while (i < cnt && off >= iov[i].iov_len) {
        off -= iov[i].iov_len;
        i++;
    }
    char *h = host;
    for (; i < cnt && len > 0; i++) {
        uint64_t l = KVS_MIN((uint64_t)iov[i].iov_len - off, len);
        char *frag = (char *)iov[i].iov_base + off;
        cudaError_t e = to_device ? cudaMemcpyAsync(frag, h, l, cudaMemcpyHostToDevice, s->stream)
                                  : cudaMemcpyAsync(h, frag, l, cudaMemcpyDeviceToHost, s->stream);
        if (e != cudaSuccess)
            return cuda_err(e, "cudaMemcpyAsync");
        h += l;
        len -= l;
        off = 0;
    }
    return len == 0 ? KVS_OK : KVS_INVALID_PARAMS;
}

int kvs__gpu_record(kvs__gpu_stream_t *s, int slot)
{
    cudaError_t e = cudaEventRecord(s->ev[slot], s->stream);
    return e == cudaSuccess ? KVS_OK : cuda_err(e, "cudaEventRecord");
}

int kvs__gpu_wait_slot(kvs__gpu_stream_t *s, int slot)
{
    cudaError_t e = cudaEventSynchronize(s->ev[slot]);
    return e == cudaSuccess ? KVS_OK : cuda_err(e, "cudaEventSynchronize");
}

int kvs__gpu_sync(kvs__gpu_stream_t *s)
{
    cudaError_t e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? KVS_OK : cuda_err(e, "cudaStreamSynchronize");
}

#else /* no CUDA */

void kvs__gpu_set_batched(bool batched)
{
    KVS_UNUSED(batched);
}

bool kvs__gpu_built(void)
{
    return false;
}

int kvs__gpu_host_register(void *p, size_t len, bool read_only)
{
    KVS_UNUSED(p);
    KVS_UNUSED(len);
    KVS_UNUSED(read_only);
    return KVS_UNSUPPORTED;
}

void kvs__gpu_host_unregister(void *p)
{
    KVS_UNUSED(p);
}

int kvs__gpu_alloc_pinned(size_t len, void **p_p)
{
    KVS_UNUSED(len);
    KVS_UNUSED(p_p);
    return KVS_UNSUPPORTED;
}

void kvs__gpu_free_pinned(void *p)
{
    KVS_UNUSED(p);
}

int kvs__gpu_stream_create(int device, kvs__gpu_stream_t **s_p)
{
    KVS_UNUSED(device);
    KVS_UNUSED(s_p);
    return KVS_UNSUPPORTED;
}

void kvs__gpu_stream_destroy(kvs__gpu_stream_t *s)
{
    KVS_UNUSED(s);
}

int kvs__gpu_copy_slice(kvs__gpu_stream_t *s, bool to_device, void *host, const struct iovec *iov,
                        uint32_t cnt, uint64_t off, uint64_t len)
{
    KVS_UNUSED(s);
    KVS_UNUSED(to_device);
    KVS_UNUSED(host);
    KVS_UNUSED(iov);
    KVS_UNUSED(cnt);
    KVS_UNUSED(off);
    KVS_UNUSED(len);
    return KVS_UNSUPPORTED;
}

int kvs__gpu_record(kvs__gpu_stream_t *s, int slot)
{
    KVS_UNUSED(s);
    KVS_UNUSED(slot);
    return KVS_UNSUPPORTED;
}

int kvs__gpu_wait_slot(kvs__gpu_stream_t *s, int slot)
{
    KVS_UNUSED(s);
    KVS_UNUSED(slot);
    return KVS_UNSUPPORTED;
}

int kvs__gpu_sync(kvs__gpu_stream_t *s)
{
    KVS_UNUSED(s);
    return KVS_UNSUPPORTED;
}

#endif
