/* The owner's data server: a thread per connection moving bytes straight between the socket
 * and segment memory. Every request is bounds-checked against a served segment before any
 * byte moves; a peer that breaks the protocol loses its own connection only. */
#define _GNU_SOURCE
#include "owner_int.h"
#include "../transport/shm/shm_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Tokens of puts the master has fenced (ended, revoked, discarded): an open-addressing set
 * (token 0 marks a free slot; tokens are never 0), each with its put's capability epoch. A
 * fence is kept while a capability of its put could still be accepted (its epoch or the next:
 * see write_allowed) and dropped after, so the set holds about two epochs of puts. */
typedef struct {
    uint64_t token;
    uint64_t epoch;
} fence_slot_t;

typedef struct {
    fence_slot_t *slots;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} fence_set_t;

typedef struct {
    uint64_t id;
    char *base;
    uint64_t size;
    int fd; /* the segment's memfd for same-host readers, or -1 */
    fence_set_t fenced;
    uint64_t epoch; /* the master's capability epoch, as its latest reply said */
    bool keyed;     /* writes need a capability under write_key */
    uint8_t write_key[KVS_WRITE_KEY_LEN];
    uint64_t key_gen; /* counts write keys (kvs__data_server_rekey): a write in progress under
                       * an older one stops */
} served_t;

static bool fence_has(const fence_set_t *f, uint64_t token)
{
    if (f->cap == 0)
        return false;
    for (size_t i = kvs__hash64(&token, sizeof(token)) & (f->cap - 1);;
         i = (i + 1) & (f->cap - 1)) {
        if (f->slots[i].token == token)
            return true;
        if (f->slots[i].token == 0)
            return false;
    }
}

static void fence_put(fence_set_t *f, fence_slot_t e)
{
    size_t i = kvs__hash64(&e.token, sizeof(e.token)) & (f->cap - 1);
    while (f->slots[i].token != 0 && f->slots[i].token != e.token)
        i = (i + 1) & (f->cap - 1);
    if (f->slots[i].token == 0) {
        f->slots[i] = e;
        f->n++;
    }
}

/* A fence still needed at epoch `now`: a capability of its epoch would still be accepted. */
static bool fence_live(fence_slot_t e, uint64_t now)
{
    return e.epoch + 1 >= now;
}

/* Rebuilds the set in `cap` slots with the fences still live at `epoch`. NO_MEMORY leaves it
 * unchanged. */
static int fence_rebuild(fence_set_t *f, size_t cap, uint64_t epoch)
{
    fence_set_t g = {kvs__calloc(cap, sizeof(fence_slot_t)), cap, 0};
    if (g.slots == NULL)
        return KVS_NO_MEMORY;
    for (size_t i = 0; i < f->cap; i++) {
        if (f->slots[i].token != 0 && fence_live(f->slots[i], epoch))
            fence_put(&g, f->slots[i]);
    }
    kvs__free(f->slots);
    *f = g;
    return KVS_OK;
}

/* Adds a fence, growing to keep the set at most half full (after dropping the fences no
 * longer needed at `epoch`). NO_MEMORY leaves it unchanged. */
static int fence_add(fence_set_t *f, uint64_t token, uint64_t fence_epoch, uint64_t epoch)
{
    if (token == 0 || (f->cap && fence_has(f, token)))
        return KVS_OK;
    if (2 * (f->n + 1) > f->cap) {
        int rc = fence_rebuild(f, f->cap ? f->cap : 64, epoch);
        if (rc == KVS_OK && 2 * (f->n + 1) > f->cap)
            rc = fence_rebuild(f, 2 * f->cap, epoch);
        if (rc != KVS_OK)
            return rc;
    }
    fence_put(f, (fence_slot_t){token, fence_epoch});
    return KVS_OK;
}

/* A connection, served by a thread of its own that ends with it: the thread unlinks it and
 * closes its descriptor under conn_lock, so every listed descriptor is open and owned (destroy
 * shuts them down under that lock, never a number closed and reused meanwhile). */
typedef struct dconn {
    struct dconn *prev, *next; /* conn_lock */
    int fd;
    kvs__data_server_t *srv;
} dconn_t;

/* Same-host handshakes served at once, each on a thread of its own: a peer that connects and
 * keeps silent holds one slot until its handshake time-out, never the others; beyond this many
 * they wait in the backlog. */
#define SHM_MAX_HANDSHAKES 16

/* A same-host handshake in progress. Its thread closes fd under shm_lock as it ends, so the
 * watchdog (unix_thread) shuts down only descriptors still in use. */
typedef struct {
    kvs__data_server_t *srv;
    int fd; /* -1: free */
    uint64_t deadline_ns;
    bool shut; /* past its deadline: shut down */
} shm_slot_t;

/* The live form of KVS_OWNER_METRICS (gauges are computed when rendered). */
typedef struct {
#define DSTAT_ATOMIC_COUNTER                                 atomic_uint_fast64_t
#define DSTAT_ATOMIC_GAUGE                                   atomic_uint_fast64_t
#define DSTAT_ATOMIC_HIST                                    kvs__hist_t
#define DSTAT_FIELD_(kind, unit, name, family, labels, help) DSTAT_ATOMIC_##kind name;
    KVS_OWNER_METRICS(DSTAT_FIELD_)
#undef DSTAT_FIELD_
} dstats_t;

struct kvs__data_server {
    kvs__data_server_config_t cfg;
    int listen_fd;
    uint16_t port;
    pthread_t accept_thread;
    bool accept_started;
    kvs__tls_t *tls;                 /* server side, when cfg.tls */
    char name[KVS_MAX_NAME_LEN + 8]; /* "advertise_host:port", set before any thread starts */
    int unix_fd;                     /* the shm socket, or -1 */
    char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    pthread_t unix_thread;
    bool unix_started;
    pthread_mutex_t shm_lock;
    pthread_cond_t shm_idle; /* shm_busy fell to 0 */
    shm_slot_t shm_slots[SHM_MAX_HANDSHAKES];
    unsigned shm_busy;
    atomic_bool stopping;
    pthread_rwlock_t seg_lock; /* readers: a request's memory steps (segment_io); writer:
                                * add/remove/fence */
    served_t *segs;
    uint32_t nseg;
    pthread_mutex_t conn_lock;
    pthread_cond_t conns_gone; /* nconns fell to 0 (destroy waits for it) */
    dconn_t *conns;
    uint32_t nconns;
    kvs__spare_fd_t spare;   /* the accept thread's, for running out of descriptors */
    uint64_t refuse_warn_ns; /* the accept thread's warnings, at most once a second */
    dstats_t st;
};

void kvs__data_server_config_init(kvs__data_server_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->bind_host = "127.0.0.1";
    cfg->max_conns = 1024;
    cfg->io_timeout_ms = 5000;
    cfg->handshake_timeout_ms = 5000;
    cfg->idle_timeout_ms = 60000;
#ifdef KVS_TEST_HOOKS
    /* Fault injection for integration tests (a slow owner): not in production builds. */
    if (kvs__env_u64("KVS_DATA_INJECT_DELAY_US", 60000000, &cfg->inject_delay_us) != KVS_OK)
        cfg->inject_delay_us = 0;
#endif
}

/* Sends a response frame made of a header and an i32 status, plus `extra` more payload bytes
 * announced in the header (a READ's data, sent by the caller right after). */
