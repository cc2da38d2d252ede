/* Subcommands of the kvstash command line that live in other files (benchmarks). */
#ifndef KVS_CLI_INT_H
#define KVS_CLI_INT_H

#include <stdint.h>

/* `kvstash bench allocator [options]`: replays the allocator workload. Returns an exit code. */
int kvs__bench_allocator_main(int argc, char **argv);
/* `kvstash bench transport [options]`: loopback transport throughput against plain sockets. */
int kvs__bench_transport_main(int argc, char **argv);
/* `kvstash bench proto [options]`: wire-format encoding and decoding rates (LOOKUP replies). */
int kvs__bench_proto_main(int argc, char **argv);

/* `kvstash bench client [options]`: put and multi-buffer get throughput against the store at
 * `master` (NULL: the client default). */
int kvs__bench_client_main(const char *master, int argc, char **argv);

/* `kvstash bench scatter [options]`: the GPU scatter kernel against CUDA's copy APIs and CUB
 * (CUDA builds only). */
int kvs__bench_scatter_main(int argc, char **argv);
/* `kvstash bench gpu [options]`: direct reads into device pages against the copy engine's own
 * rates (CUDA builds only). */
int kvs__bench_gpu_main(const char *master, int argc, char **argv);

/* `kvstash bench store [options]`: the store benchmark (DESIGN §5): its own store and reader
 * processes, four read modes, limits measured in the same run. */
int kvs__bench_store_main(int argc, char **argv);

/* Benchmarks: a reproducible random permutation of 0..n-1 into perm[] (Fisher-Yates with an
 * LCG seeded by `seed`), so destination pages land at random places. */
void kvs__bench_shuffle(uint64_t *perm, uint64_t n, uint64_t seed);

#endif
