/* Socket helpers with deadlines and the blocking master RPC connection. */
#define _GNU_SOURCE
#include "net_int.h"
#include "../ha/etcd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int kvs__set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return KVS_IO_ERROR;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, fl) == 0 ? KVS_OK : KVS_IO_ERROR;
}

/* ---- accepting without descriptors ------------------------------------------------------- */

void kvs__spare_fd_init(kvs__spare_fd_t *spare)
{
    *spare = (kvs__spare_fd_t){.fd = open("/dev/null", O_RDONLY | O_CLOEXEC)};
}

void kvs__spare_fd_close(kvs__spare_fd_t *spare)
{
    if (spare->fd >= 0)
        close(spare->fd);
    spare->fd = -1;
}

int kvs__spare_fd_shed(kvs__spare_fd_t *spare, int listen_fd, const char *who)
{
    int err = errno;
    if (kvs__every(&spare->last_warn_ns, KVS_NS_PER_S))
        kvs_warn("%s: cannot accept (%s): new connections are closed at once until descriptors "
                 "are free (%llu so far)",
                 who, strerror(err), (unsigned long long)spare->shed);
    if (spare->fd < 0)
        spare->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (spare->fd < 0)
        return -1;
    close(spare->fd);
    int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    int rc = c >= 0 || errno == ECONNABORTED || errno == EINTR ? 1
             : errno == EAGAIN || errno == EWOULDBLOCK         ? 0
                                                               : -1;
    if (c >= 0) {
        close(c);
        spare->shed++;
    }
    /* Another thread may have taken the slot meanwhile: then the next shed tries again. */
    spare->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return rc;
}

/* ---- name resolution with a deadline ------------------------------------------------------
 * getaddrinfo() has no time-out, so names (not numeric addresses) are resolved on a detached
 * thread; the caller waits for it only until its deadline. The request is shared by reference
 * count: whichever of the two lets go last frees it, so a resolver stuck in DNS past the
 * caller's return costs a thread and a few bytes until it finishes, never a dangling pointer. */

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    bool done;
    int gai_rc;
    struct addrinfo hints;
    struct addrinfo *res;
    char *host;
    char port[8];
} resolve_job_t;

_Atomic(kvs__getaddrinfo_fn) kvs__resolver_hook;

/* Lookups still running (their callers may have given up on them). Beyond the cap, new lookups
 * fail at once rather than pile up threads behind a stalled resolver. */
#define RESOLVERS_MAX 64
static atomic_int resolvers_live;

static int do_getaddrinfo(const char *host, const char *port, const struct addrinfo *hints,
                          struct addrinfo **res)
{
    kvs__getaddrinfo_fn fn = atomic_load(&kvs__resolver_hook);
    return fn != NULL ? fn(host, port, hints, res) : getaddrinfo(host, port, hints, res);
}

static void job_unref(resolve_job_t *j)
{
    pthread_mutex_lock(&j->lock);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->lock);
    if (!last)
        return;
    if (j->res != NULL)
        freeaddrinfo(j->res);
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->cond);
    free(j->host);
    free(j);
}

static void *resolve_thread(void *arg)
{
    resolve_job_t *j = arg;
    struct addrinfo *res = NULL;
    int rc = do_getaddrinfo(j->host, j->port, &j->hints, &res);
    atomic_fetch_sub(&resolvers_live, 1);
    pthread_mutex_lock(&j->lock);
    j->gai_rc = rc;
    j->res = rc == 0 ? res : NULL;
    j->done = true;
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->lock);
    job_unref(j);
    return NULL;
}

/* Plain malloc for the job: it may outlive the caller's allocator bookkeeping (a detached
 * thread finishing after a test has checked for leaks of kvs__malloc). */
