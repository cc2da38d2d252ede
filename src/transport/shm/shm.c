/* shm transport (see shm_int.h). Transfers are memcpy between the caller's fragments and a
 * mapping of the owner's segment, done by the waiting thread, so nothing runs once the wait
 * has returned. Every request is checked against the size of the descriptor actually received
 * (sealed against shrinking by the owner), so no request reaches outside the segment. */
#define _GNU_SOURCE
#include "shm_int.h"
#include "../../gpu/gpu_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* A refused segment is asked for again after this long (the owner may come up). */
#define NEGATIVE_TTL_NS (1000ull * KVS_NS_PER_MS)
/* shm_seg_t.status while one thread does the handshake (outside the lock); others wait. */
#define SEG_PENDING 1
/* A handshake that timed out after at least this long marks its owner unresponsive. */
#define SHM_FAIR_HANDSHAKE_NS (50ull * KVS_NS_PER_MS)

typedef struct shm_seg {
    struct shm_seg *next;
    kvs_endpoint_t *ep;
    uint64_t id;
    int status; /* OK: mapped; else the cached refusal */
    uint64_t refused_ns;
    int fd;
    int pidfd;     /* the owner process (pidfd_open), -1 where only `pid` is known */
    pid_t pid;     /* the owner process, from the socket's credentials */
    char *ro, *rw; /* read-only mapping; writable one made on the first write */
    uint64_t size;
    /* Chunks of each mapping registered with CUDA for copy-engine transfers (lazily): 0 no,
     * PIN_BUSY being registered (outside the lock; meanwhile copies read pageable memory),
     * PIN_DONE registered. */
    uint8_t *ro_pinned, *rw_pinned;
    uint32_t inflight;
    bool dead;
} shm_seg_t;

#define PIN_BUSY 1
#define PIN_DONE 2

/* Referenced by its users (ep_open/ep_hold/ep_close) and by each of its segment entries, so
 * that it outlives the mappings made through it. */
struct kvs_endpoint {
    struct kvs_endpoint *next;
    char *name;
    uint32_t refs; /* under the transport's lock */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* Copy-engine streams of one batch, one per device used. */
typedef struct {
    kvs__gpu_stream_t *s[16];
} streams_t;

struct kvs_batch {
    kvs_xfer_req_t *reqs;
    uint32_t n;
    shm_seg_t **segs;
    streams_t streams; /* its GPU copies, issued at submit and waited for by shm_wait */
    bool deferred;     /* no stream was free at submit: the copies are issued by shm_wait */
};

/* Copy streams per device that batches take at submit, kept idle between batches (creating and
 * destroying one per batch cost tens of us). A batch submitted while all are taken (a direct
 * read submits one batch per key before it waits for any) issues its copies in its wait, as
 * every batch once did, on a stream taken then. */
#define IDLE_STREAMS 4

typedef struct {
    kvs_transport_t base;
    kvs__shm_config_t cfg;
    char *dir;
    uint64_t pinned_bytes; /* registered with CUDA (or being), against cfg.pin_cap_bytes */
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a handshake finished */
    kvs_endpoint_t *eps;
    shm_seg_t *segs;
    kvs__gpu_stream_t *idle[16][IDLE_STREAMS]; /* under lock */
    uint32_t nidle[16];
    uint32_t nlive[16]; /* streams alive, idle or taken */
} shm_transport_t;

static void gpu_issue(shm_transport_t *t, kvs_batch_t *b, uint64_t deadline_ns);
static bool streams_reserve(shm_transport_t *t, kvs_batch_t *b);

const char *kvs__shm_dir(void)
{
    const char *d = getenv("KVS_SHM_DIR");
    return d && *d ? d : KVS_SHM_DEFAULT_DIR;
}

int kvs__shm_socket_path(const char *dir, uint16_t port, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/data-%u.sock", dir, (unsigned)port);
    return n > 0 && (size_t)n < len ? KVS_OK : KVS_INVALID_PARAMS;
}

int kvs__shm_config_init(kvs__shm_config_t *cfg)
{
    if (cfg == NULL)
        return KVS_INVALID_PARAMS;
    *cfg = (kvs__shm_config_t){.dir = kvs__shm_dir(),
                               .io_timeout_ms = 2000,
                               .pin_chunk_bytes = 256ull << 20,
                               .pin_cap_bytes = 64ull << 30};
    int rc = KVS_OK;
    if (kvs__env_size("KVS_SHM_PIN_CAP_BYTES", &cfg->pin_cap_bytes) != KVS_OK)
        rc = KVS_INVALID_PARAMS;
    if (kvs__env_size("KVS_SHM_PIN_CHUNK_BYTES", &cfg->pin_chunk_bytes) != KVS_OK ||
        cfg->pin_chunk_bytes < 4096) {
        cfg->pin_chunk_bytes = 256ull << 20;
        rc = KVS_INVALID_PARAMS;
    }
    return rc;
}

/* ---- endpoints and segments ------------------------------------------------------------------ */

static void ep_unref_locked(shm_transport_t *t, kvs_endpoint_t *ep)
{
    if (--ep->refs > 0)
        return;
    kvs_endpoint_t **pp = &t->eps;
    while (*pp != ep)
        pp = &(*pp)->next;
    *pp = ep->next;
    kvs__free(ep->name);
    kvs__free(ep);
}

static int shm_ep_open(kvs_transport_t *base, const char *endpoint, uint64_t deadline_ns,
                       kvs_endpoint_t **ep_p)
{
    (void)deadline_ns; /* nothing here waits: the handshake is made per segment */
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || endpoint == NULL || ep_p == NULL)
        return KVS_INVALID_PARAMS;
    char *host = NULL;
    uint16_t port = 0;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int rc = kvs__parse_host_port(endpoint, "127.0.0.1", &host, &port);
    kvs__free(host);
    if (rc != KVS_OK || port == 0 ||
        kvs__shm_socket_path(t->dir, port, path, sizeof(path)) != KVS_OK)
        return KVS_INVALID_PARAMS;
    /* Reachable only if a socket is there (the handshake proves the rest). */
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISSOCK(st.st_mode))
        return KVS_UNSUPPORTED;
    pthread_mutex_lock(&t->lock);
    kvs_endpoint_t *ep = t->eps;
    while (ep != NULL && strcmp(ep->name, endpoint) != 0)
        ep = ep->next;
    if (ep == NULL) {
        ep = kvs__calloc(1, sizeof(*ep));
        if (ep != NULL && (ep->name = kvs__strdup(endpoint)) == NULL) {
            kvs__free(ep);
            ep = NULL;
        }
        if (ep != NULL) {
            memcpy(ep->path, path, sizeof(path));
            ep->next = t->eps;
            t->eps = ep;
        }
    }
    if (ep != NULL)
        ep->refs++;
    pthread_mutex_unlock(&t->lock);
    if (ep == NULL)
        return KVS_NO_MEMORY;
    *ep_p = ep;
    return KVS_OK;
}

