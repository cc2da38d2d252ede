/* The hostile network (issue 24), against real kvstash-server processes on loopback started
 * with a token (some cases again with --tls): peers without the token or with another one on
 * every endpoint (the master RPC port, an owner's data port, its shm socket), replayed
 * sessions, a client acting on another client's segments, puts and allocations, floods, slow
 * and half-open connections, and a second local user. Each case asserts what would fail without
 * its protection: a refusal leaves the store exactly as it was (its counters, segments, keys
 * and every byte of the owner's segment are compared before and after), and servers give back
 * the memory, descriptors and threads peers cost them. KVS_HOSTILE_CONNS (default 2000) and
 * KVS_HOSTILE_PEERS (default 200) set the flood and the slow-peer counts. */
#define _GNU_SOURCE
#include "client_fixture.h"
#include "kvs_test.h"
#include "proc_helpers.h"
#include "rpc_helpers.h"
#include "server_fixture.h"

#include "proto/net_int.h"
#include "transport/shm/shm_int.h"

#include <kvstash/kvstash.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* Sanitizer builds run several times slower: waits and time bounds stretch by this much (the
 * counts and bytes asserted never do). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLOW 4u
#else
#define SLOW 1u
#endif

/* What peers may leave resident in a server once they are gone: glibc keeps freed memory it
 * cannot trim (the heap's top may stay in use; each burst of connection threads leaves per-
 * thread arenas, up to 8 per core) and caches freed thread stacks (only touched pages count),
 * so up to what the peers held at once: measured, 47 KiB per TLS handshake in progress (9.4
 * MiB for 200, freed and reused by the next ones, never growing), a few KiB per plain one.
 * 16 MiB covers the default counts; more peers held at once get 64 KiB (TLS) or 16 KiB each.
 * A leak of 4 KiB per refused connection of a flood would exceed it. */
static uint64_t rss_slack_kb(unsigned held, bool tls)
{
    return KVS_MAX(16u * 1024, (uint64_t)held * (tls ? 64 : 16));
}

#define TOKEN       "the hostile network suite's token, 0123456789abcdef"
#define TOKEN_WRONG "another cluster's token, also long enough 0123456789"
#define SEG_NAME    "hostile-owner"
#define SEG_SIZE    (8u << 20)
#define REQ_ID      7u /* of every request an attacker sends */

static uint64_t deadline_ms(uint64_t ms)
{
    return kvs__now_ns() + ms * SLOW * KVS_NS_PER_MS;
}

static unsigned env_count(const char *name, unsigned def)
{
    const char *s = getenv(name);
    return s != NULL && *s != '\0' ? (unsigned)strtoul(s, NULL, 10) : def;
}

/* The connection cap and handshake time-out of the servers a flood hits. Under TSan a thread
 * takes milliseconds to start, so the owner (a thread per connection) holds fewer at once: a
 * lower cap and a longer time-out keep the cap reached. KVS_HOSTILE_MAX_CONNS overrides. */
#if defined(__SANITIZE_THREAD__)
#define FLOOD_CAP          64u
#define FLOOD_HANDSHAKE_MS "1200"
#else
#define FLOOD_CAP          512u
#define FLOOD_HANDSHAKE_MS "300"
#endif

/* Deterministic bytes for an object: `seed` tells objects apart. */
static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 29u + i * 131u + (i >> 11) * 7u);
}

/* ---- the store -------------------------------------------------------------------------- */

/* A master and an owner in separate processes, both with the token. */
typedef struct {
    server_t master, owner;
    bool tls;
    char addr[32];           /* the master, "127.0.0.1:PORT" */
    char token[96];          /* the token file (mode 0600) */
    kvs__auth_t auth, wrong; /* the token's key, and another token's */
    kvs__tls_t *tls_ctx;     /* a TLS client keyed by the token, when tls */
    char shm_dir[64];        /* KVS_SHM_DIR: this store's alone, mode 0700 */
    char shm_sock[128];      /* the owner's shm socket in it */
    uint64_t seg_id;         /* the owner's segment */
    kvs__rpc_t *rpc;         /* an authenticated client of the master, for views */
} store_t;

/* The name a server's proofs bind (docs/protocol.md): the owner's endpoint as clients dial it
 * ("127.0.0.1:PORT"), none for the master. */
static const char *server_name(const store_t *st, kvs__auth_endpoint_t ep)
{
    static __thread char name[32];
    if (ep == KVS_AUTH_MASTER)
        return NULL;
    snprintf(name, sizeof(name), "127.0.0.1:%u", (unsigned)st->owner.port);
    return name;
}

static void token_write(const char *path, const char *text)
{
    unlink(path);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    CHECK_EQ_INT(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
}

static kvs__auth_t auth_load(const char *path)
{
    kvs__auth_t a;
    char why[256] = "";
    int rc = kvs__auth_load(path, &a, why, sizeof(why));
    if (rc != KVS_OK)
        kvs_test_fail(__FILE__, __LINE__, "%s: %s", path, why);
    return a;
}

/* Appends NULL-terminated `extra` to args[*n..]. */
static void args_add(const char **args, int *n, int cap, const char *const *extra)
{
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        CHECK(*n < cap - 1);
        args[(*n)++] = extra[i];
    }
    args[*n] = NULL;
}

/* Writes a token file (mode 0600, of this user), then starts the master and the owner with it
 * (and TLS), each with its own `extra` flags, and waits until the owner's segment is mounted.
 * The shm directory is the store's own (KVS_SHM_DIR, mode 0700). */
static void store_start(store_t *st, bool tls, const char *const *master_extra,
                        const char *const *owner_extra)
{
    memset(st, 0, sizeof(*st));
    snprintf(st->token, sizeof(st->token), "/tmp/kvs-hostile-token-%d", (int)getpid());
    token_write(st->token, TOKEN);
    char wrong[96];
    snprintf(wrong, sizeof(wrong), "/tmp/kvs-hostile-wrong-%d", (int)getpid());
    token_write(wrong, TOKEN_WRONG);
    st->wrong = auth_load(wrong);
    unlink(wrong);
    st->auth = auth_load(st->token);
    st->tls = tls;
    if (tls) {
        char why[256];
        CHECK_STATUS(kvs__tls_create(&st->auth, false, &st->tls_ctx, why, sizeof(why)), KVS_OK);
    }
    snprintf(st->shm_dir, sizeof(st->shm_dir), "/tmp/kvs-hostile-shm-%d-XXXXXX", (int)getpid());
    CHECK(mkdtemp(st->shm_dir) != NULL);
    CHECK_EQ_INT(chmod(st->shm_dir, 0700), 0);
    setenv("KVS_SHM_DIR", st->shm_dir, 1);
    unsetenv("KVS_AUTH_TOKEN_FILE");

    const char *common[] = {"--auth-token-file", st->token, tls ? "--tls" : NULL, NULL};
    const char *args[32] = {"--master-only"};
    int n = 1;
    args_add(args, &n, 32, common);
    args_add(args, &n, 32, master_extra);
    server_start(&st->master, args);
    snprintf(st->addr, sizeof(st->addr), "127.0.0.1:%u", (unsigned)st->master.port);
    const char *owner[] = {"--owner-only", "--master",       st->addr, "--segment-size",
                           "8MiB",         "--segment-name", SEG_NAME, NULL};
    n = 0;
    args_add(args, &n, 32, owner);
    args_add(args, &n, 32, common);
    args_add(args, &n, 32, owner_extra);
    server_start(&st->owner, args);
    snprintf(st->shm_sock, sizeof(st->shm_sock), "%s/data-%u.sock", st->shm_dir,
             (unsigned)st->owner.port);

    kvs__rpc_config_t rc = {.host = "127.0.0.1",
                            .port = st->master.port,
                            .timeout_ms = 5000 * SLOW,
                            .max_conns = 1,
                            .auth = st->auth,
                            .tls = tls};
    CHECK_STATUS(kvs__rpc_open(&rc, &st->rpc), KVS_OK);
    uint64_t dl = deadline_ms(5000);
    while (rpc_stat_counter(st->rpc, "segments") < 1) {
        CHECK(kvs__now_ns() < dl);
        usleep(10000);
    }
    st->seg_id = rpc_stat_segment_id(st->rpc, SEG_NAME);
}

static void store_stop(store_t *st)
{
    kvs__rpc_close(st->rpc);
    server_stop(&st->owner);
    server_stop(&st->master);
    unlink(st->shm_sock);
    CHECK_EQ_INT(rmdir(st->shm_dir), 0);
    unsetenv("KVS_SHM_DIR");
    unlink(st->token);
    kvs__tls_destroy(st->tls_ctx);
}

/* A client of the public API with the token (and TLS when the store has it). One data
 * connection per owner, so that one put before a flood opens every connection it will use. */
static kvs_client_t *store_client(const store_t *st, const char *protocol)
{
    setenv("KVS_TCP_CONNECTIONS", "1", 1);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = st->addr;
    cfg.protocol = protocol;
    cfg.auth_token_file = st->token;
    cfg.tls = st->tls;
    cfg.rpc_timeout_ms = 5000 * SLOW;
    cfg.transfer_timeout_ms = 5000 * SLOW;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    return c;
}

/* Another authenticated client of the master (its own client id), through the internal RPC
 * API: what a peer with the token can send. */
static kvs__rpc_t *store_rpc(const store_t *st)
{
    kvs__rpc_config_t rc = {.host = "127.0.0.1",
                            .port = st->master.port,
                            .timeout_ms = 5000 * SLOW,
                            .max_conns = 1,
                            .auth = st->auth,
                            .tls = st->tls};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&rc, &rpc), KVS_OK);
    return rpc;
}

static void put_pattern(kvs_client_t *c, const char *key, size_t n, unsigned seed)
{
    uint8_t *p = malloc(n);
    CHECK(p != NULL);
    fill(p, n, seed);
    CHECK_STATUS(kvs_client_put(c, key, p, n, NULL), KVS_OK);
    free(p);
}

/* The object under `key` is exactly `n` bytes of pattern `seed`. */
static void check_pattern(kvs_client_t *c, const char *key, size_t n, unsigned seed)
{
    void *got = NULL;
    size_t len = 0;
    CHECK_STATUS(kvs_client_get(c, key, &got, &len), KVS_OK);
    CHECK_EQ_U64(len, n);
    uint8_t *want = malloc(n);
    CHECK(want != NULL);
    fill(want, n, seed);
    CHECK_EQ_MEM(got, want, n);
    free(want);
    kvs_free(got);
}

/* A legitimate client's put and get of a fresh object, byte for byte, then its removal. */
static void legit_roundtrip(kvs_client_t *c, const char *tag)
{
    static unsigned seq;
    char key[64];
    unsigned s = ++seq;
    snprintf(key, sizeof(key), "legit-%s-%u", tag, s);
    size_t n = 200000 + s * 7;
    put_pattern(c, key, n, s);
    check_pattern(c, key, n, s);
    CHECK_STATUS(kvs_client_remove(c, key, true), KVS_OK);
}

