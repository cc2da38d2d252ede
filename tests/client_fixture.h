/* Test fixture: a client of the public API with chosen protocol and time-outs. */
#ifndef KVS_CLIENT_FIXTURE_H
#define KVS_CLIENT_FIXTURE_H

#include "kvs_test.h"

#include <kvstash/kvstash.h>

/* Opens a client of `master` over `protocol` (NULL: the default) with these time-outs. */
static inline kvs_client_t *client_open_timeouts(const char *master, const char *protocol,
                                                 uint64_t rpc_ms, uint64_t transfer_ms)
{
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    if (protocol != NULL)
        cfg.protocol = protocol;
    cfg.rpc_timeout_ms = rpc_ms;
    cfg.transfer_timeout_ms = transfer_ms;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    return c;
}

/* The same with 3 s time-outs. */
static inline kvs_client_t *client_open_protocol(const char *master, const char *protocol)
{
    return client_open_timeouts(master, protocol, 3000, 3000);
}

#endif