static void shm_ep_hold(kvs_transport_t *base, kvs_endpoint_t *ep)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || ep == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    ep->refs++;
    pthread_mutex_unlock(&t->lock);
}

static shm_seg_t *reap_locked(shm_transport_t *t);
static void segs_free(const shm_transport_t *t, shm_seg_t *list);

/* With the last user reference, the owner is gone for this client: its mappings are dropped
 * (once no transfer uses them) and with the last of them the endpoint. */
static void shm_ep_close(kvs_transport_t *base, kvs_endpoint_t *ep)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || ep == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    uint32_t segs = 0;
    for (shm_seg_t *g = t->segs; g != NULL; g = g->next)
        segs += g->ep == ep;
    if (ep->refs == segs + 1) {
        for (shm_seg_t *g = t->segs; g != NULL; g = g->next) {
            if (g->ep == ep && g->status != SEG_PENDING)
                g->dead = true;
        }
    }
    ep_unref_locked(t, ep);
    shm_seg_t *gone = reap_locked(t);
    pthread_mutex_unlock(&t->lock);
    segs_free(t, gone);
}

/* A handle on the owner process, so that writes can be confirmed only while it lives: a
 * pidfd where the kernel has them (5.3+), else the pid alone. */
static void owner_watch(shm_seg_t *g, pid_t pid)
{
    g->pid = pid;
#ifdef SYS_pidfd_open
    g->pidfd = pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
#else
    g->pidfd = -1;
#endif
}

/* Whether the owner process of a mapping still runs. A segment written through a mapping is
 * only served while its owner lives: a put confirmed after the owner died would vanish. */
static bool owner_alive(const shm_seg_t *g)
{
    if (g->pidfd >= 0) {
        struct pollfd p = {.fd = g->pidfd, .events = POLLIN};
        return poll(&p, 1, 0) == 0; /* readable once the process has exited */
    }
    return g->pid > 0 && (kill(g->pid, 0) == 0 || errno == EPERM);
}

/* Reads the owner's greeting on `s`: its nonce, and whether it has a secret. An owner with one
 * talks only to readers with one (AUTH_FAILED); a reader with one trusts no owner without. */
static int shm_greeting(const shm_transport_t *t, const kvs_endpoint_t *ep, int s,
                        uint8_t nonce[KVS_AUTH_NONCE_LEN])
{
    uint8_t buf[KVS_SHM_HELLO_LEN];
    kvs__shm_hello_t h;
    ssize_t got = recv(s, buf, sizeof(buf), MSG_WAITALL);
    if (got != (ssize_t)sizeof(buf))
        return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? KVS_TIMED_OUT
                                                                    : KVS_UNSUPPORTED;
    if (kvs__shm_hello_decode(buf, sizeof(buf), KVS_PROTO_VERSION_MIN, NULL, &h) != KVS_OK ||
        h.magic != KVS_SHM_MAGIC || h.nonce.len != KVS_AUTH_NONCE_LEN) {
        kvs_warn("shm: %s speaks another handshake (an older or newer owner); not used", ep->path);
        return KVS_UNSUPPORTED;
    }
    if (h.auth == KVS_HELLO_AUTH_HMAC && !t->cfg.auth.on) {
        kvs_error("shm: the owner behind %s requires authentication: set --auth-token-file or "
                  "KVS_AUTH_TOKEN_FILE",
                  ep->path);
        return KVS_AUTH_FAILED;
    }
    if (h.auth != KVS_HELLO_AUTH_HMAC && t->cfg.auth.on) {
        kvs_error("shm: the owner behind %s does not authenticate; not trusted", ep->path);
        return KVS_AUTH_FAILED;
    }
    memcpy(nonce, h.nonce.ptr, KVS_AUTH_NONCE_LEN);
    return KVS_OK;
}

