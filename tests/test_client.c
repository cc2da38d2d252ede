/* Integration: the public client API against real kvstash-server processes on loopback. Every
 * read is checked byte for byte; refused calls must leave destinations and the store as they
 * were. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "client_fixture.h"
#include "client/client_int.h"
#include "common/common_int.h"

#include <kvstash/kvstash.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GUARD 0xA5

typedef struct {
    server_t srv;
    char master[64];
} store_t;

/* A store: owner + embedded master (default mode) with a segment of `seg`, or with `args`. */
static void store_start(store_t *st, const char *seg, const char *const *extra)
{
    const char *args[24] = {"--segment-size", seg};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    server_start(&st->srv, args);
    snprintf(st->master, sizeof(st->master), "127.0.0.1:%u", (unsigned)st->srv.port);
}

static kvs_client_t *client_open(const char *master, uint64_t transfer_ms)
{
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.rpc_timeout_ms = 3000;
    cfg.transfer_timeout_ms = transfer_ms;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    CHECK(c != NULL);
    return c;
}

/* Object bytes are a function of the key and the offset, so any reader can check them. */
static uint8_t pattern_byte(const char *key, uint64_t off)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    uint64_t x = (off + h) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56);
}

static void fill(const char *key, void *buf, uint64_t len)
{
    uint8_t *b = buf;
    for (uint64_t i = 0; i < len; i++)
        b[i] = pattern_byte(key, i);
}

/* Offset of the first wrong byte of key's bytes [off, off + len) in buf, or -1. */
static int64_t mismatch(const char *key, uint64_t off, const void *buf, uint64_t len)
{
    const uint8_t *b = buf;
    for (uint64_t i = 0; i < len; i++) {
        if (b[i] != pattern_byte(key, off + i))
            return (int64_t)(off + i);
    }
    return -1;
}

static bool all_guard(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    for (size_t i = 0; i < len; i++) {
        if (b[i] != GUARD)
            return false;
    }
    return true;
}

static void put_pattern(kvs_client_t *c, const char *key, uint64_t size,
                        const kvs_replicate_config_t *rc)
{
    uint8_t *buf = malloc(size);
    CHECK(buf != NULL);
    fill(key, buf, size);
    CHECK_STATUS(kvs_client_put(c, key, buf, size, rc), KVS_OK);
    free(buf);
}

/* ---- round trips ----------------------------------------------------------------------------- */

static void test_round_trips_1_byte_to_64_mib(void)
{
    store_t st;
    store_start(&st, "160MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000);
    const uint64_t sizes[] = {1, 7, 4096, 65537, (1u << 20) + 3, 64u << 20};
    uint64_t max = 64u << 20;
    uint8_t *src = malloc(max), *dst = malloc(max + 64);
    CHECK(src && dst);
    CHECK_STATUS(kvs_client_register_buffer(c, src, max), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, max + 64), KVS_OK);
    for (size_t i = 0; i < KVS_ARRAY_SIZE(sizes); i++) {
        char key[32];
        uint64_t n = sizes[i];
        /* Copying put, then a zero-copy put of the same bytes under another key. */
        snprintf(key, sizeof(key), "rt-copy-%zu", i);
        put_pattern(c, key, n, NULL);
        char key2[32];
        snprintf(key2, sizeof(key2), "rt-zc-%zu", i);
        fill(key, src, n);
        CHECK_STATUS(kvs_client_put_from(c, key2, src, n, NULL), KVS_OK);
        CHECK_EQ_INT(kvs_client_get_size(c, key), (int64_t)n);
        CHECK_EQ_INT(kvs_client_exists(c, key2), 1);

        /* get_into with a larger buffer: exactly the object's bytes land, the rest is kept. */
        memset(dst, GUARD, n + 64);
        CHECK_EQ_INT(kvs_client_get_into(c, key, dst, n + 64), (int64_t)n);
        CHECK_EQ_INT(mismatch(key, 0, dst, n), -1);
        CHECK(all_guard(dst + n, 64));
        memset(dst, GUARD, n);
        CHECK_EQ_INT(kvs_client_get_into(c, key2, dst, n), (int64_t)n);
        CHECK_EQ_INT(mismatch(key, 0, dst, n), -1);

        void *copy = NULL;
        size_t got = 0;
        CHECK_STATUS(kvs_client_get(c, key, &copy, &got), KVS_OK);
        CHECK_EQ_U64(got, n);
        CHECK_EQ_INT(mismatch(key, 0, copy, n), -1);
        kvs_free(copy);
        CHECK_STATUS(kvs_client_remove(c, key, true), KVS_OK);
        CHECK_STATUS(kvs_client_remove(c, key2, true), KVS_OK);
        CHECK_EQ_INT(kvs_client_exists(c, key), 0);
    }
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    CHECK_EQ_U64(s.put_calls, 2 * KVS_ARRAY_SIZE(sizes));
    CHECK_EQ_U64(s.put_failed_keys, 0);
    CHECK_EQ_U64(s.get_failed_keys, 0);
    CHECK_EQ_U64(s.registered_buffers, 2);
    CHECK_EQ_U64(s.put_latency.count, s.put_calls);
    CHECK(kvs_histogram_quantile_us(&s.get_latency, 1.0) > 0);
    kvs_client_close(c);
    free(src);
    free(dst);
    server_stop(&st.srv);
}

/* The largest legal call: KVS_MAX_BATCH keys of KVS_MAX_KEY_LEN bytes. Its requests outgrow
 * one frame (67 MB of keys against 64 MiB), so the client splits them; every key must still
 * get its own answer. */
