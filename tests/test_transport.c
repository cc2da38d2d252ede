/* Transport conformance suite: one set of tests written against kvs_transport_ops_t and run
 * for every transport. The owner is a real data server in another process. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "owner_fixture.h"
#include "transport/shm/shm_int.h"
#include "transport/tcp/tcp_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/mman.h>

static int make_tcp(kvs_transport_t **t_p)
{
    kvs__tcp_config_t cfg;
    CHECK_STATUS(kvs__tcp_config_init(&cfg), KVS_OK);
    /* Generous: sanitizer builds on two shared cores can stall a socket step for seconds;
     * the deadline tests rely on the wait's deadline, not on this bound. */
    cfg.io_timeout_ms = 10000;
    return kvs__tcp_transport_create(&cfg, t_p);
}

static int make_shm(kvs_transport_t **t_p)
{
    kvs__shm_config_t cfg;
    CHECK_STATUS(kvs__shm_config_init(&cfg), KVS_OK);
    return kvs__shm_transport_create(&cfg, t_p);
}

static const struct {
    const char *name;
    int (*create)(kvs_transport_t **t_p);
} transports[] = {
    {"tcp", make_tcp},
    {"shm", make_shm},
};

/* Same-host transports copy from the owner's memory without asking the owner each time: a
 * stalled or dead owner cannot delay or fail their transfers. */
static bool same_host(const kvs_transport_t *t)
{
    return (t->ops->caps & KVS_TRANSPORT_CAP_SAME_HOST) != 0;
}

#define FOR_EACH_TRANSPORT(t)                                                                      \
    for (size_t ti_ = 0; ti_ < KVS_ARRAY_SIZE(transports); ti_++)                                  \
        for (kvs_transport_t *t = open_transport(ti_); t != NULL; t->ops->destroy(t), t = NULL)

static kvs_transport_t *open_transport(size_t i)
{
    kvs_transport_t *t = NULL;
    CHECK_STATUS(transports[i].create(&t), KVS_OK);
    CHECK(t->ops->name != NULL && strcmp(t->ops->name, transports[i].name) == 0);
    printf("  transport %s\n", t->ops->name);
    return t;
}

static void fill_random(void *p, size_t n)
{
    unsigned char *b = p;
    uint64_t r = 0;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0)
            r = kvs_test_rand();
        b[i] = (unsigned char)(r >> (8 * (i & 7)));
    }
}

/* One request, submitted and waited for. */
static int xfer(kvs_transport_t *t, kvs_endpoint_t *ep, kvs_xfer_op_t op, uint64_t seg,
                uint64_t off, const struct iovec *iov, uint32_t cnt, uint64_t deadline_ms)
{
    kvs_xfer_req_t r = {op, ep, seg, off, kvs__iov_total(iov, cnt), iov, cnt, 0, 0, 1, 0, 0, 0, 0};
    kvs_batch_t *b;
    CHECK_STATUS(t->ops->submit(t, &r, 1, UINT64_MAX, &b), KVS_OK);
    int rc = t->ops->wait(t, b, kvs__now_ns() + deadline_ms * KVS_NS_PER_MS);
    CHECK_STATUS(rc, r.status);
    return rc;
}

