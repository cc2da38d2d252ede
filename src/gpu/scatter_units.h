/* The host side of the GPU scatter's work units: checking fragments, splitting them into units of
 * at most KVS_SCATTER_UNIT_BYTES and writing them where the kernel reads them. Plain C without
 * CUDA, so every build (and CI) compiles and tests it; scatter.cu calls it. */
#ifndef KVS_GPU_SCATTER_UNITS_H
#define KVS_GPU_SCATTER_UNITS_H

#include "scatter.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
#define KVS_SCATTER_ALIGN16 alignas(16)
#else
#define KVS_SCATTER_ALIGN16 _Alignas(16)
#endif

/* One work unit as the kernel reads it: the destination, and the source offset (low 48 bits)
 * with length - 1 (high 16 bits), so a unit is 1..64 KiB. 16-byte aligned: the streamed writer
 * stores each with one 16-byte non-temporal store. */
typedef struct {
    KVS_SCATTER_ALIGN16 uint64_t dst;
    uint64_t off_len;
} kvs__scatter_unit_t;

/* Units of one launch at most: a streamed launch's count travels in 31 bits of its published
 * word, whose top bit says the count is final. */
#define KVS_SCATTER_MAX_UNITS 0x7fffffffu
#define KVS_SCATTER_DONE      0x80000000u
/* Units written between two publications: a multiple of 8, so counts are whole 128-byte lines. */
#define KVS_SCATTER_PUBLISH_UNITS 512u

/* Checks the fragments and splits them into units, written to `out` while they fit in `cap`
 * (cap 0: count only). *nunits_p receives the number of units. INVALID_PARAMS when the source
 * offsets would reach 2^48 or wrap src around the address space, or when there would be more
 * than KVS_SCATTER_MAX_UNITS units. */
int kvs__scatter_build_units(const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                             kvs__scatter_unit_t *out, size_t cap, size_t *nunits_p);

/* Where kvs__scatter_stream_units stopped. */
typedef struct {
    uint32_t frags;     /* fragments consumed: the rest did not fit `cap` (or one was bad) */
    uint64_t off;       /* their source bytes */
    size_t units;       /* units written */
    size_t valid_units; /* of which checked and published: the count to make final */
} kvs__scatter_streamed_t;

/* Writes the fragments' units to `out` (at most `cap`) for a kernel that is already running,
 * storing the count written so far into *published (release order, whole 128-byte lines only)
 * every KVS_SCATTER_PUBLISH_UNITS units, once the offsets so far are checked. On x86 the units
 * are written with non-temporal stores, fenced before each publication and before returning, so
 * `out` must be 16-byte aligned (else INVALID_PARAMS, nothing written). Stops at the first
 * fragment whose units do not fit (OK, with r->frags < n) or that is bad (INVALID_PARAMS, same
 * rules as kvs__scatter_build_units; r->valid_units is then the count last published). The caller
 * publishes the final count, r->valid_units | KVS_SCATTER_DONE. */
int kvs__scatter_stream_units(const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                              kvs__scatter_unit_t *out, size_t cap, uint32_t *published,
                              kvs__scatter_streamed_t *r);

#ifdef __cplusplus
}
#endif
#endif