static int send_status(const kvs__io_t *io, unsigned version, uint16_t type, uint32_t req_id,
                       int32_t status, uint64_t extra, uint64_t deadline)
{
    uint8_t buf[KVS_FRAME_HDR_LEN + KVS_DATA_STATUS_LEN];
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, (uint16_t)version, (uint16_t)(type | KVS_RSP_FLAG),
                          req_id, (uint32_t)(KVS_DATA_STATUS_LEN + extra)};
    kvs__frame_hdr_encode(&h, buf);
    kvs__wbuf_t w = kvs__wbuf_over(buf + KVS_FRAME_HDR_LEN, KVS_DATA_STATUS_LEN, version);
    kvs__data_status_t ds = {status};
    kvs__data_status_encode(&w, &ds);
    if (w.failed || w.len != KVS_DATA_STATUS_LEN)
        return KVS_INTERNAL_ERROR;
    return kvs__io_send_all(io, buf, sizeof(buf), deadline);
}

/* Sends an ERROR frame (request id 0: about the connection) if the socket takes it without
 * waiting; for a peer about to be dropped. */
static void send_error_now(int fd, int status, const char *msg)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, KVS_MSG_ERROR | KVS_RSP_FLAG, 0, KVS_PROTO_VERSION_MIN);
    kvs__error_rsp_t e = {status, kvs__str_c(msg)};
    kvs__error_rsp_encode(&w, &e);
    if (kvs__frame_end(&w) == KVS_OK) {
        ssize_t n = send(fd, w.data, w.len, MSG_DONTWAIT | MSG_NOSIGNAL);
        KVS_UNUSED(n);
    }
    kvs__wbuf_free(&w);
}

static void refuse(atomic_uint_fast64_t *reason)
{
    atomic_fetch_add_explicit(reason, 1, memory_order_relaxed);
}

/* The reason a request check failed (check_range's or segment_io's status). */
static atomic_uint_fast64_t *refusal_of(kvs__data_server_t *s, int rc)
{
    return rc == KVS_SEGMENT_NOT_FOUND ? &s->st.refused_not_served
           : rc == KVS_INVALID_WRITE   ? &s->st.refused_write
                                       : &s->st.refused_range;
}

static void served(atomic_uint_fast64_t *requests, atomic_uint_fast64_t *bytes, kvs__hist_t *lat,
                   uint64_t len, uint64_t t0)
{
    atomic_fetch_add_explicit(requests, 1, memory_order_relaxed);
    if (bytes != NULL)
        atomic_fetch_add_explicit(bytes, len, memory_order_relaxed);
    kvs__hist_add(lat, kvs__now_ns() - t0);
}

static void send_error(const kvs__io_t *io, unsigned version, uint32_t req_id, int status,
                       const char *msg, uint64_t deadline)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, KVS_MSG_ERROR | KVS_RSP_FLAG, req_id, version);
    kvs__error_rsp_t e = {status, kvs__str_c(msg)};
    kvs__error_rsp_encode(&w, &e);
    if (kvs__frame_end(&w) == KVS_OK)
        kvs__io_send_all(io, w.data, w.len, deadline);
    kvs__wbuf_free(&w);
}

/* A connection's MAC context for capabilities, keyed for the segment it last checked. */
typedef struct {
    kvs__cap_ctx_t *ctx;
    uint64_t segment_id; /* 0: not keyed yet */
    uint64_t key_gen;    /* of that segment's key */
} cap_cache_t;

/* Whether a write lies inside the range its capability names: the master allocated that range
 * to the writer's put (only the master and this owner know the key). */
static bool write_allowed(const served_t *g, const kvs__data_req_t *r, cap_cache_t *cc)
{
    if (r->alloc_size == 0 || r->offset < r->alloc_offset ||
        r->offset - r->alloc_offset > r->alloc_size ||
        r->length > r->alloc_size - (r->offset - r->alloc_offset))
        return false;
    /* Made in this epoch or the last (every write of a put comes before the master discards
     * it, one epoch after its start), or in the next (our view of the epoch may lag). Older
     * capabilities are refused: their puts' fences are forgotten. */
    if (r->cap_epoch + 1 < g->epoch || r->cap_epoch > g->epoch + 1)
        return false;
    if (cc->segment_id != g->id || cc->key_gen != g->key_gen) {
        int rc = cc->ctx == NULL ? kvs__cap_ctx_new(g->write_key, &cc->ctx)
                                 : kvs__cap_ctx_rekey(cc->ctx, g->write_key);
        if (rc != KVS_OK)
            return false;
        cc->segment_id = g->id;
        cc->key_gen = g->key_gen;
    }
    uint64_t cap = kvs__cap_ctx_compute(cc->ctx, g->id, r->alloc_offset, r->alloc_size, r->token,
                                        r->cap_epoch);
    return cap != 0 && cap == r->cap;
}

/* Finds the segment and checks [offset, offset + length) lies inside it, and for a write that
 * its put is not fenced and, with `cap` (the connection's MAC context), that its capability
 * allows it (once per request). *key_gen_p is the segment's key generation the request was
 * checked under (0: not yet; set now): a write whose segment was rekeyed since (a new leader
 * master) is refused part way, as a fenced one is. Read lock held. */
static int check_range(kvs__data_server_t *s, const kvs__data_req_t *r, bool write,
                       cap_cache_t *cap, uint64_t *key_gen_p, char **addr_p)
{
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->segs[i].id != r->segment_id)
            continue;
        if (r->length == 0 || r->length > KVS_DATA_MAX_CHUNK || r->offset > s->segs[i].size ||
            r->length > s->segs[i].size - r->offset)
            return KVS_INVALID_PARAMS;
        /* A write belongs to a put; a fenced put's space may already hold another object. */
        if (write && (r->token == 0 || fence_has(&s->segs[i].fenced, r->token)))
            return KVS_INVALID_WRITE;
        if (write && cap != NULL && s->segs[i].keyed && !write_allowed(&s->segs[i], r, cap))
            return KVS_INVALID_WRITE;
        if (write && *key_gen_p != 0 && *key_gen_p != s->segs[i].key_gen)
            return KVS_INVALID_WRITE;
        *key_gen_p = s->segs[i].key_gen;
        *addr_p = s->segs[i].base + r->offset;
        return KVS_OK;
    }
    return KVS_SEGMENT_NOT_FOUND;
}

#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define TSAN_IGNORE_BEGIN() __tsan_ignore_thread_begin()
#define TSAN_IGNORE_END()   __tsan_ignore_thread_end()
#else
#define TSAN_IGNORE_BEGIN() ((void)0)
#define TSAN_IGNORE_END()   ((void)0)
#endif

/* Moves the bytes of request `r` between the socket and its segment; *done_p says how many
 * moved. Returns OK, a transport error (IO_ERROR, TIMED_OUT), or the refusal check_range gives
 * when the segment went or the put was fenced part way (SEGMENT_NOT_FOUND, INVALID_WRITE).
 *
 * The segment lock is held around each non-blocking send or receive only (the step that
 * touches segment memory, bounded by what the socket buffer holds), never while waiting for
 * the peer: a slow or stopped peer cannot hold up a fence, a remount, or through the
 * writer-preferring lock every other request. What the lock guaranteed still holds, step by
 * step: each step re-checks under the lock that the segment is still served and the put not
 * fenced before it touches memory, and fence and remove take the lock for writing, so once
 * they return no step is under way and every later one sees the change. A fenced put's bytes
 * therefore never land after its fence returned (the rest of its payload is drained, and the
 * write refused), and no step reads or writes memory the owner freed after a remove. A read
 * cut off by a remove has sent part of its data after an OK header: the caller closes the
 * connection, so the reader gets an error, never a short or foreign object as success. (The
 * bytes it did get came from the segment its lookup named: a remounted segment gets fresh
 * memory and a new id.)
 *
 * Segment memory is shared with every peer by design, like memory a NIC writes: requests on
 * different connections are ordered by the protocol (the master hands out space; readers read
 * complete objects), through sockets and other processes that ThreadSanitizer cannot see, so
 * its checks are off for these bytes (and only these). */