static void test_sizes_and_offsets(void)
{
    owner_fixture_t f;
    uint64_t seg_size = 80ull << 20;
    owner_fixture_start(&f, seg_size, 0);
    static const uint64_t sizes[] = {1,
                                     2,
                                     3,
                                     7,
                                     63,
                                     64,
                                     65,
                                     4095,
                                     4096,
                                     4097,
                                     65537,
                                     (1 << 20) + 3,
                                     (2 << 20) + 1,
                                     (16 << 20) + 1,
                                     64 << 20};
    static const uint64_t offsets[] = {0, 1, 13, 4093, 1 << 20};
    size_t max = 64u << 20;
    unsigned char *src = malloc(max), *dst = malloc(max + 128);
    FOR_EACH_TRANSPORT(t)
    {
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        for (size_t i = 0; i < KVS_ARRAY_SIZE(sizes); i++) {
            uint64_t n = sizes[i], off = offsets[i % KVS_ARRAY_SIZE(offsets)] + (i & 1);
            if (off + n > seg_size)
                off = seg_size - n - 5;
            fill_random(src, n);
            struct iovec wv = {src, n};
            CHECK_STATUS(xfer(t, ep, KVS_XFER_WRITE, FIX_SEGMENT_ID, off, &wv, 1, 10000), KVS_OK);
            CHECK_EQ_MEM((char *)f.mem.base + off, src, n);
            /* Read back into a guarded buffer at an odd address. */
            memset(dst, 0xA5, n + 128);
            struct iovec rv = {dst + 61, n};
            CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, off, &rv, 1, 10000), KVS_OK);
            CHECK_EQ_MEM(dst + 61, src, n);
            for (int g = 0; g < 61; g++)
                CHECK_EQ_INT(dst[g], 0xA5);
            for (int g = 0; g < 67; g++)
                CHECK_EQ_INT(dst[61 + n + g], 0xA5);
        }
    }
    free(src);
    free(dst);
    owner_fixture_stop(&f);
}

typedef struct {
    uint64_t pos, len;
} frag_t;

/* Builds `n` fragments of random sizes totalling `total`, placed in shuffled order with
 * 16-byte guards between them inside a buffer of *buf_len_p bytes. */
static struct iovec *make_fragments(unsigned char *buf, uint64_t total, uint32_t n,
                                    uint64_t *buf_len_p)
{
    uint64_t *len = calloc(n, sizeof(*len));
    uint64_t left = total;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t avg = left / (n - i);
        len[i] = i + 1 == n ? left : 1 + kvs_test_rand() % (2 * avg > 1 ? 2 * avg - 1 : 1);
        if (len[i] > left - (n - i - 1))
            len[i] = left - (n - i - 1);
        left -= len[i];
    }
    /* Slots in a random order: fragment i goes to slot perm[i]. */
    uint32_t *perm = calloc(n, sizeof(*perm));
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(kvs_test_rand() % i), tmp = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = tmp;
    }
    uint64_t *slot_pos = calloc(n, sizeof(*slot_pos)), pos = 16;
    uint32_t *slot_frag = calloc(n, sizeof(*slot_frag));
    for (uint32_t i = 0; i < n; i++)
        slot_frag[perm[i]] = i;
    for (uint32_t s = 0; s < n; s++) {
        slot_pos[s] = pos;
        pos += len[slot_frag[s]] + 16;
    }
    struct iovec *iov = calloc(n, sizeof(*iov));
    for (uint32_t i = 0; i < n; i++) {
        iov[i].iov_base = buf + slot_pos[perm[i]];
        iov[i].iov_len = len[i];
    }
    *buf_len_p = pos;
    free(len);
    free(perm);
    free(slot_pos);
    free(slot_frag);
    return iov;
}

static void test_fragmented_destinations(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 32u << 20, 0);
    uint64_t total = (6u << 20) + 12345;
    uint32_t n = 777;
    unsigned char *buf = malloc(total + 16 * (n + 2));
    uint64_t buf_len;
    struct iovec *iov = make_fragments(buf, total, n, &buf_len);
    fill_random(f.mem.base, total + 100);
    FOR_EACH_TRANSPORT(t)
    {
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        memset(buf, 0x5C, buf_len);
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 3, iov, n, 10000), KVS_OK);
        uint64_t off = 3;
        for (uint32_t i = 0; i < n; i++) {
            CHECK_EQ_MEM(iov[i].iov_base, (char *)f.mem.base + off, iov[i].iov_len);
            off += iov[i].iov_len;
            for (int g = 1; g <= 16; g++) /* the guard after each fragment */
                CHECK_EQ_INT(((unsigned char *)iov[i].iov_base)[iov[i].iov_len + (g - 1)], 0x5C);
        }
        /* Gather-write from the same fragments to another place, then compare. */
        fill_random(buf, buf_len);
        CHECK_STATUS(xfer(t, ep, KVS_XFER_WRITE, FIX_SEGMENT_ID, 16u << 20, iov, n, 10000), KVS_OK);
        off = 16u << 20;
        for (uint32_t i = 0; i < n; i++) {
            CHECK_EQ_MEM((char *)f.mem.base + off, iov[i].iov_base, iov[i].iov_len);
            off += iov[i].iov_len;
        }
    }
    free(iov);
    free(buf);
    owner_fixture_stop(&f);
}