static void test_largest_legal_batch(void)
{
    store_t st;
    store_start(&st, "32MiB", NULL);
    /* Generous time-outs: 65,536 keys per call take seconds under ThreadSanitizer. */
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = st.master;
    cfg.rpc_timeout_ms = 120000;
    cfg.transfer_timeout_ms = 120000;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    const size_t n = KVS_MAX_BATCH;
    char *keybytes = malloc(n * (KVS_MAX_KEY_LEN + 1));
    const char **keys = malloc(n * sizeof(*keys));
    /* 8 bytes per key, its index: any mix-up of keys between the parts of a split shows. */
    uint64_t *src = malloc(n * 8), *dst = malloc(n * 8);
    kvs_buf_t *bufs = malloc(n * sizeof(*bufs)), *dbufs = malloc(n * sizeof(*dbufs));
    int *res = malloc(n * sizeof(*res));
    int64_t *got = malloc(n * sizeof(*got));
    CHECK(keybytes && keys && src && dst && bufs && dbufs && res && got);
    for (size_t i = 0; i < n; i++) {
        char *k = keybytes + i * (KVS_MAX_KEY_LEN + 1);
        memset(k, 'k', KVS_MAX_KEY_LEN);
        snprintf(k, 16, "%08zx", i);
        k[8] = '-';
        k[KVS_MAX_KEY_LEN] = '\0';
        keys[i] = k;
        src[i] = 0x5eed000000000000ull | i;
        bufs[i] = (kvs_buf_t){src + i, 8};
        dbufs[i] = (kvs_buf_t){dst + i, 8};
    }
    memset(dst, 0, n * 8);
    CHECK_STATUS(kvs_client_register_buffer(c, src, n * 8), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, n * 8), KVS_OK);
    CHECK_STATUS(kvs_client_batch_exists(c, n, keys, res), KVS_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(res[i], 0);
    CHECK_STATUS(kvs_client_batch_put_from(c, n, keys, bufs, NULL, res), KVS_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_STATUS(res[i], KVS_OK);
    CHECK_STATUS(kvs_client_batch_exists(c, n, keys, res), KVS_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(res[i], 1);
    CHECK_STATUS(kvs_client_batch_get_into(c, n, keys, dbufs, got), KVS_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(got[i], 8);
    CHECK_EQ_MEM(dst, src, n * 8);
    /* The CLI lists them all too: pages that each fit a frame (67 MB of keys in all). */
    char out[64];
    snprintf(out, sizeof(out), "/tmp/kvs-test-ls-%d", (int)getpid());
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(out, "w", stdout);
        if (f == NULL)
            _exit(126);
        execl(KVS_CLI_PATH, KVS_CLI_PATH, "--master", st.master, "ls", "--limit", "65536",
              (char *)NULL);
        _exit(127);
    }
    int wst = 0;
    CHECK_EQ_INT(waitpid(pid, &wst, 0), pid);
    CHECK(WIFEXITED(wst));
    CHECK_EQ_INT(WEXITSTATUS(wst), 0);
    FILE *lf = fopen(out, "r");
    CHECK(lf != NULL);
    size_t lines = 0;
    for (int ch = fgetc(lf); ch != EOF; ch = fgetc(lf))
        lines += ch == '\n';
    fclose(lf);
    unlink(out);
    CHECK_EQ_U64(lines, n);
    kvs_client_close(c);
    free(keybytes);
    free(keys);
    free(src);
    free(dst);
    free(bufs);
    free(dbufs);
    free(res);
    free(got);
    server_stop(&st.srv);
}

/* A port free on loopback right now. */
static uint16_t free_port(void)
{
    int fd = kvs__tcp_listen("127.0.0.1", 0, 1);
    CHECK(fd >= 0);
    uint16_t port = kvs__sock_port(fd);
    close(fd);
    return port;
}

/* kvs_client_get into `buf`: the object's size, or a negative status. */
static int64_t get_copy(kvs_client_t *c, const char *key, void *buf, size_t cap)
{
    void *p = NULL;
    size_t n = 0;
    int rc = kvs_client_get(c, key, &p, &n);
    if (rc != KVS_OK)
        return rc;
    CHECK_CMP_U64(n, <=, cap);
    memcpy(buf, p, n);
    kvs_free(p);
    return (int64_t)n;
}

/* A store killed (-9) and restarted on the same ports under a client that lives through it:
 * the client must not read or write the dead segment it still has mapped. Before segment ids
 * were random, the new master handed out the same id, and the client's new puts went into its
 * mapping of the dead segment (reported 0, read back as zeros by everyone else) and its reads
 * of new keys returned the dead segment's bytes as success. */
static void test_restart_on_the_same_ports_under_a_shm_client(void)
{
    char port[8], data_port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)free_port());
    snprintf(data_port, sizeof(data_port), "%u", (unsigned)free_port());
    const char *args[] = {"--port", port, "--data-port", data_port, NULL};
    store_t st;
    store_start(&st, "32MiB", args);
    kvs_client_t *c = client_open_protocol(st.master, "shm");
    const uint64_t size = 1u << 20;
    put_pattern(c, "old", size, NULL);
    uint8_t *buf = malloc(size);
    CHECK(buf != NULL);
    CHECK_EQ_INT(get_copy(c, "old", buf, size), (int64_t)size);
    kvs_client_stats_t s0;
    CHECK_STATUS(kvs_client_get_stats(c, &s0), KVS_OK);
    CHECK(s0.shm_transfers > 0); /* the dead segment will stay mapped in this client */

    server_kill(&st.srv);
    store_start(&st, "32MiB", args);
    CHECK_EQ_INT(st.srv.port, atoi(port));

    /* The new store starts empty. (The first call may find the old connection broken: it
     * fails with RPC_FAIL and the next reconnects; retrying is "Calls that keep their
     * deadline"'s.) */
    int ex = kvs_client_exists(c, "old");
    if (ex == KVS_RPC_FAIL)
        ex = kvs_client_exists(c, "old");
    CHECK_EQ_INT(ex, 0);
    /* ...and a put through the surviving client lands in the new segment. */
    uint8_t *src = malloc(size);
    CHECK(src != NULL);
    fill("new", src, size);
    int rc = kvs_client_put(c, "new", src, size, NULL);
    CHECK_STATUS(rc, KVS_OK);
    memset(buf, 0, size);
    CHECK_EQ_INT(get_copy(c, "new", buf, size), (int64_t)size);
    CHECK_EQ_INT(mismatch("new", 0, buf, size), -1);
    /* Everyone else reads the same bytes. */
    kvs_client_t *d = client_open_protocol(st.master, "tcp");
    memset(buf, 0, size);
    CHECK_EQ_INT(get_copy(d, "new", buf, size), (int64_t)size);
    CHECK_EQ_INT(mismatch("new", 0, buf, size), -1);
    kvs_client_stats_t s1;
    CHECK_STATUS(kvs_client_get_stats(c, &s1), KVS_OK);
    CHECK(s1.shm_transfers > s0.shm_transfers); /* still over shm, to the new segment */
    kvs_client_close(d);
    kvs_client_close(c);
    free(buf);
    free(src);
    server_stop(&st.srv);
}

/* An owner stopped (SIGSTOP) with a put's bytes queued in its sockets; the put times out and
 * is revoked, and another client asks for the space; then the owner resumes and processes
 * the stale bytes. The space must not be handed out before the owner has fenced the put, and
 * the next object there must read back exactly. (The space used to be reused at once: the
 * next object, written over shm while the owner was stopped, was then overwritten by the
 * stale put's bytes and read back wrong as success.) */
static void test_stopped_owner_resumes_after_its_put_was_revoked(void)
{
    server_t m, o;
    const char *margs[] = {"--master-only", "--heartbeat-timeout-ms", "3000", NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    const char *oargs[] = {"--owner-only", "--master", master, "--segment-size", "8MiB", NULL};
    server_start(&o, oargs);
    setenv("KVS_TCP_CONNECTIONS", "1", 1); /* the writer's bytes queue on one connection */
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.protocol = "tcp";
    cfg.rpc_timeout_ms = 3000;
    cfg.transfer_timeout_ms = 500;
    kvs_client_t *w = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &w), KVS_OK);
    unsetenv("KVS_TCP_CONNECTIONS");
    kvs_client_t *x = client_open_protocol(master, "shm");
    put_pattern(w, "warm-w", 4096, NULL); /* connections and mappings in place */
    put_pattern(x, "warm-x", 4096, NULL);
    const uint64_t size = 6u << 20;
    uint8_t *buf = malloc(size);
    CHECK(buf != NULL);
    CHECK_EQ_INT(get_copy(x, "warm-w", buf, size), 4096);

    CHECK_EQ_INT(kill(o.pid, SIGSTOP), 0);
    uint8_t *src = malloc(size);
    fill("stale", src, size);
    int rc = kvs_client_put(w, "stale", src, size, NULL);
    CHECK(rc == KVS_TIMED_OUT || rc == KVS_TRANSFER_FAIL); /* and revoked */
    CHECK_EQ_INT(kvs_client_exists(x, "stale"), 0);
    fill("next", src, size);
    int xrc = kvs_client_put(x, "next", src, size, NULL);
    CHECK_STATUS(xrc, KVS_NO_AVAILABLE_HANDLE); /* the revoked put's space is not free yet */
    CHECK_EQ_INT(kill(o.pid, SIGCONT), 0);

    /* Once the owner has fenced the put, the space comes back; the next object is exact. */
    for (int i = 0; i < 100 && xrc == KVS_NO_AVAILABLE_HANDLE; i++) {
        usleep(100000);
        xrc = kvs_client_put(x, "next", src, size, NULL);
    }
    CHECK_STATUS(xrc, KVS_OK);
    for (int pass = 0; pass < 2; pass++) {
        memset(buf, 0, size);
        CHECK_EQ_INT(get_copy(x, "next", buf, size), (int64_t)size);
        CHECK_EQ_INT(mismatch("next", 0, buf, size), -1);
        CHECK_EQ_INT(get_copy(w, "next", buf, size), (int64_t)size); /* over tcp too */
        CHECK_EQ_INT(mismatch("next", 0, buf, size), -1);
        usleep(300000);
    }
    free(src);
    free(buf);
    kvs_client_close(w);
    kvs_client_close(x);
    server_stop(&o);
    server_stop(&m);
}

