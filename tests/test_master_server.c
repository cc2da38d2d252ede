/* Integration: a real kvstash-server process on loopback, fed valid requests, garbage,
 * truncated, oversized and out-of-order frames. It must answer what it can, drop only the
 * offending connection, and keep serving everyone else. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "rpc_helpers.h"
#include "server_fixture.h"
#include "proto/net_int.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Every server here is a master only. */
static void master_start(server_t *s, const char *const *extra)
{
    const char *args[16] = {"--master-only"};
    int n = 1;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    server_start(s, args);
}

static kvs__rpc_t *client(server_t *s)
{
    kvs__rpc_config_t cfg = {
        .host = "127.0.0.1", .port = s->port, .node = "testnode", .timeout_ms = 3000};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_OK);
    CHECK(kvs__rpc_hello(rpc).client_id != 0);
    return rpc;
}

static void mount_and_put(kvs__rpc_t *rpc, const char *seg, const char *key)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__rpc_begin(rpc, &req, KVS_MSG_MOUNT);
    kvs__mount_req_t m = {
        kvs__str_c(seg), kvs__str_c("testnode"), kvs__str_c("127.0.0.1:1"), 1 << 20, {NULL, 0}, 0};
    kvs__mount_req_encode(&req, &m);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__mount_rsp_t mr;
    CHECK_STATUS(kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &mr), KVS_OK);
    CHECK_STATUS(mr.status, KVS_OK);

    kvs__put_item_t it = {.key = kvs__str_c(key), .size = 5000};
    kvs__put_start_req_t ps = {.node = kvs__str_c("testnode"),
                               .replica_num = 1,
                               .preferred_segment = kvs__str_c(""),
                               .nitems = 1,
                               .items = &it};
    kvs__rpc_begin(rpc, &req, KVS_MSG_PUT_START);
    kvs__put_start_req_encode(&req, &ps);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__placement_rsp_t pr;
    CHECK_STATUS(kvs__placement_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &pr), KVS_OK);
    CHECK_STATUS(pr.objs[0].status, KVS_OK);
    CHECK_EQ_U64(pr.segs[0].id, mr.segment_id);

    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t kr = {.nkeys = 1, .keys = &k};
    kvs__rpc_begin(rpc, &req, KVS_MSG_PUT_END);
    kvs__keys_req_encode(&req, &kr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__status_list_rsp_t sr;
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
    CHECK_STATUS(sr.results[0], KVS_OK);

    kvs__rpc_begin(rpc, &req, KVS_MSG_LOOKUP);
    kvs__keys_req_encode(&req, &kr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    CHECK_STATUS(kvs__placement_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &pr), KVS_OK);
    CHECK_STATUS(pr.objs[0].status, KVS_OK);
    CHECK_EQ_U64(pr.objs[0].size, 5000);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
}

/* One request of `type` with a single-key keys_req payload; returns the key's result. */
static int32_t keys_call_one(kvs__rpc_t *rpc, uint16_t type, const char *key)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t kr = {.nkeys = 1, .keys = &k};
    kvs__rpc_begin(rpc, &req, type);
    kvs__keys_req_encode(&req, &kr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__status_list_rsp_t sr;
    kvs__arena_t a;
    kvs__arena_init(&a);
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
    CHECK_EQ_INT(sr.nresults, 1);
    int32_t r = sr.results[0];
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return r;
}

/* Raw connection helpers for sending bad bytes. */
static int raw_connect(server_t *s)
{
    int fd = kvs__tcp_connect("127.0.0.1", s->port, kvs__now_ns() + 3 * KVS_NS_PER_S);
    CHECK(fd >= 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    CHECK_STATUS(kvs__send_all(fd, p, n, kvs__now_ns() + 3 * KVS_NS_PER_S), KVS_OK);
}

static void raw_frame(int fd, uint16_t type, const void *payload, uint32_t len)
{
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, type, 1, len};
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_encode(&h, hb);
    raw_send(fd, hb, sizeof(hb));
    if (len)
        raw_send(fd, payload, len);
}

