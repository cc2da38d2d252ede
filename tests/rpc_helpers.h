/* Test helper: read one master counter through a STAT request. */
#ifndef KVS_RPC_HELPERS_H
#define KVS_RPC_HELPERS_H

#include "kvs_test.h"
#include "proto/net_int.h"

static inline uint64_t rpc_stat_counter(kvs__rpc_t *rpc, const char *name)
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
    for (uint32_t i = 0; i < st.ncounters; i++) {
        if (kvs__str_eq(st.counters[i].name, kvs__str_c(name)))
            v = st.counters[i].value;
    }
    CHECK(v != UINT64_MAX);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return v;
}

#endif
