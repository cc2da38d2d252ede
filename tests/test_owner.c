/* Owner data port: malformed, truncated and oversized frames and out-of-bounds offsets are
 * refused without crashing and without touching the segment; the owner keeps serving others.
 * Also the owner's life with a master: mount, heartbeat, remount, unmount. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "common/auth_int.h"
#include "rpc_helpers.h"
#include "master/master_server_int.h"
#include "owner_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

static int dial(owner_fixture_t *f)
{
    int fd = kvs__tcp_connect("127.0.0.1", f->port, kvs__now_ns() + 3 * KVS_NS_PER_S);
    CHECK(fd >= 0);
    return fd;
}

static void send_frame(int fd, uint16_t type, uint32_t len, const void *payload, size_t n)
{
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, type, 9, len};
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_encode(&h, hb);
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__send_all(fd, hb, sizeof(hb), dl), KVS_OK);
    if (n)
        CHECK_STATUS(kvs__send_all(fd, payload, n, dl), KVS_OK);
}

static void hello(int fd)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__hello_req_t h = {.version_min = KVS_PROTO_VERSION_MIN,
                          .version_max = KVS_PROTO_VERSION_MAX,
                          .node = kvs__str_c("t")};
    kvs__hello_req_encode(&w, &h);
    send_frame(fd, KVS_MSG_HELLO, (uint32_t)w.len, w.data, w.len);
    kvs__wbuf_free(&w);
    uint8_t hb[KVS_FRAME_HDR_LEN], pb[64];
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
    kvs__frame_hdr_t rh;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), sizeof(pb), &rh), KVS_OK);
    CHECK_EQ_INT(rh.type, KVS_MSG_HELLO | KVS_RSP_FLAG);
    CHECK_STATUS(kvs__recv_all(fd, pb, rh.len, dl), KVS_OK);
}

/* Reads a response header and its leading status; skips any data. Returns the type. */
static int response(int fd, int32_t *status_p)
{
    uint8_t hb[KVS_FRAME_HDR_LEN + 4];
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, KVS_FRAME_HDR_LEN, KVS_FRAME_MAX_PAYLOAD, &h), KVS_OK);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, hb + KVS_FRAME_HDR_LEN, 4);
    *status_p = kvs__rbuf_i32(&r);
    char sink[4096];
    for (uint32_t left = h.len - 4; left > 0;) {
        uint32_t n = KVS_MIN(left, (uint32_t)sizeof(sink));
        CHECK_STATUS(kvs__recv_all(fd, sink, n, dl), KVS_OK);
        left -= n;
    }
    return h.type;
}

static bool closed_by_peer(int fd)
{
    char b;
    for (;;) {
        int rc = kvs__recv_all(fd, &b, 1, kvs__now_ns() + 3 * KVS_NS_PER_S);
        if (rc != KVS_OK)
            return rc == KVS_IO_ERROR;
    }
}

/* Writes carry a put's token; the owner has fenced none of these. */
#define TEST_TOKEN 0x7e57ull

static void data_req_token(uint8_t out[KVS_DATA_REQ_LEN], uint64_t seg, uint64_t off, uint64_t len,
                           uint64_t token)
{
    kvs__wbuf_t w = kvs__wbuf_over(out, KVS_DATA_REQ_LEN, KVS_PROTO_VERSION_MAX);
    kvs__data_req_t d = {seg, off, len, token, 0, 0, 0, 0};
    kvs__data_req_encode(&w, &d);
    CHECK(!w.failed && w.len == KVS_DATA_REQ_LEN);
}

static void data_req(uint8_t out[KVS_DATA_REQ_LEN], uint64_t seg, uint64_t off, uint64_t len)
{
    data_req_token(out, seg, off, len, TEST_TOKEN);
}