typedef struct {
    kvs_transport_t *t;
    kvs_endpoint_t *ep;
    void *seg;
    int thread;
} worker_arg_t;

static void *concurrent_worker(void *p)
{
    worker_arg_t *a = p;
    enum { N = 500 };
    kvs_xfer_req_t reqs[N];
    struct iovec iov[N];
    unsigned char *dst = malloc(N * 65536);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t len = 1 + (uint64_t)((i * 7919 + round * 31 + a->thread * 101) % 65536);
            uint64_t off = (uint64_t)((i * 104729 + a->thread * 7) % ((8u << 20) - 65536));
            iov[i] = (struct iovec){dst + (size_t)i * 65536, len};
            reqs[i] = (kvs_xfer_req_t){
                KVS_XFER_READ, a->ep, FIX_SEGMENT_ID, off, len, &iov[i], 1, 0, 0, 0, 0, 0, 0, 0};
        }
        kvs_batch_t *b;
        if (a->t->ops->submit(a->t, reqs, N, UINT64_MAX, &b) != KVS_OK)
            kvs_test_fail(__FILE__, __LINE__, "submit failed");
        int rc = a->t->ops->wait(a->t, b, kvs__now_ns() + 20 * KVS_NS_PER_S);
        if (rc != KVS_OK)
            kvs_test_fail(__FILE__, __LINE__, "batch failed: %s", kvs_status_name(rc));
        for (int i = 0; i < N; i++) {
            if (reqs[i].status != KVS_OK ||
                memcmp(iov[i].iov_base, (char *)a->seg + reqs[i].offset, iov[i].iov_len) != 0)
                kvs_test_fail(__FILE__, __LINE__, "request %d of thread %d wrong", i, a->thread);
        }
    }
    free(dst);
    return NULL;
}

static void test_many_concurrent_requests(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 8u << 20, 0);
    fill_random(f.mem.base, 8u << 20);
    FOR_EACH_TRANSPORT(t)
    {
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        pthread_t th[4];
        worker_arg_t args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (worker_arg_t){t, ep, f.mem.base, i};
            CHECK_EQ_INT(pthread_create(&th[i], NULL, concurrent_worker, &args[i]), 0);
        }
        for (int i = 0; i < 4; i++)
            pthread_join(th[i], NULL);
    }
    owner_fixture_stop(&f);
}

static void test_deadline_leaves_no_late_write(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 8u << 20, 300000); /* the owner stalls 300 ms per request */
    fill_random(f.mem.base, 8u << 20);
    size_t n = 4u << 20;
    unsigned char *dst = malloc(n), *snap = malloc(n);
    FOR_EACH_TRANSPORT(t)
    {
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        memset(dst, 0, n);
        struct iovec v = {dst, n};
        if (same_host(t)) {
            /* The owner's stall is not on the data path: the bytes arrive within the deadline. */
            CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 0, &v, 1, 5000), KVS_OK);
            CHECK_EQ_MEM(dst, f.mem.base, n);
            continue;
        }
        uint64_t t0 = kvs__now_ns();
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 0, &v, 1, 50), KVS_TIMED_OUT);
        uint64_t took_ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
        CHECK_CMP_U64(took_ms, <, 250); /* returned at the deadline, not when the owner woke */
        memcpy(snap, dst, n);
        usleep(600000); /* the owner answers now; nothing may land */
        CHECK_EQ_MEM(dst, snap, n);
        /* The transport still works afterwards. */
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 0, &v, 1, 5000), KVS_OK);
        CHECK_EQ_MEM(dst, f.mem.base, n);
    }
    free(dst);
    free(snap);
    owner_fixture_stop(&f);
}