static int segment_io(kvs__data_server_t *s, const kvs__io_t *io, const kvs__data_req_t *r,
                      bool to_segment, uint64_t key_gen, uint64_t deadline, uint64_t *done_p)
{
    uint64_t done = 0;
    int rc = KVS_OK;
    while (done < r->length) {
        pthread_rwlock_rdlock(&s->seg_lock);
        char *addr = NULL;
        ssize_t n = -1;
        int err = 0;
        short events = to_segment ? POLLIN : POLLOUT;
        rc = check_range(s, r, to_segment, NULL, &key_gen, &addr);
        if (rc == KVS_OK) {
            size_t want = (size_t)(r->length - done);
            TSAN_IGNORE_BEGIN();
            n = to_segment ? kvs__io_recv(io, addr + done, want, &events)
                           : kvs__io_send(io, addr + done, want, &events);
            err = errno;
            TSAN_IGNORE_END();
        }
        pthread_rwlock_unlock(&s->seg_lock);
        if (rc != KVS_OK)
            break;
        if (n > 0) {
            done += (uint64_t)n;
        } else if (n == 0) {
            rc = KVS_IO_ERROR; /* the peer closed */
            break;
        } else if (err == EAGAIN || err == EWOULDBLOCK) {
            rc = kvs__wait_fd(io->fd, events, deadline);
            if (rc != KVS_OK)
                break;
        } else if (err != EINTR) {
            rc = KVS_IO_ERROR;
            break;
        }
    }
    *done_p = done;
    return rc;
}

/* Reads and drops `len` bytes of the stream (a refused payload). */
static int drain(const kvs__io_t *io, uint64_t len, uint64_t deadline)
{
    char sink[16384];
    while (len > 0) {
        size_t n = (size_t)KVS_MIN(len, (uint64_t)sizeof(sink));
        int rc = kvs__io_recv_all(io, sink, n, deadline);
        if (rc != KVS_OK)
            return rc;
        len -= n;
    }
    return KVS_OK;
}

/* Sends a HELLO or AUTH reply frame of `type` holding `rec` encoded by `encode`. */
static int send_reply(const kvs__io_t *io, uint16_t type, uint32_t req_id, unsigned version,
                      void (*encode)(kvs__wbuf_t *, const void *), const void *rec,
                      uint64_t deadline)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, (uint16_t)(type | KVS_RSP_FLAG), req_id, version);
    encode(&w, rec);
    int rc = kvs__frame_end(&w);
    if (rc == KVS_OK)
        rc = kvs__io_send_all(io, w.data, w.len, deadline);
    kvs__wbuf_free(&w);
    return rc;
}

static void encode_hello_rsp(kvs__wbuf_t *w, const void *m)
{
    kvs__hello_rsp_encode(w, m);
}

static void encode_auth_rsp(kvs__wbuf_t *w, const void *m)
{
    kvs__auth_rsp_encode(w, m);
}

/* With a secret, the frame after HELLO must be an AUTH whose proof is right for this
 * connection's nonces; anything else ends the connection. */
static int expect_auth(kvs__data_server_t *s, const kvs__io_t *io, unsigned v,
                       const kvs__auth_pending_t *st, uint64_t deadline)
{
    uint8_t hb[KVS_FRAME_HDR_LEN], pb[256];
    /* Zeroed: a header that does not decode (a frame too large for an AUTH, say) is refused
     * about the connection (request id 0), not with whatever the stack held. */
    kvs__frame_hdr_t h = {0};
    kvs__auth_req_t req;
    int rc = kvs__io_recv_all(io, hb, sizeof(hb), deadline);
    if (rc != KVS_OK)
        return rc;
    if (kvs__frame_hdr_decode(hb, sizeof(hb), sizeof(pb), &h) != KVS_OK || h.type != KVS_MSG_AUTH) {
        /* (The header may not have decoded: the error is about the connection, id 0.) */
        send_error(io, v, 0, KVS_AUTH_FAILED, "AUTH must follow HELLO", deadline);
        return KVS_AUTH_FAILED;
    }
    if ((rc = kvs__io_recv_all(io, pb, h.len, deadline)) != KVS_OK)
        return rc;
    if (kvs__auth_req_decode(pb, h.len, h.version, NULL, &req) != KVS_OK ||
        !kvs__auth_server_verify(&s->cfg.auth, KVS_AUTH_DATA, s->name, st, &req)) {
        kvs_warn("data server: refused a peer with a wrong proof");
        send_error(io, v, h.req_id, KVS_AUTH_FAILED, "wrong proof: this owner has another token",
                   deadline);
        return KVS_AUTH_FAILED;
    }
    kvs__auth_rsp_t ar = {KVS_OK, 0};
    return send_reply(io, KVS_MSG_AUTH, h.req_id, v, encode_auth_rsp, &ar, deadline);
}

/* Answers a data connection's HELLO with the highest version both sides speak, or an ERROR
 * that says why there is none; with a secret, the AUTH that must follow too. */
static int answer_hello(kvs__data_server_t *s, const kvs__io_t *io, const kvs__frame_hdr_t *h,
                        const uint8_t *payload, uint64_t deadline, unsigned *version_p)
{
    kvs__hello_req_t req;
    unsigned reply_v = kvs__proto_reply_version(h->version);
    if (kvs__hello_req_decode(payload, h->len, h->version, NULL, &req) != KVS_OK) {
        send_error(io, reply_v, h->req_id, KVS_PROTOCOL_ERROR, "HELLO is malformed", deadline);
        return KVS_PROTOCOL_ERROR;
    }
    unsigned v = kvs__proto_negotiate(req.version_min, req.version_max);
    if (v == 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "peer speaks protocol %u..%u, this owner speaks %u..%u",
                 req.version_min, req.version_max, KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
        send_error(io, reply_v, h->req_id, KVS_INVALID_VERSION, msg, deadline);
        return KVS_INVALID_VERSION;
    }
    kvs__hello_rsp_t rsp = {.status = KVS_OK, .version = v, .next_probe = req.next_probe};
    kvs__auth_pending_t st;
    if (kvs__auth_server_hello(&s->cfg.auth, KVS_AUTH_DATA, s->name, &req, &st, &rsp) != KVS_OK) {
        send_error(io, v, h->req_id, KVS_AUTH_FAILED, "HELLO carries no nonce", deadline);
        return KVS_AUTH_FAILED;
    }
    int rc = send_reply(io, KVS_MSG_HELLO, h->req_id, v, encode_hello_rsp, &rsp, deadline);
    if (rc == KVS_OK && st.required)
        rc = expect_auth(s, io, v, &st, deadline);
    if (rc == KVS_OK)
        *version_p = v;
    return rc;
}

/* Waits for the next request to begin. Before the handshake is done the peer has until
 * `handshake_deadline` (it is told so when that passes); after it, idle_timeout_ms. destroy
 * shuts the socket down to wake us. Returns false to close the connection. */
