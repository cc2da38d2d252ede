/* Owner side: memfd-backed segments, the data server that serves reads and writes into them
 * over tcp, and the owner that mounts its segment with the master and keeps it alive. */
#ifndef KVS_OWNER_INT_H
#define KVS_OWNER_INT_H

#include "../common/metrics_int.h"
#include "../proto/net_int.h"

/* ---- segment memory ------------------------------------------------------------------- */

typedef struct {
    int fd;     /* memfd; shared with same-host readers later (shm transport) */
    void *base; /* MAP_SHARED mapping of the whole segment */
    uint64_t size;
} kvs__segment_mem_t;

/* Creates a memfd of `size` bytes and maps it read-write. Returns NO_MEMORY, IO_ERROR or
 * INVALID_PARAMS (size 0) on failure. */
int kvs__segment_mem_create(const char *name, uint64_t size, kvs__segment_mem_t *mem_p);
void kvs__segment_mem_destroy(kvs__segment_mem_t *mem);

/* ---- data server ---------------------------------------------------------------------- */

typedef struct {
    const char *bind_host;  /* default 127.0.0.1 */
    uint16_t port;          /* 0: any free port */
    uint32_t max_conns;     /* more open get ERROR NO_RESOURCE and are closed (default 1024) */
    uint64_t io_timeout_ms; /* a frame once begun must complete within this (default 5000) */
    const char *shm_dir;    /* where the same-host socket goes (NULL: KVS_SHM_DIR or the
                             * default; "": none) */

    /* What a silent or idle peer may cost (README: Limits). */
    uint64_t handshake_timeout_ms; /* from accept to HELLO on the tcp port, and to the end of a
                                    * same-host (shm) handshake; else closed (default 5000) */
    uint64_t idle_timeout_ms;      /* a tcp connection with no request this long is closed; the
                                    * tcp transport replaces it before its next transfer
                                    * (default 60000; 0: never) */
    const char *advertise_host;    /* the host readers reach us at (NULL: bind_host); with the port
                                    * it is the name our handshakes prove (kvs__data_server_name) */
    kvs__auth_t auth; /* peers of the tcp port and the shm socket must prove it, if on */
    bool tls;         /* TLS on the tcp port (needs auth); the owner's master calls too */
#ifdef KVS_TEST_HOOKS
    uint64_t inject_delay_us; /* stall this long before each data request (tests only; also
                               * KVS_DATA_INJECT_DELAY_US) */
#endif
} kvs__data_server_config_t;

void kvs__data_server_config_init(kvs__data_server_config_t *cfg);

typedef struct kvs__data_server kvs__data_server_t;

/* Listens and starts the accept thread; one thread serves each connection and ends with it.
 * Removes the same-host sockets of owners that are gone from the shm directory first. */
int kvs__data_server_create(const kvs__data_server_config_t *cfg, kvs__data_server_t **srv_p);
uint16_t kvs__data_server_port(const kvs__data_server_t *srv);
/* "advertise_host:port": the endpoint readers dial, which every handshake of this server
 * proves (so a relay on another endpoint cannot pass for it). */
const char *kvs__data_server_name(const kvs__data_server_t *srv);
/* Serves [base, base + size) as segment `segment_id`. Every request is checked against it. `fd`
 * (the segment's sealed memfd, borrowed) is handed to same-host readers; -1: tcp only.
 * `write_key` (copied) is the key the segment was mounted with: every tcp write must then carry
 * the capability (kvs__write_cap) of a range the master allocated, and lie inside it. NULL
 * (tests of the data path alone, with no master) accepts writes without one. `epoch` is the
 * master's capability epoch (from the MOUNT reply). */
int kvs__data_server_add(kvs__data_server_t *srv, uint64_t segment_id, void *base, uint64_t size,
                         int fd, const uint8_t *write_key, uint64_t epoch);
/* Stops serving a segment. Waits for the requests' memory steps in progress (one non-blocking
 * send or receive each), never for a peer: once it returns no request touches the memory,
 * and a read it cut short ends with its connection closed. */