/* ---- raw peers -------------------------------------------------------------------------- */

/* A connection that speaks frames by hand (inside TLS when the store has it: TLS keyed by the
 * token, so that what is tested is the server's own check of HELLO and AUTH). */
typedef struct {
    kvs__io_t io;
    kvs__wbuf_t *rec; /* every byte sent is appended here when not NULL (to replay it) */
} peer_t;

static void peer_open(peer_t *p, const store_t *st, uint16_t port)
{
    int fd = kvs__tcp_connect("127.0.0.1", port, deadline_ms(3000));
    CHECK(fd >= 0);
    p->io = (kvs__io_t){fd, NULL};
    p->rec = NULL;
    if (st->tls)
        CHECK_STATUS(kvs__tls_handshake(st->tls_ctx, fd, deadline_ms(3000), &p->io), KVS_OK);
}

static void peer_close(peer_t *p)
{
    kvs__io_free(&p->io);
    close(p->io.fd);
}

/* Sends bytes; a server that closed first may refuse them (what it answered is still read). */
static int peer_try_send(peer_t *p, const void *b, size_t n)
{
    if (p->rec != NULL)
        kvs__wbuf_put_bytes(p->rec, b, n);
    return kvs__io_send_all(&p->io, b, n, deadline_ms(3000));
}

static void peer_send(peer_t *p, const kvs__wbuf_t *frame)
{
    CHECK_STATUS(peer_try_send(p, frame->data, frame->len), KVS_OK);
}

/* Receives one frame: its type, or 0 when the server closed the connection first. A server
 * that neither answers nor closes within 3 s fails the case. */
static unsigned peer_recv(peer_t *p, kvs__wbuf_t *rsp, uint32_t *req_id_p)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    uint64_t dl = deadline_ms(3000);
    int rc = kvs__io_recv_all(&p->io, hb, sizeof(hb), dl);
    if (rc == KVS_TIMED_OUT)
        kvs_test_fail(__FILE__, __LINE__, "the server neither answered nor closed in time");
    if (rc != KVS_OK)
        return 0;
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &h), KVS_OK);
    kvs__wbuf_reset(rsp);
    uint8_t *b = kvs__wbuf_grow(rsp, h.len);
    CHECK(b != NULL || h.len == 0);
    if (h.len > 0)
        CHECK_STATUS(kvs__io_recv_all(&p->io, b, h.len, dl), KVS_OK);
    rsp->version = h.version;
    if (req_id_p != NULL)
        *req_id_p = h.req_id;
    return h.type;
}

/* The server closes the connection within 3 s and sends nothing more before it does. */
static void expect_closed(peer_t *p)
{
    uint64_t dl = deadline_ms(3000);
    size_t more = 0;
    for (;;) {
        char b[4096];
        short want = POLLIN;
        ssize_t n = kvs__io_recv(&p->io, b, sizeof(b), &want);
        if (n > 0) {
            more += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            break;
        if (kvs__wait_fd(p->io.fd, want, dl) != KVS_OK)
            kvs_test_fail(__FILE__, __LINE__, "the server kept the connection open");
    }
    CHECK_EQ_U64(more, 0);
}

static int32_t error_status(const kvs__wbuf_t *rsp)
{
    kvs__error_rsp_t e;
    CHECK_STATUS(kvs__error_rsp_decode(rsp->data, rsp->len, rsp->version, NULL, &e), KVS_OK);
    return e.status;
}

/* ---- frames ----------------------------------------------------------------------------- */

/* A HELLO with client nonce `cn` (NULL: none, as from a peer that cannot authenticate). */
static void frame_hello(kvs__wbuf_t *w, const uint8_t *cn)
{
    kvs__frame_begin(w, KVS_MSG_HELLO, 1, KVS_PROTO_VERSION_MAX);
    kvs__hello_req_t h = {KVS_PROTO_VERSION_MIN,
                          KVS_PROTO_VERSION_MAX,
                          kvs__str_c("hostile"),
                          0,
                          {cn, cn != NULL ? KVS_AUTH_NONCE_LEN : 0},
                          {NULL, 0},
                          0};
    kvs__hello_req_encode(w, &h);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

static void frame_auth(kvs__wbuf_t *w, const uint8_t proof[KVS_AUTH_PROOF_LEN])
{
    kvs__frame_begin(w, KVS_MSG_AUTH, 2, KVS_PROTO_VERSION_MAX);
    kvs__auth_req_t a = {{proof, KVS_AUTH_PROOF_LEN}};
    kvs__auth_req_encode(w, &a);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

static void frame_mount(kvs__wbuf_t *w, const char *name, const char *endpoint)
{
    kvs__frame_begin(w, KVS_MSG_MOUNT, REQ_ID, KVS_PROTO_VERSION_MAX);
    uint8_t key[KVS_WRITE_KEY_LEN] = {0};
    kvs__mount_req_t m = {kvs__str_c(name), kvs__str_c("hostile"), kvs__str_c(endpoint),
                          1u << 20,         {key, sizeof(key)},    0};
    kvs__mount_req_encode(w, &m);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

static void frame_unmount(kvs__wbuf_t *w, uint64_t segment_id)
{
    kvs__frame_begin(w, KVS_MSG_UNMOUNT, REQ_ID, KVS_PROTO_VERSION_MAX);
    kvs__ids_req_t r = {segment_id};
    kvs__ids_req_encode(w, &r);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

/* PUT_END, PUT_REVOKE, REMOVE...: one key, naming the put `token` (0: no token sent). */
static void frame_keys(kvs__wbuf_t *w, uint16_t type, uint32_t flags, const char *key,
                       uint64_t token)
{
    kvs__frame_begin(w, type, REQ_ID, KVS_PROTO_VERSION_MAX);
    kvs__str_t k = kvs__str_c(key);
    kvs__put_token_t t = {token};
    kvs__keys_req_t r = {.flags = flags,
                         .nkeys = 1,
                         .keys = &k,
                         .ntokens = token ? 1 : 0,
                         .tokens = token ? &t : NULL};
    kvs__keys_req_encode(w, &r);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

static void frame_put_start(kvs__wbuf_t *w, const char *key, uint64_t size)
{
    kvs__frame_begin(w, KVS_MSG_PUT_START, REQ_ID, KVS_PROTO_VERSION_MAX);
    kvs__put_item_t it = {.key = kvs__str_c(key), .size = size};
    kvs__put_start_req_t r = {.node = kvs__str_c("hostile"),
                              .replica_num = 1,
                              .preferred_segment = kvs__str_c(SEG_NAME),
                              .nitems = 1,
                              .items = &it};
    kvs__put_start_req_encode(w, &r);
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

static void frame_empty(kvs__wbuf_t *w, uint16_t type)
{
    kvs__frame_begin(w, type, REQ_ID, KVS_PROTO_VERSION_MAX);
    if (type == KVS_MSG_LIST) {
        kvs__list_req_t r = {kvs__str_c(""), 0, 0};
        kvs__list_req_encode(w, &r);
    }
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

/* A DATA_READ, or a DATA_WRITE of r->length bytes of pattern `seed`. */
static void frame_data(kvs__wbuf_t *w, uint16_t type, const kvs__data_req_t *r, unsigned seed)
{
    kvs__frame_begin(w, type, REQ_ID, KVS_PROTO_VERSION_MAX);
    kvs__data_req_encode(w, r);
    if (type == KVS_MSG_DATA_WRITE) {
        uint8_t *b = kvs__wbuf_grow(w, r->length);
        CHECK(b != NULL);
        fill(b, r->length, seed);
    }
    CHECK_STATUS(kvs__frame_end(w), KVS_OK);
}

/* ---- handshakes by hand ----------------------------------------------------------------- */

/* Says HELLO with nonce `cn`; the server's nonce goes to `sn`. */
static void peer_hello(peer_t *p, const uint8_t cn[KVS_AUTH_NONCE_LEN],
                       uint8_t sn[KVS_AUTH_NONCE_LEN])
{
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    frame_hello(&w, cn);
    peer_send(p, &w);
    CHECK_EQ_INT(peer_recv(p, &rsp, NULL), KVS_MSG_HELLO | KVS_RSP_FLAG);
    kvs__hello_rsp_t hr;
    CHECK_STATUS(kvs__hello_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &hr), KVS_OK);
    CHECK_STATUS(hr.status, KVS_OK);
    CHECK_EQ_INT(hr.auth, KVS_HELLO_AUTH_HMAC);
    CHECK_EQ_U64(hr.client_id, 0); /* no identity before AUTH */
    CHECK_EQ_INT(hr.auth_nonce.len, KVS_AUTH_NONCE_LEN);
    memcpy(sn, hr.auth_nonce.ptr, KVS_AUTH_NONCE_LEN);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
}

/* HELLO and AUTH with the token: the connection is served from then on. The server's nonce
 * goes to sn_out (may be NULL). */
static void peer_login(peer_t *p, const store_t *st, kvs__auth_endpoint_t ep, uint8_t *sn_out)
{
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN], proof[KVS_AUTH_PROOF_LEN];
    kvs__auth_nonce(cn);
    peer_hello(p, cn, sn);
    kvs__auth_proof(&st->auth, ep, server_name(st, ep), KVS_AUTH_BY_CLIENT, cn, sn, proof);
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    frame_auth(&w, proof);
    peer_send(p, &w);
    CHECK_EQ_INT(peer_recv(p, &rsp, NULL), KVS_MSG_AUTH | KVS_RSP_FLAG);
    kvs__auth_rsp_t ar;
    CHECK_STATUS(kvs__auth_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &ar), KVS_OK);
    CHECK_STATUS(ar.status, KVS_OK);
    if (sn_out != NULL)
        memcpy(sn_out, sn, KVS_AUTH_NONCE_LEN);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
}

/* A data request on a logged-in connection; its data_status (the connection stays). A read's
 * bytes go to `out`. */
static int32_t peer_data(peer_t *p, uint16_t type, const kvs__data_req_t *r, unsigned seed,
                         void *out)
{
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    frame_data(&w, type, r, seed);
    peer_send(p, &w);
    CHECK_EQ_INT(peer_recv(p, &rsp, NULL), type | KVS_RSP_FLAG);
    kvs__data_status_t ds;
    CHECK(rsp.len >= KVS_DATA_STATUS_LEN);
    CHECK_STATUS(kvs__data_status_decode(rsp.data, KVS_DATA_STATUS_LEN, rsp.version, NULL, &ds),
                 KVS_OK);
    if (type == KVS_MSG_DATA_READ && ds.status == KVS_OK) {
        CHECK_EQ_U64(rsp.len, KVS_DATA_STATUS_LEN + r->length);
        memcpy(out, rsp.data + KVS_DATA_STATUS_LEN, r->length);
    }
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    return ds.status;
}

/* Reads [off, off + len) of the owner's segment over an authenticated data connection (reads
 * name no put: any range of a served segment may be read). */
static void segment_read(const store_t *st, uint64_t off, uint64_t len, void *out)
{
    peer_t p;
    peer_open(&p, st, st->owner.port);
    peer_login(&p, st, KVS_AUTH_DATA, NULL);
    kvs__data_req_t r = {st->seg_id, off, len, 0, 0, 0, 0, 0};
    CHECK_STATUS(peer_data(&p, KVS_MSG_DATA_READ, &r, 0, out), KVS_OK);
    peer_close(&p);
}

/* A replica of a put (or of an object): where it lies, and the put's token and capability. */
typedef struct {
    uint64_t segment_id, offset, size, token, cap, cap_epoch;
} alloc_t;

/* Writes pattern `seed` into a put's whole allocation, as its writer does. */
static int32_t alloc_write(const store_t *st, const alloc_t *a, unsigned seed)
{
    peer_t p;
    peer_open(&p, st, st->owner.port);
    peer_login(&p, st, KVS_AUTH_DATA, NULL);
    kvs__data_req_t r = {a->segment_id, a->offset, a->size, a->token,
                         a->offset,     a->size,   a->cap,  a->cap_epoch};
    int32_t rc = peer_data(&p, KVS_MSG_DATA_WRITE, &r, seed, NULL);
    peer_close(&p);
    return rc;
}

/* ---- the master through the internal RPC API -------------------------------------------- */

/* Sends the request frame `req` on `rpc`; the reply's payload goes to rsp. */
static void rpc_do(kvs__rpc_t *rpc, kvs__wbuf_t *req, kvs__wbuf_t *rsp)
{
    CHECK_STATUS(kvs__rpc_call(rpc, req, rsp), KVS_OK);
}

/* A one-key request: the key's result. */
static int32_t rpc_key(kvs__rpc_t *rpc, uint16_t type, uint32_t flags, const char *key,
                       uint64_t token)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    frame_keys(&req, type, flags, key, token);
    rpc_do(rpc, &req, &rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__status_list_rsp_t sr;
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
    CHECK_STATUS(sr.status, KVS_OK);
    CHECK_EQ_INT(sr.nresults, 1);
    int32_t r = sr.results[0];
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return r;
}

static int32_t rpc_unmount(kvs__rpc_t *rpc, uint64_t segment_id)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    frame_unmount(&req, segment_id);
    rpc_do(rpc, &req, &rsp);
    kvs__status_list_rsp_t sr;
    kvs__arena_t a;
    kvs__arena_init(&a);
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return sr.status;
}

static int32_t rpc_mount(kvs__rpc_t *rpc, const char *name, const char *endpoint, uint64_t *id_p)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    frame_mount(&req, name, endpoint);
    rpc_do(rpc, &req, &rsp);
    kvs__mount_rsp_t mr;
    CHECK_STATUS(kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &mr), KVS_OK);
    *id_p = mr.segment_id;
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return mr.status;
}

/* PUT_START (or LOOKUP) of one key: its status, and its first replica in *a. */
static int32_t rpc_place(kvs__rpc_t *rpc, uint16_t type, const char *key, uint64_t size, alloc_t *a)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    if (type == KVS_MSG_PUT_START)
        frame_put_start(&req, key, size);
    else
        frame_keys(&req, type, 0, key, 0);
    rpc_do(rpc, &req, &rsp);
    kvs__arena_t ar;
    kvs__arena_init(&ar);
    kvs__placement_rsp_t pr;
    CHECK_STATUS(kvs__placement_rsp_decode(rsp.data, rsp.len, rsp.version, &ar, &pr), KVS_OK);
    CHECK_STATUS(pr.status, KVS_OK);
    CHECK_EQ_INT(pr.nobjs, 1);
    int32_t st = pr.objs[0].status;
    if (st == KVS_OK) {
        CHECK(pr.objs[0].nreps >= 1);
        *a = (alloc_t){pr.objs[0].reps[0].segment_id,
                       pr.objs[0].reps[0].offset,
                       pr.objs[0].size,
                       pr.objs[0].token,
                       pr.objs[0].reps[0].cap,
                       pr.objs[0].cap_epoch};
    }
    kvs__arena_free(&ar);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return st;
}

/* ---- what the store holds ----------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The store as text: the master's counters that only changes move (lookups and leases are
 * reads, left out), each segment (id, name, bytes allocated), each key (size, state, replicas)
 * in order, and a hash of every byte of the owner's segment. Equal snapshots: nothing changed.
 * Caller frees. */
static char *snapshot(const store_t *st)
{
    size_t cap = 1u << 16, len = 0;
    char *out = malloc(cap);
    CHECK(out != NULL);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__rpc_begin(st->rpc, &req, KVS_MSG_STAT);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    rpc_do(st->rpc, &req, &rsp);
    kvs__stat_rsp_t sr;
    CHECK_STATUS(kvs__stat_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
    for (uint32_t i = 0; i < sr.ncounters; i++) {
        kvs__str_t n = sr.counters[i].name;
        if (kvs__str_eq(n, kvs__str_c("lookups")) || kvs__str_eq(n, kvs__str_c("lookup_hits")) ||
            kvs__str_eq(n, kvs__str_c("lease_releases")))
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%.*s=%llu\n", (int)n.len, n.ptr,
                                (unsigned long long)sr.counters[i].value);
    }
    for (uint32_t i = 0; i < sr.nsegs; i++)
        len += (size_t)snprintf(out + len, cap - len, "segment %llu %.*s used %llu\n",
                                (unsigned long long)sr.segs[i].id, (int)sr.segs[i].name.len,
                                sr.segs[i].name.ptr, (unsigned long long)sr.segs[i].used);
    kvs__rpc_begin(st->rpc, &req, KVS_MSG_LIST);
    kvs__list_req_t lr = {kvs__str_c(""), 0, 0};
    kvs__list_req_encode(&req, &lr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    rpc_do(st->rpc, &req, &rsp);
    kvs__list_rsp_t ls;
    CHECK_STATUS(kvs__list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &ls), KVS_OK);
    CHECK_EQ_INT(ls.truncated, 0);
    char **lines = calloc(ls.nentries + 1, sizeof(*lines));
    CHECK(lines != NULL);
    for (uint32_t i = 0; i < ls.nentries; i++) {
        const kvs__list_entry_t *e = &ls.entries[i];
        CHECK(asprintf(&lines[i], "key %.*s size %llu state %u replicas %u\n", (int)e->key.len,
                       e->key.ptr, (unsigned long long)e->size, e->state, e->nrep) > 0);
    }
    qsort(lines, ls.nentries, sizeof(*lines), cmp_str);
    for (uint32_t i = 0; i < ls.nentries; i++) {
        len += (size_t)snprintf(out + len, cap - len, "%s", lines[i]);
        free(lines[i]);
    }
    free(lines);
    uint8_t *seg = malloc(SEG_SIZE);
    CHECK(seg != NULL);
    segment_read(st, 0, SEG_SIZE, seg);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < SEG_SIZE; i++)
        h = (h ^ seg[i]) * 0x100000001b3ull;
    free(seg);
    len += (size_t)snprintf(out + len, cap - len, "segment bytes %016llx\n", (unsigned long long)h);
    CHECK(len < cap - 1);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return out;
}