/* Two batches with different deadlines in one tcp connection window: the first completes and
 * its wait frees it while the second is still in flight; the second then reaches its deadline.
 * Its cancellation used to read the first batch's freed chunks from the window (a
 * use-after-free that AddressSanitizer reports). */
static void test_tcp_cancel_after_a_window_neighbour_completed(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 1u << 20, 300000); /* the owner stalls 300 ms per request */
    kvs__tcp_config_t cfg;
    CHECK_STATUS(kvs__tcp_config_init(&cfg), KVS_OK);
    cfg.conns_per_peer = 1; /* every chunk in one connection's window */
    cfg.io_timeout_ms = 10000;
    kvs_transport_t *t = NULL;
    CHECK_STATUS(kvs__tcp_transport_create(&cfg, &t), KVS_OK);
    kvs_endpoint_t *ep;
    CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
    static unsigned char bufs[3][4096];
    struct iovec v[3] = {{bufs[0], 4096}, {bufs[1], 4096}, {bufs[2], 4096}};
    kvs_xfer_req_t r[3];
    kvs_batch_t *b[3];
    for (int i = 0; i < 3; i++)
        r[i] = (kvs_xfer_req_t){KVS_XFER_READ,
                                ep,
                                FIX_SEGMENT_ID,
                                4096u * (unsigned)i,
                                4096,
                                &v[i],
                                1,
                                0,
                                0,
                                0,
                                0,
                                0,
                                0,
                                0};
    /* C keeps the connection busy while A and B queue up behind it: they share a window. */
    CHECK_STATUS(t->ops->submit(t, &r[0], 1, UINT64_MAX, &b[0]), KVS_OK);
    usleep(50000);
    CHECK_STATUS(t->ops->submit(t, &r[1], 1, UINT64_MAX, &b[1]), KVS_OK);
    CHECK_STATUS(t->ops->submit(t, &r[2], 1, UINT64_MAX, &b[2]), KVS_OK);
    uint64_t long_dl = kvs__now_ns() + 10 * KVS_NS_PER_S;
    CHECK_STATUS(t->ops->wait(t, b[0], long_dl), KVS_OK);
    CHECK_STATUS(t->ops->wait(t, b[1], long_dl), KVS_OK); /* A done and freed; B in flight */
    CHECK_STATUS(t->ops->wait(t, b[2], kvs__now_ns() + 100 * KVS_NS_PER_MS), KVS_TIMED_OUT);
    CHECK_EQ_MEM(bufs[0], f.mem.base, 4096);
    CHECK_EQ_MEM(bufs[1], f.mem.base + 4096, 4096);
    /* The transport works afterwards. */
    CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 8192, &v[2], 1, 5000), KVS_OK);
    CHECK_EQ_MEM(bufs[2], f.mem.base + 8192, 4096);
    t->ops->destroy(t);
    owner_fixture_stop(&f);
}

static void test_peer_death_mid_transfer(void)
{
    FOR_EACH_TRANSPORT(t)
    {
        owner_fixture_t f;
        owner_fixture_start(&f, 64u << 20, 100000);
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        size_t n = 64u << 20;
        unsigned char *dst = malloc(n);
        struct iovec v = {dst, n};
        kvs_xfer_req_t r = {KVS_XFER_READ, ep, FIX_SEGMENT_ID, 0, n, &v, 1, 0, 0, 0, 0, 0, 0, 0};
        kvs_batch_t *b;
        CHECK_STATUS(t->ops->submit(t, &r, 1, UINT64_MAX, &b), KVS_OK);
        usleep(150000); /* some chunks delivered, most not */
        owner_fixture_kill(&f);
        uint64_t t0 = kvs__now_ns();
        int rc = t->ops->wait(t, b, t0 + 3 * KVS_NS_PER_S);
        CHECK_CMP_U64((kvs__now_ns() - t0) / KVS_NS_PER_MS, <=, 3100);
        if (same_host(t)) {
            /* The mapping outlives the owner: exact bytes, never wrong ones. */
            CHECK_STATUS(rc, KVS_OK);
            CHECK_EQ_MEM(dst, f.mem.base, n);
        } else {
            CHECK(rc == KVS_TRANSFER_FAIL || rc == KVS_TIMED_OUT);
            CHECK(r.status != KVS_OK);
        }
        free(dst);
        owner_fixture_stop(&f);
    }
}