int kvs__data_server_remove(kvs__data_server_t *srv, uint64_t segment_id);
/* Fences puts of a served segment: every write carrying one of `tokens` from now on is refused
 * (INVALID_WRITE), including the rest of a write in progress; only its memory step in progress
 * is waited for, never the peer. `epochs` (NULL: the segment's current one) are the puts'
 * capability epochs, which say when each fence may be forgotten. SEGMENT_NOT_FOUND when not
 * served. */
int kvs__data_server_fence(kvs__data_server_t *srv, uint64_t segment_id, const uint64_t *tokens,
                           const uint64_t *epochs, size_t n);
/* Replaces the segment's write key (a new leader master was told `write_key` at its MOUNT):
 * every capability made under the old key is refused from now on, including the rest of a
 * write in progress, and the old master's fences and epoch are forgotten for `epoch`. */
int kvs__data_server_rekey(kvs__data_server_t *srv, uint64_t segment_id, const uint8_t *write_key,
                           uint64_t epoch);
/* The master's capability epoch now (from a HEARTBEAT reply): capabilities older than the
 * previous epoch are refused from now on, and their fences forgotten. Never goes back. */
int kvs__data_server_epoch(kvs__data_server_t *srv, uint64_t segment_id, uint64_t epoch);
/* Requests and connections refused so far (every reason). */
uint64_t kvs__data_server_refused(const kvs__data_server_t *srv);

/* The data server's metrics, declared once: X(kind, unit, name, family, labels, help), exposed
 * as kvstash_owner_<family>[_bytes|_seconds][_total]{owner, labels}. Bytes over shm move without
 * the owner (readers map the segment): its shm requests are the handshakes that hand a segment
 * out, and the clients' metrics count the bytes. */
#define KVS_OWNER_METRICS(X)                                                                       \
    X(COUNTER, NONE, tcp_reads, requests, "transport=\"tcp\",op=\"read\"",                         \
      "Requests served, by transport and operation")                                               \
    X(COUNTER, NONE, tcp_writes, requests, "transport=\"tcp\",op=\"write\"", "")                   \
    X(COUNTER, NONE, shm_maps, requests, "transport=\"shm\",op=\"map\"", "")                       \
    X(COUNTER, BYTES, tcp_read_bytes, served, "transport=\"tcp\",op=\"read\"",                     \
      "Bytes served, by transport and operation")                                                  \
    X(COUNTER, BYTES, tcp_write_bytes, served, "transport=\"tcp\",op=\"write\"", "")               \
    X(HIST, NS, tcp_read_latency, request_latency, "transport=\"tcp\",op=\"read\"",                \
      "Time to serve a request, from its header to its last byte")                                 \
    X(HIST, NS, tcp_write_latency, request_latency, "transport=\"tcp\",op=\"write\"", "")          \
    X(HIST, NS, shm_map_latency, request_latency, "transport=\"shm\",op=\"map\"", "")              \
    X(GAUGE, NONE, tcp_connections, connections, "transport=\"tcp\"",                              \
      "Open connections (shm: handshakes in progress)")                                            \
    X(GAUGE, NONE, shm_connections, connections, "transport=\"shm\"", "")                          \
    X(GAUGE, NONE, segments, segments, "", "Segments served")                                      \
    X(GAUGE, BYTES, segment_bytes, segment, "", "Bytes of the segments served")                    \
    X(COUNTER, NONE, refused_protocol, refusals, "reason=\"protocol\"",                            \
      "Requests and connections refused, by reason")                                               \
    X(COUNTER, NONE, refused_auth, refusals, "reason=\"auth\"", "")                                \
    X(COUNTER, NONE, refused_tls, refusals, "reason=\"tls\"", "")                                  \
    X(COUNTER, NONE, refused_not_served, refusals, "reason=\"not_served\"", "")                    \
    X(COUNTER, NONE, refused_write, refusals, "reason=\"write_refused\"", "")                      \
    X(COUNTER, NONE, refused_range, refusals, "reason=\"bad_range\"", "")                          \
    X(COUNTER, NONE, refused_limit, refusals, "reason=\"too_many_connections\"", "")               \
    X(COUNTER, NONE, refused_no_resource, refusals, "reason=\"no_resource\"", "")                  \
    X(COUNTER, NONE, refused_internal, refusals, "reason=\"internal\"", "")

