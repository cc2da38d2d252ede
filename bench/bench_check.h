/* GPU verification for the benchmarks (bench_check.cu, CUDA builds only). */
#ifndef KVS_BENCH_CHECK_H
#define KVS_BENCH_CHECK_H

#include <stdint.h>

/* A destination fragment and where its bytes lie in the expected data. */
typedef struct {
    void *dst;
    uint64_t src_off;
    uint64_t len;
} kvs__bench_frag_t;

/* Compares the n fragments (the descriptor array in device memory) with expected_dev (device
 * memory) on the current device and waits: *bad_p = fragments that differ. 0, or -1 on a CUDA
 * error. */
int kvs__bench_check_frags(const kvs__bench_frag_t *frags_dev, uint64_t n, const void *expected_dev,
                           uint64_t *bad_p);

#endif
