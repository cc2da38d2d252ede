/* Authentication and write capabilities: the token file's rules, HMAC proofs, the handshake
 * of each endpoint (master RPC, owner data port, shm socket) with the right, a wrong and no
 * token, replayed handshakes, writes outside their capability, and kvstash-server's refusal to
 * listen beyond loopback without a secret. */
#define _GNU_SOURCE
#include "client_fixture.h"
#include "kvs_test.h"
#include "rpc_helpers.h"
#include "server_fixture.h"

#include "master/master_server_int.h"
#include "owner/owner_int.h"
#include "proto/net_int.h"
#include "transport/shm/shm_int.h"
#include "transport/tcp/tcp_int.h"

#include <kvstash/kvstash.h>

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A token file with `text`, of mode `mode`; returns its path (static buffer per slot). */
static const char *token_file(int slot, const char *text, mode_t mode)
{
    static char paths[4][96];
    char *p = paths[slot];
    snprintf(p, sizeof(paths[0]), "/tmp/kvs-test-token-%d-%d", (int)getpid(), slot);
    unlink(p);
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0);
    CHECK_EQ_INT((int)write(fd, text, strlen(text)), (int)strlen(text));
    CHECK_EQ_INT(fchmod(fd, mode), 0);
    close(fd);
    return p;
}

static kvs__auth_t auth_of(const char *text)
{
    kvs__auth_t a;
    char why[256];
    CHECK_STATUS(kvs__auth_load(token_file(3, text, 0600), &a, why, sizeof(why)), KVS_OK);
    return a;
}

#define TOKEN_A "correct horse battery staple 0123456789"
#define TOKEN_B "another cluster's secret, also long enough"

static void test_hmac_known_answer(void)
{
    CHECK_STATUS(kvs__auth_selftest(), KVS_OK);
}

static void test_token_file_rules(void)
{
    kvs__auth_t a = {0}, b;
    char why[256];
    CHECK_STATUS(kvs__auth_load("/nonexistent/token", &a, why, sizeof(why)), KVS_INVALID_PARAMS);
    CHECK(strstr(why, "cannot open") != NULL);
    CHECK(!a.on);
    CHECK_STATUS(kvs__auth_load(token_file(0, TOKEN_A, 0644), &a, why, sizeof(why)),
                 KVS_INVALID_PARAMS);
    CHECK(strstr(why, "chmod 600") != NULL);
    CHECK_STATUS(kvs__auth_load(token_file(0, "short", 0600), &a, why, sizeof(why)),
                 KVS_INVALID_PARAMS);
    CHECK(strstr(why, "fewer than 16") != NULL);
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK_STATUS(kvs__auth_load(token_file(0, big, 0600), &a, why, sizeof(why)),
                 KVS_INVALID_PARAMS);
    CHECK(strstr(why, "longer than") != NULL);
    CHECK_STATUS(kvs__auth_load("/tmp", &a, why, sizeof(why)), KVS_INVALID_PARAMS);
    CHECK(!a.on);
    /* A FIFO is refused at once (opening one blocked until a writer came). */
    char fifo[96];
    snprintf(fifo, sizeof(fifo), "/tmp/kvs-test-fifo-%d", (int)getpid());
    unlink(fifo);
    CHECK_EQ_INT(mkfifo(fifo, 0600), 0);
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs__auth_load(fifo, &a, why, sizeof(why)), KVS_INVALID_PARAMS);
    CHECK(kvs__now_ns() - t0 < KVS_NS_PER_S);
    CHECK(strstr(why, "not a regular file") != NULL);
    unlink(fifo);
    /* A trailing newline is not part of the secret; a 0400 file is fine. */
    CHECK_STATUS(kvs__auth_load(token_file(0, TOKEN_A "\n", 0400), &a, why, sizeof(why)), KVS_OK);
    CHECK_STATUS(kvs__auth_load(token_file(1, TOKEN_A, 0600), &b, why, sizeof(why)), KVS_OK);
    CHECK(a.on && b.on);
    CHECK(memcmp(a.key, b.key, sizeof(a.key)) == 0);
    /* Unset and empty configure to none. */
    unsetenv("KVS_AUTH_TOKEN_FILE");
    CHECK_STATUS(kvs__auth_configure(NULL, &a, why, sizeof(why)), KVS_OK);
    CHECK(!a.on);
    setenv("KVS_AUTH_TOKEN_FILE", token_file(1, TOKEN_A, 0600), 1);
    CHECK_STATUS(kvs__auth_configure(NULL, &a, why, sizeof(why)), KVS_OK);
    CHECK(a.on && memcmp(a.key, b.key, sizeof(a.key)) == 0);
    unsetenv("KVS_AUTH_TOKEN_FILE");
}

