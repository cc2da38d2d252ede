/* The host-memory staging backend: registered host memory is its one domain (0), the buffer is
 * plain memory and the scatter is memcpy. Selected only by MC_STORE_GPU_STAGING_BACKEND=host, so
 * that CI runs the planner, fills, counters and failure paths without a GPU. */
#define _GNU_SOURCE
#include "staging_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int host_domain_of(int reg_domain)
{
    return reg_domain == KVS_DOMAIN_HOST ? 0 : -1;
}

static int host_alloc(int domain, uint64_t bytes, void **buf_p)
{
    KVS_UNUSED(domain);
    void *p = NULL;
    if (bytes > SIZE_MAX || posix_memalign(&p, 4096, (size_t)bytes) != 0)
        return KVS_NO_MEMORY;
    *buf_p = p;
    return KVS_OK;
}

static void host_free(int domain, void *buf)
{
    KVS_UNUSED(domain);
    free(buf);
}

/* The token of a stalled scatter (tests): it copies nothing, and only its deadline ends it. */
static char stalled;

static int host_scatter(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                        uint64_t deadline_ns, bool stall, void **done_p)
{
    KVS_UNUSED(domain);
    KVS_UNUSED(deadline_ns);
    if (done_p == NULL || src == NULL || (frags == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    *done_p = NULL; /* done by the time it returns */
    if (stall) {
        *done_p = &stalled;
        return KVS_OK;
    }
    const char *s = src;
    for (uint32_t i = 0; i < n; i++) {
        if (frags[i].dst != NULL)
            memcpy(frags[i].dst, s, (size_t)frags[i].len);
        s += frags[i].len;
    }
    return KVS_OK;
}

static int host_scatter_wait(int domain, void *done, uint64_t deadline_ns)
{
    KVS_UNUSED(domain);
    if (done == NULL)
        return KVS_OK;
    if (done != &stalled)
        return KVS_INVALID_PARAMS;
    /* A stalled copy behaves as the CUDA backend's kernel whose units never come: it waits for
     * its deadline, is aborted there having written nothing, and a call without a deadline
     * aborts it at once. */
    if (deadline_ns == 0 || deadline_ns == UINT64_MAX)
        return KVS_TRANSFER_FAIL;
    for (uint64_t now = kvs__now_ns(); now < deadline_ns; now = kvs__now_ns()) {
        uint64_t ns = KVS_MIN(deadline_ns - now, (uint64_t)1000000);
        struct timespec ts = {0, (long)ns};
        nanosleep(&ts, NULL);
    }
    return KVS_TIMED_OUT;
}

static int host_upload(int domain, void *dev, const void *host, size_t bytes)
{
    KVS_UNUSED(domain);
    if (dev == NULL || (host == NULL && bytes > 0))
        return KVS_INVALID_PARAMS;
    memcpy(dev, host, bytes);
    return KVS_OK;
}

static int host_scatter_pages(int domain, const void *src, const kvs__pt_plan_t *plan, uint32_t a,
                              uint32_t b, uint64_t first_unit, uint64_t end_unit, bool stall,
                              void **done_p)
{
    KVS_UNUSED(domain);
    KVS_UNUSED(first_unit);
    KVS_UNUSED(end_unit);
    if (done_p == NULL || src == NULL || plan == NULL || a >= b || b > plan->nkeys)
        return KVS_INVALID_PARAMS;
    *done_p = NULL;
    if (stall) {
        *done_p = &stalled;
        return KVS_OK;
    }
    kvs__pt_copy_host(src, plan, a, b);
    return KVS_OK;
}

/* The host backend's model: memcpy of 4 MiB (the scatter's rate) and of 256 pieces of 4 KiB
 * (the per-fragment cost); submissions and fills keep the defaults (nothing host-side to time). */
static int host_calibrate(int domain, kvs__staging_calib_t *cal)
{
    KVS_UNUSED(domain);
    const size_t len = 4u << 20, piece = 4096, n = 256;
    char *src = malloc(len), *dst = malloc(4 * len);
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return KVS_NO_MEMORY;
    }
    memset(src, 1, len);
    memset(dst, 0, 4 * len);
    uint64_t t0 = kvs__now_ns();
    memcpy(dst, src, len);
    uint64_t t1 = kvs__now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(dst + (i * 7919 % n) * 4 * piece, src + i * piece, piece);
    uint64_t t2 = kvs__now_ns();
    double per_byte = (double)KVS_MAX(t1 - t0, 1) / (double)len;
    cal->scatter_ns_per_byte = per_byte;
    cal->frag_ns = KVS_MAX((double)(t2 - t1) / (double)n - per_byte * (double)piece, 1.0);
    free(src);
    free(dst);
    return KVS_OK;
}

const kvs__staging_backend_t kvs__staging_backend_host = {
    .name = "host",
    .device_memory = false,
    .domain_of = host_domain_of,
    .alloc = host_alloc,
    .free = host_free,
    .scatter = host_scatter,
    .scatter_wait = host_scatter_wait,
    .upload = host_upload,
    .scatter_pages = host_scatter_pages,
    .calibrate = host_calibrate,
};
