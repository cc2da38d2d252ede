/* The master's epoll event loop: framing, dispatch to the state machine, back-pressure. */
#define _GNU_SOURCE
#include "master_server_int.h"
#include "master_ha_int.h"
#include "../ha/etcd_int.h"
#include "../proto/net_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* Reading from a peer pauses while this much of its output waits to be sent. */
#define OUT_HIGH_WATER (1u << 20)

/* What an epoll event's tag points at, besides the listening and stop descriptors. */
typedef enum { TAG_CONN = 1, TAG_PROBE } tag_t;

struct probe;

struct conn;

/* Connections in the order they expire: each list has one time-out, so appending keeps it
 * sorted and the loop looks at its head only. */
typedef struct {
    struct conn *head, *tail;
} conn_list_t;

typedef struct conn {
    tag_t tag;                /* TAG_CONN */
    struct conn *prev, *next; /* every open connection, for shutdown */
    conn_list_t *timer;       /* the list that times it out; NULL while parked (or no idle limit) */
    struct conn *tprev, *tnext;
    uint64_t expires_ns; /* master clock (server_now) */
    int fd;
    void *ssl;           /* its TLS session when the master has TLS on */
    bool read_wants_out; /* TLS: a read step must write first (its handshake) */
    bool write_wants_in; /* TLS: a write step must read first */
    bool ready;          /* on the ready list: TLS holds bytes a poll cannot see */
    struct conn *ready_next;
    bool hello_done;          /* HELLO answered */
    bool authed;              /* and the peer proved the secret (or the master has none): the
                               * connection has its identity, and requests are served */
    kvs__auth_pending_t auth; /* between HELLO and AUTH */
    uint64_t hello_client_id; /* the id HELLO asked for, bound once AUTH succeeds */
    bool parked;              /* a MOUNT waits for its probe: nothing more is read meanwhile */
    bool probed;              /* the MOUNT being served again after its probe: no second one */
    struct probe *probe;      /* while parked */
    bool closing;             /* close once the output is flushed */
    unsigned reply_version;   /* of the last request whose header decoded; errors go out in it */
    uint64_t client_id;
    char peer[INET6_ADDRSTRLEN]; /* the peer's address (no port), "" if unknown */
    /* The namespace of this connection's keys (HELLO): the master's keys are the tenant, a NUL
     * byte, then the client's key (user keys hold no NUL, so tenants never collide); the
     * default tenant's keys are the client's keys as they are. */
    char tenant[KVS_MAX_TENANT_LEN + 1];
    uint32_t tenant_len;
    uint8_t hdr[KVS_FRAME_HDR_LEN];
    size_t hdr_got;
    kvs__frame_hdr_t h;
    uint8_t *payload;
    size_t payload_got;
    kvs__wbuf_t out;
    size_t out_sent;
    uint32_t events; /* what epoll currently watches */
    /* HA waits (parked meanwhile): a HEARTBEAT answered once there is news for its owner, or a
     * PUT_END reply held until the owners have indexed its objects. */
    uint8_t wait;
    struct conn *wprev, *wnext;
    uint64_t wait_until; /* master clock: answered then at the latest */
    uint32_t wait_req_id;
    unsigned wait_version;
    unsigned wait_type; /* WAIT_INDEXED: the request whose reply is held */
    kvs__wbuf_t held;
    kvs__index_mark_t marks[KVS_MAX_REPLICAS * 4];
    uint32_t nmarks;
    bool marks_all;
} conn_t;

enum { WAIT_NONE = 0, WAIT_HEARTBEAT, WAIT_INDEXED };

/* A MOUNT of a name whose owner may be dead (no connection of its client is open) waits while
 * a non-blocking connect to that owner's data endpoint, driven by the event loop, finds out:
 * refused proves the owner dead (nothing listens there), so its registration is replaced;
 * anything else (it connects, the time runs out, the host is unreachable) is no proof, and the
 * MOUNT is refused with SEGMENT_ALREADY_EXISTS as before. */
typedef struct probe {
    tag_t tag; /* TAG_PROBE */
    struct probe *next;
    conn_t *conn; /* the parked connection; NULL once it closed (freed after the batch) */
    int fd;
    uint64_t segment_id; /* the registration it probes */
    uint64_t deadline_ns;
    kvs__frame_hdr_t h; /* the MOUNT request, served again when the probe ends */
    uint8_t *payload;
} probe_t;

struct kvs__master_server {
    kvs__master_server_config_t cfg;
    kvs__master_t *master;
    int listen_fd;
    int epoll_fd;
    int stop_fd;
    uint16_t port;
    uint32_t nconns;
    conn_t *conns;
    probe_t *probes;      /* in flight */
    probe_t *dead_probes; /* finished; freed after the event batch that may still name them */
    kvs__wbuf_t scratch;
    kvs__tls_t *tls;      /* server side, when cfg.tls */
    conn_t *ready;        /* connections to read again before waiting (see conn_update_events) */
    uint64_t incarnation; /* random per start, told to every peer at HELLO */
    uint64_t pause_ns;    /* a gap between two looks at the clock longer than this is a pause */
    uint64_t last_run_ns; /* the monotonic clock at the last look (0: none yet) */
    uint64_t paused_ns;   /* the time the loop did not run, taken off the master's clock */
    pthread_t thread;
    bool thread_started;

    /* High availability: the election, and what this master serves as leader. */
    kvs__ha_t *ha; /* NULL: alone */
    int ha_fd;     /* eventfd the election writes when leadership changes */
    char advertise[KVS_MAX_NAME_LEN + 1];
    uint64_t ha_gen;         /* the election's generation this state belongs to (0: none) */
    bool ha_serving;         /* leading under ha_gen: requests are served */
    uint64_t term;           /* the term led (HELLO tells it) */
    uint64_t recover_until;  /* master clock: clients wait until owners re-registered */
    conn_t *waiting;         /* connections in an HA wait */
    bool ha_woken;           /* the election said something: looked at after the event batch */
    uint64_t index_timeouts; /* PUT_END replies sent before their owners indexed them */

    /* What peers may cost. */
    conn_list_t handshaking; /* before the handshake is done, by the time they were accepted */
    conn_list_t idle;        /* after it, by their last request */
    kvs__spare_fd_t spare;   /* accepting (and closing) when out of descriptors */
    bool listen_paused;      /* out of descriptors with no spare: accept again at the next tick */
    uint64_t refuse_warn_ns; /* warnings about refused connections at most once a second */

    /* Scrapes of the metrics endpoint, rendered on the loop (the master is not thread-safe):
     * the HTTP thread posts its text buffer and wakes metrics_fd; the loop fills it. */
    int metrics_fd;
    pthread_mutex_t metrics_lock;
    pthread_cond_t metrics_done;
    kvs__text_t *metrics_out; /* the scrape waiting to be rendered (NULL: none) */
    int metrics_rc;
    bool metrics_init;
};

int kvs__master_server_config_init(kvs__master_server_config_t *cfg)
{
    if (cfg == NULL)
        return KVS_INVALID_PARAMS;
    memset(cfg, 0, sizeof(*cfg));
    cfg->bind_host = "127.0.0.1";
    cfg->port = 50051;
    cfg->max_payload = KVS_FRAME_MAX_PAYLOAD;
    cfg->max_conns = 4096;
    cfg->handshake_timeout_ms = 5000;
    cfg->idle_timeout_ms = 600000;
    cfg->tick_ms = 100;
    cfg->probe_ms = 1000;
    cfg->etcd_ttl_s = KVS_HA_DEFAULT_TTL_S;
    cfg->etcd_poll_ms = KVS_HA_DEFAULT_POLL_MS;
    cfg->recovery_ms = 300;
    cfg->metrics_timeout_ms = 2000;
    cfg->index_wait_ms = 1000;
    return kvs__master_config_init(&cfg->master);
}

/* The longest gap between two looks at the clock that is not a pause: the loop looks at least
 * once a tick, so well above a tick, and well below the heartbeat time-out, so that a pause
 * that could expire an owner is seen. */
static uint64_t server_pause_ms(const kvs__master_server_config_t *cfg)
{
    if (cfg->pause_ms != 0)
        return cfg->pause_ms;
    uint64_t ms = KVS_MIN(cfg->master.heartbeat_timeout_ms / 4, 1000);
    return KVS_MAX(ms, 2 * cfg->tick_ms);
}