static int resolve_named(const char *host, const struct addrinfo *hints, const char *port,
                         uint64_t deadline_ns, struct addrinfo **res_p)
{
    if (kvs__now_ns() >= deadline_ns)
        return KVS_TIMED_OUT;
    if (atomic_fetch_add(&resolvers_live, 1) >= RESOLVERS_MAX) {
        atomic_fetch_sub(&resolvers_live, 1);
        kvs_error("cannot resolve '%s': %d earlier lookups are still stalled", host, RESOLVERS_MAX);
        return KVS_TIMED_OUT;
    }
    resolve_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->host = strdup(host)) == NULL) {
        atomic_fetch_sub(&resolvers_live, 1);
        free(j);
        return KVS_NO_MEMORY;
    }
    pthread_mutex_init(&j->lock, NULL);
    kvs__cond_init(&j->cond);
    j->refs = 2;
    j->hints = *hints;
    snprintf(j->port, sizeof(j->port), "%s", port);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int prc = pthread_create(&th, &attr, resolve_thread, j);
    pthread_attr_destroy(&attr);
    if (prc != 0) {
        atomic_fetch_sub(&resolvers_live, 1);
        j->refs = 1;
        job_unref(j);
        kvs_error("cannot resolve '%s': no thread for the resolver", host);
        return KVS_INTERNAL_ERROR;
    }
    pthread_mutex_lock(&j->lock);
    while (!j->done && kvs__cond_wait_until(&j->cond, &j->lock, deadline_ns))
        ;
    int rc;
    if (!j->done) {
        kvs_error("resolving '%s' did not finish before the deadline", host);
        rc = KVS_TIMED_OUT;
    } else if (j->gai_rc != 0) {
        kvs_error("cannot resolve '%s': %s", host, gai_strerror(j->gai_rc));
        rc = KVS_INVALID_PARAMS;
    } else {
        *res_p = j->res;
        j->res = NULL; /* the caller's now */
        rc = KVS_OK;
    }
    pthread_mutex_unlock(&j->lock);
    job_unref(j);
    return rc;
}

int kvs__resolve(const char *host, uint16_t port, bool passive, uint64_t deadline_ns,
                 struct addrinfo **res_p)
{
    if (res_p == NULL)
        return KVS_INVALID_PARAMS;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = (passive ? AI_PASSIVE : 0) | AI_NUMERICHOST};
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", (unsigned)port);
    /* Numeric addresses (and the wildcard) need no lookup, and so no thread. */
    int rc = getaddrinfo(host, ports, &hints, res_p);
    if (rc == 0)
        return KVS_OK;
    if (host == NULL || rc != EAI_NONAME) {
        kvs_error("cannot resolve '%s': %s", host ? host : "(any)", gai_strerror(rc));
        return KVS_INVALID_PARAMS;
    }
    hints.ai_flags &= ~AI_NUMERICHOST;
    return resolve_named(host, &hints, ports, deadline_ns, res_p);
}

bool kvs__host_is_loopback(const char *host)
{
    if (host == NULL || strcmp(host, "localhost") == 0)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false; /* a name may resolve anywhere */
}

int kvs__tcp_listen(const char *host, uint16_t port, int backlog)
{
    struct addrinfo *res;
    int rc = kvs__resolve(host, port, true, kvs__now_ns() + 10 * KVS_NS_PER_S, &res);
    if (rc != KVS_OK)
        return rc;
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        kvs_error("cannot listen on %s:%u: %s", host ? host : "*", (unsigned)port, strerror(err));
        return KVS_IO_ERROR;
    }
    return fd;
}

uint16_t kvs__sock_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

int kvs__wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvs__now_ns();
        if (now >= deadline_ns)
            return KVS_TIMED_OUT;
        uint64_t ms = (deadline_ns - now + KVS_NS_PER_MS - 1) / KVS_NS_PER_MS;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, ms > 60000 ? 60000 : (int)ms);
        if (rc > 0)
            return KVS_OK;
        if (rc < 0 && errno != EINTR)
            return KVS_IO_ERROR;
    }
}

int kvs__connect_start(const struct addrinfo *ai, int *fd_p)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return KVS_IO_ERROR;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        close(fd);
        return KVS_RPC_FAIL;
    }
    *fd_p = fd;
    return KVS_OK;
}

int kvs__connect_finish(int fd, uint64_t deadline_ns)
{
    int rc = kvs__wait_fd(fd, POLLOUT, deadline_ns);
    if (rc != KVS_OK)
        return rc;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
        return KVS_RPC_FAIL;
    /* A socket shut down while connecting polls writable without an error: make sure. */
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    return getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 ? KVS_OK : KVS_RPC_FAIL;
}

int kvs__tcp_connect(const char *host, uint16_t port, uint64_t deadline_ns)
{
    struct addrinfo *res;
    int rc = kvs__resolve(host, port, false, deadline_ns, &res);
    if (rc != KVS_OK)
        return rc;
    int fd = -1;
    rc = KVS_RPC_FAIL;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        if (kvs__connect_start(ai, &fd) != KVS_OK)
            continue;
        rc = kvs__connect_finish(fd, deadline_ns);
        if (rc != KVS_OK) {
            close(fd);
            fd = -1;
            if (rc == KVS_TIMED_OUT)
                break;
        }
    }
    freeaddrinfo(res);
    return fd >= 0 ? fd : rc;
}

int kvs__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    kvs__io_t io = {fd, NULL};
    return kvs__io_send_all(&io, buf, len, deadline_ns);
}

int kvs__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    kvs__io_t io = {fd, NULL};
    return kvs__io_recv_all(&io, buf, len, deadline_ns);
}

