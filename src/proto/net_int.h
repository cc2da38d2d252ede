/* Socket helpers with deadlines, and a blocking RPC connection to the master. */
#ifndef KVS_NET_INT_H
#define KVS_NET_INT_H

#include "proto_int.h"
#include "tls_int.h"

#include <netdb.h>
#include <sys/types.h>

/* Whether `host` names only this machine: a numeric loopback address (127.0.0.0/8, ::1) or
 * "localhost". Servers bound elsewhere need a secret (or --insecure-no-auth). */
bool kvs__host_is_loopback(const char *host);
/* Listens on host:port (port 0 picks a free one). Returns the fd or a negative status. */
int kvs__tcp_listen(const char *host, uint16_t port, int backlog);
/* A descriptor held in reserve for a listening socket (libuv's trick). When accept fails for
 * want of descriptors (EMFILE, ENFILE) the connection stays pending and the socket readable, so
 * a level-triggered poll reports it again at once and the loop spins. Shedding closes the spare,
 * accepts the pending connection into the freed slot, closes it at once (its peer sees the end
 * instead of a hang) and opens the spare again. One thread uses a spare at a time. */
typedef struct {
    int fd;                /* /dev/null, or -1 while it cannot be had */
    uint64_t last_warn_ns; /* warnings at most once a second */
    uint64_t shed;         /* connections closed for want of descriptors */
} kvs__spare_fd_t;

/* Opens the spare (it is -1 if that fails; shedding tries again). */
void kvs__spare_fd_init(kvs__spare_fd_t *spare);
void kvs__spare_fd_close(kvs__spare_fd_t *spare);
/* After accept on the non-blocking `listen_fd` failed with EMFILE or ENFILE: sheds one pending
 * connection and warns (naming `who`) at most once a second. Returns 1 when one was shed (try
 * accept again: more may be pending), 0 when none was pending, -1 when no descriptor could be
 * freed for it (the caller backs off: the socket stays readable). */
int kvs__spare_fd_shed(kvs__spare_fd_t *spare, int listen_fd, const char *who);
/* The local port a socket is bound to, 0 on error. */
uint16_t kvs__sock_port(int fd);
/* Resolves host:port before the deadline (absolute, kvs__now_ns() clock). Numeric addresses are
 * converted in place; names are looked up on a helper thread that the caller stops waiting for
 * at the deadline (TIMED_OUT). INVALID_PARAMS: the name does not resolve. Free with
 * freeaddrinfo(). */
int kvs__resolve(const char *host, uint16_t port, bool passive, uint64_t deadline_ns,
                 struct addrinfo **res_p);
/* Tests: resolves names in place of getaddrinfo() (a stand-in for a slow or broken resolver). */
typedef int (*kvs__getaddrinfo_fn)(const char *host, const char *port, const struct addrinfo *hints,
                                   struct addrinfo **res);
extern _Atomic(kvs__getaddrinfo_fn) kvs__resolver_hook;
/* Connects with a deadline. Returns fd or negative status: TIMED_OUT, RPC_FAIL (refused or
 * unreachable), INVALID_PARAMS (unresolvable host). */
int kvs__tcp_connect(const char *host, uint16_t port, uint64_t deadline_ns);
/* A connect in two steps, so that another thread can cancel the wait by shutting the socket
 * down: start makes a non-blocking socket and starts connecting to `ai`; finish waits until it
 * is connected (OK), refused or shut down (RPC_FAIL) or the deadline (TIMED_OUT). */
int kvs__connect_start(const struct addrinfo *ai, int *fd_p);
int kvs__connect_finish(int fd, uint64_t deadline_ns);
int kvs__set_nonblock(int fd, bool on);
/* Waits until `fd` is ready for poll `events` (or has an error or hang-up): OK, TIMED_OUT at the
 * deadline, IO_ERROR when poll fails. */
int kvs__wait_fd(int fd, short events, uint64_t deadline_ns);
/* Sends or receives exactly `len` bytes before the deadline. IO_ERROR when the peer closed or
 * failed, TIMED_OUT at the deadline. The socket must be non-blocking. */
int kvs__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
int kvs__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns);

/* ---- HELLO and AUTH ------------------------------------------------------------------------ */

/* A server's state between its HELLO reply and the client's AUTH. */
typedef struct {
    bool required; /* the server has a secret: AUTH must succeed before anything else */
    uint8_t client_nonce[KVS_AUTH_NONCE_LEN];
    uint8_t server_nonce[KVS_AUTH_NONCE_LEN];
    uint8_t server_proof[KVS_AUTH_PROOF_LEN];
} kvs__auth_pending_t;

/* Server: fills the auth fields of the HELLO reply `rsp` (proving `name`, the endpoint clients
 * dial it at; NULL: none, for the master) (they point into `st`, which must
 * outlive the encoding) from the request's nonce. AUTH_FAILED: the server has a secret and the
 * HELLO carries no nonce of the right length. */
int kvs__auth_server_hello(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                           const kvs__hello_req_t *req, kvs__auth_pending_t *st,
                           kvs__hello_rsp_t *rsp);
/* Server: whether the client's AUTH proves the secret for this connection's nonces. */
bool kvs__auth_server_verify(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint,
                             const char *name, const kvs__auth_pending_t *st,
                             const kvs__auth_req_t *req);