/* The clock the master's state machine runs on: the monotonic clock less every time the
 * loop did not run (the process was stopped, or starved of the CPU). The master counts an
 * owner's silence, a lease or a pending put only while it runs itself, so a pause cuts none
 * short; leases then last longer at the master than at their readers, which only keeps space
 * longer. After a pause every owner also gets a grace period (kvs__master_resumed): their
 * heartbeats during it failed or wait unread in the sockets, and a retry needs a moment. The loop
 * looks at the clock after every wait (a tick at most), so a longer gap means it did not run. */
static uint64_t server_now(kvs__master_server_t *s)
{
    uint64_t now = kvs__now_ns();
    if (s->last_run_ns != 0 && now - s->last_run_ns > s->pause_ns) {
        uint64_t gap = now - s->last_run_ns;
        s->paused_ns += gap - KVS_MIN(gap, s->cfg.tick_ms * KVS_NS_PER_MS);
        kvs_warn("the master did not run for %llu ms; owners get a grace period to heartbeat",
                 (unsigned long long)(gap / KVS_NS_PER_MS));
        kvs__master_resumed(s->master, now - s->paused_ns);
    }
    s->last_run_ns = now;
    return now - s->paused_ns;
}

/* Joins the election (after listening: the leader record names a port that answers). */
static int ha_setup(kvs__master_server_t *s)
{
    const kvs__master_server_config_t *cfg = &s->cfg;
    const char *bind = cfg->bind_host ? cfg->bind_host : "127.0.0.1";
    if (cfg->advertise != NULL) {
        snprintf(s->advertise, sizeof(s->advertise), "%s", cfg->advertise);
    } else if (strcmp(bind, "0.0.0.0") == 0 || strcmp(bind, "::") == 0 || bind[0] == '\0') {
        kvs_error("master: bound to %s, the leader record needs an address clients can reach: "
                  "give --advertise HOST:PORT",
                  bind);
        return KVS_INVALID_PARAMS;
    } else {
        snprintf(s->advertise, sizeof(s->advertise), strchr(bind, ':') ? "[%s]:%u" : "%s:%u", bind,
                 (unsigned)s->port);
    }
    s->ha_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event hev = {.events = EPOLLIN, .data.ptr = &s->ha_fd};
    if (s->ha_fd < 0 || epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->ha_fd, &hev) != 0)
        return KVS_IO_ERROR;
    kvs__ha_config_t hc = {.etcd = cfg->etcd,
                           .prefix = cfg->etcd_prefix,
                           .advertise = s->advertise,
                           .ttl_s = cfg->etcd_ttl_s,
                           .poll_ms = cfg->etcd_poll_ms,
                           .wake_fd = s->ha_fd};
    int rc = kvs__ha_start(&hc, &s->ha);
    if (rc != KVS_OK)
        kvs_error("master: cannot join the election at etcd://%s: %s", cfg->etcd,
                  kvs_status_str(rc));
    else
        kvs_info("master: a leader candidate at etcd://%s as %s", cfg->etcd, s->advertise);
    return rc;
}

static void conn_close(kvs__master_server_t *s, struct conn *c);

/* This candidate won the election (generation lead->generation): it serves from fresh state,
 * under the incarnation its leader record carries, and every connection made before (to a
 * standby, or to an earlier term of this one) starts again. */
static void ha_take_office(kvs__master_server_t *s, const kvs__ha_lead_t *lead)
{
    while (s->conns != NULL)
        conn_close(s, s->conns);
    kvs__master_t *fresh = NULL;
    kvs__master_config_t mc = s->cfg.master;
    mc.version_base = lead->term << 32;
    if (kvs__master_create(&mc, &fresh) != KVS_OK) {
        kvs_error("master: out of memory taking office; serving nothing");
        return;
    }
    kvs__master_destroy(s->master);
    s->master = fresh;
    s->incarnation = lead->incarnation;
    s->term = lead->term;
    s->ha_gen = lead->generation;
    s->ha_serving = true;
    s->recover_until = server_now(s) + s->cfg.recovery_ms * KVS_NS_PER_MS;
    kvs_info("master: leading (term %llu); owners have %llu ms to re-register",
             (unsigned long long)s->term, (unsigned long long)s->cfg.recovery_ms);
}

/* Follows the election: office taken when won, requests refused once lost. */
static void ha_check(kvs__master_server_t *s)
{
    if (s->ha == NULL)
        return;
    uint64_t v;
    ssize_t r = read(s->ha_fd, &v, sizeof(v));
    KVS_UNUSED(r);
    kvs__ha_lead_t lead;
    bool leading = kvs__ha_leading(s->ha, &lead);
    if (leading && lead.generation != s->ha_gen)
        ha_take_office(s, &lead);
    else if (!leading && s->ha_serving) {
        s->ha_serving = false;
        kvs_warn("master: no longer the leader (term %llu): every request is refused",
                 (unsigned long long)s->term);
    }
}

/* Whether a request of `type` is served now. A leader checks its lease deadline before every
 * request (it stops serving before a standby can be elected); in its first moments it lets
 * owners re-register first. Otherwise `msg` gets where to go instead. */
static bool ha_serves(kvs__master_server_t *s, unsigned type, uint64_t now, char *msg, size_t len)
{
    msg[0] = '\0';
    if (s->ha == NULL)
        return true;
    kvs__ha_lead_t lead;
    bool leading = kvs__ha_leading(s->ha, &lead);
    if (!leading || lead.generation != s->ha_gen || !s->ha_serving) {
        /* (Taking office is left to the loop, between event batches: it closes connections.) */
        if (s->ha_serving && !leading) {
            s->ha_serving = false;
            kvs_warn("master: no longer the leader (term %llu): every request is refused",
                     (unsigned long long)s->term);
        }
        kvs__ha_leader(s->ha, msg, len);
        return false;
    }
    bool owner_msg = type == KVS_MSG_MOUNT || type == KVS_MSG_UNMOUNT ||
                     type == KVS_MSG_HEARTBEAT || type == KVS_MSG_RECOVER || type == KVS_MSG_STAT;
    if (!owner_msg && now < s->recover_until) {
        snprintf(msg, len, "%s", s->advertise); /* here, in a moment */
        return false;
    }
    return true;
}

int kvs__master_server_create(const kvs__master_server_config_t *cfg,
                              kvs__master_server_t **server_p)
{
    if (cfg == NULL || server_p == NULL || cfg->max_payload == 0 || cfg->max_conns == 0 ||
        cfg->tick_ms == 0 || cfg->probe_ms == 0 || cfg->handshake_timeout_ms == 0 ||
        (cfg->pause_ms != 0 && cfg->pause_ms <= 2 * cfg->tick_ms) ||
        kvs__master_config_check(&cfg->master) != KVS_OK)
        return KVS_INVALID_PARAMS;
    kvs__master_server_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->cfg = *cfg;
    s->listen_fd = s->epoll_fd = s->stop_fd = s->ha_fd = s->metrics_fd = -1;
    kvs__spare_fd_init(&s->spare);
    pthread_mutex_init(&s->metrics_lock, NULL);
    kvs__cond_init(&s->metrics_done);
    s->metrics_init = true;
    s->incarnation = kvs__random_u64();
    if (cfg->tls) {
        char why[256];
        int trc = kvs__tls_create(&cfg->auth, true, &s->tls, why, sizeof(why));
        if (trc != KVS_OK) {
            kvs_error("master: %s", why);
            kvs__free(s);
            return trc;
        }
    }
    s->pause_ns = server_pause_ms(cfg) * KVS_NS_PER_MS;
    kvs__wbuf_init(&s->scratch);
    if (cfg->etcd != NULL)
        s->cfg.master.owner_index = true; /* a new leader rebuilds from the owners */
    int rc = kvs__master_create(&s->cfg.master, &s->master);
    if (rc != KVS_OK)
        goto err;
    s->listen_fd = kvs__tcp_listen(cfg->bind_host ? cfg->bind_host : "127.0.0.1", cfg->port, 512);
    if (s->listen_fd < 0) {
        rc = s->listen_fd;
        goto err;
    }
    kvs__set_nonblock(s->listen_fd, true);
    s->port = kvs__sock_port(s->listen_fd);
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->metrics_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->epoll_fd < 0 || s->stop_fd < 0 || s->metrics_fd < 0) {
        rc = KVS_IO_ERROR;
        goto err;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listen_fd};
    struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &s->stop_fd};
    struct epoll_event mev = {.events = EPOLLIN, .data.ptr = &s->metrics_fd};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &ev) != 0 ||
        epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->stop_fd, &sev) != 0 ||
        epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->metrics_fd, &mev) != 0) {
        rc = KVS_IO_ERROR;
        goto err;
    }
    if (cfg->etcd != NULL && (rc = ha_setup(s)) != KVS_OK)
        goto err;
    *server_p = s;
    return KVS_OK;