static void test_out_of_segment_refused(void)
{
    owner_fixture_t f;
    uint64_t size = 1u << 20;
    owner_fixture_start(&f, size, 0);
    memset(f.mem.base, 0x11, size);
    unsigned char buf[64];
    FOR_EACH_TRANSPORT(t)
    {
        kvs_endpoint_t *ep;
        CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
        struct iovec v = {buf, 20};
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, size - 10, &v, 1, 5000),
                     KVS_INVALID_PARAMS);
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, size, &v, 1, 5000),
                     KVS_INVALID_PARAMS);
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, UINT64_MAX - 5, &v, 1, 5000),
                     KVS_INVALID_PARAMS);
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID + 1, 0, &v, 1, 5000),
                     KVS_SEGMENT_NOT_FOUND);
        memset(buf, 0x77, sizeof(buf));
        CHECK_STATUS(xfer(t, ep, KVS_XFER_WRITE, FIX_SEGMENT_ID, size - 10, &v, 1, 5000),
                     KVS_INVALID_PARAMS);
        for (uint64_t i = 0; i < size; i++) /* nothing written anywhere */
            CHECK_EQ_INT(((unsigned char *)f.mem.base)[i], 0x11);
        /* Malformed requests are refused before anything is sent. */
        kvs_xfer_req_t bad[3] = {
            {KVS_XFER_READ, ep, FIX_SEGMENT_ID, 0, 30, &v, 1, 0, 0, 0, 0, 0, 0,
             0}, /* length != fragments */
            {KVS_XFER_READ, NULL, FIX_SEGMENT_ID, 0, 20, &v, 1, 0, 0, 0, 0, 0, 0, 0},
            {(kvs_xfer_op_t)9, ep, FIX_SEGMENT_ID, 0, 20, &v, 1, 0, 0, 0, 0, 0, 0, 0},
        };
        kvs_batch_t *b;
        CHECK_STATUS(t->ops->submit(t, bad, 3, UINT64_MAX, &b), KVS_OK);
        CHECK_STATUS(t->ops->wait(t, b, kvs__now_ns() + KVS_NS_PER_S), KVS_INVALID_PARAMS);
        for (int i = 0; i < 3; i++)
            CHECK_STATUS(bad[i].status, KVS_INVALID_PARAMS);
        /* And a good request still works on the same endpoint. */
        CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, size - 20, &v, 1, 5000), KVS_OK);
        CHECK_EQ_INT(buf[0], 0x11);
    }
    owner_fixture_stop(&f);
}

/* ---- shm only ------------------------------------------------------------------------------ */