static void test_proofs_bind_everything(void)
{
    kvs__auth_t a = auth_of(TOKEN_A), b = auth_of(TOKEN_B);
    uint8_t cn[32], sn[32], p[32], q[32];
    kvs__auth_nonce(cn);
    kvs__auth_nonce(sn);
    CHECK(memcmp(cn, sn, 32) != 0);
    kvs__auth_proof(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, p);
    CHECK(kvs__auth_check(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, p, 32));
    CHECK(!kvs__auth_check(&b, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, p, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_DATA, NULL, KVS_AUTH_BY_CLIENT, cn, sn, p, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_SERVER, cn, sn, p, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, sn, cn, p, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, p, 31));
    /* The server's name is part of the proof: a relay on another endpoint cannot reuse it. */
    kvs__auth_proof(&a, KVS_AUTH_DATA, "10.0.0.1:7000", KVS_AUTH_BY_SERVER, cn, sn, q);
    CHECK(kvs__auth_check(&a, KVS_AUTH_DATA, "10.0.0.1:7000", KVS_AUTH_BY_SERVER, cn, sn, q, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_DATA, "10.0.0.1:7001", KVS_AUTH_BY_SERVER, cn, sn, q, 32));
    CHECK(!kvs__auth_check(&a, KVS_AUTH_DATA, NULL, KVS_AUTH_BY_SERVER, cn, sn, q, 32));
    memcpy(q, p, 32);
    q[31] ^= 1;
    CHECK(!kvs__auth_check(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, q, 32));
    /* Capabilities name the segment, the range and the token. */
    uint8_t k[KVS_WRITE_KEY_LEN];
    kvs__write_key_new(k);
    uint64_t c = kvs__write_cap(k, 5, 4096, 100, 77, 9);
    CHECK(c != 0);
    CHECK_EQ_U64(kvs__write_cap(k, 5, 4096, 100, 77, 9), c);
    CHECK(kvs__write_cap(k, 6, 4096, 100, 77, 9) != c);
    CHECK(kvs__write_cap(k, 5, 0, 100, 77, 9) != c);
    CHECK(kvs__write_cap(k, 5, 4096, 4096, 77, 9) != c);
    CHECK(kvs__write_cap(k, 5, 4096, 100, 78, 9) != c);
    CHECK(kvs__write_cap(k, 5, 4096, 100, 77, 10) != c);
}

/* ---- master RPC ---------------------------------------------------------------------------- */

typedef struct {
    kvs__master_server_t *srv;
    uint16_t port;
} master_t;

static void master_start(master_t *m, const kvs__auth_t *auth)
{
    kvs__master_server_config_t cfg;
    CHECK_STATUS(kvs__master_server_config_init(&cfg), KVS_OK);
    cfg.port = 0;
    if (auth != NULL)
        cfg.auth = *auth;
    CHECK_STATUS(kvs__master_server_create(&cfg, &m->srv), KVS_OK);
    CHECK_STATUS(kvs__master_server_start(m->srv), KVS_OK);
    m->port = kvs__master_server_port(m->srv);
}

static int rpc_open_with(const master_t *m, const kvs__auth_t *auth, kvs__rpc_t **rpc_p)
{
    kvs__rpc_config_t rc = {.host = "127.0.0.1", .port = m->port, .timeout_ms = 2000};
    if (auth != NULL)
        rc.auth = *auth;
    return kvs__rpc_open(&rc, rpc_p);
}

static int raw_connect(uint16_t port)
{
    int fd = kvs__tcp_connect("127.0.0.1", port, kvs__now_ns() + 2 * KVS_NS_PER_S);
    CHECK(fd >= 0);
    return fd;
}

/* Sends one frame of `type` with payload `w` (may be NULL). */
static void raw_send(int fd, uint16_t type, const kvs__wbuf_t *w)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, type, 1,
                          w ? (uint32_t)w->len : 0};
    kvs__frame_hdr_encode(&h, hb);
    uint64_t d = kvs__now_ns() + 2 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__send_all(fd, hb, sizeof(hb), d), KVS_OK);
    if (w && w->len)
        CHECK_STATUS(kvs__send_all(fd, w->data, w->len, d), KVS_OK);
}

/* Receives one frame into `rsp`; returns its type (0 when the peer closed). */
static unsigned raw_recv(int fd, kvs__wbuf_t *rsp)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    uint64_t d = kvs__now_ns() + 2 * KVS_NS_PER_S;
    if (kvs__recv_all(fd, hb, sizeof(hb), d) != KVS_OK)
        return 0;
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), 1u << 20, &h), KVS_OK);
    kvs__wbuf_reset(rsp);
    uint8_t *p = kvs__wbuf_grow(rsp, h.len);
    CHECK(p != NULL || h.len == 0);
    if (h.len)
        CHECK_STATUS(kvs__recv_all(fd, p, h.len, d), KVS_OK);
    rsp->version = h.version;
    return h.type;
}

/* Whether the peer closed the connection (within 2 s). */
static bool closed_by_peer(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 2000) != 1)
        return false;
    char b;
    return recv(fd, &b, 1, 0) <= 0;
}

static int32_t error_status(const kvs__wbuf_t *rsp)
{
    kvs__error_rsp_t e;
    CHECK_STATUS(kvs__error_rsp_decode(rsp->data, rsp->len, rsp->version, NULL, &e), KVS_OK);
    return e.status;
}

/* A HELLO with client nonce `cn` on a raw socket; the reply's server nonce goes to `sn`. */
static void raw_hello(int fd, const uint8_t cn[32], uint64_t client_id, uint8_t sn[32],
                      kvs__hello_rsp_t *hr_p)
{
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    kvs__hello_req_t h = {KVS_PROTO_VERSION_MIN,
                          KVS_PROTO_VERSION_MAX,
                          kvs__str_c("raw"),
                          client_id,
                          {cn, 32},
                          {NULL, 0},
                          0};
    kvs__hello_req_encode(&w, &h);
    raw_send(fd, KVS_MSG_HELLO, &w);
    CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_HELLO | KVS_RSP_FLAG);
    kvs__hello_rsp_t hr;
    CHECK_STATUS(kvs__hello_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &hr), KVS_OK);
    CHECK_EQ_INT(hr.auth, KVS_HELLO_AUTH_HMAC);
    CHECK_EQ_U64(hr.client_id, 0); /* no identity before AUTH */
    CHECK_EQ_INT(hr.auth_nonce.len, 32);
    memcpy(sn, hr.auth_nonce.ptr, 32);
    hr.auth_nonce = hr.auth_proof = (kvs__blob_t){NULL, 0};
    if (hr_p)
        *hr_p = hr;
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
}

