/* The tcp transport: several connections per owner, requests split into chunks spread over
 * them, pipelined per connection, bytes streamed straight between socket and local memory. */
#ifndef KVS_TCP_INT_H
#define KVS_TCP_INT_H

#include "../transport_int.h"

typedef struct {
    uint32_t conns_per_peer; /* KVS_TCP_CONNECTIONS, default 8 */
    uint64_t chunk_bytes;    /* KVS_TCP_CHUNK_BYTES, default 2 MiB, at most 16 MiB */
    uint32_t window;         /* chunks in flight per connection, default 8 */
    uint64_t io_timeout_ms;  /* bound on each blocking socket step, default 5000 */
    kvs__auth_t auth;        /* the secret owners must prove (and we prove to them), if on */
    bool tls;                /* TLS on every connection (needs auth; owners must have it on) */
} kvs__tcp_config_t;

/* Defaults, then the environment variables named above. */
int kvs__tcp_config_init(kvs__tcp_config_t *cfg);
int kvs__tcp_transport_create(const kvs__tcp_config_t *cfg, kvs_transport_t **t_p);

#endif