err:
    kvs__master_server_destroy(s);
    return rc;
}

uint16_t kvs__master_server_port(const kvs__master_server_t *s)
{
    return s->port;
}

/* ---- connections ------------------------------------------------------------------------ */

/* Whether the connection's peer has identified itself (HELLO, and AUTH where the master has a
 * secret): until then it is held to small frames and the handshake time-out. */
static bool conn_handshake_done(const conn_t *c)
{
    return c->authed;
}

static void timer_unlink(conn_t *c)
{
    conn_list_t *l = c->timer;
    if (l == NULL)
        return;
    if (c->tprev)
        c->tprev->tnext = c->tnext;
    else
        l->head = c->tnext;
    if (c->tnext)
        c->tnext->tprev = c->tprev;
    else
        l->tail = c->tprev;
    c->timer = NULL;
    c->tprev = c->tnext = NULL;
}

static void timer_append(conn_list_t *l, conn_t *c, uint64_t expires_ns)
{
    timer_unlink(c);
    c->timer = l;
    c->expires_ns = expires_ns;
    c->tprev = l->tail;
    c->tnext = NULL;
    if (l->tail)
        l->tail->tnext = c;
    else
        l->head = c;
    l->tail = c;
}

/* A request was served: past the handshake the connection's idle time starts again. One still
 * in its handshake keeps its deadline; a parked one has none while it waits for its probe
 * (probe_ms bounds that), and gets a fresh one when the probe ends. */
static void conn_served(kvs__master_server_t *s, conn_t *c)
{
    if (!conn_handshake_done(c))
        return;
    timer_unlink(c);
    if (!c->parked && s->cfg.idle_timeout_ms != 0)
        timer_append(&s->idle, c, server_now(s) + s->cfg.idle_timeout_ms * KVS_NS_PER_MS);
}

/* Sends an ERROR frame (request id 0: about the connection) if the socket takes it at once; for
 * a peer about to be dropped, so nothing waits for it. */
static void send_error_now(kvs__master_server_t *s, int fd, unsigned version, int status,
                           const char *msg)
{
    kvs__frame_begin(&s->scratch, KVS_MSG_ERROR | KVS_RSP_FLAG, 0, version);
    kvs__error_rsp_t e = {status, kvs__str_c(msg)};
    kvs__error_rsp_encode(&s->scratch, &e);
    if (kvs__frame_end(&s->scratch) == KVS_OK) {
        ssize_t n = send(fd, s->scratch.data, s->scratch.len, MSG_DONTWAIT | MSG_NOSIGNAL);
        KVS_UNUSED(n);
    }
}

static void probe_unlink(kvs__master_server_t *s, probe_t *p);

static void wait_unlink(kvs__master_server_t *s, conn_t *c)
{
    if (c->wait == WAIT_NONE)
        return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else
        s->waiting = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
    c->wprev = c->wnext = NULL;
    c->wait = WAIT_NONE;
    c->parked = false;
}

static void wait_link(kvs__master_server_t *s, conn_t *c, uint8_t kind, uint64_t until)
{
    timer_unlink(c); /* no idle time-out while it waits for us */
    c->wait = kind;
    c->parked = true;
    c->wait_until = until;
    c->wprev = NULL;
    c->wnext = s->waiting;
    if (s->waiting)
        s->waiting->wprev = c;
    s->waiting = c;
}

static void conn_close(kvs__master_server_t *s, conn_t *c)
{
    timer_unlink(c);
    wait_unlink(s, c);
    kvs__wbuf_free(&c->held);
    if (c->probe != NULL)
        probe_unlink(s, c->probe);
    if (c->authed)
        kvs__master_client_disconnected(s->master, server_now(s), c->client_id);
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    kvs__io_t io = {c->fd, c->ssl};
    kvs__io_free(&io);
    close(c->fd);
    for (conn_t **pp = &s->ready; c->ready && *pp != NULL; pp = &(*pp)->ready_next) {
        if (*pp == c) {
            *pp = c->ready_next;
            break;
        }
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    kvs__free(c->payload);
    kvs__wbuf_free(&c->out);
    kvs__free(c);
    s->nconns--;
}

static bool conn_reading(const conn_t *c)
{
    return !c->closing && !c->parked && c->out.len - c->out_sent < OUT_HIGH_WATER;
}

static void conn_update_events(kvs__master_server_t *s, conn_t *c)
{
    size_t pending = c->out.len - c->out_sent;
    uint32_t ev = 0;
    bool reading = conn_reading(c);
    if (reading || c->write_wants_in)
        ev |= EPOLLIN;
    if (c->parked)
        ev |= EPOLLRDHUP; /* a peer that leaves while its MOUNT waits cancels the probe */
    if (pending > 0 || (reading && c->read_wants_out))
        ev |= EPOLLOUT;
    /* Bytes TLS decrypted already raise no event: such a connection is read again before the
     * loop waits. */
    kvs__io_t io = {c->fd, c->ssl};
    if (reading && !c->ready && kvs__io_pending(&io)) {
        c->ready = true;
        c->ready_next = s->ready;
        s->ready = c;
    }
    if (ev != c->events) {
        struct epoll_event e = {.events = ev, .data.ptr = c};
        epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, c->fd, &e);
        c->events = ev;
    }
}

/* Moves the frame in s->scratch to the connection's output. */
static void conn_queue(conn_t *c, kvs__wbuf_t *frame)
{
    if (c->out_sent == c->out.len) {
        kvs__wbuf_reset(&c->out);
        c->out_sent = 0;
    }
    kvs__wbuf_put_bytes(&c->out, frame->data, frame->len);
    if (c->out.failed)
        c->closing = true;
}

static void send_error(kvs__master_server_t *s, conn_t *c, uint32_t req_id, int status,
                       const char *msg, bool close_after)
{
    kvs__frame_begin(&s->scratch, KVS_MSG_ERROR | KVS_RSP_FLAG, req_id, c->reply_version);
    kvs__error_rsp_t e = {status, kvs__str_c(msg)};
    kvs__error_rsp_encode(&s->scratch, &e);
    if (kvs__frame_end(&s->scratch) == KVS_OK)
        conn_queue(c, &s->scratch);
    if (close_after)
        c->closing = true;
}

/* ---- proving a segment's owner dead ------------------------------------------------------ */

/* Takes a finished probe out of the loop; it is freed after the current event batch. */
static void probe_unlink(kvs__master_server_t *s, probe_t *p)
{
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, p->fd, NULL);
    close(p->fd);
    for (probe_t **pp = &s->probes; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (p->conn != NULL)
        p->conn->probe = NULL;
    p->conn = NULL;
    kvs__free(p->payload);
    p->payload = NULL;
    p->next = s->dead_probes;
    s->dead_probes = p;
}

/* Whether the registration `h` names may be replaced now: the same one, its client still
 * without a connection (an owner that reconnected meanwhile is alive). */
static bool holder_still_gone(kvs__master_server_t *s, kvs__str_t name, uint64_t segment_id)
{
    kvs__master_holder_t h;
    return kvs__master_holder(s->master, name, &h) == KVS_OK && h.segment_id == segment_id &&
           !h.connected;
}

typedef enum { PROBE_ALIVE, PROBE_DEAD, PROBE_PARKED } probe_rc_t;

/* Starts a connect to a data endpoint "HOST:PORT" with a numeric host (a name would need a
 * resolver call, which blocks); *fd_p gets the socket. DEAD when refused at once, PARKED when
 * in progress, ALIVE when connected or not probeable. */