static unsigned raw_auth(int fd, const uint8_t proof[32], kvs__wbuf_t *rsp)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__auth_req_t a = {{proof, 32}};
    kvs__auth_req_encode(&w, &a);
    raw_send(fd, KVS_MSG_AUTH, &w);
    kvs__wbuf_free(&w);
    return raw_recv(fd, rsp);
}

static void test_master_handshake(void)
{
    kvs__auth_t a = auth_of(TOKEN_A), b = auth_of(TOKEN_B);
    master_t m;
    master_start(&m, &a);
    kvs__rpc_t *rpc = NULL;
    /* The right token: served. */
    CHECK_STATUS(rpc_open_with(&m, &a, &rpc), KVS_OK);
    CHECK(kvs__rpc_hello(rpc).client_id != 0);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 0);
    /* No token, a wrong one: refused at open. */
    kvs__rpc_t *bad = NULL;
    CHECK_STATUS(rpc_open_with(&m, NULL, &bad), KVS_AUTH_FAILED);
    CHECK(bad == NULL);
    CHECK_STATUS(rpc_open_with(&m, &b, &bad), KVS_AUTH_FAILED);
    /* A request after HELLO without AUTH: refused, closed, and nothing mounted. */
    uint8_t cn[32], sn[32], proof[32];
    kvs__auth_nonce(cn);
    int fd = raw_connect(m.port);
    raw_hello(fd, cn, 0, sn, NULL);
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    uint8_t key[KVS_WRITE_KEY_LEN] = {0};
    kvs__mount_req_t mr = {kvs__str_c("rogue"), kvs__str_c("n"),          kvs__str_c("127.0.0.1:1"),
                           1ull << 40,          {key, KVS_WRITE_KEY_LEN}, 0};
    kvs__mount_req_encode(&w, &mr);
    raw_send(fd, KVS_MSG_MOUNT, &w);
    CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(error_status(&rsp), KVS_AUTH_FAILED);
    CHECK(closed_by_peer(fd));
    close(fd);
    /* A wrong proof: refused and closed. */
    fd = raw_connect(m.port);
    raw_hello(fd, cn, 0, sn, NULL);
    kvs__auth_proof(&b, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, proof);
    CHECK_EQ_INT(raw_auth(fd, proof, &rsp), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(error_status(&rsp), KVS_AUTH_FAILED);
    CHECK(closed_by_peer(fd));
    close(fd);
    /* A right proof on a raw socket: then MOUNT is served. Recorded for the replay below. */
    fd = raw_connect(m.port);
    raw_hello(fd, cn, 0, sn, NULL);
    kvs__auth_proof(&a, KVS_AUTH_MASTER, NULL, KVS_AUTH_BY_CLIENT, cn, sn, proof);
    CHECK_EQ_INT(raw_auth(fd, proof, &rsp), KVS_MSG_AUTH | KVS_RSP_FLAG);
    kvs__auth_rsp_t ar;
    CHECK_STATUS(kvs__auth_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &ar), KVS_OK);
    CHECK_STATUS(ar.status, KVS_OK);
    CHECK(ar.client_id != 0);
    mr.size = 1u << 20;
    kvs__wbuf_reset(&w);
    kvs__mount_req_encode(&w, &mr);
    raw_send(fd, KVS_MSG_MOUNT, &w);
    CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_MOUNT | KVS_RSP_FLAG);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 1);
    /* The same HELLO and AUTH replayed on a new connection: the server's nonce is new, so the
     * recorded proof is wrong. */
    int fd2 = raw_connect(m.port);
    uint8_t sn2[32];
    raw_hello(fd2, cn, ar.client_id, sn2, NULL);
    CHECK(memcmp(sn, sn2, 32) != 0);
    CHECK_EQ_INT(raw_auth(fd2, proof, &rsp), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(error_status(&rsp), KVS_AUTH_FAILED);
    CHECK(closed_by_peer(fd2));
    close(fd2);
    close(fd);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(rpc);
    kvs__master_server_destroy(m.srv);
}

/* A client with a token trusts no server without one; a server without a token serves
 * clients without one, as before. */
static void test_client_refuses_unauthenticated_master(void)
{
    kvs__auth_t a = auth_of(TOKEN_A);
    master_t m;
    master_start(&m, NULL);
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(rpc_open_with(&m, &a, &rpc), KVS_AUTH_FAILED);
    CHECK_STATUS(rpc_open_with(&m, NULL, &rpc), KVS_OK);
    kvs__rpc_close(rpc);
    kvs__master_server_destroy(m.srv);
}

/* ---- data port and shm socket --------------------------------------------------------------- */

typedef struct {
    kvs__data_server_t *srv;
    kvs__segment_mem_t mem;
    char ep[64];
    char dir[64];
    uint8_t key[KVS_WRITE_KEY_LEN];
} owner_t;

#define SEG_ID 99u

static void owner_start(owner_t *o, const kvs__auth_t *auth)
{
    snprintf(o->dir, sizeof(o->dir), "/tmp/kvs-test-auth-shm-%d", (int)getpid());
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.shm_dir = o->dir;
    if (auth)
        cfg.auth = *auth;
    CHECK_STATUS(kvs__segment_mem_create("auth-test", 1u << 20, &o->mem), KVS_OK);
    memset(o->mem.base, 0x5a, o->mem.size);
    kvs__write_key_new(o->key);
    CHECK_STATUS(kvs__data_server_create(&cfg, &o->srv), KVS_OK);
    CHECK_STATUS(
        kvs__data_server_add(o->srv, SEG_ID, o->mem.base, o->mem.size, o->mem.fd, o->key, 0),
        KVS_OK);
    snprintf(o->ep, sizeof(o->ep), "127.0.0.1:%u", (unsigned)kvs__data_server_port(o->srv));
}