/* Asks the owner behind ep->path for segment `id`: its size, descriptor and process. */
static int handshake(const shm_transport_t *t, const kvs_endpoint_t *ep, uint64_t id,
                     uint64_t deadline_ns, int *fd_p, uint64_t *size_p, pid_t *pid_p)
{
    uint64_t now = kvs__now_ns();
    if (now >= deadline_ns)
        return KVS_TIMED_OUT;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return KVS_UNSUPPORTED;
    /* Every step (connect included, for unix sockets) is bounded by the send/receive time-outs;
     * the whole handshake by the remaining time, as steps rarely all take the full bound. */
    uint64_t us = KVS_MIN(t->cfg.io_timeout_ms * 1000, (deadline_ns - now + 999) / 1000);
    struct timeval tv = {.tv_sec = (time_t)(us / 1000000), .tv_usec = (suseconds_t)(us % 1000000)};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, ep->path, strlen(ep->path) + 1);
    int rc = KVS_UNSUPPORTED;
    int fd = -1;
    if (connect(s, (struct sockaddr *)&addr, sizeof(addr)) != 0)
        goto out;
    /* Only an owner running as this user (or root) is trusted with our reads. */
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        kvs_warn("shm: %s belongs to another user; not used", ep->path);
        goto out;
    }
    /* Without the owner's pid (another pid namespace) writes could not be confirmed: use tcp. */
    if (cred.pid <= 0) {
        kvs_warn("shm: the owner behind %s is in another pid namespace; not used", ep->path);
        goto out;
    }
    *pid_p = cred.pid;
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN];
    if ((rc = shm_greeting(t, ep, s, sn)) != KVS_OK)
        goto out;
    uint8_t proof[KVS_AUTH_PROOF_LEN] = {0};
    kvs__auth_nonce(cn);
    if (t->cfg.auth.on)
        kvs__auth_proof(&t->cfg.auth, KVS_AUTH_SHM, ep->name, KVS_AUTH_BY_CLIENT, cn, sn, proof);
    rc = KVS_UNSUPPORTED;
    uint8_t req[KVS_SHM_REQ_LEN];
    kvs__wbuf_t w = kvs__wbuf_over(req, sizeof(req), KVS_PROTO_VERSION_MIN);
    kvs__shm_req_t sr = {KVS_SHM_MAGIC, id, {cn, sizeof(cn)}, {proof, sizeof(proof)}};
    kvs__shm_req_encode(&w, &sr);
    if (w.failed || w.len != sizeof(req) ||
        send(s, req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req))
        goto out;
    uint8_t rsp[KVS_SHM_RSP_LEN];
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec v = {rsp, sizeof(rsp)};
    struct msghdr mh = {
        .msg_iov = &v, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t got = recvmsg(s, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int)) && fd < 0)
            memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    }
    if (got != (ssize_t)sizeof(rsp) || (mh.msg_flags & MSG_CTRUNC)) {
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            rc = KVS_TIMED_OUT; /* the owner did not answer: stopped or swamped */
        goto out;
    }
    kvs__shm_rsp_t ans;
    if (kvs__shm_rsp_decode(rsp, sizeof(rsp), KVS_PROTO_VERSION_MIN, NULL, &ans) != KVS_OK)
        goto out;
    int32_t status = ans.status;
    uint64_t size = ans.size;
    if (status == KVS_AUTH_FAILED) {
        kvs_error("shm: the owner behind %s refused our proof (a different auth token?)", ep->path);
        rc = KVS_AUTH_FAILED;
        goto out;
    }
    if (status != KVS_OK) {
        rc = status == KVS_SEGMENT_NOT_FOUND ? status : KVS_UNSUPPORTED;
        goto out;
    }
    /* The owner proves the secret too before its memory is trusted with our reads. */
    if (t->cfg.auth.on && !kvs__auth_check(&t->cfg.auth, KVS_AUTH_SHM, ep->name, KVS_AUTH_BY_SERVER,
                                           cn, sn, ans.proof.ptr, ans.proof.len)) {
        kvs_error("shm: the owner behind %s gave a wrong proof; not used", ep->path);
        rc = KVS_AUTH_FAILED;
        goto out;
    }
    /* The descriptor must be what was announced and sealed against shrinking. */
    struct stat st;
    int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || size == 0 || seals < 0 ||
        !(seals & F_SEAL_SHRINK)) {
        kvs_warn("shm: %s sent no usable descriptor for segment %llu", ep->path,
                 (unsigned long long)id);
        goto out;
    }
    *fd_p = fd;
    *size_p = size;
    fd = -1;
    rc = KVS_OK;
