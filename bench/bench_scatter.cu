// `kvstash bench scatter`: one contiguous device buffer scattered to randomly placed device
// destinations, by five methods: the kvstash kernel, cudaMemcpyBatchAsync, one cudaMemcpyAsync
// per fragment, CUB's DeviceMemcpy::Batched (here only, never in the library) and one
// contiguous copy of the same bytes (the limit). Host wall time covers building the method's
// descriptors, uploading them, submitting and waiting; GPU time comes from events around the
// submission. Medians after warm-up, methods in rotating order, every result verified on the
// GPU against the source (the destinations are cleared before each call).
#include <cub/device/device_memcpy.cuh>
#include <cuda_runtime.h>

extern "C" {
#include "common/common_int.h"
#include "gpu/scatter.h"
#include "tools/cli_int.h"
}

#include <algorithm>
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
enum method_t { M_KERNEL, M_BATCH, M_PER_FRAG, M_CUB, M_CONTIG, M_K8, M_K16, M_K32, M_COUNT };
const char *const kMethodNames[M_COUNT] = {
    "kvstash",    "cudaMemcpyBatchAsync", "cudaMemcpyAsync/frag", "cub::Batched",
    "contiguous", "kvstash/8 blocks",     "kvstash/16 blocks",    "kvstash/32 blocks"};
const uint32_t kBounded[3] = {8, 16, 32};

// Counts bytes of each fragment that differ from the source (one block per fragment).
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
    uint64_t bytes;
};

// Lays out fragments of `total` bytes in the pool in shuffled order (with gaps of 1..15 bytes
// when `gaps`).
set_t make_set(const std::string &name, uint64_t total, char *pool, std::mt19937_64 &rng)
{
    set_t s{name, {}, 0};
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
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<uint64_t> pos(lens.size());
    uint64_t p = odd ? 1 + rng() % 15 : 0;
    for (size_t k = 0; k < order.size(); k++) {
        pos[order[k]] = p;
        p += lens[order[k]] + (odd ? 1 + rng() % 15 : 0);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < lens.size(); i++) {
        s.frags.push_back(frag_t{pool + pos[i], off, lens[i]});
        off += lens[i];
    }
    s.bytes = sum;
    return s;
}

struct ctx_t {
    cudaStream_t stream;
    kvs__scatter_t *scatter;
    kvs__scatter_t *bounded[3]; // max_blocks 8, 16, 32
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
    // verification
    frag_t *d_frags;
    unsigned long long *d_bad;
};