/* ---- master RPC connections ------------------------------------------------------------
 * A pool: each call takes an idle connection, or opens one while fewer than max_conns exist, or
 * waits (until its deadline) for one to come back. Threads therefore never queue behind each
 * other's time-outs, and a stopped master costs each call its own deadline only. Every
 * connection says HELLO with the client id the first one received, so the master sees one
 * client. */

typedef struct {
    int fd;    /* -1: not connected */
    void *ssl; /* its TLS session, when the pool has TLS on */
    uint32_t next_req_id;
    bool busy;
    uint64_t target_gen;  /* the target it was connected to (rpc->target_gen then) */
    uint64_t incarnation; /* of the master its HELLO reached */
} rpc_conn_t;

static kvs__io_t conn_io(const rpc_conn_t *cn)
{
    return (kvs__io_t){cn->fd, cn->ssl};
}

static void conn_drop(rpc_conn_t *cn)
{
    kvs__io_t io = conn_io(cn);
    kvs__io_free(&io);
    if (cn->fd >= 0)
        close(cn->fd);
    cn->fd = -1;
    cn->ssl = NULL;
}

struct kvs__rpc {
    char *host; /* the master now (under lock once calls run: a leader change moves it) */
    uint16_t port;
    uint64_t target_gen; /* counts moves of host:port; older connections are dropped */
    kvs__etcd_t *etcd;   /* NULL: one master at host:port */
    char etcd_prefix[KVS_MAX_NAME_LEN + 1];
    bool resolved; /* host:port came from etcd (or a NOT_LEADER) since the last failure */
    char node[KVS_MAX_NAME_LEN + 1];
    char tenant[KVS_MAX_TENANT_LEN + 1];
    uint64_t timeout_ns;
    kvs__auth_t auth;
    kvs__tls_t *tls; /* NULL: plain connections */
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a connection became idle */
    unsigned version;    /* negotiated at the last HELLO; this build's highest before the first */
    kvs__hello_rsp_t hello; /* the last HELLO's answer (its client id is kept across masters) */
    uint32_t nconns;
    rpc_conn_t conns[KVS_RPC_MAX_CONNS];
};

/* Whether an idle connection was closed by the master meanwhile (it restarted, or dropped us):
 * such a connection is replaced before the request is sent, so the request goes out once. */
static bool conn_dead(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
           n > 0; /* nothing may arrive unasked: a stray byte means the stream is out of step */
}

/* One frame out, one frame back, with the request id and type matched. The connection is the
 * caller's (busy); rpc->lock is not held. */
static bool leader_moved(kvs__rpc_t *rpc, uint64_t incarnation, uint64_t deadline);

/* Receives the first byte of a reply. A pool that follows the leader looks at etcd every
 * FOLLOW_WAIT_SLICE_NS meanwhile: a master that stopped (paused, partitioned) and lost the
 * lead gives RPC_FAIL, so the call goes to the new leader within its deadline. */
#define FOLLOW_WAIT_SLICE_NS (250 * KVS_NS_PER_MS)
static int recv_first(kvs__rpc_t *follow, const rpc_conn_t *cn, kvs__io_t *io, uint8_t *b,
                      uint64_t deadline)
{
    for (;;) {
        uint64_t now = kvs__now_ns();
        uint64_t until = follow ? KVS_MIN(deadline, now + FOLLOW_WAIT_SLICE_NS) : deadline;
        int rc = kvs__io_recv_all(io, b, 1, until);
        if (rc != KVS_TIMED_OUT || until >= deadline)
            return rc;
        if (leader_moved(follow, cn->incarnation, deadline)) {
            kvs_warn("the master stopped answering and another leads now: going there");
            return KVS_RPC_FAIL;
        }
    }
}