/* Reads one response frame; returns its type and the status its payload starts with. */
static uint16_t raw_response(int fd, int32_t *status_p)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &h), KVS_OK);
    uint8_t *p = malloc(h.len + 1);
    CHECK_STATUS(kvs__recv_all(fd, p, h.len, dl), KVS_OK);
    CHECK(h.len >= 4);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, h.len);
    *status_p = kvs__rbuf_i32(&r);
    free(p);
    return h.type;
}

/* True when the server closed the connection (EOF before the deadline). */
static bool raw_closed(int fd)
{
    uint8_t b[256];
    for (;;) {
        int rc = kvs__recv_all(fd, b, 1, kvs__now_ns() + 3 * KVS_NS_PER_S);
        if (rc == KVS_IO_ERROR)
            return true;
        if (rc == KVS_TIMED_OUT)
            return false;
    }
}

/* Sends a HELLO; the reply must be of type `want` with status `want_status`. */
static void hello_expect(int fd, unsigned want, int want_status)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__hello_req_t h = {KVS_PROTO_VERSION_MIN,
                          KVS_PROTO_VERSION_MAX,
                          kvs__str_c("raw"),
                          0,
                          {NULL, 0},
                          {NULL, 0},
                          0};
    kvs__hello_req_encode(&w, &h);
    raw_frame(fd, KVS_MSG_HELLO, w.data, (uint32_t)w.len);
    int32_t st;
    CHECK_EQ_INT(raw_response(fd, &st), want | KVS_RSP_FLAG);
    CHECK_STATUS(st, want_status);
    kvs__wbuf_free(&w);
}

static void say_hello(int fd)
{
    hello_expect(fd, KVS_MSG_HELLO, KVS_OK);
}

/* Sends a HELLO that must be refused with an ERROR frame. */
static void say_hello_expect_error(int fd)
{
    hello_expect(fd, KVS_MSG_ERROR, KVS_PROTOCOL_ERROR);
}

static void test_serves_valid_requests(void)
{
    server_t s;
    master_start(&s, NULL);
    kvs__rpc_t *rpc = client(&s);
    mount_and_put(rpc, "seg1", "hello");
    CHECK_EQ_U64(rpc_stat_counter(rpc, "objects"), 1);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 1);
    kvs__rpc_close(rpc);
    server_stop(&s);
}

static void test_malformed_frames_drop_only_their_connection(void)
{
    server_t s;
    master_start(&s, NULL);
    kvs__rpc_t *good = client(&s);
    mount_and_put(good, "seg1", "before");

    /* Bad magic: an ERROR frame, then the connection closes. */
    int fd = raw_connect(&s);
    raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    int32_t st;
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_PROTOCOL_ERROR);
    CHECK(raw_closed(fd));
    close(fd);

    /* Each bad header: an older version, a newer one whose HELLO we cannot read, 1 GiB. */
    static const kvs__frame_hdr_t bad_headers[] = {
        {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MIN - 1, KVS_MSG_HELLO, 1, 0},
        {KVS_PROTO_MAGIC, 9, KVS_MSG_HELLO, 1, 0},
        {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, KVS_MSG_LOOKUP, 1, 1u << 30},
    };
    static const int bad_status[] = {KVS_INVALID_VERSION, KVS_INVALID_VERSION, KVS_PROTOCOL_ERROR};
    kvs__frame_hdr_t h;
    uint8_t hb[KVS_FRAME_HDR_LEN];
    for (size_t i = 0; i < KVS_ARRAY_SIZE(bad_headers); i++) {
        fd = raw_connect(&s);
        kvs__frame_hdr_encode(&bad_headers[i], hb);
        raw_send(fd, hb, sizeof(hb));
        CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
        CHECK_STATUS(st, bad_status[i]);
        CHECK(raw_closed(fd));
        close(fd);
    }

    /* Requests before HELLO. */
    fd = raw_connect(&s);
    raw_frame(fd, KVS_MSG_STAT, NULL, 0);
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(raw_closed(fd));
    close(fd);

    /* A response sent as a request. */
    fd = raw_connect(&s);
    say_hello(fd);
    raw_frame(fd, KVS_MSG_STAT | KVS_RSP_FLAG, "\0\0\0\0", 4);
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(raw_closed(fd));
    close(fd);

    /* Truncated: half a header, and a header with half its payload, then hang up. */
    fd = raw_connect(&s);
    raw_send(fd, hb, 7);
    close(fd);
    fd = raw_connect(&s);
    say_hello(fd);
    h = (kvs__frame_hdr_t){KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, KVS_MSG_LOOKUP, 1, 100};
    kvs__frame_hdr_encode(&h, hb);
    raw_send(fd, hb, sizeof(hb));
    raw_send(fd, "0123456789", 10);
    close(fd);

    /* A well-framed request with a malformed payload gets an error and keeps its connection. */
    fd = raw_connect(&s);
    say_hello(fd);
    uint8_t junk[12] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
    raw_frame(fd, KVS_MSG_LOOKUP, junk, sizeof(junk));
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_INVALID_PARAMS);
    raw_frame(fd, KVS_MSG_STAT, NULL, 0);
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_STAT | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
    close(fd);

    server_check_alive(&s);
    /* The well-behaved client never noticed. */
    mount_and_put(good, "seg2", "after");
    CHECK_EQ_U64(rpc_stat_counter(good, "objects"), 2);
    kvs__rpc_close(good);
    server_stop(&s);
}