static probe_rc_t probe_connect(const char *endpoint, int *fd_p)
{
    char *host = NULL;
    uint16_t port = 0;
    if (kvs__parse_host_port(endpoint, NULL, &host, &port) != KVS_OK || host == NULL || port == 0) {
        kvs__free(host);
        return PROBE_ALIVE;
    }
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", (unsigned)port);
    struct addrinfo *res = NULL;
    int grc = getaddrinfo(host, ports, &hints, &res);
    kvs__free(host);
    if (grc != 0)
        return PROBE_ALIVE;
    probe_rc_t rc = PROBE_ALIVE;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0)
            rc = PROBE_ALIVE;
        else if (errno == EINPROGRESS)
            rc = PROBE_PARKED;
        else if (errno == ECONNREFUSED)
            rc = PROBE_DEAD;
        if (rc != PROBE_PARKED) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    *fd_p = fd;
    return rc;
}

/* A MOUNT of `req` found its name taken. Decides whether the holder is proven dead now
 * (DEAD: replace it and mount again), may be (PARKED: the connection waits for a probe and
 * is answered when it ends) or is not (ALIVE: refuse). A holder whose client still has a
 * connection is alive. One on the same node and data endpoint as the new owner, whose
 * connection came from the same address, is dead: the new owner listens there, so the old one
 * cannot (node names alone are not unique: cloned hosts share them). */
static probe_rc_t mount_probe(kvs__master_server_t *s, conn_t *c, uint64_t now,
                              const kvs__mount_req_t *req)
{
    kvs__master_holder_t h;
    if (kvs__master_holder(s->master, req->name, &h) != KVS_OK || h.connected ||
        h.client_id == c->client_id)
        return PROBE_ALIVE;
    if (kvs__str_eq(kvs__str_c(h.node), req->node) &&
        kvs__str_eq(kvs__str_c(h.endpoint), req->endpoint) && h.peer[0] != '\0' &&
        strcmp(h.peer, c->peer) == 0)
        return PROBE_DEAD;
    int fd = -1;
    probe_rc_t rc = probe_connect(h.endpoint, &fd);
    if (rc != PROBE_PARKED)
        return rc;
    probe_t *p = kvs__calloc(1, sizeof(*p));
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = p};
    if (p == NULL || epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        kvs__free(p);
        close(fd);
        return PROBE_ALIVE;
    }
    *p = (probe_t){.tag = TAG_PROBE,
                   .next = s->probes,
                   .conn = c,
                   .fd = fd,
                   .segment_id = h.segment_id,
                   .deadline_ns = now + s->cfg.probe_ms * KVS_NS_PER_MS,
                   .h = c->h,
                   .payload = c->payload};
    s->probes = p;
    c->payload = NULL; /* the probe keeps the request */
    c->parked = true;
    c->probe = p;
    return PROBE_PARKED;
}

static void dispatch(kvs__master_server_t *s, conn_t *c);

/* Ends the HA waits that are over: a waiting HEARTBEAT whose owner has news (or whose wait
 * ran out) is answered now, and a held PUT_END reply goes once its owners have indexed its
 * objects (or the index wait ran out: the objects are readable, though a failover before the
 * owner catches up would lose them). */
static void waits_run(kvs__master_server_t *s, uint64_t now)
{
    for (conn_t *c = s->waiting, *next; c != NULL; c = next) {
        next = c->wnext;
        bool over = now >= c->wait_until;
        if (c->wait == WAIT_HEARTBEAT) {
            if (!over && !kvs__master_heartbeat_due(s->master, c->client_id))
                continue;
            char msg[KVS_MAX_NAME_LEN + 64];
            if (!ha_serves(s, KVS_MSG_HEARTBEAT, now, msg, sizeof(msg))) {
                wait_unlink(s, c); /* deposed while it waited: tells the owner nothing more */
                send_error(s, c, c->wait_req_id, KVS_NOT_LEADER, msg, false);
                conn_served(s, c);
                conn_update_events(s, c);
                continue;
            }
            kvs__arena_t arena;
            kvs__arena_init(&arena);
            kvs__heartbeat_rsp_t rsp;
            kvs__wbuf_t *w = &s->scratch;
            kvs__frame_begin(w, KVS_MSG_HEARTBEAT | KVS_RSP_FLAG, c->wait_req_id, c->wait_version);
            int rc = kvs__master_heartbeat(s->master, now, c->client_id, NULL, &arena, &rsp);
            if (rc == KVS_OK) {
                kvs__heartbeat_rsp_encode(w, &rsp);
                rc = kvs__frame_end(w);
            }
            wait_unlink(s, c);
            if (rc == KVS_OK)
                conn_queue(c, w);
            else
                send_error(s, c, c->wait_req_id, rc, "HEARTBEAT failed", false);
            kvs__arena_free(&arena);
        } else {
            bool done = c->marks_all ? kvs__master_segments_synced(s->master) : true;
            for (uint32_t i = 0; i < c->nmarks && done; i++)
                done = kvs__master_mark_acked(s->master, &c->marks[i]);
            if (!done && !over)
                continue;
            char msg[KVS_MAX_NAME_LEN + 64];
            bool leading = ha_serves(s, KVS_MSG_HEARTBEAT, now, msg, sizeof(msg));
            wait_unlink(s, c);
            if (!leading) {
                /* Deposed while it waited: the next leader may not have what this did. */
                send_error(s, c, c->wait_req_id, KVS_NOT_LEADER, msg, false);
            } else if (!done && c->wait_type == KVS_MSG_PUT_END) {
                /* The objects stay invisible until their owners index them: not a success. */
                if (s->index_timeouts++ % 1000 == 0)
                    kvs_warn("owners have not indexed a PUT_END's objects within %llu ms: it "
                             "fails (they become readable once indexed)",
                             (unsigned long long)s->cfg.index_wait_ms);
                send_error(s, c, c->wait_req_id, KVS_TIMED_OUT,
                           "the owners did not index the objects in time", false);
            } else {
                conn_queue(c, &c->held); /* a removal: done here, whatever the owner says */
            }
            kvs__wbuf_reset(&c->held);
        }
        conn_served(s, c);
        conn_update_events(s, c);
    }
}

/* A PUT_END reply (in `w`) that waits for the owners' index: true when held. */
static bool hold_for_index(kvs__master_server_t *s, conn_t *c, kvs__wbuf_t *w, uint64_t now)
{
    bool all = false;
    uint32_t n = kvs__master_take_marks(s->master, c->marks, KVS_ARRAY_SIZE(c->marks), &all);
    if (n == 0 && !all)
        return false;
    kvs__wbuf_reset(&c->held);
    kvs__wbuf_put_bytes(&c->held, w->data, w->len);
    if (c->held.failed)
        return false;
    c->nmarks = n;
    c->marks_all = all;
    c->wait_req_id = c->h.req_id;
    c->wait_type = c->h.type;
    wait_link(s, c, WAIT_INDEXED, now + s->cfg.index_wait_ms * KVS_NS_PER_MS);
    return true;
}

/* A probe ended: `dead` when its connect was refused. The parked MOUNT is served again, after
 * the old registration went if it is proven dead; its reply goes out from the loop (the
 * connection is never closed here: the current event batch may still name it). */
static void probe_finish(kvs__master_server_t *s, probe_t *p, bool dead)
{
    conn_t *c = p->conn;
    kvs__mount_req_t req;
    if (dead && kvs__mount_req_decode(p->payload, p->h.len, p->h.version, NULL, &req) == KVS_OK &&
        holder_still_gone(s, req.name, p->segment_id))
        kvs__master_replace(s->master, p->segment_id);
    c->h = p->h;
    c->payload = p->payload;
    p->payload = NULL;
    probe_unlink(s, p);
    c->parked = false;
    c->probed = true;
    dispatch(s, c);
    c->probed = false;
    conn_served(s, c);
    kvs__free(c->payload);
    c->payload = NULL;
    conn_update_events(s, c); /* reads again; the reply waits for EPOLLOUT */
}

static void probe_event(kvs__master_server_t *s, probe_t *p)
{
    if (p->conn == NULL)
        return; /* finished earlier in this batch */
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    probe_finish(s, p, err == ECONNREFUSED);
}

/* Probes out of time prove nothing. */
static void probes_expire(kvs__master_server_t *s, uint64_t now)
{
    for (probe_t *p = s->probes, *next; p != NULL; p = next) {
        next = p->next;
        if (p->deadline_ns <= now)
            probe_finish(s, p, false);
    }
}

static void probes_free_dead(kvs__master_server_t *s)
{
    while (s->dead_probes != NULL) {
        probe_t *p = s->dead_probes;
        s->dead_probes = p->next;
        kvs__free(p);
    }
}

