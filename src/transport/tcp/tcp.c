/* tcp transport. Each endpoint (owner) has a fixed set of connections, each served by one
 * worker thread with a queue of chunks. A worker sends up to `window` requests, then reads
 * the responses in order straight into (or writes them from) the caller's fragments.
 *
 * Cancellation: a wait that reaches its deadline marks the batch cancelled, removes its queued
 * chunks and shuts down the sockets that carry its in-flight chunks, then waits for the
 * workers to let go of them. A shut-down socket can deliver nothing more, so once the wait
 * returns no byte of that batch can land in the caller's memory. Read chunks of other batches
 * that shared such a socket are retried once on a fresh connection; their write chunks fail. */
#define _GNU_SOURCE
#include "tcp_int.h"
#include "../../gpu/gpu_copy.h"
#include "../../proto/net_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_WINDOW 64u
#define IOV_BATCH  64

typedef struct tcp_conn tcp_conn_t;

typedef struct chunk {
    struct chunk *next, *prev; /* in its connection's queue, while `queued` */
    bool queued;
    kvs_batch_t *b;
    tcp_conn_t *conn;
    uint32_t req;
    uint32_t retries;
    uint64_t off; /* within the request */
    uint64_t len;
} chunk_t;

/* GPU fragments: chunks are received into one of two pinned bounce buffers, and the copy of
 * one to the GPU overlaps the receive of the next. A chunk completes once its copy has. */
typedef struct {
    kvs__gpu_stream_t *stream;
    int device;
    void *bounce[KVS_GPU_SLOTS];
    chunk_t *pending[KVS_GPU_SLOTS];
    int cur;
} tcp_gpu_t;

/* recv_response: the chunk completes later, when its GPU copy has. */
#define CHUNK_DEFERRED 1

struct tcp_conn {
    tcp_gpu_t gpu;
    kvs_endpoint_t *ep;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int fd;           /* -1 while disconnected; closed only under lock */
    void *ssl;        /* its TLS session when the transport has TLS on (used by its thread) */
    int opening_fd;   /* the socket of a handshake in progress (cancel shuts it down), or -1 */
    unsigned version; /* negotiated at HELLO */
    chunk_t *head, *tail;
    /* The ids of the batches of the chunks in the worker's window, for cancellation to compare
     * against. Ids, not pointers: another batch's wait may have freed its batch (and a new one
     * taken its address) while the window is still being served. */
    uint64_t inflight[MAX_WINDOW];
    uint32_t ninflight;
    bool shut; /* a cancel shut the socket down: the worker closes it after the window */
    uint32_t next_req_id;
    bool stop;
    bool started;
};

struct kvs_endpoint {
    struct kvs_endpoint *next;
    struct tcp_transport *t;
    char *name;
    struct addrinfo *addrs; /* resolved once, at open: workers never wait for DNS */
    uint32_t refs;          /* under the transport's lock */
    tcp_conn_t *conns;
    uint32_t nconns;
    atomic_uint rr;
};

struct kvs_batch {
    uint64_t id; /* unique per transport's life */
    kvs_xfer_req_t *reqs;
    uint32_t n;
    chunk_t *chunks;
    uint64_t nchunks;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t outstanding;
    bool cancelled;
};

typedef struct tcp_transport {
    kvs_transport_t base;
    kvs__tcp_config_t cfg;
    kvs__tls_t *tls; /* client side, when cfg.tls */
    atomic_uint_fast64_t next_batch_id;
    pthread_mutex_t lock;
    kvs_endpoint_t *eps;
} tcp_transport_t;

/* The connection queue is doubly linked so that a cancel unlinks its own chunks without
 * walking other batches' (a 65,536-key read cancels as many batches). Caller holds c->lock. */
static void queue_push_back(tcp_conn_t *c, chunk_t *ch)
{
    ch->next = NULL;
    ch->prev = c->tail;
    if (c->tail != NULL)
        c->tail->next = ch;
    else
        c->head = ch;
    c->tail = ch;
    ch->queued = true;
}

static void queue_push_front(tcp_conn_t *c, chunk_t *ch)
{
    ch->prev = NULL;
    ch->next = c->head;
    if (c->head != NULL)
        c->head->prev = ch;
    else
        c->tail = ch;
    c->head = ch;
    ch->queued = true;
}

static void queue_unlink(tcp_conn_t *c, chunk_t *ch)
{
    if (ch->prev != NULL)
        ch->prev->next = ch->next;
    else
        c->head = ch->next;
    if (ch->next != NULL)
        ch->next->prev = ch->prev;
    else
        c->tail = ch->prev;
    ch->next = ch->prev = NULL;
    ch->queued = false;
}