out:
    if (fd >= 0)
        close(fd);
    close(s);
    return rc;
}

static uint64_t nchunks(const shm_transport_t *t, const shm_seg_t *g)
{
    return (g->size + t->cfg.pin_chunk_bytes - 1) / t->cfg.pin_chunk_bytes;
}

/* Takes an entry off the transport's books (its pinned bytes, its endpoint reference). Caller
 * holds the lock and has unlinked it; seg_free does the slow part without the lock. */
static void seg_detach_locked(shm_transport_t *t, shm_seg_t *g)
{
    for (int m = 0; m < 2; m++) {
        const uint8_t *pinned = m ? g->rw_pinned : g->ro_pinned;
        for (uint64_t i = 0; pinned != NULL && i < nchunks(t, g); i++) {
            if (pinned[i] == PIN_DONE)
                t->pinned_bytes -=
                    KVS_MIN(t->cfg.pin_chunk_bytes, g->size - i * t->cfg.pin_chunk_bytes);
        }
    }
    ep_unref_locked(t, g->ep);
    g->ep = NULL;
}

/* Unregisters, unmaps and closes a detached entry: without the lock, since unregistering
 * gigabytes of pinned mappings takes long and other threads' transfers need the lock. */
static void seg_free(const shm_transport_t *t, shm_seg_t *g)
{
    for (int m = 0; m < 2; m++) {
        uint8_t *pinned = m ? g->rw_pinned : g->ro_pinned;
        char *base = m ? g->rw : g->ro;
        for (uint64_t i = 0; pinned != NULL && i < nchunks(t, g); i++) {
            if (pinned[i] == PIN_DONE)
                kvs__gpu_host_unregister(base + i * t->cfg.pin_chunk_bytes);
        }
        kvs__free(pinned);
    }
    if (g->ro != NULL)
        munmap(g->ro, g->size);
    if (g->rw != NULL)
        munmap(g->rw, g->size);
    if (g->fd >= 0)
        close(g->fd);
    if (g->pidfd >= 0)
        close(g->pidfd);
    kvs__free(g);
}

static void segs_free(const shm_transport_t *t, shm_seg_t *list)
{
    while (list != NULL) {
        shm_seg_t *g = list;
        list = g->next;
        seg_free(t, g);
    }
}

/* Detaches dead, idle entries; the caller frees them (segs_free) once it has let go of the
 * lock. Caller holds the lock. */
static shm_seg_t *reap_locked(shm_transport_t *t)
{
    shm_seg_t *gone = NULL;
    for (shm_seg_t **pp = &t->segs; *pp != NULL;) {
        shm_seg_t *g = *pp;
        if (g->dead && g->inflight == 0) {
            *pp = g->next;
            seg_detach_locked(t, g);
            g->next = gone;
            gone = g;
        } else {
            pp = &g->next;
        }
    }
    return gone;
}

/* The entry for (ep, id), mapped if need be, with a transfer counted on it (give it back with
 * seg_release) — or NULL and why not in *rc_p. The handshake runs outside the lock, so an
 * owner that does not answer stalls only the calls that need its segment, each until its own
 * deadline; others asking for the same segment meanwhile wait for that handshake. */
