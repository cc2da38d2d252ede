// `kvstash bench scatter`: one contiguous device buffer scattered to randomly placed device
// destinations, by five methods: the kvstash kernel, cudaMemcpyBatchAsync, one cudaMemcpyAsync
// per fragment, CUB's DeviceMemcpy::Batched (here only, never in the library) and one
// contiguous copy of the same bytes (the limit). Host wall time covers building the method's
// descriptors, uploading them, submitting and waiting. GPU time is the method's work on the GPU
// alone: the submission is queued behind a gate kernel that the host opens once everything is
// enqueued, and events time the queued work (uploads included, host preparation excluded; the
// page-table methods' GPU time is their kernel's, their plan upload being in the wall time). The
// per-fragment APIs enqueue too much to wait behind a gate; their GPU time runs from submission.
// Medians after warm-up, methods in rotating order, every result verified on the GPU against the
// source (the destinations are cleared before each call). Placement of the fragments in the
// destination pool is a parameter: shuffled (paged KV caches), in order, or shuffled only within
// windows of a given size, to tell the cost of scattered destinations from the kernel's own.
#include <cub/device/device_memcpy.cuh>
#include <cuda_runtime.h>

extern "C" {
#include "common/common_int.h"
#include "gpu/scatter.h"
#include "gpu/scatter_pages.h"
#include "tools/cli_int.h"
}

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace
{

#define BENCH_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "bench scatter: %s: %s\n", #call, cudaGetErrorString(e_));        \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

struct frag_t {
    char *dst;
    uint64_t src_off;
    uint64_t len;
};

// The kernel also runs on a bounded grid (8, 16, 32 blocks), as it would beside model compute.
// The page-table form (M_PAGES) runs on sets of equal pages whose places are page ids: the
// kernel reads 4-byte ids from a plan the host builds and uploads within the call.
enum method_t {
    M_KERNEL,
    M_BATCH,
    M_PER_FRAG,
    M_CUB,
    M_CONTIG,
    M_K8,
    M_K16,
    M_K32,
    M_PAGES,
    M_PAGES_P,
    M_REF,
    M_COUNT
};
const char *const kMethodNames[M_COUNT] = {"kvstash",
                                           "cudaMemcpyBatchAsync",
                                           "cudaMemcpyAsync/frag",
                                           "cub::Batched",
                                           "contiguous",
                                           "kvstash/8 blocks",
                                           "kvstash/16 blocks",
                                           "kvstash/32 blocks",
                                           "kvstash/page table",
                                           "page table/persist",
                                           "reference copy"};
const char *const kMethodKeys[M_COUNT] = {
    "kvstash", "batch", "per-frag",         "cub",      "contiguous", "bounded", "bounded",
    "bounded", "pages", "pages-persistent", "reference"};
// Bytes per key in the page-table form (a key is a unit of the plan, as a stored object is).
constexpr uint64_t kPageKeyBytes = 1u << 20;
const uint32_t kBounded[3] = {8, 16, 32};

// Methods that enqueue a handful of operations can wait behind a gate (see the top).
bool gateable(method_t m)
{
    return m != M_BATCH && m != M_PER_FRAG;
}

// The gate: a host function in the stream that returns once the host opens it (state 1), or
// gives up after two seconds (state 2, reported as an error).
void CUDART_CB gate_fn(void *arg)
{
    std::atomic<int> *state = static_cast<std::atomic<int> *>(arg);
    uint64_t t0 = kvs__now_ns();
    while (state->load(std::memory_order_acquire) == 0) {
        int closed = 0;
        if (kvs__now_ns() - t0 > 2000000000ull && state->compare_exchange_strong(closed, 2))
            return;
    }
}

// Counts bytes of each piece that differ from the source (one block per piece).
__global__ void verify_kernel(const char *src, const frag_t *frags, unsigned n,
                              unsigned long long *bad)
{
    for (unsigned f = blockIdx.x; f < n; f += gridDim.x) {
        const frag_t fr = frags[f];
        unsigned long long local = 0;
        for (uint64_t i = threadIdx.x; i < fr.len; i += blockDim.x)
            local += fr.dst[i] != src[fr.src_off + i];
        if (local)
            atomicAdd(bad, local);
    }
}

struct set_t {
    std::string name;
    std::vector<frag_t> frags;
    std::vector<kvs__scatter_frag_t> kfr; // the same, as kvstash's callers hand them over
    uint64_t bytes;
    std::vector<frag_t> checks; // the fragments, then the contiguous copy, in pieces to verify
    size_t contig_checks;       // where the contiguous copy's pieces start
    // Page-table form: equal fragments at multiples of their length (no gaps), as page ids,
    // in keys of kPageKeyBytes.
    bool paged;
    uint64_t page_bytes;
    std::vector<uint32_t> ids;
    std::vector<kvs__pt_pages_t> keys;
    std::vector<uint64_t> key_off;
};

// Splits [dst, dst + len) <- src_off.. into pieces a verify block each (64 KiB at most).
void add_checks(std::vector<frag_t> &out, char *dst, uint64_t src_off, uint64_t len)
{
    for (uint64_t o = 0; o < len; o += 65536)
        out.push_back(frag_t{dst + o, src_off + o, std::min<uint64_t>(65536, len - o)});
}

// How fragments are placed in the destination pool: `window` 0 shuffles them over the whole pool,
// UINT64_MAX keeps them in source order, anything else shuffles them only among the fragments
// that start within the same `window`-byte stretch of the source.
struct placement_t {
    std::string name;
    uint64_t window;
};

bool parse_placement(const std::string &a, placement_t *p)
{
    if (a == "shuffled" || a == "ordered") {
        *p = placement_t{a, a == "ordered" ? UINT64_MAX : 0};
        return true;
    }
    uint64_t w = 0;
    if (a.compare(0, 7, "window:") != 0 || kvs__parse_size(a.c_str() + 7, &w) != KVS_OK || w == 0)
        return false;
    *p = placement_t{a, w};
    return true;
}

// Lays out fragments of `total` bytes in the pool as `pl` says (with gaps of 1..15 bytes for the
// odd set).
set_t make_set(const std::string &name, uint64_t total, const placement_t &pl, char *pool,
               std::mt19937_64 &rng)
{
    set_t s{name, {}, {}, 0, {}, 0, false, 0, {}, {}, {}};
    std::vector<uint64_t> lens;
    static const uint64_t mixed[] = {4096, 8192, 16384, 65536, 262144, 1u << 20};
    bool odd = name == "odd", mix = name == "mixed";
    uint64_t fixed = 0;
    if (!odd && !mix)
        kvs__parse_size(name.c_str(), &fixed);
    uint64_t sum = 0;
    for (;;) {
        uint64_t l = odd ? 1 + 2 * (rng() % 10000) : mix ? mixed[rng() % 6] : fixed;
        if (sum + l > total)
            break;
        lens.push_back(l);
        sum += l;
    }
    std::vector<size_t> order(lens.size());
    for (size_t i = 0; i < order.size(); i++)
        order[i] = i;
    if (pl.window == 0) {
        std::shuffle(order.begin(), order.end(), rng);
    } else if (pl.window != UINT64_MAX) {
        uint64_t at = 0;
        for (size_t b = 0, e = 0; b < order.size(); b = e) {
            uint64_t stretch = at / pl.window;
            for (e = b; e < order.size() && at / pl.window == stretch; e++)
                at += lens[e];
            std::shuffle(order.begin() + (ptrdiff_t)b, order.begin() + (ptrdiff_t)e, rng);
        }
    }
    std::vector<uint64_t> pos(lens.size());
    uint64_t p = odd ? 1 + rng() % 15 : 0;
    for (size_t k = 0; k < order.size(); k++) {
        pos[order[k]] = p;
        p += lens[order[k]] + (odd ? 1 + rng() % 15 : 0);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < lens.size(); i++) {
        s.frags.push_back(frag_t{pool + pos[i], off, lens[i]});
        s.kfr.push_back(kvs__scatter_frag_t{pool + pos[i], lens[i]});
        off += lens[i];
    }
    s.bytes = sum;
    for (const frag_t &f : s.frags)
        add_checks(s.checks, f.dst, f.src_off, f.len);
    s.contig_checks = s.checks.size();
    add_checks(s.checks, pool, 0, sum);
    s.paged = fixed != 0 && fixed <= UINT32_MAX && !odd && !mix;
    if (s.paged) {
        s.page_bytes = fixed;
        for (size_t i = 0; i < lens.size(); i++)
            s.ids.push_back((uint32_t)(pos[i] / fixed));
        uint64_t per_key = std::max<uint64_t>(1, kPageKeyBytes / fixed);
        for (size_t i = 0; i < s.ids.size(); i += per_key) {
            uint64_t np = std::min<uint64_t>(per_key, s.ids.size() - i);
            s.keys.push_back(kvs__pt_pages_t{&s.ids[i], np});
            s.key_off.push_back(i * fixed);
        }
    }
    return s;
}

struct ctx_t {
    cudaStream_t stream;
    kvs__scatter_t *scatter;
    kvs__scatter_t *bounded[3]; // max_blocks 8, 16, 32
    kvs__scatter_t *persist;    // the page kernel's persistent warps on the full grid
    uint32_t *d_ids;            // the reference copy's page ids of the current set
    char *src;
    char *pool;
    uint64_t pool_len;
    // CUB
    void **d_srcs, **d_dsts;
    size_t *d_sizes;
    void **h_srcs, **h_dsts; // pinned
    size_t *h_sizes;
    void *cub_tmp;
    size_t cub_tmp_len;
    size_t cub_cap;
    // page-table plans: built in pinned memory, uploaded within the call
    char *h_plan, *d_plan;
    size_t plan_cap;
    uint64_t plan_ns; // host time building the last plan
    // verification
    frag_t *d_frags;
    unsigned long long *d_bad;
    std::atomic<int> gate;
};

// The reference copy: a warp per page, eight 16-byte loads in flight per lane, page i of the
// source to page ids[i] of the pool (pages a multiple of 16 bytes, sources in page order, as the
// paged sets are). What the page copy alone costs, without a plan or the library's kernels.
__global__ void __launch_bounds__(256, 4)
    reference_copy(char *pool, const char *src, const uint32_t *ids, unsigned page, unsigned n)
{
    unsigned lane = threadIdx.x & 31;
    unsigned long long u = (unsigned long long)blockIdx.x * 8 + threadIdx.x / 32;
    if (u >= n)
        return;
    const uint4 *sp = reinterpret_cast<const uint4 *>(src + u * page);
    uint4 *dp = reinterpret_cast<uint4 *>(pool + (size_t)ids[u] * page);
    unsigned nvec = page / 16;
    for (unsigned i = lane; i < nvec; i += 8 * 32) {
        uint4 v[8];
#pragma unroll
        for (unsigned k = 0; k < 8; k++)
            if (i + k * 32 < nvec)
                v[k] = sp[i + k * 32];
#pragma unroll
        for (unsigned k = 0; k < 8; k++)
            if (i + k * 32 < nvec)
                dp[i + k * 32] = v[k];
    }
}

bool is_pages(method_t m)
{
    return m == M_PAGES || m == M_PAGES_P;
}

// The context a page-table method launches on.
kvs__scatter_t *page_ctx(const ctx_t &c, method_t m)
{
    return m == M_PAGES_P ? c.persist : c.scatter;
}

// Enqueues method m on the set; `start` is recorded where its GPU time begins: before its work,
// or for the page methods after the plan's upload (a staged read uploads it during its first
// fill), so that their GPU time is the kernel's.
void run_method(ctx_t &c, method_t m, const set_t &s, std::vector<void *> &dsts,
                std::vector<const void *> &srcs, std::vector<size_t> &sizes, cudaEvent_t start)
{
    if (!is_pages(m))
        BENCH_CUDA(cudaEventRecord(start, c.stream));
    const size_t n = s.frags.size();
    switch (m) {
    case M_KERNEL:
    case M_K8:
    case M_K16:
    case M_K32: {
        kvs__scatter_t *ctx = m == M_KERNEL ? c.scatter : c.bounded[m - M_K8];
        int rc = kvs__scatter_launch(ctx, c.src, s.kfr.data(), (uint32_t)n, c.stream);
        if (rc != KVS_OK) {
            std::fprintf(stderr, "bench scatter: kvstash launch: %s\n", kvs_status_str(rc));
            std::exit(1);
        }
        break;
    }
    case M_BATCH: {
        dsts.resize(n);
        srcs.resize(n);
        sizes.resize(n);
        for (size_t i = 0; i < n; i++) {
            dsts[i] = s.frags[i].dst;
            srcs[i] = c.src + s.frags[i].src_off;
            sizes[i] = s.frags[i].len;
        }
        cudaMemcpyAttributes attr;
        std::memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.srcLocHint.type = cudaMemLocationTypeDevice;
        attr.dstLocHint.type = cudaMemLocationTypeDevice;
        size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
        BENCH_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr, &attr_idx,
                                        1, c.stream));
#else
        size_t fail_idx = 0;
        BENCH_CUDA(cudaMemcpyBatchAsync(dsts.data(), const_cast<void **>(srcs.data()), sizes.data(),
                                        n, &attr, &attr_idx, 1, &fail_idx, c.stream));
#endif
        break;
    }
    case M_PER_FRAG:
        for (size_t i = 0; i < n; i++)
            BENCH_CUDA(cudaMemcpyAsync(s.frags[i].dst, c.src + s.frags[i].src_off, s.frags[i].len,
                                       cudaMemcpyDeviceToDevice, c.stream));
        break;
    case M_CUB: {
        // The host waits for the previous call, so the pinned arrays are free to refill.
        for (size_t i = 0; i < n; i++) {
            c.h_srcs[i] = c.src + s.frags[i].src_off;
            c.h_dsts[i] = s.frags[i].dst;
            c.h_sizes[i] = s.frags[i].len;
        }
        BENCH_CUDA(cudaMemcpyAsync(c.d_srcs, c.h_srcs, n * sizeof(void *), cudaMemcpyHostToDevice,
                                   c.stream));
        BENCH_CUDA(cudaMemcpyAsync(c.d_dsts, c.h_dsts, n * sizeof(void *), cudaMemcpyHostToDevice,
                                   c.stream));
        BENCH_CUDA(cudaMemcpyAsync(c.d_sizes, c.h_sizes, n * sizeof(size_t), cudaMemcpyHostToDevice,
                                   c.stream));
        size_t tmp = c.cub_tmp_len;
        BENCH_CUDA(cub::DeviceMemcpy::Batched(c.cub_tmp, tmp, c.d_srcs, c.d_dsts, c.d_sizes,
                                              (int64_t)n, c.stream));
        break;
    }
    case M_CONTIG:
        BENCH_CUDA(cudaMemcpyAsync(c.pool, c.src, s.bytes, cudaMemcpyDeviceToDevice, c.stream));
        break;
    case M_REF: {
        unsigned n = (unsigned)s.ids.size();
        reference_copy<<<(n + 7) / 8, 256, 0, c.stream>>>(c.pool, c.src, c.d_ids,
                                                          (unsigned)s.page_bytes, n);
        BENCH_CUDA(cudaGetLastError());
        break;
    }
    case M_PAGES:
    case M_PAGES_P: {
        uint64_t t0 = kvs__now_ns();
        kvs_page_region_t rg = {c.pool, s.page_bytes, s.page_bytes, c.pool_len / s.page_bytes};
        kvs__page_layout_t L = {&rg, 1, KVS_PAGE_MAJOR, rg.npages - 1};
        uint32_t nslices = 0;
        uint64_t row = 0;
        uint32_t nk = (uint32_t)s.keys.size();
        size_t bytes = 0;
        if (kvs__pt_slices(&L, &nslices, &row) != KVS_OK ||
            (bytes = kvs__pt_plan_bytes(&L, nslices, s.keys.data(), sizeof(kvs__pt_pages_t), nk)) >
                c.plan_cap) {
            std::fprintf(stderr, "bench scatter: the page plan does not fit\n");
            std::exit(1);
        }
        kvs__pt_plan_t plan;
        if (kvs__pt_plan_build(&L, nslices, row, s.keys.data(), sizeof(kvs__pt_pages_t), nk,
                               s.key_off.data(), c.h_plan, (uintptr_t)c.d_plan, &plan) != KVS_OK) {
            std::fprintf(stderr, "bench scatter: the page plan was refused\n");
            std::exit(1);
        }
        c.plan_ns = kvs__now_ns() - t0;
        BENCH_CUDA(cudaMemcpyAsync(c.d_plan, c.h_plan, bytes, cudaMemcpyHostToDevice, c.stream));
        BENCH_CUDA(cudaEventRecord(start, c.stream));
        uint64_t units = (uint64_t)s.ids.size() * nslices;
        int rc = kvs__scatter_pages_launch(page_ctx(c, m), c.src, &plan, 0, nk, 0, units, c.stream);
        if (rc != KVS_OK) {
            std::fprintf(stderr, "bench scatter: page launch: %s\n", kvs_status_str(rc));
            std::exit(1);
        }
        break;
    }
    default:
        break;
    }
}