static void test_bad_frames_and_offsets(void)
{
    owner_fixture_t f;
    uint64_t size = 1u << 20;
    owner_fixture_start(&f, size, 0);
    memset(f.mem.base, 0x3C, size);
    int32_t st;
    uint8_t dr[KVS_DATA_REQ_LEN];

    int fd = dial(&f); /* garbage */
    CHECK_STATUS(kvs__send_all(fd, "SSH-2.0-OpenSSH\r\n\r\n", 19, kvs__now_ns() + KVS_NS_PER_S),
                 KVS_OK);
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(closed_by_peer(fd));
    close(fd);

    fd = dial(&f); /* data before HELLO */
    data_req(dr, FIX_SEGMENT_ID, 0, 16);
    send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(closed_by_peer(fd));
    close(fd);

    fd = dial(&f); /* oversized frame */
    hello(fd);
    send_frame(fd, KVS_MSG_DATA_WRITE, 0x7fffffffu, NULL, 0);
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(closed_by_peer(fd));
    close(fd);

    fd = dial(&f); /* READ with trailing bytes; WRITE whose length disagrees with its frame */
    hello(fd);
    send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN + 1, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    close(fd);
    fd = dial(&f);
    hello(fd);
    data_req(dr, FIX_SEGMENT_ID, 0, 1000);
    send_frame(fd, KVS_MSG_DATA_WRITE, KVS_DATA_REQ_LEN + 10, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK(closed_by_peer(fd));
    close(fd);

    fd = dial(&f); /* an unknown message type: a clear error, its payload skipped */
    hello(fd);
    send_frame(fd, 0x66, 5, "01234", 5);
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_UNSUPPORTED);
    data_req(dr, FIX_SEGMENT_ID, 0, 16);
    send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_READ | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
    close(fd);

    fd = dial(&f); /* a HELLO with no version in common */
    {
        kvs__wbuf_t w;
        kvs__wbuf_init(&w);
        kvs__hello_req_t h = {.version_min = KVS_PROTO_VERSION_MAX + 1,
                              .version_max = KVS_PROTO_VERSION_MAX + 1,
                              .node = kvs__str_c("t")};
        kvs__hello_req_encode(&w, &h);
        send_frame(fd, KVS_MSG_HELLO, (uint32_t)w.len, w.data, w.len);
        kvs__wbuf_free(&w);
    }
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_INVALID_VERSION);
    CHECK(closed_by_peer(fd));
    close(fd);

    fd = dial(&f); /* out-of-bounds reads are refused and the connection stays */
    hello(fd);
    static const uint64_t bad[][3] = {
        {FIX_SEGMENT_ID, 1u << 20, 1},
        {FIX_SEGMENT_ID, (1u << 20) - 1, 2},
        {FIX_SEGMENT_ID, UINT64_MAX, 2},
        {FIX_SEGMENT_ID, 0, 0},
        {FIX_SEGMENT_ID, 0, UINT64_MAX},
        {FIX_SEGMENT_ID + 1, 0, 10},
        {FIX_SEGMENT_ID, 8, KVS_DATA_MAX_CHUNK + 1},
    };
    for (size_t i = 0; i < KVS_ARRAY_SIZE(bad); i++) {
        data_req(dr, bad[i][0], bad[i][1], bad[i][2]);
        send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, dr, sizeof(dr));
        CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_READ | KVS_RSP_FLAG);
        CHECK(st == KVS_INVALID_PARAMS || st == KVS_SEGMENT_NOT_FOUND);
    }
    /* An out-of-bounds write: its bytes are drained, never stored. */
    uint8_t payload[KVS_DATA_REQ_LEN + 64];
    data_req(payload, FIX_SEGMENT_ID, size - 32, 64);
    memset(payload + KVS_DATA_REQ_LEN, 0xEE, 64);
    send_frame(fd, KVS_MSG_DATA_WRITE, sizeof(payload), payload, sizeof(payload));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_WRITE | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_INVALID_PARAMS);
    /* A good read on the same connection. */
    data_req(dr, FIX_SEGMENT_ID, size - 16, 16);
    send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_READ | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
    close(fd);

    fd = dial(&f); /* truncated: a header promising a write, half the bytes, hang up */
    hello(fd);
    data_req(payload, FIX_SEGMENT_ID, 0, 64);
    send_frame(fd, KVS_MSG_DATA_WRITE, sizeof(payload), payload, KVS_DATA_REQ_LEN + 10);
    close(fd);

    for (uint64_t i = 0; i < size - 0; i++) {
        if (i < 10) /* the truncated write may have stored its first bytes: allowed */
            continue;
        CHECK_EQ_INT(((unsigned char *)f.mem.base)[i], 0x3C);
    }
    /* Still serving. */
    int st2;
    CHECK_EQ_INT(waitpid(f.pid, &st2, WNOHANG), 0);
    fd = dial(&f);
    hello(fd);
    data_req(dr, FIX_SEGMENT_ID, 100, 1000);
    send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, dr, sizeof(dr));
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_READ | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
    close(fd);
    owner_fixture_stop(&f);
}