/* Where `key` lives: its first replica's segment id and offset (an internal LOOKUP). */
static void locate(kvs_client_t *c, const char *key, uint64_t *seg_p, uint64_t *off_p)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__placement_rsp_t pr;
    CHECK_STATUS(kvs__client_keys_call(c, KVS_MSG_LOOKUP, 0, 1, &k, NULL, &a, NULL, &pr,
                                       kvs__client_rpc_deadline(c)),
                 KVS_OK);
    CHECK_STATUS(pr.objs[0].status, KVS_OK);
    *seg_p = pr.objs[0].reps[0].segment_id;
    *off_p = pr.objs[0].reps[0].offset;
    kvs__arena_free(&a);
}

/* An owner dropped by the master (stopped past the heartbeat time-out) mounts again when it
 * resumes, under a new id and in fresh memory: a read planned before (a lookup's lease
 * outlives the master's memory of the segment) that copies from its old shm mapping afterwards
 * still sees the old object, never the new segment's. (The re-mount used to serve the same
 * memfd, so the old mapping showed the next object at that offset.) */
static void test_remounted_segment_gets_fresh_memory(void)
{
    server_t m, o;
    const char *margs[] = {"--master-only", "--heartbeat-timeout-ms", "600", NULL};
    server_start(&m, margs);
    char master[64], endpoint[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    const char *oargs[] = {"--owner-only", "--master", master, "--segment-size", "4MiB", NULL};
    server_start(&o, oargs);
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%u", (unsigned)o.port); /* data port */
    setenv("KVS_SHM_SWEEP_MS", "0", 1); /* keep the old mapping, as a read in flight would */
    kvs_client_t *c = client_open_protocol(master, "shm");
    unsetenv("KVS_SHM_SWEEP_MS");
    const uint64_t size = 64u << 10;
    put_pattern(c, "before", size, NULL);
    uint64_t seg1, off1;
    locate(c, "before", &seg1, &off1);

    CHECK_EQ_INT(kill(o.pid, SIGSTOP), 0);
    usleep(1200000); /* the master drops the silent segment */
    CHECK_EQ_INT(kill(o.pid, SIGCONT), 0);
    uint64_t seg2 = 0, off2 = 0;
    for (int i = 0; i < 100; i++) { /* the owner mounts again on its next heartbeat */
        usleep(50000);
        if (kvs_client_put(c, "after", "x", 1, NULL) == KVS_OK)
            break;
    }
    CHECK_STATUS(kvs_client_remove(c, "after", true), KVS_OK);
    put_pattern(c, "after", size, NULL);
    locate(c, "after", &seg2, &off2);
    CHECK(seg2 != seg1);
    CHECK_EQ_U64(off2, off1); /* the new object sits where the old one sat */

    /* The stale read: the old segment id through the cached mapping. */
    kvs_endpoint_t *ep;
    CHECK_STATUS(c->shm->ops->ep_open(c->shm, endpoint, UINT64_MAX, &ep), KVS_OK);
    uint8_t *buf = malloc(size);
    struct iovec v = {buf, size};
    kvs_xfer_req_t r = {.op = KVS_XFER_READ,
                        .ep = ep,
                        .segment_id = seg1,
                        .offset = off1,
                        .length = size,
                        .iov = &v,
                        .iovcnt = 1};
    kvs_batch_t *b;
    CHECK_STATUS(c->shm->ops->submit(c->shm, &r, 1, UINT64_MAX, &b), KVS_OK);
    int rc = c->shm->ops->wait(c->shm, b, kvs__now_ns() + 5 * KVS_NS_PER_S);
    if (rc == KVS_OK)
        CHECK_EQ_INT(mismatch("before", 0, buf, size), -1);
    free(buf);
    kvs_client_close(c);
    server_stop(&o);
    server_stop(&m);
}

typedef struct {
    kvs_client_t *c;
    const char *key;
    uint8_t *buf;
    uint64_t size;
    int64_t result;
} copy_read_t;

static void *copy_read_main(void *arg)
{
    copy_read_t *r = arg;
    r->result = get_copy(r->c, r->key, r->buf, r->size);
    return NULL;
}

/* A forced remove while a reader is inside its lease, then a new object of the same size: the
 * reader must get the old object's bytes or an error, never the new object's. (The space used
 * to go back to the allocator at once; the new put took it over shm while the reader's tcp
 * read sat at the slow owner, and the reader returned the new bytes as success.) */
static void test_forced_remove_during_a_read(void)
{
    kvs_test_need_hooks();                           /* a slow owner: KVS_DATA_INJECT_DELAY_US */
    setenv("KVS_DATA_INJECT_DELAY_US", "400000", 1); /* tcp data requests wait 400 ms */
    store_t st;
    store_start(&st, "16MiB", NULL);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    kvs_client_t *w = client_open_protocol(st.master, "shm"),
                 *r = client_open_protocol(st.master, "tcp");
    const uint64_t size = 1u << 20;
    put_pattern(w, "victim", size, NULL);
    copy_read_t sr = {r, "victim", malloc(size), size, 0};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, copy_read_main, &sr), 0);
    usleep(150000); /* the reader has its lease and waits at the owner */
    CHECK_STATUS(kvs_client_remove(w, "victim", true), KVS_OK);
    CHECK_EQ_INT(kvs_client_exists(w, "victim"), 0);
    put_pattern(w, "newcomer", size, NULL); /* over shm: lands at once */
    CHECK_EQ_INT(pthread_join(t, NULL), 0);
    if (sr.result >= 0) {
        CHECK_EQ_INT(sr.result, (int64_t)size);
        CHECK_EQ_INT(mismatch("victim", 0, sr.buf, size), -1);
    }
    /* The tombstone kept the space from the new object. */
    uint8_t *nb = malloc(size);
    CHECK_EQ_INT(get_copy(w, "newcomer", nb, size), (int64_t)size);
    CHECK_EQ_INT(mismatch("newcomer", 0, nb, size), -1);
    free(nb);
    free(sr.buf);
    kvs_client_close(w);
    kvs_client_close(r);
    server_stop(&st.srv);
}

static void test_batch_put_from_multi_gathers_in_order(void)
{
    store_t st;
    store_start(&st, "64MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000);
    enum { NK = 5 };
    uint64_t size = 300000;
    uint8_t *pool = malloc(NK * size), *dst = malloc(size);
    CHECK(pool && dst);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, NK * size), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, size), KVS_OK);
    const char *keys[NK] = {"g0", "g1", "g2", "g3", "g4"};
    kvs_buf_t frags[NK][3];
    const kvs_buf_t *bufs[NK];
    size_t nbufs[NK];
    /* Each object is gathered from 3 pieces stored in reverse order in the pool. */
    for (int i = 0; i < NK; i++) {
        uint8_t *base = pool + (uint64_t)i * size;
        uint64_t a = 1000 + (uint64_t)i * 777, b = 150000;
        uint64_t lens[3] = {a, b, size - a - b};
        uint64_t off = 0;
        for (int j = 0; j < 3; j++) {
            uint8_t *p = base + size - off - lens[j];
            fill(keys[i], dst, size);
            memcpy(p, dst + off, lens[j]);
            frags[i][j] = (kvs_buf_t){p, lens[j]};
            off += lens[j];
        }
        bufs[i] = frags[i];
        nbufs[i] = 3;
    }
    int results[NK];
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.prefer_alloc_in_same_node = true;
    CHECK_STATUS(kvs_client_batch_put_from_multi(c, NK, keys, bufs, nbufs, &rc, results), KVS_OK);
    for (int i = 0; i < NK; i++) {
        CHECK_STATUS(results[i], KVS_OK);
        memset(dst, 0, size);
        CHECK_EQ_INT(kvs_client_get_into(c, keys[i], dst, size), (int64_t)size);
        CHECK_EQ_INT(mismatch(keys[i], 0, dst, size), -1);
    }
    /* batch_put_from: one buffer per key; a present key fails alone. */
    const char *keys2[3] = {"h0", "g2", "h1"};
    kvs_buf_t one[3] = {{pool, 100}, {pool, 100}, {pool + 100, 200}};
    CHECK_STATUS(kvs_client_batch_put_from(c, 3, keys2, one, NULL, results), KVS_OK);
    CHECK_STATUS(results[0], KVS_OK);
    CHECK_STATUS(results[1], KVS_OBJECT_ALREADY_EXISTS);
    CHECK_STATUS(results[2], KVS_OK);
    CHECK_EQ_INT(kvs_client_get_size(c, "h1"), 200);
    CHECK_EQ_INT(kvs_client_get_size(c, "g2"), (int64_t)size);
    kvs_client_close(c);
    free(pool);
    free(dst);
    server_stop(&st.srv);
}

