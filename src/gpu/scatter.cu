// The scatter kernel: one launch copies a contiguous device source into many destination
// fragments. The host splits fragments into work units of at most KVS_SCATTER_UNIT_BYTES,
// described in 16 bytes each; each warp of a persistent grid copies whole units with 16-byte
// streaming loads and stores, eight in flight per lane (4 KiB per warp, 128 KiB per SM) when
// source and destination are equally aligned modulo 16, else four, each store funnel-shifted
// from two aligned source blocks; bytes only for heads and tails. Units travel as a by-value
// kernel parameter when they fit, else they are written to one of two pinned buffers of the
// context that the kernel reads through their mapping, a chunk of up to 32 units per warp and
// read (one PCIe read each, issued before the previous chunk is copied). Uploading them with a
// cudaMemcpyAsync first cost the kernel's start 20 us per MiB of descriptors; reading one per
// unit measured 1.3-1.4x slower at 4-8 KiB units. Each buffer is rewritten only after the kernel
// that last read it.
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
            v[k] = __ldcs(sp + k * 32); // streaming: neither side is read again
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            __stcs(dp + k * 32, v[k]);
    }
    if (i < nvec) {
        // The last round: loads clamped to the last element (always valid, all in flight),
        // stores only where the element exists.
        T v[kInFlight];
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            v[k] = __ldcs(s + min(i + k * 32, nvec - 1));
#pragma unroll
        for (unsigned k = 0; k < kInFlight; k++)
            if (i + k * 32 < nvec)
                __stcs(d + i + k * 32, v[k]);
    }
    unsigned done = head + nvec * W, tail = len - done;
    if (lane < tail)
        dst[done + lane] = src[done + lane];
}

// Bytes [r, r + 16) of the 32 bytes a:b, r = 4 * Q + sh / 8 (little-endian funnel shifts).
template <unsigned Q> __device__ __forceinline__ uint4 shifted(uint4 a, uint4 b, unsigned sh)
{
    const unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    return make_uint4(__funnelshift_r(w[Q], w[Q + 1], sh), __funnelshift_r(w[Q + 1], w[Q + 2], sh),
                      __funnelshift_r(w[Q + 2], w[Q + 3], sh),
                      __funnelshift_r(w[Q + 3], w[Q + 4], sh));
}

// Source and destination misaligned differently (modulo 16): after a byte head that aligns the
// destination, every 16-byte store combines two aligned 16-byte source blocks, the lane's own
// and its right neighbour's (by shuffle; the warp's last lane takes the next round's first
// block), so each block is loaded once. Only blocks that lie wholly inside the source range
// are loaded (whatever lies before the source start in its aligned block is never used); the
// last bytes, fewer than 32, go one per lane. Q: the source's offset in its block, in words.
template <unsigned Q>
__device__ __forceinline__ void warp_copy_shifted(char *dst, const char *src, unsigned len,
                                                  unsigned lane)
{
    unsigned head = (unsigned)((16 - ((uintptr_t)dst & 15)) & 15);
    if (head > len)
        head = len;
    if (lane < head)
        dst[lane] = src[lane];
    const char *s = src + head;
    const uint4 *sa = reinterpret_cast<const uint4 *>((uintptr_t)s & ~(uintptr_t)15);
    const unsigned sh = 8u * (unsigned)((uintptr_t)s & 3);
    // Blocks sa[0..nvec] are read; sa[nvec] must end inside the source.
    unsigned span = (unsigned)((src + len) - reinterpret_cast<const char *>(sa));
    unsigned nvec = span >= 32 ? span / 16 - 1 : 0;
    uint4 *d = reinterpret_cast<uint4 *>(dst + head);
    constexpr unsigned F = kInFlight / 2;
#pragma unroll 1
    for (unsigned i0 = 0; i0 < nvec; i0 += F * 32) {
        uint4 a[F + 1];
#pragma unroll
        for (unsigned k = 0; k < F; k++)
            a[k] = __ldcs(sa + min(i0 + k * 32 + lane, nvec));
        a[F] = __ldcs(sa + min(i0 + F * 32, nvec)); // the last lane's right neighbour
#pragma unroll
        for (unsigned k = 0; k < F; k++) {
            uint4 give = lane == 0 ? a[k + 1] : a[k], b;
            unsigned from = (lane + 1) & 31;
            b.x = __shfl_sync(0xffffffffu, give.x, (int)from);
            b.y = __shfl_sync(0xffffffffu, give.y, (int)from);
            b.z = __shfl_sync(0xffffffffu, give.z, (int)from);
            b.w = __shfl_sync(0xffffffffu, give.w, (int)from);
            unsigned j = i0 + k * 32 + lane;
            if (j < nvec)
                __stcs(d + j, shifted<Q>(a[k], b, sh));
        }
    }
    unsigned done = head + 16 * nvec, tail = len - done;
    if (lane < tail)
        dst[done + lane] = src[done + lane];
}