static shm_seg_t *seg_acquire(shm_transport_t *t, kvs_endpoint_t *ep, uint64_t id,
                              uint64_t deadline_ns, int *rc_p)
{
    pthread_mutex_lock(&t->lock);
    shm_seg_t *g;
    for (;;) {
        uint64_t now = kvs__now_ns();
        shm_seg_t **pp = &t->segs;
        while (*pp != NULL && ((*pp)->ep != ep || (*pp)->id != id || (*pp)->dead))
            pp = &(*pp)->next;
        g = *pp;
        if (g != NULL && g->status == SEG_PENDING) {
            if (!kvs__cond_wait_until(&t->cond, &t->lock, deadline_ns)) {
                pthread_mutex_unlock(&t->lock);
                *rc_p = KVS_TIMED_OUT;
                return NULL;
            }
            continue;
        }
        if (g != NULL && (g->status == KVS_OK || now - g->refused_ns < NEGATIVE_TTL_NS))
            break;
        if (g != NULL)
            g->dead = true; /* a stale refusal: ask again (reaped below or once idle) */
        g = kvs__calloc(1, sizeof(*g));
        if (g == NULL) {
            pthread_mutex_unlock(&t->lock);
            *rc_p = KVS_NO_MEMORY;
            return NULL;
        }
        g->ep = ep;
        ep->refs++;
        g->id = id;
        g->fd = -1;
        g->pidfd = -1;
        g->status = SEG_PENDING;
        g->inflight = 1; /* the handshake's: keeps it from being reaped meanwhile */
        g->next = t->segs;
        t->segs = g;
        pthread_mutex_unlock(&t->lock);
        pid_t pid = 0;
        int fd = -1;
        uint64_t size = 0;
        uint64_t t0 = kvs__now_ns();
        int st = handshake(t, ep, id, deadline_ns, &fd, &size, &pid);
        char *ro = NULL;
        if (st == KVS_OK) {
            void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                kvs_warn("shm: cannot map segment %llu (%s)", (unsigned long long)id,
                         strerror(errno));
                st = KVS_UNSUPPORTED;
            } else {
                ro = p;
                kvs_debug("shm: segment %llu of %s mapped (%llu bytes)", (unsigned long long)id,
                          ep->name, (unsigned long long)size);
            }
        }
        pthread_mutex_lock(&t->lock);
        g->fd = fd;
        g->size = size;
        g->ro = ro;
        if (st == KVS_OK)
            owner_watch(g, pid);
        /* An owner that let a handshake of fair length time out is stopped or swamped: it is
         * refused for a while like one that said no, so that every other key and call does
         * not wait for it again. One cut short by a nearly spent deadline says nothing: the
         * entry is dropped. */
        bool fair = kvs__now_ns() - t0 >= SHM_FAIR_HANDSHAKE_NS;
        g->status = st == KVS_TIMED_OUT ? KVS_UNSUPPORTED : st;
        g->refused_ns = kvs__now_ns();
        if (st == KVS_TIMED_OUT && !fair)
            g->dead = true;
        g->inflight--;
        pthread_cond_broadcast(&t->cond);
        if (st == KVS_TIMED_OUT) {
            shm_seg_t *gone = reap_locked(t);
            pthread_mutex_unlock(&t->lock);
            segs_free(t, gone);
            *rc_p = KVS_TIMED_OUT;
            return NULL;
        }
        break;
    }
    if (g->status != KVS_OK) {
        *rc_p = g->status;
        pthread_mutex_unlock(&t->lock);
        return NULL;
    }
    g->inflight++;
    pthread_mutex_unlock(&t->lock);
    *rc_p = KVS_OK;
    return g;
}

static void seg_release(shm_transport_t *t, shm_seg_t *g)
{
    pthread_mutex_lock(&t->lock);
    g->inflight--;
    shm_seg_t *gone = reap_locked(t);
    pthread_mutex_unlock(&t->lock);
    segs_free(t, gone);
}

int kvs__shm_map_segment(kvs_transport_t *base, kvs_endpoint_t *ep, uint64_t segment_id,
                         uint64_t deadline_ns)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || ep == NULL)
        return KVS_INVALID_PARAMS;
    int rc;
    shm_seg_t *g = seg_acquire(t, ep, segment_id, deadline_ns, &rc);
    if (g != NULL)
        seg_release(t, g);
    return rc;
}

void kvs__shm_retain(kvs_transport_t *base, const uint64_t *ids, size_t n)
{
    shm_transport_t *t = (shm_transport_t *)base;
    pthread_mutex_lock(&t->lock);
    for (shm_seg_t *g = t->segs; g != NULL; g = g->next) {
        bool live = false;
        for (size_t i = 0; i < n && !live; i++)
            live = ids[i] == g->id;
        if (!live && !g->dead) {
            g->dead = true;
            kvs_debug("shm: segment %llu is gone at the master; unmapped",
                      (unsigned long long)g->id);
        }
    }
    shm_seg_t *gone = reap_locked(t);
    pthread_mutex_unlock(&t->lock);
    segs_free(t, gone);
}

size_t kvs__shm_mapped(kvs_transport_t *base)
{
    shm_transport_t *t = (shm_transport_t *)base;
    size_t n = 0;
    pthread_mutex_lock(&t->lock);
    for (shm_seg_t *g = t->segs; g != NULL; g = g->next)
        n += g->status == KVS_OK && !g->dead;
    pthread_mutex_unlock(&t->lock);
    return n;
}

/* ---- transfers ------------------------------------------------------------------------------- */

static int shm_mem_reg(kvs_transport_t *t, void *addr, size_t len)
{
    return t && addr && len ? KVS_OK : KVS_INVALID_PARAMS;
}