/* Nothing changed since `before` (freed). */
static void unchanged_since(const store_t *st, char *before)
{
    char *after = snapshot(st);
    CHECK_EQ_STR(after, before);
    free(after);
    free(before);
}

/* ---- 1. peers without the token ----------------------------------------------------------- */

/* How an attacker without the token gets to its request on a fresh connection. */
typedef enum {
    ATTACK_NO_HELLO,    /* the request first */
    ATTACK_NO_NONCE,    /* a HELLO without a nonce (a peer that cannot authenticate) */
    ATTACK_NO_AUTH,     /* HELLO answered, then the request instead of AUTH */
    ATTACK_WRONG_PROOF, /* AUTH with another token's proof, the request right behind it */
    ATTACK_N
} attack_t;

static const char *const attack_names[ATTACK_N] = {"the request before HELLO",
                                                   "HELLO without a nonce", "no AUTH after HELLO",
                                                   "another token's proof"};

/* One attack on a fresh connection to `port`: the steps of `how`, with the request frame `req`
 * sent in the same write as the last of them. The server must answer with one ERROR (about
 * the connection or the refused frame) of PROTOCOL_ERROR before HELLO, AUTH_FAILED after, and
 * close the connection, serving nothing. */
static void attack(const store_t *st, uint16_t port, kvs__auth_endpoint_t ep, attack_t how,
                   const kvs__wbuf_t *req, const char *what)
{
    peer_t p;
    peer_open(&p, st, port);
    kvs__wbuf_t out, w, rsp;
    kvs__wbuf_init(&out);
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN], proof[KVS_AUTH_PROOF_LEN];
    kvs__auth_nonce(cn);
    if (how == ATTACK_NO_NONCE) {
        frame_hello(&w, NULL);
        kvs__wbuf_put_bytes(&out, w.data, w.len);
    } else if (how == ATTACK_NO_AUTH || how == ATTACK_WRONG_PROOF) {
        peer_hello(&p, cn, sn);
    }
    if (how == ATTACK_WRONG_PROOF) {
        kvs__auth_proof(&st->wrong, ep, server_name(st, ep), KVS_AUTH_BY_CLIENT, cn, sn, proof);
        frame_auth(&w, proof);
        kvs__wbuf_put_bytes(&out, w.data, w.len);
    }
    kvs__wbuf_put_bytes(&out, req->data, req->len);
    peer_try_send(&p, out.data, out.len);
    uint32_t rid = 0;
    unsigned type = peer_recv(&p, &rsp, &rid);
    if (type != (KVS_MSG_ERROR | KVS_RSP_FLAG))
        kvs_test_fail(__FILE__, __LINE__, "%s with %s: answered with frame type 0x%x, not ERROR",
                      what, attack_names[how], type);
    int32_t want = how == ATTACK_NO_HELLO ? KVS_PROTOCOL_ERROR : KVS_AUTH_FAILED;
    int32_t got = error_status(&rsp);
    if (got != want)
        kvs_test_fail(__FILE__, __LINE__, "%s with %s: %s, not %s", what, attack_names[how],
                      kvs_status_name(got), kvs_status_name(want));
    /* The answer names the frame it refuses (the HELLO, the AUTH or the request), or none (0:
     * the connection), never anything else. */
    uint32_t refused = how == ATTACK_NO_NONCE ? 1 : how == ATTACK_WRONG_PROOF ? 2 : REQ_ID;
    if (rid != 0 && rid != refused)
        kvs_test_fail(__FILE__, __LINE__, "%s with %s: the ERROR names request %u, not %u", what,
                      attack_names[how], rid, refused);
    expect_closed(&p);
    peer_close(&p);
    kvs__wbuf_free(&out);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
}