/* ---- multi-buffer reads ---------------------------------------------------------------------- */

/* Splits `size` bytes into fragments of irregular lengths placed at shuffled positions of
 * `pool`; returns the count. */
static size_t scatter_layout(uint8_t *pool, uint64_t size, kvs_buf_t *frags, size_t max)
{
    size_t n = 0;
    uint64_t off = 0;
    while (off < size) {
        CHECK(n < max);
        uint64_t want = 1 + kvs_test_rand() % 20000; /* KVS_MIN evaluates twice */
        uint64_t len = KVS_MIN(want, size - off);
        frags[n++] = (kvs_buf_t){NULL, len};
        off += len;
    }
    /* Place the fragments in the pool in reverse order with gaps of guard bytes. */
    uint64_t pos = 0;
    for (size_t i = n; i-- > 0;) {
        frags[i].ptr = pool + pos;
        pos += frags[i].len + 1 + kvs_test_rand() % 64;
    }
    return n;
}

static bool frags_match(const char *key, const kvs_buf_t *f, size_t n)
{
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (mismatch(key, off, f[i].ptr, f[i].len) != -1)
            return false;
        off += f[i].len;
    }
    return true;
}

static bool frags_guarded(const kvs_buf_t *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!all_guard(f[i].ptr, f[i].len))
            return false;
    }
    return true;
}

static void multi_buffer_case(bool grouped)
{
    store_t st;
    store_start(&st, "64MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000);
    const uint64_t size_a = 1000003, size_b = 77777;
    put_pattern(c, "A", size_a, NULL);
    put_pattern(c, "B", size_b, NULL);
    size_t pool_len = 8u << 20;
    uint8_t *pool = malloc(pool_len), *unreg = malloc(32768);
    CHECK(pool && unreg);
    memset(pool, GUARD, pool_len);
    memset(unreg, GUARD, 32768);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
    /* Keys: A, missing, B, A again (other destinations), B with one byte too few, B with a
     * fragment outside registered memory, another missing. */
    enum { NK = 7 };
    const char *keys[NK] = {"A", "nope", "B", "A", "B", "B", "nope2"};
    kvs_buf_t f[NK][256];
    size_t nbufs[NK];
    const kvs_buf_t *bufs[NK];
    uint64_t region = pool_len / NK;
    for (int i = 0; i < NK; i++) {
        uint64_t size = strcmp(keys[i], "A") == 0 ? size_a : size_b;
        nbufs[i] = scatter_layout(pool + (uint64_t)i * region, size, f[i], 256);
        bufs[i] = f[i];
        CHECK(f[i][0].len + ((uint8_t *)f[i][0].ptr - pool) <= (uint64_t)(i + 1) * region);
    }
    f[4][nbufs[4] - 1].len -= 1;               /* sums to size_b - 1 */
    f[5][0] = (kvs_buf_t){unreg, f[5][0].len}; /* not registered */
    CHECK(f[5][0].len <= 32768);
    int64_t res[NK];
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, NK, keys, bufs, nbufs, grouped, res),
                 KVS_OK);
    CHECK_EQ_INT(res[0], (int64_t)size_a);
    CHECK_STATUS(res[1], KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_INT(res[2], (int64_t)size_b);
    CHECK_EQ_INT(res[3], (int64_t)size_a);
    CHECK_STATUS(res[4], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[5], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[6], KVS_OBJECT_NOT_FOUND);
    CHECK(frags_match("A", f[0], nbufs[0]));
    CHECK(frags_match("B", f[2], nbufs[2]));
    CHECK(frags_match("A", f[3], nbufs[3]));
    /* Refused and missing keys: not one destination byte written. */
    CHECK(frags_guarded(f[1], nbufs[1]));
    CHECK(frags_guarded(f[4], nbufs[4]));
    CHECK(frags_guarded(f[5], nbufs[5]));
    CHECK(frags_guarded(f[6], nbufs[6]));
    /* The gaps between fragments were never written either. */
    for (int i = 0; i < NK; i++) {
        if (i == 5)
            continue;
        uint8_t *end = (uint8_t *)f[i][0].ptr + f[i][0].len;
        for (size_t j = 0; j + 1 < nbufs[i]; j++) {
            uint8_t *next = (uint8_t *)f[i][j + 1].ptr;
            uint8_t *gap = (uint8_t *)f[i][j + 1].ptr + f[i][j + 1].len;
            CHECK(gap < (uint8_t *)f[i][j].ptr);
            CHECK(all_guard(gap, (size_t)((uint8_t *)f[i][j].ptr - gap)));
            (void)next;
        }
        CHECK(all_guard(end, 1));
    }
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    CHECK_EQ_U64(s.get_failed_keys, 4);
    size_t nfrag = 0;
    for (int i = 0; i < NK; i++)
        nfrag += nbufs[i];
    CHECK_EQ_U64(s.planned_fragments, nfrag);
    CHECK(s.plan_ns_total > 0);
    /* Direct: one submission per readable key; grouped: one for the one owner. */
    CHECK_EQ_U64(s.get_submissions, grouped ? 1 : 3);
    CHECK_EQ_U64(s.get_grouped_calls, grouped ? 1 : 0);
    kvs_client_close(c);
    free(pool);
    free(unreg);
    server_stop(&st.srv);
}

/* Puts from any memory (gathered, one batch), registered-range checks, the replica clear of a
 * client's own objects, and the config's group count rule. */
