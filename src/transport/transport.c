/* Helpers shared by every transport. */
#include "transport_int.h"

#include <string.h>

uint64_t kvs__iov_total(const struct iovec *iov, uint32_t iovcnt)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len > UINT64_MAX - total)
            return UINT64_MAX;
        total += iov[i].iov_len;
    }
    return total;
}

/* Index of t in g->t[], adding it; -1 past KVS_XFER_MAX_TRANSPORTS. */
static int group_index(kvs__xfer_group_t *g, kvs_transport_t *t)
{
    for (uint32_t k = 0; k < g->nt; k++)
        if (g->t[k] == t)
            return (int)k;
    if (g->nt == KVS_XFER_MAX_TRANSPORTS)
        return -1;
    g->t[g->nt] = t;
    return (int)g->nt++;
}

int kvs__xfer_group_submit(kvs__xfer_group_t *g, const kvs_xfer_req_t *reqs,
                           kvs_transport_t *const *ts, uint32_t n, uint64_t deadline_ns)
{
    uint32_t count[KVS_XFER_MAX_TRANSPORTS] = {0};
    g->nt = 0;
    for (uint32_t r = 0; r < n; r++) {
        int k = group_index(g, ts[r]);
        if (k < 0)
            return kvs__fail(KVS_UNSUPPORTED, "a batch reads over more than %u transports",
                             KVS_XFER_MAX_TRANSPORTS);
        g->tk[r] = (uint8_t)k;
        count[k]++;
    }
    g->start[0] = 0;
    for (uint32_t k = 0; k < g->nt; k++)
        g->start[k + 1] = g->start[k] + count[k];
    uint32_t pos[KVS_XFER_MAX_TRANSPORTS];
    memcpy(pos, g->start, sizeof(pos));
    for (uint32_t r = 0; r < n; r++) { /* stable: each submission keeps the callers' order */
        uint32_t q = pos[g->tk[r]]++;
        g->sub[q] = reqs[r];
        g->back[q] = r;
    }
    for (uint32_t k = 0; k < g->nt; k++) {
        g->batch[k] = NULL;
        uint32_t m = g->start[k + 1] - g->start[k];
        if (g->t[k]->ops->submit(g->t[k], g->sub + g->start[k], m, deadline_ns, &g->batch[k]) !=
            KVS_OK) {
            g->batch[k] = NULL;
            for (uint32_t q = g->start[k]; q < g->start[k + 1]; q++)
                g->sub[q].status = KVS_NO_MEMORY;
        }
    }
    return KVS_OK;
}

void kvs__xfer_group_wait(kvs__xfer_group_t *g, kvs_xfer_req_t *reqs, uint64_t deadline_ns)
{
    for (uint32_t k = 0; k < g->nt; k++)
        if (g->batch[k] != NULL)
            g->t[k]->ops->wait(g->t[k], g->batch[k], deadline_ns);
    for (uint32_t q = 0; q < g->start[g->nt]; q++)
        reqs[g->back[q]].status = g->sub[q].status;
}