/* ---- requests --------------------------------------------------------------------------- */

/* Gives an authenticated connection its identity: the client id its HELLO asked for (a client
 * keeps its id across connections and masters), or a new one. */
static void conn_bind(kvs__master_server_t *s, conn_t *c, uint64_t now)
{
    c->client_id = c->hello_client_id ? c->hello_client_id : kvs__master_new_client(s->master);
    c->authed = true;
    kvs__master_client_connected(s->master, now, c->client_id);
}

/* A client key as the master stores it for this connection's tenant (in `arena`). A key that
 * is not valid (a NUL byte among them: it could name another tenant's key) becomes the empty
 * key, which the state machine refuses as invalid. */
static bool ns_key(const conn_t *c, kvs__arena_t *arena, kvs__str_t *k)
{
    if (kvs__key_check(k->ptr, k->len) != KVS_OK) {
        *k = (kvs__str_t){"", 0};
        return true;
    }
    if (c->tenant_len == 0)
        return true;
    char *p = kvs__arena_alloc(arena, c->tenant_len + 1 + k->len);
    if (p == NULL)
        return false;
    memcpy(p, c->tenant, c->tenant_len);
    p[c->tenant_len] = '\0';
    memcpy(p + c->tenant_len + 1, k->ptr, k->len);
    *k = (kvs__str_t){p, c->tenant_len + 1 + k->len};
    return true;
}

static int ns_keys_req(const conn_t *c, kvs__arena_t *arena, kvs__keys_req_t *req)
{
    for (uint32_t i = 0; i < req->nkeys; i++) {
        if (!ns_key(c, arena, &req->keys[i]))
            return KVS_NO_MEMORY;
    }
    for (uint32_t i = 0; i < req->nreleased; i++) {
        if (!ns_key(c, arena, &req->released[i].key))
            return KVS_NO_MEMORY;
    }
    return KVS_OK;
}

