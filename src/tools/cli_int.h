/* Subcommands of the kvstash command line that live in other files (benchmarks). */
#ifndef KVS_CLI_INT_H
#define KVS_CLI_INT_H

#include <stdbool.h>
#include <stdint.h>

/* Progress of long work on standard error (progress.c): drawn only on a terminal. */
typedef struct {
    bool on, bytes, drawn;
    const char *what; /* borrowed */
    uint64_t total, done, t0, drawn_ns;
} kvs__progress_t;

/* Whether progress is shown: standard error is a terminal (KVS_PROGRESS=0: never, =1: always). */
bool kvs__progress_wanted(void);
/* Starts a line "what: 42% done of total" (amounts in bytes when `bytes`, else counts). */
void kvs__progress_start(kvs__progress_t *p, const char *what, uint64_t total, bool bytes);
/* `done` of total so far; redrawn at most every 100 ms. */
void kvs__progress_set(kvs__progress_t *p, uint64_t done);
/* A log line on standard error (always printed), with the progress line kept below it. */
void kvs__progress_log(kvs__progress_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Erases the line (before output to standard output on the same terminal); the next set
 * draws it again. */
void kvs__progress_clear(kvs__progress_t *p);
/* The final line: 100% and "done", or "failed". */
void kvs__progress_end(kvs__progress_t *p, bool ok);

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
