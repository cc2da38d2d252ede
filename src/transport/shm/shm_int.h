/* The shm transport: same-host reads and writes straight from and to an owner's memfd segment.
 * The owner's data server passes the segment's descriptor over a unix-domain socket at a
 * filesystem path (never the abstract namespace, which is per network namespace); the reader
 * checks who sent it, maps it (read-only for reads; a second, writable mapping only once a
 * write needs it) and copies with memcpy. Same-host use is decided by reaching the socket and
 * receiving the descriptor of the very segment asked for, never by comparing host names. */
#ifndef KVS_SHM_INT_H
#define KVS_SHM_INT_H

#include "../transport_int.h"

/* Socket of the data server listening on tcp port `port`: "<dir>/data-<port>.sock". */
#define KVS_SHM_DEFAULT_DIR "/tmp/kvstash-shm"
int kvs__shm_socket_path(const char *dir, uint16_t port, char *out, size_t len);
/* KVS_SHM_DIR, else the default. */
const char *kvs__shm_dir(void);

/* The descriptor handshake on that socket (records shm_hello, shm_req and shm_rsp of the
 * schema, each of fixed length): the owner greets with its nonce; the reader asks for a segment
 * with its nonce and, where the owner has a secret, its proof; the owner answers with a status,
 * the segment's size, its own proof, and the memfd as SCM_RIGHTS when the status is OK. */
#define KVS_SHM_MAGIC     0x32535653u /* "VSS2": the authenticated layout */
#define KVS_SHM_HELLO_LEN (KVS__MIN_BYTES_shm_hello + KVS_AUTH_NONCE_LEN)
#define KVS_SHM_REQ_LEN   (KVS__MIN_BYTES_shm_req + KVS_AUTH_NONCE_LEN + KVS_AUTH_PROOF_LEN)
#define KVS_SHM_RSP_LEN   (KVS__MIN_BYTES_shm_rsp + KVS_AUTH_PROOF_LEN)

typedef struct {
    const char *dir;          /* where owners' sockets are (KVS_SHM_DIR) */
    kvs__auth_t auth;         /* the secret owners must prove (and we prove to them), if on */
    uint64_t io_timeout_ms;   /* bound on one handshake (default 2000) */
    uint64_t pin_chunk_bytes; /* GPU copies: mappings are registered in chunks this large
                               * (KVS_SHM_PIN_CHUNK_BYTES, default 256 MiB) */
    uint64_t pin_cap_bytes;   /* and at most this much in all (KVS_SHM_PIN_CAP_BYTES, 64 GiB);
                               * beyond it, copies read pageable memory */
} kvs__shm_config_t;

int kvs__shm_config_init(kvs__shm_config_t *cfg);
int kvs__shm_transport_create(const kvs__shm_config_t *cfg, kvs_transport_t **t_p);

/* Maps segment `segment_id` of the owner behind `ep` unless it already is: OK when this owner
 * is on this host and serves it, else why not (UNSUPPORTED: no socket or no descriptor;
 * SEGMENT_NOT_FOUND: the owner does not serve that id; TIMED_OUT: no answer before the
 * deadline). Cached, both ways, per segment (a time-out is not cached). */
int kvs__shm_map_segment(kvs_transport_t *t, kvs_endpoint_t *ep, uint64_t segment_id,
                         uint64_t deadline_ns);

/* Unmaps every segment whose id is not in ids[0..n) (their owner is gone), once no transfer
 * uses it any more. */
void kvs__shm_retain(kvs_transport_t *t, const uint64_t *ids, size_t n);
/* Segments currently mapped. */
size_t kvs__shm_mapped(kvs_transport_t *t);

#endif