static bool wait_request(kvs__data_server_t *s, const kvs__io_t *io, bool handshake_done,
                         uint64_t handshake_deadline)
{
    uint64_t deadline = handshake_deadline;
    if (handshake_done)
        deadline = s->cfg.idle_timeout_ms ? kvs__now_ns() + s->cfg.idle_timeout_ms * KVS_NS_PER_MS
                                          : UINT64_MAX;
    /* (Bytes TLS has decrypted already are not seen by poll.) */
    int rc = kvs__io_pending(io) ? KVS_OK : kvs__wait_fd(io->fd, POLLIN, deadline);
    if (rc == KVS_TIMED_OUT && !handshake_done && io->ssl == NULL) {
        char msg[64];
        snprintf(msg, sizeof(msg), "no handshake within %llu ms",
                 (unsigned long long)s->cfg.handshake_timeout_ms);
        send_error_now(io->fd, KVS_TIMED_OUT, msg);
    }
    return rc == KVS_OK && !atomic_load(&s->stopping);
}

/* Serves one connection's requests. Returns when the peer leaves, errs, times out, or the
 * server stops. */
static void serve_requests(kvs__data_server_t *s, const kvs__io_t *io, uint64_t handshake_deadline,
                           cap_cache_t *cc)
{
    uint64_t io_ns = s->cfg.io_timeout_ms * KVS_NS_PER_MS;
    bool hello = false; /* the handshake (HELLO, and AUTH with a secret) is done */
    unsigned ver = KVS_PROTO_VERSION_MIN; /* negotiated at HELLO */
    uint8_t hb[KVS_FRAME_HDR_LEN], pb[KVS_HANDSHAKE_MAX_PAYLOAD];
    for (;;) {
        if (!wait_request(s, io, hello, handshake_deadline))
            return;
        uint64_t deadline = kvs__now_ns() + io_ns;
        if (!hello) /* the whole handshake fits its time-out, however slowly the bytes come */
            deadline = KVS_MIN(deadline, handshake_deadline);
        if (kvs__io_recv_all(io, hb, sizeof(hb), deadline) != KVS_OK)
            return;
        kvs__frame_hdr_t h;
        int rc = kvs__frame_hdr_decode(hb, sizeof(hb), KVS_DATA_REQ_LEN + KVS_DATA_MAX_CHUNK, &h);
        if (rc != KVS_OK) {
            refuse(&s->st.refused_protocol);
            char msg[128] = "bad frame header (magic, type or size)";
            if (rc == KVS_INVALID_VERSION)
                snprintf(msg, sizeof(msg),
                         "unsupported protocol version (this owner speaks %u..%u)",
                         KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
            send_error(io, ver, 0, rc, msg, deadline);
            return;
        }
        kvs__frame_log("owner", "<-", &h, NULL, 0);
        if (!hello && h.len > sizeof(pb)) { /* nothing of a peer not yet known is read */
            refuse(&s->st.refused_protocol);
            char msg[96];
            snprintf(msg, sizeof(msg),
                     "a frame of %u bytes before the handshake (at most %u until then)",
                     (unsigned)h.len, (unsigned)sizeof(pb));
            send_error(io, ver, h.req_id, KVS_PROTOCOL_ERROR, msg, deadline);
            return;
        }
        if (hello && !kvs__msg_known(h.type)) { /* before HELLO: refused below, and closed */
            /* Skip the payload so the stream stays in step, and say why. */
            refuse(&s->st.refused_protocol);
            if (drain(io, h.len, deadline + h.len / 256) != KVS_OK)
                return;
            char msg[96];
            snprintf(msg, sizeof(msg), "unknown message type %u (this owner speaks %u..%u)", h.type,
                     KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
            send_error(io, ver, h.req_id, KVS_UNSUPPORTED, msg, deadline);
            continue;
        }
        if (h.type == KVS_MSG_HELLO && !hello && h.len <= sizeof(pb)) {
            if (kvs__io_recv_all(io, pb, h.len, deadline) != KVS_OK)
                return;
            int hrc = answer_hello(s, io, &h, pb, deadline, &ver);
            if (hrc != KVS_OK) {
                refuse(hrc == KVS_AUTH_FAILED ? &s->st.refused_auth : &s->st.refused_protocol);
                return;
            }
            hello = true;
            continue;
        }
        bool is_read = h.type == KVS_MSG_DATA_READ, is_write = h.type == KVS_MSG_DATA_WRITE;
        if (!hello || (!is_read && !is_write) || h.len < KVS_DATA_REQ_LEN ||
            (is_read && h.len != KVS_DATA_REQ_LEN)) {
            refuse(&s->st.refused_protocol);
            send_error(io, ver, h.req_id, KVS_PROTOCOL_ERROR,
                       hello ? "expected DATA_READ or DATA_WRITE" : "HELLO must come first",
                       deadline);
            return;
        }
        kvs__data_req_t r;
        if (kvs__io_recv_all(io, pb, KVS_DATA_REQ_LEN, deadline) != KVS_OK)
            return;
        if (kvs__data_req_decode(pb, KVS_DATA_REQ_LEN, h.version, NULL, &r) != KVS_OK ||
            (is_write && r.length != h.len - KVS_DATA_REQ_LEN)) {
            refuse(&s->st.refused_protocol);
            send_error(io, ver, h.req_id, KVS_PROTOCOL_ERROR, "WRITE length disagrees with frame",
                       deadline);
            return;
        }
#ifdef KVS_TEST_HOOKS
        if (s->cfg.inject_delay_us)
            usleep((useconds_t)s->cfg.inject_delay_us);
#endif
        uint64_t t0 = kvs__now_ns();
        pthread_rwlock_rdlock(&s->seg_lock);
        char *addr = NULL;
        uint64_t key_gen = 0;
        rc = check_range(s, &r, is_write, cc, &key_gen, &addr);
        pthread_rwlock_unlock(&s->seg_lock);
        uint64_t done = 0;
        deadline = kvs__now_ns() + io_ns + r.length / 256; /* at least ~256 MB/s */
        if (rc == KVS_OK && is_read) {
            rc = send_status(io, ver, KVS_MSG_DATA_READ, h.req_id, KVS_OK, r.length, deadline);
            if (rc != KVS_OK)
                return;
            /* Any failure after the OK header (a remove part way included) leaves the frame
             * short: only closing the connection tells the reader. */
            if (segment_io(s, io, &r, false, key_gen, deadline, &done) != KVS_OK)
                return;
            served(&s->st.tcp_reads, &s->st.tcp_read_bytes, &s->st.tcp_read_latency, r.length, t0);
            continue;
        }
        if (rc == KVS_OK) {
            rc = segment_io(s, io, &r, true, key_gen, deadline, &done);
            if (rc == KVS_OK) {
                if (send_status(io, ver, KVS_MSG_DATA_WRITE, h.req_id, KVS_OK, 0, deadline) !=
                    KVS_OK)
                    return;
                served(&s->st.tcp_writes, &s->st.tcp_write_bytes, &s->st.tcp_write_latency,
                       r.length, t0);
                continue;
            }
            if (rc != KVS_SEGMENT_NOT_FOUND && rc != KVS_INVALID_WRITE)
                return; /* the transport failed */
        }
        refuse(refusal_of(s, rc));
        if (is_read) {
            if (send_status(io, ver, KVS_MSG_DATA_READ, h.req_id, rc, 0, deadline) != KVS_OK)
                return;
            continue;
        }
        /* Drain the rest of the announced bytes (never into the segment) so the stream stays
         * in step, then refuse; the peer keeps its connection. */
        if (drain(io, r.length - done, deadline) != KVS_OK)
            return;
        if (send_status(io, ver, KVS_MSG_DATA_WRITE, h.req_id, rc, 0, deadline) != KVS_OK)
            return;
    }
}

/* Serves one connection: its TLS handshake when TLS is on, then its requests, with its own
 * MAC context for write capabilities. */
static void serve(kvs__data_server_t *s, int fd)
{
    uint64_t handshake_deadline = kvs__now_ns() + s->cfg.handshake_timeout_ms * KVS_NS_PER_MS;
    kvs__io_t io = {fd, NULL};
    if (s->tls != NULL && kvs__tls_handshake(s->tls, fd, handshake_deadline, &io) != KVS_OK) {
        refuse(&s->st.refused_tls);
        kvs_debug("data server: a peer failed the TLS handshake");
        return;
    }
    cap_cache_t cc = {NULL, 0, 0};
    serve_requests(s, &io, handshake_deadline, &cc);
    kvs__cap_ctx_free(cc.ctx);
    kvs__io_free(&io);
}

static void conn_unlink_locked(kvs__data_server_t *s, dconn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
}

/* Serves a connection, then reclaims its descriptor and itself (the thread is detached): a
 * peer that left costs nothing from then on. */
static void *conn_thread(void *arg)
{
    dconn_t *c = arg;
    kvs__data_server_t *s = c->srv;
    serve(s, c->fd);
    kvs__crypto_thread_end();
    pthread_mutex_lock(&s->conn_lock);
    conn_unlink_locked(s, c);
    close(c->fd); /* under the lock: destroy never shuts down a number reused meanwhile */
    kvs__free(c);
    if (s->nconns == 0)
        pthread_cond_broadcast(&s->conns_gone);
    pthread_mutex_unlock(&s->conn_lock);
    return NULL;
}

/* Gives an accepted connection its thread, or refuses it with a reason and closes it. */
static void conn_start(kvs__data_server_t *s, int fd, const pthread_attr_t *detached)
{
    /* Responses go out as a small header then the data: without this, Nagle and delayed
     * acknowledgements stall every small read by tens of milliseconds. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pthread_mutex_lock(&s->conn_lock);
    uint32_t open = s->nconns;
    dconn_t *c = open < s->cfg.max_conns ? kvs__calloc(1, sizeof(*c)) : NULL;
    if (c != NULL) {
        /* Listed before its thread starts: the thread unlinks it under this lock. */
        c->fd = fd;
        c->srv = s;
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        pthread_t t;
        if (pthread_create(&t, detached, conn_thread, c) == 0) {
            fd = -1;
        } else {
            conn_unlink_locked(s, c);
            kvs__free(c);
        }
    }
    pthread_mutex_unlock(&s->conn_lock);
    if (fd < 0)
        return;
    refuse(open >= s->cfg.max_conns ? &s->st.refused_limit : &s->st.refused_no_resource);
    char msg[96];
    if (open >= s->cfg.max_conns)
        snprintf(msg, sizeof(msg), "too many connections (%u open, limit %u)", (unsigned)open,
                 (unsigned)s->cfg.max_conns);
    else
        snprintf(msg, sizeof(msg), "cannot serve a connection now (no memory or thread)");
    if (kvs__every(&s->refuse_warn_ns, KVS_NS_PER_S))
        kvs_warn("data server: refusing a connection: %s", msg);
    if (s->tls == NULL) /* a TLS peer could not read plain words */
        send_error_now(fd, KVS_NO_RESOURCE, msg);
    close(fd);
}

static void *accept_thread(void *arg)
{
    kvs__data_server_t *s = arg;
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    while (!atomic_load(&s->stopping)) {
        /* destroy shuts the listening socket down to wake this poll. */
        struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            usleep(10000);
        if (atomic_load(&s->stopping))
            break;
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            conn_start(s, fd, &detached);
        } else if (errno == EMFILE || errno == ENFILE) {
            uint64_t before = s->spare.shed;
            if (kvs__spare_fd_shed(&s->spare, s->listen_fd, "data server") < 0)
                usleep(10000); /* no descriptor to shed with: back off rather than spin */
            if (s->spare.shed > before)
                refuse(&s->st.refused_no_resource);
        } else if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN &&
                   errno != EWOULDBLOCK) {
            usleep(10000); /* ENOBUFS, ENOMEM */
        }
    }
    pthread_attr_destroy(&detached);
    return NULL;
}