static int rpc_exchange(kvs__rpc_t *follow, rpc_conn_t *cn, kvs__wbuf_t *req, kvs__wbuf_t *rsp,
                        uint64_t deadline, bool *sent_p, char *leader, size_t leader_len)
{
    uint32_t id = ++cn->next_req_id;
    kvs__frame_hdr_t sent;
    if (kvs__frame_hdr_decode(req->data, req->len, KVS_FRAME_MAX_PAYLOAD, &sent) != KVS_OK)
        return KVS_INVALID_PARAMS;
    sent.req_id = id;
    kvs__frame_hdr_encode(&sent, req->data);
    kvs__frame_log("rpc", "->", &sent, req->data + KVS_FRAME_HDR_LEN, sent.len);
    kvs__io_t io = conn_io(cn);
    int rc = kvs__io_send_all(&io, req->data, req->len, deadline);
    *sent_p = rc == KVS_OK;
    uint8_t hb[KVS_FRAME_HDR_LEN];
    if (rc == KVS_OK)
        rc = recv_first(follow, cn, &io, hb, deadline);
    if (rc == KVS_OK)
        rc = kvs__io_recv_all(&io, hb + 1, sizeof(hb) - 1, deadline);
    kvs__frame_hdr_t h;
    bool conn_error = false;
    if (rc == KVS_OK) {
        rc = kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &h);
        /* An ERROR of request id 0 is about the connection (a bad header, a limit the master
         * refused it for): it may come before the request was read, and answers it too. */
        conn_error = rc == KVS_OK && h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG) && h.req_id == 0;
        if (rc == KVS_OK && !conn_error &&
            (h.req_id != id ||
             (h.type != (sent.type | KVS_RSP_FLAG) && h.type != (KVS_MSG_ERROR | KVS_RSP_FLAG))))
            rc = KVS_PROTOCOL_ERROR;
    }
    if (rc == KVS_OK) {
        kvs__wbuf_reset(rsp);
        if (h.len > 0) {
            /* Grow to the payload size, then receive straight into it. */
            kvs__wbuf_t *w = rsp;
            if (w->cap < h.len) {
                uint8_t *d = kvs__realloc(w->data, h.len);
                if (d == NULL)
                    rc = KVS_NO_MEMORY;
                else {
                    w->data = d;
                    w->cap = h.len;
                }
            }
            if (rc == KVS_OK)
                rc = kvs__io_recv_all(&io, w->data, h.len, deadline);
            w->len = rc == KVS_OK ? h.len : 0;
        }
        rsp->version = h.version;
        if (rc == KVS_OK)
            kvs__frame_log("rpc", "<-", &h, rsp->data, rsp->len);
    }
    if (rc != KVS_OK) {
        conn_drop(cn);
        return rc == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_RPC_FAIL;
    }
    if (conn_error) /* the master closes such a connection */
        conn_drop(cn);
    if (h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG)) {
        kvs__error_rsp_t e;
        if (kvs__error_rsp_decode(rsp->data, rsp->len, rsp->version, NULL, &e) == KVS_OK) {
            if (e.status == KVS_NOT_LEADER) {
                /* A standby: its message is the leader's address, or empty when it knows none. */
                snprintf(leader, leader_len, "%.*s", (int)e.message.len, e.message.ptr);
                return KVS_NOT_LEADER;
            }
            kvs_error("master refused %s: %.*s (%s)", kvs__msg_name(sent.type), (int)e.message.len,
                      e.message.ptr, kvs_status_name(e.status));
            return e.status < 0 ? e.status : KVS_RPC_FAIL;
        }
        return KVS_RPC_FAIL;
    }
    return KVS_OK;
}

/* Connects `cn` to the current target and says HELLO, all before `deadline`. */
static int rpc_connect(kvs__rpc_t *rpc, rpc_conn_t *cn, uint64_t deadline)
{
    char host[KVS_MAX_NAME_LEN + 1];
    pthread_mutex_lock(&rpc->lock);
    snprintf(host, sizeof(host), "%s", rpc->host ? rpc->host : "");
    uint16_t port = rpc->port;
    uint64_t gen = rpc->target_gen;
    pthread_mutex_unlock(&rpc->lock);
    if (port == 0)
        return KVS_NO_LEADER; /* following etcd, which has named no leader yet */
    int fd = kvs__tcp_connect(host, port, deadline);
    if (fd < 0) {
        if (rpc->etcd == NULL)
            kvs_error("cannot reach the master at %s:%u: %s", host, (unsigned)port,
                      kvs_status_str(fd));
        else
            kvs_debug("cannot reach the master at %s:%u: %s", host, (unsigned)port,
                      kvs_status_str(fd));
        return fd == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_RPC_FAIL;
    }
    cn->fd = fd;
    cn->target_gen = gen;
    if (rpc->tls != NULL) {
        kvs__io_t io;
        int trc = kvs__tls_handshake(rpc->tls, fd, deadline, &io);
        if (trc != KVS_OK) {
            kvs_error("TLS with the master at %s:%u failed: %s", host, (unsigned)port,
                      trc == KVS_AUTH_FAILED ? "it has another token"
                      : trc == KVS_TIMED_OUT ? "no answer in time"
                                             : "it does not speak TLS (is it started with --tls?)");
            conn_drop(cn);
            return trc == KVS_TIMED_OUT || trc == KVS_AUTH_FAILED ? trc : KVS_RPC_FAIL;
        }
        cn->ssl = io.ssl;
    }
    pthread_mutex_lock(&rpc->lock);
    uint64_t client_id = rpc->hello.client_id;
    pthread_mutex_unlock(&rpc->lock);
    char peer[300];
    snprintf(peer, sizeof(peer), "the master at %s:%u", host, (unsigned)port);
    kvs__handshake_t hs = {.auth = &rpc->auth,
                           .endpoint = KVS_AUTH_MASTER,
                           .node = rpc->node,
                           .tenant = rpc->tenant,
                           .client_id = client_id,
                           .peer = peer};
    kvs__hello_rsp_t h;
    kvs__io_t io = conn_io(cn);
    int rc = kvs__client_handshake(&io, &hs, deadline, &h);
    if (rc == KVS_OK) {
        cn->incarnation = h.incarnation;
        pthread_mutex_lock(&rpc->lock);
        rpc->hello = h;
        rpc->version = h.version;
        pthread_mutex_unlock(&rpc->lock);
    }
    if (rc != KVS_OK) {
        conn_drop(cn);
        /* Transport failures are the caller's to report; refusals were logged with why. */
        if (rc == KVS_IO_ERROR || rc == KVS_PROTOCOL_ERROR || rc == KVS_NO_MEMORY)
            rc = KVS_RPC_FAIL;
    }
    return rc;
}

