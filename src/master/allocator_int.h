/* Per-segment space allocator of the master. It manages offsets only (the bytes live in the
 * owner's memory), with two-level segregated fit bins in the manner of TLSF: O(1) allocation
 * and free, immediate coalescing of neighbours, and a bounded best-fit scan before giving up so
 * that a nearly full segment still finds a hole that the rounded-up bin search would miss. */
#ifndef KVS_ALLOCATOR_INT_H
#define KVS_ALLOCATOR_INT_H

#include "../common/common_int.h"

/* Offsets handed out are multiples of this; objects start 64-byte aligned in the segment. */
#define KVS_SEG_ALLOC_ALIGN 64u
#define KVS_SEG_ALLOC_NIL   UINT32_MAX

typedef struct kvs__seg_alloc kvs__seg_alloc_t;

/* Creates an allocator over [0, capacity). capacity is rounded down to the alignment and must
 * hold at least one aligned unit. */
int kvs__seg_alloc_create(uint64_t capacity, kvs__seg_alloc_t **alloc_p);
void kvs__seg_alloc_destroy(kvs__seg_alloc_t *alloc);

/* Allocates `size` bytes (> 0). On success writes the offset and a handle for the free call.
 * Returns NO_AVAILABLE_HANDLE when no hole fits, NO_MEMORY when bookkeeping cannot grow,
 * INVALID_PARAMS for size 0. Nothing changes on failure. */
int kvs__seg_alloc_alloc(kvs__seg_alloc_t *alloc, uint64_t size, uint64_t *offset_p,
                         uint32_t *handle_p);
/* Allocates exactly [offset, offset + size) (offset aligned), for a new master rebuilding what
 * owners hold: INVALID_PARAMS when any of it is outside or taken. Claims made in ascending
 * order of offset cost O(1) each. */
int kvs__seg_alloc_claim(kvs__seg_alloc_t *alloc, uint64_t offset, uint64_t size,
                         uint32_t *handle_p);
/* Frees a handle from kvs__seg_alloc_alloc. Returns INVALID_PARAMS for a handle that is not
 * currently allocated (the allocator is left unchanged). */
int kvs__seg_alloc_free(kvs__seg_alloc_t *alloc, uint32_t handle);

uint64_t kvs__seg_alloc_capacity(const kvs__seg_alloc_t *alloc);
/* Bytes allocated, rounded up to the alignment per allocation. */
uint64_t kvs__seg_alloc_used(const kvs__seg_alloc_t *alloc);
uint64_t kvs__seg_alloc_largest_free(const kvs__seg_alloc_t *alloc);
/* Walks every block and checks the invariants (sizes add up, neighbours linked, no two free
 * neighbours, bins consistent). Returns OK or INTERNAL_ERROR. For tests. */
int kvs__seg_alloc_check(const kvs__seg_alloc_t *alloc);

#endif