/* ---- same-host descriptor passing (the shm transport's owner side) -------------------------- */

/* Sends the handshake's answer, with the descriptor `fd` when the status is OK. */
static void shm_reply(int c, int32_t status, uint64_t size, const uint8_t proof[KVS_AUTH_PROOF_LEN],
                      int fd)
{
    uint8_t rsp[KVS_SHM_RSP_LEN];
    kvs__wbuf_t w = kvs__wbuf_over(rsp, sizeof(rsp), KVS_PROTO_VERSION_MIN);
    kvs__shm_rsp_t ans = {status, size, {proof, KVS_AUTH_PROOF_LEN}};
    kvs__shm_rsp_encode(&w, &ans);
    if (w.failed || w.len != sizeof(rsp))
        return;
    struct iovec v = {rsp, sizeof(rsp)};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof(cbuf));
    struct msghdr mh = {.msg_iov = &v, .msg_iovlen = 1};
    if (status == KVS_OK && fd >= 0) {
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t sent = sendmsg(c, &mh, MSG_NOSIGNAL);
    KVS_UNUSED(sent);
}

/* Answers one handshake: the descriptor of the segment asked for, if served, to a reader of
 * this user that proved the secret (when the owner has one). */
static void shm_answer(kvs__data_server_t *s, int c)
{
    uint64_t t0 = kvs__now_ns();
    struct timeval tv = {.tv_sec = 1};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        refuse(&s->st.refused_auth); /* another user's process: never its segment */
        return;
    }
    /* The greeting carries our nonce, so the reader's proof is fresh for this connection. */
    uint8_t sn[KVS_AUTH_NONCE_LEN], greet[KVS_SHM_HELLO_LEN];
    kvs__auth_nonce(sn);
    kvs__wbuf_t gw = kvs__wbuf_over(greet, sizeof(greet), KVS_PROTO_VERSION_MIN);
    kvs__shm_hello_t hello = {KVS_SHM_MAGIC,
                              s->cfg.auth.on ? KVS_HELLO_AUTH_HMAC : KVS_HELLO_AUTH_NONE,
                              {sn, sizeof(sn)}};
    kvs__shm_hello_encode(&gw, &hello);
    uint8_t req[KVS_SHM_REQ_LEN];
    kvs__shm_req_t sr;
    if (gw.failed || gw.len != sizeof(greet) ||
        send(c, greet, sizeof(greet), MSG_NOSIGNAL) != (ssize_t)sizeof(greet))
        return;
    ssize_t got = recv(c, req, sizeof(req), MSG_WAITALL);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
        return; /* gone without a word (closed, or reset as it closed with our greeting unread):
                 * a liveness probe, such as an owner's sweep of the socket directory */
    if (got != (ssize_t)sizeof(req) || /* short, or silent until the time-out */
        kvs__shm_req_decode(req, sizeof(req), KVS_PROTO_VERSION_MIN, NULL, &sr) != KVS_OK ||
        sr.magic != KVS_SHM_MAGIC || sr.nonce.len != KVS_AUTH_NONCE_LEN) {
        refuse(&s->st.refused_protocol); /* short or malformed */
        return;
    }
    uint8_t proof[KVS_AUTH_PROOF_LEN] = {0};
    if (s->cfg.auth.on) {
        if (!kvs__auth_check(&s->cfg.auth, KVS_AUTH_SHM, s->name, KVS_AUTH_BY_CLIENT, sr.nonce.ptr,
                             sn, sr.proof.ptr, sr.proof.len)) {
            refuse(&s->st.refused_auth);
            kvs_warn("shm: refused a reader (pid %d) with a wrong proof", (int)cred.pid);
            shm_reply(c, KVS_AUTH_FAILED, 0, proof, -1);
            return;
        }
        kvs__auth_proof(&s->cfg.auth, KVS_AUTH_SHM, s->name, KVS_AUTH_BY_SERVER, sr.nonce.ptr, sn,
                        proof);
    }
    uint64_t id = sr.segment_id;
    /* The descriptor is duplicated under the lock and sent after it: a segment's memfd is
     * never served under another id (a remount gets fresh memory), so even if the segment is
     * removed meanwhile the reader gets that segment's memory, which it keys by this id. */
    pthread_rwlock_rdlock(&s->seg_lock);
    int32_t status = KVS_SEGMENT_NOT_FOUND;
    uint64_t size = 0;
    int fd = -1;
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->segs[i].id == id) {
            fd = s->segs[i].fd >= 0 ? fcntl(s->segs[i].fd, F_DUPFD_CLOEXEC, 0) : -1;
            size = s->segs[i].size;
            status = s->segs[i].fd < 0 ? KVS_UNSUPPORTED : fd >= 0 ? KVS_OK : KVS_IO_ERROR;
        }
    }
    pthread_rwlock_unlock(&s->seg_lock);
    shm_reply(c, status, size, proof, fd);
    if (fd >= 0)
        close(fd);
    if (status == KVS_OK)
        served(&s->st.shm_maps, NULL, &s->st.shm_map_latency, 0, t0);
    else
        refuse(status == KVS_SEGMENT_NOT_FOUND ? &s->st.refused_not_served
                                               : &s->st.refused_internal);
}