bool verify(ctx_t &c, method_t m, const set_t &s)
{
    BENCH_CUDA(cudaMemsetAsync(c.d_bad, 0, sizeof(*c.d_bad), c.stream));
    size_t first = m == M_CONTIG ? s.contig_checks : 0;
    unsigned n = (unsigned)((m == M_CONTIG ? s.checks.size() : s.contig_checks) - first);
    verify_kernel<<<std::min(n, 65535u), 256, 0, c.stream>>>(c.src, c.d_frags + first, n, c.d_bad);
    unsigned long long bad = 1;
    BENCH_CUDA(cudaMemcpyAsync(&bad, c.d_bad, sizeof(bad), cudaMemcpyDeviceToHost, c.stream));
    BENCH_CUDA(cudaStreamSynchronize(c.stream));
    return bad == 0;
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

void usage(FILE *f)
{
    std::fprintf(
        f, "usage: kvstash bench scatter [--bytes SIZE[,SIZE...]] [--sets NAME[,NAME...]]\n"
           "                             [--placement P[,P...]] [--methods M[,M...]]\n"
           "                             [--reps N] [--warmup N] [--csv PATH] [--device N]\n"
           "  --bytes      bytes per call (default 256MiB,1GiB)\n"
           "  --sets       fragment sets (default 4KiB,8KiB,16KiB,64KiB,256KiB,1MiB,12MiB,"
           "mixed,odd)\n"
           "  --placement  where fragments land in the destination pool: shuffled (default),\n"
           "               ordered, or window:SIZE (shuffled within SIZE-byte stretches)\n"
           "  --methods    kvstash, batch, per-frag, cub, contiguous, bounded (8/16/32-block\n"
           "               kvstash grids), pages (page-table form: sets of equal pages, plan\n"
           "               built and uploaded within the call), pages-persistent (the same\n"
           "               with persistent warps), reference (the least a page copy costs: a warp\n"
           "               per page, 16-byte loads, page ids already on the GPU; no plan,\n"
           "               no library code); default all\n"
           "  --reps       timed calls per method (default 20; methods whose calls take over\n"
           "               200 ms get 5)\n"
           "  --warmup     untimed calls per method first (default 3, at least 1)\n");
}

std::vector<std::string> split(const char *s)
{
    std::vector<std::string> out;
    std::string cur;
    for (; *s; s++) {
        if (*s == ',') {
            out.push_back(cur);
            cur.clear();
        } else {
            cur += *s;
        }
    }
    if (!cur.empty())
        out.push_back(cur);
    return out;
}

} // namespace