/* Reads one response frame whole: its header and payload (caller frees). */
static uint8_t *raw_response_frame(int fd, kvs__frame_hdr_t *h)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, h), KVS_OK);
    uint8_t *p = malloc(h->len + 1);
    CHECK_STATUS(kvs__recv_all(fd, p, h->len, dl), KVS_OK);
    return p;
}

/* Version negotiation at HELLO and unknown message types, on the wire. */
static void test_versions_and_unknown_types(void)
{
    server_t s;
    master_start(&s, NULL);

    /* A newer peer: its HELLO is of a version above ours and carries a field we do not know.
     * The master skips it and answers in the highest version both speak. */
    int fd = raw_connect(&s);
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    w.version = KVS_PROTO_VERSION_MAX;
    kvs__hello_req_t hr = {KVS_PROTO_VERSION_MIN,
                           KVS_PROTO_VERSION_MAX + 3,
                           kvs__str_c("new"),
                           0,
                           {NULL, 0},
                           {NULL, 0},
                           0};
    kvs__hello_req_encode(&w, &hr);
    kvs__wbuf_put_u64(&w, 0x1234567890abcdefull); /* the newer field */
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX + 3, KVS_MSG_HELLO, 5,
                          (uint32_t)w.len};
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_encode(&h, hb);
    raw_send(fd, hb, sizeof(hb));
    raw_send(fd, w.data, w.len);
    kvs__frame_hdr_t rh;
    uint8_t *p = raw_response_frame(fd, &rh);
    CHECK_EQ_INT(rh.type, KVS_MSG_HELLO | KVS_RSP_FLAG);
    CHECK_EQ_INT(rh.version, KVS_PROTO_VERSION_MAX);
    kvs__hello_rsp_t hello;
    CHECK_STATUS(kvs__hello_rsp_decode(p, rh.len, rh.version, NULL, &hello), KVS_OK);
    CHECK_STATUS(hello.status, KVS_OK);
    CHECK_EQ_INT(hello.version, KVS_PROTO_VERSION_MAX);
    CHECK(hello.client_id != 0 && hello.incarnation != 0);
    free(p);

    /* A message type this master does not know: a clear error, and the connection stays. */
    raw_frame(fd, 0x77, "abcdefgh", 8);
    p = raw_response_frame(fd, &rh);
    CHECK_EQ_INT(rh.type, KVS_MSG_ERROR | KVS_RSP_FLAG);
    kvs__error_rsp_t e;
    CHECK_STATUS(kvs__error_rsp_decode(p, rh.len, rh.version, NULL, &e), KVS_OK);
    CHECK_STATUS(e.status, KVS_UNSUPPORTED);
    CHECK(memmem(e.message.ptr, e.message.len, "unknown message type 119", 24) != NULL);
    free(p);
    int32_t st;
    raw_frame(fd, KVS_MSG_STAT, NULL, 0);
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_STAT | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
    /* A second HELLO could rebind the connection's identity: refused, and closed. */
    say_hello_expect_error(fd);
    CHECK(raw_closed(fd));
    close(fd);

    /* Before HELLO even unknown types are refused and the connection closed: a peer that never
     * says HELLO cannot keep sending. */
    fd = raw_connect(&s);
    raw_frame(fd, 0x77, "abcdefgh", 8);
    CHECK_EQ_INT(raw_response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_PROTOCOL_ERROR);
    CHECK(raw_closed(fd));
    close(fd);

    /* No version in common: refused in words, and the connection closed. */
    fd = raw_connect(&s);
    kvs__wbuf_reset(&w);
    hr = (kvs__hello_req_t){KVS_PROTO_VERSION_MAX + 1,
                            KVS_PROTO_VERSION_MAX + 2,
                            kvs__str_c("future"),
                            0,
                            {NULL, 0},
                            {NULL, 0},
                            0};
    kvs__hello_req_encode(&w, &hr);
    h = (kvs__frame_hdr_t){KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX + 2, KVS_MSG_HELLO, 6,
                           (uint32_t)w.len};
    kvs__frame_hdr_encode(&h, hb);
    raw_send(fd, hb, sizeof(hb));
    raw_send(fd, w.data, w.len);
    p = raw_response_frame(fd, &rh);
    CHECK_EQ_INT(rh.type, KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(kvs__error_rsp_decode(p, rh.len, rh.version, NULL, &e), KVS_OK);
    CHECK_STATUS(e.status, KVS_INVALID_VERSION);
    CHECK(memmem(e.message.ptr, e.message.len, "no version in common", 20) != NULL);
    free(p);
    CHECK(raw_closed(fd));
    close(fd);
    kvs__wbuf_free(&w);
    server_check_alive(&s);
    server_stop(&s);
}