/* Answers one same-host handshake (bounded by shm_answer's own time-outs, and by the
 * watchdog's shutdown at the handshake time-out), then frees its slot. */
static void *shm_thread(void *arg)
{
    shm_slot_t *slot = arg;
    kvs__data_server_t *s = slot->srv;
    shm_answer(s, slot->fd);
    kvs__crypto_thread_end();
    pthread_mutex_lock(&s->shm_lock);
    close(slot->fd);
    slot->fd = -1;
    if (--s->shm_busy == 0)
        pthread_cond_broadcast(&s->shm_idle);
    pthread_mutex_unlock(&s->shm_lock);
    return NULL;
}

/* Accepts same-host peers while slots are free, a thread each. *backoff_ns_p is set when
 * accept cannot go on for want of descriptors, memory or threads. */
static void shm_accept(kvs__data_server_t *s, kvs__spare_fd_t *spare,
                       const pthread_attr_t *detached, uint64_t *backoff_ns_p)
{
    while (!atomic_load(&s->stopping)) {
        pthread_mutex_lock(&s->shm_lock);
        bool room = s->shm_busy < SHM_MAX_HANDSHAKES;
        pthread_mutex_unlock(&s->shm_lock);
        if (!room)
            return;
        int c = accept4(s->unix_fd, NULL, NULL, SOCK_CLOEXEC); /* blocking: shm_answer waits */
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            int shed = 0;
            uint64_t before = spare->shed;
            if (errno == EMFILE || errno == ENFILE)
                shed = kvs__spare_fd_shed(spare, s->unix_fd, "shm socket");
            else if (errno != EAGAIN && errno != EWOULDBLOCK)
                shed = -1;
            if (spare->shed > before)
                refuse(&s->st.refused_no_resource);
            if (shed > 0)
                continue;
            if (shed < 0)
                *backoff_ns_p = kvs__now_ns() + 10 * KVS_NS_PER_MS;
            return;
        }
        pthread_mutex_lock(&s->shm_lock);
        shm_slot_t *slot = s->shm_slots;
        while (slot->fd >= 0)
            slot++; /* a free one exists: only this thread takes slots */
        *slot =
            (shm_slot_t){s, c, kvs__now_ns() + s->cfg.handshake_timeout_ms * KVS_NS_PER_MS, false};
        s->shm_busy++;
        pthread_t t;
        bool started = pthread_create(&t, detached, shm_thread, slot) == 0;
        if (!started) {
            slot->fd = -1;
            s->shm_busy--;
        }
        pthread_mutex_unlock(&s->shm_lock);
        if (!started) {
            close(c);
            *backoff_ns_p = kvs__now_ns() + 10 * KVS_NS_PER_MS;
            return;
        }
    }
}

/* Shuts down the handshakes past their deadline; returns the next deadline (UINT64_MAX: none)
 * and whether a slot is free. */
static uint64_t shm_watch(kvs__data_server_t *s, uint64_t now, bool *room_p)
{
    uint64_t next = UINT64_MAX;
    pthread_mutex_lock(&s->shm_lock);
    for (unsigned i = 0; i < SHM_MAX_HANDSHAKES; i++) {
        shm_slot_t *slot = &s->shm_slots[i];
        if (slot->fd < 0 || slot->shut)
            continue;
        if (slot->deadline_ns <= now) {
            shutdown(slot->fd, SHUT_RDWR); /* its thread wakes, fails and ends */
            slot->shut = true;
        } else {
            next = KVS_MIN(next, slot->deadline_ns);
        }
    }
    *room_p = s->shm_busy < SHM_MAX_HANDSHAKES;
    pthread_mutex_unlock(&s->shm_lock);
    return next;
}

/* Accepts same-host peers and hands each to a thread of its own (shm_thread), so handshakes
 * run at once and a silent peer delays nobody; watches that each ends within the handshake
 * time-out. At stop, ends those in progress and waits for their threads. */
static void *unix_thread(void *arg)
{
    kvs__data_server_t *s = arg;
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    kvs__spare_fd_t spare;
    kvs__spare_fd_init(&spare);
    uint64_t backoff_ns = 0; /* accept again only after this (out of descriptors) */
    while (!atomic_load(&s->stopping)) {
        uint64_t now = kvs__now_ns();
        bool room;
        uint64_t wake = shm_watch(s, now, &room);
        bool accepting = room && backoff_ns <= now;
        if (!accepting) /* a slot frees, or the back-off ends, without telling us */
            wake = KVS_MIN(wake, now + 10 * KVS_NS_PER_MS);
        /* destroy shuts the listening socket down to wake this poll. */
        struct pollfd p = {.fd = s->unix_fd, .events = accepting ? POLLIN : 0};
        int ms = wake == UINT64_MAX ? -1 : (int)KVS_MIN((wake - now) / KVS_NS_PER_MS + 1, 60000);
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            usleep(10000);
        if (atomic_load(&s->stopping))
            break;
        if (accepting && p.revents != 0)
            shm_accept(s, &spare, &detached, &backoff_ns);
    }
    pthread_mutex_lock(&s->shm_lock);
    for (unsigned i = 0; i < SHM_MAX_HANDSHAKES; i++) {
        if (s->shm_slots[i].fd >= 0)
            shutdown(s->shm_slots[i].fd, SHUT_RDWR);
    }
    while (s->shm_busy > 0)
        pthread_cond_wait(&s->shm_idle, &s->shm_lock);
    pthread_mutex_unlock(&s->shm_lock);
    pthread_attr_destroy(&detached);
    kvs__spare_fd_close(&spare);
    return NULL;
}

/* Removes the sockets of owners that are gone: "data-*.sock" sockets of this user in `dir`
 * that nobody listens on (a connect is refused; an owner stopped by a signal still has its
 * backlog, so it keeps its socket). Called with the directory locked, as owners bind and
 * listen under that lock: a socket is never seen between the two. */
