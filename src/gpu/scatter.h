/* GPU scatter: copies one contiguous device source into many destination fragments with one
 * kernel launch. scatter.cu (the library's only CUDA file, compiled as CUDA C++) implements it;
 * builds without CUDA link scatter_none.c, whose calls return KVS_UNSUPPORTED. Plain C. */
#ifndef KVS_GPU_SCATTER_H
#define KVS_GPU_SCATTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One destination fragment (device memory of the context's device). */
typedef struct {
    void *dst;
    uint64_t len;
} kvs__scatter_frag_t;

typedef struct {
    int device;          /* CUDA device ordinal the context launches on */
    uint32_t max_blocks; /* 0: enough blocks to fill the GPU; else at most this many */
} kvs__scatter_config_t;

typedef struct kvs__scatter kvs__scatter_t;

/* Host time of a context's last successful launch (zeros when it copied nothing). */
typedef struct {
    uint64_t prepare_ns; /* checking the fragments and writing the work units */
    uint64_t submit_ns;  /* launching the kernel (before the units are written, when streamed) */
    uint64_t units;      /* work units launched */
} kvs__scatter_stats_t;

/* Whether this build has the CUDA implementation (a GPU may still be absent). */
bool kvs__scatter_built(void);

/* Creates a context on cfg->device. UNSUPPORTED without CUDA or without that device. */
int kvs__scatter_create(const kvs__scatter_config_t *cfg, kvs__scatter_t **s_p);

/* Enqueues one kernel on `stream` (a cudaStream_t; NULL: the legacy default stream) that
 * copies bytes [off_i, off_i + len_i) of `src` to frags[i].dst, where off_i is the sum of the
 * earlier lengths: the source is read in order, the destinations may lie anywhere, in any order
 * and at any alignment; zero-length fragments are skipped, and a fragment whose dst is NULL
 * skips its `len` bytes of the source (padding, or a key that is not to be written). Fragments
 * must not overlap each other or the source. `frags` is borrowed for the call only; `src` and
 * the destinations must stay valid until the stream passes the kernel. Up to
 * KVS_SCATTER_INLINE_UNITS work units travel as a kernel parameter; with more, the kernel is
 * enqueued first and reads the units from one of the context's two pinned buffers while this call
 * writes them (each buffer rewritten only after the kernel that last read it: a third launch in
 * a row may wait for the first). The total length must stay below 2^48. Returns OK once enqueued,
 * INVALID_PARAMS for bad arguments, NO_MEMORY, or TRANSFER_FAIL when CUDA refuses (the reason is
 * logged). Bad arguments are found before anything is copied, except a fragment that takes the
 * source past 2^48 bytes among more than KVS_SCATTER_INLINE_UNITS fragments: fragments before it
 * may have been copied, none from it on. Not thread-safe: one caller at a time per context. The
 * caller's current device is left as it was. */
int kvs__scatter_launch(kvs__scatter_t *s, const void *src, const kvs__scatter_frag_t *frags,
                        uint32_t n, void *stream);

/* Copies the host timings of the context's last launch to *out (no-op on NULL). */
void kvs__scatter_stats(const kvs__scatter_t *s, kvs__scatter_stats_t *out);

/* Waits for the context's last kernel, frees it. NULL is a no-op. */
void kvs__scatter_destroy(kvs__scatter_t *s);

/* Largest piece of a fragment one block copies (larger fragments are split). */
#define KVS_SCATTER_UNIT_BYTES (64u << 10)
/* Work units carried as kernel parameters at most (else read from pinned memory). */
#define KVS_SCATTER_INLINE_UNITS 2000u

#ifdef __cplusplus
}
#endif
#endif