typedef struct {
    const kvs__auth_t *auth; /* this process's secret (NULL or off: none) */
    kvs__auth_endpoint_t endpoint;
    const char *server_name; /* the endpoint dialled, which the server must prove (NULL: none) */
    const char *node;        /* this client's host, for same-node placement */
    const char *tenant;      /* the keys' namespace (NULL: the default) */
    uint64_t client_id;      /* 0 on first contact, else the id the master gave before */
    const char *peer;        /* "the master at HOST:PORT", for messages */
    /* Whether the caller shut the socket down itself (a cancelled wait does): an I/O error is
     * then the caller's time-out, not the peer's doing. NULL: never. */
    bool (*cut)(const void *arg);
    const void *cut_arg;
} kvs__handshake_t;

/* Client: says HELLO on a connected non-blocking connection (plain or TLS) and, when the server
 * asks for it, proves the secret (AUTH), all before the deadline. The server must prove it first; a
 * client with a secret refuses a server without one. *rsp_p gets the HELLO reply (its client_id the
 * one AUTH bound, and its nonce and proof cleared). AUTH_FAILED, INVALID_VERSION, the server's
 * refusal, or a transport error (IO_ERROR, TIMED_OUT; TIMED_OUT also when hs->cut says the caller
 * cut the socket); failures other than transport ones are logged with the reason. */
int kvs__client_handshake(const kvs__io_t *io, const kvs__handshake_t *hs, uint64_t deadline_ns,
                          kvs__hello_rsp_t *rsp_p);

/* Connections to the master: a pool of up to max_conns, one per call in progress, so threads
 * never wait for each other's time-outs. */
typedef struct kvs__rpc kvs__rpc_t;

#define KVS_RPC_DEFAULT_CONNS 8u
#define KVS_RPC_MAX_CONNS     64u

typedef struct {
    const char *host;
    uint16_t port;
    const char *node;     /* this client's host name; NULL: gethostname() */
    const char *tenant;   /* the namespace of this client's keys (NULL: the default) */
    uint64_t timeout_ms;  /* kvs__rpc_call's deadline: connect, HELLO and request together */
    uint32_t max_conns;   /* 0: KVS_RPC_DEFAULT_CONNS */
    uint64_t deadline_ns; /* of the first connection, made by open; 0: now + timeout_ms */
    kvs__auth_t auth;     /* the secret to prove to the master (and it to us), if on */
    bool tls;             /* TLS on every connection (needs auth; the master must have it on) */
    /* High availability (docs/ha.md): the leader's address is read from etcd at these endpoints
     * ("HOST:PORT[,...]", an "etcd://" in front accepted; host and port are then unused), under
     * `etcd_prefix` (NULL: KVS_ETCD_DEFAULT_PREFIX). Calls follow the leader: a NOT_LEADER
     * answer (which names the leader), a master that cannot be reached, or one that failed
     * during the request and is then found gone (it no longer leads, or cannot be reached),
     * make the call find the leader again and retry, until its deadline; NO_LEADER when etcd
     * names none by then. */
    const char *etcd;
    const char *etcd_prefix;
} kvs__rpc_config_t;

int kvs__rpc_open(const kvs__rpc_config_t *cfg, kvs__rpc_t **rpc_p);
void kvs__rpc_close(kvs__rpc_t *rpc);
/* What the last HELLO returned (a copy: reconnects on other threads update it). */
kvs__hello_rsp_t kvs__rpc_hello(kvs__rpc_t *rpc);
const char *kvs__rpc_node(const kvs__rpc_t *rpc);
/* The protocol version to build requests in: the one negotiated at the last HELLO. */
unsigned kvs__rpc_version(kvs__rpc_t *rpc);
/* The incarnation of the master the connection last said HELLO to (random per master start;
 * a change means the master restarted and forgot every segment, object and lease). */
uint64_t kvs__rpc_incarnation(kvs__rpc_t *rpc);
/* The master this pool talks to now, "HOST:PORT" (for messages). */
void kvs__rpc_target(kvs__rpc_t *rpc, char *buf, size_t len);
/* Whether the pool follows a leader through etcd. */
bool kvs__rpc_follows(const kvs__rpc_t *rpc);
/* Starts a request frame of `type` in that version (kvs__frame_begin). */
void kvs__rpc_begin(kvs__rpc_t *rpc, kvs__wbuf_t *req, uint16_t type);

/* Sends `req` (a frame built with kvs__frame_begin/end; its request id is filled in) and waits
 * for the response of the same type, whose payload replaces the contents of `rsp` (caller
 * owns both buffers; rsp->version is the version the reply is encoded in). Everything — waiting
 * for a connection, connecting, HELLO, the request — ends by `deadline_ns` (TIMED_OUT). Other
 * transport failures give RPC_FAIL and close that connection; a connection the master closed
 * while idle is replaced before the request is sent, and new connections say HELLO with the
 * same client id. An ERROR frame from the master gives its status. */
int kvs__rpc_call_until(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp, uint64_t deadline_ns);
/* The same with the deadline now + timeout_ms. */
int kvs__rpc_call(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp);
/* now + timeout_ms. */
uint64_t kvs__rpc_deadline(const kvs__rpc_t *rpc);

#endif
