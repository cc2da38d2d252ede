// Byte-exact verification on the GPU for `kvstash bench store`: compares every destination
// fragment with the bytes it should hold (a device copy of what was put), so a benchmark can
// check every read without copying the page pool back to the host.
#include <cuda_runtime.h>

extern "C" {
#include "bench_check.h"
}

namespace
{

// One block per fragment (grid-stride over fragments); 16-byte compares when both sides are
// aligned, bytes otherwise. Counts differing fragments.
__global__ void check_kernel(const kvs__bench_frag_t *frags, unsigned long long n,
                             const unsigned char *expected, unsigned long long *bad)
{
    for (unsigned long long f = blockIdx.x; f < n; f += gridDim.x) {
        const unsigned char *d = reinterpret_cast<const unsigned char *>(frags[f].dst);
        const unsigned char *e = expected + frags[f].src_off;
        unsigned long long len = frags[f].len;
        int differs = 0;
        if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(e) | len) & 15) == 0) {
            const uint4 *d4 = reinterpret_cast<const uint4 *>(d);
            const uint4 *e4 = reinterpret_cast<const uint4 *>(e);
            for (unsigned long long i = threadIdx.x; i < len / 16; i += blockDim.x) {
                uint4 a = d4[i], b = e4[i];
                differs |= a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
            }
        } else {
            for (unsigned long long i = threadIdx.x; i < len; i += blockDim.x)
                differs |= d[i] != e[i];
        }
        if (__syncthreads_or(differs) && threadIdx.x == 0)
            atomicAdd(bad, 1ull);
    }
}

} // namespace

extern "C" int kvs__bench_check_frags(const kvs__bench_frag_t *frags_dev, uint64_t n,
                                      const void *expected_dev, uint64_t *bad_p)
{
    unsigned long long *bad = nullptr;
    if (cudaMalloc(&bad, sizeof(*bad)) != cudaSuccess)
        return -1;
    cudaError_t e = cudaMemset(bad, 0, sizeof(*bad));
    if (e == cudaSuccess && n > 0) {
        unsigned blocks = n < 65536 ? static_cast<unsigned>(n) : 65536u;
        check_kernel<<<blocks, 256>>>(frags_dev, n,
                                      static_cast<const unsigned char *>(expected_dev), bad);
        e = cudaGetLastError();
    }
    unsigned long long h = 0;
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost);
    cudaFree(bad);
    *bad_p = h;
    return e == cudaSuccess ? 0 : -1;
}
