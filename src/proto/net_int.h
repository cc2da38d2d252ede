/* Socket helpers with deadlines, and a blocking RPC connection to the master. */
#ifndef KVS_NET_INT_H
#define KVS_NET_INT_H

#include "proto_int.h"

#include <sys/types.h>

/* Listens on host:port (port 0 picks a free one). Returns the fd or a negative status. */
int kvs__tcp_listen(const char *host, uint16_t port, int backlog);
/* The local port a socket is bound to, 0 on error. */
uint16_t kvs__sock_port(int fd);
/* Connects with a deadline (absolute, kvs__now_ns() clock). Returns fd or negative status:
 * TIMED_OUT, RPC_FAIL (refused or unreachable), INVALID_PARAMS (unresolvable host). */
int kvs__tcp_connect(const char *host, uint16_t port, uint64_t deadline_ns);
int kvs__set_nonblock(int fd, bool on);
/* Sends or receives exactly `len` bytes before the deadline. IO_ERROR when the peer closed or
 * failed, TIMED_OUT at the deadline. The socket must be non-blocking. */
int kvs__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
int kvs__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns);

/* A connection to the master. One call at a time (calls serialise on an internal lock). */
typedef struct kvs__rpc kvs__rpc_t;

typedef struct {
    const char *host;
    uint16_t port;
    const char *node;    /* this client's host name; NULL: gethostname() */
    uint64_t timeout_ms; /* per call, connect included */
} kvs__rpc_config_t;

int kvs__rpc_open(const kvs__rpc_config_t *cfg, kvs__rpc_t **rpc_p);
void kvs__rpc_close(kvs__rpc_t *rpc);
/* What HELLO returned. */
const kvs__hello_rsp_t *kvs__rpc_hello(const kvs__rpc_t *rpc);
const char *kvs__rpc_node(const kvs__rpc_t *rpc);
/* The protocol version to build requests in: the one negotiated at the last HELLO. */
unsigned kvs__rpc_version(kvs__rpc_t *rpc);
/* The incarnation of the master the connection last said HELLO to (random per master start;
 * a change means the master restarted and forgot every segment, object and lease). */
uint64_t kvs__rpc_incarnation(kvs__rpc_t *rpc);
/* Starts a request frame of `type` in that version (kvs__frame_begin). */
void kvs__rpc_begin(kvs__rpc_t *rpc, kvs__wbuf_t *req, uint16_t type);

/* Sends `req` (a frame built with kvs__frame_begin/end; its request id is filled in) and waits
 * for the response of the same type, whose payload replaces the contents of `rsp` (caller
 * owns both buffers; rsp->version is the version the reply is encoded in). Transport failures give
 * RPC_FAIL or TIMED_OUT and close the connection; the next call reconnects and says HELLO again
 * with the same client id. An ERROR frame from the master gives its status. */
int kvs__rpc_call(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp);

#endif
