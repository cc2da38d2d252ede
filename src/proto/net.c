/* Socket helpers with deadlines and the blocking master RPC connection. */
#define _GNU_SOURCE
#include "net_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
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

static int resolve(const char *host, uint16_t port, int passive, struct addrinfo **res_p)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", (unsigned)port);
    int rc = getaddrinfo(host, ports, &hints, res_p);
    if (rc != 0) {
        kvs_error("cannot resolve '%s': %s", host ? host : "(any)", gai_strerror(rc));
        return KVS_INVALID_PARAMS;
    }
    return KVS_OK;
}

int kvs__tcp_listen(const char *host, uint16_t port, int backlog)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 1, &res);
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

static int wait_fd(int fd, short events, uint64_t deadline_ns)
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

int kvs__tcp_connect(const char *host, uint16_t port, uint64_t deadline_ns)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 0, &res);
    if (rc != KVS_OK)
        return rc;
    int fd = -1;
    rc = KVS_RPC_FAIL;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            rc = wait_fd(fd, POLLOUT, deadline_ns);
            int err = 0;
            socklen_t len = sizeof(err);
            if (rc == KVS_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                break;
            if (rc == KVS_OK)
                rc = KVS_RPC_FAIL;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rc == KVS_OK ? KVS_RPC_FAIL : rc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int kvs__send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline_ns);
            if (rc != KVS_OK)
                return rc;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return KVS_IO_ERROR;
        }
    }
    return KVS_OK;
}

int kvs__recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return KVS_IO_ERROR;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline_ns);
            if (rc != KVS_OK)
                return rc;
        } else if (errno != EINTR) {
            return KVS_IO_ERROR;
        }
    }
    return KVS_OK;
}

/* ---- master RPC connection -------------------------------------------------------------- */

struct kvs__rpc {
    char *host;
    uint16_t port;
    char node[KVS_MAX_NAME_LEN + 1];
    uint64_t timeout_ns;
    int fd;
    uint32_t next_req_id;
    unsigned version; /* negotiated at HELLO; this build's highest before the first */
    kvs__hello_rsp_t hello;
    pthread_mutex_t lock;
};

static void rpc_disconnect(kvs__rpc_t *rpc)
{
    if (rpc->fd >= 0)
        close(rpc->fd);
    rpc->fd = -1;
}

/* One frame out, one frame back, with the request id and type matched. Lock held. */
static int rpc_exchange(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp)
{
    uint64_t deadline = kvs__now_ns() + rpc->timeout_ns;
    uint32_t id = ++rpc->next_req_id;
    kvs__frame_hdr_t sent;
    if (kvs__frame_hdr_decode(req->data, req->len, KVS_FRAME_MAX_PAYLOAD, &sent) != KVS_OK)
        return KVS_INVALID_PARAMS;
    sent.req_id = id;
    kvs__frame_hdr_encode(&sent, req->data);
    kvs__frame_log("rpc", "->", &sent, req->data + KVS_FRAME_HDR_LEN, sent.len);
    int rc = kvs__send_all(rpc->fd, req->data, req->len, deadline);
    uint8_t hb[KVS_FRAME_HDR_LEN];
    if (rc == KVS_OK)
        rc = kvs__recv_all(rpc->fd, hb, sizeof(hb), deadline);
    kvs__frame_hdr_t h;
    if (rc == KVS_OK) {
        rc = kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &h);
        if (rc == KVS_OK && (h.req_id != id || (h.type != (sent.type | KVS_RSP_FLAG) &&
                                                h.type != (KVS_MSG_ERROR | KVS_RSP_FLAG))))
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
                rc = kvs__recv_all(rpc->fd, w->data, h.len, deadline);
            w->len = rc == KVS_OK ? h.len : 0;
        }
        rsp->version = h.version;
        if (rc == KVS_OK)
            kvs__frame_log("rpc", "<-", &h, rsp->data, rsp->len);
    }
    if (rc != KVS_OK) {
        rpc_disconnect(rpc);
        return rc == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_RPC_FAIL;
    }
    if (h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG)) {
        kvs__error_rsp_t e;
        if (kvs__error_rsp_decode(rsp->data, rsp->len, rsp->version, NULL, &e) == KVS_OK) {
            kvs_error("master refused %s: %.*s (%s)", kvs__msg_name(sent.type), (int)e.message.len,
                      e.message.ptr, kvs_status_name(e.status));
            return e.status < 0 ? e.status : KVS_RPC_FAIL;
        }
        return KVS_RPC_FAIL;
    }
    return KVS_OK;
}

