// The scatter kernel: one launch copies a contiguous device source into many destination
// fragments. The host splits fragments into work units of at most KVS_SCATTER_UNIT_BYTES,
// described in 16 bytes each; each warp of a persistent grid copies whole units with 16-byte
// loads and stores, eight in flight per lane (4 KiB per warp, 128 KiB per SM) when source and
// destination are equally aligned modulo 16, else four, each store funnel-shifted from two
// aligned source blocks; bytes only for heads and tails. (Plain loads and stores: the streaming
// .cs hints measured 3% slower on a plain copy.) Units travel as a by-value kernel parameter when
// they fit; else the kernel is launched first and reads them from one of two pinned buffers of
// the context through their mapping while the host is still writing them: the host publishes the
// count written so far, and each warp copies a chunk of up to 32 units once they are published
// (one PCIe read each, issued before the previous chunk is copied). Writing every unit before
// the launch kept the GPU idle for the 100-200 us that 65,536 units take to write; uploading
// them with a cudaMemcpyAsync first cost the kernel's start 20 us per MiB of descriptors; reading
// one per unit measured 1.3-1.4x slower at 4-8 KiB units. The host writes units with
// non-temporal stores (scatter_units.c), 1.3-1.7x faster into lines the GPU last read. Each
// buffer is rewritten only after the kernel that last read it. A streamed kernel depends on its
// host to publish, so its wait is bounded in device time and the host can abort it through a
// second mapped word; it reports how it ended in a mapped status ring (progress_t).
#include "scatter.h"
#include "scatter_pages.h"
#include "scatter_units.h"

extern "C" {
#include "../common/common_int.h"
}

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

namespace
{

using unit_t = kvs__scatter_unit_t; // 16 bytes: see scatter_units.h
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
            a[k] = sa[min(i0 + k * 32 + lane, nvec)];
        a[F] = sa[min(i0 + F * 32, nvec)]; // the last lane's right neighbour
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
                d[j] = shifted<Q>(a[k], b, sh);
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

// The published-units word of a streamed launch: the count of units the host has written so far
// (low 31 bits), and kDone once that count is final.
constexpr unsigned kDone = KVS_SCATTER_DONE;
constexpr unsigned kCountMask = KVS_SCATTER_MAX_UNITS;

// Lane l's descriptor of chunk c (2^shift units from unit c << shift, of which the first n
// exist): one coalesced read of the chunk per warp. A plain (cached) read, so the warps of a block,
// whose chunks are neighbours, share one PCIe read per line (see docs/scatter.md, step 9). No line
// can be cached before all its units are written: the host publishes counts in whole 128-byte lines
// (multiples of 8 units) and a warp reads only units below a published count, or below the final
// one.
__device__ __forceinline__ unit_t chunk_unit(const unit_t *units, unsigned n, unsigned c,
                                             unsigned shift, unsigned lane)
{
    unsigned i = (c << shift) + lane;
    return lane < (1u << shift) && i < n ? units[i] : unit_t{0, 0};
}

// Why a streamed kernel stopped before its final count (kvs__scatter_end_t).
constexpr unsigned kEndAborted = KVS_SCATTER_ABORTED;
constexpr unsigned kEndTimedOut = KVS_SCATTER_TIMED_OUT;
// How often grid warp 0 reads the host's words while it copies, so that an abort reaches a
// kernel none of whose warps waits (one PCIe read, about 1 us, per period; kernels shorter than
// this never pay it).
constexpr unsigned long long kRefreshNs = 20000;

// Where a streamed kernel learns how many units the host has published and whether the host
// aborted it. Reads of one host word from many warps are served one at a time, about 1 us each
// (4,224 warps reading it once took 4 ms), so warps read a device-memory mirror of it instead,
// and one waiting warp at a time (the one that takes `lock`) reads the host words and refreshes
// the mirror. A warp that finds the launch aborted or waits past its bound writes `stop`, which
// every warp checks between chunks, so one warp's finding stops them all; it also writes the
// launch's entry of the host's status ring, which the host reads once the stream has passed.
struct progress_t {
    const unsigned *ctl;        // pinned host words: [0] published units (kDone once final),
                                // [1] the number of the launch the host aborted
    unsigned long long *mirror; // device: seq << 32 | a value of ctl[0] seen in launch `seq`
    unsigned *lock;             // device: 1 while a warp reads ctl
    unsigned long long *stop;   // device: seq << 32 | why, once launch `seq` stops early
    unsigned *status;           // pinned host word: (seq mod 2^30) << 2 | why
    unsigned long long wait_ns; // the longest a warp waits for units, from its start
    unsigned seq;               // this launch's number (older values of the words differ)
};

__device__ __forceinline__ unsigned long long device_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Lane 0: why the launch stopped, 0 while it runs.
__device__ __forceinline__ unsigned stopped(const progress_t &p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p.stop) : "memory");
    return (unsigned)(v >> 32) == p.seq ? (unsigned)v : 0u;
}