static void owner_stop(owner_t *o)
{
    kvs__data_server_destroy(o->srv);
    kvs__segment_mem_destroy(&o->mem);
    rmdir(o->dir);
}

/* One transfer through a fresh tcp transport with `auth`. */
static int tcp_xfer_epoch(const owner_t *o, const kvs__auth_t *auth, kvs_xfer_op_t op, uint64_t off,
                          uint64_t len, void *buf, uint64_t token, uint64_t cap, uint64_t epoch)
{
    kvs__tcp_config_t cfg;
    CHECK_STATUS(kvs__tcp_config_init(&cfg), KVS_OK);
    cfg.io_timeout_ms = 2000;
    if (auth)
        cfg.auth = *auth;
    kvs_transport_t *t;
    CHECK_STATUS(kvs__tcp_transport_create(&cfg, &t), KVS_OK);
    kvs_endpoint_t *ep;
    uint64_t d = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(t->ops->ep_open(t, o->ep, d, &ep), KVS_OK);
    struct iovec v = {buf, len};
    kvs_xfer_req_t r = {op, ep, SEG_ID, off, len, &v, 1, 0, 0, token, cap, epoch, 0, 0};
    kvs_batch_t *b;
    int rc = t->ops->submit(t, &r, 1, d, &b);
    if (rc == KVS_OK)
        rc = t->ops->wait(t, b, d);
    t->ops->ep_close(t, ep);
    t->ops->destroy(t);
    return rc == KVS_OK ? r.status : rc;
}

static int tcp_xfer(const owner_t *o, const kvs__auth_t *auth, kvs_xfer_op_t op, uint64_t off,
                    uint64_t len, void *buf, uint64_t token, uint64_t cap)
{
    return tcp_xfer_epoch(o, auth, op, off, len, buf, token, cap, 0);
}

static void test_data_port_handshake(void)
{
    kvs__auth_t a = auth_of(TOKEN_A), b = auth_of(TOKEN_B);
    owner_t o;
    owner_start(&o, &a);
    char buf[256];
    memset(buf, 0, sizeof(buf));
    CHECK_STATUS(tcp_xfer(&o, &a, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0), KVS_OK);
    CHECK_EQ_INT((unsigned char)buf[7], 0x5a);
    memset(buf, 0, sizeof(buf));
    CHECK(tcp_xfer(&o, NULL, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0) != KVS_OK);
    CHECK(tcp_xfer(&o, &b, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0) != KVS_OK);
    CHECK_EQ_INT(buf[7], 0); /* nothing was read */
    /* A raw DATA_READ right after HELLO, without AUTH: refused and closed. */
    int fd = raw_connect(kvs__data_server_port(o.srv));
    uint8_t cn[32], sn[32];
    kvs__auth_nonce(cn);
    raw_hello(fd, cn, 0, sn, NULL);
    uint8_t dr[KVS_DATA_REQ_LEN];
    kvs__wbuf_t w = kvs__wbuf_over(dr, sizeof(dr), KVS_PROTO_VERSION_MAX);
    kvs__data_req_t d = {SEG_ID, 0, 64, 0, 0, 0, 0, 0};
    kvs__data_req_encode(&w, &d);
    raw_send(fd, KVS_MSG_DATA_READ, &w);
    kvs__wbuf_t rsp;
    kvs__wbuf_init(&rsp);
    CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(error_status(&rsp), KVS_AUTH_FAILED);
    CHECK(closed_by_peer(fd));
    close(fd);
    kvs__wbuf_free(&rsp);
    owner_stop(&o);
    /* A client with a token refuses an owner without one. */
    owner_start(&o, NULL);
    CHECK(tcp_xfer(&o, &a, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0) != KVS_OK);
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0), KVS_OK);
    owner_stop(&o);
}

static int shm_map(const owner_t *o, const kvs__auth_t *auth)
{
    kvs__shm_config_t cfg;
    CHECK_STATUS(kvs__shm_config_init(&cfg), KVS_OK);
    cfg.dir = o->dir;
    if (auth)
        cfg.auth = *auth;
    kvs_transport_t *t;
    CHECK_STATUS(kvs__shm_transport_create(&cfg, &t), KVS_OK);
    kvs_endpoint_t *ep;
    uint64_t d = kvs__now_ns() + 3 * KVS_NS_PER_S;
    int rc = t->ops->ep_open(t, o->ep, d, &ep);
    if (rc == KVS_OK) {
        rc = kvs__shm_map_segment(t, ep, SEG_ID, d);
        t->ops->ep_close(t, ep);
    }
    t->ops->destroy(t);
    return rc;
}

static void test_shm_handshake(void)
{
    kvs__auth_t a = auth_of(TOKEN_A), b = auth_of(TOKEN_B);
    owner_t o;
    owner_start(&o, &a);
    CHECK_STATUS(shm_map(&o, &a), KVS_OK);
    CHECK_STATUS(shm_map(&o, NULL), KVS_AUTH_FAILED);
    CHECK_STATUS(shm_map(&o, &b), KVS_AUTH_FAILED);
    CHECK(kvs__data_server_refused(o.srv) >= 1);
    owner_stop(&o);
    owner_start(&o, NULL);
    CHECK_STATUS(shm_map(&o, &a), KVS_AUTH_FAILED); /* an owner without a token is not trusted */
    CHECK_STATUS(shm_map(&o, NULL), KVS_OK);
    owner_stop(&o);
}

