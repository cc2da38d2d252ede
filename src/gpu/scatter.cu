// The scatter kernel: one launch copies a contiguous device source into many destination
// fragments. The host splits fragments into work units of at most KVS_SCATTER_UNIT_BYTES,
// described in 16 bytes each; each warp of a persistent grid copies whole units, eight 16-byte
// loads in flight per lane (4 KiB per warp, 128 KiB per SM), with the widest access the relative
// alignment of source and destination allows (16, 8 or 4 bytes; a funnel shift when they
// differ), bytes only for heads and tails, and the next unit's descriptor loaded while the
// current one is copied. Units travel as a by-value kernel parameter when they fit, else they
// are written to one of two pinned buffers of the context and uploaded with one copy before the
// kernel (reading them from mapped host memory instead costs one small PCIe read per unit, which
// measured 1.3-1.4x slower at 4-8 KiB units); each buffer is rewritten only after the kernel that
// last read it.
#include "scatter.h"

extern "C" {
#include "../common/common_int.h"
}

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

namespace
{

// dst, and the source offset (low 48 bits) with len - 1 (high 16 bits): a unit is 1..64 KiB.
struct unit_t {
    unsigned long long dst;
    unsigned long long off_len;
};
static_assert(KVS_SCATTER_UNIT_BYTES <= 65536, "a unit's length - 1 must fit 16 bits");

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kBlocksPerSM = 4; // 32 warps per SM, 64 registers per thread at most
constexpr unsigned kInFlight = 8;    // loads in flight per lane
constexpr unsigned kSmallUnits = 64;
constexpr unsigned kLargeUnits = KVS_SCATTER_INLINE_UNITS;

template <unsigned N> struct inline_units_t {
    unit_t u[N];
};
static_assert(sizeof(inline_units_t<kLargeUnits>) + 64 <= 32764, "kernel parameter limit");

// A warp copies len bytes with accesses of type T; dst and src have the same alignment modulo
// sizeof(T).
template <typename T>
__device__ __forceinline__ void warp_copy_vec(char *dst, const char *src, unsigned len,
                                              unsigned lane)
{
    constexpr unsigned W = sizeof(T);
    unsigned head = (unsigned)((W - ((uintptr_t)dst & (W - 1))) & (W - 1));
    if (head > len)
        head = len;
    if (lane < head)
        dst[lane] = src[lane];
    unsigned nvec = (len - head) / W;
    const T *s = reinterpret_cast<const T *>(src + head);
    T *d = reinterpret_cast<T *>(dst + head);
    // Whole rounds (every lane's eight loads valid) without bounds checks, then one checked.
    unsigned i = lane;
#pragma unroll 1
    for (; i + (kInFlight - 1) * 32 < nvec; i += kInFlight * 32) {
        const T *sp = s + i; // immediate offsets from one base per side
        T *dp = d + i, v[kInFlight];
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            v[k] = sp[k * 32];
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            dp[k * 32] = v[k];
    }
    if (i < nvec) {
        // The last round: loads clamped to the last element (always valid, all in flight),
        // stores only where the element exists.
        T v[kInFlight];
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            v[k] = s[min(i + k * 32, nvec - 1)];
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            if (i + k * 32 < nvec)
                d[i + k * 32] = v[k];
    }
    unsigned done = head + nvec * W, tail = len - done;
    if (lane < tail)
        dst[done + lane] = src[done + lane];
}

// Source and destination misaligned differently: 4-byte stores built from two aligned 4-byte
// source words. Never loads a word that holds no byte of the source range.
__device__ __forceinline__ void warp_copy_shift(char *dst, const char *src, unsigned len,
                                                unsigned lane)
{
    unsigned head = (unsigned)((4 - ((uintptr_t)dst & 3)) & 3);
    if (head > len)
        head = len;
    if (lane < head)
        dst[lane] = src[lane];
    const char *s = src + head;
    unsigned nw = (len - head) / 4;
    unsigned r = (unsigned)((uintptr_t)s & 3); // non-zero here
    const unsigned *sw = reinterpret_cast<const unsigned *>(s - r);
    const unsigned *last =
        reinterpret_cast<const unsigned *>(((uintptr_t)(src + len - 1)) & ~(uintptr_t)3);
    unsigned *dw = reinterpret_cast<unsigned *>(dst + head);
    constexpr unsigned F = kInFlight / 2; // two words per store
#pragma unroll 1
    for (unsigned i = lane; i < nw; i += F * 32) {
        unsigned lo[F], hi[F];
#pragma unroll
        for (unsigned k = 0; k < F; k++) {
            unsigned j = i + k * 32;
            lo[k] = j < nw ? sw[j] : 0u;
            hi[k] = j < nw && sw + j + 1 <= last ? sw[j + 1] : 0u;
        }
#pragma unroll
        for (unsigned k = 0; k < F; k++) {
            unsigned j = i + k * 32;
            if (j < nw)
                dw[j] = __funnelshift_r(lo[k], hi[k], 8 * r);
        }
    }
    unsigned done = head + nw * 4, tail = len - done;
    if (lane < tail)
        dst[done + lane] = src[done + lane];
}

__device__ __forceinline__ void warp_copy_unit(unit_t u, const char *src, unsigned lane)
{
    char *d = reinterpret_cast<char *>(u.dst);
    const char *s = src + (u.off_len & 0xffffffffffffull);
    unsigned len = (unsigned)(u.off_len >> 48) + 1;
    uintptr_t x = (uintptr_t)d ^ (uintptr_t)s;
    if ((x & 15) == 0)
        warp_copy_vec<uint4>(d, s, len, lane);
    else if ((x & 7) == 0)
        warp_copy_vec<uint2>(d, s, len, lane);
    else if ((x & 3) == 0)
        warp_copy_vec<unsigned>(d, s, len, lane);
    else
        warp_copy_shift(d, s, len, lane);
}

// Descriptors in the kernel parameter (constant bank: a warp's lanes read one broadcast).
template <unsigned N>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_inline(const char *src, unsigned n, const inline_units_t<N> units)
{
    unsigned lane = threadIdx.x & 31, warps = gridDim.x * kWarps;
#pragma unroll 1
    for (unsigned i = blockIdx.x * kWarps + threadIdx.x / 32; i < n; i += warps)
        warp_copy_unit(units.u[i], src, lane);
}

// Descriptors uploaded to device memory: each warp loads its next descriptor before copying the
// current unit, so the load's latency hides behind the copy.
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_uploaded(const char *src, unsigned n, const unit_t *units)
{
    unsigned lane = threadIdx.x & 31, warps = gridDim.x * kWarps;
    unsigned i = blockIdx.x * kWarps + threadIdx.x / 32;
    if (i >= n)
        return;
    unit_t cur = units[i];
#pragma unroll 1
    for (; i < n; i += warps) {
        unit_t next = i + warps < n ? units[i + warps] : cur;
        warp_copy_unit(cur, src, lane);
        cur = next;
    }
}

} // namespace

