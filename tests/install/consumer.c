/* Built against an installed kvstash only: checks that the headers and library are usable. */
#include <kvstash/kvstash.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = "127.0.0.1:1"; /* nothing listens: open must fail cleanly */
    cfg.rpc_timeout_ms = 200;
    kvs_client_t *c = NULL;
    int rc = kvs_client_open(&cfg, &c);
    printf("kvstash %s: open -> %s (%s)\n", KVS_VERSION_STRING, kvs_status_name(rc),
           kvs_last_error());
    return rc == KVS_RPC_FAIL && c == NULL && strlen(kvs_last_error()) > 0 ? 0 : 1;
}