// Lane 0: stops the launch for every warp and tells the host why. Several warps may find a
// reason at once; any of them is true, so the last store wins.
__device__ void stop_launch(const progress_t &p, unsigned why)
{
    unsigned long long v = (unsigned long long)p.seq << 32 | why;
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p.stop), "l"(v) : "memory");
    unsigned st = (p.seq & 0x3fffffffu) << 2 | why;
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p.status), "r"(st) : "memory");
}

// Lane 0, holding p.lock: reads both host words in one PCIe read, mirrors the published count,
// stops the launch when the host aborted it, and gives the lock back. Returns the published
// word; *why_p receives kEndAborted when the host aborted the launch, else 0.
__device__ unsigned read_host(const progress_t &p, unsigned *why_p)
{
    unsigned long long w;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(w) : "l"(p.ctl) : "memory");
    unsigned v = (unsigned)w;
    *why_p = 0;
    if ((unsigned)(w >> 32) == p.seq) {
        stop_launch(p, kEndAborted);
        *why_p = kEndAborted;
    }
    unsigned long long m = (unsigned long long)p.seq << 32 | v;
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p.mirror), "l"(m) : "memory");
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p.lock), "r"(0u) : "memory");
    return v;
}

// Waits until units [0, end) are published or the count is final, and returns true with the
// word in *word_p (the same in every lane); returns false when the launch stopped instead: the
// host aborted it, or this warp waited past p.wait_ns since its start *t0_p (device time, kept in
// shared memory, as lane 0 alone reads it: registers are short around the copy). The
// acquire reads order the warp's later descriptor reads after the host's writes of the units
// counted (__syncwarp carries lane 0's order to the others). Grid warp 0 reads the host word at
// once; another warp only after two tries found the mirror short and the lock free (all warps
// taking the lock at the start cost 5-10 us of atomics). Between tries the warp sleeps 1 us while
// the mirror is from an earlier launch (the first read of the host word takes about that), else
// about 1 ns per missing unit (the host writes one in 1.5-3 ns), at least 0.5 us.
__device__ bool wait_published(const progress_t &p, unsigned end, unsigned lane, bool first,
                               const unsigned long long *t0_p, unsigned *word_p)
{
    for (unsigned tries = 0;; tries++) {
        unsigned v = 0, why = 0;
        if (lane == 0) {
            unsigned long long m;
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
                         : "=l"(m)
                         : "l"(p.mirror)
                         : "memory");
            v = (unsigned)(m >> 32) == p.seq ? (unsigned)m : 0;
            why = stopped(p);
            if (why == 0 && !(v & kDone) && (v & kCountMask) < end && (first || tries >= 2) &&
                *reinterpret_cast<volatile unsigned *>(p.lock) == 0u &&
                atomicCAS(p.lock, 0u, 1u) == 0u)
                v = read_host(p, &why);
            if (why == 0 && !(v & kDone) && (v & kCountMask) < end &&
                device_ns() - *t0_p > p.wait_ns) {
                stop_launch(p, kEndTimedOut);
                why = kEndTimedOut;
            }
        }
        v = __shfl_sync(0xffffffffu, v, 0);
        why = __shfl_sync(0xffffffffu, why, 0);
        __syncwarp();
        if (why != 0)
            return false;
        if ((v & kDone) || (v & kCountMask) >= end) {
            *word_p = v;
            return true;
        }
        __nanosleep(v == 0 ? 1000u : min(max(end - (v & kCountMask), 500u), 32768u));
    }
}