/* Points the pool at host:port (a new leader): connections to the old target are dropped
 * when next taken. */
static void rpc_retarget(kvs__rpc_t *rpc, const char *host, uint16_t port)
{
    char *h = kvs__strdup(host);
    if (h == NULL)
        return;
    pthread_mutex_lock(&rpc->lock);
    if (rpc->host == NULL || strcmp(rpc->host, host) != 0 || rpc->port != port) {
        kvs__free(rpc->host);
        rpc->host = h;
        h = NULL;
        rpc->port = port;
        rpc->target_gen++;
        kvs_info("following the leader master at %s:%u", host, (unsigned)port);
    }
    rpc->resolved = true;
    pthread_mutex_unlock(&rpc->lock);
    kvs__free(h);
}

/* Asks etcd who leads and points the pool there. NO_LEADER when nobody does. */
static int rpc_resolve(kvs__rpc_t *rpc, kvs__etcd_leader_t *l_p, uint64_t deadline)
{
    kvs__etcd_leader_t l;
    int rc = kvs__etcd_leader_until(rpc->etcd, rpc->etcd_prefix, &l, deadline);
    if (rc == KVS_OK)
        rpc_retarget(rpc, l.host, l.port);
    if (l_p != NULL)
        *l_p = l;
    return rc;
}

/* Takes a connection for one call: an idle connected one, else a free slot, else waits for one
 * until the deadline. */
static int conn_take(kvs__rpc_t *rpc, uint64_t deadline, rpc_conn_t **cn_p)
{
    pthread_mutex_lock(&rpc->lock);
    for (;;) {
        rpc_conn_t *slot = NULL;
        for (uint32_t i = 0; i < rpc->nconns; i++) {
            rpc_conn_t *cn = &rpc->conns[i];
            if (cn->busy)
                continue;
            if (cn->fd >= 0) {
                slot = cn;
                break;
            }
            if (slot == NULL)
                slot = cn;
        }
        if (slot != NULL) {
            slot->busy = true;
            pthread_mutex_unlock(&rpc->lock);
            *cn_p = slot;
            return KVS_OK;
        }
        if (!kvs__cond_wait_until(&rpc->cond, &rpc->lock, deadline)) {
            pthread_mutex_unlock(&rpc->lock);
            return KVS_TIMED_OUT;
        }
    }
}

static void conn_give(kvs__rpc_t *rpc, rpc_conn_t *cn)
{
    pthread_mutex_lock(&rpc->lock);
    cn->busy = false;
    pthread_cond_signal(&rpc->cond);
    pthread_mutex_unlock(&rpc->lock);
}

static int rpc_follow_connect(kvs__rpc_t *rpc, uint64_t deadline);