__device__ __forceinline__ void warp_copy_unit(unit_t u, const char *src, unsigned lane)
{
    char *d = reinterpret_cast<char *>(u.dst);
    const char *s = src + (u.off_len & 0xffffffffffffull);
    unsigned len = (unsigned)(u.off_len >> 48) + 1;
    // The source's offset in its 16-byte block once the destination is aligned.
    unsigned r = (unsigned)((uintptr_t)s - (uintptr_t)d) & 15;
    switch (r >> 2) {
    case 0:
        if (r == 0)
            warp_copy_vec<uint4>(d, s, len, lane);
        else
            warp_copy_shifted<0>(d, s, len, lane);
        break;
    case 1:
        warp_copy_shifted<1>(d, s, len, lane);
        break;
    case 2:
        warp_copy_shifted<2>(d, s, len, lane);
        break;
    default:
        warp_copy_shifted<3>(d, s, len, lane);
        break;
    }
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

// Lane l's descriptor of chunk c (2^shift units from unit c << shift): one coalesced read of
// the chunk per warp.
__device__ __forceinline__ unit_t chunk_unit(const unit_t *units, unsigned n, unsigned c,
                                             unsigned shift, unsigned lane)
{
    unsigned i = (c << shift) + lane;
    return lane < (1u << shift) && i < n ? units[i] : unit_t{0, 0};
}

// Descriptors read straight from pinned host memory, a chunk of 2^shift consecutive units per
// warp and read (one PCIe read of up to 512 bytes, not one per unit), kept in shared memory
// while the warp copies them. The next chunk's read is issued before the current chunk is
// copied, so its latency hides behind the copy.
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_mapped(const char *src, unsigned n, const unit_t *units, unsigned shift)
{
    __shared__ unit_t chunk[kWarps][32];
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = gridDim.x * kWarps;
    unsigned nchunks = ((n - 1) >> shift) + 1;
    unsigned c = blockIdx.x * kWarps + warp;
    if (c >= nchunks)
        return;
    unit_t next = chunk_unit(units, n, c, shift, lane);
#pragma unroll 1
    for (; c < nchunks; c += warps) {
        __syncwarp();
        chunk[warp][lane] = next;
        __syncwarp();
        if (c + warps < nchunks)
            next = chunk_unit(units, n, c + warps, shift, lane);
        unsigned base = c << shift, cnt = min(1u << shift, n - base);
#pragma unroll 1
        for (unsigned j = 0; j < cnt; j++)
            warp_copy_unit(chunk[warp][j], src, lane);
    }
}

} // namespace

// A pinned descriptor buffer the kernel reads through its mapping, and the event recorded after
// the kernel that last read it.
struct slot_t {
    unit_t *host; // pinned, mapped
    unit_t *dev;  // the kernel's pointer to it
    size_t cap;   // units
    cudaEvent_t done;
    bool pending;
};