static void test_write_capabilities(void)
{
    owner_t o;
    owner_start(&o, NULL);
    char buf[4096];
    memset(buf, 0xc3, sizeof(buf));
    const uint64_t tok = 0x1234, off = 8192, size = 4096;
    uint64_t cap = kvs__write_cap(o.key, SEG_ID, off, size, tok, 0);
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok, cap), KVS_OK);
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[off + 5], 0xc3);
    /* Forged, zero, another token's, another range's: all refused, nothing written. */
    memset(buf, 0x11, sizeof(buf));
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok, cap ^ 1),
                 KVS_INVALID_WRITE);
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok, 0), KVS_INVALID_WRITE);
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok + 1, cap),
                 KVS_INVALID_WRITE);
    CHECK_STATUS(tcp_xfer(&o, NULL, KVS_XFER_WRITE, 0, size, buf, tok, cap), KVS_INVALID_WRITE);
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[off + 5], 0xc3);
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[5], 0x5a);
    /* Outside the named range, with the range's own capability (raw: the transport always
     * names the request's own range). */
    int fd = raw_connect(kvs__data_server_port(o.srv));
    uint8_t cn[32];
    kvs__auth_nonce(cn);
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    kvs__hello_req_t h = {
        KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX, kvs__str_c("raw"), 0, {cn, 32}, {NULL, 0}, 0};
    kvs__hello_req_encode(&w, &h);
    raw_send(fd, KVS_MSG_HELLO, &w);
    CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_HELLO | KVS_RSP_FLAG);
    for (int i = 0; i < 3; i++) {
        /* i = 0: past the end; 1: before the start; 2: inside (accepted). */
        uint64_t woff = i == 0 ? off + size - 16 : i == 1 ? off - 16 : off + 16;
        kvs__wbuf_reset(&w);
        kvs__data_req_t d = {SEG_ID, woff, 32, tok, off, size, cap, 0};
        kvs__data_req_encode(&w, &d);
        kvs__wbuf_put_bytes(&w, buf, 32);
        raw_send(fd, KVS_MSG_DATA_WRITE, &w);
        CHECK_EQ_INT(raw_recv(fd, &rsp), KVS_MSG_DATA_WRITE | KVS_RSP_FLAG);
        kvs__data_status_t ds;
        CHECK_STATUS(kvs__data_status_decode(rsp.data, rsp.len, rsp.version, NULL, &ds), KVS_OK);
        CHECK_STATUS(ds.status, i == 2 ? KVS_OK : KVS_INVALID_WRITE);
    }
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[off + size + 4], 0x5a);
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[off - 4], 0x5a);
    CHECK_EQ_INT((unsigned char)((char *)o.mem.base)[off + 20], 0x11);
    close(fd);
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    /* Epochs: a capability of the next epoch passes (the owner's view may lag); once the owner
     * is told epoch 5, those of epochs 0..3 are refused and 4..6 pass. A fence of epoch 4 holds
     * at epoch 5 and is forgotten at epoch 6, when epoch 4's capabilities are refused anyway. */
    uint64_t tok2 = 0x4242;
    for (uint64_t e = 0; e <= 7; e++) {
        uint64_t c = kvs__write_cap(o.key, SEG_ID, off, size, tok2, e);
        CHECK_STATUS(tcp_xfer_epoch(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok2, c, e),
                     e <= 1 ? KVS_OK : KVS_INVALID_WRITE);
    }
    CHECK_STATUS(kvs__data_server_epoch(o.srv, SEG_ID, 5), KVS_OK);
    for (uint64_t e = 0; e <= 7; e++) {
        uint64_t c = kvs__write_cap(o.key, SEG_ID, off, size, tok2, e);
        CHECK_STATUS(tcp_xfer_epoch(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok2, c, e),
                     e >= 4 && e <= 6 ? KVS_OK : KVS_INVALID_WRITE);
    }
    uint64_t c4 = kvs__write_cap(o.key, SEG_ID, off, size, tok2, 4);
    CHECK_STATUS(kvs__data_server_fence(o.srv, SEG_ID, &tok2, (const uint64_t[]){4}, 1), KVS_OK);
    CHECK_STATUS(tcp_xfer_epoch(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok2, c4, 4),
                 KVS_INVALID_WRITE);
    uint64_t c6 = kvs__write_cap(o.key, SEG_ID, off, size, tok2, 6);
    CHECK_STATUS(tcp_xfer_epoch(&o, NULL, KVS_XFER_WRITE, off, size, buf, tok2, c6, 6),
                 KVS_INVALID_WRITE); /* the token is fenced, whatever the epoch */
    owner_stop(&o);
}

/* ---- real servers ------------------------------------------------------------------------- */

/* Runs kvstash-server with `args` for at most 5 s; returns its exit status (-1: still running,
 * then killed) and its standard error in err. */
static int server_run(const char *const *args, char *err, size_t errlen)
{
    int pipefd[2];
    CHECK_EQ_INT(pipe(pipefd), 0);
    const char *argv[24] = {KVS_SERVER_PATH, "--port", "0"};
    int n = 3;
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t got = 0;
    int st = 0, rc = -1;
    uint64_t until = kvs__now_ns() + 5 * KVS_NS_PER_S;
    kvs__set_nonblock(pipefd[0], true);
    while (kvs__now_ns() < until) {
        ssize_t r = read(pipefd[0], err + got, errlen - 1 - got);
        if (r > 0)
            got += (size_t)r;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
            break;
        }
        if (strstr(err, "listening") != NULL && got > 0) {
            err[got] = '\0';
            if (strstr(err, "owner serving") != NULL || strstr(err, "master-only") != NULL)
                break;
        }
        usleep(10000);
    }
    ssize_t r;
    while ((r = read(pipefd[0], err + got, errlen - 1 - got)) > 0)
        got += (size_t)r;
    err[got] = '\0';
    if (rc == -1) {
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
    }
    close(pipefd[0]);
    return rc;
}