int kvs__rpc_open(const kvs__rpc_config_t *cfg, kvs__rpc_t **rpc_p)
{
    if (cfg == NULL || rpc_p == NULL ||
        (cfg->etcd == NULL && (cfg->host == NULL || cfg->port == 0)) || cfg->timeout_ms == 0 ||
        cfg->max_conns > KVS_RPC_MAX_CONNS ||
        (cfg->etcd_prefix != NULL && strlen(cfg->etcd_prefix) > KVS_MAX_NAME_LEN))
        return KVS_INVALID_PARAMS;
    kvs__rpc_t *rpc = kvs__calloc(1, sizeof(*rpc));
    if (rpc == NULL)
        return KVS_NO_MEMORY;
    rpc->version = KVS_PROTO_VERSION_MAX;
    if (cfg->etcd != NULL) {
        /* etcd calls get a share of the call's time, so that one slow endpoint leaves time to
         * try another and the master. */
        int erc = kvs__etcd_open(cfg->etcd, KVS_MAX(cfg->timeout_ms / 4, 1), &rpc->etcd);
        if (erc != KVS_OK) {
            kvs__free(rpc);
            return erc;
        }
        snprintf(rpc->etcd_prefix, sizeof(rpc->etcd_prefix), "%s",
                 cfg->etcd_prefix ? cfg->etcd_prefix : KVS_ETCD_DEFAULT_PREFIX);
        rpc->host = kvs__strdup(""); /* port 0: not resolved yet */
    } else {
        rpc->host = kvs__strdup(cfg->host);
        rpc->port = cfg->port;
    }
    rpc->timeout_ns = cfg->timeout_ms * KVS_NS_PER_MS;
    rpc->auth = cfg->auth;
    if (cfg->tls) {
        char why[256];
        int trc = kvs__tls_create(&cfg->auth, false, &rpc->tls, why, sizeof(why));
        if (trc != KVS_OK) {
            kvs_error("%s", why);
            kvs__etcd_close(rpc->etcd);
            kvs__free(rpc->host);
            kvs__free(rpc);
            return trc;
        }
    }
    rpc->nconns = cfg->max_conns ? cfg->max_conns : KVS_RPC_DEFAULT_CONNS;
    for (uint32_t i = 0; i < KVS_RPC_MAX_CONNS; i++)
        rpc->conns[i].fd = -1;
    if (cfg->node != NULL)
        snprintf(rpc->node, sizeof(rpc->node), "%s", cfg->node);
    else if (gethostname(rpc->node, sizeof(rpc->node) - 1) != 0)
        snprintf(rpc->node, sizeof(rpc->node), "localhost");
    if (cfg->tenant != NULL)
        snprintf(rpc->tenant, sizeof(rpc->tenant), "%s", cfg->tenant);
    pthread_mutex_init(&rpc->lock, NULL);
    kvs__cond_init(&rpc->cond);
    /* The first connection is made now, so that a wrong address fails at open. */
    int rc = rpc->host ? KVS_OK : KVS_NO_MEMORY;
    if (rc == KVS_OK) {
        uint64_t deadline = cfg->deadline_ns ? cfg->deadline_ns : kvs__now_ns() + rpc->timeout_ns;
        rc = rpc->etcd ? rpc_follow_connect(rpc, deadline)
                       : rpc_connect(rpc, &rpc->conns[0], deadline);
    }
    if (rc != KVS_OK) {
        kvs__rpc_close(rpc);
        return rc;
    }
    *rpc_p = rpc;
    return KVS_OK;
}

void kvs__rpc_close(kvs__rpc_t *rpc)
{
    if (rpc == NULL)
        return;
    for (uint32_t i = 0; i < KVS_RPC_MAX_CONNS; i++)
        conn_drop(&rpc->conns[i]);
    kvs__tls_destroy(rpc->tls);
    kvs__etcd_close(rpc->etcd);
    kvs__auth_wipe(&rpc->auth);
    pthread_mutex_destroy(&rpc->lock);
    pthread_cond_destroy(&rpc->cond);
    kvs__free(rpc->host);
    kvs__free(rpc);
}

kvs__hello_rsp_t kvs__rpc_hello(kvs__rpc_t *rpc)
{
    pthread_mutex_lock(&rpc->lock);
    kvs__hello_rsp_t h = rpc->hello;
    pthread_mutex_unlock(&rpc->lock);
    return h;
}

unsigned kvs__rpc_version(kvs__rpc_t *rpc)
{
    pthread_mutex_lock(&rpc->lock);
    unsigned v = rpc->version;
    pthread_mutex_unlock(&rpc->lock);
    return v;
}

uint64_t kvs__rpc_incarnation(kvs__rpc_t *rpc)
{
    return kvs__rpc_hello(rpc).incarnation;
}

void kvs__rpc_begin(kvs__rpc_t *rpc, kvs__wbuf_t *req, uint16_t type)
{
    kvs__frame_begin(req, type, 0, kvs__rpc_version(rpc));
}

const char *kvs__rpc_node(const kvs__rpc_t *rpc)
{
    return rpc->node;
}

uint64_t kvs__rpc_deadline(const kvs__rpc_t *rpc)
{
    return kvs__now_ns() + rpc->timeout_ns;
}

/* One try of a call on one connection (made now if needed, to the current target): `sent` says
 * whether the request went out whole, `leader` gets a NOT_LEADER's address. */
