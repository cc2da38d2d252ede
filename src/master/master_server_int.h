/* The master's network service: one event-loop thread (epoll) that decodes frames, calls the
 * state machine and writes responses. A peer that sends garbage loses its own connection and
 * nothing else. */
#ifndef KVS_MASTER_SERVER_INT_H
#define KVS_MASTER_SERVER_INT_H

#include "master_int.h"
#include "../proto/net_int.h"

typedef struct {
    const char *bind_host;         /* default "127.0.0.1" */
    uint16_t port;                 /* 0: any free port (see kvs__master_server_port) */
    uint32_t max_payload;          /* largest request accepted once the handshake is done (default
                                    * 64 MiB; before it, KVS_HANDSHAKE_MAX_PAYLOAD at most) */
    uint32_t max_conns;            /* a connection beyond this many open gets an ERROR NO_RESOURCE
                                    * frame ("too many connections") and is closed (default 4096) */
    uint64_t handshake_timeout_ms; /* a connection that has not completed its handshake this
                                    * long after it was accepted is closed (default 5000) */
    uint64_t idle_timeout_ms; /* a connection past its handshake that sends no request this long
                               * is closed; clients replace such a connection before their next
                               * call, owners heartbeat every 500 ms at most (default 600000;
                               * 0: never) */
    uint64_t tick_ms;         /* how often time-driven work runs (default 100) */
    uint64_t pause_ms;        /* the loop not running this long is a pause: the master's clock
                               * skips it and owners get a new heartbeat time-out (0: a quarter
                               * of the heartbeat time-out, at most 1 s, at least two ticks) */
    uint64_t probe_ms;        /* a MOUNT of a taken name whose owner has no connection waits this
                               * long at most for a connect to the old owner's data endpoint: if
                               * it is refused, the old registration is replaced (default 1000) */
    /* High availability (docs/ha.md): a leader candidate on etcd at these endpoints
     * ("HOST:PORT[,...]"; NULL: this master serves alone). Only the leader serves; standbys
     * answer NOT_LEADER with the leader's address. */
    const char *etcd;
    const char *etcd_prefix;     /* NULL: KVS_ETCD_DEFAULT_PREFIX */
    const char *advertise;       /* "HOST:PORT" the leader record gives clients (default
                                  * bind_host:port; required when bound to a wildcard) */
    uint64_t etcd_ttl_s;         /* the leader's lease TTL (default 2) */
    uint64_t etcd_poll_ms;       /* how often a standby reads the leader key (default 50) */
    uint64_t recovery_ms;        /* after taking office, clients wait this long for owners to
                                  * re-register (default 300) */
    uint64_t index_wait_ms;      /* a PUT_END reply waits this long at most for the owners to
                                  * index its objects (default 1000) */
    uint64_t metrics_timeout_ms; /* a scrape waits this long for the loop (default 2000) */
    kvs__auth_t auth;            /* peers must prove this secret at HELLO (AUTH), if on */
    bool tls;                    /* TLS on every connection (needs auth) */
    kvs__master_config_t master;
} kvs__master_server_config_t;

/* Defaults and the master's environment variables. */
int kvs__master_server_config_init(kvs__master_server_config_t *cfg);

typedef struct kvs__master_server kvs__master_server_t;

/* Binds and listens; nothing is served until run or start. */
int kvs__master_server_create(const kvs__master_server_config_t *cfg,
                              kvs__master_server_t **server_p);
uint16_t kvs__master_server_port(const kvs__master_server_t *s);
/* Serves on the calling thread until kvs__master_server_stop. */
int kvs__master_server_run(kvs__master_server_t *s);
/* Serves on a new thread (embedded master). */
int kvs__master_server_start(kvs__master_server_t *s);
/* Asks the loop to return. Async-signal-safe: only writes to an eventfd. */
void kvs__master_server_stop(kvs__master_server_t *s);
/* Renders the master's metrics (a kvs__metrics_render_cb; `arg` is the server): asks the loop,
 * which must be running, and waits up to metrics_timeout_ms for it (else KVS_TIMED_OUT). */
int kvs__master_server_metrics_render(void *arg, kvs__text_t *t);
/* Stops (if started), joins, closes every connection and frees. NULL is a no-op. */
void kvs__master_server_destroy(kvs__master_server_t *s);

#endif