// A pinned descriptor buffer, its device copy, and the event recorded after the kernel that last
// read them.
struct slot_t {
    unit_t *host; // pinned
    unit_t *dev;
    size_t cap; // units in host and dev
    cudaEvent_t done;
    bool pending;
};

struct kvs__scatter {
    int device;
    unsigned grid; // blocks of a full launch
    slot_t slot[2];
    unsigned next; // the slot the next uploaded launch uses
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
    for (int i = 0; i < 2 && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&s->slot[i].done, cudaEventDisableTiming);
    leave_device(s, prev);
    if (e != cudaSuccess) {
        kvs__scatter_destroy(s);
        return cuda_fail(e, "scatter setup");
    }
    unsigned full = (unsigned)sms * kBlocksPerSM;
    s->grid = cfg->max_blocks && cfg->max_blocks < full ? cfg->max_blocks : full;
    *s_p = s;
    return KVS_OK;
}

// Grows a slot to hold `n` units; the slot is idle.
static int ensure_slot(slot_t *sl, size_t n)
{
    if (n <= sl->cap)
        return KVS_OK;
    size_t cap = sl->cap ? sl->cap : 4096;
    while (cap < n)
        cap *= 2;
    cudaFreeHost(sl->host);
    cudaFree(sl->dev);
    sl->host = sl->dev = NULL;
    sl->cap = 0;
    cudaError_t e = cudaMallocHost(reinterpret_cast<void **>(&sl->host), cap * sizeof(unit_t));
    if (e == cudaSuccess)
        e = cudaMalloc(reinterpret_cast<void **>(&sl->dev), cap * sizeof(unit_t));
    if (e != cudaSuccess) {
        cudaFreeHost(sl->host);
        sl->host = sl->dev = NULL;
        return cuda_fail(e, "descriptor buffer allocation");
    }
    sl->cap = cap;
    return KVS_OK;
}