static int rpc_attempt(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp,
                       uint64_t connect_deadline, uint64_t deadline, bool *sent, char *leader,
                       size_t leader_len, uint64_t *inc_p)
{
    *sent = false;
    rpc_conn_t *cn;
    int rc = conn_take(rpc, deadline, &cn);
    if (rc != KVS_OK)
        return rc;
    pthread_mutex_lock(&rpc->lock);
    bool moved = cn->target_gen != rpc->target_gen;
    pthread_mutex_unlock(&rpc->lock);
    if (cn->fd >= 0 && (moved || conn_dead(cn->fd)))
        conn_drop(cn);
    if (cn->fd < 0)
        rc = rpc_connect(rpc, cn, connect_deadline);
    if (inc_p != NULL)
        *inc_p = cn->incarnation;
    if (rc == KVS_OK)
        rc = rpc_exchange(rpc->etcd ? rpc : NULL, cn, req, rsp, deadline, sent, leader, leader_len);
    conn_give(rpc, cn);
    return rc;
}

/* Whether etcd names a leader other than the master of `incarnation`. */
static bool leader_moved(kvs__rpc_t *rpc, uint64_t incarnation, uint64_t deadline)
{
    kvs__etcd_leader_t l;
    return kvs__etcd_leader_until(rpc->etcd, rpc->etcd_prefix, &l, deadline) == KVS_OK &&
           l.incarnation != incarnation;
}

/* Whether anything listens at the current target: a master that failed during a request and
 * still accepts connections may have served it, so it is not sent again. */