static int shm_submit(kvs_transport_t *base, kvs_xfer_req_t *reqs, uint32_t n, uint64_t deadline_ns,
                      kvs_batch_t **batch_p)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || (reqs == NULL && n > 0) || batch_p == NULL)
        return KVS_INVALID_PARAMS;
    kvs_batch_t *b = kvs__calloc(1, sizeof(*b));
    shm_seg_t **segs = kvs__calloc(KVS_MAX(n, 1), sizeof(*segs));
    if (b == NULL || segs == NULL) {
        kvs__free(b);
        kvs__free(segs);
        return KVS_NO_MEMORY;
    }
    b->reqs = reqs;
    b->n = n;
    b->segs = segs;
    for (uint32_t i = 0; i < n; i++) {
        kvs_xfer_req_t *r = &reqs[i];
        bool ok =
            r->ep != NULL && r->length > 0 && (r->op == KVS_XFER_READ || r->op == KVS_XFER_WRITE) &&
            (r->iov != NULL || r->iovcnt == 0) && kvs__iov_total(r->iov, r->iovcnt) == r->length &&
            r->offset <= UINT64_MAX - r->length;
        if (ok) {
            pthread_mutex_lock(&t->lock);
            bool ours = false;
            for (kvs_endpoint_t *e = t->eps; e != NULL && !ours; e = e->next)
                ours = e == r->ep;
            pthread_mutex_unlock(&t->lock);
            ok = ours;
        }
        r->status = ok ? KVS_OK : KVS_INVALID_PARAMS;
        if (!ok)
            continue;
        int grc;
        shm_seg_t *g = seg_acquire(t, r->ep, r->segment_id, deadline_ns, &grc);
        if (g == NULL) {
            r->status =
                grc == KVS_SEGMENT_NOT_FOUND || grc == KVS_NO_MEMORY ? grc : KVS_TRANSFER_FAIL;
            continue;
        }
        pthread_mutex_lock(&t->lock);
        if (r->offset + r->length > g->size) {
            r->status = KVS_INVALID_PARAMS; /* outside the segment */
        } else if (r->op == KVS_XFER_WRITE && g->rw == NULL) {
            void *p = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
            if (p == MAP_FAILED)
                r->status = KVS_TRANSFER_FAIL;
            else
                g->rw = p;
        }
        if (r->status != KVS_OK)
            g->inflight--;
        else
            segs[i] = g;
        pthread_mutex_unlock(&t->lock);
    }
    b->deferred = !streams_reserve(t, b);
    if (!b->deferred)
        gpu_issue(t, b, deadline_ns);
    *batch_p = b;
    return KVS_OK;
}

/* A copy stream of device `dev`: an idle one, else a new one; `bounded` (at submit): none rather
 * than more than IDLE_STREAMS alive. */
static kvs__gpu_stream_t *stream_take(shm_transport_t *t, uint32_t dev, bool bounded)
{
    kvs__gpu_stream_t *s = NULL;
    pthread_mutex_lock(&t->lock);
    bool create = false;
    if (t->nidle[dev] > 0)
        s = t->idle[dev][--t->nidle[dev]];
    else if (!bounded || t->nlive[dev] < IDLE_STREAMS) {
        t->nlive[dev]++;
        create = true;
    }
    pthread_mutex_unlock(&t->lock);
    if (create && kvs__gpu_stream_create((int)dev, &s) != KVS_OK) {
        s = NULL;
        pthread_mutex_lock(&t->lock);
        t->nlive[dev]--;
        pthread_mutex_unlock(&t->lock);
    }
    return s;
}

/* Returns a stream whose work has ended; `ok`: synchronised without error (else it is not kept:
 * its context may be unusable). */
static void stream_give(shm_transport_t *t, uint32_t dev, kvs__gpu_stream_t *s, bool ok)
{
    pthread_mutex_lock(&t->lock);
    if (ok && t->nidle[dev] < IDLE_STREAMS) {
        t->idle[dev][t->nidle[dev]++] = s;
        s = NULL;
    } else {
        t->nlive[dev]--;
    }
    pthread_mutex_unlock(&t->lock);
    kvs__gpu_stream_destroy(s);
}

/* Takes, at submit, a stream for every device the batch's GPU requests use; false (none kept)
 * when one is not free. */
static bool streams_reserve(shm_transport_t *t, kvs_batch_t *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        uint32_t dev = b->reqs[i].gpu - 1;
        if (b->segs[i] == NULL || b->reqs[i].gpu == 0 || dev >= KVS_ARRAY_SIZE(b->streams.s) ||
            b->streams.s[dev] != NULL)
            continue;
        if ((b->streams.s[dev] = stream_take(t, dev, true)) == NULL) {
            for (uint32_t d = 0; d < KVS_ARRAY_SIZE(b->streams.s); d++)
                if (b->streams.s[d] != NULL)
                    stream_give(t, d, b->streams.s[d], true);
            memset(&b->streams, 0, sizeof(b->streams));
            return false;
        }
    }
    return true;
}

/* Registers the chunks of the mapping that [off, off + len) touches, within the pin cap. A chunk
 * that cannot be registered is copied from pageable memory (slower, still correct). The
 * registrations run outside the lock (cudaHostRegister of 256 MiB takes tens of ms); chunks
 * being registered are marked so that no other thread registers them twice. The caller's
 * transfer keeps the mapping alive meanwhile. */
