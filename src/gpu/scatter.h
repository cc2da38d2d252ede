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
    /* Page kernel (kvs__scatter_pages_launch) on a full grid: false (default) launches a warp per
     * unit and lets the hardware schedule blocks; true keeps the persistent warps a bounded grid
     * uses (benchmarks compare the two). */
    bool persistent_pages;
} kvs__scatter_config_t;

typedef struct kvs__scatter kvs__scatter_t;

/* Host time of a context's last successful launch (zeros when it copied nothing). */
typedef struct {
    uint64_t prepare_ns; /* checking the fragments and writing the work units */
    uint64_t submit_ns;  /* launching the kernel (before the units are written, when streamed) */
    uint64_t units;      /* work units launched */
} kvs__scatter_stats_t;

/* How a launch's streamed kernels ended (kvs__scatter_result), worst first when several ran. */
typedef enum {
    KVS_SCATTER_COMPLETE = 0,  /* every unit copied (also: no streamed kernel ran) */
    KVS_SCATTER_ABORTED = 1,   /* kvs__scatter_abort (or a failed launch) stopped it */
    KVS_SCATTER_TIMED_OUT = 2, /* it waited for its units past its bound and stopped */
    KVS_SCATTER_UNKNOWN = 3    /* the record is gone (see KVS_SCATTER_STATUS_RING): assume failed */
} kvs__scatter_end_t;

/* Options of one launch; all-zero gives the defaults. */
typedef struct {
    /* When the caller stops waiting for the copy (kvs__now_ns() clock); 0: no deadline. */
    uint64_t deadline_ns;
    /* How long a streamed kernel may wait for the host to publish its units, in device time
     * (%globaltimer), counted per warp from its start; past it the kernel stops and reports
     * KVS_SCATTER_TIMED_OUT. 0: the time left to deadline_ns at launch, at least
     * KVS_SCATTER_WAIT_MIN_NS, or KVS_SCATTER_WAIT_DEFAULT_NS without a deadline. The host aborts
     * at its deadline itself; this bound is what stops a kernel whose host never does. */
    uint64_t wait_ns;
    /* Tests only: take the streamed kernel whatever the count, write every unit, but publish only
     * the first test_publish_units (rounded down to whole 128-byte lines) and never the final
     * count, as a host that failed between launch and publication would. Only kvs__scatter_abort
     * or the wait bound ends such a kernel. */
    bool test_hold;
    uint32_t test_publish_units;
} kvs__scatter_opts_t;

/* The streamed kernels one launch made (at most two), to abort them and learn how they ended. */
typedef struct {
    uint32_t n;
    uint32_t seq[2];
    uint8_t slot[2];
} kvs__scatter_ticket_t;

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
 * a row may wait for the first). A streamed kernel waits for its units at most
 * KVS_SCATTER_WAIT_DEFAULT_NS (see kvs__scatter_launch_opts). The total length must stay below
 * 2^48. Returns OK once enqueued, INVALID_PARAMS for bad arguments, NO_MEMORY, or TRANSFER_FAIL
 * when CUDA refuses (the reason is logged). Bad arguments are found before anything is copied,
 * except a fragment that takes the source past 2^48 bytes among more than KVS_SCATTER_INLINE_UNITS
 * fragments: fragments before it may have been copied, none from it on. Not thread-safe: one caller
 * at a time per context. The caller's current device is left as it was. */
int kvs__scatter_launch(kvs__scatter_t *s, const void *src, const kvs__scatter_frag_t *frags,
                        uint32_t n, void *stream);

/* kvs__scatter_launch with options (`opts` NULL: the defaults; borrowed for the call). *ticket_p
 * (may be NULL) names the streamed kernels the call launched, also when it fails. Same results
 * as kvs__scatter_launch, but a failure after a streamed kernel started aborts that kernel (it
 * stops at its next check; the caller still waits for the stream before reusing the memory). */
int kvs__scatter_launch_opts(kvs__scatter_t *s, const void *src, const kvs__scatter_frag_t *frags,
                             uint32_t n, void *stream, const kvs__scatter_opts_t *opts,
                             kvs__scatter_ticket_t *ticket_p);

/* Asks the ticket's streamed kernels to stop: a kernel waiting for units stops within tens of
 * microseconds (its warps poll at most 33 us apart); a copying one stops at its warps' next chunk
 * once it learns of the abort (from grid warp 0, which reads the host's words every ~20 us while it
 * still copies; a kernel whose units are all published and whose warp 0 has finished just completes
 * its copy). Copies of units already started finish. A kernel that already ended is not affected,
 * nor is a later launch. The caller still waits for the stream before it reuses the destinations.
 * Thread-safe (one store per kernel): it may run while another thread launches on the context.
 * INVALID_PARAMS for NULL arguments or a malformed ticket. */
int kvs__scatter_abort(kvs__scatter_t *s, const kvs__scatter_ticket_t *t);

/* How the ticket's kernels ended; valid once the stream has passed the launch (earlier, a kernel
 * still running reads as COMPLETE). Records are kept for the last KVS_SCATTER_STATUS_RING streamed
 * kernels of the context; an older one reads UNKNOWN, as do NULL arguments. Thread-safe. */
kvs__scatter_end_t kvs__scatter_result(const kvs__scatter_t *s, const kvs__scatter_ticket_t *t);

struct kvs__pt_plan; /* scatter_pages.h */

/* Enqueues one kernel on `stream` that copies units [first_unit, end_unit) of the page-table plan
 * `plan` (scatter_pages.h), which lie in its keys [a, b), from `src`: the plan's tables are in
 * device memory of the context's device, written and checked by the host before (their values
 * are trusted: every destination they name must be the caller's). The kernel waits for nothing
 * on the host, so it needs no abort: it ends once its copies do. INVALID_PARAMS for bad
 * arguments, TRANSFER_FAIL when CUDA refuses. Not thread-safe (one caller per context). */
int kvs__scatter_pages_launch(kvs__scatter_t *s, const void *src, const struct kvs__pt_plan *plan,
                              uint32_t a, uint32_t b, uint64_t first_unit, uint64_t end_unit,
                              void *stream);

/* Copies the host timings of the context's last launch to *out (no-op on NULL). */
void kvs__scatter_stats(const kvs__scatter_t *s, kvs__scatter_stats_t *out);

/* Waits for the context's last kernel, frees it. NULL is a no-op. */
void kvs__scatter_destroy(kvs__scatter_t *s);

/* Largest piece of a fragment one block copies (larger fragments are split). */
#define KVS_SCATTER_UNIT_BYTES (64u << 10)
/* Work units carried as kernel parameters at most (else read from pinned memory). */
#define KVS_SCATTER_INLINE_UNITS 2000u
/* A streamed kernel's wait bound without a deadline (the default transfer deadline), and the
 * least one derived from a deadline (a launch just before it still gets to read its units). */
#define KVS_SCATTER_WAIT_DEFAULT_NS 5000000000ull
#define KVS_SCATTER_WAIT_MIN_NS     10000000ull
/* Streamed kernels whose end a context remembers (kvs__scatter_result). */
#define KVS_SCATTER_STATUS_RING 256u

#ifdef __cplusplus
}
#endif
#endif
