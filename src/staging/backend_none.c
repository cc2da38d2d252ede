/* The staging backend of builds without a GPU one: no memory is its domain, so every call
 * takes the direct path (counted as other_domain). */
#include "staging_int.h"

static int none_domain_of(int reg_domain)
{
    KVS_UNUSED(reg_domain);
    return -1;
}

static int none_alloc(int domain, uint64_t bytes, void **buf_p)
{
    KVS_UNUSED(domain);
    KVS_UNUSED(bytes);
    KVS_UNUSED(buf_p);
    return KVS_UNSUPPORTED;
}

static void none_free(int domain, void *buf)
{
    KVS_UNUSED(domain);
    KVS_UNUSED(buf);
}

static int none_scatter(int domain, const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                        uint64_t deadline_ns, bool stall, void **done_p)
{
    if (done_p != NULL)
        *done_p = NULL;
    KVS_UNUSED(deadline_ns);
    KVS_UNUSED(stall);
    KVS_UNUSED(domain);
    KVS_UNUSED(src);
    KVS_UNUSED(frags);
    KVS_UNUSED(n);
    return KVS_UNSUPPORTED;
}

static int none_scatter_wait(int domain, void *done, uint64_t deadline_ns)
{
    KVS_UNUSED(deadline_ns);
    KVS_UNUSED(domain);
    KVS_UNUSED(done);
    return KVS_UNSUPPORTED;
}

static int none_upload(int domain, void *dev, const void *host, size_t bytes)
{
    KVS_UNUSED(domain);
    KVS_UNUSED(dev);
    KVS_UNUSED(host);
    KVS_UNUSED(bytes);
    return KVS_UNSUPPORTED;
}

static int none_scatter_pages(int domain, const void *src, const kvs__pt_plan_t *plan, uint32_t a,
                              uint32_t b, uint64_t first_unit, uint64_t end_unit, bool stall,
                              void **done_p)
{
    if (done_p != NULL)
        *done_p = NULL;
    KVS_UNUSED(domain);
    KVS_UNUSED(src);
    KVS_UNUSED(plan);
    KVS_UNUSED(a);
    KVS_UNUSED(b);
    KVS_UNUSED(first_unit);
    KVS_UNUSED(end_unit);
    KVS_UNUSED(stall);
    return KVS_UNSUPPORTED;
}

const kvs__staging_backend_t kvs__staging_backend_none = {
    .name = "none",
    .device_memory = false,
    .domain_of = none_domain_of,
    .alloc = none_alloc,
    .free = none_free,
    .scatter = none_scatter,
    .scatter_wait = none_scatter_wait,
    .upload = none_upload,
    .scatter_pages = none_scatter_pages,
};