static void test_any_memory_puts_and_replica_clear(void)
{
    store_t st;
    store_start(&st, "64MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000), *other = client_open(st.master, 5000);
    enum { SZ = 70000 };
    uint8_t *src = malloc(SZ), *dst = malloc(SZ); /* never registered */
    CHECK(src && dst);
    fill("any", src, SZ);
    kvs_buf_t two[2] = {{src, 1000}, {src + 1000, SZ - 1000}};
    const kvs_buf_t *bufs[1] = {two};
    size_t nbufs[1] = {2};
    const char *key[1] = {"any"};
    int res[2];
    CHECK_STATUS(kvs_client_batch_put_multi(c, 1, key, bufs, nbufs, NULL, false, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    void *got = NULL;
    size_t n = 0;
    CHECK_STATUS(kvs_client_get(c, "any", &got, &n), KVS_OK);
    CHECK_EQ_U64(n, SZ);
    CHECK_EQ_INT(mismatch("any", 0, got, SZ), -1);
    kvs_free(got);
    /* upsert = true replaces; a plain put of a present key is -705. */
    memset(src, 0x33, SZ);
    CHECK_STATUS(kvs_client_batch_put_multi(c, 1, key, bufs, nbufs, NULL, false, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OBJECT_ALREADY_EXISTS);
    CHECK_STATUS(kvs_client_batch_put_multi(c, 1, key, bufs, nbufs, NULL, true, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_EQ_INT(kvs_client_get_into(c, "any", src, SZ), -600); /* unregistered destination */
    CHECK_STATUS(kvs_client_register_buffer(c, dst, SZ), KVS_OK);
    CHECK_EQ_INT(kvs_client_get_into(c, "any", dst, SZ), SZ);
    CHECK_EQ_INT(dst[0], 0x33);
    CHECK_EQ_INT(dst[SZ - 1], 0x33);
    /* kvs_client_batch_put: one buffer each. */
    const char *keys2[2] = {"one", "two"};
    kvs_buf_t single[2] = {{src, 10}, {src + 10, 20}};
    CHECK_STATUS(kvs_client_batch_put(c, 2, keys2, single, NULL, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_STATUS(res[1], KVS_OK);
    CHECK_EQ_INT(kvs_client_get_size(c, "two"), 20);
    /* Registered ranges. */
    CHECK_EQ_INT(kvs_client_buffer_domain(c, dst, SZ), -1);
    CHECK_EQ_INT(kvs_client_buffer_domain(c, dst + 10, 10), -1);
    CHECK_STATUS(kvs_client_buffer_domain(c, dst, SZ + 1), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_buffer_domain(c, src, 10), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_buffer_domain(c, NULL, 10), KVS_INVALID_PARAMS);
    /* Replica clear: only the writer's own objects; "" (or NULL) clears whole objects. */
    const char *both[2] = {"one", "absent"};
    CHECK_STATUS(kvs_client_batch_replica_clear(other, 2, both, NULL, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[1], KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_INT(kvs_client_get_size(c, "one"), 10); /* its lookup's lease goes back at once */
    CHECK_STATUS(kvs_client_batch_replica_clear(c, 1, both, "no-such-segment", res), KVS_OK);
    CHECK_STATUS(res[0], KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(kvs_client_batch_replica_clear(c, 1, both, "", res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_EQ_INT(kvs_client_get_size(c, "one"), KVS_OBJECT_NOT_FOUND);
    /* group_ids: one for all keys, or one per key; another count is refused up front. */
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    const char *groups[3] = {"g", "h", "i"};
    rc.group_ids = groups;
    rc.ngroup_ids = 3;
    const char *keys3[2] = {"p", "q"};
    CHECK_STATUS(kvs_client_batch_put(c, 2, keys3, single, &rc, res), KVS_INVALID_PARAMS);
    rc.ngroup_ids = 2;
    CHECK_STATUS(kvs_client_batch_put(c, 2, keys3, single, &rc, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    rc.ngroup_ids = 1;
    const char *keys4[2] = {"r", "s"};
    CHECK_STATUS(kvs_client_batch_put(c, 2, keys4, single, &rc, res), KVS_OK);
    CHECK_STATUS(res[1], KVS_OK);
    free(src);
    kvs_client_unregister_buffer(c, dst);
    free(dst);
    kvs_client_close(other);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_multi_buffers_direct(void)
{
    multi_buffer_case(false);
}

static void test_multi_buffers_grouped(void)
{
    multi_buffer_case(true);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void test_bad_input_is_refused_and_changes_nothing(void)
{
    store_t st;
    store_start(&st, "16MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000);
    kvs_client_config_t cfg;
    kvs_client_t *other = NULL;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = "not a host:port:x";
    CHECK_STATUS(kvs_client_open(&cfg, &other), KVS_INVALID_PARAMS);
    CHECK(strstr(kvs_last_error(), "HOST:PORT") != NULL);
    cfg.master = st.master;
    cfg.protocol = "carrier-pigeon";
    CHECK_STATUS(kvs_client_open(&cfg, &other), KVS_INVALID_PARAMS);
    cfg.protocol = "tcp";
    cfg.transfer_timeout_ms = 0;
    CHECK_STATUS(kvs_client_open(&cfg, &other), KVS_INVALID_PARAMS);
    CHECK(other == NULL);
    cfg.master = "127.0.0.1:1"; /* nothing listens there */
    cfg.transfer_timeout_ms = 1000;
    cfg.rpc_timeout_ms = 500;
    CHECK_STATUS(kvs_client_open(&cfg, &other), KVS_RPC_FAIL);
    CHECK(other == NULL);

    char data[64] = "payload", longkey[1100];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    CHECK_STATUS(kvs_client_put(NULL, "k", data, 8, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put(c, NULL, data, 8, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put(c, "", data, 8, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put(c, longkey, data, 8, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put(c, "k", NULL, 8, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put(c, "k", data, 0, NULL), KVS_INVALID_PARAMS);
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.replica_num = 0;
    CHECK_STATUS(kvs_client_put(c, "k", data, 8, &rc), KVS_INVALID_PARAMS);
    rc.replica_num = 17;
    CHECK_STATUS(kvs_client_put(c, "k", data, 8, &rc), KVS_INVALID_PARAMS);
    /* Zero-copy puts need registered memory. */
    CHECK_STATUS(kvs_client_put_from(c, "k", data, 8, NULL), KVS_INVALID_PARAMS);
    CHECK(strstr(kvs_last_error(), "registered") != NULL);
    CHECK_STATUS(kvs_client_put(c, "big", data, (size_t)1 << 30, NULL), KVS_NO_AVAILABLE_HANDLE);
    CHECK_EQ_INT(kvs_client_exists(c, "k"), 0);
    CHECK_EQ_INT(kvs_client_exists(c, "big"), 0);

    /* Registration. */
    CHECK_STATUS(kvs_client_register_buffer(c, NULL, 10), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_register_buffer(c, data, 0), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_register_buffer(c, data, 32), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, data + 16, 32), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_register_buffer(c, data + 32, 32), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(c, data + 1), KVS_INVALID_PARAMS);
    /* A fragment straddling two registered buffers is in no single one. */
    CHECK_STATUS(kvs_client_put_from(c, "k", data + 16, 32, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_put_from(c, "k", data + 8, 8, NULL), KVS_OK);

    /* An existing key is refused; objects are immutable. */
    CHECK_STATUS(kvs_client_put(c, "k", data, 8, NULL), KVS_OBJECT_ALREADY_EXISTS);
    /* Reads: too small a buffer is refused before any I/O and left untouched. */
    memset(data, GUARD, 8);
    CHECK_STATUS(kvs_client_get_into(c, "k", data, 7), KVS_INVALID_PARAMS);
    CHECK(all_guard(data, 7));
    CHECK_STATUS(kvs_client_get_into(c, "nope", data, 8), KVS_OBJECT_NOT_FOUND);
    int64_t r64;
    const char *keys[1] = {"k"};
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 0, keys, NULL, NULL, false, &r64),
                 KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_batch_get_into(c, 1, keys, NULL, &r64), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_get_size(c, ""), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_remove(c, NULL, false), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_remove(c, "nope", false), KVS_OBJECT_NOT_FOUND);
    int r[2];
    const char *two[2] = {"k", NULL};
    CHECK_STATUS(kvs_client_batch_exists(c, 2, two, r), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_get_stats(c, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_mount_segment(c, 0, NULL, NULL), KVS_INVALID_PARAMS);
    /* The store holds exactly the one object that was accepted. */
    CHECK_EQ_INT(kvs_client_get_size(c, "k"), 8);
    CHECK_STATUS(kvs_client_unregister_buffer(c, data), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(c, data), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_unregister_buffer(c, data + 32), KVS_OK);
    kvs_client_close(c);
    kvs_client_close(NULL);
    server_stop(&st.srv);
}

/* ---- concurrency ----------------------------------------------------------------------------- */

enum { WORKERS = 6, WORKER_KEYS = 24 };

typedef struct {
    kvs_client_t *c;
    const char *prefix;
    int id;
    atomic_int *published;
    int errors;
} worker_t;

static uint64_t worker_size(int w, int k)
{
    return 1 + (uint64_t)((w * 7919 + k * 104729) % 400000);
}

/* Puts its own keys and reads everyone's published keys into scattered registered pages. */
static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint8_t *pool = malloc(1 << 20);
    if (pool == NULL || kvs_client_register_buffer(w->c, pool, 1 << 20) != KVS_OK) {
        w->errors++;
        free(pool);
        return NULL;
    }
    for (int k = 0; k < WORKER_KEYS; k++) {
        char key[64];
        snprintf(key, sizeof(key), "%s-w%d-k%d", w->prefix, w->id, k);
        uint64_t size = worker_size(w->id, k);
        uint8_t *buf = malloc(size);
        fill(key, buf, size);
        if (kvs_client_put(w->c, key, buf, size, NULL) != KVS_OK)
            w->errors++;
        free(buf);
        atomic_fetch_add(&w->published[w->id], 1);
        /* Read a few keys of other workers. */
        for (int o = 0; o < WORKERS; o++) {
            int have = atomic_load(&w->published[o]);
            if (have == 0)
                continue;
            int kk = (int)(kvs_test_rand() % (uint64_t)have);
            char okey[64];
            snprintf(okey, sizeof(okey), "%s-w%d-k%d", w->prefix, o, kk);
            uint64_t osize = worker_size(o, kk);
            kvs_buf_t frags[64];
            size_t n = 0;
            uint64_t page = 8192 + (uint64_t)o * 1000;
            for (uint64_t off = 0; off < osize; off += page, n++)
                frags[n] = (kvs_buf_t){pool + (1 << 20) - (n + 1) * 16384,
                                       (size_t)KVS_MIN(page, osize - off)};
            const kvs_buf_t *bp = frags;
            const char *kp = okey;
            int64_t res = 0;
            int rc = kvs_client_batch_get_into_multi_buffers(w->c, 1, &kp, &bp, &n, o % 2, &res);
            if (rc != KVS_OK || res != (int64_t)osize || !frags_match(okey, frags, n))
                w->errors++;
        }
    }
    if (kvs_client_unregister_buffer(w->c, pool) != KVS_OK)
        w->errors++;
    free(pool);
    return NULL;
}

static int run_workers(const char *master, const char *prefix)
{
    kvs_client_t *c = client_open(master, 5000);
    atomic_int published[WORKERS] = {0};
    worker_t w[WORKERS];
    pthread_t t[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        w[i] = (worker_t){c, prefix, i, published, 0};
        CHECK_EQ_INT(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    CHECK_EQ_U64(s.put_keys, WORKERS * WORKER_KEYS);
    CHECK_EQ_U64(s.registered_buffers, 0);
    kvs_client_close(c);
    return errors;
}

static void test_threads_share_one_client(void)
{
    store_t st;
    store_start(&st, "128MiB", NULL);
    CHECK_EQ_INT(run_workers(st.master, "thr"), 0);
    server_stop(&st.srv);
}

static void test_processes_read_each_others_keys(void)
{
    store_t st;
    store_start(&st, "256MiB", NULL);
    enum { PROCS = 3 };
    pid_t pids[PROCS];
    fflush(stdout);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            char prefix[16];
            snprintf(prefix, sizeof(prefix), "p%d", p);
            int errors = run_workers(st.master, prefix);
            /* Then every key of every process that has finished putting. */
            _exit(errors == 0 ? 0 : 1);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int status;
        CHECK_EQ_INT(waitpid(pids[p], &status, 0), pids[p]);
        CHECK(WIFEXITED(status));
        CHECK_EQ_INT(WEXITSTATUS(status), 0);
    }
    /* Cross-process: this process reads every key the others wrote. */
    kvs_client_t *c = client_open(st.master, 5000);
    for (int p = 0; p < PROCS; p++) {
        for (int w = 0; w < WORKERS; w++) {
            for (int k = 0; k < WORKER_KEYS; k += 5) {
                char key[64];
                snprintf(key, sizeof(key), "p%d-w%d-k%d", p, w, k);
                void *data;
                size_t size;
                CHECK_STATUS(kvs_client_get(c, key, &data, &size), KVS_OK);
                CHECK_EQ_U64(size, worker_size(w, k));
                CHECK_EQ_INT(mismatch(key, 0, data, size), -1);
                kvs_free(data);
            }
        }
    }
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- eviction and leases --------------------------------------------------------------------- */

static void test_eviction_makes_room_for_new_puts(void)
{
    store_t st;
    store_start(&st, "16MiB", NULL);
    kvs_client_t *c = client_open(st.master, 5000);
    /* 64 MiB through a 16 MiB store: every put succeeds, old keys make way for new ones. */
    enum { N = 64 };
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof(key), "ev-%d", i);
        put_pattern(c, key, 1 << 20, NULL);
    }
    CHECK_EQ_INT(kvs_client_exists(c, "ev-0"), 0);
    CHECK_STATUS(kvs_client_get_size(c, "ev-0"), KVS_OBJECT_NOT_FOUND);
    int present = 0;
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof(key), "ev-%d", i);
        present += kvs_client_exists(c, key) == 1;
    }
    CHECK(present >= 8 && present <= 16);
    /* The newest key survived and reads back exactly. */
    void *data;
    size_t size;
    CHECK_STATUS(kvs_client_get(c, "ev-63", &data, &size), KVS_OK);
    CHECK_EQ_U64(size, 1 << 20);
    CHECK_EQ_INT(mismatch("ev-63", 0, data, size), -1);
    kvs_free(data);
    kvs_client_close(c);
    server_stop(&st.srv);
}

typedef struct {
    kvs_client_t *c;
    void *buf;
    int64_t result;
} lease_read_t;

static void *lease_read_main(void *arg)
{
    lease_read_t *r = arg;
    r->result = kvs_client_get_into(r->c, "L", r->buf, 5000);
    return NULL;
}

static void test_leases_protect_reads_and_expire(void)
{
    kvs_test_need_hooks(); /* a slow owner: KVS_DATA_INJECT_DELAY_US */
    /* Every data request stalls 400 ms; leases last 250 ms. Over tcp: the stall is on its data
     * path (shm reads never ask the owner). */
    setenv("KVS_PROTOCOL", "tcp", 1);
    setenv("KVS_DATA_INJECT_DELAY_US", "400000", 1);
    const char *extra[] = {"--lease-ms", "250", NULL};
    store_t st;
    store_start(&st, "16MiB", extra);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    kvs_client_t *c = client_open(st.master, 3000), *r = client_open(st.master, 3000);
    put_pattern(c, "L", 5000, NULL);
    /* A read in progress leases the object: another client's removal is refused until the
     * lease ends (or forced). */
    uint8_t *buf = malloc(5000);
    CHECK_STATUS(kvs_client_register_buffer(r, buf, 5000), KVS_OK);
    lease_read_t lr = {r, buf, 0};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, lease_read_main, &lr), 0);
    usleep(100000);
    CHECK_STATUS(kvs_client_remove(c, "L", false), KVS_OBJECT_HAS_LEASE);
    /* A read whose transfer outlasts the lease is refused: the space may have been reused. */
    CHECK_EQ_INT(pthread_join(t, NULL), 0);
    CHECK_STATUS(lr.result, KVS_LEASE_EXPIRED);
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(r, &s), KVS_OK);
    CHECK_EQ_U64(s.get_lease_expired, 1);
    CHECK_STATUS(kvs_client_remove(c, "L", false), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(r, buf), KVS_OK);
    kvs_client_close(r);
    kvs_client_close(c);
    free(buf);
    server_stop(&st.srv);
}

/* A finished read gives its lease back without an extra round trip on the read path: with the
 * next request, or at close. So `kvstash get K f; kvstash rm K` succeeds (it used to be refused
 * with OBJECT_HAS_LEASE for the lease's 10 s), and so does a get then a remove in one client,
 * while another client's read still protects the object. */
static void test_completed_reads_release_their_leases(void)
{
    store_t st;
    store_start(&st, "16MiB", NULL);
    char in[64], out[64];
    snprintf(in, sizeof(in), "/tmp/kvs-lease-in-%d", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/kvs-lease-out-%d", (int)getpid());
    FILE *f = fopen(in, "wb");
    CHECK(f != NULL && fwrite("lease me", 1, 8, f) == 8);
    fclose(f);
    const char *put[] = {"put", "K", in, NULL}, *get[] = {"get", "K", out, NULL},
               *rm[] = {"rm", "K", NULL};
    CHECK_EQ_INT(run_cli(st.master, put), 0);
    CHECK_EQ_INT(run_cli(st.master, get), 0);
    CHECK_EQ_INT(run_cli(st.master, rm), 0);
    unlink(in);
    unlink(out);

    kvs_client_t *a = client_open(st.master, 3000), *b = client_open(st.master, 3000);
    put_pattern(a, "k", 4096, NULL);
    uint8_t *buf = malloc(4096);
    CHECK_EQ_INT(get_copy(a, "k", buf, 4096), 4096);
    CHECK_EQ_INT(get_copy(b, "k", buf, 4096), 4096);
    CHECK_EQ_INT(get_copy(b, "k", buf, 4096), 4096);
    /* b's two reads are done, but their releases wait for b's next request. */
    CHECK_STATUS(kvs_client_remove(a, "k", false), KVS_OBJECT_HAS_LEASE);
    CHECK_EQ_INT(kvs_client_exists(b, "k"), 1); /* carries b's releases */
    CHECK_STATUS(kvs_client_remove(a, "k", false), KVS_OK);
    free(buf);
    kvs_client_close(a);
    kvs_client_close(b);
    server_stop(&st.srv);
}

static void test_transfer_deadline_bounds_a_slow_owner(void)
{
    kvs_test_need_hooks(); /* a slow owner: KVS_DATA_INJECT_DELAY_US */
    setenv("KVS_PROTOCOL", "tcp", 1);
    setenv("KVS_DATA_INJECT_DELAY_US", "1500000", 1);
    store_t st;
    store_start(&st, "16MiB", NULL);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    kvs_client_t *writer = client_open(st.master, 5000);
    put_pattern(writer, "slow", 10000, NULL);
    kvs_client_close(writer);
    kvs_client_t *c = client_open(st.master, 300);
    uint8_t *buf = malloc(10000);
    memset(buf, GUARD, 10000);
    CHECK_STATUS(kvs_client_register_buffer(c, buf, 10000), KVS_OK);
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs_client_get_into(c, "slow", buf, 10000), KVS_TIMED_OUT);
    uint64_t ms = (kvs__now_ns() - t0) / 1000000;
    CHECK_CMP_U64(ms, >=, 250);
    CHECK_CMP_U64(ms, <, 1200);
    /* The cancelled read wrote nothing after returning: the buffer can go at once. */
    CHECK(all_guard(buf, 10000));
    CHECK_STATUS(kvs_client_unregister_buffer(c, buf), KVS_OK);
    kvs_client_close(c);
    free(buf);
    server_stop(&st.srv);
}

typedef struct {
    kvs_client_t *c;
    void *buf;
    atomic_int done;
    int64_t result;
} slow_read_t;

static void *slow_read_main(void *arg)
{
    slow_read_t *r = arg;
    r->result = kvs_client_get_into(r->c, "slow", r->buf, 10000);
    atomic_store(&r->done, 1);
    return NULL;
}

static void test_unregister_waits_for_reads_in_flight(void)
{
    kvs_test_need_hooks();            /* a slow owner: KVS_DATA_INJECT_DELAY_US */
    setenv("KVS_PROTOCOL", "tcp", 1); /* a slow owner on the data path */
    setenv("KVS_DATA_INJECT_DELAY_US", "400000", 1);
    store_t st;
    store_start(&st, "16MiB", NULL);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    kvs_client_t *c = client_open(st.master, 5000);
    put_pattern(c, "slow", 10000, NULL);
    slow_read_t r = {c, malloc(10000), 0, 0};
    CHECK_STATUS(kvs_client_register_buffer(c, r.buf, 10000), KVS_OK);
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, slow_read_main, &r), 0);
    /* Wait until the read is inside the client (its buffer pinned), then a little more: it is
     * waiting on the owner. */
    for (int i = 0; i < 2000 && atomic_load(&c->calls) == 0; i++)
        usleep(1000);
    CHECK(atomic_load(&c->calls) > 0);
    CHECK_STATUS(kvs_client_unregister_buffer(c, r.buf), KVS_OK);
    /* It returned only once the read was done with the buffer: the bytes are all there. */
    CHECK_EQ_INT(mismatch("slow", 0, r.buf, 10000), -1);
    pthread_join(t, NULL);
    CHECK_EQ_INT(r.result, 10000);
    CHECK_EQ_INT(mismatch("slow", 0, r.buf, 10000), -1);
    kvs_client_close(c);
    free(r.buf);
    server_stop(&st.srv);
}

/* ---- owners ---------------------------------------------------------------------------------- */

static void test_client_mounts_its_own_segment(void)
{
    server_t m;
    const char *args[] = {"--master-only", NULL};
    server_start(&m, args);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    kvs_client_t *owner = client_open(master, 5000);
    CHECK_STATUS(kvs_client_mount_segment(owner, 8 << 20, "mine", NULL), KVS_OK);
    CHECK_STATUS(kvs_client_mount_segment(owner, 8 << 20, "mine", NULL),
                 KVS_SEGMENT_ALREADY_EXISTS);
    kvs_client_t *reader = client_open(master, 5000);
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.preferred_segment = "mine";
    put_pattern(reader, "on-mine", 123456, &rc);
    void *data;
    size_t size;
    CHECK_STATUS(kvs_client_get(reader, "on-mine", &data, &size), KVS_OK);
    CHECK_EQ_U64(size, 123456);
    CHECK_EQ_INT(mismatch("on-mine", 0, data, size), -1);
    kvs_free(data);
    /* Closing the owner unmounts its segment: its objects are gone. */
    kvs_client_close(owner);
    CHECK_STATUS(kvs_client_get_size(reader, "on-mine"), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(kvs_client_put(reader, "x", "x", 1, NULL), KVS_NO_AVAILABLE_HANDLE);
    kvs_client_close(reader);
    server_stop(&m);
}

typedef struct {
    const char *master;
    atomic_int *stop;
    int wrong_bytes, hung, ok_a, failed_a, ok_b, failed_b, calls;
    atomic_int completed; /* calls finished, for the main thread to watch */
} reader_t;

enum { KILL_KEYS = 16 };
static const uint64_t KILL_SIZE = 256u << 10;

static void *killer_reader_main(void *arg)
{
    reader_t *r = arg;
    kvs_client_t *c = client_open(r->master, 1000);
    size_t pool_len = (size_t)KILL_KEYS * 2 * KILL_SIZE;
    uint8_t *pool = malloc(pool_len);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
    char names[2 * KILL_KEYS][16];
    const char *keys[2 * KILL_KEYS];
    kvs_buf_t frags[2 * KILL_KEYS][32];
    const kvs_buf_t *bufs[2 * KILL_KEYS];
    size_t nbufs[2 * KILL_KEYS];
    for (int i = 0; i < 2 * KILL_KEYS; i++) {
        snprintf(names[i], sizeof(names[i]), "%c%d", i < KILL_KEYS ? 'a' : 'b', i % KILL_KEYS);
        keys[i] = names[i];
        for (int j = 0; j < 32; j++) /* 8 KiB pages, interleaved across keys */
            frags[i][j] = (kvs_buf_t){pool + ((size_t)j * 2 * KILL_KEYS + (size_t)i) * 8192, 8192};
        bufs[i] = frags[i];
        nbufs[i] = 32;
    }
    for (int round = 0; !atomic_load(r->stop) || round < 2; round++) {
        memset(pool, 0, pool_len);
        int64_t res[2 * KILL_KEYS];
        uint64_t t0 = kvs__now_ns();
        int rc = kvs_client_batch_get_into_multi_buffers(c, 2 * KILL_KEYS, keys, bufs, nbufs,
                                                         round % 2, res);
        uint64_t ms = (kvs__now_ns() - t0) / 1000000;
        r->calls++;
        atomic_fetch_add(&r->completed, 1);
        /* Lookup (rpc timeout 3 s) and the transfers (1 s) bound every call. */
        if (ms > 4500)
            r->hung++;
        if (rc != KVS_OK)
            continue;
        for (int i = 0; i < 2 * KILL_KEYS; i++) {
            bool a = i < KILL_KEYS;
            if (res[i] == (int64_t)KILL_SIZE) {
                if (!frags_match(keys[i], frags[i], 32))
                    r->wrong_bytes++;
                *(a ? &r->ok_a : &r->ok_b) += 1;
            } else {
                CHECK(res[i] < 0);
                *(a ? &r->failed_a : &r->failed_b) += 1;
            }
        }
    }
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    kvs_client_close(c);
    free(pool);
    return NULL;
}

/* Two owners, B killed while three threads read keys of both: every key returns exact bytes or
 * fails within the deadline, A keeps serving, and B's keys are gone once the master drops it.
 * Over shm the mapping outlives B: its keys read exactly until the master drops B. */
static void owner_killed_case(const char *protocol)
{
    setenv("KVS_PROTOCOL", protocol, 1);
    bool shm = strcmp(protocol, "shm") == 0;
    server_t m, oa, ob;
    const char *margs[] = {"--master-only", "--heartbeat-timeout-ms", "600", NULL};
    server_start(&m, margs);
    char master[64], port[16];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    snprintf(port, sizeof(port), "%u", (unsigned)m.port);
    const char *aargs[] = {"--owner-only",   "--master", master, "--segment-name", "A",
                           "--segment-size", "32MiB",    NULL};
    const char *bargs[] = {"--owner-only",   "--master", master, "--segment-name", "B",
                           "--segment-size", "32MiB",    NULL};
    server_start(&oa, aargs);
    server_start(&ob, bargs);
    kvs_client_t *w = client_open(master, 5000);
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    for (int i = 0; i < 2 * KILL_KEYS; i++) {
        char key[16];
        snprintf(key, sizeof(key), "%c%d", i < KILL_KEYS ? 'a' : 'b', i % KILL_KEYS);
        rc.preferred_segment = i < KILL_KEYS ? "A" : "B";
        put_pattern(w, key, KILL_SIZE, &rc);
    }
    atomic_int stop = 0;
    reader_t r[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        r[i] = (reader_t){.master = master, .stop = &stop};
        CHECK_EQ_INT(pthread_create(&t[i], NULL, killer_reader_main, &r[i]), 0);
    }
    /* Every reader completes a call with both owners up (slow under sanitizers), then B dies. */
    for (int i = 0; i < 3; i++) {
        for (int t_ = 0; t_ < 3000 && atomic_load(&r[i].completed) < 2; t_++)
            usleep(10000);
        CHECK(atomic_load(&r[i].completed) >= 2);
    }
    server_kill(&ob);
    /* A put placed on dead B fails and is revoked, not left half written. Over shm the writer
     * still has B mapped: the put used to return 0 and then vanish with B. */
    rc.preferred_segment = "B";
    uint8_t small[1000] = {0};
    int prc = kvs_client_put(w, "late", small, sizeof(small), &rc);
    CHECK(prc == KVS_TRANSFER_FAIL || prc == KVS_NO_AVAILABLE_HANDLE);
    CHECK_EQ_INT(kvs_client_exists(w, "late"), 0);
    usleep(1200000); /* past the heartbeat time-out: the master drops B */
    /* Each reader completes a whole call begun after that (slow under sanitizers). */
    int after[3];
    for (int i = 0; i < 3; i++)
        after[i] = atomic_load(&r[i].completed) + 2;
    for (int i = 0; i < 3; i++) {
        for (int t_ = 0; t_ < 6000 && atomic_load(&r[i].completed) < after[i]; t_++)
            usleep(10000);
        CHECK(atomic_load(&r[i].completed) >= after[i]);
    }
    atomic_store(&stop, 1);
    int ok_a = 0, failed_a = 0, ok_b = 0, failed_b = 0, calls = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(r[i].wrong_bytes, 0);
        CHECK_EQ_INT(r[i].hung, 0);
        ok_a += r[i].ok_a;
        failed_a += r[i].failed_a;
        ok_b += r[i].ok_b;
        failed_b += r[i].failed_b;
        calls += r[i].calls;
    }
    /* A kept serving every read; B's keys were readable before and failed after. */
    CHECK_EQ_INT(failed_a, 0);
    CHECK(ok_a >= 3 * 2 * KILL_KEYS);
    CHECK(ok_b > 0);
    CHECK(failed_b > 0);
    /* After the master dropped B its keys are simply gone; A's are all there. */
    for (int i = 0; i < KILL_KEYS; i++) {
        char key[16];
        snprintf(key, sizeof(key), "a%d", i);
        CHECK_EQ_INT(kvs_client_get_size(w, key), (int64_t)KILL_SIZE);
        snprintf(key, sizeof(key), "b%d", i);
        CHECK_STATUS(kvs_client_get_size(w, key), KVS_OBJECT_NOT_FOUND);
    }
    printf("  %s: %d read calls; A: %d ok; B: %d ok, %d failed\n", protocol, calls, ok_a, ok_b,
           failed_b);
    kvs_client_stats_t ws;
    CHECK_STATUS(kvs_client_get_stats(w, &ws), KVS_OK);
    CHECK(shm ? ws.shm_transfers > 0 && ws.tcp_transfers == 0
              : ws.tcp_transfers > 0 && ws.shm_transfers == 0);
    kvs_client_close(w);
    server_check_alive(&oa);
    server_stop(&oa);
    server_stop(&m);
    (void)port;
}

static void test_owner_killed_during_tcp_reads(void)
{
    owner_killed_case("tcp");
}

static void test_owner_killed_during_shm_reads(void)
{
    owner_killed_case("shm");
}

/* auto takes shm where the owner's socket and descriptor are reachable, else tcp; shm alone
 * fails keys it cannot reach. */
static void test_protocols_auto_shm_tcp(void)
{
    store_t st;
    store_start(&st, "16MiB", NULL);
    unsetenv("KVS_PROTOCOL");
    kvs_client_t *w = client_open(st.master, 5000);
    put_pattern(w, "p", 200000, NULL);
    kvs_client_close(w);
    const char *protos[] = {"auto", "tcp", "shm", "auto", "shm"};
    /* The last two look for owners' sockets where there are none: auto falls back to tcp. */
    const char *dirs[] = {NULL, NULL, NULL, "/nonexistent/kvstash", "/nonexistent/kvstash"};
    for (int i = 0; i < 5; i++) {
        setenv("KVS_PROTOCOL", protos[i], 1);
        if (dirs[i])
            setenv("KVS_SHM_DIR", dirs[i], 1);
        kvs_client_t *c = client_open(st.master, 2000);
        unsetenv("KVS_SHM_DIR");
        uint8_t *buf = malloc(200000);
        CHECK_STATUS(kvs_client_register_buffer(c, buf, 200000), KVS_OK);
        int64_t got = kvs_client_get_into(c, "p", buf, 200000);
        kvs_client_stats_t s;
        CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
        bool via_shm = dirs[i] == NULL && strcmp(protos[i], "tcp") != 0;
        if (strcmp(protos[i], "shm") == 0 && !via_shm) {
            CHECK_STATUS(got, KVS_TRANSFER_FAIL);
        } else {
            CHECK_EQ_INT(got, 200000);
            CHECK_EQ_INT(mismatch("p", 0, buf, 200000), -1);
            CHECK_EQ_U64(s.shm_transfers, via_shm ? 1 : 0);
            CHECK_EQ_U64(s.tcp_transfers, via_shm ? 0 : 1);
        }
        CHECK_STATUS(kvs_client_unregister_buffer(c, buf), KVS_OK);
        kvs_client_close(c);
        free(buf);
    }
    server_stop(&st.srv);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_round_trips_1_byte_to_64_mib),
        KVS_TEST_CASE(test_largest_legal_batch),
        KVS_TEST_CASE(test_restart_on_the_same_ports_under_a_shm_client),
        KVS_TEST_CASE(test_forced_remove_during_a_read),
        KVS_TEST_CASE(test_remounted_segment_gets_fresh_memory),
        KVS_TEST_CASE(test_stopped_owner_resumes_after_its_put_was_revoked),
        KVS_TEST_CASE(test_batch_put_from_multi_gathers_in_order),
        KVS_TEST_CASE(test_any_memory_puts_and_replica_clear),
        KVS_TEST_CASE(test_multi_buffers_direct),
        KVS_TEST_CASE(test_multi_buffers_grouped),
        KVS_TEST_CASE(test_bad_input_is_refused_and_changes_nothing),
        KVS_TEST_CASE(test_threads_share_one_client),
        KVS_TEST_CASE(test_processes_read_each_others_keys),
        KVS_TEST_CASE(test_eviction_makes_room_for_new_puts),
        KVS_TEST_CASE(test_leases_protect_reads_and_expire),
        KVS_TEST_CASE(test_completed_reads_release_their_leases),
        KVS_TEST_CASE(test_transfer_deadline_bounds_a_slow_owner),
        KVS_TEST_CASE(test_unregister_waits_for_reads_in_flight),
        KVS_TEST_CASE(test_client_mounts_its_own_segment),
        KVS_TEST_CASE(test_owner_killed_during_tcp_reads),
        KVS_TEST_CASE(test_owner_killed_during_shm_reads),
        KVS_TEST_CASE(test_protocols_auto_shm_tcp),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