/* Every attack with every request in reqs[0..n) on `port`. */
static void attack_all(const store_t *st, uint16_t port, kvs__auth_endpoint_t ep,
                       const kvs__wbuf_t *reqs, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int how = 0; how < ATTACK_N; how++)
            attack(st, port, ep, (attack_t)how, &reqs[i], names[i]);
}

/* ---- the shm socket by hand --------------------------------------------------------------- */

static int shm_dial(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    CHECK(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    struct timeval tv = {.tv_sec = 3 * SLOW};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* The owner's greeting: its nonce (it has a secret). */
static void shm_greeting(int fd, uint8_t sn[KVS_AUTH_NONCE_LEN])
{
    uint8_t buf[KVS_SHM_HELLO_LEN];
    CHECK_EQ_INT(recv(fd, buf, sizeof(buf), MSG_WAITALL), (int)sizeof(buf));
    kvs__shm_hello_t h;
    CHECK_STATUS(kvs__shm_hello_decode(buf, sizeof(buf), KVS_PROTO_VERSION_MIN, NULL, &h), KVS_OK);
    CHECK_EQ_U64(h.magic, KVS_SHM_MAGIC);
    CHECK_EQ_INT(h.auth, KVS_HELLO_AUTH_HMAC);
    CHECK_EQ_INT(h.nonce.len, KVS_AUTH_NONCE_LEN);
    memcpy(sn, h.nonce.ptr, KVS_AUTH_NONCE_LEN);
}

static void shm_request(uint8_t req[KVS_SHM_REQ_LEN], uint64_t segment_id,
                        const uint8_t cn[KVS_AUTH_NONCE_LEN],
                        const uint8_t proof[KVS_AUTH_PROOF_LEN])
{
    kvs__wbuf_t w = kvs__wbuf_over(req, KVS_SHM_REQ_LEN, KVS_PROTO_VERSION_MIN);
    kvs__shm_req_t r = {
        KVS_SHM_MAGIC, segment_id, {cn, KVS_AUTH_NONCE_LEN}, {proof, KVS_AUTH_PROOF_LEN}};
    kvs__shm_req_encode(&w, &r);
    CHECK(!w.failed && w.len == KVS_SHM_REQ_LEN);
}

/* Sends `req` and reads the owner's answer: its status, and the descriptor it passed (-1:
 * none) in *memfd_p. Then the owner must close the connection. */
static int32_t shm_ask(int fd, const uint8_t req[KVS_SHM_REQ_LEN], int *memfd_p)
{
    CHECK_EQ_INT(send(fd, req, KVS_SHM_REQ_LEN, MSG_NOSIGNAL), (int)KVS_SHM_REQ_LEN);
    uint8_t rsp[KVS_SHM_RSP_LEN];
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec v = {rsp, sizeof(rsp)};
    struct msghdr mh = {
        .msg_iov = &v, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t got = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    *memfd_p = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); got > 0 && cm != NULL; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(memfd_p, CMSG_DATA(cm), sizeof(int));
    CHECK_EQ_INT(got, (int)sizeof(rsp));
    kvs__shm_rsp_t ans;
    CHECK_STATUS(kvs__shm_rsp_decode(rsp, sizeof(rsp), KVS_PROTO_VERSION_MIN, NULL, &ans), KVS_OK);
    char b;
    CHECK_EQ_INT(recv(fd, &b, 1, 0), 0); /* one handshake per connection */
    return ans.status;
}

/* A reader on the shm socket with `key` (NULL: an all-zero proof, as from a reader without a
 * token) asks for the owner's segment: refused, no descriptor passed. */
static void shm_attack(const store_t *st, const kvs__auth_t *key)
{
    int fd = shm_dial(st->shm_sock);
    CHECK(fd >= 0);
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN], proof[KVS_AUTH_PROOF_LEN] = {0};
    uint8_t req[KVS_SHM_REQ_LEN];
    shm_greeting(fd, sn);
    kvs__auth_nonce(cn);
    if (key != NULL)
        kvs__auth_proof(key, KVS_AUTH_SHM, server_name(st, KVS_AUTH_SHM), KVS_AUTH_BY_CLIENT, cn,
                        sn, proof);
    shm_request(req, st->seg_id, cn, proof);
    int memfd;
    CHECK_STATUS(shm_ask(fd, req, &memfd), KVS_AUTH_FAILED);
    CHECK_EQ_INT(memfd, -1);
    close(fd);
}

/* ---- 1. the cases ------------------------------------------------------------------------- */

/* A plain peer, or one with another token's TLS key, gets no frame out of a TLS server. */
static void tls_refuses(const store_t *st, uint16_t port)
{
    int fd = kvs__tcp_connect("127.0.0.1", port, deadline_ms(3000));
    CHECK(fd >= 0);
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    uint8_t cn[KVS_AUTH_NONCE_LEN];
    kvs__auth_nonce(cn);
    frame_hello(&w, cn);
    kvs__send_all(fd, w.data, w.len, deadline_ms(3000));
    kvs__wbuf_free(&w);
    uint8_t head[4] = {0}, b[4096];
    size_t got = 0;
    uint64_t dl = deadline_ms(3000);
    for (;;) {
        ssize_t n = recv(fd, b, sizeof(b), 0);
        if (n > 0) {
            memcpy(head + KVS_MIN(got, sizeof(head)), b,
                   KVS_MIN((size_t)n, sizeof(head) - KVS_MIN(got, sizeof(head))));
            got += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            break;
        if (kvs__wait_fd(fd, POLLIN, dl) != KVS_OK)
            kvs_test_fail(__FILE__, __LINE__, "a plain peer was kept");
    }
    CHECK(got < 4 || memcmp(head, "KVST", 4) != 0); /* a TLS alert at most, never a frame */
    close(fd);

    char why[256];
    kvs__tls_t *other = NULL;
    CHECK_STATUS(kvs__tls_create(&st->wrong, false, &other, why, sizeof(why)), KVS_OK);
    fd = kvs__tcp_connect("127.0.0.1", port, deadline_ms(3000));
    CHECK(fd >= 0);
    kvs__io_t io;
    CHECK(kvs__tls_handshake(other, fd, deadline_ms(3000), &io) != KVS_OK);
    close(fd);
    kvs__tls_destroy(other);
}

/* Objects and a put in progress for attackers to aim at. */
typedef struct {
    alloc_t victim;  /* where "victim-0" (65536 bytes, pattern 1) lies */
    alloc_t pending; /* a put another client has open, with pattern 3 written */
    kvs__rpc_t *writer;
} targets_t;

static void targets_make(const store_t *st, kvs_client_t *c, targets_t *t)
{
    put_pattern(c, "victim-0", 65536, 1);
    put_pattern(c, "victim-1", 3000, 2);
    t->writer = store_rpc(st);
    CHECK_STATUS(rpc_place(t->writer, KVS_MSG_LOOKUP, "victim-0", 0, &t->victim), KVS_OK);
    CHECK_STATUS(rpc_place(t->writer, KVS_MSG_PUT_START, "pending", 8192, &t->pending), KVS_OK);
    CHECK_STATUS(alloc_write(st, &t->pending, 3), KVS_OK);
}

/* Without the token (or with another one), on each endpoint: a MOUNT, PUT_START, REMOVE,
 * UNMOUNT, PUT_END, PUT_REVOKE, STAT or LIST at the master, a DATA_WRITE (with the token and
 * capability of an open put, as an on-path observer sees them without TLS, so that only
 * authentication stands in its way) or DATA_READ at the data port, sent before HELLO, after a
 * HELLO without a nonce, instead of AUTH, or behind a wrong proof, are refused and the
 * connection closed; the shm socket passes no descriptor to a reader without the right proof.
 * The store is exactly as before, and its objects read back byte for byte. */
static void unauthenticated_refused(bool tls)
{
    store_t st;
    store_start(&st, tls, NULL, NULL);
    kvs_client_t *c = store_client(&st, "tcp");
    targets_t t;
    targets_make(&st, c, &t);
    char *before = snapshot(&st);

    kvs__wbuf_t m[8];
    for (int i = 0; i < 8; i++)
        kvs__wbuf_init(&m[i]);
    frame_mount(&m[0], "rogue", "127.0.0.1:9");
    frame_put_start(&m[1], "rogue-key", 4096);
    frame_keys(&m[2], KVS_MSG_REMOVE, KVS_KEYS_FLAG_FORCE, "victim-0", 0);
    frame_unmount(&m[3], st.seg_id);
    frame_keys(&m[4], KVS_MSG_PUT_END, 0, "pending", t.pending.token);
    frame_keys(&m[5], KVS_MSG_PUT_REVOKE, 0, "pending", t.pending.token);
    frame_empty(&m[6], KVS_MSG_STAT);
    frame_empty(&m[7], KVS_MSG_LIST);
    const char *mnames[] = {"MOUNT",   "PUT_START",  "REMOVE", "UNMOUNT",
                            "PUT_END", "PUT_REVOKE", "STAT",   "LIST"};
    attack_all(&st, st.master.port, KVS_AUTH_MASTER, m, mnames, 8);

    kvs__wbuf_t d[3];
    for (int i = 0; i < 3; i++)
        kvs__wbuf_init(&d[i]);
    const alloc_t *a = &t.pending;
    kvs__data_req_t big = {a->segment_id, a->offset, a->size, a->token,
                           a->offset,     a->size,   a->cap,  a->cap_epoch};
    kvs__data_req_t small = {a->segment_id, a->offset + 64, 64,     a->token,
                             a->offset,     a->size,        a->cap, a->cap_epoch};
    kvs__data_req_t rd = {st.seg_id, t.victim.offset, 4096, 0, 0, 0, 0, 0};
    frame_data(&d[0], KVS_MSG_DATA_WRITE, &big, 99);
    frame_data(&d[1], KVS_MSG_DATA_WRITE, &small, 99);
    frame_data(&d[2], KVS_MSG_DATA_READ, &rd, 0);
    const char *dnames[] = {"DATA_WRITE of 8 KiB", "DATA_WRITE of 64 bytes", "DATA_READ"};
    attack_all(&st, st.owner.port, KVS_AUTH_DATA, d, dnames, 3);

    shm_attack(&st, NULL);
    shm_attack(&st, &st.wrong);
    /* The same socket passes the segment to a reader with the token: the refusals above were
     * the proof's. */
    int fd = shm_dial(st.shm_sock);
    CHECK(fd >= 0);
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN], proof[KVS_AUTH_PROOF_LEN];
    uint8_t req[KVS_SHM_REQ_LEN];
    shm_greeting(fd, sn);
    kvs__auth_nonce(cn);
    kvs__auth_proof(&st.auth, KVS_AUTH_SHM, server_name(&st, KVS_AUTH_SHM), KVS_AUTH_BY_CLIENT, cn,
                    sn, proof);
    shm_request(req, st.seg_id, cn, proof);
    int memfd;
    CHECK_STATUS(shm_ask(fd, req, &memfd), KVS_OK);
    CHECK(memfd >= 0);
    close(memfd);
    close(fd);
    if (tls) {
        tls_refuses(&st, st.master.port);
        tls_refuses(&st, st.owner.port);
    }

    unchanged_since(&st, before);
    check_pattern(c, "victim-0", 65536, 1);
    check_pattern(c, "victim-1", 3000, 2);
    for (int i = 0; i < 8; i++)
        kvs__wbuf_free(&m[i]);
    for (int i = 0; i < 3; i++)
        kvs__wbuf_free(&d[i]);
    kvs__rpc_close(t.writer);
    kvs_client_close(c);
    store_stop(&st);
}

static void test_unauthenticated_refused(void)
{
    unauthenticated_refused(false);
}

/* With --tls: the attacks again, inside TLS sessions keyed by the token (the servers' own
 * HELLO and AUTH checks stand behind TLS), and peers without TLS or with another token's key
 * get no frame at either tcp port. */
static void test_unauthenticated_refused_tls(void)
{
    unauthenticated_refused(true);
}

/* ---- 2. replayed sessions ------------------------------------------------------------------ */

/* Sends a recorded session's bytes on a new connection, all at once, as a blind replay: the
 * server answers HELLO with a new nonce, so the recorded AUTH is wrong: ERROR AUTH_FAILED, and
 * the connection is closed before the recorded request is read. */
static void replay(const store_t *st, uint16_t port, const kvs__wbuf_t *rec,
                   const uint8_t recorded_sn[KVS_AUTH_NONCE_LEN])
{
    peer_t p;
    peer_open(&p, st, port);
    peer_try_send(&p, rec->data, rec->len);
    kvs__wbuf_t rsp;
    kvs__wbuf_init(&rsp);
    CHECK_EQ_INT(peer_recv(&p, &rsp, NULL), KVS_MSG_HELLO | KVS_RSP_FLAG);
    kvs__hello_rsp_t hr;
    CHECK_STATUS(kvs__hello_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &hr), KVS_OK);
    CHECK_EQ_INT(hr.auth_nonce.len, KVS_AUTH_NONCE_LEN);
    CHECK(memcmp(hr.auth_nonce.ptr, recorded_sn, KVS_AUTH_NONCE_LEN) != 0);
    CHECK_EQ_INT(peer_recv(&p, &rsp, NULL), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(error_status(&rsp), KVS_AUTH_FAILED);
    expect_closed(&p);
    peer_close(&p);
    kvs__wbuf_free(&rsp);
}

/* Recorded sessions replayed on new connections change nothing, on each endpoint: a data
 * connection's write into a put's range (replayed after the writer rewrote the range and ended
 * the put, it would put the old bytes back over the committed object), a master session's
 * REMOVE (replayed after the key was stored again, it would remove it), and a shm handshake
 * (replayed, it would pass the segment's descriptor). */
static void test_replayed_sessions(void)
{
    store_t st;
    store_start(&st, false, NULL, NULL);
    kvs_client_t *c = store_client(&st, "tcp");
    kvs__rpc_t *writer = store_rpc(&st);
    kvs__wbuf_t rec, w, rsp;
    kvs__wbuf_init(&rec);
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);

    /* The data port: a session that writes pattern 10 into an open put, recorded. */
    alloc_t a;
    CHECK_STATUS(rpc_place(writer, KVS_MSG_PUT_START, "replayed", 16384, &a), KVS_OK);
    peer_t p;
    peer_open(&p, &st, st.owner.port);
    p.rec = &rec;
    uint8_t data_sn[KVS_AUTH_NONCE_LEN];
    peer_login(&p, &st, KVS_AUTH_DATA, data_sn);
    kvs__data_req_t r = {a.segment_id, a.offset, a.size, a.token,
                         a.offset,     a.size,   a.cap,  a.cap_epoch};
    CHECK_STATUS(peer_data(&p, KVS_MSG_DATA_WRITE, &r, 10, NULL), KVS_OK);
    peer_close(&p);
    /* The writer writes pattern 11 over it, and ends the put. */
    CHECK_STATUS(alloc_write(&st, &a, 11), KVS_OK);
    CHECK_STATUS(rpc_key(writer, KVS_MSG_PUT_END, 0, "replayed", a.token), KVS_OK);
    check_pattern(c, "replayed", 16384, 11);
    kvs__wbuf_t data_rec = rec;
    kvs__wbuf_init(&rec);

    /* The master: a session that removes a key, recorded; the key is stored again. */
    put_pattern(c, "removed", 5000, 12);
    peer_open(&p, &st, st.master.port);
    p.rec = &rec;
    uint8_t master_sn[KVS_AUTH_NONCE_LEN];
    peer_login(&p, &st, KVS_AUTH_MASTER, master_sn);
    frame_keys(&w, KVS_MSG_REMOVE, 0, "removed", 0);
    peer_send(&p, &w);
    CHECK_EQ_INT(peer_recv(&p, &rsp, NULL), KVS_MSG_REMOVE | KVS_RSP_FLAG);
    peer_close(&p);
    CHECK_EQ_INT(kvs_client_exists(c, "removed"), 0);
    put_pattern(c, "removed", 5000, 13);

    /* The shm socket: a reader's handshake, recorded (it got the segment). */
    int fd = shm_dial(st.shm_sock);
    CHECK(fd >= 0);
    uint8_t cn[KVS_AUTH_NONCE_LEN], sn[KVS_AUTH_NONCE_LEN], sn2[KVS_AUTH_NONCE_LEN];
    uint8_t proof[KVS_AUTH_PROOF_LEN], req[KVS_SHM_REQ_LEN];
    shm_greeting(fd, sn);
    kvs__auth_nonce(cn);
    kvs__auth_proof(&st.auth, KVS_AUTH_SHM, server_name(&st, KVS_AUTH_SHM), KVS_AUTH_BY_CLIENT, cn,
                    sn, proof);
    shm_request(req, st.seg_id, cn, proof);
    int memfd;
    CHECK_STATUS(shm_ask(fd, req, &memfd), KVS_OK);
    CHECK(memfd >= 0);
    close(memfd);
    close(fd);

    char *before = snapshot(&st);
    replay(&st, st.owner.port, &data_rec, data_sn);
    replay(&st, st.master.port, &rec, master_sn);
    fd = shm_dial(st.shm_sock);
    CHECK(fd >= 0);
    shm_greeting(fd, sn2);
    CHECK(memcmp(sn, sn2, sizeof(sn)) != 0);
    CHECK_STATUS(shm_ask(fd, req, &memfd), KVS_AUTH_FAILED);
    CHECK_EQ_INT(memfd, -1);
    close(fd);
    unchanged_since(&st, before);
    check_pattern(c, "replayed", 16384, 11);
    check_pattern(c, "removed", 5000, 13);

    kvs__wbuf_free(&data_rec);
    kvs__wbuf_free(&rec);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(writer);
    kvs_client_close(c);
    store_stop(&st);
}