// Between two chunks: whether the launch has stopped (lane 0's read of p.stop, issued before the
// chunk was copied, so its latency hides behind the copy). Grid warp 0 also reads the host's
// words every kRefreshNs, the only way an abort reaches warps none of which waits.
__device__ __forceinline__ bool stop_seen(const progress_t &p, unsigned why, unsigned lane,
                                          unsigned long long *next_refresh_p)
{
    if (lane == 0 && why == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long now = device_ns();
        if (now >= *next_refresh_p) {
            *next_refresh_p = now + kRefreshNs;
            if (*reinterpret_cast<volatile unsigned *>(p.lock) == 0u &&
                atomicCAS(p.lock, 0u, 1u) == 0u)
                read_host(p, &why);
        }
    }
    return __shfl_sync(0xffffffffu, why, 0) != 0;
}

// Descriptors read straight from pinned host memory while the host is still writing them: the
// kernel is launched first, the host publishes the count of units written every
// KVS_SCATTER_PUBLISH_UNITS, and a warp copies a chunk of 2^shift consecutive units once they are
// all published (or the count is final). A chunk is one PCIe read of up to 512 bytes, kept in
// shared memory while the warp copies it; the next chunk's read is issued before the current chunk
// is copied when it is already published. The kernel stops early, units not yet started left
// uncopied, when the host aborts it or a warp waits past p.wait_ns (progress_t).
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_stream(const char *src, const unit_t *units, const progress_t p, unsigned shift)
{
    __shared__ unit_t chunk[kWarps][32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = gridDim.x * kWarps;
    unsigned c = blockIdx.x * kWarps + warp;
    __shared__ unsigned long long clocks[kWarps][2]; // the warp's start, grid warp 0's next refresh
    if (lane == 0) {
        clocks[warp][0] = device_ns();
        clocks[warp][1] = clocks[warp][0] + kRefreshNs;
    }
    unsigned seen;
    if (!wait_published(p, (c + 1) << shift, lane, c == 0, &clocks[warp][0], &seen))
        return;
    unsigned cnt = seen & kCountMask;
    if ((c << shift) >= cnt)
        return; // the final count ends before this warp's first chunk
    unit_t next = chunk_unit(units, cnt, c, shift, lane);
    unsigned m = min(1u << shift, cnt - (c << shift)); // units in `next`
#pragma unroll 1
    for (;;) {
        __syncwarp();
        chunk[warp][lane] = next;
        __syncwarp();
        const unsigned ncur = m;
        c += warps;
        cnt = seen & kCountMask;
        bool ready = (seen & kDone) ? (c << shift) < cnt : ((c + 1) << shift) <= cnt;
        if (ready) { // prefetch: its latency hides behind the copy below
            next = chunk_unit(units, cnt, c, shift, lane);
            m = min(1u << shift, cnt - (c << shift));
        }
        const unsigned why = lane == 0 ? stopped(p) : 0u; // used after the copy
#pragma unroll 1
        for (unsigned j = 0; j < ncur; j++)
            warp_copy_unit(chunk[warp][j], src, lane);
        if (stop_seen(p, why, lane, &clocks[warp][1]))
            return;
        if (!ready) {
            if (seen & kDone)
                return; // nothing left for this warp
            if (!wait_published(p, (c + 1) << shift, lane, false, &clocks[warp][0], &seen))
                return;
            cnt = seen & kCountMask;
            if ((c << shift) >= cnt)
                return;
            next = chunk_unit(units, cnt, c, shift, lane);
            m = min(1u << shift, cnt - (c << shift));
        }
    }
}

// The page-table form (scatter_pages.h): no host-written units at all. Each warp takes chunks of
// 2^shift consecutive units of keys [a, b) of the plan (in device memory); lane l maps unit l of
// the chunk (its key by binary search in the key table, then its page id, region and slice), and
// the warp copies the chunk's units one after another, each unit's description shuffled from the
// lane that mapped it. Neighbouring lanes read neighbouring page ids, so a chunk's ids are one
// or two cache lines.
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_pages(const char *src, const kvs__pt_plan_t p, unsigned a, unsigned b,
                  unsigned long long u0, unsigned long long u1, unsigned shift)
{
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long warps = (unsigned long long)gridDim.x * kWarps;
    const unsigned long long chunks = ((u1 - u0 - 1) >> shift) + 1;
#pragma unroll 1
    for (unsigned long long c = (unsigned long long)blockIdx.x * kWarps + threadIdx.x / 32;
         c < chunks; c += warps) {
        unsigned long long first = u0 + (c << shift), u = first + lane;
        uint64_t dst = 0, off = 0;
        uint32_t len = 1;
        if (lane < (1u << shift) && u < u1) {
            const kvs__pt_key_t *k = &p.keys[kvs__pt_key_of(&p, a, b, u)];
            kvs__pt_unit(&p, k, u - k->unit_start, &dst, &off, &len);
        }
        unsigned n = (unsigned)min((unsigned long long)(1u << shift), u1 - first);
#pragma unroll 1
        for (unsigned j = 0; j < n; j++) {
            unit_t x;
            x.dst = __shfl_sync(0xffffffffu, dst, (int)j);
            x.off_len = __shfl_sync(0xffffffffu, off | ((uint64_t)(len - 1) << 48), (int)j);
            warp_copy_unit(x, src, lane);
        }
    }
}

// The same, one warp per unit and one block per kWarps units (no persistent loop), so that the
// hardware keeps every SM full of warps as others finish: what a context with a full grid runs.
// Every lane maps the warp's unit (the same addresses: broadcast loads), the key by binary search.
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
    scatter_pages_flat(const char *src, const kvs__pt_plan_t p, unsigned a, unsigned b,
                       unsigned long long u0, unsigned long long u1)
{
    const unsigned lane = threadIdx.x & 31;
    const unsigned long long warps = (unsigned long long)gridDim.x * kWarps;
#pragma unroll 1
    for (unsigned long long u = u0 + (unsigned long long)blockIdx.x * kWarps + threadIdx.x / 32;
         u < u1; u += warps) {
        const kvs__pt_key_t *k = &p.keys[kvs__pt_key_of(&p, a, b, u)];
        uint64_t dst, off;
        uint32_t len;
        kvs__pt_unit(&p, k, u - k->unit_start, &dst, &off, &len);
        warp_copy_unit(unit_t{dst, off | ((uint64_t)(len - 1) << 48)}, src, lane);
    }
}

} // namespace