struct kvs__scatter {
    int device;
    unsigned grid; // blocks of a full launch
    slot_t slot[2];
    unsigned next; // the slot the next mapped launch uses
    kvs__scatter_stats_t stats;
    uint64_t prepared_at; // when the current call's units were built
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

// Grows an idle slot to hold at least `n` units (its contents are not kept).
static int ensure_slot(slot_t *sl, size_t n)
{
    if (n <= sl->cap)
        return KVS_OK;
    size_t cap = sl->cap ? sl->cap : 4096;
    while (cap < n)
        cap *= 2;
    cudaFreeHost(sl->host);
    sl->host = sl->dev = NULL;
    sl->cap = 0;
    cudaError_t e = cudaHostAlloc(reinterpret_cast<void **>(&sl->host), cap * sizeof(unit_t),
                                  cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&sl->dev), sl->host, 0);
    if (e != cudaSuccess) {
        cudaFreeHost(sl->host);
        sl->host = sl->dev = NULL;
        return cuda_fail(e, "descriptor buffer allocation");
    }
    sl->cap = cap;
    return KVS_OK;
}

// Checks the fragments and splits them into units, written to `out` while they fit in `cap`
// (pass cap 0 to count only). *nunits_p receives the number of units. The common fragment, one
// unit long, costs no check: 2^32 of them cannot wrap the 64-bit offset.
static int build_units(const void *src, const kvs__scatter_frag_t *frags, uint32_t n, unit_t *out,
                       size_t cap, size_t *nunits_p)
{
    uint64_t off = 0;
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = frags[i].len;
        unsigned long long dst = (unsigned long long)(uintptr_t)frags[i].dst;
        if (len - 1 < KVS_SCATTER_UNIT_BYTES && dst != 0) {
            if (k < cap)
                out[k] = unit_t{dst, (unsigned long long)off | ((len - 1) << 48)};
            k++;
            off += len;
            continue;
        }
        if (len > UINT64_MAX - off || off + len >= (1ull << 48))
            return KVS_INVALID_PARAMS; // source offsets travel in 48 bits
        if (dst != 0) { // split into units, written only when all fit (else only counted)
            uint64_t units = (len + KVS_SCATTER_UNIT_BYTES - 1) / KVS_SCATTER_UNIT_BYTES;
            if (k > UINT32_MAX || units > UINT32_MAX - k)
                return KVS_INVALID_PARAMS;
            for (uint64_t o = 0; k + units <= cap && o < len; o += KVS_SCATTER_UNIT_BYTES) {
                uint64_t l = len - o < KVS_SCATTER_UNIT_BYTES ? len - o : KVS_SCATTER_UNIT_BYTES;
                out[k + o / KVS_SCATTER_UNIT_BYTES] =
                    unit_t{dst + o, (unsigned long long)(off + o) | ((l - 1) << 48)};
            }
            k += units;
        }
        off += len;
    }
    // Offsets only grow, so the last one bounds them all.
    if (k > UINT32_MAX || off >= (1ull << 48) || (uintptr_t)src > UINTPTR_MAX - off)
        return KVS_INVALID_PARAMS; // source offsets travel in 48 bits
    *nunits_p = k;
    return KVS_OK;
}

// Blocks for `warps_wanted` busy warps, at most the context's grid.
static unsigned blocks_for(const kvs__scatter_t *s, size_t warps_wanted)
{
    size_t b = (warps_wanted + kWarps - 1) / kWarps;
    return b < s->grid ? (unsigned)b : s->grid;
}

template <unsigned N>
static int launch_inline(kvs__scatter_t *s, const char *src, const kvs__scatter_frag_t *frags,
                         uint32_t n, size_t nunits, cudaStream_t stream)
{
    inline_units_t<N> p;
    size_t built;
    build_units(src, frags, n, p.u, N, &built); // already checked
    s->prepared_at = kvs__now_ns();
    scatter_inline<N><<<blocks_for(s, nunits), kThreads, 0, stream>>>(src, (unsigned)nunits, p);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KVS_OK : cuda_fail(e, "scatter launch");
}