/* Decodes and serves one request; the response (or an ERROR frame) goes to the output. */
static void dispatch(kvs__master_server_t *s, conn_t *c)
{
    const uint8_t *p = c->payload;
    size_t len = c->h.len;
    unsigned type = c->h.type;
    unsigned ver = c->h.version; /* requests decode in theirs; replies go out in the same */
    uint64_t now = server_now(s);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__wbuf_t *w = &s->scratch;
    kvs__frame_log("master", "<-", &c->h, p, len);
    kvs__master_take_marks(s->master, NULL, 0, NULL);
    kvs__frame_begin(w, (uint16_t)(type | KVS_RSP_FLAG), c->h.req_id,
                     kvs__proto_reply_version(ver));
    int rc = KVS_OK;
    char msg[KVS_MAX_NAME_LEN + 64];

    if (type & KVS_RSP_FLAG || type == KVS_MSG_ERROR) {
        send_error(s, c, c->h.req_id, KVS_PROTOCOL_ERROR, "responses are not requests", true);
        goto out;
    }
    if (!c->hello_done && type != KVS_MSG_HELLO) {
        /* Nothing but HELLO is answered before HELLO: bytes before it stay bounded. */
        send_error(s, c, c->h.req_id, KVS_PROTOCOL_ERROR, "HELLO must come first", true);
        goto out;
    }
    if (c->hello_done && type == KVS_MSG_HELLO) {
        /* The connection's identity was bound by its HELLO; a second could change it. */
        send_error(s, c, c->h.req_id, KVS_PROTOCOL_ERROR, "HELLO twice on one connection", true);
        goto out;
    }
    if (c->hello_done && !c->authed && type != KVS_MSG_AUTH) {
        /* Nothing is served to a peer that has not proved the secret. */
        send_error(s, c, c->h.req_id, KVS_AUTH_FAILED, "AUTH must follow HELLO", true);
        goto out;
    }
    if (type == KVS_MSG_AUTH && (!c->hello_done || c->authed)) {
        send_error(s, c, c->h.req_id, KVS_PROTOCOL_ERROR, "AUTH only once, after HELLO", true);
        goto out;
    }
    if (!kvs__msg_known(type)) {
        /* The payload was read whole: the stream stays in step and the connection usable. */
        snprintf(msg, sizeof(msg),
                 "unknown message type %u (this master speaks protocol %u..%u, types 1..%u)", type,
                 KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX, KVS_MSG_MAX_ - 1);
        send_error(s, c, c->h.req_id, KVS_UNSUPPORTED, msg, false);
        goto out;
    }
    if (type != KVS_MSG_HELLO && type != KVS_MSG_AUTH &&
        !ha_serves(s, type, now, msg, sizeof(msg))) {
        send_error(s, c, c->h.req_id, KVS_NOT_LEADER, msg, false);
        goto out;
    }
    switch (type) {
    case KVS_MSG_HELLO: {
        kvs__hello_req_t req;
        if ((rc = kvs__hello_req_decode(p, len, ver, &arena, &req)) != KVS_OK) {
            /* From a newer peer it may be a HELLO we cannot read: say which versions we speak. */
            snprintf(msg, sizeof(msg), "malformed HELLO of protocol %u (this master speaks %u..%u)",
                     ver, KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
            send_error(s, c, c->h.req_id,
                       ver > KVS_PROTO_VERSION_MAX ? KVS_INVALID_VERSION : KVS_INVALID_PARAMS, msg,
                       true);
            goto out;
        }
        unsigned v = kvs__proto_negotiate(req.version_min, req.version_max);
        if (v == 0) {
            snprintf(msg, sizeof(msg),
                     "client speaks protocol %u..%u, this master speaks %u..%u: no version in "
                     "common",
                     req.version_min, req.version_max, KVS_PROTO_VERSION_MIN,
                     KVS_PROTO_VERSION_MAX);
            send_error(s, c, c->h.req_id, KVS_INVALID_VERSION, msg, true);
            goto out;
        }
        kvs__hello_rsp_t rsp = {.status = KVS_OK,
                                .version = v,
                                .incarnation = s->incarnation,
                                .lease_ms = s->cfg.master.lease_ms,
                                .heartbeat_timeout_ms = s->cfg.master.heartbeat_timeout_ms,
                                .term = s->ha_serving ? s->term : 0,
                                .next_probe = req.next_probe};
        if (kvs__auth_server_hello(&s->cfg.auth, KVS_AUTH_MASTER, NULL, &req, &c->auth, &rsp) !=
            KVS_OK) {
            send_error(s, c, c->h.req_id, KVS_AUTH_FAILED, "HELLO carries no nonce", true);
            goto out;
        }
        if (req.tenant.len > 0 &&
            !(req.tenant.len == 7 && memcmp(req.tenant.ptr, "default", 7) == 0)) {
            if (!kvs__tenant_ok(req.tenant.ptr, req.tenant.len)) {
                send_error(s, c, c->h.req_id, KVS_INVALID_PARAMS,
                           "tenant names are 1..64 bytes of A-Z a-z 0-9 . _ -", true);
                goto out;
            }
            memcpy(c->tenant, req.tenant.ptr, req.tenant.len);
            c->tenant_len = req.tenant.len;
        }
        c->hello_done = true;
        c->hello_client_id = req.client_id;
        if (!c->auth.required)
            conn_bind(s, c, now);     /* no secret: the identity is bound at HELLO */
        rsp.client_id = c->client_id; /* 0 until AUTH */
        kvs__frame_begin(w, (uint16_t)(type | KVS_RSP_FLAG), c->h.req_id, v);
        kvs__hello_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_AUTH: {
        kvs__auth_req_t req;
        if ((rc = kvs__auth_req_decode(p, len, ver, &arena, &req)) != KVS_OK ||
            !kvs__auth_server_verify(&s->cfg.auth, KVS_AUTH_MASTER, NULL, &c->auth, &req)) {
            kvs_warn("refused a peer from %s: wrong proof (another token?)",
                     c->peer[0] ? c->peer : "an unknown address");
            send_error(s, c, c->h.req_id, KVS_AUTH_FAILED,
                       "wrong proof: this master has another token", true);
            goto out;
        }
        conn_bind(s, c, now);
        kvs__auth_rsp_t rsp = {KVS_OK, c->client_id};
        kvs__auth_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_MOUNT: {
        kvs__mount_req_t req;
        if ((rc = kvs__mount_req_decode(p, len, ver, &arena, &req)) != KVS_OK)
            break;
        kvs__mount_rsp_t rsp = {0};
        rsp.epoch = kvs__master_cap_epoch(s->master, now);
        rsp.status = kvs__master_mount(s->master, now, c->client_id, &req, &rsp.segment_id);
        if (rsp.status == KVS_OK)
            kvs__master_segment_set_peer(s->master, rsp.segment_id, c->peer);
        if (rsp.status == KVS_SEGMENT_ALREADY_EXISTS && !c->probed) {
            kvs__master_holder_t h;
            probe_rc_t pr = mount_probe(s, c, now, &req);
            if (pr == PROBE_PARKED)
                goto out; /* answered when the probe ends */
            if (pr == PROBE_DEAD && kvs__master_holder(s->master, req.name, &h) == KVS_OK) {
                kvs__master_replace(s->master, h.segment_id);
                rsp.status = kvs__master_mount(s->master, now, c->client_id, &req, &rsp.segment_id);
                if (rsp.status == KVS_OK)
                    kvs__master_segment_set_peer(s->master, rsp.segment_id, c->peer);
            }
        }
        kvs__mount_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_RECOVER: {
        kvs__recover_req_t req;
        kvs__status_list_rsp_t rsp;
        if ((rc = kvs__recover_req_decode(p, len, ver, &arena, &req)) != KVS_OK)
            break;
        rc = ver < 4 ? KVS_UNSUPPORTED
                     : kvs__master_recover(s->master, now, c->client_id, &req, &arena, &rsp);
        if (rc == KVS_OK)
            kvs__status_list_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_UNMOUNT: {
        kvs__ids_req_t req;
        if ((rc = kvs__ids_req_decode(p, len, ver, &arena, &req)) != KVS_OK)
            break;
        kvs__status_list_rsp_t rsp = {0};
        rsp.status = kvs__master_unmount(s->master, c->client_id, req.segment_id);
        kvs__status_list_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_HEARTBEAT: {
        kvs__heartbeat_req_t req;
        kvs__heartbeat_rsp_t rsp;
        if (s->ha != NULL && ver >= 4 &&
            kvs__heartbeat_req_decode(p, len, ver, &arena, &req) == KVS_OK && req.wait_ms > 0 &&
            kvs__master_heartbeat(s->master, now, c->client_id, &req, NULL, NULL) == KVS_OK &&
            !kvs__master_heartbeat_due(s->master, c->client_id)) {
            /* Nothing to tell yet: answered when there is (waits_run), or after the wait. */
            c->wait_req_id = c->h.req_id;
            c->wait_version = kvs__proto_reply_version(ver);
            wait_link(s, c, WAIT_HEARTBEAT, now + KVS_MIN(req.wait_ms, 2000) * KVS_NS_PER_MS);
            goto out;
        }
        if ((rc = kvs__heartbeat_req_decode(p, len, ver, &arena, &req)) != KVS_OK ||
            (rc = kvs__master_heartbeat(s->master, now, c->client_id, &req, &arena, &rsp)) !=
                KVS_OK)
            break;
        kvs__heartbeat_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_PUT_START: {
        kvs__put_start_req_t req;
        kvs__placement_rsp_t rsp;
        rc = kvs__put_start_req_decode(p, len, ver, &arena, &req);
        /* Keys and groups both live in the tenant's namespace; an item with a group that is
         * not a valid name is refused (its key made invalid). */
        for (uint32_t i = 0; rc == KVS_OK && i < req.nitems; i++) {
            kvs__put_item_t *it = &req.items[i];
            if (it->group.len > 0 && kvs__key_check(it->group.ptr, it->group.len) != KVS_OK)
                it->key = (kvs__str_t){"", 0};
            rc =
                ns_key(c, &arena, &it->key) && (it->group.len == 0 || ns_key(c, &arena, &it->group))
                    ? KVS_OK
                    : KVS_NO_MEMORY;
        }
        if (rc != KVS_OK || (rc = kvs__master_put_start(s->master, now, c->client_id, &req, &arena,
                                                        &rsp)) != KVS_OK)
            break;
        kvs__placement_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_LOOKUP: {
        kvs__keys_req_t req;
        kvs__placement_rsp_t rsp;
        if ((rc = kvs__keys_req_decode(p, len, ver, &arena, &req)) != KVS_OK ||
            (rc = ns_keys_req(c, &arena, &req)) != KVS_OK ||
            (rc = kvs__master_release(s->master, now, c->client_id, req.released, req.nreleased)) !=
                KVS_OK ||
            (rc = kvs__master_lookup(s->master, now, c->client_id, &req, &arena, &rsp)) != KVS_OK)
            break;
        kvs__placement_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_PUT_END:
    case KVS_MSG_PUT_REVOKE:
    case KVS_MSG_EXISTS:
    case KVS_MSG_REMOVE:
    case KVS_MSG_REPLICA_CLEAR:
    case KVS_MSG_RELEASE: {
        kvs__keys_req_t req;
        kvs__status_list_rsp_t rsp = {0};
        /* The leases of reads the client has finished go first: a REMOVE of a key just read
         * by this client finds it unleased. */
        if ((rc = kvs__keys_req_decode(p, len, ver, &arena, &req)) != KVS_OK ||
            (rc = ns_keys_req(c, &arena, &req)) != KVS_OK ||
            (rc = kvs__master_release(s->master, now, c->client_id, req.released, req.nreleased)) !=
                KVS_OK)
            break;
        if (type == KVS_MSG_RELEASE)
            rc = req.nkeys == 0 ? KVS_OK : KVS_PROTOCOL_ERROR;
        else if (type == KVS_MSG_REPLICA_CLEAR)
            rc = ver < 4
                     ? KVS_UNSUPPORTED
                     : kvs__master_replica_clear(s->master, now, c->client_id, &req, &arena, &rsp);
        else if (type == KVS_MSG_PUT_END)
            rc = kvs__master_put_end(s->master, now, c->client_id, &req, &arena, &rsp);
        else if (type == KVS_MSG_PUT_REVOKE)
            rc = kvs__master_put_revoke(s->master, now, c->client_id, &req, &arena, &rsp);
        else if (type == KVS_MSG_EXISTS)
            rc = kvs__master_exists(s->master, now, &req, &arena, &rsp);
        else
            rc = kvs__master_remove(s->master, now, &req, &arena, &rsp);
        if (rc == KVS_OK)
            kvs__status_list_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_LIST: {
        kvs__list_req_t req;
        kvs__list_rsp_t rsp;
        if ((rc = kvs__list_req_decode(p, len, ver, &arena, &req)) != KVS_OK)
            break;
        /* The tenant's keys only, listed without their namespace. */
        if (req.prefix.len > 0 && memchr(req.prefix.ptr, '\0', req.prefix.len) != NULL) {
            rc = KVS_INVALID_PARAMS;
            break;
        }
        if (c->tenant_len > 0) {
            char *pre = kvs__arena_alloc(&arena, c->tenant_len + 1 + req.prefix.len);
            if (pre == NULL) {
                rc = KVS_NO_MEMORY;
                break;
            }
            memcpy(pre, c->tenant, c->tenant_len);
            pre[c->tenant_len] = '\0';
            if (req.prefix.len)
                memcpy(pre + c->tenant_len + 1, req.prefix.ptr, req.prefix.len);
            req.prefix = (kvs__str_t){pre, c->tenant_len + 1 + req.prefix.len};
        }
        if ((rc = kvs__master_list(s->master, &req, &arena, &rsp)) != KVS_OK)
            break;
        for (uint32_t i = 0; i < rsp.nentries && c->tenant_len > 0; i++) {
            rsp.entries[i].key.ptr += c->tenant_len + 1;
            rsp.entries[i].key.len -= c->tenant_len + 1;
        }
        kvs__list_rsp_encode(w, &rsp);
        break;
    }
    case KVS_MSG_STAT: {
        kvs__stat_rsp_t rsp;
        if ((rc = kvs__msg_desc(type)->req->decode(p, len, ver, &arena, NULL)) != KVS_OK)
            break;
        if ((rc = kvs__master_stat(s->master, now, &arena, &rsp)) != KVS_OK)
            break;
        kvs__stat_rsp_encode(w, &rsp);
        break;
    }
    default:
        rc = KVS_PROTOCOL_ERROR;
        break;
    }
    if (rc == KVS_OK)
        rc = kvs__frame_end(w);
    if (rc == KVS_OK) {
        if (kvs__log_level() >= KVS_LOG_DEBUG) {
            kvs__frame_hdr_t rh;
            if (kvs__frame_hdr_decode(w->data, w->len, KVS_FRAME_MAX_PAYLOAD, &rh) == KVS_OK)
                kvs__frame_log("master", "->", &rh, w->data + KVS_FRAME_HDR_LEN, rh.len);
        }
        /* HA: a put's end, a removal or a clear answers once the owners' indexes agree. */
        bool holds =
            type == KVS_MSG_PUT_END || type == KVS_MSG_REMOVE || type == KVS_MSG_REPLICA_CLEAR;
        if (!(holds && s->ha != NULL && hold_for_index(s, c, w, now)))
            conn_queue(c, w);
    } else {
        snprintf(msg, sizeof(msg), "%s request %s", kvs__msg_name(type),
                 rc == KVS_PROTOCOL_ERROR ? "is malformed" : "failed");
        kvs_debug("client %llu: %s", (unsigned long long)c->client_id, msg);
        send_error(s, c, c->h.req_id, rc == KVS_PROTOCOL_ERROR ? KVS_INVALID_PARAMS : rc, msg,
                   false);
    }
out:
    kvs__arena_free(&arena);
    /* Reads change nothing a wait is for (no fences, index changes or acknowledgements): the
     * hot path skips the list; time-outs are seen at the next tick. */
    bool news = type != KVS_MSG_LOOKUP && type != KVS_MSG_EXISTS && type != KVS_MSG_LIST &&
                type != KVS_MSG_STAT && type != KVS_MSG_RELEASE && type != KVS_MSG_HELLO &&
                type != KVS_MSG_AUTH;
    if (s->waiting != NULL && news)
        waits_run(s, now);
}

/* Reads what is available and serves each complete frame. Returns false to close now. */
static bool conn_read(kvs__master_server_t *s, conn_t *c)
{
    while (!c->closing && !c->parked && c->out.len - c->out_sent < OUT_HIGH_WATER) {
        uint8_t *dst;
        size_t want;
        if (c->hdr_got < KVS_FRAME_HDR_LEN) {
            dst = c->hdr + c->hdr_got;
            want = KVS_FRAME_HDR_LEN - c->hdr_got;
        } else {
            dst = c->payload + c->payload_got;
            want = c->h.len - c->payload_got;
        }
        kvs__io_t io = {c->fd, c->ssl};
        short events = POLLIN;
        ssize_t n = want ? kvs__io_recv(&io, dst, want, &events) : 0;
        c->read_wants_out = n < 0 && events == POLLOUT;
        if (want && n == 0)
            return false;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK;
        }
        if (c->hdr_got < KVS_FRAME_HDR_LEN) {
            c->hdr_got += (size_t)n;
            if (c->hdr_got < KVS_FRAME_HDR_LEN)
                continue;
            int rc = kvs__frame_hdr_decode(c->hdr, sizeof(c->hdr), s->cfg.max_payload, &c->h);
            if (rc != KVS_OK) {
                /* The stream cannot be resynchronised: explain, then hang up. */
                char msg[128] = "bad frame header (magic, type or size)";
                if (rc == KVS_INVALID_VERSION)
                    snprintf(msg, sizeof(msg),
                             "unsupported protocol version %u (this master speaks %u..%u)",
                             (unsigned)c->hdr[4] | (unsigned)c->hdr[5] << 8, KVS_PROTO_VERSION_MIN,
                             KVS_PROTO_VERSION_MAX);
                send_error(s, c, 0, rc, msg, true);
                return true;
            }
            c->reply_version = kvs__proto_reply_version(c->h.version);
            uint32_t cap = KVS_MIN(s->cfg.max_payload, KVS_HANDSHAKE_MAX_PAYLOAD);
            if (!conn_handshake_done(c) && c->h.len > cap) {
                /* Refused before anything is allocated: a peer that has not identified itself
                 * costs a connection and a few bytes, never the frame it announces. */
                char msg[128];
                snprintf(msg, sizeof(msg),
                         "a frame of %u bytes before the handshake (at most %u until then)",
                         (unsigned)c->h.len, (unsigned)cap);
                send_error(s, c, c->h.req_id, KVS_PROTOCOL_ERROR, msg, true);
                return true;
            }
            kvs__free(c->payload);
            c->payload = kvs__malloc(c->h.len ? c->h.len : 1);
            c->payload_got = 0;
            if (c->payload == NULL) {
                send_error(s, c, c->h.req_id, KVS_NO_MEMORY, "out of memory", true);
                return true;
            }
        } else {
            c->payload_got += (size_t)n;
        }
        if (c->hdr_got == KVS_FRAME_HDR_LEN && c->payload_got == c->h.len) {
            dispatch(s, c);
            conn_served(s, c);
            c->hdr_got = 0;
            kvs__free(c->payload);
            c->payload = NULL;
        }
    }
    return true;
}

static bool conn_write(conn_t *c)
{
    c->write_wants_in = false;
    while (c->out_sent < c->out.len) {
        kvs__io_t io = {c->fd, c->ssl};
        short events = POLLOUT;
        ssize_t n = kvs__io_send(&io, c->out.data + c->out_sent, c->out.len - c->out_sent, &events);
        c->write_wants_in = n < 0 && events == POLLIN;
        if (n > 0) {
            c->out_sent += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        }
    }
    return true;
}

/* The address of the socket's peer, without the port ("" when unknown). */
static void peer_address(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    out[0] = '\0';
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST) != 0)
        out[0] = '\0';
}

/* Stops watching the listening socket until the next tick: it stays readable while accept
 * fails for want of descriptors or memory, and the loop would spin on it. */
static void listen_pause(kvs__master_server_t *s)
{
    struct epoll_event ev = {.events = 0, .data.ptr = &s->listen_fd};
    if (!s->listen_paused && epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, s->listen_fd, &ev) == 0)
        s->listen_paused = true;
}

static void listen_resume(kvs__master_server_t *s)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listen_fd};
    if (s->listen_paused && epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, s->listen_fd, &ev) == 0)
        s->listen_paused = false;
}

/* Accept failed: out of descriptors sheds the pending connections (the spare), anything but
 * "none pending" pauses listening. Returns true to accept again. */
static bool accept_failed(kvs__master_server_t *s)
{
    int err = errno;
    if (err == EINTR || err == ECONNABORTED)
        return true;
    if (err == EAGAIN || err == EWOULDBLOCK)
        return false;
    if (err == EMFILE || err == ENFILE) {
        int shed = kvs__spare_fd_shed(&s->spare, s->listen_fd, "master");
        if (shed < 0)
            listen_pause(s);
        return shed > 0;
    }
    if (kvs__every(&s->refuse_warn_ns, KVS_NS_PER_S))
        kvs_warn("master: accept: %s", strerror(err));
    listen_pause(s); /* ENOBUFS, ENOMEM: try again at the next tick */
    return false;
}

/* A connection beyond the limit is told why, without waiting for it, and closed. */
static void refuse_conn(kvs__master_server_t *s, int fd)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "too many connections (%u open, limit %u)", (unsigned)s->nconns,
             (unsigned)s->cfg.max_conns);
    if (kvs__every(&s->refuse_warn_ns, KVS_NS_PER_S))
        kvs_warn("master: refusing a connection: %s", msg);
    if (s->tls == NULL) /* a TLS peer could not read plain words */
        send_error_now(s, fd, KVS_PROTO_VERSION_MIN, KVS_NO_RESOURCE, msg);
    close(fd);
}

static void accept_all(kvs__master_server_t *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (accept_failed(s))
                continue;
            return;
        }
        if (s->nconns >= s->cfg.max_conns) {
            refuse_conn(s, fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn_t *c = kvs__calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->tag = TAG_CONN;
        c->fd = fd;
        if (s->tls != NULL) { /* the handshake runs in the first reads and writes */
            kvs__io_t io;
            if (kvs__tls_handshake(s->tls, fd, 0, &io) != KVS_OK) {
                close(fd);
                kvs__free(c);
                continue;
            }
            c->ssl = io.ssl;
        }
        peer_address(fd, c->peer, sizeof(c->peer));
        c->reply_version = KVS_PROTO_VERSION_MIN;
        c->events = EPOLLIN;
        kvs__wbuf_init(&c->out);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            kvs__free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        timer_append(&s->handshaking, c,
                     server_now(s) + s->cfg.handshake_timeout_ms * KVS_NS_PER_MS);
    }
}

/* Reads the connections whose TLS holds decrypted bytes (no event would come for them). */
static void serve_ready(kvs__master_server_t *s)
{
    conn_t *list = s->ready;
    s->ready = NULL;
    while (list != NULL) {
        conn_t *c = list;
        list = c->ready_next;
        c->ready = false;
        bool ok = conn_read(s, c) && conn_write(c);
        if (!ok || (c->closing && c->out_sent == c->out.len))
            conn_close(s, c);
        else
            conn_update_events(s, c);
    }
}

/* Closes the connections whose time ran out: no handshake within its time-out (told so, if the
 * socket takes it at once), or no request for the idle time-out. Both lists are in expiry
 * order, so this looks at each expired connection and one more. */
static void conns_expire(kvs__master_server_t *s, uint64_t now)
{
    while (s->handshaking.head != NULL && s->handshaking.head->expires_ns <= now) {
        conn_t *c = s->handshaking.head;
        if (c->out_sent == c->out.len && c->ssl == NULL) { /* (plain words, not in TLS) */
            char msg[96];
            snprintf(msg, sizeof(msg), "no handshake within %llu ms",
                     (unsigned long long)s->cfg.handshake_timeout_ms);
            send_error_now(s, c->fd, c->reply_version, KVS_TIMED_OUT, msg);
        }
        conn_close(s, c);
    }
    while (s->idle.head != NULL && s->idle.head->expires_ns <= now)
        conn_close(s, s->idle.head);
}

/* Renders the scrape the HTTP thread is waiting for, if it still waits. Loop thread. */
static void metrics_answer(kvs__master_server_t *s)
{
    uint64_t v;
    ssize_t r = read(s->metrics_fd, &v, sizeof(v));
    KVS_UNUSED(r);
    pthread_mutex_lock(&s->metrics_lock);
    kvs__text_t *t = s->metrics_out;
    if (t != NULL) {
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        kvs__stat_rsp_t rsp;
        int rc = kvs__master_stat(s->master, server_now(s), &arena, &rsp);
        if (rc == KVS_OK) {
            kvs__master_metrics_write(&rsp, t);
            /* The service's own state, beside the state machine's. */
            bool leads = s->ha == NULL || s->ha_serving;
            kvs__text_printf(t,
                             "# HELP kvstash_master_connections Open connections to the master\n"
                             "# TYPE kvstash_master_connections gauge\n"
                             "kvstash_master_connections %u\n"
                             "# HELP kvstash_master_leader Whether this master serves (1) or "
                             "stands by (0)\n"
                             "# TYPE kvstash_master_leader gauge\n"
                             "kvstash_master_leader %d\n",
                             (unsigned)s->nconns, leads ? 1 : 0);
        }
        kvs__arena_free(&arena);
        s->metrics_rc = rc;
        s->metrics_out = NULL;
        pthread_cond_broadcast(&s->metrics_done);
    }
    pthread_mutex_unlock(&s->metrics_lock);
}

int kvs__master_server_metrics_render(void *arg, kvs__text_t *t)
{
    kvs__master_server_t *s = arg;
    uint64_t one = 1, deadline = kvs__now_ns() + s->cfg.metrics_timeout_ms * KVS_NS_PER_MS;
    pthread_mutex_lock(&s->metrics_lock);
    while (s->metrics_out != NULL) /* one scrape at a time */
        if (!kvs__cond_wait_until(&s->metrics_done, &s->metrics_lock, deadline))
            break;
    int rc = KVS_TIMED_OUT;
    if (s->metrics_out == NULL) {
        s->metrics_out = t;
        ssize_t w = write(s->metrics_fd, &one, sizeof(one));
        KVS_UNUSED(w);
        while (s->metrics_out == t)
            if (!kvs__cond_wait_until(&s->metrics_done, &s->metrics_lock, deadline))
                break;
        if (s->metrics_out == t) /* the loop did not answer: it must never write into t now */
            s->metrics_out = NULL;
        else
            rc = s->metrics_rc;
    }
    pthread_mutex_unlock(&s->metrics_lock);
    return rc;
}

int kvs__master_server_run(kvs__master_server_t *s)
{
    if (s == NULL)
        return KVS_INVALID_PARAMS;
    kvs_info("master serving on port %u", (unsigned)s->port);
    struct epoll_event evs[64];
    uint64_t tick_ns = s->cfg.tick_ms * KVS_NS_PER_MS, next_tick = server_now(s) + tick_ns;
    for (;;) {
        serve_ready(s);
        int n = epoll_wait(s->epoll_fd, evs, (int)KVS_ARRAY_SIZE(evs),
                           s->ready != NULL ? 0 : (int)s->cfg.tick_ms);
        if (n < 0 && errno != EINTR) {
            kvs_error("epoll_wait: %s", strerror(errno));
            return KVS_IO_ERROR;
        }
        server_now(s); /* a pause shows here, before any request or tick uses the clock */
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &s->stop_fd)
                return KVS_OK;
            if (tag == &s->metrics_fd) {
                metrics_answer(s);
                continue;
            }
            if (tag == &s->ha_fd) {
                s->ha_woken = true; /* after the batch: taking office frees connections */
                continue;
            }
            if (tag == &s->listen_fd) {
                accept_all(s);
                continue;
            }
            if (*(tag_t *)tag == TAG_PROBE) {
                probe_event(s, tag);
                continue;
            }
            conn_t *c = tag;
            bool ok = true;
            if (c->parked && (evs[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
                ok = false; /* reported whatever we watch: a parked peer that failed goes now */
            else if ((evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ||
                     (c->read_wants_out && (evs[i].events & EPOLLOUT)))
                ok = conn_read(s, c);
            if (ok)
                ok = conn_write(c);
            if (!ok || (c->closing && c->out_sent == c->out.len))
                conn_close(s, c);
            else
                conn_update_events(s, c);
        }
        if (s->ha_woken) {
            s->ha_woken = false;
            ha_check(s);
        }
        uint64_t now = server_now(s);
        probes_expire(s, now);
        probes_free_dead(s);
        conns_expire(s, now);
        if (now >= next_tick) {
            ha_check(s);
            kvs__master_tick(s->master, now); /* (discards and evictions: news for owners) */
            if (s->waiting != NULL)
                waits_run(s, now); /* waits that ran out, and the tick's news */
            listen_resume(s);
            next_tick = now + tick_ns;
        }
    }
}

static void *server_thread(void *arg)
{
    kvs__master_server_run(arg);
    return NULL;
}

int kvs__master_server_start(kvs__master_server_t *s)
{
    if (s == NULL || s->thread_started)
        return KVS_INVALID_PARAMS;
    if (pthread_create(&s->thread, NULL, server_thread, s) != 0)
        return KVS_INTERNAL_ERROR;
    s->thread_started = true;
    return KVS_OK;
}

void kvs__master_server_stop(kvs__master_server_t *s)
{
    uint64_t one = 1;
    if (s != NULL && s->stop_fd >= 0) {
        ssize_t w = write(s->stop_fd, &one, sizeof(one));
        KVS_UNUSED(w);
    }
}

void kvs__master_server_destroy(kvs__master_server_t *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        kvs__master_server_stop(s);
        pthread_join(s->thread, NULL);
    }
    kvs__ha_stop(s->ha); /* revokes the lease: a standby takes over at once */
    if (s->ha_fd >= 0)
        close(s->ha_fd);
    while (s->conns != NULL)
        conn_close(s, s->conns);
    probes_free_dead(s);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    if (s->metrics_fd >= 0)
        close(s->metrics_fd);
    if (s->metrics_init) {
        pthread_mutex_destroy(&s->metrics_lock);
        pthread_cond_destroy(&s->metrics_done);
    }
    if (s->epoll_fd >= 0)
        close(s->epoll_fd);
    kvs__spare_fd_close(&s->spare);
    kvs__wbuf_free(&s->scratch);
    kvs__tls_destroy(s->tls);
    kvs__auth_wipe(&s->cfg.auth);
    kvs__master_destroy(s->master);
    kvs__free(s);
}