/* ---- 3. one client against another --------------------------------------------------------- */

/* Client A (authenticated, its own identity) cannot unmount segments of others (client B's, the
 * owner process's) nor take their names; B's segment keeps serving B's puts. UNMOUNT works on
 * A's own segment on the same connection: the refusals are about who asks. */
static void test_unmount_only_own_segments(void)
{
    store_t st;
    store_start(&st, false, NULL, NULL);
    kvs_client_t *b = store_client(&st, "tcp");
    CHECK_STATUS(kvs_client_mount_segment(b, 4u << 20, "seg-B", NULL), KVS_OK);
    uint64_t id_b = rpc_stat_segment_id(st.rpc, "seg-B");
    kvs__rpc_t *a = store_rpc(&st);
    char *before = snapshot(&st);

    CHECK_STATUS(rpc_unmount(a, id_b), KVS_INVALID_PARAMS);
    CHECK_STATUS(rpc_unmount(a, st.seg_id), KVS_INVALID_PARAMS);
    uint64_t id;
    CHECK_STATUS(rpc_mount(a, "seg-B", "127.0.0.1:9", &id), KVS_SEGMENT_ALREADY_EXISTS);
    CHECK_STATUS(rpc_mount(a, SEG_NAME, "127.0.0.1:9", &id), KVS_SEGMENT_ALREADY_EXISTS);
    unchanged_since(&st, before);

    /* B's segment serves B: a put placed on it, read back by another client. */
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.preferred_segment = "seg-B";
    uint8_t buf[30000];
    fill(buf, sizeof(buf), 21);
    CHECK_STATUS(kvs_client_put(b, "on-B", buf, sizeof(buf), &rc), KVS_OK);
    alloc_t where;
    CHECK_STATUS(rpc_place(a, KVS_MSG_LOOKUP, "on-B", 0, &where), KVS_OK);
    CHECK_EQ_U64(where.segment_id, id_b);
    kvs_client_t *reader = store_client(&st, "tcp");
    check_pattern(reader, "on-B", sizeof(buf), 21);

    /* A's own segment: A unmounts it. */
    CHECK_STATUS(rpc_mount(a, "seg-A", "127.0.0.1:9", &id), KVS_OK);
    CHECK_STATUS(rpc_unmount(a, id), KVS_OK);
    CHECK_STATUS(rpc_unmount(a, id_b), KVS_INVALID_PARAMS);
    CHECK_EQ_U64(rpc_stat_segment_id(st.rpc, "seg-B"), id_b);

    kvs_client_close(reader);
    kvs__rpc_close(a);
    kvs_client_close(b);
    store_stop(&st);
}

/* What a client's put does in a thread of its own, while others act on it. */
typedef struct {
    kvs_client_t *c;
    int rc;
} put_job_t;

static void *put_thread(void *arg)
{
    put_job_t *j = arg;
    uint8_t *p = malloc(65536);
    fill(p, 65536, 31);
    j->rc = kvs_client_put(j->c, "b-api", p, 65536, NULL);
    free(p);
    return NULL;
}