static void test_server_refuses_open_bind_without_token(void)
{
    char err[4096] = "";
    const char *open_bind[] = {"--bind", "0.0.0.0", "--segment-size", "1MiB", NULL};
    unsetenv("KVS_AUTH_TOKEN_FILE");
    CHECK_EQ_INT(server_run(open_bind, err, sizeof(err)), 2);
    CHECK(strstr(err, "without authentication") != NULL);
    const char *insecure[] = {
        "--bind", "0.0.0.0", "--segment-size", "1MiB", "--insecure-no-auth", "--data-port",
        "0",      NULL};
    memset(err, 0, sizeof(err));
    CHECK_EQ_INT(server_run(insecure, err, sizeof(err)), -1); /* runs */
    CHECK(strstr(err, "WARNING: --insecure-no-auth") != NULL);
    const char *bad_file[] = {"--auth-token-file", "/nonexistent/token", NULL};
    memset(err, 0, sizeof(err));
    CHECK_EQ_INT(server_run(bad_file, err, sizeof(err)), 2);
    CHECK(strstr(err, "cannot open the token file") != NULL);
    const char *both[] = {"--auth-token-file", token_file(2, TOKEN_A, 0600), "--insecure-no-auth",
                          NULL};
    memset(err, 0, sizeof(err));
    CHECK_EQ_INT(server_run(both, err, sizeof(err)), 2);
}

/* kvstash-server with a token: a client with it stores and reads back over tcp and shm; one
 * without, or with another, cannot even open. */
static void test_store_with_token(void)
{
    const char *path = token_file(2, TOKEN_A, 0600);
    const char *wrong = token_file(1, TOKEN_B, 0600);
    const char *args[] = {"--auth-token-file", path, "--segment-size", "8MiB", NULL};
    server_t s;
    server_start(&s, args);
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)s.port);
    const char *protos[] = {"tcp", "auto"};
    for (int i = 0; i < 2; i++) {
        kvs_client_config_t cfg;
        CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
        cfg.master = master;
        cfg.protocol = protos[i];
        cfg.auth_token_file = path;
        kvs_client_t *c = NULL;
        CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
        char key[16], in[5000];
        snprintf(key, sizeof(key), "k-%s", protos[i]);
        memset(in, 'a' + i, sizeof(in));
        CHECK_STATUS(kvs_client_put(c, key, in, sizeof(in), NULL), KVS_OK);
        void *out = NULL;
        size_t n = 0;
        CHECK_STATUS(kvs_client_get(c, key, &out, &n), KVS_OK);
        CHECK_EQ_U64(n, sizeof(in));
        CHECK(memcmp(in, out, sizeof(in)) == 0);
        kvs_free(out);
        kvs_client_close(c);
        cfg.auth_token_file = NULL;
        c = NULL;
        CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_AUTH_FAILED);
        CHECK(c == NULL);
        cfg.auth_token_file = wrong;
        CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_AUTH_FAILED);
    }
    /* The command line: with the token it lists and reads; without, it is refused. */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --master %s --auth-token-file %s ls >/dev/null 2>&1",
             KVS_CLI_PATH, master, path);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "KVS_AUTH_TOKEN_FILE=%s %s --master %s get k-tcp - >/dev/null 2>&1",
             path, KVS_CLI_PATH, master);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s --master %s ls >/dev/null 2>&1", KVS_CLI_PATH, master);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof(cmd), "%s --master %s --auth-token-file %s rm k-tcp >/dev/null 2>&1",
             KVS_CLI_PATH, master, wrong);
    CHECK(system(cmd) != 0);
    server_stop(&s);
}

/* --tls: a client with TLS and the token stores and reads back over tcp; a client without TLS
 * is refused by the TLS server, and a TLS client refuses a server without TLS. */
static int open_client(const char *master, const char *token, bool tls, kvs_client_t **c_p)
{
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.protocol = "tcp";
    cfg.auth_token_file = token;
    cfg.tls = tls;
    cfg.rpc_timeout_ms = 2000;
    *c_p = NULL;
    return kvs_client_open(&cfg, c_p);
}

static void test_tls_store(void)
{
    const char *path = token_file(2, TOKEN_A, 0600);
    const char *wrong = token_file(1, TOKEN_B, 0600);
    const char *args[] = {"--auth-token-file", path, "--tls", "--segment-size", "8MiB", NULL};
    server_t s;
    server_start(&s, args);
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)s.port);
    kvs_client_t *c;
    CHECK_STATUS(open_client(master, path, true, &c), KVS_OK);
    char in[300000];
    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = (char)(i * 7 + 1);
    CHECK_STATUS(kvs_client_put(c, "tls-key", in, sizeof(in), NULL), KVS_OK);
    void *out = NULL;
    size_t n = 0;
    CHECK_STATUS(kvs_client_get(c, "tls-key", &out, &n), KVS_OK);
    CHECK_EQ_U64(n, sizeof(in));
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    kvs_free(out);
    kvs_client_close(c);
    CHECK(open_client(master, path, false, &c) != KVS_OK); /* plain against TLS */
    CHECK(c == NULL);
    CHECK(open_client(master, wrong, true, &c) != KVS_OK);                 /* another token's key */
    CHECK_STATUS(open_client(master, NULL, true, &c), KVS_INVALID_PARAMS); /* TLS needs one */
    server_stop(&s);
    /* A server without TLS: the TLS client refuses it. */
    const char *plain[] = {"--auth-token-file", path, "--segment-size", "8MiB", NULL};
    server_start(&s, plain);
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)s.port);
    CHECK(open_client(master, path, true, &c) != KVS_OK);
    CHECK(c == NULL);
    server_stop(&s);
    /* --tls without a token: refused at start. */
    char err[2048] = "";
    const char *no_token[] = {"--tls", NULL};
    unsetenv("KVS_AUTH_TOKEN_FILE");
    CHECK_EQ_INT(server_run(no_token, err, sizeof(err)), 2);
    CHECK(strstr(err, "--tls needs") != NULL);
}