/* The master acts on the id a connection got at HELLO, never on ids in payloads: another
 * connection cannot end, revoke or unmount what this one started. */
static void test_identity_comes_from_the_connection(void)
{
    server_t s;
    master_start(&s, NULL);
    kvs__rpc_t *a = client(&s), *b = client(&s);
    CHECK(kvs__rpc_hello(a).client_id != kvs__rpc_hello(b).client_id);
    mount_and_put(a, "seg-a", "done");
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__put_item_t it = {.key = kvs__str_c("open"), .size = 100};
    kvs__put_start_req_t ps = {.node = kvs__str_c("testnode"),
                               .replica_num = 1,
                               .preferred_segment = kvs__str_c(""),
                               .nitems = 1,
                               .items = &it};
    kvs__rpc_begin(a, &req, KVS_MSG_PUT_START);
    kvs__put_start_req_encode(&req, &ps);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(a, &req, &rsp), KVS_OK);
    CHECK_STATUS(keys_call_one(b, KVS_MSG_PUT_END, "open"), KVS_INVALID_WRITE);
    CHECK_STATUS(keys_call_one(b, KVS_MSG_PUT_REVOKE, "open"), KVS_INVALID_WRITE);
    CHECK_STATUS(keys_call_one(b, KVS_MSG_EXISTS, "open"), 0); /* still pending */
    CHECK_STATUS(keys_call_one(a, KVS_MSG_PUT_END, "open"), KVS_OK);
    CHECK_STATUS(keys_call_one(b, KVS_MSG_EXISTS, "open"), 1);
    /* b cannot unmount a's segment, whatever id it names. */
    CHECK_EQ_U64(rpc_stat_counter(b, "segments"), 1);
    kvs__arena_t ar;
    kvs__arena_init(&ar);
    kvs__ids_req_t u = {rpc_stat_segment_id(b, "seg-a")};
    kvs__rpc_begin(b, &req, KVS_MSG_UNMOUNT);
    kvs__ids_req_encode(&req, &u);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(b, &req, &rsp), KVS_OK);
    kvs__status_list_rsp_t sr;
    CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &ar, &sr), KVS_OK);
    CHECK(sr.status != KVS_OK);
    CHECK_EQ_U64(rpc_stat_counter(b, "segments"), 1);
    kvs__arena_free(&ar);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(a);
    kvs__rpc_close(b);
    server_stop(&s);
}

