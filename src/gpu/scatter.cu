// The scatter kernel: one launch copies a contiguous device source into many destination
// fragments. The host splits fragments into work units of at most KVS_SCATTER_UNIT_BYTES; each
// block of a persistent grid copies whole units with the widest accesses the relative alignment
// of source and destination allows (16, 8 or 4 bytes; a funnel shift when they differ), bytes
// only for heads and tails. Units travel as a by-value kernel parameter when they fit, else
// from a pinned upload buffer whose reuse waits on the event of its last kernel.
#include "scatter.h"

extern "C" {
#include "../common/common_int.h"
}

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

namespace
{

struct unit_t {
    unsigned long long dst;
    unsigned long long src_off;
    unsigned int len;
    unsigned int pad_;
};

constexpr unsigned kThreads = 256;
constexpr unsigned kSmallUnits = 64;
constexpr unsigned kLargeUnits = KVS_SCATTER_INLINE_UNITS;

template <unsigned N> struct inline_units_t {
    unit_t u[N];
};
static_assert(sizeof(inline_units_t<kLargeUnits>) + 64 <= 32764, "kernel parameter limit");

// Copies len bytes with accesses of type T; dst and src have the same alignment modulo
// sizeof(T).
template <typename T>
__device__ __forceinline__ void copy_vec(char *dst, const char *src, unsigned len)
{
    constexpr unsigned W = sizeof(T);
    unsigned head = (unsigned)((W - ((uintptr_t)dst & (W - 1))) & (W - 1));
    if (head > len)
        head = len;
    if (threadIdx.x < head)
        dst[threadIdx.x] = src[threadIdx.x];
    unsigned nvec = (len - head) / W;
    const T *s = reinterpret_cast<const T *>(src + head);
    T *d = reinterpret_cast<T *>(dst + head);
    constexpr unsigned U = 4; // loads in flight per thread
    for (unsigned i = threadIdx.x; i < nvec; i += U * kThreads) {
        T v[U];
#pragma unroll
        for (unsigned k = 0; k < U; k++) {
            unsigned j = i + k * kThreads;
            if (j < nvec)
                v[k] = s[j];
        }
#pragma unroll
        for (unsigned k = 0; k < U; k++) {
            unsigned j = i + k * kThreads;
            if (j < nvec)
                d[j] = v[k];
        }
    }
    unsigned done = head + nvec * W, tail = len - done;
    if (threadIdx.x < tail)
        dst[done + threadIdx.x] = src[done + threadIdx.x];
}

// Source and destination misaligned differently: 4-byte stores built from two aligned 4-byte
// source words. Never loads a word that holds no byte of the source range.
__device__ __forceinline__ void copy_shift(char *dst, const char *src, unsigned len)
{
    unsigned head = (unsigned)((4 - ((uintptr_t)dst & 3)) & 3);
    if (head > len)
        head = len;
    if (threadIdx.x < head)
        dst[threadIdx.x] = src[threadIdx.x];
    const char *s = src + head;
    unsigned nw = (len - head) / 4;
    unsigned r = (unsigned)((uintptr_t)s & 3); // non-zero here
    const unsigned *sw = reinterpret_cast<const unsigned *>(s - r);
    const unsigned *last =
        reinterpret_cast<const unsigned *>(((uintptr_t)(src + len - 1)) & ~(uintptr_t)3);
    unsigned *dw = reinterpret_cast<unsigned *>(dst + head);
    for (unsigned i = threadIdx.x; i < nw; i += kThreads) {
        unsigned lo = sw[i];
        unsigned hi = (sw + i + 1 <= last) ? sw[i + 1] : 0u;
        dw[i] = __funnelshift_r(lo, hi, 8 * r);
    }
    unsigned done = head + nw * 4, tail = len - done;
    if (threadIdx.x < tail)
        dst[done + threadIdx.x] = src[done + threadIdx.x];
}

__device__ __forceinline__ void copy_unit(const unit_t &u, const char *src)
{
    char *d = reinterpret_cast<char *>(u.dst);
    const char *s = src + u.src_off;
    uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
    if ((x & 15) == 0)
        copy_vec<uint4>(d, s, u.len);
    else if ((x & 7) == 0)
        copy_vec<uint2>(d, s, u.len);
    else if ((x & 3) == 0)
        copy_vec<unsigned>(d, s, u.len);
    else
        copy_shift(d, s, u.len);
}

template <unsigned N>
__global__ void __launch_bounds__(kThreads)
    scatter_inline(const char *src, unsigned n, const inline_units_t<N> units)
{
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x)
        copy_unit(units.u[i], src);
}