/* Sends a DATA_WRITE whose request is in payload[0, KVS_DATA_REQ_LEN), followed by `n` bytes of
 * `fill`; returns the owner's status. */
static int32_t send_write(int fd, uint8_t *payload, uint8_t fill, size_t n)
{
    memset(payload + KVS_DATA_REQ_LEN, fill, n);
    send_frame(fd, KVS_MSG_DATA_WRITE, (uint32_t)(KVS_DATA_REQ_LEN + n), payload,
               KVS_DATA_REQ_LEN + n);
    int32_t st;
    CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_WRITE | KVS_RSP_FLAG);
    return st;
}

/* One DATA_WRITE of `n` bytes of `fill` with `token` at offset 0; returns the owner's status. */
static int32_t write_with_token(int fd, uint64_t seg, uint64_t token, uint8_t fill, size_t n)
{
    uint8_t payload[KVS_DATA_REQ_LEN + 256];
    CHECK(n <= 256);
    data_req_token(payload, seg, 0, n, token);
    return send_write(fd, payload, fill, n);
}

/* A fenced put's writes are refused; other puts' go on. */
static void test_fenced_writes_are_refused(void)
{
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.shm_dir = "/nonexistent"; /* tcp only */
    kvs__data_server_t *srv;
    CHECK_STATUS(kvs__data_server_create(&cfg, &srv), KVS_OK);
    static uint8_t seg[4096];
    CHECK_STATUS(kvs__data_server_add(srv, 77, seg, sizeof(seg), -1, NULL, 0), KVS_OK);
    owner_fixture_t f = {.port = kvs__data_server_port(srv)};
    int fd = dial(&f);
    hello(fd);
    CHECK_STATUS(write_with_token(fd, 77, 5, 0xA1, 64), KVS_OK);
    CHECK_EQ_INT(seg[0], 0xA1);
    CHECK_STATUS(kvs__data_server_fence(srv, 77, (const uint64_t[]){5, 9}, NULL, 2), KVS_OK);
    CHECK_STATUS(kvs__data_server_fence(srv, 78, (const uint64_t[]){5}, NULL, 1),
                 KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(write_with_token(fd, 77, 5, 0xB2, 64), KVS_INVALID_WRITE);
    CHECK_STATUS(write_with_token(fd, 77, 9, 0xB2, 64), KVS_INVALID_WRITE);
    CHECK_STATUS(write_with_token(fd, 77, 0, 0xB2, 64), KVS_INVALID_WRITE); /* no put at all */
    CHECK_EQ_INT(seg[0], 0xA1);
    CHECK_STATUS(write_with_token(fd, 77, 6, 0xC3, 64), KVS_OK); /* another put's */
    CHECK_EQ_INT(seg[63], 0xC3);
    close(fd);
    kvs__data_server_destroy(srv);

    CHECK_STATUS(kvs__data_server_create(&cfg, &srv), KVS_OK);
    CHECK_STATUS(kvs__data_server_add(srv, 77, seg, sizeof(seg), -1, NULL, 0), KVS_OK);
    f.port = kvs__data_server_port(srv);
    fd = dial(&f);
    hello(fd);
    /* Many fences (the set grows) and the first ones still hold. */
    CHECK_STATUS(kvs__data_server_fence(srv, 77, (const uint64_t[]){5}, NULL, 1), KVS_OK);
    for (uint64_t t = 100; t < 5000; t++)
        CHECK_STATUS(kvs__data_server_fence(srv, 77, &t, NULL, 1), KVS_OK);
    CHECK_STATUS(write_with_token(fd, 77, 5, 0xD4, 64), KVS_INVALID_WRITE);
    CHECK_STATUS(write_with_token(fd, 77, 4999, 0xD4, 64), KVS_INVALID_WRITE);
    CHECK_STATUS(write_with_token(fd, 77, 5000, 0xD4, 64), KVS_OK);
    close(fd);
    kvs__data_server_destroy(srv);
}

/* Queued bytes: writes of a put sent before its fence, served (the owner stalls 300 ms per
 * request) only after it, are refused too. */
static void test_fence_refuses_writes_already_queued(void)
{
    kvs_test_need_hooks();
#ifdef KVS_TEST_HOOKS
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.shm_dir = "/nonexistent"; /* tcp only */
    cfg.inject_delay_us = 300000;
    kvs__data_server_t *srv;
    CHECK_STATUS(kvs__data_server_create(&cfg, &srv), KVS_OK);
    static uint8_t seg[4096];
    memset(seg, 0x11, sizeof(seg));
    CHECK_STATUS(kvs__data_server_add(srv, 77, seg, sizeof(seg), -1, NULL, 0), KVS_OK);
    owner_fixture_t f = {.port = kvs__data_server_port(srv)};
    int fd = dial(&f);
    hello(fd);
    uint8_t payload[KVS_DATA_REQ_LEN + 64];
    for (int i = 0; i < 2; i++) {
        data_req_token(payload, 77, 0, 64, 7);
        memset(payload + KVS_DATA_REQ_LEN, 0xE5, 64);
        send_frame(fd, KVS_MSG_DATA_WRITE, sizeof(payload), payload, sizeof(payload));
    }
    usleep(50000); /* both are in the socket; the first waits out its stall */
    CHECK_STATUS(kvs__data_server_fence(srv, 77, (const uint64_t[]){7}, NULL, 1), KVS_OK);
    for (int i = 0; i < 2; i++) {
        int32_t st;
        CHECK_EQ_INT(response(fd, &st), KVS_MSG_DATA_WRITE | KVS_RSP_FLAG);
        CHECK_STATUS(st, KVS_INVALID_WRITE);
    }
    CHECK_EQ_INT(seg[0], 0x11); /* nothing of the fenced put landed */
    close(fd);
    kvs__data_server_destroy(srv);
#endif
}

static void test_owner_with_master(void)
{
    kvs__master_server_config_t mc;
    CHECK_STATUS(kvs__master_server_config_init(&mc), KVS_OK);
    mc.port = 0;
    mc.tick_ms = 20;
    mc.master.heartbeat_timeout_ms = 300;
    kvs__master_server_t *ms;
    CHECK_STATUS(kvs__master_server_create(&mc, &ms), KVS_OK);
    CHECK_STATUS(kvs__master_server_start(ms), KVS_OK);
    kvs__owner_config_t oc = {.master_host = "127.0.0.1",
                              .master_port = kvs__master_server_port(ms),
                              .segment_size = 4u << 20,
                              .rpc_timeout_ms = 2000};
    kvs__data_server_config_init(&oc.data);
    kvs__owner_t *o;
    CHECK_STATUS(kvs__owner_create(&oc, &o), KVS_OK);
    CHECK(kvs__owner_segment_id(o) != 0);
    kvs__rpc_config_t rc = {
        .host = "127.0.0.1", .port = kvs__master_server_port(ms), .timeout_ms = 2000};
    kvs__rpc_t *rpc;
    CHECK_STATUS(kvs__rpc_open(&rc, &rpc), KVS_OK);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 1);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "capacity_bytes"), 4u << 20);
    usleep(900000); /* three heartbeat time-outs: the heartbeats keep it mounted */
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 1);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments_expired"), 0);
    kvs__owner_destroy(o);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments"), 0);
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments_unmounted"), 1);
    kvs__rpc_close(rpc);
    kvs__master_server_destroy(ms);
    /* Bad configuration is refused. */
    oc.segment_size = 10;
    CHECK_STATUS(kvs__owner_create(&oc, &o), KVS_INVALID_PARAMS);
}