static bool target_alive(kvs__rpc_t *rpc, uint64_t deadline)
{
    char host[KVS_MAX_NAME_LEN + 1];
    pthread_mutex_lock(&rpc->lock);
    snprintf(host, sizeof(host), "%s", rpc->host ? rpc->host : "");
    uint16_t port = rpc->port;
    pthread_mutex_unlock(&rpc->lock);
    int fd = port ? kvs__tcp_connect(host, port, deadline) : -1;
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static void sleep_until_at_most(uint64_t ns, uint64_t deadline)
{
    uint64_t now = kvs__now_ns();
    if (now >= deadline)
        return;
    ns = KVS_MIN(ns, deadline - now);
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

#define FOLLOW_BACKOFF_MIN_NS (10 * KVS_NS_PER_MS)
#define FOLLOW_BACKOFF_MAX_NS (100 * KVS_NS_PER_MS)

/* The call of a pool that follows the leader (see kvs__rpc_config_t.etcd). */
static int rpc_follow_call(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp, uint64_t deadline)
{
    uint64_t backoff = FOLLOW_BACKOFF_MIN_NS;
    int last = KVS_NO_LEADER;
    for (;;) {
        pthread_mutex_lock(&rpc->lock);
        bool resolved = rpc->resolved && rpc->port != 0;
        pthread_mutex_unlock(&rpc->lock);
        if (!resolved) {
            int r = rpc_resolve(rpc, NULL, deadline);
            if (r != KVS_OK && r != KVS_TIMED_OUT) /* (out of time: say what was found) */
                last = r;
        }
        uint64_t now = kvs__now_ns();
        /* A connect gets part of the time: a leader that is gone must leave time for the next. */
        uint64_t cdl = KVS_MIN(deadline, now + KVS_MAX(rpc->timeout_ns / 4, 200 * KVS_NS_PER_MS));
        uint64_t inc = 0;
        bool sent = false;
        char leader[KVS_MAX_NAME_LEN + 8] = "";
        int rc = KVS_NO_LEADER;
        pthread_mutex_lock(&rpc->lock);
        resolved = rpc->port != 0;
        pthread_mutex_unlock(&rpc->lock);
        if (resolved)
            rc = rpc_attempt(rpc, req, rsp, cdl, deadline, &sent, leader, sizeof(leader), &inc);
        if (rc == KVS_OK || (rc != KVS_NOT_LEADER && rc != KVS_RPC_FAIL && rc != KVS_TIMED_OUT &&
                             rc != KVS_NO_LEADER))
            return rc;
        last = rc;
        pthread_mutex_lock(&rpc->lock);
        rpc->resolved = false;
        pthread_mutex_unlock(&rpc->lock);
        char *lh = NULL;
        uint16_t lp = 0;
        if (rc == KVS_NOT_LEADER && leader[0] != '\0' &&
            kvs__parse_host_port(leader, NULL, &lh, &lp) == KVS_OK && lh != NULL && lp != 0) {
            pthread_mutex_lock(&rpc->lock);
            bool same = rpc->port == lp && rpc->host != NULL && strcmp(rpc->host, lh) == 0;
            pthread_mutex_unlock(&rpc->lock);
            if (same)
                lp = 0; /* the leader itself, not serving clients yet: wait a moment */
            else
                rpc_retarget(rpc, lh, lp); /* the standby's word; etcd is asked if it fails */
        }
        kvs__free(lh);
        if (sent && rc != KVS_NOT_LEADER) {
            /* The master failed during the request, which it may have served: it is sent again
             * only to another leader (this one is then gone, with what it did). */
            for (;;) {
                kvs__etcd_leader_t l;
                int r = rpc_resolve(rpc, &l, deadline);
                if (r == KVS_OK && l.incarnation != inc)
                    break;
                if (r == KVS_OK &&
                    target_alive(rpc, KVS_MIN(deadline, kvs__now_ns() + 200 * KVS_NS_PER_MS)))
                    return rc; /* it still leads and lives: not ours to repeat */
                if (kvs__now_ns() + backoff >= deadline)
                    return r == KVS_NO_LEADER ? KVS_NO_LEADER : rc;
                sleep_until_at_most(backoff, deadline);
                backoff = KVS_MIN(2 * backoff, FOLLOW_BACKOFF_MAX_NS);
            }
            continue;
        }
        if (kvs__now_ns() + (rc == KVS_NOT_LEADER && lp ? 0 : backoff) >= deadline)
            break;
        if (!(rc == KVS_NOT_LEADER && lp != 0)) {
            sleep_until_at_most(backoff, deadline);
            backoff = KVS_MIN(2 * backoff, FOLLOW_BACKOFF_MAX_NS);
        }
    }
    if (last == KVS_NO_LEADER || last == KVS_NOT_LEADER) {
        kvs_error("no master leads the cluster at etcd://%s (prefix %s) yet",
                  kvs__etcd_endpoints(rpc->etcd), rpc->etcd_prefix);
        return KVS_NO_LEADER;
    }
    return last;
}

/* open's first connection when following: find the leader and say HELLO, until the deadline. */
static int rpc_follow_connect(kvs__rpc_t *rpc, uint64_t deadline)
{
    uint64_t backoff = FOLLOW_BACKOFF_MIN_NS;
    int rc;
    bool no_leader = false;
    for (;;) {
        rc = rpc_resolve(rpc, NULL, deadline);
        no_leader |= rc == KVS_NO_LEADER;
        if (rc == KVS_TIMED_OUT && no_leader)
            rc = KVS_NO_LEADER;
        if (rc == KVS_OK) {
            uint64_t now = kvs__now_ns();
            uint64_t cdl =
                KVS_MIN(deadline, now + KVS_MAX(rpc->timeout_ns / 4, 200 * KVS_NS_PER_MS));
            rc = rpc_connect(rpc, &rpc->conns[0], cdl);
            if (rc == KVS_OK || rc == KVS_AUTH_FAILED || rc == KVS_INVALID_VERSION)
                return rc;
        } else if (rc != KVS_NO_LEADER && rc != KVS_RPC_FAIL) {
            return rc;
        }
        if (kvs__now_ns() + backoff >= deadline)
            break;
        sleep_until_at_most(backoff, deadline);
        backoff = KVS_MIN(2 * backoff, FOLLOW_BACKOFF_MAX_NS);
    }
    if (rc == KVS_NO_LEADER)
        kvs_error("no master leads the cluster at etcd://%s (prefix %s)",
                  kvs__etcd_endpoints(rpc->etcd), rpc->etcd_prefix);
    else if (rc == KVS_RPC_FAIL)
        kvs_error("cannot reach etcd at %s, or the leader it names",
                  kvs__etcd_endpoints(rpc->etcd));
    return rc;
}

int kvs__rpc_call_until(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp, uint64_t deadline_ns)
{
    if (rpc == NULL || req == NULL || req->failed || rsp == NULL)
        return KVS_INVALID_PARAMS;
    if (kvs__now_ns() >= deadline_ns)
        return KVS_TIMED_OUT;
    if (rpc->etcd != NULL)
        return rpc_follow_call(rpc, req, rsp, deadline_ns);
    bool sent;
    char leader[8];
    int rc =
        rpc_attempt(rpc, req, rsp, deadline_ns, deadline_ns, &sent, leader, sizeof(leader), NULL);
    if (rc == KVS_NOT_LEADER)
        kvs_error("the master at %s:%u is a standby of an etcd cluster: give etcd://... as the "
                  "master address",
                  rpc->host, (unsigned)rpc->port);
    return rc;
}

void kvs__rpc_target(kvs__rpc_t *rpc, char *buf, size_t len)
{
    pthread_mutex_lock(&rpc->lock);
    snprintf(buf, len, "%s:%u", rpc->host ? rpc->host : "", (unsigned)rpc->port);
    pthread_mutex_unlock(&rpc->lock);
}

bool kvs__rpc_follows(const kvs__rpc_t *rpc)
{
    return rpc != NULL && rpc->etcd != NULL;
}

int kvs__rpc_call(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp)
{
    if (rpc == NULL)
        return KVS_INVALID_PARAMS;
    return kvs__rpc_call_until(rpc, req, rsp, kvs__rpc_deadline(rpc));
}