// A pinned descriptor buffer the kernel reads through its mapping, the words through which the
// host publishes how many of its units are written and aborts the kernel, and the event recorded
// after the kernel that last read them.
struct slot_t {
    unit_t *host;  // pinned, mapped
    unit_t *dev;   // the kernel's pointer to it
    size_t cap;    // units
    unsigned *ctl; // [0] published units (kDone: final), [1] the launch aborted; pinned, mapped,
                   // 8-byte aligned (the kernel reads both at once), their own cache lines
    const unsigned *ctl_dev;
    unsigned long long *mirror; // device memory: the kernel's copy of ctl[0] (progress_t)
    unsigned *lock;
    unsigned long long *stop;
    cudaEvent_t done;
    bool pending;
};

// Layout of the pinned block: both slots' words, 128 bytes apart, then the status ring.
constexpr size_t kCtlBytes = 256;
constexpr size_t kCtlBlockBytes = kCtlBytes + KVS_SCATTER_STATUS_RING * sizeof(unsigned);

struct kvs__scatter {
    int device;
    unsigned grid;         // blocks of a launch: the full grid or the configured bound
    unsigned full_grid;    // kBlocksPerSM blocks per SM
    bool persistent_pages; // page kernel: persistent warps even on the full grid (benchmarks)
    slot_t slot[2];
    unsigned *ctl_block;  // pinned, mapped: both slots' words, 128 bytes apart, zeroed
    unsigned *status;     // in ctl_block: the end of launch seq at [seq % RING]
    unsigned *status_dev; // the kernels' pointer to it
    char *dev_block;      // device memory: both slots' mirrors, locks and stops, zeroed
    unsigned seq;         // the last streamed launch's number (never 0, so an unset abort
                          // word, 0, names no launch)
    unsigned next;        // the slot the next mapped launch uses
    size_t units_hint;    // the most units one call has made: a slot grows to it before launching
    kvs__scatter_stats_t stats;
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
    if (e == cudaSuccess)
        e = cudaHostAlloc(reinterpret_cast<void **>(&s->ctl_block), kCtlBlockBytes,
                          cudaHostAllocMapped);
    if (e == cudaSuccess)
        memset(s->ctl_block, 0, kCtlBlockBytes);
    unsigned *ctl_dev = NULL;
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&ctl_dev), s->ctl_block, 0);
    if (e == cudaSuccess) {
        s->status = s->ctl_block + kCtlBytes / sizeof(unsigned);
        s->status_dev = ctl_dev + kCtlBytes / sizeof(unsigned);
    }
    if (e == cudaSuccess)
        e = cudaMalloc(reinterpret_cast<void **>(&s->dev_block), 512);
    if (e == cudaSuccess)
        e = cudaMemset(s->dev_block, 0, 512);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        s->slot[i].ctl = s->ctl_block + 32 * i;
        s->slot[i].ctl_dev = ctl_dev + 32 * i;
        s->slot[i].mirror = reinterpret_cast<unsigned long long *>(s->dev_block + 256 * i);
        s->slot[i].lock = reinterpret_cast<unsigned *>(s->dev_block + 256 * i + 128);
        s->slot[i].stop = reinterpret_cast<unsigned long long *>(s->dev_block + 256 * i + 192);
    }
    leave_device(s, prev);
    if (e != cudaSuccess) {
        kvs__scatter_destroy(s);
        return cuda_fail(e, "scatter setup");
    }
    unsigned full = (unsigned)sms * kBlocksPerSM;
    s->grid = cfg->max_blocks && cfg->max_blocks < full ? cfg->max_blocks : full;
    s->full_grid = full;
    s->persistent_pages = cfg->persistent_pages;
    *s_p = s;
    return KVS_OK;
}