/* ---- the segment lock is not held across socket I/O ---------------------------------------- */

#define LOCK_SEG_SIZE (32u << 20)
#define LOCK_READ_LEN 4096u

static uint8_t lock_pattern(uint64_t off)
{
    return (uint8_t)(off * 7 + 3);
}

typedef struct {
    uint16_t port;
    atomic_bool stop;
    atomic_uint_least64_t ok, refused, wrong, cut;
} steady_t;

/* Reads 4 KiB after 4 KiB of segment 7 and checks each; counts the refusals that follow its
 * removal, and the reads it cut off. */
static void *steady_reader(void *arg)
{
    steady_t *st = arg;
    owner_fixture_t f = {.port = st->port};
    int fd = dial(&f);
    hello(fd);
    static uint8_t bufs[8][LOCK_READ_LEN];
    static atomic_uint next;
    uint8_t *buf = bufs[atomic_fetch_add(&next, 1) % 8];
    for (uint64_t i = 0; !atomic_load(&st->stop); i++) {
        uint64_t off = (i * LOCK_READ_LEN) % (1u << 20);
        uint8_t req[KVS_DATA_REQ_LEN];
        data_req(req, FIX_SEGMENT_ID, off, LOCK_READ_LEN);
        send_frame(fd, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, req, sizeof(req));
        uint8_t hb[KVS_FRAME_HDR_LEN + 4];
        uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
        CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
        kvs__rbuf_t r;
        kvs__rbuf_init(&r, hb + KVS_FRAME_HDR_LEN, 4);
        int32_t status = kvs__rbuf_i32(&r);
        if (status != KVS_OK) {
            CHECK_STATUS(status, KVS_SEGMENT_NOT_FOUND);
            atomic_fetch_add(&st->refused, 1);
            usleep(1000);
            continue;
        }
        if (kvs__recv_all(fd, buf, LOCK_READ_LEN, dl) != KVS_OK) {
            /* Cut off by the remove after its OK header: the connection closed (never a
             * short success). Dial again. */
            CHECK(closed_by_peer(fd));
            close(fd);
            fd = dial(&f);
            hello(fd);
            atomic_fetch_add(&st->cut, 1);
            continue;
        }
        bool right = true;
        for (uint32_t j = 0; j < LOCK_READ_LEN; j++)
            right &= buf[j] == lock_pattern(off + j);
        atomic_fetch_add(right ? &st->ok : &st->wrong, 1);
    }
    close(fd);
    return NULL;
}

