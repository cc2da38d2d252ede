/* The page-table scatter (issue 30): a staged read in page-table form is scattered from a plan
 * that names each key's page ids (4 bytes a page) and the call's regions once, instead of one
 * 16-byte work unit per fragment written by the host. The plan is built once per call and
 * uploaded with one copy; each fill's launch names a range of its keys. The unit mapping below is
 * shared by the CUDA kernel (scatter.cu) and the host backend, so CI tests the same arithmetic
 * the GPU runs. Plain C, also compiled as CUDA C++. */
#ifndef KVS_GPU_SCATTER_PAGES_H
#define KVS_GPU_SCATTER_PAGES_H

#include "kvstash/client.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define KVS_PT_HD __host__ __device__ __forceinline__
#else
#define KVS_PT_HD static inline
#endif

/* The largest piece of a page one unit copies: longer pages are cut into slices of this size. */
#define KVS_PT_SLICE_BYTES (64u << 10)
/* Slices of one page row (every region's page, cut) at most; larger layouts take the fragment
 * path. */
#define KVS_PT_MAX_SLICES 8192u

/* The order of a key's bytes in the staging buffer, as kvs_page_order_t. */
#define KVS_PT_PAGE_MAJOR   0u
#define KVS_PT_REGION_MAJOR 1u

typedef struct {
    uint64_t base;   /* device (or host) address of page 0 */
    uint64_t stride; /* bytes from one page to the next */
    uint64_t page_bytes;
} kvs__pt_region_t;

/* A piece of one region's page: bytes [off, off + len) of that page. `pre` is the page bytes of
 * the regions before it (its offset within a page row in page-major order, and, times a key's
 * page count, the offset of the region's pages within the key in region-major order). */
typedef struct {
    uint32_t region, off, len, pad;
    uint64_t pre;
} kvs__pt_slice_t;

/* One key of the plan: its bytes start at src_off in the source, its page ids at ids[ids_off],
 * and its units are [unit_start, next key's unit_start). The plan's key table has one more
 * entry than keys, whose unit_start ends the last key. */
typedef struct {
    uint64_t src_off;
    uint64_t unit_start;
    uint64_t ids_off;
    uint64_t npages;
} kvs__pt_key_t;

/* A plan as a launch reads it: every pointer in the memory the scatter runs in. */
typedef struct kvs__pt_plan {
    const kvs__pt_region_t *regions;
    const kvs__pt_slice_t *slices;
    const kvs__pt_key_t *keys; /* nkeys + 1 entries */
    const uint32_t *ids;
    uint32_t nregions, nslices, nkeys, order;
    uint64_t row_bytes; /* page bytes of every region summed: one page's share of a key */
} kvs__pt_plan_t;

/* Unit `local` of key `k` (0 <= local < npages * nslices): where it goes, where it comes from in
 * the source, and its length. Page-major keys run slice by slice within a page; region-major ones
 * page by page within a slice, so neighbouring units read neighbouring page ids. */
KVS_PT_HD void kvs__pt_unit(const kvs__pt_plan_t *p, const kvs__pt_key_t *k, uint64_t local,
                            uint64_t *dst, uint64_t *src, uint32_t *len)
{
    uint64_t page, q;
    if (p->order == KVS_PT_PAGE_MAJOR) {
        page = local / p->nslices;
        q = local - page * p->nslices;
    } else {
        q = local / k->npages;
        page = local - q * k->npages;
    }
    const kvs__pt_slice_t *s = &p->slices[q];
    const kvs__pt_region_t *g = &p->regions[s->region];
    uint64_t id = p->ids[k->ids_off + page];
    *dst = g->base + id * g->stride + s->off;
    *src = k->src_off + s->off +
           (p->order == KVS_PT_PAGE_MAJOR ? page * p->row_bytes + s->pre
                                          : s->pre * k->npages + page * g->page_bytes);
    *len = s->len;
}

/* The key of keys[a, b) that holds unit u (keys[a].unit_start <= u < keys[b].unit_start). */
KVS_PT_HD uint32_t kvs__pt_key_of(const kvs__pt_plan_t *p, uint32_t a, uint32_t b, uint64_t u)
{
    while (b - a > 1) {
        uint32_t m = a + (b - a) / 2;
        if (p->keys[m].unit_start <= u)
            a = m;
        else
            b = m;
    }
    return a;
}

/* ---- building plans (staging_pages.c) -------------------------------------------------------- */

/* A page-table read's destinations (client.h), named once for the call. */
typedef struct {
    const kvs_page_region_t *regions;
    uint32_t nregions;
    kvs_page_order_t order;
    uint64_t max_id; /* no page id of the call is larger (found while the ids were checked) */
} kvs__page_layout_t;

/* One key's pages: its page ids in the layout. */
typedef struct {
    const uint32_t *ids;
    uint64_t npages;
} kvs__pt_pages_t;

/* Slices of one page row and its bytes. UNSUPPORTED when a page is 4 GiB or more or the row
 * needs more than KVS_PT_MAX_SLICES slices (the call then takes the fragment form). */
int kvs__pt_slices(const kvs__page_layout_t *L, uint32_t *nslices_p, uint64_t *row_p);
/* Bytes of the plan blob for n keys, key i's pages at (char *)keys + i * stride (so that the
 * keys may be members of larger records). */
size_t kvs__pt_plan_bytes(const kvs__page_layout_t *L, uint32_t nslices,
                          const kvs__pt_pages_t *keys, size_t stride, uint32_t n);
/* Writes the plan of the n keys (key i's bytes at off[i] of its fill's source) into `blob`, and
 * in *plan its tables' addresses once the blob is copied to `at_base`. INVALID_PARAMS (the plan
 * unusable) when an id is above L->max_id: the ids changed after the call checked them. */
int kvs__pt_plan_build(const kvs__page_layout_t *L, uint32_t nslices, uint64_t row,
                       const kvs__pt_pages_t *keys, size_t stride, uint32_t n, const uint64_t *off,
                       void *blob, uintptr_t at_base, kvs__pt_plan_t *plan);
/* The largest of n page ids (0 for none). */
uint32_t kvs__pt_ids_max(const uint32_t *ids, uint64_t n);
/* Copies keys [a, b) of a plan in host memory from src, as the kernel would (host backend). */
void kvs__pt_copy_host(const void *src, const kvs__pt_plan_t *p, uint32_t a, uint32_t b);

#ifdef __cplusplus
}
#endif
#endif