// Units per chunk of the mapped kernel (log2): about a quarter of each warp's share, so chunks
// still balance across warps, at most 32 (a warp's lanes).
static unsigned chunk_shift(const kvs__scatter_t *s, size_t nunits)
{
    size_t per_warp = nunits / ((size_t)s->grid * kWarps);
    unsigned shift = 0;
    while (shift < 5 && ((size_t)4 << shift) <= per_warp)
        shift++;
    return shift;
}

// Builds the units into a slot and launches the mapped kernel.
static int launch_mapped(kvs__scatter_t *s, const char *src, const kvs__scatter_frag_t *frags,
                         uint32_t n, cudaStream_t stream)
{
    // Two slots in turn; each is rewritten only after the kernel that read it.
    slot_t *sl = &s->slot[s->next];
    s->next ^= 1;
    cudaError_t e = sl->pending ? cudaEventSynchronize(sl->done) : cudaSuccess;
    sl->pending = false;
    if (e != cudaSuccess)
        return cuda_fail(e, "waiting for an earlier scatter");
    size_t nunits;
    int rc = build_units(src, frags, n, sl->host, sl->cap, &nunits);
    if (rc == KVS_OK && nunits > sl->cap) { // grown once, then built again
        rc = ensure_slot(sl, nunits);
        if (rc == KVS_OK)
            rc = build_units(src, frags, n, sl->host, sl->cap, &nunits);
    }
    if (rc != KVS_OK || nunits == 0)
        return rc;
    s->prepared_at = kvs__now_ns();
    unsigned shift = chunk_shift(s, nunits);
    size_t chunks = ((nunits - 1) >> shift) + 1;
    scatter_mapped<<<blocks_for(s, chunks), kThreads, 0, stream>>>(src, (unsigned)nunits, sl->dev,
                                                                   shift);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaEventRecord(sl->done, stream);
    sl->pending = e == cudaSuccess;
    s->stats.units = nunits;
    return e == cudaSuccess ? KVS_OK : cuda_fail(e, "scatter launch");
}

extern "C" int kvs__scatter_launch(kvs__scatter_t *s, const void *src,
                                   const kvs__scatter_frag_t *frags, uint32_t n, void *stream_)
{
    if (s == NULL || src == NULL || (frags == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    uint64_t t0 = kvs__now_ns();
    s->stats = kvs__scatter_stats_t{0, 0, 0};
    s->prepared_at = 0;
    cudaStream_t stream = static_cast<cudaStream_t>(stream_);
    const char *csrc = static_cast<const char *>(src);
    int prev;
    int rc = enter_device(s, &prev);
    if (rc != KVS_OK)
        return rc;
    size_t nunits = 0;
    if (n > kLargeUnits) { // checked while built
        rc = launch_mapped(s, csrc, frags, n, stream);
    } else if ((rc = build_units(csrc, frags, n, NULL, 0, &nunits)) != KVS_OK || nunits == 0) {
        // bad arguments, or nothing to copy
    } else if (nunits <= kLargeUnits) {
        rc = nunits <= kSmallUnits ? launch_inline<kSmallUnits>(s, csrc, frags, n, nunits, stream)
                                   : launch_inline<kLargeUnits>(s, csrc, frags, n, nunits, stream);
        s->stats.units = nunits;
    } else {
        rc = launch_mapped(s, csrc, frags, n, stream);
    }
    leave_device(s, prev);
    if (rc == KVS_OK && s->prepared_at != 0) {
        s->stats.prepare_ns = s->prepared_at - t0;
        s->stats.submit_ns = kvs__now_ns() - s->prepared_at;
    }
    return rc;
}

extern "C" void kvs__scatter_stats(const kvs__scatter_t *s, kvs__scatter_stats_t *out)
{
    if (s != NULL && out != NULL)
        *out = s->stats;
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
        }
        leave_device(s, prev);
    }
    kvs__free(s);
}