/* The TLS client trusts only the PSK: a TLS server with a certificate (anyone can make one) and
 * no token fails the handshake. Needs the openssl command line. */
static void test_tls_refuses_certificate_server(void)
{
    if (system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
               "-keyout /tmp/kvs-test-tls-key.pem -out /tmp/kvs-test-tls-cert.pem -days 1 "
               "-subj /CN=x >/dev/null 2>&1") != 0)
        kvs_test_skip("no openssl command line to make a certificate server");
    int lfd = kvs__tcp_listen("127.0.0.1", 0, 4);
    CHECK(lfd >= 0);
    uint16_t port = kvs__sock_port(lfd);
    close(lfd); /* s_server binds it next: a free port */
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "exec openssl s_server -quiet -tls1_3 -accept %u -cert /tmp/kvs-test-tls-cert.pem "
             "-key /tmp/kvs-test-tls-key.pem -naccept 1 </dev/null >/dev/null 2>&1",
             (unsigned)port);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int fd = -1;
    for (uint64_t until = kvs__now_ns() + 5 * KVS_NS_PER_S; fd < 0 && kvs__now_ns() < until;) {
        fd = kvs__tcp_connect("127.0.0.1", port, kvs__now_ns() + KVS_NS_PER_S);
        if (fd < 0)
            usleep(20000);
    }
    CHECK(fd >= 0);
    kvs__auth_t a = auth_of(TOKEN_A);
    kvs__tls_t *tls;
    char why[256];
    CHECK_STATUS(kvs__tls_create(&a, false, &tls, why, sizeof(why)), KVS_OK);
    kvs__io_t io = {-1, NULL};
    int rc = kvs__tls_handshake(tls, fd, kvs__now_ns() + 3 * KVS_NS_PER_S, &io);
    CHECK(rc != KVS_OK);
    close(fd);
    kvs__tls_destroy(tls);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    unlink("/tmp/kvs-test-tls-key.pem");
    unlink("/tmp/kvs-test-tls-cert.pem");
}

/* A relay without the token, listening on another endpoint, forwards a client's HELLO to a real
 * owner and the owner's reply back: the owner's proof names the owner's own endpoint, so the
 * client refuses it and never sends its AUTH (before, the relay got an authenticated session to
 * the owner and could answer the client's reads with its own bytes). */
typedef struct {
    int listen_fd;
    uint16_t upstream;
    bool saw_auth;
} relay_t;

static void *relay_thread(void *arg)
{
    relay_t *r = arg;
    int c = accept4(r->listen_fd, NULL, NULL, SOCK_NONBLOCK);
    int u = kvs__tcp_connect("127.0.0.1", r->upstream, kvs__now_ns() + 2 * KVS_NS_PER_S);
    uint8_t hb[KVS_FRAME_HDR_LEN], pb[4096];
    kvs__frame_hdr_t h;
    for (int i = 0; c >= 0 && u >= 0 && i < 3; i++) {
        int from = i == 1 ? u : c, to = i == 1 ? c : u;
        uint64_t d = kvs__now_ns() + 2 * KVS_NS_PER_S;
        if (kvs__recv_all(from, hb, sizeof(hb), d) != KVS_OK ||
            kvs__frame_hdr_decode(hb, sizeof(hb), sizeof(pb), &h) != KVS_OK ||
            kvs__recv_all(from, pb, h.len, d) != KVS_OK)
            break;
        if (h.type == KVS_MSG_AUTH)
            r->saw_auth = true;
        if (kvs__send_all(to, hb, sizeof(hb), d) != KVS_OK ||
            kvs__send_all(to, pb, h.len, d) != KVS_OK)
            break;
    }
    if (c >= 0)
        close(c);
    if (u >= 0)
        close(u);
    return NULL;
}

static void test_relay_refused(void)
{
    kvs__auth_t a = auth_of(TOKEN_A);
    owner_t o;
    owner_start(&o, &a);
    relay_t r = {kvs__tcp_listen("127.0.0.1", 0, 4), kvs__data_server_port(o.srv), false};
    CHECK(r.listen_fd >= 0);
    kvs__set_nonblock(r.listen_fd, false);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, relay_thread, &r), 0);
    owner_t via = o; /* the same owner, dialled at the relay's endpoint */
    snprintf(via.ep, sizeof(via.ep), "127.0.0.1:%u", (unsigned)kvs__sock_port(r.listen_fd));
    char buf[64];
    memset(buf, 0, sizeof(buf));
    CHECK(tcp_xfer(&via, &a, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0) != KVS_OK);
    pthread_join(th, NULL);
    CHECK(!r.saw_auth);
    CHECK_EQ_INT(buf[0], 0);
    close(r.listen_fd);
    /* Dialled at its own endpoint, the owner is trusted. */
    CHECK_STATUS(tcp_xfer(&o, &a, KVS_XFER_READ, 0, sizeof(buf), buf, 0, 0), KVS_OK);
    CHECK_EQ_INT((unsigned char)buf[0], 0x5a);
    owner_stop(&o);
}

/* A put's writes end with it: after PUT_END the owner fences its token (at its next heartbeat),
 * so its writer's capability no longer works there, neither over its own committed object nor
 * over another put's object in the same space later. */