/* The state LIST shows for `key` (UINT32_MAX: not listed). */
static uint32_t key_state(kvs__rpc_t *rpc, const char *key)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    frame_empty(&req, KVS_MSG_LIST);
    rpc_do(rpc, &req, &rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__list_rsp_t ls;
    CHECK_STATUS(kvs__list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &ls), KVS_OK);
    uint32_t state = UINT32_MAX;
    for (uint32_t i = 0; i < ls.nentries; i++)
        if (kvs__str_eq(ls.entries[i].key, kvs__str_c(key)))
            state = ls.entries[i].state;
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return state;
}

/* Client A cannot end or revoke client B's put, naming B's token or none: refused, B's put
 * still pending, and it completes with B's bytes. Once with B on the internal API (A knows B's
 * token), once with B on the public API in a thread, its write slowed by the owner's fault
 * knob, and A acting while it runs. */
static void test_puts_ended_only_by_writer(void)
{
    kvs_test_need_hooks();
    char delay[32]; /* each data request of the owner waits this long */
    snprintf(delay, sizeof(delay), "%u", 300000u * SLOW);
    setenv("KVS_DATA_INJECT_DELAY_US", delay, 1);
    store_t st;
    store_start(&st, false, NULL, NULL);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    kvs__rpc_t *a = store_rpc(&st), *b = store_rpc(&st);
    alloc_t put;
    CHECK_STATUS(rpc_place(b, KVS_MSG_PUT_START, "b-put", 65536, &put), KVS_OK);
    for (int i = 0; i < 2; i++) {
        uint16_t type = i == 0 ? KVS_MSG_PUT_END : KVS_MSG_PUT_REVOKE;
        CHECK_STATUS(rpc_key(a, type, 0, "b-put", put.token), KVS_INVALID_WRITE);
        CHECK_STATUS(rpc_key(a, type, 0, "b-put", 0), KVS_INVALID_WRITE);
    }
    CHECK_EQ_INT(key_state(st.rpc, "b-put"), 0); /* pending */
    CHECK_EQ_U64(rpc_stat_counter(st.rpc, "puts_ended"), 0);
    CHECK_EQ_U64(rpc_stat_counter(st.rpc, "puts_revoked"), 0);
    CHECK_STATUS(alloc_write(&st, &put, 30), KVS_OK);
    CHECK_STATUS(rpc_key(b, KVS_MSG_PUT_END, 0, "b-put", put.token), KVS_OK);
    kvs_client_t *reader = store_client(&st, "tcp");
    check_pattern(reader, "b-put", 65536, 30);

    put_job_t job = {store_client(&st, "tcp"), -1};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, put_thread, &job), 0);
    uint64_t dl = deadline_ms(3000);
    while (key_state(st.rpc, "b-api") != 0) {
        CHECK(kvs__now_ns() < dl);
        usleep(2000);
    }
    CHECK_STATUS(rpc_key(a, KVS_MSG_PUT_END, 0, "b-api", 0), KVS_INVALID_WRITE);
    CHECK_STATUS(rpc_key(a, KVS_MSG_PUT_REVOKE, 0, "b-api", 0), KVS_INVALID_WRITE);
    CHECK_STATUS(rpc_key(a, KVS_MSG_PUT_REVOKE, 0, "b-api", put.token), KVS_INVALID_WRITE);
    CHECK_EQ_INT(key_state(st.rpc, "b-api"), 0); /* still B's, still pending */
    CHECK_EQ_INT(pthread_join(t, NULL), 0);
    CHECK_STATUS(job.rc, KVS_OK);
    check_pattern(reader, "b-api", 65536, 31);
    CHECK_EQ_U64(rpc_stat_counter(st.rpc, "puts_revoked"), 0);

    kvs_client_close(job.c);
    kvs_client_close(reader);
    kvs__rpc_close(a);
    kvs__rpc_close(b);
    store_stop(&st);
}

/* Client A, with its own open put's token and capability, cannot write into B's committed
 * object (naming its own range or B's) nor past either end of its own range: INVALID_WRITE,
 * the connection kept, and every byte of the segment but A's own range as it was. A's write
 * inside its range succeeds on the same connection. */
static void test_writes_only_inside_own_allocation(void)
{
    store_t st;
    store_start(&st, false, NULL, NULL);
    kvs_client_t *b = store_client(&st, "tcp");
    put_pattern(b, "b-obj", 65536, 41);
    kvs__rpc_t *a = store_rpc(&st);
    alloc_t bo, ao;
    CHECK_STATUS(rpc_place(a, KVS_MSG_LOOKUP, "b-obj", 0, &bo), KVS_OK);
    CHECK_STATUS(rpc_place(a, KVS_MSG_PUT_START, "a-obj", 4096, &ao), KVS_OK);
    CHECK_EQ_U64(ao.segment_id, bo.segment_id);
    CHECK(ao.offset >= 16);
    uint8_t *seg0 = malloc(SEG_SIZE), *seg1 = malloc(SEG_SIZE);
    CHECK(seg0 != NULL && seg1 != NULL);
    segment_read(&st, 0, SEG_SIZE, seg0);

    peer_t p;
    peer_open(&p, &st, st.owner.port);
    peer_login(&p, &st, KVS_AUTH_DATA, NULL);
    uint64_t s = ao.segment_id, t = ao.token, c = ao.cap, e = ao.cap_epoch;
    const kvs__data_req_t bad[] = {
        {s, bo.offset, 4096, t, ao.offset, ao.size, c, e},              /* B's bytes, A's range */
        {s, bo.offset, 4096, t, bo.offset, bo.size, c, e},              /* B's range, A's cap */
        {s, ao.offset + ao.size - 16, 32, t, ao.offset, ao.size, c, e}, /* past A's end */
        {s, ao.offset - 16, 32, t, ao.offset, ao.size, c, e},           /* before A's start */
        {s, ao.offset, ao.size + 4096, t, ao.offset, ao.size, c, e},    /* longer than A's */
        {s, bo.offset, 4096, 0, 0, 0, 0, 0},                            /* no put at all */
    };
    for (size_t i = 0; i < KVS_ARRAY_SIZE(bad); i++)
        CHECK_STATUS(peer_data(&p, KVS_MSG_DATA_WRITE, &bad[i], 42, NULL), KVS_INVALID_WRITE);
    kvs__data_req_t good = {s, ao.offset, ao.size, t, ao.offset, ao.size, c, e};
    CHECK_STATUS(peer_data(&p, KVS_MSG_DATA_WRITE, &good, 43, NULL), KVS_OK);
    peer_close(&p);

    segment_read(&st, 0, SEG_SIZE, seg1);
    fill(seg0 + ao.offset, ao.size, 43);
    CHECK_EQ_MEM(seg1, seg0, SEG_SIZE);
    check_pattern(b, "b-obj", 65536, 41);
    CHECK_STATUS(rpc_key(a, KVS_MSG_PUT_REVOKE, 0, "a-obj", ao.token), KVS_OK);
    free(seg0);
    free(seg1);
    kvs__rpc_close(a);
    kvs_client_close(b);
    store_stop(&st);
}

/* ---- 4. floods, slow and half-open peers ----------------------------------------------------- */

/* What a server costs, as /proc shows it. */
typedef struct {
    uint64_t rss_kb;
    unsigned fds, tasks;
} cost_t;

static cost_t cost_of(pid_t pid)
{
    return (cost_t){proc_status_kb(pid, "VmRSS"), proc_count(pid, "fd"), proc_count(pid, "task")};
}

/* Sanitizers keep memory back by design: ASan its quarantine of freed blocks (256 MiB by
 * default), TSan the shadow of freed memory and the state of finished threads. Resident memory
 * says nothing about the servers' own there; LeakSanitizer does, exactly, at each server's exit
 * in ASan builds (server_stop wants status 0). Descriptors and threads are checked always. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_CHECKED false
#else
#define RSS_CHECKED true
#endif

/* Waits until the server is back to `base`: as many descriptors and threads, and at most
 * `slack_kb` more resident memory. */
static void back_to(pid_t pid, const cost_t *base, const cost_t *peak, uint64_t slack_kb,
                    const char *who)
{
    uint64_t t0 = kvs__now_ns(), dl = deadline_ms(10000);
    cost_t now;
    for (;;) {
        now = cost_of(pid);
        if (now.fds <= base->fds && now.tasks <= base->tasks &&
            (!RSS_CHECKED || now.rss_kb <= base->rss_kb + slack_kb))
            break;
        if (kvs__now_ns() >= dl)
            break;
        usleep(10000);
    }
    printf("  %s: fds %u -> %u -> %u, threads %u -> %u -> %u, VmRSS %llu -> %llu -> %llu kB "
           "(%llu ms to settle)\n",
           who, base->fds, peak->fds, now.fds, base->tasks, peak->tasks, now.tasks,
           (unsigned long long)base->rss_kb, (unsigned long long)peak->rss_kb,
           (unsigned long long)now.rss_kb,
           (unsigned long long)((kvs__now_ns() - t0) / KVS_NS_PER_MS));
    fflush(stdout);
    CHECK_CMP_U64(now.fds, <=, base->fds);
    CHECK_CMP_U64(now.tasks, <=, base->tasks);
    if (RSS_CHECKED)
        CHECK_CMP_U64(now.rss_kb, <=, base->rss_kb + slack_kb);
}

static void peak_update(cost_t *peak, pid_t pid)
{
    cost_t c = cost_of(pid);
    peak->rss_kb = KVS_MAX(peak->rss_kb, c.rss_kb);
    peak->fds = KVS_MAX(peak->fds, c.fds);
    peak->tasks = KVS_MAX(peak->tasks, c.tasks);
}

/* Raises the descriptor limit to the hard one; skips the case if that is below `need`. */
static void fd_limit_at_least(unsigned need)
{
    struct rlimit r;
    CHECK_EQ_INT(getrlimit(RLIMIT_NOFILE, &r), 0);
    if (r.rlim_max != RLIM_INFINITY && r.rlim_max < need) {
        static char why[128];
        snprintf(why, sizeof(why), "needs %u descriptors; the hard limit is %llu", need,
                 (unsigned long long)r.rlim_max);
        kvs_test_skip(why);
    }
    r.rlim_cur = r.rlim_max;
    CHECK_EQ_INT(setrlimit(RLIMIT_NOFILE, &r), 0);
}

/* A peer of a flood: a socket whose connect was started, and what the server did with it. */
typedef struct {
    int fd;
    uint64_t t0;      /* connect started */
    uint64_t closed;  /* when the server closed it (0: not yet) */
    uint8_t head[32]; /* the first bytes the server sent */
    size_t got;
    unsigned sent; /* bytes of its trickle sent so far */
    bool peek;     /* it stopped reading: only a close is noticed (POLLRDHUP) */
} atk_t;