static void pin_range(shm_transport_t *t, shm_seg_t *g, bool rd, uint64_t off, uint64_t len)
{
    uint64_t ck = t->cfg.pin_chunk_bytes, hi = (off + len - 1) / ck;
    char *base = rd ? g->ro : g->rw;
    pthread_mutex_lock(&t->lock);
    uint8_t **pinned = rd ? &g->ro_pinned : &g->rw_pinned;
    if (*pinned == NULL)
        *pinned = kvs__calloc(nchunks(t, g), 1);
    uint8_t *flags = *pinned;
    for (uint64_t i = off / ck; flags != NULL && i <= hi; i++) {
        uint64_t l = KVS_MIN(ck, g->size - i * ck);
        if (flags[i] != 0 || t->pinned_bytes + l > t->cfg.pin_cap_bytes)
            continue;
        flags[i] = PIN_BUSY; /* this thread's to register; the bytes are reserved */
        t->pinned_bytes += l;
        pthread_mutex_unlock(&t->lock);
        bool ok = kvs__gpu_host_register(base + i * ck, (size_t)l, rd) == KVS_OK;
        pthread_mutex_lock(&t->lock);
        flags[i] = ok ? PIN_DONE : 0;
        if (!ok)
            t->pinned_bytes -= l;
    }
    pthread_mutex_unlock(&t->lock);
}

/* One request between the mapping and GPU fragments: one copy per fragment (or one batch). */
static int gpu_copy(shm_transport_t *t, shm_seg_t *g, kvs_xfer_req_t *r, streams_t *st)
{
    uint32_t dev = r->gpu - 1;
    if (dev >= KVS_ARRAY_SIZE(st->s))
        return KVS_INVALID_PARAMS;
    bool rd = r->op == KVS_XFER_READ;
    pin_range(t, g, rd, r->offset, r->length);
    if (st->s[dev] == NULL && (st->s[dev] = stream_take(t, dev, false)) == NULL)
        return KVS_TRANSFER_FAIL;
    /* A copy may not span two registrations: split at chunk boundaries. */
    char *base = rd ? g->ro : g->rw;
    uint64_t ck = t->cfg.pin_chunk_bytes, done = 0;
    int rc = KVS_OK;
    while (rc == KVS_OK && done < r->length) {
        uint64_t at = r->offset + done;
        uint64_t l = KVS_MIN(r->length - done, ck - at % ck);
        rc = kvs__gpu_copy_slice(st->s[dev], rd, base + at, r->iov, r->iovcnt, done, l);
        done += l;
    }
    return rc == KVS_OK ? KVS_OK : KVS_TRANSFER_FAIL;
}

/* Consecutive GPU requests with one destination fragment each, adjacent both in the segment and
 * in GPU memory (a staging fill of keys that were put one after another): one copy for the run
 * instead of one per key (each copy costs the copy engine ~5 us). */
typedef struct {
    shm_seg_t *g;
    kvs_xfer_req_t *first;
    uint32_t count;
    struct iovec iov; /* the run's destination (or source) bytes in GPU memory */
    uint64_t offset;  /* in the segment */
} gpu_run_t;

static bool run_extends(const gpu_run_t *u, const shm_seg_t *g, const kvs_xfer_req_t *r)
{
    const kvs_xfer_req_t *f = u->first;
    return u->count > 0 && g == u->g && r->iovcnt == 1 && r->op == f->op && r->gpu == f->gpu &&
           r->offset == u->offset + u->iov.iov_len &&
           (char *)r->iov[0].iov_base == (char *)u->iov.iov_base + u->iov.iov_len;
}

static void run_flush(shm_transport_t *t, gpu_run_t *u, streams_t *st)
{
    if (u->count == 0)
        return;
    kvs_xfer_req_t whole = *u->first;
    whole.offset = u->offset;
    whole.length = u->iov.iov_len;
    whole.iov = &u->iov;
    whole.iovcnt = 1;
    int rc = gpu_copy(t, u->g, &whole, st);
    for (uint32_t i = 0; i < u->count; i++)
        u->first[i].status = rc;
    u->count = 0;
}

/* Issues a batch's GPU copies on its streams (shm_wait waits for them): at submit, so that they
 * run while the caller goes on (a staged fill builds its plan meanwhile). */
static void gpu_issue(shm_transport_t *t, kvs_batch_t *b, uint64_t deadline_ns)
{
    gpu_run_t run = {0};
    for (uint32_t i = 0; i < b->n; i++) {
        kvs_xfer_req_t *r = &b->reqs[i];
        shm_seg_t *g = b->segs[i];
        if (g == NULL || r->gpu == 0)
            continue;
        if (run_extends(&run, g, r)) {
            run.iov.iov_len += r->length;
            run.count++;
            continue;
        }
        run_flush(t, &run, &b->streams);
        if (kvs__now_ns() >= deadline_ns)
            r->status = KVS_TIMED_OUT;
        else if (r->iovcnt == 1)
            run = (gpu_run_t){g, r, 1, r->iov[0], r->offset}; /* may grow */
        else
            r->status = gpu_copy(t, g, r, &b->streams);
    }
    run_flush(t, &run, &b->streams);
}