// Splits the fragments into units written to `out` (which holds all of them).
static void build_units(const kvs__scatter_frag_t *frags, uint32_t n, unit_t *out)
{
    uint64_t off = 0;
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = frags[i].len;
        unsigned long long dst = (unsigned long long)(uintptr_t)frags[i].dst;
        for (uint64_t o = 0; dst != 0 && o < len; o += KVS_SCATTER_UNIT_BYTES) {
            uint64_t l = len - o < KVS_SCATTER_UNIT_BYTES ? len - o : KVS_SCATTER_UNIT_BYTES;
            out[k++] = unit_t{dst + o, (unsigned long long)(off + o) | ((l - 1) << 48)};
        }
        off += len;
    }
}

// Blocks for `nunits` units: enough for a warp each, at most the context's grid.
static unsigned blocks_for(const kvs__scatter_t *s, size_t nunits)
{
    size_t b = (nunits + kWarps - 1) / kWarps;
    return b < s->grid ? (unsigned)b : s->grid;
}

template <unsigned N>
static cudaError_t launch_inline(const kvs__scatter_t *s, const char *src,
                                 const kvs__scatter_frag_t *frags, uint32_t n, size_t nunits,
                                 cudaStream_t stream)
{
    inline_units_t<N> p;
    build_units(frags, n, p.u);
    scatter_inline<N><<<blocks_for(s, nunits), kThreads, 0, stream>>>(src, (unsigned)nunits, p);
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
    if (nunits > UINT32_MAX || total >= (1ull << 48))
        return KVS_INVALID_PARAMS; // source offsets travel in 48 bits
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
        // Two buffers in turn; each is rewritten only after the kernel that read it.
        slot_t *sl = &s->slot[s->next];
        s->next ^= 1;
        e = sl->pending ? cudaEventSynchronize(sl->done) : cudaSuccess;
        sl->pending = false;
        if (e != cudaSuccess) {
            rc = cuda_fail(e, "waiting for an earlier scatter");
            goto out;
        }
        rc = ensure_slot(sl, nunits);
        if (rc != KVS_OK)
            goto out;
        build_units(frags, n, sl->host);
        e = cudaMemcpyAsync(sl->dev, sl->host, nunits * sizeof(unit_t), cudaMemcpyHostToDevice,
                            stream);
        if (e == cudaSuccess) {
            scatter_uploaded<<<blocks_for(s, nunits), kThreads, 0, stream>>>(csrc, (unsigned)nunits,
                                                                             sl->dev);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) {
            e = cudaEventRecord(sl->done, stream);
            sl->pending = e == cudaSuccess;
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
        for (int i = 0; i < 2; i++) {
            slot_t *sl = &s->slot[i];
            if (sl->pending)
                cudaEventSynchronize(sl->done);
            if (sl->done != NULL)
                cudaEventDestroy(sl->done);
            cudaFreeHost(sl->host);
            cudaFree(sl->dev);
        }
        leave_device(s, prev);
    }
    kvs__free(s);
}
