/* Test helpers: one master counter, or a segment's id, through a STAT request. */
#ifndef KVS_RPC_HELPERS_H
#define KVS_RPC_HELPERS_H

#include "kvs_test.h"
#include "proto/net_int.h"

/* One STAT: a counter by name (`seg` NULL), or the id of the segment named `seg`. */
static inline uint64_t rpc_stat_lookup(kvs__rpc_t *rpc, const char *name, const char *seg)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(rpc, &req, KVS_MSG_STAT);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__stat_rsp_t st;
    CHECK_STATUS(kvs__stat_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &st), KVS_OK);
    uint64_t v = UINT64_MAX;
    for (uint32_t i = 0; seg == NULL && i < st.ncounters; i++) {
        if (kvs__str_eq(st.counters[i].name, kvs__str_c(name)))
            v = st.counters[i].value;
    }
    for (uint32_t i = 0; seg != NULL && i < st.nsegs; i++) {
        if (kvs__str_eq(st.segs[i].name, kvs__str_c(seg)))
            v = st.segs[i].id;
    }
    CHECK(v != UINT64_MAX);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return v;
}

static inline uint64_t rpc_stat_counter(kvs__rpc_t *rpc, const char *name)
{
    return rpc_stat_lookup(rpc, name, NULL);
}

static inline uint64_t rpc_stat_segment_id(kvs__rpc_t *rpc, const char *seg)
{
    return rpc_stat_lookup(rpc, NULL, seg);
}

#endif
