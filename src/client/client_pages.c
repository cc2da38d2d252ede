/* Page-table reads and writes (client.h): regions named once, page ids per key. They are
 * expanded into the fragments of the multi-buffer calls, so every rule of those (planning,
 * staging, grouping, results) applies unchanged. */
#define _GNU_SOURCE
#include "client_int.h"

#include <string.h>

/* Fragments of one call at most (16 bytes each while the call runs). */
#define MAX_FRAGMENTS (1ull << 26)

/* The fragments of a call: one kvs_buf_t per page and region, key after key. */
typedef struct {
    kvs_buf_t *frags;
    const kvs_buf_t **bufs;
    size_t *nbufs;
} pages_t;

static void pages_free(pages_t *p)
{
    kvs__free(p->frags);
    kvs__free(p->bufs);
    kvs__free(p->nbufs);
}

/* Checks the arguments and builds the fragments. KVS_INVALID_PARAMS (with the reason) before
 * any I/O. */
static int pages_build(const char *op, size_t n, const kvs_page_region_t regions[], size_t nregions,
                       kvs_page_order_t order, const uint32_t page_ids[], const size_t npages[],
                       pages_t *p)
{
    memset(p, 0, sizeof(*p));
    if (n == 0 || n > KVS_MAX_BATCH || regions == NULL || nregions == 0 || nregions > 4096 ||
        npages == NULL || (order != KVS_PAGE_MAJOR && order != KVS_REGION_MAJOR))
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: 1..%u keys, 1..4096 regions, page counts and an order "
                         "(KVS_PAGE_MAJOR or KVS_REGION_MAJOR) are required",
                         op, KVS_MAX_BATCH);
    uint64_t min_pages = UINT64_MAX;
    for (size_t r = 0; r < nregions; r++) {
        const kvs_page_region_t *g = &regions[r];
        if (g->base == NULL || g->page_bytes == 0 || g->stride < g->page_bytes || g->npages == 0 ||
            g->page_bytes > UINTPTR_MAX - (uintptr_t)g->base ||
            g->stride > (UINTPTR_MAX - (uintptr_t)g->base - g->page_bytes) / g->npages)
            return kvs__fail(KVS_INVALID_PARAMS,
                             "%s: region %zu wants a base, page_bytes >= 1, stride >= "
                             "page_bytes and npages >= 1 within the address space",
                             op, r);
        min_pages = KVS_MIN(min_pages, g->npages);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (npages[i] == 0 || npages[i] > MAX_FRAGMENTS / nregions)
            return kvs__fail(KVS_INVALID_PARAMS, "%s: key %zu has %zu pages (1..%llu)", op, i,
                             npages[i], (unsigned long long)(MAX_FRAGMENTS / nregions));
        total += npages[i];
    }
    if (total * nregions > MAX_FRAGMENTS)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: %llu fragments in one call (at most %llu)", op,
                         (unsigned long long)(total * nregions), (unsigned long long)MAX_FRAGMENTS);
    if (page_ids == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: page ids are required", op);
    for (uint64_t j = 0; j < total; j++)
        if (page_ids[j] >= min_pages) {
            uint64_t key = 0, seen = npages[0];
            while (j >= seen)
                seen += npages[++key];
            return kvs__fail(KVS_INVALID_PARAMS,
                             "%s: key %llu names page %u, but a region has only %llu pages", op,
                             (unsigned long long)key, page_ids[j], (unsigned long long)min_pages);
        }
    p->frags = kvs__malloc(total * nregions * sizeof(*p->frags));
    p->bufs = kvs__malloc(n * sizeof(*p->bufs));
    p->nbufs = kvs__malloc(n * sizeof(*p->nbufs));
    if (p->frags == NULL || p->bufs == NULL || p->nbufs == NULL) {
        pages_free(p);
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory for %llu fragments", op,
                         (unsigned long long)(total * nregions));
    }
    kvs_buf_t *f = p->frags;
    const uint32_t *ids = page_ids;
    for (size_t i = 0; i < n; i++) {
        p->bufs[i] = f;
        p->nbufs[i] = npages[i] * nregions;
        size_t outer = order == KVS_PAGE_MAJOR ? npages[i] : nregions;
        size_t inner = order == KVS_PAGE_MAJOR ? nregions : npages[i];
        for (size_t a = 0; a < outer; a++) {
            for (size_t b = 0; b < inner; b++) {
                size_t pg = order == KVS_PAGE_MAJOR ? a : b, r = order == KVS_PAGE_MAJOR ? b : a;
                const kvs_page_region_t *g = &regions[r];
                *f++ = (kvs_buf_t){(char *)g->base + (size_t)ids[pg] * g->stride, g->page_bytes};
            }
        }
        ids += npages[i];
    }
    return KVS_OK;
}

/* Every region whole in one registered buffer (its npages pages, not only those named), so that
 * a region that overstates its memory is refused for the call before any I/O. */
static int regions_registered(kvs_client_t *c, const char *op, const kvs_page_region_t regions[],
                              size_t nregions)
{
    for (size_t r = 0; r < nregions; r++) {
        const kvs_page_region_t *g = &regions[r];
        size_t span = (size_t)(g->npages - 1) * g->stride + g->page_bytes;
        if (kvs_client_buffer_domain(c, g->base, span) == KVS_INVALID_PARAMS)
            return kvs__fail(KVS_INVALID_PARAMS,
                             "%s: region %zu (%zu bytes at %p) is not whole in one registered "
                             "buffer",
                             op, r, span, g->base);
    }
    return KVS_OK;
}

int kvs_client_batch_get_into_pages(kvs_client_t *c, size_t n, const char *const keys[],
                                    const kvs_page_region_t regions[], size_t nregions,
                                    kvs_page_order_t order, const uint32_t page_ids[],
                                    const size_t npages[], bool prefer_alloc_in_same_node,
                                    int64_t results[])
{
    if (c == NULL || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_get_into_pages: a client, keys and results are required");
    pages_t p;
    int rc = pages_build("batch_get_into_pages", n, regions, nregions, order, page_ids, npages, &p);
    if (rc != KVS_OK)
        return rc;
    rc = regions_registered(c, "batch_get_into_pages", regions, nregions);
    if (rc != KVS_OK) {
        pages_free(&p);
        return rc;
    }
    rc = kvs_client_batch_get_into_multi_buffers(c, n, keys, p.bufs, p.nbufs,
                                                 prefer_alloc_in_same_node, results);
    pages_free(&p);
    return rc;
}

int kvs_client_batch_put_from_pages(kvs_client_t *c, size_t n, const char *const keys[],
                                    const kvs_page_region_t regions[], size_t nregions,
                                    kvs_page_order_t order, const uint32_t page_ids[],
                                    const size_t npages[], const kvs_replicate_config_t *rc,
                                    int results[])
{
    if (c == NULL || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_put_from_pages: a client, keys and results are required");
    pages_t p;
    int r = pages_build("batch_put_from_pages", n, regions, nregions, order, page_ids, npages, &p);
    if (r != KVS_OK)
        return r;
    r = regions_registered(c, "batch_put_from_pages", regions, nregions);
    if (r != KVS_OK) {
        pages_free(&p);
        return r;
    }
    r = kvs_client_batch_put_from_multi(c, n, keys, p.bufs, p.nbufs, rc, results);
    pages_free(&p);
    return r;
}
