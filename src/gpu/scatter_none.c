/* The scatter module of builds without CUDA: every call says so. */
#include "scatter.h"

#include "../common/common_int.h"

bool kvs__scatter_built(void)
{
    return false;
}

int kvs__scatter_create(const kvs__scatter_config_t *cfg, kvs__scatter_t **s_p)
{
    KVS_UNUSED(cfg);
    KVS_UNUSED(s_p);
    return KVS_UNSUPPORTED;
}

int kvs__scatter_launch(kvs__scatter_t *s, const void *src, const kvs__scatter_frag_t *frags,
                        uint32_t n, void *stream)
{
    KVS_UNUSED(s);
    KVS_UNUSED(src);
    KVS_UNUSED(frags);
    KVS_UNUSED(n);
    KVS_UNUSED(stream);
    return KVS_UNSUPPORTED;
}

void kvs__scatter_stats(const kvs__scatter_t *s, kvs__scatter_stats_t *out)
{
    KVS_UNUSED(s);
    if (out != NULL)
        *out = (kvs__scatter_stats_t){0, 0, 0};
}

void kvs__scatter_destroy(kvs__scatter_t *s)
{
    KVS_UNUSED(s);
}

int kvs__scatter_launch_opts(kvs__scatter_t *s, const void *src, const kvs__scatter_frag_t *frags,
                             uint32_t n, void *stream, const kvs__scatter_opts_t *opts,
                             kvs__scatter_ticket_t *ticket_p)
{
    KVS_UNUSED(s);
    KVS_UNUSED(src);
    KVS_UNUSED(frags);
    KVS_UNUSED(n);
    KVS_UNUSED(stream);
    KVS_UNUSED(opts);
    if (ticket_p != NULL)
        *ticket_p = (kvs__scatter_ticket_t){0, {0, 0}, {0, 0}};
    return KVS_UNSUPPORTED;
}

int kvs__scatter_abort(kvs__scatter_t *s, const kvs__scatter_ticket_t *t)
{
    KVS_UNUSED(s);
    KVS_UNUSED(t);
    return KVS_UNSUPPORTED;
}

kvs__scatter_end_t kvs__scatter_result(const kvs__scatter_t *s, const kvs__scatter_ticket_t *t)
{
    KVS_UNUSED(s);
    KVS_UNUSED(t);
    return KVS_SCATTER_UNKNOWN;
}

int kvs__scatter_pages_launch(kvs__scatter_t *s, const void *src, const struct kvs__pt_plan *plan,
                              uint32_t a, uint32_t b, uint64_t first_unit, uint64_t end_unit,
                              void *stream)
{
    KVS_UNUSED(s);
    KVS_UNUSED(src);
    KVS_UNUSED(plan);
    KVS_UNUSED(a);
    KVS_UNUSED(b);
    KVS_UNUSED(first_unit);
    KVS_UNUSED(end_unit);
    KVS_UNUSED(stream);
    return KVS_UNSUPPORTED;
}