int kvs__tcp_config_init(kvs__tcp_config_t *cfg)
{
    if (cfg == NULL)
        return KVS_INVALID_PARAMS;
    *cfg = (kvs__tcp_config_t){
        .conns_per_peer = 8, .chunk_bytes = 2u << 20, .window = 8, .io_timeout_ms = 5000};
    uint64_t conns = cfg->conns_per_peer, window = cfg->window;
    int rc = KVS_OK;
    if (kvs__env_u64("KVS_TCP_CONNECTIONS", 64, &conns) != KVS_OK ||
        kvs__env_size("KVS_TCP_CHUNK_BYTES", &cfg->chunk_bytes) != KVS_OK ||
        kvs__env_u64("KVS_TCP_WINDOW", MAX_WINDOW, &window) != KVS_OK ||
        kvs__env_u64("KVS_TCP_IO_TIMEOUT_MS", 3600000, &cfg->io_timeout_ms) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
    cfg->conns_per_peer = (uint32_t)conns;
    cfg->window = (uint32_t)window;
    return rc;
}

static int config_check(const kvs__tcp_config_t *cfg)
{
    if (cfg == NULL || cfg->conns_per_peer == 0 || cfg->conns_per_peer > 64 ||
        cfg->chunk_bytes < 4096 || cfg->chunk_bytes > KVS_DATA_MAX_CHUNK || cfg->window == 0 ||
        cfg->window > MAX_WINDOW || cfg->io_timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    return KVS_OK;
}

/* ---- socket I/O over a slice of a request's fragments ------------------------------------ */

/* Moves `len` bytes between the socket and the fragments starting `off` bytes into them. */
static int xfer_iov(const kvs__io_t *io, bool to_memory, const struct iovec *iov, uint32_t cnt,
                    uint64_t off, uint64_t len)
{
    uint32_t i = 0;
    while (i < cnt && off >= iov[i].iov_len) {
        off -= iov[i].iov_len;
        i++;
    }
    while (len > 0) {
        struct iovec v[IOV_BATCH];
        int k = 0;
        uint64_t o = off, rem = len;
        for (uint32_t j = i; k < IOV_BATCH && j < cnt && rem > 0; j++, k++) {
            size_t l = (size_t)KVS_MIN((uint64_t)iov[j].iov_len - o, rem);
            v[k].iov_base = (char *)iov[j].iov_base + o;
            v[k].iov_len = l;
            rem -= l;
            o = 0;
        }
        if (k == 0)
            return KVS_INVALID_PARAMS; /* fragments shorter than the request */
        short want;
        ssize_t n = to_memory ? kvs__io_recvv(io, v, k, &want) : kvs__io_sendv(io, v, k, &want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVS_TIMED_OUT : KVS_IO_ERROR;
        }
        if (n == 0)
            return KVS_IO_ERROR;
        len -= (uint64_t)n;
        uint64_t adv = (uint64_t)n;
        while (adv > 0) {
            uint64_t left = iov[i].iov_len - off;
            if (adv >= left) {
                adv -= left;
                off = 0;
                i++;
            } else {
                off += adv;
                adv = 0;
            }
        }
    }
    return KVS_OK;
}

static int io_all(const kvs__io_t *io, bool to_memory, void *buf, size_t len)
{
    struct iovec v = {buf, len};
    return xfer_iov(io, to_memory, &v, 1, 0, len);
}

static kvs__io_t conn_io(const tcp_conn_t *c)
{
    return (kvs__io_t){c->fd, c->ssl};
}

/* Closes the connection's socket and session. Caller holds c->lock (or is its only user). */
static void conn_drop_locked(tcp_conn_t *c)
{
    kvs__io_t io = conn_io(c);
    kvs__io_free(&io);
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* ---- connections -------------------------------------------------------------------------- */

static bool batch_cancelled(kvs_batch_t *b);

/* Whether a batch of the window was cancelled. Safe to follow the chunks' batches: none of the
 * window's chunks has completed yet, so none of their batches can have been freed. */
static bool window_cancelled(chunk_t *const *win, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (batch_cancelled(win[i]->b))
            return true;
    }
    return false;
}

/* Connects to the endpoint's addresses in turn. The socket is published as opening_fd before
 * the connect starts, so a cancelled wait can shut it down: a connect to an owner whose listen
 * backlog is full (SYNs dropped) then ends at once instead of at the I/O time-out. */
static int conn_connect(tcp_conn_t *c, chunk_t *const *win, uint32_t n, uint64_t deadline,
                        int *fd_p)
{
    int rc = KVS_RPC_FAIL;
    for (const struct addrinfo *ai = c->ep->addrs; ai != NULL; ai = ai->ai_next) {
        int fd;
        if (kvs__connect_start(ai, &fd) != KVS_OK)
            continue;
        /* Published first, checked second: a cancel either sees the socket (and shuts it
         * down) or set its batch's flag before this check. */
        pthread_mutex_lock(&c->lock);
        c->opening_fd = fd;
        pthread_mutex_unlock(&c->lock);
        bool cancelled = window_cancelled(win, n);
        rc = cancelled ? KVS_TIMED_OUT : kvs__connect_finish(fd, deadline);
        if (rc == KVS_OK) {
            *fd_p = fd;
            return KVS_OK;
        }
        pthread_mutex_lock(&c->lock);
        c->opening_fd = -1;
        pthread_mutex_unlock(&c->lock);
        close(fd);
        if (rc == KVS_TIMED_OUT)
            break;
    }
    return rc;
}

typedef struct {
    chunk_t *const *win;
    uint32_t n;
} window_t;

/* The handshake's cut test: a cancelled wait shuts opening_fd down (conn_cancel). */
static bool handshake_cut(const void *arg)
{
    const window_t *w = arg;
    return window_cancelled(w->win, w->n);
}

static int conn_open(tcp_conn_t *c, chunk_t *const *win, uint32_t n)
{
    tcp_transport_t *t = c->ep->t;
    uint64_t deadline = kvs__now_ns() + t->cfg.io_timeout_ms * KVS_NS_PER_MS;
    int fd = -1;
    int crc = conn_connect(c, win, n, deadline, &fd);
    if (crc != KVS_OK)
        return crc;
    /* opening_fd stays set through the handshake: a cancelled wait need not sit out its I/O
     * time-out either. */
    char peer[KVS_MAX_NAME_LEN + 16];
    snprintf(peer, sizeof(peer), "the owner at %s", c->ep->name);
    kvs__handshake_t hs = {.auth = &t->cfg.auth,
                           .endpoint = KVS_AUTH_DATA,
                           .server_name = c->ep->name,
                           .node = "tcp",
                           .client_id = 0,
                           .peer = peer,
                           .cut = handshake_cut,
                           .cut_arg = &(window_t){win, n}};
    kvs__hello_rsp_t hr;
    kvs__io_t io = {fd, NULL};
    int rc = t->tls != NULL ? kvs__tls_handshake(t->tls, fd, deadline, &io) : KVS_OK;
    if (rc != KVS_OK && handshake_cut(hs.cut_arg))
        rc = KVS_TIMED_OUT; /* our own cancel shut it, not a peer without TLS */
    else if (rc != KVS_OK)
        kvs_error("tcp: TLS with %s failed: %s", c->ep->name,
                  rc == KVS_AUTH_FAILED ? "it has another token"
                  : rc == KVS_TIMED_OUT ? "no answer in time"
                                        : "it does not speak TLS (is it started with --tls?)");
    if (rc == KVS_OK)
        rc = kvs__client_handshake(&io, &hs, deadline, &hr);
    if (rc == KVS_OK) {
        kvs__set_nonblock(fd, false);
        struct timeval tv = {.tv_sec = (time_t)(t->cfg.io_timeout_ms / 1000),
                             .tv_usec = (suseconds_t)(t->cfg.io_timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    pthread_mutex_lock(&c->lock);
    c->opening_fd = -1;
    if (rc == KVS_OK) {
        c->fd = fd;
        c->ssl = io.ssl;
        c->version = hr.version;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != KVS_OK) {
        if (rc == KVS_IO_ERROR || rc == KVS_TIMED_OUT) /* refusals were logged with why */
            kvs_warn("tcp: handshake with %s failed: %s", c->ep->name, kvs_status_str(rc));
        kvs__io_free(&io);
        close(fd);
    }
    return rc;
}

static void conn_close(tcp_conn_t *c)
{
    pthread_mutex_lock(&c->lock);
    conn_drop_locked(c);
    pthread_mutex_unlock(&c->lock);
}

static void chunk_complete(chunk_t *ch, int status)
{
    kvs_batch_t *b = ch->b;
    pthread_mutex_lock(&b->lock);
    if (status != KVS_OK && b->reqs[ch->req].status == KVS_OK)
        b->reqs[ch->req].status = status;
    if (--b->outstanding == 0)
        pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* Completes the chunk whose copy used bounce slot `slot`, once the copy is done. */
static void gpu_retire(tcp_conn_t *c, int slot)
{
    chunk_t *ch = c->gpu.pending[slot];
    if (ch == NULL)
        return;
    c->gpu.pending[slot] = NULL;
    int rc = kvs__gpu_wait_slot(c->gpu.stream, slot);
    chunk_complete(ch, rc == KVS_OK ? KVS_OK : KVS_TRANSFER_FAIL);
}

static void gpu_flush(tcp_conn_t *c)
{
    for (int i = 0; i < KVS_GPU_SLOTS; i++)
        gpu_retire(c, (c->gpu.cur + i) % KVS_GPU_SLOTS);
}

/* Readies the stream and bounce buffers for `device` (1-based, as in kvs_xfer_req_t.gpu). */
static int gpu_ready(tcp_conn_t *c, uint32_t gpu)
{
    int dev = (int)gpu - 1;
    if (c->gpu.stream != NULL && c->gpu.device != dev) {
        gpu_flush(c);
        kvs__gpu_stream_destroy(c->gpu.stream);
        c->gpu.stream = NULL;
    }
    if (c->gpu.stream == NULL && kvs__gpu_stream_create(dev, &c->gpu.stream) != KVS_OK)
        return KVS_TRANSFER_FAIL;
    c->gpu.device = dev;
    for (int i = 0; i < KVS_GPU_SLOTS; i++) {
        if (c->gpu.bounce[i] == NULL &&
            kvs__gpu_alloc_pinned((size_t)c->ep->t->cfg.chunk_bytes, &c->gpu.bounce[i]) != KVS_OK)
            return KVS_TRANSFER_FAIL;
    }
    return KVS_OK;
}

static void gpu_release(tcp_conn_t *c)
{
    gpu_flush(c);
    kvs__gpu_stream_destroy(c->gpu.stream);
    for (int i = 0; i < KVS_GPU_SLOTS; i++)
        kvs__gpu_free_pinned(c->gpu.bounce[i]);
    memset(&c->gpu, 0, sizeof(c->gpu));
}

/* Puts chunks back at the front of the queue, in order. A chunk whose batch was cancelled
 * meanwhile completes instead: the cancel is decided under b->lock before the canceller takes
 * c->lock to empty the queue, so checking it here, under c->lock, leaves no window in which a
 * cancelled chunk could be queued (and sent) after the queue was emptied. */
static void requeue_front(tcp_conn_t *c, chunk_t **chs, uint32_t n)
{
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = n; i-- > 0;) {
        if (batch_cancelled(chs[i]->b)) {
            chunk_complete(chs[i], KVS_TIMED_OUT);
            continue;
        }
        queue_push_front(c, chs[i]);
    }
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

static bool batch_cancelled(kvs_batch_t *b)
{
    pthread_mutex_lock(&b->lock);
    bool c = b->cancelled;
    pthread_mutex_unlock(&b->lock);
    return c;
}

/* After an I/O error: fail or retry chunks [from, n) of the window. Writes are never sent
 * twice: the first copy may still sit in the owner's socket and land later, after the put
 * completed and its space was reused; failing the put instead makes the client revoke it,
 * and the master then fences its token before the space is reused. */
/* Chunks [unsent, n) were never sent: they are requeued as they are, writes included. */
static void window_fail(tcp_conn_t *c, chunk_t **win, uint32_t from, uint32_t unsent, uint32_t n,
                        int err)
{
    chunk_t *retry[MAX_WINDOW];
    uint32_t nretry = 0;
    for (uint32_t i = from; i < n; i++) {
        chunk_t *ch = win[i];
        bool write = ch->b->reqs[ch->req].op == KVS_XFER_WRITE;
        if (batch_cancelled(ch->b))
            chunk_complete(ch, KVS_TIMED_OUT);
        else if (i >= unsent && err != KVS_INVALID_PARAMS)
            retry[nretry++] = ch;
        else if (!write && ch->retries++ < 1 && err != KVS_INVALID_PARAMS)
            retry[nretry++] = ch; /* reads only: see below */
        else
            chunk_complete(ch, err == KVS_TIMED_OUT ? KVS_TIMED_OUT : KVS_TRANSFER_FAIL);
    }
    if (nretry)
        requeue_front(c, retry, nretry);
}

static int send_request(tcp_conn_t *c, chunk_t *ch, uint32_t req_id)
{
    const kvs_xfer_req_t *r = &ch->b->reqs[ch->req];
    bool write = r->op == KVS_XFER_WRITE;
    uint8_t buf[KVS_FRAME_HDR_LEN + KVS_DATA_REQ_LEN];
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, (uint16_t)c->version,
                          write ? KVS_MSG_DATA_WRITE : KVS_MSG_DATA_READ, req_id,
                          (uint32_t)(KVS_DATA_REQ_LEN + (write ? ch->len : 0))};
    kvs__frame_hdr_encode(&h, buf);
    kvs__wbuf_t w = kvs__wbuf_over(buf + KVS_FRAME_HDR_LEN, KVS_DATA_REQ_LEN, c->version);
    kvs__data_req_t d = {r->segment_id, r->offset + ch->off, ch->len, 0, 0, 0, 0, 0};
    if (write) { /* the chunk lies in the replica's range, which its capability names */
        d.token = r->token;
        d.alloc_offset = r->alloc_size ? r->alloc_offset : r->offset;
        d.alloc_size = r->alloc_size ? r->alloc_size : r->length;
        d.cap = r->cap;
        d.cap_epoch = r->cap_epoch;
    }
    kvs__data_req_encode(&w, &d);
    if (w.failed || w.len != KVS_DATA_REQ_LEN)
        return KVS_INVALID_PARAMS;
    if (write && r->gpu != 0) {
        /* GPU source: into a bounce buffer first (earlier copies of this window are done). */
        gpu_flush(c);
        int g = gpu_ready(c, r->gpu);
        if (g == KVS_OK)
            g = kvs__gpu_copy_slice(c->gpu.stream, false, c->gpu.bounce[0], r->iov, r->iovcnt,
                                    ch->off, ch->len);
        if (g == KVS_OK)
            g = kvs__gpu_sync(c->gpu.stream);
        if (g != KVS_OK)
            return KVS_INVALID_PARAMS; /* fails the chunk without a retry */
    }
    kvs__io_t io = conn_io(c);
    int rc = io_all(&io, false, buf, sizeof(buf));
    if (rc == KVS_OK && write && r->gpu != 0)
        rc = io_all(&io, false, c->gpu.bounce[0], (size_t)ch->len);
    else if (rc == KVS_OK && write)
        rc = xfer_iov(&io, false, r->iov, r->iovcnt, ch->off, ch->len);
    return rc;
}

/* Reads one response. Returns the chunk's status in *status_p, or an I/O error. */
static int recv_response(tcp_conn_t *c, chunk_t *ch, uint32_t req_id, int *status_p)
{
    const kvs_xfer_req_t *r = &ch->b->reqs[ch->req];
    bool write = r->op == KVS_XFER_WRITE;
    uint8_t buf[KVS_FRAME_HDR_LEN + 4];
    kvs__io_t io = conn_io(c);
    int rc = io_all(&io, true, buf, sizeof(buf));
    if (rc != KVS_OK)
        return rc;
    kvs__frame_hdr_t h;
    rc = kvs__frame_hdr_decode(buf, sizeof(buf), KVS_DATA_MAX_CHUNK + 4, &h);
    if (rc != KVS_OK)
        return KVS_PROTOCOL_ERROR;
    /* The status record alone: a READ's bytes follow it, an ERROR's message is not read. */
    kvs__data_status_t ds;
    kvs__data_status_decode(buf + KVS_FRAME_HDR_LEN, KVS_DATA_STATUS_LEN, h.version, NULL, &ds);
    int32_t status = ds.status;
    if (h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG)) {
        kvs_warn("tcp: %s refused a request: %s", c->ep->name, kvs_status_name(status));
        return KVS_PROTOCOL_ERROR; /* it hangs up after an ERROR frame */
    }
    uint16_t want = (uint16_t)((write ? KVS_MSG_DATA_WRITE : KVS_MSG_DATA_READ) | KVS_RSP_FLAG);
    if (h.type != want || h.req_id != req_id || h.len < 4)
        return KVS_PROTOCOL_ERROR;
    if (status == KVS_OK && !write && r->gpu != 0) {
        if (h.len != 4 + ch->len)
            return KVS_PROTOCOL_ERROR;
        /* The slot's previous copy must be done before the buffer is refilled. */
        int slot = c->gpu.cur;
        gpu_retire(c, slot);
        if (gpu_ready(c, r->gpu) != KVS_OK)
            return KVS_IO_ERROR; /* the payload stays unread: the connection is closed */
        rc = io_all(&io, true, c->gpu.bounce[slot], (size_t)ch->len);
        if (rc != KVS_OK)
            return rc;
        if (kvs__gpu_copy_slice(c->gpu.stream, true, c->gpu.bounce[slot], r->iov, r->iovcnt,
                                ch->off, ch->len) != KVS_OK ||
            kvs__gpu_record(c->gpu.stream, slot) != KVS_OK) {
            *status_p = KVS_TRANSFER_FAIL;
            return KVS_OK;
        }
        c->gpu.pending[slot] = ch;
        c->gpu.cur = (slot + 1) % KVS_GPU_SLOTS;
        *status_p = CHUNK_DEFERRED;
        return KVS_OK;
    }
    if (status == KVS_OK && !write) {
        if (h.len != 4 + ch->len)
            return KVS_PROTOCOL_ERROR;
        rc = xfer_iov(&io, true, r->iov, r->iovcnt, ch->off, ch->len);
        if (rc != KVS_OK)
            return rc;
    } else if (h.len != 4) {
        return KVS_PROTOCOL_ERROR;
    }
    *status_p = status;
    return KVS_OK;
}

/* A connection that a cancel shut down, or that the owner closed while it was idle (an owner
 * restarted on the same port), is replaced before anything is sent on it. */
static void conn_check(tcp_conn_t *c)
{
    pthread_mutex_lock(&c->lock);
    bool shut = c->shut;
    c->shut = false;
    pthread_mutex_unlock(&c->lock);
    if (c->fd < 0)
        return;
    char b;
    ssize_t r = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (shut || r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        conn_close(c); /* EOF, an error, or a byte nobody asked for */
}

static void process_window(tcp_conn_t *c, chunk_t **win, uint32_t n)
{
    conn_check(c);
    if (c->fd < 0) {
        int rc = conn_open(c, win, n);
        if (rc != KVS_OK) {
            /* Nothing was sent: chunks of batches still waiting go again (on a connect that
             * another batch's cancel cut short), others fail. */
            bool cut = window_cancelled(win, n);
            chunk_t *again[MAX_WINDOW];
            uint32_t nagain = 0;
            for (uint32_t i = 0; i < n; i++) {
                if (batch_cancelled(win[i]->b))
                    chunk_complete(win[i], KVS_TIMED_OUT);
                else if (cut && win[i]->retries++ < 1)
                    again[nagain++] = win[i];
                else
                    chunk_complete(win[i], KVS_TRANSFER_FAIL);
            }
            if (nagain > 0)
                requeue_front(c, again, nagain);
            return;
        }
    }
    uint32_t base_id = c->next_req_id;
    c->next_req_id += n;
    uint32_t sent = 0, tried = 0;
    int rc = KVS_OK;
    /* A chunk of a cancelled batch is never sent: the wait that cancelled it may have returned
     * already, and its caller reused the memory (or the put's space was reused). */
    bool cancelled = false;
    while (tried < n && rc == KVS_OK) {
        if (batch_cancelled(win[tried]->b)) {
            cancelled = true;
            break;
        }
        rc = send_request(c, win[tried++], base_id + sent);
        if (rc == KVS_OK)
            sent++;
    }
    uint32_t done = 0;
    /* Responses to what was sent arrive in order, even after a send failed half way. */
    uint32_t readable = sent;
    for (; done < readable; done++) {
        int status;
        int io = recv_response(c, win[done], base_id + done, &status);
        if (io != KVS_OK) {
            rc = io;
            break;
        }
        if (status != CHUNK_DEFERRED)
            chunk_complete(win[done], status);
    }
    /* Chunks whose GPU copies are in flight complete when those are done. */
    gpu_flush(c);
    if (done < n) {
        /* Only a stop before sending, with every answer read, leaves the stream in step (and a
         * cancel that shut the socket meanwhile is caught by the next conn_check). */
        if (!(cancelled && rc == KVS_OK && done == sent))
            conn_close(c);
        window_fail(c, win, done, tried, n, rc == KVS_OK ? KVS_TIMED_OUT : rc);
    }
}

static void *conn_thread(void *arg)
{
    tcp_conn_t *c = arg;
    uint32_t window = c->ep->t->cfg.window;
    for (;;) {
        chunk_t *win[MAX_WINDOW];
        uint32_t n = 0;
        pthread_mutex_lock(&c->lock);
        while (!c->stop && c->head == NULL)
            pthread_cond_wait(&c->cond, &c->lock);
        if (c->stop && c->head == NULL) {
            pthread_mutex_unlock(&c->lock);
            break;
        }
        while (c->head != NULL && n < window) {
            chunk_t *ch = c->head;
            queue_unlink(c, ch);
            win[n] = ch;
            c->inflight[n++] = ch->b->id;
        }
        c->ninflight = n;
        pthread_mutex_unlock(&c->lock);
        process_window(c, win, n);
        pthread_mutex_lock(&c->lock);
        c->ninflight = 0;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
    }
    return NULL;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

static void ep_destroy(kvs_endpoint_t *ep)
{
    for (uint32_t i = 0; i < ep->nconns; i++) {
        tcp_conn_t *c = &ep->conns[i];
        if (!c->started)
            continue;
        pthread_mutex_lock(&c->lock);
        c->stop = true;
        if (c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
        gpu_release(c);
        conn_drop_locked(c);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
    }
    kvs__free(ep->conns);
    kvs__free(ep->name);
    if (ep->addrs != NULL)
        freeaddrinfo(ep->addrs);
    kvs__free(ep);
}

static int tcp_ep_open(kvs_transport_t *base, const char *endpoint, uint64_t deadline_ns,
                       kvs_endpoint_t **ep_p)
{
    tcp_transport_t *t = (tcp_transport_t *)base;
    if (t == NULL || endpoint == NULL || ep_p == NULL)
        return KVS_INVALID_PARAMS;
    pthread_mutex_lock(&t->lock);
    for (kvs_endpoint_t *e = t->eps; e != NULL; e = e->next) {
        if (strcmp(e->name, endpoint) == 0) {
            e->refs++;
            *ep_p = e;
            pthread_mutex_unlock(&t->lock);
            return KVS_OK;
        }
    }
    pthread_mutex_unlock(&t->lock);
    /* Resolved outside the lock, within the caller's deadline: no other caller waits on it. */
    char *host = NULL;
    uint16_t port = 0;
    struct addrinfo *addrs = NULL;
    int rc = kvs__parse_host_port(endpoint, "127.0.0.1", &host, &port);
    if (rc != KVS_OK || port == 0)
        rc = KVS_INVALID_PARAMS;
    else
        rc = kvs__resolve(host, port, false, deadline_ns, &addrs);
    kvs__free(host);
    if (rc != KVS_OK)
        return rc;
    kvs_endpoint_t *ep = kvs__calloc(1, sizeof(*ep));
    if (ep == NULL) {
        freeaddrinfo(addrs);
        return KVS_NO_MEMORY;
    }
    ep->t = t;
    ep->addrs = addrs;
    ep->refs = 1;
    ep->name = kvs__strdup(endpoint);
    ep->conns = kvs__calloc(t->cfg.conns_per_peer, sizeof(*ep->conns));
    rc = ep->name != NULL && ep->conns != NULL ? KVS_OK : KVS_NO_MEMORY;
    if (rc == KVS_OK)
        ep->nconns = t->cfg.conns_per_peer;
    for (uint32_t i = 0; rc == KVS_OK && i < ep->nconns; i++) {
        tcp_conn_t *c = &ep->conns[i];
        c->ep = ep;
        c->fd = -1;
        c->opening_fd = -1;
        pthread_mutex_init(&c->lock, NULL);
        kvs__cond_init(&c->cond);
        if (pthread_create(&c->thread, NULL, conn_thread, c) != 0) {
            pthread_mutex_destroy(&c->lock);
            pthread_cond_destroy(&c->cond);
            rc = KVS_INTERNAL_ERROR;
            break;
        }
        c->started = true;
    }
    if (rc != KVS_OK) {
        ep_destroy(ep);
        return rc;
    }
    pthread_mutex_lock(&t->lock);
    /* Another caller may have opened the same endpoint meanwhile: use the first. */
    kvs_endpoint_t *e = t->eps;
    while (e != NULL && strcmp(e->name, endpoint) != 0)
        e = e->next;
    if (e != NULL) {
        e->refs++;
    } else {
        ep->next = t->eps;
        t->eps = ep;
    }
    pthread_mutex_unlock(&t->lock);
    if (e != NULL)
        ep_destroy(ep);
    *ep_p = e != NULL ? e : ep;
    return KVS_OK;
}

static void tcp_ep_hold(kvs_transport_t *base, kvs_endpoint_t *ep)
{
    tcp_transport_t *t = (tcp_transport_t *)base;
    if (t == NULL || ep == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    ep->refs++;
    pthread_mutex_unlock(&t->lock);
}

/* The caller has waited for every batch it submitted to `ep`, so with the last reference no
 * chunk of it is queued: its workers are idle and exit at once. */
static void tcp_ep_close(kvs_transport_t *base, kvs_endpoint_t *ep)
{
    tcp_transport_t *t = (tcp_transport_t *)base;
    if (t == NULL || ep == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    bool last = --ep->refs == 0;
    if (last) {
        kvs_endpoint_t **pp = &t->eps;
        while (*pp != ep)
            pp = &(*pp)->next;
        *pp = ep->next;
    }
    pthread_mutex_unlock(&t->lock);
    if (last)
        ep_destroy(ep);
}

/* ---- batches ------------------------------------------------------------------------------ */

static int tcp_mem_reg(kvs_transport_t *t, void *addr, size_t len)
{
    return t && addr && len ? KVS_OK : KVS_INVALID_PARAMS;
}

static void batch_free(kvs_batch_t *b)
{
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    kvs__free(b->chunks);
    kvs__free(b);
}

static int tcp_submit(kvs_transport_t *base, kvs_xfer_req_t *reqs, uint32_t n, uint64_t deadline_ns,
                      kvs_batch_t **batch_p)
{
    (void)deadline_ns; /* submitting only queues: the workers wait, and the wait has the deadline */
    tcp_transport_t *t = (tcp_transport_t *)base;
    if (t == NULL || (reqs == NULL && n > 0) || batch_p == NULL)
        return KVS_INVALID_PARAMS;
    uint64_t nchunks = 0, cb = t->cfg.chunk_bytes;
    for (uint32_t i = 0; i < n; i++) {
        kvs_xfer_req_t *r = &reqs[i];
        bool ok = r->ep != NULL && r->ep->t == t && r->length > 0 &&
                  (r->op == KVS_XFER_READ || r->op == KVS_XFER_WRITE) &&
                  (r->iov != NULL || r->iovcnt == 0) &&
                  kvs__iov_total(r->iov, r->iovcnt) == r->length &&
                  r->offset <= UINT64_MAX - r->length;
        r->status = ok ? KVS_OK : KVS_INVALID_PARAMS;
        if (ok)
            nchunks += (r->length + cb - 1) / cb;
    }
    kvs_batch_t *b = kvs__calloc(1, sizeof(*b));
    chunk_t *chunks = nchunks ? kvs__calloc(nchunks, sizeof(*chunks)) : NULL;
    if (b == NULL || (nchunks && chunks == NULL)) {
        kvs__free(b);
        kvs__free(chunks);
        return KVS_NO_MEMORY;
    }
    b->id = atomic_fetch_add(&t->next_batch_id, 1) + 1;
    b->reqs = reqs;
    b->n = n;
    b->chunks = chunks;
    b->nchunks = nchunks;
    b->outstanding = nchunks;
    pthread_mutex_init(&b->lock, NULL);
    kvs__cond_init(&b->cond);
    uint64_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvs_xfer_req_t *r = &reqs[i];
        if (r->status != KVS_OK)
            continue;
        for (uint64_t off = 0; off < r->length; off += cb) {
            chunk_t *ch = &chunks[k++];
            ch->b = b;
            ch->req = i;
            ch->off = off;
            ch->len = KVS_MIN(cb, r->length - off);
            kvs_endpoint_t *ep = r->ep;
            ch->conn = &ep->conns[atomic_fetch_add(&ep->rr, 1) % ep->nconns];
        }
    }
    /* Enqueue per connection in one go each, after every chunk is built. */
    for (k = 0; k < nchunks; k++) {
        tcp_conn_t *c = chunks[k].conn;
        pthread_mutex_lock(&c->lock);
        queue_push_back(c, &chunks[k]);
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
    }
    *batch_p = b;
    return KVS_OK;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return (x > y) - (x < y);
}

/* Cancels what is left of a batch: its queued chunks complete at once, and on every connection
 * whose worker serves some of them the socket (or the connect in progress) is shut down, so the
 * worker lets go at once too. Linear in the batch's chunks: nothing else is walked. */
static void batch_cancel(kvs_batch_t *b)
{
    for (uint64_t k = 0; k < b->nchunks; k++) {
        chunk_t *ch = &b->chunks[k];
        tcp_conn_t *c = ch->conn;
        pthread_mutex_lock(&c->lock);
        if (ch->queued) {
            queue_unlink(c, ch);
            chunk_complete(ch, KVS_TIMED_OUT);
        }
        pthread_mutex_unlock(&c->lock);
    }
    tcp_conn_t **conns = kvs__malloc(KVS_MAX(b->nchunks, 1) * sizeof(*conns));
    uint64_t nc = 0;
    if (conns != NULL) {
        for (uint64_t k = 0; k < b->nchunks; k++)
            conns[k] = b->chunks[k].conn;
        qsort(conns, b->nchunks, sizeof(*conns), cmp_ptr);
        for (uint64_t k = 0; k < b->nchunks; k++) {
            if (nc == 0 || conns[nc - 1] != conns[k])
                conns[nc++] = conns[k];
        }
    }
    /* Without memory for the list, every chunk's connection is checked (repeats are harmless). */
    for (uint64_t k = 0; k < (conns != NULL ? nc : b->nchunks); k++) {
        tcp_conn_t *c = conns != NULL ? conns[k] : b->chunks[k].conn;
        pthread_mutex_lock(&c->lock);
        for (uint32_t i = 0; i < c->ninflight; i++) {
            if (c->inflight[i] != b->id)
                continue;
            if (c->fd >= 0) {
                shutdown(c->fd, SHUT_RDWR);
                c->shut = true;
            }
            if (c->opening_fd >= 0)
                shutdown(c->opening_fd, SHUT_RDWR); /* its connect or handshake fails at once */
            break;
        }
        pthread_mutex_unlock(&c->lock);
    }
    kvs__free(conns);
}

static int tcp_wait(kvs_transport_t *base, kvs_batch_t *b, uint64_t deadline_ns)
{
    if (base == NULL || b == NULL)
        return KVS_INVALID_PARAMS;
    pthread_mutex_lock(&b->lock);
    while (b->outstanding > 0 && kvs__cond_wait_until(&b->cond, &b->lock, deadline_ns))
        ;
    if (b->outstanding > 0) {
        b->cancelled = true;
        pthread_mutex_unlock(&b->lock);
        batch_cancel(b);
        pthread_mutex_lock(&b->lock);
        /* The workers let go quickly: their sockets are shut down. */
        while (b->outstanding > 0)
            pthread_cond_wait(&b->cond, &b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    int rc = KVS_OK;
    for (uint32_t i = 0; i < b->n && rc == KVS_OK; i++)
        rc = b->reqs[i].status;
    batch_free(b);
    return rc;
}

static void tcp_destroy(kvs_transport_t *base)
{
    tcp_transport_t *t = (tcp_transport_t *)base;
    if (t == NULL)
        return;
    while (t->eps != NULL) {
        kvs_endpoint_t *e = t->eps;
        t->eps = e->next;
        ep_destroy(e);
    }
    pthread_mutex_destroy(&t->lock);
    kvs__tls_destroy(t->tls);
    kvs__free(t);
}

static const kvs_transport_ops_t tcp_ops = {
    .name = "tcp",
    .caps = KVS_TRANSPORT_CAP_ZERO_COPY | (KVS_GPU_BUILT ? KVS_TRANSPORT_CAP_GPU_DEST : 0),
    .ep_open = tcp_ep_open,
    .ep_hold = tcp_ep_hold,
    .ep_close = tcp_ep_close,
    .mem_reg = tcp_mem_reg,
    .mem_dereg = tcp_mem_reg,
    .submit = tcp_submit,
    .wait = tcp_wait,
    .destroy = tcp_destroy,
};

int kvs__tcp_transport_create(const kvs__tcp_config_t *cfg, kvs_transport_t **t_p)
{
    if (t_p == NULL || config_check(cfg) != KVS_OK)
        return KVS_INVALID_PARAMS;
    tcp_transport_t *t = kvs__calloc(1, sizeof(*t));
    if (t == NULL)
        return KVS_NO_MEMORY;
    t->base.ops = &tcp_ops;
    t->cfg = *cfg;
    if (cfg->tls) {
        char why[256];
        int rc = kvs__tls_create(&cfg->auth, false, &t->tls, why, sizeof(why));
        if (rc != KVS_OK) {
            kvs_error("tcp: %s", why);
            kvs__free(t);
            return rc;
        }
    }
    pthread_mutex_init(&t->lock, NULL);
    *t_p = &t->base;
    return KVS_OK;
}