static int shm_wait(kvs_transport_t *base, kvs_batch_t *b, uint64_t deadline_ns)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL || b == NULL)
        return KVS_INVALID_PARAMS;
    int rc = KVS_OK;
    if (b->deferred)
        gpu_issue(t, b, deadline_ns);
    for (uint32_t i = 0; i < b->n; i++) {
        kvs_xfer_req_t *r = &b->reqs[i];
        shm_seg_t *g = b->segs[i];
        if (g == NULL || r->gpu != 0)
            continue; /* refused at submit, or a GPU copy (issued above or at submit) */
        if (kvs__now_ns() >= deadline_ns) {
            r->status = KVS_TIMED_OUT;
        } else {
            bool rd = r->op == KVS_XFER_READ;
            char *seg = (rd ? g->ro : g->rw) + r->offset;
            for (uint32_t j = 0; j < r->iovcnt; j++) {
                size_t l = r->iov[j].iov_len;
                if (rd)
                    memcpy(r->iov[j].iov_base, seg, l);
                else
                    memcpy(seg, r->iov[j].iov_base, l);
                seg += l;
            }
        }
    }
    /* GPU copies end here, before the wait returns: nothing lands afterwards. */
    for (uint32_t d = 0; d < KVS_ARRAY_SIZE(b->streams.s); d++) {
        kvs__gpu_stream_t *s = b->streams.s[d];
        if (s == NULL)
            continue;
        bool ok = kvs__gpu_sync(s) == KVS_OK;
        if (!ok) {
            for (uint32_t i = 0; i < b->n; i++)
                if (b->reqs[i].gpu == d + 1 && b->reqs[i].status == KVS_OK)
                    b->reqs[i].status = KVS_TRANSFER_FAIL;
        }
        stream_give(t, d, s, ok);
    }
    /* Written bytes count only if their owner is alive now, after they were written. */
    for (uint32_t i = 0; i < b->n; i++) {
        kvs_xfer_req_t *r = &b->reqs[i];
        if (b->segs[i] != NULL && r->op == KVS_XFER_WRITE && r->status == KVS_OK &&
            !owner_alive(b->segs[i])) {
            kvs_warn("shm: the owner of segment %llu has exited; the write is lost",
                     (unsigned long long)b->segs[i]->id);
            r->status = KVS_TRANSFER_FAIL;
        }
        if (rc == KVS_OK && r->status != KVS_OK)
            rc = r->status;
    }
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < b->n; i++) {
        if (b->segs[i] != NULL)
            b->segs[i]->inflight--;
    }
    shm_seg_t *gone = reap_locked(t);
    pthread_mutex_unlock(&t->lock);
    segs_free(t, gone);
    kvs__free(b->segs);
    kvs__free(b);
    return rc;
}

static void shm_destroy(kvs_transport_t *base)
{
    shm_transport_t *t = (shm_transport_t *)base;
    if (t == NULL)
        return;
    while (t->segs != NULL) {
        shm_seg_t *g = t->segs;
        t->segs = g->next;
        seg_detach_locked(t, g);
        seg_free(t, g);
    }
    while (t->eps != NULL) {
        kvs_endpoint_t *e = t->eps;
        t->eps = e->next;
        kvs__free(e->name);
        kvs__free(e);
    }
    for (uint32_t d = 0; d < KVS_ARRAY_SIZE(t->idle); d++)
        for (uint32_t i = 0; i < t->nidle[d]; i++)
            kvs__gpu_stream_destroy(t->idle[d][i]);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    kvs__free(t->dir);
    kvs__free(t);
}

static const kvs_transport_ops_t shm_ops = {
    .name = "shm",
    .caps = KVS_TRANSPORT_CAP_SAME_HOST | KVS_TRANSPORT_CAP_ZERO_COPY |
            KVS_TRANSPORT_CAP_CHEAP_SUBMIT | (KVS_GPU_BUILT ? KVS_TRANSPORT_CAP_GPU_DEST : 0),
    .ep_open = shm_ep_open,
    .ep_hold = shm_ep_hold,
    .ep_close = shm_ep_close,
    .mem_reg = shm_mem_reg,
    .mem_dereg = shm_mem_reg,
    .submit = shm_submit,
    .wait = shm_wait,
    .destroy = shm_destroy,
};

int kvs__shm_transport_create(const kvs__shm_config_t *cfg, kvs_transport_t **t_p)
{
    if (cfg == NULL || t_p == NULL || cfg->dir == NULL || cfg->io_timeout_ms == 0 ||
        cfg->pin_chunk_bytes < 4096)
        return KVS_INVALID_PARAMS;
    shm_transport_t *t = kvs__calloc(1, sizeof(*t));
    if (t == NULL || (t->dir = kvs__strdup(cfg->dir)) == NULL) {
        kvs__free(t);
        return KVS_NO_MEMORY;
    }
    t->base.ops = &shm_ops;
    t->cfg = *cfg;
    t->cfg.dir = t->dir;
    pthread_mutex_init(&t->lock, NULL);
    kvs__cond_init(&t->cond);
    *t_p = &t->base;
    return KVS_OK;
}