__global__ void __launch_bounds__(kThreads)
    scatter_uploaded(const char *src, unsigned n, const unit_t *units)
{
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x)
        copy_unit(units[i], src);
}

} // namespace

struct kvs__scatter {
    int device;
    unsigned grid; // blocks of a full launch
    cudaEvent_t done;
    bool pending; // `done` recorded after the last kernel that used the upload buffers
    unit_t *host; // pinned
    unit_t *dev;
    size_t cap; // units in host and dev
};

static int cuda_fail(cudaError_t e, const char *what)
{
    kvs_error("scatter: %s failed: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? KVS_NO_MEMORY : KVS_TRANSFER_FAIL;
}

// Makes s->device current; *prev_p receives the caller's device to restore.
static int enter_device(const kvs__scatter_t *s, int *prev_p)
{
    cudaError_t e = cudaGetDevice(prev_p);
    if (e == cudaSuccess && *prev_p != s->device)
        e = cudaSetDevice(s->device);
    return e == cudaSuccess ? KVS_OK : cuda_fail(e, "cudaSetDevice");
}

static void leave_device(const kvs__scatter_t *s, int prev)
{
    if (prev != s->device)
        cudaSetDevice(prev);
}

extern "C" bool kvs__scatter_built(void)
{
    return true;
}

extern "C" int kvs__scatter_create(const kvs__scatter_config_t *cfg, kvs__scatter_t **s_p)
{
    if (cfg == NULL || s_p == NULL || cfg->device < 0)
        return KVS_INVALID_PARAMS;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || cfg->device >= count) {
        cudaGetLastError(); // clear the sticky "no device" error
        return KVS_UNSUPPORTED;
    }
    kvs__scatter_t *s = static_cast<kvs__scatter_t *>(kvs__calloc(1, sizeof(*s)));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->device = cfg->device;
    int prev, sms = 0;
    int rc = enter_device(s, &prev);
    if (rc != KVS_OK) {
        kvs__free(s);
        return rc;
    }
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s->device);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    leave_device(s, prev);
    if (e != cudaSuccess) {
        kvs__free(s);
        return cuda_fail(e, "scatter setup");
    }
    // 8 resident blocks of 256 threads fill an SM (2048 threads on Hopper).
    unsigned full = (unsigned)sms * 8u;
    s->grid = cfg->max_blocks && cfg->max_blocks < full ? cfg->max_blocks : full;
    *s_p = s;
    return KVS_OK;
}

// Grows the upload buffers to hold `n` units; the previous ones must be idle.
static int ensure_upload(kvs__scatter_t *s, size_t n)
{
    if (n <= s->cap)
        return KVS_OK;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < n)
        cap *= 2;
    cudaFreeHost(s->host);
    cudaFree(s->dev);
    s->host = NULL;
    s->dev = NULL;
    s->cap = 0;
    cudaError_t e = cudaMallocHost(reinterpret_cast<void **>(&s->host), cap * sizeof(unit_t));
    if (e == cudaSuccess)
        e = cudaMalloc(reinterpret_cast<void **>(&s->dev), cap * sizeof(unit_t));
    if (e != cudaSuccess) {
        cudaFreeHost(s->host);
        s->host = NULL;
        s->dev = NULL;
        return cuda_fail(e, "descriptor buffer allocation");
    }
    s->cap = cap;
    return KVS_OK;
}

