/* Test fixture: a client of the public API with chosen protocol and time-outs. */
#ifndef KVS_CLIENT_FIXTURE_H
#define KVS_CLIENT_FIXTURE_H

#include "kvs_test.h"

#include <kvstash/kvstash.h>

/* Opens a client of `master` over `protocol` (NULL: the default) with 3 s time-outs. */
static inline kvs_client_t *client_open_protocol(const char *master, const char *protocol)
{
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    if (protocol != NULL)
        cfg.protocol = protocol;
    cfg.rpc_timeout_ms = 3000;
    cfg.transfer_timeout_ms = 3000;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    return c;
}

#endif