void run_method(ctx_t &c, method_t m, const set_t &s, std::vector<void *> &dsts,
                std::vector<const void *> &srcs, std::vector<size_t> &sizes,
                std::vector<kvs__scatter_frag_t> &kfr)
{
    const size_t n = s.frags.size();
    switch (m) {
    case M_KERNEL:
    case M_K8:
    case M_K16:
    case M_K32: {
        kfr.resize(n);
        for (size_t i = 0; i < n; i++)
            kfr[i] = kvs__scatter_frag_t{s.frags[i].dst, s.frags[i].len};
        kvs__scatter_t *ctx = m == M_KERNEL ? c.scatter : c.bounded[m - M_K8];
        int rc = kvs__scatter_launch(ctx, c.src, kfr.data(), (uint32_t)n, c.stream);
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
    default:
        break;
    }
}

bool verify(ctx_t &c, method_t m, const set_t &s)
{
    BENCH_CUDA(cudaMemsetAsync(c.d_bad, 0, sizeof(*c.d_bad), c.stream));
    unsigned n = (unsigned)s.frags.size();
    if (m == M_CONTIG) {
        frag_t one{c.pool, 0, s.bytes};
        BENCH_CUDA(
            cudaMemcpyAsync(c.d_frags + n, &one, sizeof(one), cudaMemcpyHostToDevice, c.stream));
        verify_kernel<<<2048, 256, 0, c.stream>>>(c.src, c.d_frags + n, 1, c.d_bad);
    } else {
        verify_kernel<<<std::min(n, 65535u), 256, 0, c.stream>>>(c.src, c.d_frags, n, c.d_bad);
    }
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
    std::fprintf(f,
                 "usage: kvstash bench scatter [--bytes SIZE[,SIZE...]] [--sets NAME[,NAME...]]\n"
                 "                             [--reps N] [--warmup N] [--csv PATH] [--device N]\n"
                 "  --bytes   bytes per call (default 256MiB,1GiB)\n"
                 "  --sets    fragment sets (default 4KiB,8KiB,16KiB,64KiB,256KiB,1MiB,12MiB,"
                 "mixed,odd)\n"
                 "  --reps    timed calls per method (default 20; methods whose calls take over\n"
                 "            200 ms get 5)\n"
                 "  --warmup  untimed calls per method first (default 3)\n");
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
    if (reps == 0 || reps > 1000) {
        std::fprintf(stderr, "kvstash bench scatter: --reps wants 1..1000\n");
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
        std::fprintf(out, "bytes_per_call,set,fragments,method,reps,wall_ms_median,"
                          "gpu_ms_median,wall_gbps,gpu_gbps,verified\n");
    std::printf("device %d: %s, %d SMs; medians of timed calls after %u warm-up calls\n", device,
                prop.name, prop.multiProcessorCount, warmup);
    std::mt19937_64 rng(42);
    int failures = 0;
    for (uint64_t total : totals) {
        ctx_t c{};
        BENCH_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
        kvs__scatter_config_t sc = {device, 0};
        if (kvs__scatter_create(&sc, &c.scatter) != KVS_OK) {
            std::fprintf(stderr, "bench scatter: no scatter context\n");
            return 1;
        }
        for (int b = 0; b < 3; b++) {
            kvs__scatter_config_t bc = {device, kBounded[b]};
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
        BENCH_CUDA(cudaMalloc(&c.d_frags, (max_frags + 1) * sizeof(frag_t)));
        BENCH_CUDA(cudaMalloc(&c.d_bad, sizeof(*c.d_bad)));
        c.cub_tmp_len = 0;
        BENCH_CUDA(cub::DeviceMemcpy::Batched(NULL, c.cub_tmp_len, c.d_srcs, c.d_dsts, c.d_sizes,
                                              (int64_t)max_frags, c.stream));
        BENCH_CUDA(cudaMalloc(&c.cub_tmp, c.cub_tmp_len));
        cudaEvent_t e0, e1;
        BENCH_CUDA(cudaEventCreate(&e0));
        BENCH_CUDA(cudaEventCreate(&e1));
        char tb[32];
        std::printf("\n%s per call\n%-8s %9s  %-22s %10s %10s %10s %10s  %s\n",
                    kvs__format_size(total, tb, sizeof(tb)), "set", "fragments", "method",
                    "wall ms", "GPU ms", "wall GB/s", "GPU GB/s", "check");
        for (const std::string &name : sets) {
            set_t s = make_set(name, total, c.pool, rng);
            if (s.frags.empty() || s.frags.size() > max_frags) {
                std::fprintf(stderr, "bench scatter: set '%s' does not fit %s\n", name.c_str(), tb);
                continue;
            }
            BENCH_CUDA(cudaMemcpy(c.d_frags, s.frags.data(), s.frags.size() * sizeof(frag_t),
                                  cudaMemcpyHostToDevice));
            std::vector<void *> dsts;
            std::vector<const void *> srcs;
            std::vector<size_t> sizes;
            std::vector<kvs__scatter_frag_t> kfr;
            std::vector<double> wall[M_COUNT], gpu[M_COUNT];
            bool ok[M_COUNT];
            unsigned nreps[M_COUNT];
            for (int m = 0; m < M_COUNT; m++) {
                ok[m] = true;
                nreps[m] = reps;
            }
            for (unsigned r = 0; r < warmup + reps; r++) {
                for (int k = 0; k < M_COUNT; k++) {
                    method_t m = (method_t)((k + r) % M_COUNT);
                    if (r >= warmup && r - warmup >= nreps[m])
                        continue;
                    BENCH_CUDA(cudaMemsetAsync(c.pool, 0, c.pool_len, c.stream));
                    BENCH_CUDA(cudaStreamSynchronize(c.stream));
                    uint64_t t0 = kvs__now_ns();
                    BENCH_CUDA(cudaEventRecord(e0, c.stream));
                    run_method(c, m, s, dsts, srcs, sizes, kfr);
                    BENCH_CUDA(cudaEventRecord(e1, c.stream));
                    BENCH_CUDA(cudaStreamSynchronize(c.stream));
                    uint64_t t1 = kvs__now_ns();
                    float gms = 0;
                    BENCH_CUDA(cudaEventElapsedTime(&gms, e0, e1));
                    ok[m] = ok[m] && verify(c, m, s);
                    double wms = (double)(t1 - t0) / 1e6;
                    if (r == 0 && wms > 200 && nreps[m] > 5)
                        nreps[m] = 5;
                    if (r >= warmup) {
                        wall[m].push_back(wms);
                        gpu[m].push_back(gms);
                    }
                }
            }
            for (int m = 0; m < M_COUNT; m++) {
                double w = median(wall[m]), g = median(gpu[m]);
                double wg = (double)s.bytes / (w * 1e6), gg = (double)s.bytes / (g * 1e6);
                failures += !ok[m];
                std::printf("%-8s %9zu  %-22s %10.3f %10.3f %10.1f %10.1f  %s%s\n", name.c_str(),
                            s.frags.size(), kMethodNames[m], w, g, wg, gg,
                            ok[m] ? "ok" : "WRONG BYTES",
                            wall[m].size() < reps ? " (fewer reps)" : "");
                if (out)
                    std::fprintf(out, "%llu,%s,%zu,%s,%zu,%.4f,%.4f,%.2f,%.2f,%d\n",
                                 (unsigned long long)total, name.c_str(), s.frags.size(),
                                 kMethodNames[m], wall[m].size(), w, g, wg, gg, ok[m] ? 1 : 0);
            }
            std::fflush(stdout);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        kvs__scatter_destroy(c.scatter);
        for (int b = 0; b < 3; b++)
            kvs__scatter_destroy(c.bounded[b]);
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