static uint64_t ms_since(uint64_t t0)
{
    return (kvs__now_ns() - t0) / KVS_NS_PER_MS;
}

/* Steady reads in four threads, a reader that stopped reading a 16 MiB response, and a writer
 * stalled half way through a put's bytes: a fence of that put and a remount (remove, add)
 * still complete at once, the stalled write's later bytes never land, and the cut-off read
 * ends with its connection closed. (The data server held the segment lock across socket I/O,
 * so the fence and the remount waited for the stalled peers' time-outs, and behind the
 * writer-preferring lock every other read waited too.) */
static void test_fence_and_remount_do_not_wait_for_peers(void)
{
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.shm_dir = "/nonexistent"; /* tcp only */
    cfg.io_timeout_ms = 3000;
    kvs__data_server_t *srv;
    CHECK_STATUS(kvs__data_server_create(&cfg, &srv), KVS_OK);
    kvs__segment_mem_t mem, fresh;
    CHECK_STATUS(kvs__segment_mem_create("lock-test", LOCK_SEG_SIZE, &mem), KVS_OK);
    uint8_t *seg = mem.base;
    for (uint64_t i = 0; i < LOCK_SEG_SIZE; i++)
        seg[i] = lock_pattern(i);
    CHECK_STATUS(kvs__data_server_add(srv, FIX_SEGMENT_ID, mem.base, mem.size, -1, NULL, 0),
                 KVS_OK);
    owner_fixture_t f = {.port = kvs__data_server_port(srv)};

    /* A reader that asks for 16 MiB and reads none of it: the server's send blocks. */
    int stalled = dial(&f);
    hello(stalled);
    uint8_t req[KVS_DATA_REQ_LEN];
    data_req(req, FIX_SEGMENT_ID, 0, KVS_DATA_MAX_CHUNK);
    send_frame(stalled, KVS_MSG_DATA_READ, KVS_DATA_REQ_LEN, req, sizeof(req));

    steady_t st = {.port = f.port};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(pthread_create(&th[i], NULL, steady_reader, &st), 0);

    /* A writer of put 0x5107 sends half of 64 KiB at 20 MiB, then stalls. */
    const uint64_t woff = 20u << 20, wlen = 64u << 10;
    int writer = dial(&f);
    hello(writer);
    uint8_t wreq[KVS_DATA_REQ_LEN];
    data_req_token(wreq, FIX_SEGMENT_ID, woff, wlen, 0x5107);
    uint8_t *wbytes = malloc(wlen);
    CHECK(wbytes != NULL);
    memset(wbytes, 0xEE, wlen);
    send_frame(writer, KVS_MSG_DATA_WRITE, (uint32_t)(KVS_DATA_REQ_LEN + wlen), wreq, sizeof(wreq));
    CHECK_STATUS(kvs__send_all(writer, wbytes, wlen / 2, kvs__now_ns() + KVS_NS_PER_S), KVS_OK);
    usleep(200000); /* the first half is in; readers are streaming */
    CHECK(atomic_load(&st.ok) > 0);

    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs__data_server_fence(srv, FIX_SEGMENT_ID, (const uint64_t[]){0x5107}, NULL, 1),
                 KVS_OK);
    uint64_t fence_ms = ms_since(t0);
    CHECK_CMP_U64(fence_ms, <, 500); /* it waited for no peer */
    CHECK_STATUS(kvs__send_all(writer, wbytes + wlen / 2, wlen / 2, kvs__now_ns() + KVS_NS_PER_S),
                 KVS_OK);
    int32_t wst;
    CHECK_EQ_INT(response(writer, &wst), KVS_MSG_DATA_WRITE | KVS_RSP_FLAG);
    CHECK_STATUS(wst, KVS_INVALID_WRITE);
    for (uint64_t i = woff + wlen / 2; i < woff + wlen; i++)
        CHECK_EQ_INT(seg[i], lock_pattern(i)); /* nothing sent after the fence landed */
    uint64_t ok_before = atomic_load(&st.ok);
    usleep(50000);
    CHECK(atomic_load(&st.ok) > ok_before); /* reads go on */

    t0 = kvs__now_ns();
    CHECK_STATUS(kvs__data_server_remove(srv, FIX_SEGMENT_ID), KVS_OK);
    CHECK_STATUS(kvs__segment_mem_create("lock-test", LOCK_SEG_SIZE, &fresh), KVS_OK);
    CHECK_STATUS(kvs__data_server_add(srv, FIX_SEGMENT_ID + 1, fresh.base, fresh.size, -1, NULL, 0),
                 KVS_OK);
    uint64_t remount_ms = ms_since(t0);
    kvs__segment_mem_destroy(&mem); /* as the owner does: nothing may touch it any more */
    printf("fence %llu ms, remount %llu ms, with a stalled reader and writer; %llu reads cut off\n",
           (unsigned long long)fence_ms, (unsigned long long)remount_ms,
           (unsigned long long)atomic_load(&st.cut));
    CHECK_CMP_U64(remount_ms, <, 500);
    for (int i = 0; i < 100 && atomic_load(&st.refused) < 4; i++)
        usleep(10000);
    CHECK(atomic_load(&st.refused) >= 4); /* the readers see the segment gone */
    atomic_store(&st.stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_U64(atomic_load(&st.wrong), 0);
    /* The cut-off read: its frame can only end in a close, before all its bytes came. */
    static char sink[1 << 16];
    uint64_t got = 0;
    struct timeval tv = {.tv_sec = 3};
    CHECK_STATUS(kvs__set_nonblock(stalled, false), KVS_OK);
    setsockopt(stalled, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* bounded */
    for (;;) {
        ssize_t n = recv(stalled, sink, sizeof(sink), 0);
        if (n <= 0) {
            CHECK(n == 0);
            break;
        }
        got += (uint64_t)n;
    }
    CHECK_CMP_U64(got, <, KVS_FRAME_HDR_LEN + 4 + KVS_DATA_MAX_CHUNK);
    close(stalled);
    close(writer);
    free(wbytes);
    kvs__data_server_destroy(srv);
    kvs__segment_mem_destroy(&fresh);
}

/* One capability write of `n` bytes of `fill` at offset 0 under `key` (range [0, 4096), token
 * 5, epoch 1); returns the owner's status. */
static int32_t write_with_cap(int fd, uint64_t seg, const uint8_t *key, uint8_t fill, size_t n)
{
    uint8_t payload[KVS_DATA_REQ_LEN + 256];
    CHECK(n <= 256);
    kvs__wbuf_t w = kvs__wbuf_over(payload, KVS_DATA_REQ_LEN, KVS_PROTO_VERSION_MAX);
    kvs__data_req_t d = {.segment_id = seg,
                         .offset = 0,
                         .length = n,
                         .token = 5,
                         .alloc_offset = 0,
                         .alloc_size = 4096,
                         .cap = kvs__write_cap(key, seg, 0, 4096, 5, 1),
                         .cap_epoch = 1};
    kvs__data_req_encode(&w, &d);
    CHECK(!w.failed && w.len == KVS_DATA_REQ_LEN);
    return send_write(fd, payload, fill, n);
}

/* A segment re-registered with a new leader gets a new write key: every capability the old
 * leader made fails from then on, the new leader's work. */
static void test_rekey_refuses_the_old_leaders_capabilities(void)
{
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.shm_dir = "/nonexistent";
    kvs__data_server_t *srv;
    CHECK_STATUS(kvs__data_server_create(&cfg, &srv), KVS_OK);
    static uint8_t seg[4096];
    uint8_t old_key[KVS_WRITE_KEY_LEN], new_key[KVS_WRITE_KEY_LEN];
    kvs__write_key_new(old_key);
    kvs__write_key_new(new_key);
    CHECK_STATUS(kvs__data_server_add(srv, 77, seg, sizeof(seg), -1, old_key, 1), KVS_OK);
    owner_fixture_t f = {.port = kvs__data_server_port(srv)};
    int fd = dial(&f);
    hello(fd);
    CHECK_STATUS(write_with_cap(fd, 77, old_key, 0xA1, 64), KVS_OK);
    CHECK_EQ_INT(seg[0], 0xA1);
    CHECK_STATUS(write_with_cap(fd, 77, new_key, 0xB2, 64), KVS_INVALID_WRITE);
    CHECK_STATUS(kvs__data_server_rekey(srv, 78, new_key, 1), KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(kvs__data_server_rekey(srv, 77, new_key, 1), KVS_OK);
    /* The same connection, whose capability cache was keyed with the old key. */
    CHECK_STATUS(write_with_cap(fd, 77, old_key, 0xC3, 64), KVS_INVALID_WRITE);
    CHECK_EQ_INT(seg[0], 0xA1);
    CHECK_STATUS(write_with_cap(fd, 77, new_key, 0xD4, 64), KVS_OK);
    CHECK_EQ_INT(seg[0], 0xD4);
    close(fd);
    kvs__data_server_destroy(srv);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_bad_frames_and_offsets),
        KVS_TEST_CASE(test_fenced_writes_are_refused),
        KVS_TEST_CASE(test_rekey_refuses_the_old_leaders_capabilities),
        KVS_TEST_CASE(test_fence_refuses_writes_already_queued),
        KVS_TEST_CASE(test_owner_with_master),
        KVS_TEST_CASE(test_fence_and_remount_do_not_wait_for_peers),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