/* The table as descriptors (*n_p entries; tests check it). */
const kvs__metric_desc_t *kvs__data_server_metrics_table(size_t *n_p);
/* Writes the metrics of `n` data servers (each sample labelled with its owner), every family
 * once. */
int kvs__data_servers_metrics_write(kvs__data_server_t *const *ds, size_t n, kvs__text_t *t);
/* Renders one data server's metrics (a kvs__metrics_render_cb; `arg` is the data server). */
int kvs__data_server_metrics_render(void *arg, kvs__text_t *t);

/* Closes every connection, waits for every thread, removes its same-host socket, frees. NULL
 * is a no-op. */
void kvs__data_server_destroy(kvs__data_server_t *srv);

/* ---- owner ---------------------------------------------------------------------------- */

typedef struct {
    const char *master_host;
    uint16_t master_port;
    const char *segment_name; /* default "<node>:<data port>" */
    const char *node;         /* this host's name for same-node placement; NULL: gethostname() */
    uint64_t segment_size;
    const char *advertise_host; /* host readers use to reach the data port (default bind) */
    uint64_t rpc_timeout_ms;
    uint64_t heartbeat_max_ms; /* longest heartbeat period (0: KVS_OWNER_HEARTBEAT_MAX_MS) */
    uint64_t retry_min_ms;     /* first back-off after a failed heartbeat or mount (0: default) */
    /* High availability (docs/ha.md): follow the leader master named in etcd at these
     * endpoints (master_host/port are then unused). The owner keeps an index of its complete
     * objects (fed by the master) and re-registers the segment and the index with every new
     * leader, so the cache survives a failover; heartbeats come at least every
     * KVS_OWNER_HA_HEARTBEAT_MAX_MS unless heartbeat_max_ms says otherwise. */
    const char *etcd;
    const char *etcd_prefix;
    kvs__data_server_config_t data;
} kvs__owner_config_t;

/* The heartbeat period is a third of the master's heartbeat time-out, at most this: an owner
 * notices a restarted master at its next heartbeat, so this bounds the time to mount again. */
#define KVS_OWNER_HEARTBEAT_MAX_MS    500u
#define KVS_OWNER_RETRY_MIN_MS        20u
#define KVS_OWNER_HA_HEARTBEAT_MAX_MS 100u

typedef struct kvs__owner kvs__owner_t;

/* Creates the segment, starts the data server, mounts with the master and starts the
 * heartbeat thread (every third of the heartbeat time-out the master announced at the latest
 * HELLO, at most heartbeat_max_ms; remounts when the master has dropped the segment or
 * restarted, and the segment then starts empty; failed rounds are retried after a back-off of
 * retry_min_ms that doubles up to the period). */
int kvs__owner_create(const kvs__owner_config_t *cfg, kvs__owner_t **owner_p);
uint64_t kvs__owner_segment_id(const kvs__owner_t *o);
/* The name the segment is mounted under (valid until the owner is destroyed). */
const char *kvs__owner_name(const kvs__owner_t *o);
uint16_t kvs__owner_data_port(const kvs__owner_t *o);
kvs__data_server_t *kvs__owner_data_server(kvs__owner_t *o);
/* Objects in the owner's index (HA; 0 otherwise), and how many it re-registered with new
 * leaders so far. For tests and logs. */
size_t kvs__owner_index_size(kvs__owner_t *o);
uint64_t kvs__owner_recovered(kvs__owner_t *o);
/* Unmounts, stops the threads, unmaps. NULL is a no-op. */
void kvs__owner_destroy(kvs__owner_t *o);

#endif