static void test_writes_end_with_the_put(void)
{
    const char *args[] = {"--segment-size", "1MiB", NULL};
    server_t srv;
    server_start(&srv, args);
    kvs__rpc_config_t rc = {.host = "127.0.0.1", .port = srv.port, .timeout_ms = 2000};
    kvs__rpc_t *rpc;
    CHECK_STATUS(kvs__rpc_open(&rc, &rpc), KVS_OK);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__rpc_begin(rpc, &req, KVS_MSG_PUT_START);
    kvs__put_item_t it = {.key = kvs__str_c("a"), .size = 4096};
    kvs__put_start_req_t ps = {.node = kvs__str_c("n"),
                               .replica_num = 1,
                               .preferred_segment = kvs__str_c(""),
                               .nitems = 1,
                               .items = &it};
    kvs__put_start_req_encode(&req, &ps);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__placement_rsp_t pr;
    CHECK_STATUS(kvs__placement_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &pr), KVS_OK);
    CHECK_EQ_INT(pr.nobjs, 1);
    CHECK_STATUS(pr.objs[0].status, KVS_OK);
    kvs__obj_desc_t d = pr.objs[0];
    CHECK(d.reps[0].cap != 0);
    owner_t o = {0};
    snprintf(o.ep, sizeof(o.ep), "%.*s", (int)pr.segs[0].endpoint.len, pr.segs[0].endpoint.ptr);
    char buf[4096];
    memset(buf, 'a', sizeof(buf));
    uint64_t seg = d.reps[0].segment_id, off = d.reps[0].offset;
    /* (tcp_xfer_epoch writes to SEG_ID; this store's segment id is random) */
    kvs__tcp_config_t tc;
    CHECK_STATUS(kvs__tcp_config_init(&tc), KVS_OK);
    kvs_transport_t *t;
    CHECK_STATUS(kvs__tcp_transport_create(&tc, &t), KVS_OK);
    kvs_endpoint_t *ep;
    CHECK_STATUS(t->ops->ep_open(t, o.ep, kvs__now_ns() + 2 * KVS_NS_PER_S, &ep), KVS_OK);
    struct iovec v = {buf, sizeof(buf)};
    kvs_xfer_req_t w = {KVS_XFER_WRITE, ep,          seg, off, sizeof(buf), &v, 1, 0, 0, d.token,
                        d.reps[0].cap,  d.cap_epoch, 0,   0};
    int wrc = 0;
#define WRITE_ONCE()                                                                               \
    do {                                                                                           \
        kvs_batch_t *b;                                                                            \
        kvs_xfer_req_t r = w;                                                                      \
        wrc = t->ops->submit(t, &r, 1, kvs__now_ns() + 2 * KVS_NS_PER_S, &b);                      \
        if (wrc == KVS_OK)                                                                         \
            wrc = t->ops->wait(t, b, kvs__now_ns() + 2 * KVS_NS_PER_S);                            \
        if (wrc == KVS_OK || wrc == KVS_INVALID_WRITE)                                             \
            wrc = r.status;                                                                        \
    } while (0)
    WRITE_ONCE();
    CHECK_STATUS(wrc, KVS_OK);
    /* PUT_END. */
    kvs__wbuf_reset(&req);
    kvs__rpc_begin(rpc, &req, KVS_MSG_PUT_END);
    kvs__str_t k = kvs__str_c("a");
    kvs__put_token_t tok = {d.token};
    kvs__keys_req_t kr = {.nkeys = 1, .keys = &k, .ntokens = 1, .tokens = &tok};
    kvs__keys_req_encode(&req, &kr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__status_list_rsp_t sl;
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sl), KVS_OK);
    CHECK_STATUS(sl.results[0], KVS_OK);
    /* Within a heartbeat or two the same write is refused (the owner applies the end fence). */
    uint64_t t0 = kvs__now_ns(), until = t0 + 5 * KVS_NS_PER_S;
    do {
        WRITE_ONCE();
        if (wrc == KVS_OK)
            usleep(20000);
    } while (wrc == KVS_OK && kvs__now_ns() < until);
    CHECK_STATUS(wrc, KVS_INVALID_WRITE);
    printf("  writes refused %.0f ms after PUT_END\n", (double)(kvs__now_ns() - t0) / 1e6);
    /* From then on the committed object does not change. */
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)srv.port);
    kvs_client_t *c = client_open_protocol(master, "tcp");
    void *before = NULL, *after = NULL;
    size_t n = 0;
    CHECK_STATUS(kvs_client_get(c, "a", &before, &n), KVS_OK);
    CHECK_EQ_U64(n, 4096);
    memset(buf, 'Y', sizeof(buf));
    WRITE_ONCE();
    CHECK_STATUS(wrc, KVS_INVALID_WRITE);
#undef WRITE_ONCE
    CHECK_STATUS(kvs_client_get(c, "a", &after, &n), KVS_OK);
    CHECK(memcmp(before, after, 4096) == 0);
    CHECK(((char *)after)[0] != 'Y');
    kvs_free(before);
    kvs_free(after);
    kvs_client_close(c);
    t->ops->ep_close(t, ep);
    t->ops->destroy(t);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(rpc);
    server_stop(&srv);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_hmac_known_answer),
        KVS_TEST_CASE(test_token_file_rules),
        KVS_TEST_CASE(test_proofs_bind_everything),
        KVS_TEST_CASE(test_master_handshake),
        KVS_TEST_CASE(test_client_refuses_unauthenticated_master),
        KVS_TEST_CASE(test_data_port_handshake),
        KVS_TEST_CASE(test_shm_handshake),
        KVS_TEST_CASE(test_write_capabilities),
        KVS_TEST_CASE(test_server_refuses_open_bind_without_token),
        KVS_TEST_CASE(test_store_with_token),
        KVS_TEST_CASE(test_tls_store),
        KVS_TEST_CASE(test_writes_end_with_the_put),
        KVS_TEST_CASE(test_tls_refuses_certificate_server),
        KVS_TEST_CASE(test_relay_refused),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