// Grows an idle slot to hold at least `n` units (its contents are not kept).
static int ensure_slot(slot_t *sl, size_t n)
{
    if (n <= sl->cap)
        return KVS_OK;
    size_t cap = KVS_MAX(2 * sl->cap, (n + 1023) & ~(size_t)1023); // doubling: few regrowths
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
    kvs__scatter_build_units(src, frags, n, p.u, N, &built); // already checked
    uint64_t t = kvs__now_ns();
    scatter_inline<N><<<blocks_for(s, nunits), kThreads, 0, stream>>>(src, (unsigned)nunits, p);
    cudaError_t e = cudaGetLastError();
    s->stats.submit_ns += kvs__now_ns() - t;
    s->stats.units += nunits;
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

// Stores a streamed launch's published word for the kernel to read.
static void publish(unsigned *ctl, size_t v)
{
    __atomic_store_n(ctl, (unsigned)v, __ATOMIC_RELEASE);
}

// Tells the kernel of launch `seq` on slot `sl` to stop (it compares the number with its own, so
// a later launch on the slot is not affected).
static void abort_kernel(slot_t *sl, unsigned seq)
{
    __atomic_store_n(&sl->ctl[1], seq, __ATOMIC_RELEASE);
}

// The record a launch's kernel overwrites when it stops early.
static unsigned status_tag(unsigned seq)
{
    return (seq & 0x3fffffffu) << 2;
}

// The device-time bound of a streamed kernel's wait (kvs__scatter_opts_t.wait_ns).
static uint64_t wait_bound(const kvs__scatter_opts_t *o)
{
    if (o->wait_ns != 0)
        return o->wait_ns;
    if (o->deadline_ns == 0)
        return KVS_SCATTER_WAIT_DEFAULT_NS;
    uint64_t now = kvs__now_ns();
    uint64_t left = o->deadline_ns > now ? o->deadline_ns - now : 0;
    return KVS_MAX(left, (uint64_t)KVS_SCATTER_WAIT_MIN_NS);
}

// Launches the streamed kernel on the next slot, then writes the units into that slot while it
// runs. `known`: the exact unit count when the caller has counted it, else 0 (the slot is sized
// to the fragment count or the most units an earlier call made, and fragments whose units do
// not fit go to one more launch, sized exactly). The kernel is added to *t.
static int launch_mapped(kvs__scatter_t *s, const char *src, const kvs__scatter_frag_t *frags,
                         uint32_t n, size_t known, cudaStream_t stream,
                         const kvs__scatter_opts_t *o, kvs__scatter_ticket_t *tk)
{
    if (tk->n >= 2) // a relaunch is sized exactly, so a call makes two at most
        return KVS_INVALID_PARAMS;
    unsigned slot_no = s->next;
    // Two slots in turn; each is rewritten only after the kernel that read it.
    slot_t *sl = &s->slot[s->next];
    s->next ^= 1;
    cudaError_t e = sl->pending ? cudaEventSynchronize(sl->done) : cudaSuccess;
    sl->pending = false;
    if (e != cudaSuccess)
        return cuda_fail(e, "waiting for an earlier scatter");
    // Sized for the most units an earlier call made; chunks and grid for at least one unit per
    // fragment (a larger estimate would leave warps idle when the units are fewer).
    size_t want = known ? known : (size_t)n;
    int rc = ensure_slot(sl, KVS_MAX(want, s->units_hint));
    if (rc != KVS_OK)
        return rc;
    // Its last reader has finished; the launch below orders these stores before the kernel.
    *sl->ctl = 0;
    if (++s->seq == 0)
        s->seq = 1;
    const unsigned seq = s->seq;
    __atomic_store_n(&s->status[seq % KVS_SCATTER_STATUS_RING], status_tag(seq), __ATOMIC_RELAXED);
    unsigned shift = chunk_shift(s, want);
    uint64_t t = kvs__now_ns();
    progress_t p{sl->ctl_dev,
                 sl->mirror,
                 sl->lock,
                 sl->stop,
                 s->status_dev + seq % KVS_SCATTER_STATUS_RING,
                 wait_bound(o),
                 seq};
    scatter_stream<<<blocks_for(s, ((want - 1) >> shift) + 1), kThreads, 0, stream>>>(src, sl->dev,
                                                                                      p, shift);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return cuda_fail(e, "scatter launch"); // not running: nothing to publish
    tk->seq[tk->n] = seq;
    tk->slot[tk->n++] = (uint8_t)slot_no;
    cudaError_t er = cudaEventRecord(sl->done, stream);
    sl->pending = er == cudaSuccess;
    s->stats.submit_ns += kvs__now_ns() - t;
    // From here the kernel is waiting for units: every path publishes a final count (a held test
    // launch excepted), and a failed one aborts the kernel first.
    kvs__scatter_streamed_t r;
    unsigned held = 0; // a held launch's units are published here, not as they are written
    rc = kvs__scatter_stream_units(src, frags, n, sl->host, sl->cap, o->test_hold ? &held : sl->ctl,
                                   &r);
    if (rc != KVS_OK || er != cudaSuccess)
        abort_kernel(sl, seq);
    if (o->test_hold && rc == KVS_OK && er == cudaSuccess) {
        publish(sl->ctl, KVS_MIN(r.valid_units, (size_t)o->test_publish_units) & ~(size_t)7);
        return KVS_OK;
    }
    publish(sl->ctl, r.valid_units | kDone);
    s->stats.units += r.valid_units;
    s->units_hint = KVS_MAX(s->units_hint, r.units);
    if (er != cudaSuccess) { // the slot's next user could not wait for this kernel
        cudaStreamSynchronize(stream);
        return cuda_fail(er, "cudaEventRecord");
    }
    if (rc != KVS_OK || r.frags == n)
        return rc;
    size_t more; // the fragments that did not fit: counted, then launched on the other slot
    rc = kvs__scatter_build_units(src + r.off, frags + r.frags, n - r.frags, NULL, 0, &more);
    if (rc != KVS_OK || more == 0)
        return rc;
    s->units_hint = KVS_MAX(s->units_hint, r.units + more);
    return launch_mapped(s, src + r.off, frags + r.frags, n - r.frags, more, stream, o, tk);
}

extern "C" int kvs__scatter_launch(kvs__scatter_t *s, const void *src,
                                   const kvs__scatter_frag_t *frags, uint32_t n, void *stream)
{
    return kvs__scatter_launch_opts(s, src, frags, n, stream, NULL, NULL);
}

extern "C" int kvs__scatter_launch_opts(kvs__scatter_t *s, const void *src,
                                        const kvs__scatter_frag_t *frags, uint32_t n, void *stream_,
                                        const kvs__scatter_opts_t *opts,
                                        kvs__scatter_ticket_t *ticket_p)
{
    kvs__scatter_ticket_t scratch_ticket;
    kvs__scatter_ticket_t *t = ticket_p != NULL ? ticket_p : &scratch_ticket;
    *t = kvs__scatter_ticket_t{0, {0, 0}, {0, 0}};
    const kvs__scatter_opts_t defaults{0, 0, false, 0};
    const kvs__scatter_opts_t *o = opts != NULL ? opts : &defaults;
    if (s == NULL || src == NULL || (frags == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    uint64_t t0 = kvs__now_ns();
    s->stats = kvs__scatter_stats_t{0, 0, 0};
    cudaStream_t stream = static_cast<cudaStream_t>(stream_);
    const char *csrc = static_cast<const char *>(src);
    int prev;
    int rc = enter_device(s, &prev);
    if (rc != KVS_OK)
        return rc;
    size_t nunits = 0;
    if (o->test_hold) { // the streamed kernel, sized exactly, whatever the count
        rc = kvs__scatter_build_units(csrc, frags, n, NULL, 0, &nunits);
        if (rc == KVS_OK && nunits != 0)
            rc = launch_mapped(s, csrc, frags, n, nunits, stream, o, t);
    } else if (n > kLargeUnits) { // checked while written
        rc = launch_mapped(s, csrc, frags, n, 0, stream, o, t);
    } else if ((rc = kvs__scatter_build_units(csrc, frags, n, NULL, 0, &nunits)) != KVS_OK ||
               nunits == 0) {
        // bad arguments, or nothing to copy
    } else if (nunits <= kLargeUnits) {
        rc = nunits <= kSmallUnits ? launch_inline<kSmallUnits>(s, csrc, frags, n, nunits, stream)
                                   : launch_inline<kLargeUnits>(s, csrc, frags, n, nunits, stream);
    } else {
        rc = launch_mapped(s, csrc, frags, n, nunits, stream, o, t);
    }
    leave_device(s, prev);
    if (rc == KVS_OK && s->stats.units != 0)
        s->stats.prepare_ns = kvs__now_ns() - t0 - s->stats.submit_ns;
    else
        s->stats = kvs__scatter_stats_t{0, 0, 0};
    return rc;
}

extern "C" int kvs__scatter_pages_launch(kvs__scatter_t *s, const void *src,
                                         const kvs__pt_plan_t *plan, uint32_t a, uint32_t b,
                                         uint64_t first_unit, uint64_t end_unit, void *stream_)
{
    if (s == NULL || src == NULL || plan == NULL || a >= b || b > plan->nkeys ||
        end_unit <= first_unit || plan->nslices == 0)
        return KVS_INVALID_PARAMS;
    uint64_t t0 = kvs__now_ns();
    s->stats = kvs__scatter_stats_t{0, 0, 0};
    int prev;
    int rc = enter_device(s, &prev);
    if (rc != KVS_OK)
        return rc;
    uint64_t units = end_unit - first_unit;
    unsigned shift = chunk_shift(s, units);
    uint64_t t = kvs__now_ns();
    cudaStream_t stream = static_cast<cudaStream_t>(stream_);
    const char *csrc = static_cast<const char *>(src);
    if (s->grid == s->full_grid && !s->persistent_pages) // a warp per unit, at most 2^31 blocks
        scatter_pages_flat<<<(unsigned)KVS_MIN((units + kWarps - 1) / kWarps, (uint64_t)INT32_MAX),
                             kThreads, 0, stream>>>(csrc, *plan, a, b, first_unit, end_unit);
    else // a bounded grid (beside model compute): persistent warps
        scatter_pages<<<blocks_for(s, ((units - 1) >> shift) + 1), kThreads, 0, stream>>>(
            csrc, *plan, a, b, first_unit, end_unit, shift);
    cudaError_t e = cudaGetLastError();
    s->stats = kvs__scatter_stats_t{t - t0, kvs__now_ns() - t, units};
    leave_device(s, prev);
    return e == cudaSuccess ? KVS_OK : cuda_fail(e, "page scatter launch");
}

extern "C" int kvs__scatter_abort(kvs__scatter_t *s, const kvs__scatter_ticket_t *t)
{
    if (s == NULL || t == NULL || t->n > 2)
        return KVS_INVALID_PARAMS;
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->slot[i] > 1)
            return KVS_INVALID_PARAMS;
        abort_kernel(&s->slot[t->slot[i]], t->seq[i]);
    }
    return KVS_OK;
}

extern "C" kvs__scatter_end_t kvs__scatter_result(const kvs__scatter_t *s,
                                                  const kvs__scatter_ticket_t *t)
{
    if (s == NULL || t == NULL || t->n > 2)
        return KVS_SCATTER_UNKNOWN;
    unsigned worst = KVS_SCATTER_COMPLETE;
    for (uint32_t i = 0; i < t->n; i++) {
        unsigned v =
            __atomic_load_n(&s->status[t->seq[i] % KVS_SCATTER_STATUS_RING], __ATOMIC_ACQUIRE);
        if ((v & ~3u) != status_tag(t->seq[i]))
            return KVS_SCATTER_UNKNOWN; // a later launch took the entry
        worst = KVS_MAX(worst, v & 3u);
    }
    return static_cast<kvs__scatter_end_t>(worst);
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
        cudaFreeHost(s->ctl_block);
        cudaFree(s->dev_block);
        leave_device(s, prev);
    }
    kvs__free(s);
}