static int rpc_connect(kvs__rpc_t *rpc)
{
    uint64_t deadline = kvs__now_ns() + rpc->timeout_ns;
    int fd = kvs__tcp_connect(rpc->host, rpc->port, deadline);
    if (fd < 0) {
        kvs_error("cannot reach the master at %s:%u: %s", rpc->host, (unsigned)rpc->port,
                  kvs_status_str(fd));
        return fd == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_RPC_FAIL;
    }
    rpc->fd = fd;
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    /* HELLO goes out in our highest version; the master answers in the one both speak. */
    kvs__frame_begin(&w, KVS_MSG_HELLO, 0, KVS_PROTO_VERSION_MAX);
    kvs__hello_req_t hello = {.version_min = KVS_PROTO_VERSION_MIN,
                              .version_max = KVS_PROTO_VERSION_MAX,
                              .node = kvs__str_c(rpc->node),
                              .client_id = rpc->hello.client_id,
                              .next_probe = KVS_PROTO_VERSION_MAX};
    kvs__hello_req_encode(&w, &hello);
    int rc = kvs__frame_end(&w);
    kvs__wbuf_t rsp;
    kvs__wbuf_init(&rsp);
    if (rc == KVS_OK)
        rc = rpc_exchange(rpc, &w, &rsp);
    if (rc == KVS_OK) {
        kvs__hello_rsp_t h;
        rc = kvs__hello_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &h);
        if (rc == KVS_OK && h.status != KVS_OK)
            rc = h.status;
        if (rc == KVS_OK && (h.version != rsp.version || h.version < KVS_PROTO_VERSION_MIN ||
                             h.version > KVS_PROTO_VERSION_MAX)) {
            kvs_error("the master at %s:%u chose protocol version %u (this client speaks %u..%u)",
                      rpc->host, (unsigned)rpc->port, h.version, KVS_PROTO_VERSION_MIN,
                      KVS_PROTO_VERSION_MAX);
            rc = KVS_INVALID_VERSION;
        }
        if (rc == KVS_OK) {
            rpc->hello = h;
            rpc->version = h.version;
        }
    }
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    if (rc != KVS_OK) {
        kvs_error("handshake with the master at %s:%u failed: %s", rpc->host, (unsigned)rpc->port,
                  kvs_status_str(rc));
        rpc_disconnect(rpc);
    }
    return rc;
}

int kvs__rpc_open(const kvs__rpc_config_t *cfg, kvs__rpc_t **rpc_p)
{
    if (cfg == NULL || rpc_p == NULL || cfg->host == NULL || cfg->port == 0 || cfg->timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    kvs__rpc_t *rpc = kvs__calloc(1, sizeof(*rpc));
    if (rpc == NULL)
        return KVS_NO_MEMORY;
    rpc->fd = -1;
    rpc->version = KVS_PROTO_VERSION_MAX;
    rpc->host = kvs__strdup(cfg->host);
    rpc->port = cfg->port;
    rpc->timeout_ns = cfg->timeout_ms * KVS_NS_PER_MS;
    if (cfg->node != NULL)
        snprintf(rpc->node, sizeof(rpc->node), "%s", cfg->node);
    else if (gethostname(rpc->node, sizeof(rpc->node) - 1) != 0)
        snprintf(rpc->node, sizeof(rpc->node), "localhost");
    pthread_mutex_init(&rpc->lock, NULL);
    int rc = rpc->host ? rpc_connect(rpc) : KVS_NO_MEMORY;
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
    rpc_disconnect(rpc);
    pthread_mutex_destroy(&rpc->lock);
    kvs__free(rpc->host);
    kvs__free(rpc);
}

const kvs__hello_rsp_t *kvs__rpc_hello(const kvs__rpc_t *rpc)
{
    return &rpc->hello;
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
    pthread_mutex_lock(&rpc->lock);
    uint64_t v = rpc->hello.incarnation;
    pthread_mutex_unlock(&rpc->lock);
    return v;
}

void kvs__rpc_begin(kvs__rpc_t *rpc, kvs__wbuf_t *req, uint16_t type)
{
    kvs__frame_begin(req, type, 0, kvs__rpc_version(rpc));
}

const char *kvs__rpc_node(const kvs__rpc_t *rpc)
{
    return rpc->node;
}

int kvs__rpc_call(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp)
{
    if (rpc == NULL || req == NULL || req->failed || rsp == NULL)
        return KVS_INVALID_PARAMS;
    pthread_mutex_lock(&rpc->lock);
    int rc = rpc->fd < 0 ? rpc_connect(rpc) : KVS_OK;
    if (rc == KVS_OK)
        rc = rpc_exchange(rpc, req, rsp);
    pthread_mutex_unlock(&rpc->lock);
    return rc;
}