static void test_shm_handshake_refusals_and_unmapping(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 1u << 20, 0);
    kvs_transport_t *t;
    CHECK_STATUS(make_shm(&t), KVS_OK);
    kvs_endpoint_t *ep;
    /* No socket there: not on this host as far as shm can tell. */
    CHECK_STATUS(t->ops->ep_open(t, "127.0.0.1:1", UINT64_MAX, &ep), KVS_UNSUPPORTED);
    CHECK_STATUS(t->ops->ep_open(t, f.endpoint, UINT64_MAX, &ep), KVS_OK);
    /* The owner hands out only the segments it serves. */
    CHECK_STATUS(kvs__shm_map_segment(t, ep, FIX_SEGMENT_ID + 1, UINT64_MAX),
                 KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(kvs__shm_map_segment(t, ep, FIX_SEGMENT_ID, UINT64_MAX), KVS_OK);
    CHECK_EQ_U64(kvs__shm_mapped(t), 1);
    /* The master no longer lists it: unmapped, and a later read maps it afresh. */
    uint64_t live[1] = {FIX_SEGMENT_ID + 5};
    kvs__shm_retain(t, live, 1);
    CHECK_EQ_U64(kvs__shm_mapped(t), 0);
    memset(f.mem.base, 0x42, 4096);
    unsigned char buf[4096];
    struct iovec v = {buf, sizeof(buf)};
    CHECK_STATUS(xfer(t, ep, KVS_XFER_READ, FIX_SEGMENT_ID, 0, &v, 1, 5000), KVS_OK);
    CHECK_EQ_MEM(buf, f.mem.base, sizeof(buf));
    t->ops->destroy(t);
    owner_fixture_stop(&f);
}

/* In a network namespace of its own a reader cannot reach the owner's tcp port, but the
 * socket path is a file: shm still works (the abstract namespace would not). */
static void test_shm_from_another_network_namespace(void)
{
    owner_fixture_t f;
    owner_fixture_start(&f, 4u << 20, 0);
    fill_random(f.mem.base, 4u << 20);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNET) != 0)
            _exit(77);
        kvs_transport_t *tcp, *shm;
        kvs__tcp_config_t tc;
        kvs__tcp_config_init(&tc);
        tc.io_timeout_ms = 500;
        if (kvs__tcp_transport_create(&tc, &tcp) != KVS_OK || make_shm(&shm) != KVS_OK)
            _exit(2);
        unsigned char *dst = malloc(4u << 20);
        struct iovec v = {dst, 4u << 20};
        kvs_endpoint_t *ep;
        kvs_xfer_req_t r = {
            KVS_XFER_READ, NULL, FIX_SEGMENT_ID, 0, 4u << 20, &v, 1, 0, 0, 0, 0, 0, 0, 0};
        kvs_batch_t *b;
        /* tcp: the loopback of the test's namespace is not here. */
        if (tcp->ops->ep_open(tcp, f.endpoint, UINT64_MAX, &ep) == KVS_OK) {
            r.ep = ep;
            if (tcp->ops->submit(tcp, &r, 1, UINT64_MAX, &b) != KVS_OK ||
                tcp->ops->wait(tcp, b, kvs__now_ns() + 2 * KVS_NS_PER_S) == KVS_OK)
                _exit(3);
        }
        if (shm->ops->ep_open(shm, f.endpoint, UINT64_MAX, &ep) != KVS_OK)
            _exit(4);
        r.ep = ep;
        if (shm->ops->submit(shm, &r, 1, UINT64_MAX, &b) != KVS_OK ||
            shm->ops->wait(shm, b, kvs__now_ns() + 2 * KVS_NS_PER_S) != KVS_OK)
            _exit(5);
        _exit(memcmp(dst, f.mem.base, 4u << 20) == 0 ? 0 : 6);
    }
    int st = 0;
    CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st));
    owner_fixture_stop(&f);
    if (WEXITSTATUS(st) == 77)
        kvs_test_skip("no permission to make a network namespace here");
    CHECK_EQ_INT(WEXITSTATUS(st), 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_sizes_and_offsets),
        KVS_TEST_CASE(test_fragmented_destinations),
        KVS_TEST_CASE(test_many_concurrent_requests),
        KVS_TEST_CASE(test_deadline_leaves_no_late_write),
        KVS_TEST_CASE(test_tcp_cancel_after_a_window_neighbour_completed),
        KVS_TEST_CASE(test_peer_death_mid_transfer),
        KVS_TEST_CASE(test_out_of_segment_refused),
        KVS_TEST_CASE(test_shm_handshake_refusals_and_unmapping),
        KVS_TEST_CASE(test_shm_from_another_network_namespace),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