extern "C" int kvs__bench_scatter_main(int argc, char **argv)
{
    std::vector<std::string> byte_args = {"256MiB", "1GiB"};
    std::vector<std::string> sets = {"4KiB", "8KiB",  "16KiB", "64KiB", "256KiB",
                                     "1MiB", "12MiB", "mixed", "odd"};
    std::vector<placement_t> placements = {placement_t{"shuffled", 0}};
    bool use[M_COUNT];
    for (int m = 0; m < M_COUNT; m++)
        use[m] = true;
    unsigned reps = 20, warmup = 3;
    int device = 0;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (v && a == "--bytes") {
            byte_args = split(v);
        } else if (v && a == "--sets") {
            sets = split(v);
        } else if (v && a == "--placement") {
            placements.clear();
            for (auto &p : split(v)) {
                placement_t pl;
                if (!parse_placement(p, &pl)) {
                    std::fprintf(stderr, "kvstash bench scatter: bad placement '%s'\n", p.c_str());
                    return 2;
                }
                placements.push_back(pl);
            }
        } else if (v && a == "--methods") {
            for (int m = 0; m < M_COUNT; m++)
                use[m] = false;
            for (auto &k : split(v)) {
                bool known = false;
                for (int m = 0; m < M_COUNT; m++)
                    if (k == kMethodKeys[m])
                        use[m] = known = true;
                if (!known) {
                    std::fprintf(stderr, "kvstash bench scatter: unknown method '%s'\n", k.c_str());
                    return 2;
                }
            }
        } else if (v && a == "--reps") {
            reps = (unsigned)std::atoi(v);
        } else if (v && a == "--warmup") {
            warmup = (unsigned)std::atoi(v);
        } else if (v && a == "--csv") {
            csv = v;
        } else if (v && a == "--device") {
            device = std::atoi(v);
        } else {
            std::fprintf(stderr, "kvstash bench scatter: bad option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (reps == 0 || reps > 1000 || warmup == 0 || warmup > 1000 || placements.empty()) {
        std::fprintf(stderr, "kvstash bench scatter: --reps and --warmup want 1..1000\n");
        return 2;
    }
    std::vector<uint64_t> totals;
    for (auto &b : byte_args) {
        uint64_t t;
        if (kvs__parse_size(b.c_str(), &t) != KVS_OK || t < 4096) {
            std::fprintf(stderr, "kvstash bench scatter: bad size '%s'\n", b.c_str());
            return 2;
        }
        totals.push_back(t);
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
        std::fprintf(stderr, "kvstash bench scatter: no CUDA device %d\n", device);
        return 1;
    }
    BENCH_CUDA(cudaSetDevice(device));
    cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
    FILE *out = csv ? std::fopen(csv, "w") : NULL;
    if (csv && !out) {
        std::fprintf(stderr, "kvstash bench scatter: cannot write %s\n", csv);
        return 1;
    }
    if (out)
        std::fprintf(out, "bytes_per_call,set,placement,fragments,method,reps,wall_ms_median,"
                          "gpu_ms_median,wall_gbps,gpu_gbps,gpu_gated,enqueue_ms_median,"
                          "prepare_us_median,submit_us_median,verified\n");
    std::printf("device %d: %s, %d SMs; medians of timed calls after %u warm-up calls\n"
                "GPU ms: the method's queued work alone (* timed from submission); enqueue ms:\n"
                "host time in the method's calls (kvstash: prepare + submit, in µs)\n",
                device, prop.name, prop.multiProcessorCount, warmup);
    std::mt19937_64 rng(42);
    int failures = 0;
    for (uint64_t total : totals) {
        ctx_t c{};
        BENCH_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
        kvs__scatter_config_t sc = {device, 0, false};
        if (kvs__scatter_create(&sc, &c.scatter) != KVS_OK) {
            std::fprintf(stderr, "bench scatter: no scatter context\n");
            return 1;
        }
        kvs__scatter_config_t pc = {device, 0, true};
        if (kvs__scatter_create(&pc, &c.persist) != KVS_OK) {
            std::fprintf(stderr, "bench scatter: no scatter context\n");
            return 1;
        }
        for (int b = 0; b < 3; b++) {
            kvs__scatter_config_t bc = {device, kBounded[b], false};
            if (kvs__scatter_create(&bc, &c.bounded[b]) != KVS_OK) {
                std::fprintf(stderr, "bench scatter: no scatter context\n");
                return 1;
            }
        }
        c.pool_len = total + total / 8 + 4096; // room for the odd set's gaps
        BENCH_CUDA(cudaMalloc(&c.src, total));
        BENCH_CUDA(cudaMalloc(&c.pool, c.pool_len));
        std::vector<unsigned char> h(total);
        for (uint64_t b = 0; b < total; b++)
            h[b] = (unsigned char)(rng() >> 56);
        BENCH_CUDA(cudaMemcpy(c.src, h.data(), total, cudaMemcpyHostToDevice));
        size_t max_frags = total / 1 / 2 + 2; // the odd set averages ~10 KB; bounded by 1 B
        max_frags = std::min<size_t>(max_frags, total / 4096 * 4 + 1024);
        c.cub_cap = max_frags;
        BENCH_CUDA(cudaMalloc(&c.d_srcs, max_frags * sizeof(void *)));
        BENCH_CUDA(cudaMalloc(&c.d_dsts, max_frags * sizeof(void *)));
        BENCH_CUDA(cudaMalloc(&c.d_sizes, max_frags * sizeof(size_t)));
        BENCH_CUDA(cudaMallocHost(&c.h_srcs, max_frags * sizeof(void *)));
        BENCH_CUDA(cudaMallocHost(&c.h_dsts, max_frags * sizeof(void *)));
        BENCH_CUDA(cudaMallocHost(&c.h_sizes, max_frags * sizeof(size_t)));
        size_t max_checks = max_frags + 2 * (total / 65536 + 1);
        BENCH_CUDA(cudaMalloc(&c.d_frags, max_checks * sizeof(frag_t)));
        BENCH_CUDA(cudaMalloc(&c.d_bad, sizeof(*c.d_bad)));
        c.plan_cap = total / 64 + (total / kPageKeyBytes + 2) * sizeof(kvs__pt_key_t) + (1u << 20);
        BENCH_CUDA(cudaMallocHost(&c.h_plan, c.plan_cap));
        BENCH_CUDA(cudaMalloc(&c.d_plan, c.plan_cap));
        c.cub_tmp_len = 0;
        BENCH_CUDA(cub::DeviceMemcpy::Batched(NULL, c.cub_tmp_len, c.d_srcs, c.d_dsts, c.d_sizes,
                                              (int64_t)max_frags, c.stream));
        BENCH_CUDA(cudaMalloc(&c.cub_tmp, c.cub_tmp_len));
        cudaEvent_t e0, e1;
        BENCH_CUDA(cudaEventCreate(&e0));
        BENCH_CUDA(cudaEventCreate(&e1));
        char tb[32];
        std::printf("\n%s per call\n%-8s %-13s %9s  %-22s %9s %9s %9s %9s %10s  %s\n",
                    kvs__format_size(total, tb, sizeof(tb)), "set", "placement", "fragments",
                    "method", "wall ms", "GPU ms", "wall GB/s", "GPU GB/s", "enqueue ms", "check");
        for (size_t si = 0; si < sets.size() * placements.size(); si++) {
            const std::string &name = sets[si / placements.size()];
            const placement_t &pl = placements[si % placements.size()];
            set_t s = make_set(name, total, pl, c.pool, rng);
            if (s.frags.empty() || s.frags.size() > max_frags) {
                std::fprintf(stderr, "bench scatter: set '%s' does not fit %s\n", name.c_str(), tb);
                continue;
            }
            BENCH_CUDA(cudaMemcpy(c.d_frags, s.checks.data(), s.checks.size() * sizeof(frag_t),
                                  cudaMemcpyHostToDevice));
            cudaFree(c.d_ids); // the reference copy's page ids, untimed
            c.d_ids = NULL;
            if (s.paged) {
                BENCH_CUDA(cudaMalloc(&c.d_ids, s.ids.size() * sizeof(uint32_t)));
                BENCH_CUDA(cudaMemcpy(c.d_ids, s.ids.data(), s.ids.size() * sizeof(uint32_t),
                                      cudaMemcpyHostToDevice));
            }
            std::vector<void *> dsts;
            std::vector<const void *> srcs;
            std::vector<size_t> sizes;
            // enqueue: host time in the method's calls; prep/subm: kvstash's own split (µs)
            std::vector<double> wall[M_COUNT], gpu[M_COUNT], enq[M_COUNT], prep[M_COUNT],
                subm[M_COUNT];
            bool ok[M_COUNT];
            unsigned nreps[M_COUNT];
            for (int m = 0; m < M_COUNT; m++) {
                ok[m] = true;
                nreps[m] = reps;
            }
            for (unsigned r = 0; r < warmup + reps; r++) {
                for (int k = 0; k < M_COUNT; k++) {
                    method_t m = (method_t)((k + r) % M_COUNT);
                    if (!use[m] || (r >= warmup && r - warmup >= nreps[m]) ||
                        ((is_pages(m) || m == M_REF) && !s.paged))
                        continue;
                    // Wall time: submitted at once, host preparation included.
                    BENCH_CUDA(cudaMemsetAsync(c.pool, 0, c.pool_len, c.stream));
                    BENCH_CUDA(cudaStreamSynchronize(c.stream));
                    uint64_t t0 = kvs__now_ns();
                    run_method(c, m, s, dsts, srcs, sizes, e0);
                    uint64_t tq = kvs__now_ns();
                    BENCH_CUDA(cudaEventRecord(e1, c.stream));
                    BENCH_CUDA(cudaStreamSynchronize(c.stream));
                    uint64_t t1 = kvs__now_ns();
                    kvs__scatter_stats_t st = {0, 0, 0};
                    if (m == M_KERNEL)
                        kvs__scatter_stats(c.scatter, &st);
                    if (is_pages(m))
                        kvs__scatter_stats(page_ctx(c, m), &st);
                    if (is_pages(m))
                        st.prepare_ns = c.plan_ns; // the plan, built on the host, is its prepare
                    float gms = 0;
                    BENCH_CUDA(cudaEventElapsedTime(&gms, e0, e1));
                    ok[m] = ok[m] && verify(c, m, s);
                    double wms = (double)(t1 - t0) / 1e6;
                    // GPU time: the same work queued behind the gate (not on the first call,
                    // whose allocations may wait for the device).
                    if (gateable(m) && r > 0) {
                        BENCH_CUDA(cudaMemsetAsync(c.pool, 0, c.pool_len, c.stream));
                        c.gate.store(0);
                        BENCH_CUDA(cudaLaunchHostFunc(c.stream, gate_fn, &c.gate));
                        run_method(c, m, s, dsts, srcs, sizes, e0);
                        BENCH_CUDA(cudaEventRecord(e1, c.stream));
                        if (c.gate.exchange(1) != 0) {
                            std::fprintf(stderr, "bench scatter: the gate gave up waiting\n");
                            return 1;
                        }
                        BENCH_CUDA(cudaStreamSynchronize(c.stream));
                        BENCH_CUDA(cudaEventElapsedTime(&gms, e0, e1));
                        ok[m] = ok[m] && verify(c, m, s);
                    }
                    if (r == 0 && wms > 200 && nreps[m] > 5)
                        nreps[m] = 5;
                    if (r >= warmup) {
                        wall[m].push_back(wms);
                        gpu[m].push_back(gms);
                        enq[m].push_back((double)(tq - t0) / 1e6);
                        prep[m].push_back((double)st.prepare_ns / 1e3);
                        subm[m].push_back((double)st.submit_ns / 1e3);
                    }
                }
            }
            for (int m = 0; m < M_COUNT; m++) {
                if (!use[m] || wall[m].empty())
                    continue;
                double w = median(wall[m]), g = median(gpu[m]), q = median(enq[m]);
                double wg = (double)s.bytes / (w * 1e6), gg = (double)s.bytes / (g * 1e6);
                double pu = median(prep[m]), su = median(subm[m]);
                char split[48] = "";
                if (m == M_KERNEL || is_pages((method_t)m))
                    std::snprintf(split, sizeof(split), " (%.0f + %.0f)", pu, su);
                failures += !ok[m];
                std::printf("%-8s %-13s %9zu  %-22s %9.3f %8.3f%s %9.1f %9.1f %10.3f%s  %s%s\n",
                            name.c_str(), pl.name.c_str(), s.frags.size(), kMethodNames[m], w, g,
                            gateable((method_t)m) ? " " : "*", wg, gg, q, split,
                            ok[m] ? "ok" : "WRONG BYTES",
                            wall[m].size() < reps ? " (fewer reps)" : "");
                if (out)
                    std::fprintf(out,
                                 "%llu,%s,%s,%zu,%s,%zu,%.4f,%.4f,%.2f,%.2f,%d,%.4f,%.1f,%.1f,%d\n",
                                 (unsigned long long)total, name.c_str(), pl.name.c_str(),
                                 s.frags.size(), kMethodNames[m], wall[m].size(), w, g, wg, gg,
                                 gateable((method_t)m) ? 1 : 0, q, pu, su, ok[m] ? 1 : 0);
            }
            std::fflush(stdout);
            if (out)
                std::fflush(out);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        kvs__scatter_destroy(c.scatter);
        for (int b = 0; b < 3; b++)
            kvs__scatter_destroy(c.bounded[b]);
        kvs__scatter_destroy(c.persist);
        cudaFree(c.d_ids);
        cudaFree(c.src);
        cudaFree(c.pool);
        cudaFree(c.d_srcs);
        cudaFree(c.d_dsts);
        cudaFree(c.d_sizes);
        cudaFreeHost(c.h_srcs);
        cudaFreeHost(c.h_dsts);
        cudaFreeHost(c.h_sizes);
        cudaFree(c.d_frags);
        cudaFree(c.d_bad);
        cudaFreeHost(c.h_plan);
        cudaFree(c.d_plan);
        cudaFree(c.cub_tmp);
        cudaStreamDestroy(c.stream);
    }
    if (out)
        std::fclose(out);
    if (failures) {
        std::fprintf(stderr, "bench scatter: %d method/set results had wrong bytes\n", failures);
        return 1;
    }
    return 0;
}