static void atk_dial(atk_t *k, uint16_t port)
{
    memset(k, 0, sizeof(*k));
    k->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK(k->fd >= 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    k->t0 = kvs__now_ns();
    int rc = connect(k->fd, (struct sockaddr *)&sa, sizeof(sa));
    CHECK(rc == 0 || errno == EINPROGRESS);
}

/* Reads what the server sent to peers that are readable, and notes those it closed; returns
 * how many are open. Nothing is read from peers that stopped reading. */
static unsigned atk_poll(atk_t *k, unsigned n, int ms)
{
    struct pollfd *p = calloc(n, sizeof(*p));
    CHECK(p != NULL);
    unsigned open = 0;
    for (unsigned i = 0; i < n; i++) {
        p[i].fd = k[i].closed ? -1 : k[i].fd;
        p[i].events = k[i].peek ? POLLRDHUP : POLLIN | POLLRDHUP;
    }
    int r = poll(p, n, ms);
    CHECK(r >= 0 || errno == EINTR);
    for (unsigned i = 0; i < n; i++) {
        if (k[i].closed)
            continue;
        if (k[i].peek && (p[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            k[i].closed = kvs__now_ns();
        } else if (!k[i].peek && p[i].revents != 0) {
            uint8_t b[4096];
            ssize_t got = recv(k[i].fd, b, sizeof(b), MSG_DONTWAIT);
            if (got > 0 && k[i].got < sizeof(k[i].head)) {
                size_t take = KVS_MIN((size_t)got, sizeof(k[i].head) - k[i].got);
                memcpy(k[i].head + k[i].got, b, take);
                k[i].got += take;
            }
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                k[i].closed = kvs__now_ns();
        }
        open += !k[i].closed;
    }
    free(p);
    return open;
}

/* The status of the ERROR frame a peer received first (0: no frame). */
static int32_t atk_error(const atk_t *k)
{
    if (k->got < KVS_FRAME_HDR_LEN + 4)
        return 0;
    kvs__frame_hdr_t h;
    if (kvs__frame_hdr_decode(k->head, KVS_FRAME_HDR_LEN, KVS_FRAME_MAX_PAYLOAD, &h) != KVS_OK ||
        h.type != (KVS_MSG_ERROR | KVS_RSP_FLAG))
        return 0;
    return (int32_t)kvs__le_load(k->head + KVS_FRAME_HDR_LEN, 4);
}

static void atk_close_all(atk_t *k, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        close(k[i].fd);
}

/* A flood of `n` connections at `port` of server `pid`, whose limit is `cap` connections with
 * a short handshake time-out: a legitimate client connected before keeps putting and getting;
 * the server holds at most `cap` of them at once, refuses the rest at once (ERROR
 * NO_RESOURCE) and closes the ones it holds at the time-out (ERROR TIMED_OUT); none is
 * served; afterwards the server is back to where it was and serves a new client. */
static void flood(store_t *st, pid_t pid, uint16_t port, unsigned cap, const char *who)
{
    unsigned n = env_count("KVS_HOSTILE_CONNS", 2000);
    kvs_client_t *c = store_client(st, "tcp");
    legit_roundtrip(c, who); /* its connections are open from here on */
    usleep(50000);
    cost_t base = cost_of(pid), peak = base;
    atk_t *k = calloc(n, sizeof(*k));
    CHECK(k != NULL);
    uint64_t t0 = kvs__now_ns();
    for (unsigned i = 0; i < n; i++)
        atk_dial(&k[i], port);
    uint64_t dial_ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    legit_roundtrip(c, who);
    /* Until every peer is closed, or none has been for 2 s: a connect the listen queue had no
     * room for was answered with a SYN cookie, so the peer thinks itself connected while the
     * server knows nothing of it. Such peers then send a byte: the server accepts them now
     * (and closes them at the time-out) or the kernel resets them. Either way none stays. */
    unsigned open = n, rounds = 0, poked = 0;
    bool poking = false;
    uint64_t quiet = kvs__now_ns(), dl = deadline_ms(15000);
    while (open > 0 && kvs__now_ns() < dl) {
        unsigned was = open;
        open = atk_poll(k, n, 20);
        peak_update(&peak, pid);
        if (++rounds % 25 == 0)
            legit_roundtrip(c, who);
        if (open < was)
            quiet = kvs__now_ns();
        if (!poking && open > 0 && kvs__now_ns() - quiet > 2000 * SLOW * KVS_NS_PER_MS) {
            poking = true;
            for (unsigned i = 0; i < n; i++)
                if (!k[i].closed && send(k[i].fd, "K", 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
                    poked++;
        }
    }
    legit_roundtrip(c, who);
    unsigned no_resource = 0, timed_out = 0, other = 0, silent = 0;
    uint64_t last_ms = 0;
    for (unsigned i = 0; i < n; i++) {
        int32_t e = atk_error(&k[i]);
        no_resource += e == KVS_NO_RESOURCE;
        timed_out += e == KVS_TIMED_OUT;
        silent += e == 0;
        other += e != 0 && e != KVS_NO_RESOURCE && e != KVS_TIMED_OUT;
        if (k[i].closed)
            last_ms = KVS_MAX(last_ms, (k[i].closed - t0) / KVS_NS_PER_MS);
    }
    printf("  %s flood: %u connections dialled in %llu ms; %u refused (NO_RESOURCE), %u timed "
           "out, %u closed without a frame (%u unknown to the server, poked), %u still open; "
           "the last closed after %llu ms\n",
           who, n, (unsigned long long)dial_ms, no_resource, timed_out, silent, poked, open,
           (unsigned long long)last_ms);
    fflush(stdout);
    CHECK_EQ_INT(open, 0);
    CHECK_EQ_INT(other, 0);
    CHECK_CMP_U64(no_resource, >, 0); /* the cap was reached */
    CHECK_CMP_U64(timed_out, >, 0);
    CHECK_CMP_U64(peak.fds, <=, base.fds + cap + 8);
    CHECK_CMP_U64(peak.tasks, <=, base.tasks + cap + 8);
    atk_close_all(k, n);
    free(k);
    back_to(pid, &base, &peak, rss_slack_kb(cap, st->tls), who);
    kvs_client_t *fresh = store_client(st, "tcp");
    legit_roundtrip(fresh, who);
    kvs_client_close(fresh);
    legit_roundtrip(c, who);
    kvs_client_close(c);
}

/* The master (one event loop) against a flood of its RPC port. */
static void test_flood_master(void)
{
    fd_limit_at_least(env_count("KVS_HOSTILE_CONNS", 2000) + 200);
    unsigned cap = env_count("KVS_HOSTILE_MAX_CONNS", FLOOD_CAP);
    char caps[16];
    snprintf(caps, sizeof(caps), "%u", cap);
    const char *margs[] = {"--max-conns", caps, "--handshake-timeout-ms", FLOOD_HANDSHAKE_MS, NULL};
    store_t st;
    store_start(&st, false, margs, NULL);
    flood(&st, st.master.pid, st.master.port, cap, "master");
    store_stop(&st);
}

/* The owner (a thread per connection) against a flood of its data port. */
static void test_flood_data_port(void)
{
    fd_limit_at_least(env_count("KVS_HOSTILE_CONNS", 2000) + 200);
    unsigned cap = env_count("KVS_HOSTILE_MAX_CONNS", FLOOD_CAP);
    char caps[16];
    snprintf(caps, sizeof(caps), "%u", cap);
    const char *oargs[] = {"--data-max-conns", caps, "--data-handshake-timeout-ms",
                           FLOOD_HANDSHAKE_MS, NULL};
    store_t st;
    store_start(&st, false, NULL, oargs);
    flood(&st, st.owner.pid, st.owner.port, cap, "data port");
    store_stop(&st);
}

/* The bytes a slow peer trickles: a HELLO frame (plain), or a TLS record announcing a
 * ClientHello (--tls). */
static size_t trickle_bytes(bool tls, uint8_t *b, size_t cap)
{
    memset(b, 0x41, cap);
    if (tls) {
        const uint8_t rec[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03};
        memcpy(b, rec, sizeof(rec));
        return cap;
    }
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    uint8_t cn[KVS_AUTH_NONCE_LEN] = {1};
    frame_hello(&w, cn);
    CHECK(w.len <= cap);
    memcpy(b, w.data, w.len);
    size_t n = w.len;
    kvs__wbuf_free(&w);
    return n;
}

/* Peers that never finish a handshake, `n` at each of the master's and the owner's ports,
 * each of them: `trickle` sends a byte every 100 ms; else silent, or (odd ones) a HELLO and
 * then never reading. Every one is closed at the 300 ms handshake time-out however it
 * behaves; a legitimate client connected before and a new one put and get meanwhile; both
 * servers are back to where they were afterwards. */
static void slow_peers(bool tls, bool trickle)
{
    unsigned n = env_count("KVS_HOSTILE_PEERS", 200);
    fd_limit_at_least(2 * n + 200);
    const char *margs[] = {"--handshake-timeout-ms", "300", NULL};
    const char *oargs[] = {"--data-handshake-timeout-ms", "300", NULL};
    store_t st;
    store_start(&st, tls, margs, oargs);
    kvs_client_t *c = store_client(&st, "tcp");
    legit_roundtrip(c, "slow");
    usleep(50000);
    cost_t mbase = cost_of(st.master.pid), obase = cost_of(st.owner.pid);
    cost_t mpeak = mbase, opeak = obase;
    atk_t *k = calloc(2 * n, sizeof(*k));
    CHECK(k != NULL);
    uint8_t bytes[128];
    size_t nbytes = trickle_bytes(tls, bytes, sizeof(bytes));
    for (unsigned i = 0; i < 2 * n; i++) {
        atk_dial(&k[i], i < n ? st.master.port : st.owner.port);
        if (!trickle && i % 2 == 1) {
            /* A whole HELLO, then it never reads (the smallest receive buffer there is). */
            int one = 1;
            setsockopt(k[i].fd, SOL_SOCKET, SO_RCVBUF, &one, sizeof(one));
            CHECK_STATUS(kvs__wait_fd(k[i].fd, POLLOUT, deadline_ms(3000)), KVS_OK);
            CHECK_EQ_INT(send(k[i].fd, bytes, nbytes, MSG_NOSIGNAL), (int)nbytes);
            k[i].peek = true;
        }
    }
    uint64_t t0 = kvs__now_ns(), next = t0, dl = deadline_ms(10000);
    unsigned open = 2 * n, tick = 0;
    while (open > 0 && kvs__now_ns() < dl) {
        if (trickle && kvs__now_ns() >= next) {
            for (unsigned i = 0; i < 2 * n; i++) {
                if (k[i].closed || k[i].sent >= nbytes)
                    continue;
                if (send(k[i].fd, bytes + k[i].sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
                    k[i].sent++;
            }
            next += 100 * KVS_NS_PER_MS;
        }
        open = atk_poll(k, 2 * n, 10);
        peak_update(&mpeak, st.master.pid);
        peak_update(&opeak, st.owner.pid);
        if (tick++ == 10) { /* about 100 ms in: every peer is still being held */
            legit_roundtrip(c, "slow");
            kvs_client_t *fresh = store_client(&st, "tcp");
            legit_roundtrip(fresh, "slow");
            kvs_client_close(fresh);
        }
    }
    uint64_t first = UINT64_MAX, last = 0;
    unsigned bytes_max = 0;
    for (unsigned i = 0; i < 2 * n; i++) {
        if (!k[i].closed)
            continue;
        uint64_t ms = (k[i].closed - k[i].t0) / KVS_NS_PER_MS;
        first = KVS_MIN(first, ms);
        last = KVS_MAX(last, ms);
        bytes_max = KVS_MAX(bytes_max, k[i].sent);
    }
    printf("  %u %s peers (%s): closed after %llu..%llu ms (time-out 300 ms), %u bytes sent at "
           "most, %u still open\n",
           2 * n, trickle ? "trickling" : "silent or not reading", tls ? "TLS" : "plain",
           (unsigned long long)first, (unsigned long long)last, bytes_max, open);
    fflush(stdout);
    CHECK_EQ_INT(open, 0);
    CHECK_CMP_U64(first, >=, 250);
    CHECK_CMP_U64(last, <, 2000 * SLOW);
    if (trickle)
        CHECK_CMP_U64(bytes_max, <, 30); /* the trickle did not stretch the time-out */
    atk_close_all(k, 2 * n);
    free(k);
    back_to(st.master.pid, &mbase, &mpeak, rss_slack_kb(n, tls), "master");
    back_to(st.owner.pid, &obase, &opeak, rss_slack_kb(n, tls), "owner");
    legit_roundtrip(c, "slow");
    kvs_client_close(c);
    store_stop(&st);
}

static void test_slow_loris(void)
{
    slow_peers(false, true);
}

static void test_slow_loris_tls(void)
{
    slow_peers(true, true);
}

static void test_half_open(void)
{
    slow_peers(false, false);
}

/* ---- 5. another local user ---------------------------------------------------------------- */

/* What the second user is told about the store (no secret). */
typedef struct {
    uint16_t master_port, data_port;
    uint64_t segment_id, offset, size;
    char token[96], shm_sock[128];
} target_msg_t;

/* Runs as the second user: the client API cannot read the token file nor open the store
 * without it; raw requests of every kind are refused at both tcp ports; the shm socket cannot
 * even be reached. */
static void second_user_attacks(uid_t uid, gid_t gid, int msg_fd)
{
    CHECK_EQ_INT(setgroups(0, NULL), 0);
    CHECK_EQ_INT(setgid(gid), 0);
    CHECK_EQ_INT(setuid(uid), 0);
    CHECK_EQ_INT(getuid(), uid);
    CHECK(setuid(0) != 0); /* for good */
    target_msg_t m;
    CHECK_EQ_INT(read(msg_fd, &m, sizeof(m)), (int)sizeof(m));
    unsetenv("KVS_AUTH_TOKEN_FILE");

    CHECK(open(m.token, O_RDONLY) < 0);
    CHECK_EQ_INT(errno, EACCES);
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.master_port);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.protocol = "tcp";
    cfg.auth_token_file = m.token;
    kvs_client_t *c = NULL;
    CHECK(kvs_client_open(&cfg, &c) != KVS_OK);
    cfg.auth_token_file = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_AUTH_FAILED);
    CHECK(c == NULL);

    /* The attack helpers, with what this user has: ports, and a guessed key. */
    store_t st;
    memset(&st, 0, sizeof(st));
    st.master.port = m.master_port;
    st.owner.port = m.data_port;
    st.wrong.on = true;
    CHECK_EQ_INT(getrandom(st.wrong.key, sizeof(st.wrong.key), 0), (int)sizeof(st.wrong.key));
    kvs__wbuf_t r[6];
    for (int i = 0; i < 6; i++)
        kvs__wbuf_init(&r[i]);
    frame_keys(&r[0], KVS_MSG_REMOVE, KVS_KEYS_FLAG_FORCE, "secret", 0);
    frame_unmount(&r[1], m.segment_id);
    frame_put_start(&r[2], "planted", 4096);
    frame_mount(&r[3], "rogue", "127.0.0.1:9");
    const char *mnames[] = {"REMOVE", "UNMOUNT", "PUT_START", "MOUNT"};
    attack_all(&st, m.master_port, KVS_AUTH_MASTER, r, mnames, 4);
    kvs__data_req_t w = {m.segment_id, m.offset, 64, 1, m.offset, m.size, 1, 0};
    kvs__data_req_t rd = {m.segment_id, m.offset, 64, 0, 0, 0, 0, 0};
    frame_data(&r[4], KVS_MSG_DATA_WRITE, &w, 51);
    frame_data(&r[5], KVS_MSG_DATA_READ, &rd, 0);
    const char *dnames[] = {"DATA_WRITE", "DATA_READ"};
    attack_all(&st, m.data_port, KVS_AUTH_DATA, r + 4, dnames, 2);
    for (int i = 0; i < 6; i++)
        kvs__wbuf_free(&r[i]);

    CHECK_EQ_INT(shm_dial(m.shm_sock), -1);
    CHECK_EQ_INT(errno, EACCES);
}

/* Started as root with a token only root can read, the store is written to by root; a second
 * user (a fresh account, forked before the token was loaded) tries everything above; nothing
 * changed, as root then sees. */
static void second_user_case(const char *user)
{
    struct passwd *pw = getpwnam(user);
    CHECK(pw != NULL);
    uid_t uid = pw->pw_uid;
    gid_t gid = pw->pw_gid;
    store_t st;
    int pfd[2];
    CHECK_EQ_INT(pipe(pfd), 0);
    fflush(stdout);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        close(pfd[1]);
        second_user_attacks(uid, gid, pfd[0]);
        _exit(0);
    }
    close(pfd[0]);
    store_start(&st, false, NULL, NULL);
    kvs_client_t *c = store_client(&st, "auto");
    put_pattern(c, "secret", 65536, 50);
    alloc_t where;
    CHECK_STATUS(rpc_place(st.rpc, KVS_MSG_LOOKUP, "secret", 0, &where), KVS_OK);
    char *before = snapshot(&st);
    struct stat sb;
    CHECK_EQ_INT(stat(st.shm_dir, &sb), 0);
    CHECK_EQ_INT(sb.st_mode & 0777, 0700);
    CHECK_EQ_INT(stat(st.token, &sb), 0);
    CHECK_EQ_INT(sb.st_mode & 0777, 0600);

    target_msg_t m = {st.master.port, st.owner.port, st.seg_id, where.offset, where.size, "", ""};
    snprintf(m.token, sizeof(m.token), "%s", st.token);
    snprintf(m.shm_sock, sizeof(m.shm_sock), "%s", st.shm_sock);
    CHECK_EQ_INT(write(pfd[1], &m, sizeof(m)), (int)sizeof(m));
    close(pfd[1]);
    int status = 0;
    CHECK_EQ_INT(waitpid(child, &status, 0), child);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);

    unchanged_since(&st, before);
    check_pattern(c, "secret", 65536, 50);
    kvs_client_close(c);
    store_stop(&st);
}

static volatile sig_atomic_t guardian_alarm;

static void on_alarm(int sig)
{
    KVS_UNUSED(sig);
    guardian_alarm = 1;
}

/* useradd or userdel (`add`) of account `user`; returns its exit status. */
static int user_cmd(bool add, const char *user)
{
    char cmd[160];
    if (strlen(user) > 64) /* names made here are short; nothing longer is run */
        return -1;
    if (add)
        snprintf(cmd, sizeof(cmd), "useradd -M -N -s /usr/sbin/nologin %.64s >/dev/null 2>&1",
                 user);
    else
        snprintf(cmd, sizeof(cmd), "userdel -f -r %.64s >/dev/null 2>&1", user);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Accounts this test made in runs that died before removing them. */
static void remove_stale_users(void)
{
    char stale[16][40];
    int n = 0;
    setpwent();
    struct passwd *pw;
    while ((pw = getpwent()) != NULL && n < 16) {
        int pid;
        if (strlen(pw->pw_name) < sizeof(stale[0]) &&
            sscanf(pw->pw_name, "kvs-hostile-%d", &pid) == 1 && kill(pid, 0) != 0 && errno == ESRCH)
            snprintf(stale[n++], sizeof(stale[0]), "%s", pw->pw_name);
    }
    endpwent();
    for (int i = 0; i < n; i++)
        user_cmd(false, stale[i]);
}

/* The case runs in a child of its own process group; this process removes the account after
 * it whatever happened (a failed check, a crash, the harness's time limit), then reports. */
static void test_second_local_user(void)
{
    if (geteuid() != 0)
        kvs_test_skip("needs root, to create a second local user");
    if (system("command -v useradd >/dev/null 2>&1 && command -v userdel >/dev/null 2>&1") != 0)
        kvs_test_skip("needs useradd and userdel");
    remove_stale_users();
    char user[64];
    snprintf(user, sizeof(user), "kvs-hostile-%d", (int)getpid());
    if (user_cmd(true, user) != 0)
        kvs_test_skip("useradd failed (a read-only /etc/passwd?)");
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: waitpid returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    fflush(stdout);
    pid_t worker = fork();
    CHECK(worker >= 0);
    if (worker == 0) {
        setpgid(0, 0);
        second_user_case(user);
        fflush(stdout);
        _exit(0);
    }
    setpgid(worker, worker);
    int status = 0;
    while (waitpid(worker, &status, 0) < 0) {
        if (errno == EINTR && guardian_alarm)
            kill(-worker, SIGKILL);
    }
    kill(-worker, SIGKILL); /* its servers and the second user's process, if left */
    usleep(20000);
    user_cmd(false, user); /* 12 without a home or mail spool: neither was made */
    CHECK(getpwnam(user) == NULL);
    if (guardian_alarm)
        kvs_test_fail(__FILE__, __LINE__, "time limit (KVS_TEST_TIMEOUT_S)");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_unauthenticated_refused),
        KVS_TEST_CASE(test_unauthenticated_refused_tls),
        KVS_TEST_CASE(test_replayed_sessions),
        KVS_TEST_CASE(test_unmount_only_own_segments),
        KVS_TEST_CASE(test_puts_ended_only_by_writer),
        KVS_TEST_CASE(test_writes_only_inside_own_allocation),
        KVS_TEST_CASE(test_flood_master),
        KVS_TEST_CASE(test_flood_data_port),
        KVS_TEST_CASE(test_slow_loris),
        KVS_TEST_CASE(test_slow_loris_tls),
        KVS_TEST_CASE(test_half_open),
        KVS_TEST_CASE(test_second_local_user),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