// Splits the fragments into units written to `out` (which holds `nunits`).
static void build_units(const kvs__scatter_frag_t *frags, uint32_t n, unit_t *out)
{
    uint64_t off = 0;
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = frags[i].len;
        for (uint64_t o = 0; frags[i].dst != NULL && o < len; o += KVS_SCATTER_UNIT_BYTES) {
            uint64_t l = len - o < KVS_SCATTER_UNIT_BYTES ? len - o : KVS_SCATTER_UNIT_BYTES;
            out[k++] = unit_t{(unsigned long long)(uintptr_t)frags[i].dst + o,
                              (unsigned long long)(off + o), (unsigned)l, 0u};
        }
        off += len;
    }
}

template <unsigned N>
static cudaError_t launch_inline(const kvs__scatter_t *s, const char *src,
                                 const kvs__scatter_frag_t *frags, uint32_t n, size_t nunits,
                                 cudaStream_t stream)
{
    inline_units_t<N> p;
    build_units(frags, n, p.u);
    unsigned grid = nunits < s->grid ? (unsigned)nunits : s->grid;
    scatter_inline<N><<<grid, kThreads, 0, stream>>>(src, (unsigned)nunits, p);
    return cudaGetLastError();
}

extern "C" int kvs__scatter_launch(kvs__scatter_t *s, const void *src,
                                   const kvs__scatter_frag_t *frags, uint32_t n, void *stream_)
{
    if (s == NULL || src == NULL || (frags == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    size_t nunits = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = frags[i].len;
        if (len > UINT64_MAX - total || (uintptr_t)src > UINTPTR_MAX - (total + len))
            return KVS_INVALID_PARAMS;
        total += len;
        if (frags[i].dst != NULL)
            nunits += (len + KVS_SCATTER_UNIT_BYTES - 1) / KVS_SCATTER_UNIT_BYTES;
    }
    if (nunits == 0)
        return KVS_OK;
    if (nunits > UINT32_MAX)
        return KVS_INVALID_PARAMS;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_);
    const char *csrc = static_cast<const char *>(src);
    int prev;
    int rc = enter_device(s, &prev);
    if (rc != KVS_OK)
        return rc;
    cudaError_t e;
    if (nunits <= kSmallUnits) {
        e = launch_inline<kSmallUnits>(s, csrc, frags, n, nunits, stream);
    } else if (nunits <= kLargeUnits) {
        e = launch_inline<kLargeUnits>(s, csrc, frags, n, nunits, stream);
    } else {
        // The upload buffers are reused only after the kernel that last read them.
        e = s->pending ? cudaEventSynchronize(s->done) : cudaSuccess;
        s->pending = false;
        if (e != cudaSuccess) {
            rc = cuda_fail(e, "waiting for the previous scatter");
            goto out;
        }
        rc = ensure_upload(s, nunits);
        if (rc != KVS_OK)
            goto out;
        build_units(frags, n, s->host);
        e = cudaMemcpyAsync(s->dev, s->host, nunits * sizeof(unit_t), cudaMemcpyHostToDevice,
                            stream);
        if (e == cudaSuccess) {
            unsigned grid = nunits < s->grid ? (unsigned)nunits : s->grid;
            scatter_uploaded<<<grid, kThreads, 0, stream>>>(csrc, (unsigned)nunits, s->dev);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) {
            e = cudaEventRecord(s->done, stream);
            s->pending = e == cudaSuccess;
        }
    }
    if (e != cudaSuccess)
        rc = cuda_fail(e, "scatter launch");
out:
    leave_device(s, prev);
    return rc;
}

extern "C" void kvs__scatter_destroy(kvs__scatter_t *s)
{
    if (s == NULL)
        return;
    int prev;
    if (enter_device(s, &prev) == KVS_OK) {
        if (s->pending)
            cudaEventSynchronize(s->done);
        cudaEventDestroy(s->done);
        cudaFreeHost(s->host);
        cudaFree(s->dev);
        leave_device(s, prev);
    }
    kvs__free(s);
}