static void test_random_frames_do_not_hurt(void)
{
    server_t s;
    master_start(&s, NULL);
    uint8_t payload[512];
    for (int round = 0; round < 200; round++) {
        int fd = raw_connect(&s);
        if (round % 2)
            say_hello(fd);
        for (int k = 0; k < 5; k++) {
            uint32_t len = (uint32_t)(kvs_test_rand() % sizeof(payload));
            for (uint32_t i = 0; i < len; i++)
                payload[i] = (uint8_t)kvs_test_rand();
            uint16_t type = (uint16_t)(1 + kvs_test_rand() % (KVS_MSG_MAX_ - 1));
            /* The server may hang up on any of these; later sends then fail, which is fine. */
            kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, type, 1, len};
            uint8_t hb[KVS_FRAME_HDR_LEN];
            kvs__frame_hdr_encode(&h, hb);
            uint64_t dl = kvs__now_ns() + KVS_NS_PER_S;
            if (kvs__send_all(fd, hb, sizeof(hb), dl) != KVS_OK ||
                kvs__send_all(fd, payload, len, dl) != KVS_OK)
                break;
        }
        close(fd);
    }
    /* Many idle connections at once, then gone. */
    int fds[100];
    for (int i = 0; i < 100; i++)
        fds[i] = raw_connect(&s);
    for (int i = 0; i < 100; i++)
        close(fds[i]);
    server_check_alive(&s);
    kvs__rpc_t *rpc = client(&s);
    mount_and_put(rpc, "seg", "k");
    kvs__rpc_close(rpc);
    server_stop(&s);
}

static void test_liveness_over_the_network(void)
{
    server_t s;
    const char *extra[] = {"--heartbeat-timeout-ms", "300", NULL};
    master_start(&s, extra);
    kvs__rpc_t *rpc = client(&s);
    mount_and_put(rpc, "seg", "k");
    mount_and_put(rpc, "seg-unnamed", "k2"); /* its heartbeats will not name this one */
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 2);
    uint64_t seg_id = rpc_stat_segment_id(rpc, "seg");
    CHECK(seg_id != 0);
    /* Heartbeats keep the segment they name, and only that one. */
    for (int i = 0; i < 6; i++) {
        usleep(100000);
        kvs__wbuf_t req, rsp;
        kvs__wbuf_init(&req);
        kvs__wbuf_init(&rsp);
        kvs__rpc_begin(rpc, &req, KVS_MSG_HEARTBEAT);
        kvs__fence_ack_t ack = {seg_id, 0, 0};
        kvs__heartbeat_req_t hb = {1, &ack, 0};
        kvs__heartbeat_req_encode(&req, &hb);
        CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
        CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
        kvs__wbuf_free(&req);
        kvs__wbuf_free(&rsp);
    }
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 1);
    /* Silence drops it, and its object with it. */
    usleep(700000);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 0);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "objects"), 0);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments_expired"), 2);
    kvs__rpc_close(rpc);
    server_stop(&s);
}

static int run_cli_line(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1", KVS_CLI_PATH, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void)
{
    server_t s;
    master_start(&s, NULL);
    kvs__rpc_t *rpc = client(&s);
    mount_and_put(rpc, "seg", "cli-key");
    char args[128];
    snprintf(args, sizeof(args), "--master 127.0.0.1:%u stat", (unsigned)s.port);
    CHECK_EQ_INT(run_cli_line(args), 0);
    snprintf(args, sizeof(args), "--master 127.0.0.1:%u ls cli-", (unsigned)s.port);
    CHECK_EQ_INT(run_cli_line(args), 0);
    CHECK(run_cli_line("--master 127.0.0.1:1 --timeout-ms 500 stat") != 0); /* nobody there */
    CHECK_EQ_INT(run_cli_line("frobnicate"), 2);
    CHECK_EQ_INT(run_cli_line("--master nonsense stat"), 2);
    kvs__rpc_close(rpc);
    server_stop(&s);
    /* The server refuses bad options with a usage error. */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "%s --master-only --port 70000 2>/dev/null", KVS_SERVER_PATH);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_serves_valid_requests),
        KVS_TEST_CASE(test_malformed_frames_drop_only_their_connection),
        KVS_TEST_CASE(test_versions_and_unknown_types),
        KVS_TEST_CASE(test_identity_comes_from_the_connection),
        KVS_TEST_CASE(test_random_frames_do_not_hurt),
        KVS_TEST_CASE(test_liveness_over_the_network),
        KVS_TEST_CASE(test_cli),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
