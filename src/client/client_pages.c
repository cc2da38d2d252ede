/* Page-table reads and writes (client.h): regions named once, page ids per key. They are
 * checked here; reads then run through the read pipeline in page-table form (client_io.c: staged
 * reads hand the page ids to the scatter, direct ones expand them into fragments), writes through
 * the multi-buffer put with the fragments expanded. Every rule of the multi-buffer calls
 * (staging, grouping, results) applies unchanged. */
#define _GNU_SOURCE
#include "client_int.h"

#include <string.h>

/* Fragments of one call at most (16 bytes each while the call runs). */
#define MAX_FRAGMENTS (1ull << 26)

/* Checks a page-table call's arguments. KVS_INVALID_PARAMS (with the reason) before any I/O.
 * *pages_p: the call's page ids in all; *max_id_p the largest. */
static int pages_check(const char *op, size_t n, const kvs_page_region_t regions[], size_t nregions,
                       kvs_page_order_t order, const uint32_t page_ids[], const size_t npages[],
                       uint64_t *pages_p, uint64_t *max_id_p)
{
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
    uint32_t max_id = kvs__pt_ids_max(page_ids, total);
    for (uint64_t j = 0; max_id >= min_pages && j < total; j++)
        if (page_ids[j] >= min_pages) {
            uint64_t key = 0, seen = npages[0];
            while (j >= seen)
                seen += npages[++key];
            return kvs__fail(KVS_INVALID_PARAMS,
                             "%s: key %llu names page %u, but a region has only %llu pages", op,
                             (unsigned long long)key, page_ids[j], (unsigned long long)min_pages);
        }
    *pages_p = total;
    *max_id_p = max_id;
    return KVS_OK;
}

bool kvs__pages_fragments(const kvs__page_layout_t *L, const uint32_t *ids, size_t npages,
                          struct iovec *out)
{
    bool pm = L->order == KVS_PAGE_MAJOR;
    size_t outer = pm ? npages : L->nregions, inner = pm ? L->nregions : npages;
    for (size_t a = 0; a < outer; a++) {
        for (size_t b = 0; b < inner; b++) {
            const kvs_page_region_t *g = &L->regions[pm ? b : a];
            uint32_t id = ids[pm ? a : b]; /* read once: the check holds for the address made */
            if (id > L->max_id)            /* as checked: the caller may have changed them since */
                return false;
            *out++ = (struct iovec){(char *)g->base + (size_t)id * g->stride, g->page_bytes};
        }
    }
    return true;
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
    const char *op = "batch_get_into_pages";
    if (c == NULL || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: a client, keys and results are required", op);
    uint64_t t0 = kvs__now_ns(), pages, max_id;
    int rc = pages_check(op, n, regions, nregions, order, page_ids, npages, &pages, &max_id);
    if (rc != KVS_OK)
        return rc;
    kvs__page_layout_t L = {regions, (uint32_t)nregions, order, max_id};
    return kvs__get_pages(c, op, n, keys, &L, page_ids, npages, prefer_alloc_in_same_node, t0,
                          results);
}

int kvs_client_batch_put_from_pages(kvs_client_t *c, size_t n, const char *const keys[],
                                    const kvs_page_region_t regions[], size_t nregions,
                                    kvs_page_order_t order, const uint32_t page_ids[],
                                    const size_t npages[], const kvs_replicate_config_t *rc,
                                    int results[])
{
    const char *op = "batch_put_from_pages";
    if (c == NULL || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: a client, keys and results are required", op);
    uint64_t pages, max_id;
    int r = pages_check(op, n, regions, nregions, order, page_ids, npages, &pages, &max_id);
    if (r == KVS_OK)
        r = regions_registered(c, op, regions, nregions);
    if (r != KVS_OK)
        return r;
    kvs__page_layout_t L = {regions, (uint32_t)nregions, order, max_id};
    size_t nf = (size_t)pages * nregions;
    struct iovec *iov = kvs__malloc(nf * sizeof(*iov));
    kvs_buf_t *frags = kvs__malloc(nf * sizeof(*frags));
    const kvs_buf_t **bufs = kvs__malloc(n * sizeof(*bufs));
    size_t *nbufs = kvs__malloc(n * sizeof(*nbufs));
    if (iov == NULL || frags == NULL || bufs == NULL || nbufs == NULL) {
        r = kvs__fail(KVS_NO_MEMORY, "%s: out of memory for %zu fragments", op, nf);
    } else {
        const uint32_t *ids = page_ids;
        for (size_t i = 0, f = 0; i < n; ids += npages[i++]) {
            if (!kvs__pages_fragments(&L, ids, npages[i], iov + f)) {
                r = kvs__fail(KVS_INVALID_PARAMS, "%s: page ids changed during the call", op);
                goto out;
            }
            bufs[i] = frags + f;
            nbufs[i] = npages[i] * nregions;
            for (size_t j = 0; j < nbufs[i]; j++, f++)
                frags[f] = (kvs_buf_t){iov[f].iov_base, iov[f].iov_len};
        }
        r = kvs_client_batch_put_from_multi(c, n, keys, bufs, nbufs, rc, results);
    }
out:
    kvs__free(iov);
    kvs__free(frags);
    kvs__free(bufs);
    kvs__free(nbufs);
    return r;
}