static void shm_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
        struct stat st;
        if (len < 10 || strncmp(e->d_name, "data-", 5) != 0 ||
            strcmp(e->d_name + len - 5, ".sock") != 0 ||
            (size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= sizeof(path) ||
            lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
            continue;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        memcpy(addr.sun_path, path, strlen(path) + 1);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 &&
            errno == ECONNREFUSED && unlink(path) == 0)
            kvs_info("shm: removed %s, left by an owner that is gone", path);
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
}

/* Locks the shm directory against other owners' sweeps and binds (flock; -1 if it cannot be
 * had within half a second, e.g. its holder is stopped: then we go on without). */
static int shm_dir_lock(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uint64_t deadline = kvs__now_ns() + 500 * KVS_NS_PER_MS;
    while (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || kvs__now_ns() >= deadline) {
            close(fd);
            return -1;
        }
        usleep(1000);
    }
    return fd;
}

/* Listens on "<shm dir>/data-<port>.sock" (mode 0600). Same-host readers are an optimisation:
 * any failure here only means they use tcp. */
static void shm_listen(kvs__data_server_t *s)
{
    const char *dir = s->cfg.shm_dir ? s->cfg.shm_dir : kvs__shm_dir();
    if (*dir == '\0' ||
        kvs__shm_socket_path(dir, s->port, s->unix_path, sizeof(s->unix_path)) != KVS_OK) {
        s->unix_path[0] = '\0';
        return;
    }
    /* The directory is this user's alone: nobody else can reach (or replace) the socket. */
    struct stat st;
    if ((mkdir(dir, 0700) != 0 && errno != EEXIST) || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        kvs_warn("shm: %s is not a directory of this user with mode 0700; same-host readers "
                 "use tcp (set KVS_SHM_DIR)",
                 dir);
        s->unix_path[0] = '\0';
        return;
    }
    int lock = shm_dir_lock(dir);
    if (lock >= 0)
        shm_sweep(dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, s->unix_path, strlen(s->unix_path) + 1);
    /* A socket left by an owner that died on this port: no one can be listening on it now,
     * since this process holds the port. */
    unlink(s->unix_path);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
    if (ok)
        ok = chmod(s->unix_path, 0600) == 0 && listen(fd, 64) == 0;
    if (lock >= 0)
        close(lock);
    s->unix_fd = fd; /* before the thread that uses it starts */
    if (!ok || pthread_create(&s->unix_thread, NULL, unix_thread, s) != 0) {
        s->unix_fd = -1;
        kvs_warn("shm: cannot listen on %s (%s); same-host readers use tcp", s->unix_path,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(s->unix_path);
        s->unix_path[0] = '\0';
        return;
    }
    s->unix_started = true;
}

int kvs__data_server_create(const kvs__data_server_config_t *cfg, kvs__data_server_t **srv_p)
{
    if (cfg == NULL || srv_p == NULL || cfg->max_conns == 0 || cfg->io_timeout_ms == 0 ||
        cfg->handshake_timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    kvs__data_server_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->cfg = *cfg;
    s->unix_fd = -1;
    if (cfg->tls) {
        char why[256];
        int rc = kvs__tls_create(&cfg->auth, true, &s->tls, why, sizeof(why));
        if (rc != KVS_OK) {
            kvs_error("data server: %s", why);
            kvs__free(s);
            return rc;
        }
    }
    /* Writers first: a fence (or a segment change) must not wait behind a stream of reads. */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->seg_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&s->conn_lock, NULL);
    kvs__cond_init(&s->conns_gone);
    pthread_mutex_init(&s->shm_lock, NULL);
    kvs__cond_init(&s->shm_idle);
    for (unsigned i = 0; i < SHM_MAX_HANDSHAKES; i++)
        s->shm_slots[i].fd = -1;
    kvs__spare_fd_init(&s->spare);
    s->listen_fd = kvs__tcp_listen(cfg->bind_host ? cfg->bind_host : "127.0.0.1", cfg->port, 512);
    if (s->listen_fd < 0) {
        int rc = s->listen_fd;
        s->listen_fd = -1;
        kvs__data_server_destroy(s);
        return rc;
    }
    s->port = kvs__sock_port(s->listen_fd);
    const char *adv = cfg->advertise_host ? cfg->advertise_host
                      : cfg->bind_host    ? cfg->bind_host
                                          : "127.0.0.1";
    snprintf(s->name, sizeof(s->name), "%s:%u", adv, (unsigned)s->port);
    s->cfg.advertise_host = NULL;          /* borrowed: not kept */
    kvs__set_nonblock(s->listen_fd, true); /* accept after poll: shedding must never block */
    if (pthread_create(&s->accept_thread, NULL, accept_thread, s) != 0) {
        kvs__data_server_destroy(s);
        return KVS_INTERNAL_ERROR;
    }
    s->accept_started = true;
    shm_listen(s);
    *srv_p = s;
    return KVS_OK;
}

uint16_t kvs__data_server_port(const kvs__data_server_t *s)
{
    return s->port;
}

const char *kvs__data_server_name(const kvs__data_server_t *s)
{
    return s->name;
}

static const kvs__metric_desc_t owner_metrics[] = {
#define DESC_(kind, unit, name, family, labels, help)                                              \
    {KVS_METRIC_##kind, KVS_UNIT_##unit, #name, #family, labels, help},
    KVS_OWNER_METRICS(DESC_)
#undef DESC_
};

uint64_t kvs__data_server_refused(const kvs__data_server_t *s)
{
    /* Every member of the table's refusals family, however many reasons it lists. */
    static const size_t offsets[] = {
#define OFF_(kind, unit, name, family, labels, help) offsetof(dstats_t, name),
        KVS_OWNER_METRICS(OFF_)
#undef OFF_
    };
    uint64_t sum = 0;
    for (size_t i = 0; i < KVS_ARRAY_SIZE(owner_metrics); i++)
        if (strcmp(owner_metrics[i].family, "refusals") == 0)
            sum += atomic_load(
                (const atomic_uint_fast64_t *)(const void *)((const char *)&s->st + offsets[i]));
    return sum;
}

const kvs__metric_desc_t *kvs__data_server_metrics_table(size_t *n_p)
{
    *n_p = KVS_ARRAY_SIZE(owner_metrics);
    return owner_metrics;
}

/* One data server's values, labelled with its name (owner="..."), into v, h and owner. */
typedef struct {
    char owner[3 * KVS_MAX_NAME_LEN + 32];
    kvs_histogram_t h[KVS_ARRAY_SIZE(owner_metrics)];
} dsnap_t;

static void data_server_values(kvs__data_server_t *s, dsnap_t *snap, kvs__metric_value_t *v)
{
    dstats_t *st = &s->st;
    pthread_mutex_lock(&s->conn_lock);
    atomic_store(&st->tcp_connections, s->nconns);
    pthread_mutex_unlock(&s->conn_lock);
    pthread_mutex_lock(&s->shm_lock);
    atomic_store(&st->shm_connections, s->shm_busy);
    pthread_mutex_unlock(&s->shm_lock);
    uint64_t bytes = 0;
    pthread_rwlock_rdlock(&s->seg_lock);
    for (uint32_t i = 0; i < s->nseg; i++)
        bytes += s->segs[i].size;
    atomic_store(&st->segments, s->nseg);
    atomic_store(&st->segment_bytes, bytes);
    pthread_rwlock_unlock(&s->seg_lock);
    char name[3 * KVS_MAX_NAME_LEN + 16];
    kvs__metrics_label_escape(s->name, name, sizeof(name));
    snprintf(snap->owner, sizeof(snap->owner), "owner=\"%s\"", name);
    size_t i = 0;
#define VAL_COUNTER(name)                                                                          \
    v[i] = (kvs__metric_value_t){&owner_metrics[i], snap->owner, atomic_load(&st->name), NULL};
#define VAL_GAUGE(name) VAL_COUNTER(name)
#define VAL_HIST(name)                                                                             \
    kvs__hist_copy(&snap->h[i], &st->name);                                                        \
    v[i] = (kvs__metric_value_t){&owner_metrics[i], snap->owner, 0, &snap->h[i]};
#define VAL_(kind, unit, name, family, labels, help)                                               \
    VAL_##kind(name);                                                                              \
    i++;
    KVS_OWNER_METRICS(VAL_)
#undef VAL_
#undef VAL_HIST
#undef VAL_GAUGE
#undef VAL_COUNTER
}

int kvs__data_servers_metrics_write(kvs__data_server_t *const *ds, size_t n, kvs__text_t *t)
{
    if (n == 0)
        return KVS_OK;
    const size_t k = KVS_ARRAY_SIZE(owner_metrics);
    dsnap_t *snaps = kvs__calloc(n, sizeof(*snaps));
    kvs__metric_value_t *v = kvs__calloc(n * k, sizeof(*v));
    if (snaps != NULL && v != NULL) {
        for (size_t j = 0; j < n; j++)
            data_server_values(ds[j], &snaps[j], v + j * k);
        kvs__metrics_write(t, "kvstash_owner_", v, n * k);
    } else {
        t->failed = true;
    }
    kvs__free(v);
    kvs__free(snaps);
    return t->failed ? KVS_NO_MEMORY : KVS_OK;
}

int kvs__data_server_metrics_render(void *arg, kvs__text_t *t)
{
    kvs__data_server_t *s = arg;
    return kvs__data_servers_metrics_write(&s, 1, t);
}

int kvs__data_server_add(kvs__data_server_t *s, uint64_t segment_id, void *base, uint64_t size,
                         int fd, const uint8_t *write_key, uint64_t epoch)
{
    if (s == NULL || base == NULL || size == 0)
        return KVS_INVALID_PARAMS;
    pthread_rwlock_wrlock(&s->seg_lock);
    int rc = KVS_OK;
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->segs[i].id == segment_id)
            rc = KVS_SEGMENT_ALREADY_EXISTS;
    }
    served_t *segs = rc == KVS_OK ? kvs__realloc(s->segs, (s->nseg + 1) * sizeof(*segs)) : NULL;
    if (rc == KVS_OK && segs == NULL)
        rc = KVS_NO_MEMORY;
    if (rc == KVS_OK) {
        s->segs = segs;
        served_t g = {segment_id, base, size, fd, {NULL, 0, 0}, epoch, write_key != NULL, {0}, 1};
        if (write_key != NULL)
            memcpy(g.write_key, write_key, KVS_WRITE_KEY_LEN);
        s->segs[s->nseg++] = g;
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int kvs__data_server_remove(kvs__data_server_t *s, uint64_t segment_id)
{
    if (s == NULL)
        return KVS_INVALID_PARAMS;
    pthread_rwlock_wrlock(&s->seg_lock);
    int rc = KVS_SEGMENT_NOT_FOUND;
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->segs[i].id == segment_id) {
            kvs__free(s->segs[i].fenced.slots);
            kvs__secret_wipe(s->segs[i].write_key, sizeof(s->segs[i].write_key));
            s->segs[i] = s->segs[--s->nseg];
            rc = KVS_OK;
            break;
        }
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int kvs__data_server_fence(kvs__data_server_t *s, uint64_t segment_id, const uint64_t *tokens,
                           const uint64_t *epochs, size_t n)
{
    if (s == NULL || (tokens == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    /* The write lock waits for every request in progress: once it is held, no write of a
     * fenced put is still moving bytes, and every later one sees the fence. */
    pthread_rwlock_wrlock(&s->seg_lock);
    int rc = KVS_SEGMENT_NOT_FOUND;
    for (uint32_t i = 0; i < s->nseg; i++) {
        if (s->segs[i].id != segment_id)
            continue;
        served_t *g = &s->segs[i];
        rc = KVS_OK;
        for (size_t j = 0; j < n && rc == KVS_OK; j++)
            rc = fence_add(&g->fenced, tokens[j], epochs ? epochs[j] : g->epoch, g->epoch);
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int kvs__data_server_rekey(kvs__data_server_t *s, uint64_t segment_id, const uint8_t *write_key,
                           uint64_t epoch)
{
    if (s == NULL || write_key == NULL)
        return KVS_INVALID_PARAMS;
    /* The write lock waits for every step in progress; each later one sees the new key. */
    pthread_rwlock_wrlock(&s->seg_lock);
    int rc = KVS_SEGMENT_NOT_FOUND;
    for (uint32_t i = 0; i < s->nseg; i++) {
        served_t *g = &s->segs[i];
        if (g->id != segment_id)
            continue;
        memcpy(g->write_key, write_key, KVS_WRITE_KEY_LEN);
        g->keyed = true;
        g->key_gen++;
        g->epoch = epoch; /* the new master's epochs: its own count */
        kvs__free(g->fenced.slots);
        g->fenced = (fence_set_t){NULL, 0, 0}; /* every old capability fails under the new key */
        rc = KVS_OK;
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int kvs__data_server_epoch(kvs__data_server_t *s, uint64_t segment_id, uint64_t epoch)
{
    if (s == NULL)
        return KVS_INVALID_PARAMS;
    pthread_rwlock_wrlock(&s->seg_lock);
    int rc = KVS_SEGMENT_NOT_FOUND;
    for (uint32_t i = 0; i < s->nseg; i++) {
        served_t *g = &s->segs[i];
        if (g->id != segment_id)
            continue;
        rc = KVS_OK;
        if (epoch > g->epoch) { /* (never back: a late reply says nothing new) */
            g->epoch = epoch;
            /* Fences no capability can pass any more go; failing to shrink keeps them. */
            if (g->fenced.cap > 0)
                fence_rebuild(&g->fenced, g->fenced.cap, epoch);
        }
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

void kvs__data_server_destroy(kvs__data_server_t *s)
{
    if (s == NULL)
        return;
    atomic_store(&s->stopping, true);
    if (s->listen_fd >= 0)
        shutdown(s->listen_fd, SHUT_RDWR);
    if (s->accept_started)
        pthread_join(s->accept_thread, NULL);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->unix_started) {
        shutdown(s->unix_fd, SHUT_RDWR);
        pthread_join(s->unix_thread, NULL);
        close(s->unix_fd);
        unlink(s->unix_path);
    }
    /* Every listed descriptor is still open (its thread closes it under this lock as it goes):
     * shutting them down wakes the threads, which then end. */
    pthread_mutex_lock(&s->conn_lock);
    for (dconn_t *c = s->conns; c != NULL; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->nconns > 0)
        pthread_cond_wait(&s->conns_gone, &s->conn_lock);
    pthread_mutex_unlock(&s->conn_lock);
    kvs__spare_fd_close(&s->spare);
    pthread_rwlock_destroy(&s->seg_lock);
    pthread_cond_destroy(&s->conns_gone);
    pthread_mutex_destroy(&s->conn_lock);
    pthread_cond_destroy(&s->shm_idle);
    pthread_mutex_destroy(&s->shm_lock);
    for (uint32_t i = 0; i < s->nseg; i++) {
        kvs__free(s->segs[i].fenced.slots);
        kvs__secret_wipe(s->segs[i].write_key, sizeof(s->segs[i].write_key));
    }
    kvs__free(s->segs);
    kvs__tls_destroy(s->tls);
    kvs__auth_wipe(&s->cfg.auth);
    kvs__free(s);
}
