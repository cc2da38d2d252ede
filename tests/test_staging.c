/* GPU read staging through the host-memory backend (DESIGN §1), against a real kvstash-server:
 * capacity, fills, fallbacks, failure injection, late completions, and unregister/close while a
 * staged read is in flight. Counters prove which path ran. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "rpc_helpers.h"
#include "client/client_int.h"

#include <kvstash/kvstash.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GUARD  0x5A
#define BUDGET (1u << 20)

typedef struct {
    server_t srv;
    char master[64];
} store_t;

static void store_start(store_t *st, const char *delay_us)
{
    if (delay_us) {
        kvs_test_need_hooks();
        setenv("KVS_DATA_INJECT_DELAY_US", delay_us, 1);
    }
    const char *args[] = {"--segment-size", "64MiB", NULL};
    server_start(&st->srv, args);
    unsetenv("KVS_DATA_INJECT_DELAY_US");
    snprintf(st->master, sizeof(st->master), "127.0.0.1:%u", (unsigned)st->srv.port);
}

/* A client with host-backend staging and a BUDGET-byte buffer (environment read at open). */
static kvs_client_t *staged_client(const store_t *st, uint64_t transfer_ms, const char *busy_us)
{
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    setenv("MC_STORE_GPU_STAGING_BACKEND", "host", 1);
    setenv("MC_STORE_GPU_STAGING_BUFFER_BYTES", "1MiB", 1);
    setenv("MC_STORE_GPU_STAGING_BUSY_WAIT_US", busy_us ? busy_us : "0", 1);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = st->master;
    cfg.transfer_timeout_ms = transfer_ms;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    CHECK(kvs__client_staging(c) != NULL);
    return c;
}

static uint8_t byte_of(const char *key, uint64_t off)
{
    uint64_t h = 14695981039346656037ull;
    for (const char *p = key; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (uint8_t)(((off + h) * 0x9E3779B97F4A7C15ull) >> 56);
}

static void put_key(kvs_client_t *c, const char *key, uint64_t size)
{
    uint8_t *b = malloc(size);
    CHECK(b != NULL);
    for (uint64_t i = 0; i < size; i++)
        b[i] = byte_of(key, i);
    CHECK_STATUS(kvs_client_put(c, key, b, size, NULL), KVS_OK);
    free(b);
}

/* Destinations: each key's object split into irregular fragments, placed in reverse order in a
 * registered pool with guard gaps. */
typedef struct {
    uint8_t *pool;
    size_t pool_len;
    kvs_buf_t frags[16][600];
    const kvs_buf_t *bufs[16];
    size_t nbufs[16];
} dest_t;

static void dest_init(kvs_client_t *c, dest_t *d, const uint64_t *sizes, int n)
{
    d->pool_len = 0;
    for (int i = 0; i < n; i++)
        d->pool_len += sizes[i] + sizes[i] / 64 + 4096;
    d->pool = malloc(d->pool_len);
    CHECK(d->pool != NULL);
    memset(d->pool, GUARD, d->pool_len);
    CHECK_STATUS(kvs_client_register_buffer(c, d->pool, d->pool_len), KVS_OK);
    uint64_t base = 0;
    for (int i = 0; i < n; i++) {
        size_t nf = 0;
        uint64_t off = 0;
        while (off < sizes[i]) {
            uint64_t want = 1 + kvs_test_rand() % 9000;
            uint64_t len = KVS_MIN(want, sizes[i] - off);
            CHECK(nf < 600);
            d->frags[i][nf++] = (kvs_buf_t){NULL, len};
            off += len;
        }
        uint64_t pos = base + 7;
        for (size_t j = nf; j-- > 0;) {
            d->frags[i][j].ptr = d->pool + pos;
            pos += d->frags[i][j].len + 1 + kvs_test_rand() % 50;
        }
        CHECK(pos <= d->pool_len);
        base = pos;
        d->bufs[i] = d->frags[i];
        d->nbufs[i] = nf;
    }
}

static void dest_free(kvs_client_t *c, dest_t *d)
{
    CHECK_STATUS(kvs_client_unregister_buffer(c, d->pool), KVS_OK);
    free(d->pool);
}

static bool key_exact(const dest_t *d, int i, const char *key)
{
    uint64_t off = 0;
    for (size_t j = 0; j < d->nbufs[i]; j++) {
        const uint8_t *p = d->frags[i][j].ptr;
        for (size_t b = 0; b < d->frags[i][j].len; b++) {
            if (p[b] != byte_of(key, off + b))
                return false;
        }
        off += d->frags[i][j].len;
    }
    return true;
}

static bool key_guarded(const dest_t *d, int i)
{
    for (size_t j = 0; j < d->nbufs[i]; j++) {
        const uint8_t *p = d->frags[i][j].ptr;
        for (size_t b = 0; b < d->frags[i][j].len; b++) {
            if (p[b] != GUARD)
                return false;
        }
    }
    return true;
}

/* Waits until a call of another thread is inside the client (its buffers are pinned by then). */
static void wait_call_in_flight(kvs_client_t *c)
{
    for (int i = 0; i < 2000 && atomic_load(&c->calls) == 0; i++)
        usleep(1000);
    CHECK(atomic_load(&c->calls) > 0);
}

static kvs_client_stats_t stats(kvs_client_t *c)
{
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    return s;
}

static int read_keys(kvs_client_t *c, dest_t *d, const char *const *keys, int n, int64_t *res)
{
    return kvs_client_batch_get_into_multi_buffers(c, (size_t)n, keys, d->bufs, d->nbufs, false,
                                                   res);
}

/* Reads keys[0..n) (n <= 16) into fresh destinations: every key's size and bytes exact. */
static void read_all_exact(kvs_client_t *c, const char *const *keys, const uint64_t *sizes, int n)
{
    CHECK(n <= 16);
    dest_t d;
    dest_init(c, &d, sizes, n);
    int64_t res[16];
    CHECK_STATUS(read_keys(c, &d, keys, n, res), KVS_OK);
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
        CHECK(key_exact(&d, i, keys[i]));
    }
    dest_free(c, &d);
}

/* ---- capacity and fills ---------------------------------------------------------------------- */

static void test_staging_exact_capacity(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "full", BUDGET);
    put_key(c, "over", BUDGET + 1);
    uint64_t s1[] = {BUDGET}, s2[] = {BUDGET + 1};
    const char *k1[] = {"full"}, *k2[] = {"over"};
    int64_t r;
    dest_t d;
    dest_init(c, &d, s1, 1);
    CHECK_STATUS(read_keys(c, &d, k1, 1, &r), KVS_OK);
    CHECK_EQ_INT(r, BUDGET);
    CHECK(key_exact(&d, 0, "full"));
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.staged_reads, 1);
    CHECK_EQ_U64(s.fills, 1);
    CHECK_EQ_U64(s.scatter_launches, 1);
    CHECK_EQ_U64(s.get_submissions, 0);
    dest_free(c, &d);
    /* One byte more: the direct path, counted as too_large, bytes still exact. */
    dest_init(c, &d, s2, 1);
    CHECK_STATUS(read_keys(c, &d, k2, 1, &r), KVS_OK);
    CHECK_EQ_INT(r, BUDGET + 1);
    CHECK(key_exact(&d, 0, "over"));
    s = stats(c);
    CHECK_EQ_U64(s.staged_reads, 1);
    CHECK_EQ_U64(s.fallback_too_large, 1);
    CHECK_EQ_U64(s.get_submissions, 1);
    /* Each call in one mode: the first staged, the second direct (it fell back). */
    CHECK_EQ_U64(s.get_staged_calls, 1);
    CHECK_EQ_U64(s.get_direct_calls, 1);
    CHECK_EQ_U64(s.get_grouped_unstaged_calls, 0);
    CHECK_EQ_U64(s.get_staged_calls + s.get_direct_calls + s.get_grouped_unstaged_calls,
                 s.get_calls);
    CHECK_EQ_U64(s.get_staged_bytes, BUDGET);
    CHECK_EQ_U64(s.get_direct_bytes, BUDGET + 1);
    CHECK_EQ_U64(s.get_staged_latency.count, 1);
    CHECK_EQ_U64(s.get_direct_latency.count, 1);
    CHECK_EQ_U64(s.staging_held_bytes, BUDGET);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_seven_keys_four_fills(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    /* Fills (1 MiB, 16-byte aligned offsets): {k0,k1} {k2,k3} {k4} {k5,k6}. */
    uint64_t sizes[7] = {600001, 300000, 512000, 512000, BUDGET, 100000, 50000};
    const char *keys[7] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6"};
    for (int i = 0; i < 7; i++)
        put_key(c, keys[i], sizes[i]);
    read_all_exact(c, keys, sizes, 7);
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.staged_reads, 1);
    CHECK_EQ_U64(s.staged_keys, 7);
    CHECK_EQ_U64(s.fills, 4);
    CHECK_EQ_U64(s.scatter_launches, 4);
    CHECK_EQ_U64(s.get_submissions, 0);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* By default (and with MC_STORE_GPU_STAGING_HALF_FILLS=1), keys that all fit half the buffer fill
 * halves in turn over shm (one fill's receive overlapping the previous fill's scatter); one larger
 * key, tcp, or MC_STORE_GPU_STAGING_HALF_FILLS=0 make fills take the whole buffer. */
static void test_staging_half_buffer_fills(void)
{
    store_t st;
    store_start(&st, NULL);
    setenv("MC_STORE_GPU_STAGING_HALF_FILLS", "1", 1);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    /* Six keys of 200000 bytes: two per half (524288 bytes), so three fills. */
    uint64_t sizes[6] = {200000, 200000, 200000, 200000, 200000, 200000};
    const char *keys[6] = {"h0", "h1", "h2", "h3", "h4", "h5"};
    for (int i = 0; i < 6; i++)
        put_key(c, keys[i], sizes[i]);
    read_all_exact(c, keys, sizes, 6);
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.fills, 3);
    CHECK_EQ_U64(s.scatter_launches, 3);
    CHECK_EQ_U64(s.get_submissions, 0);
    /* A key above half the buffer: whole-buffer fills, all three keys in one. */
    uint64_t big[3] = {600000, 100000, 100000};
    const char *bk[3] = {"b0", "b1", "b2"};
    for (int i = 0; i < 3; i++)
        put_key(c, bk[i], big[i]);
    read_all_exact(c, bk, big, 3);
    s = stats(c);
    CHECK_EQ_U64(s.fills, 4);
    CHECK_EQ_U64(s.scatter_launches, 4);
    kvs_client_close(c);
    /* Over tcp (a fill ends in a drain of its connections) fills take the whole buffer: the
     * six keys need two. */
    setenv("KVS_PROTOCOL", "tcp", 1);
    c = staged_client(&st, 5000, NULL);
    unsetenv("KVS_PROTOCOL");
    read_all_exact(c, keys, sizes, 6);
    s = stats(c);
    CHECK_EQ_U64(s.fills, 2);
    CHECK_EQ_U64(s.tcp_transfers, 6);
    kvs_client_close(c);
    /* Off: whole-buffer fills over shm too. */
    setenv("MC_STORE_GPU_STAGING_HALF_FILLS", "0", 1);
    c = staged_client(&st, 5000, NULL);
    read_all_exact(c, keys, sizes, 6);
    s = stats(c);
    CHECK_EQ_U64(s.fills, 2);
    CHECK_EQ_U64(s.shm_transfers, 6);
    kvs_client_close(c);
    /* Unset: the default, half fills. */
    unsetenv("MC_STORE_GPU_STAGING_HALF_FILLS");
    c = staged_client(&st, 5000, NULL);
    read_all_exact(c, keys, sizes, 6);
    CHECK_EQ_U64(stats(c).fills, 3);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* A read of more than its first fill looks up that fill's keys, starts the fill, and looks up
 * the rest while it runs (read_lead in client_io.c): the bytes and results are those of one
 * lookup, keys missing from either part fail alone, and fills stay as the whole call's. */
static void test_staging_pipelined_lookup(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    /* Eight keys of 200000 bytes: two per half fill, so four fills; the first two are looked up
     * before anything moves, the other six while the first fill runs. */
    const char *keys[8] = {"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"};
    uint64_t sizes[8];
    for (int i = 0; i < 8; i++) {
        sizes[i] = 200000;
        put_key(c, keys[i], sizes[i]);
    }
    kvs_client_stats_t a = stats(c);
    read_all_exact(c, keys, sizes, 8);
    kvs_client_stats_t b = stats(c);
    CHECK_EQ_U64(b.staged_reads - a.staged_reads, 1);
    CHECK_EQ_U64(b.staged_keys - a.staged_keys, 8);
    CHECK_EQ_U64(b.fills - a.fills, 4);
    CHECK_EQ_U64(b.get_submissions, 0);
    CHECK(b.get_lookup_overlapped_ns > a.get_lookup_overlapped_ns);
    CHECK(b.get_lookup_ns - a.get_lookup_ns >
          b.get_lookup_overlapped_ns - a.get_lookup_overlapped_ns);
    /* A lookup that keeps the pending releases (a pipelined read's first) sends none; the next
     * request sends them. */
    {
        uint64_t rel = rpc_stat_counter(c->rpc, "lease_releases");
        kvs__str_t one = kvs__str_c("p0");
        kvs__arena_t ar;
        kvs__arena_init(&ar);
        kvs__placement_rsp_t pr;
        CHECK_STATUS(kvs__client_keys_call(c, KVS_MSG_LOOKUP, KVS__CALL_KEEP_RELEASES, 1, &one,
                                           NULL, &ar, NULL, &pr, kvs__client_rpc_deadline(c)),
                     KVS_OK);
        CHECK_STATUS(pr.objs[0].status, KVS_OK);
        CHECK_EQ_U64(rpc_stat_counter(c->rpc, "lease_releases"), rel);
        uint64_t token = pr.objs[0].lease_id;
        kvs__client_release_later(c, 1, &one, &token);
        kvs__arena_free(&ar);
        CHECK_EQ_INT(kvs_client_exists(c, "p1"), 1);
        CHECK_EQ_U64(rpc_stat_counter(c->rpc, "lease_releases") - rel, 9);
    }

    /* Missing keys in the first part (p1 -> gone1) and in the rest (p5 -> gone5): they fail on
     * their own, keep their place in the fills, and their destinations stay untouched. */
    const char *some[8] = {"p0", "gone1", "p2", "p3", "p4", "gone5", "p6", "p7"};
    dest_t d;
    dest_init(c, &d, sizes, 8);
    int64_t res[8];
    a = stats(c);
    CHECK_STATUS(read_keys(c, &d, some, 8, res), KVS_OK);
    for (int i = 0; i < 8; i++) {
        if (i == 1 || i == 5) {
            CHECK_STATUS(res[i], KVS_OBJECT_NOT_FOUND);
            CHECK(key_guarded(&d, i));
        } else {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, some[i]));
        }
    }
    b = stats(c);
    CHECK_EQ_U64(b.staged_reads - a.staged_reads, 1);
    CHECK_EQ_U64(b.staged_keys - a.staged_keys, 6);
    CHECK_EQ_U64(b.fills - a.fills, 4);
    CHECK(b.get_lookup_overlapped_ns > a.get_lookup_overlapped_ns);
    dest_free(c, &d);
    /* The whole first part missing: its fill carries nothing, and the rest still reads. */
    const char *late_only[8] = {"gone0", "gone1", "p2", "p3", "p4", "p5", "p6", "p7"};
    dest_init(c, &d, sizes, 8);
    a = stats(c);
    CHECK_STATUS(read_keys(c, &d, late_only, 8, res), KVS_OK);
    for (int i = 0; i < 8; i++) {
        if (i < 2) {
            CHECK_STATUS(res[i], KVS_OBJECT_NOT_FOUND);
            CHECK(key_guarded(&d, i));
        } else {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, late_only[i]));
        }
    }
    b = stats(c);
    CHECK_EQ_U64(b.staged_keys - a.staged_keys, 6);
    CHECK_EQ_U64(b.get_submissions, 0);
    /* Nothing was in flight beside that lookup, and the empty fill is no fill. */
    CHECK_EQ_U64(b.get_lookup_overlapped_ns, a.get_lookup_overlapped_ns);
    CHECK_EQ_U64(b.fills - a.fills, 3);
    CHECK_EQ_U64(b.staging_last_fills, 3);
    dest_free(c, &d);
    /* The buffer held elsewhere: the call falls back before its first fill, looks the rest up
     * and reads everything direct. */
    CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), true), KVS_OK);
    a = stats(c);
    read_all_exact(c, keys, sizes, 8);
    b = stats(c);
    CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), false), KVS_OK);
    CHECK_EQ_U64(b.fallback_busy - a.fallback_busy, 1);
    CHECK_EQ_U64(b.get_direct_calls - a.get_direct_calls, 1);
    CHECK_EQ_U64(b.get_submissions - a.get_submissions, 8);
    CHECK_EQ_U64(b.staged_reads, a.staged_reads);
    CHECK_EQ_U64(b.get_lookup_overlapped_ns, a.get_lookup_overlapped_ns);
    kvs_client_close(c);

    /* Off (MC_STORE_GPU_STAGING_PIPELINED_LOOKUP=0): every key looked up first, the same fills. */
    setenv("MC_STORE_GPU_STAGING_PIPELINED_LOOKUP", "0", 1);
    c = staged_client(&st, 5000, NULL);
    unsetenv("MC_STORE_GPU_STAGING_PIPELINED_LOOKUP");
    read_all_exact(c, keys, sizes, 8);
    b = stats(c);
    CHECK_EQ_U64(b.staged_reads, 1);
    CHECK_EQ_U64(b.fills, 4);
    CHECK_EQ_U64(b.get_lookup_overlapped_ns, 0);
    CHECK(b.get_lookup_ns > 0);
    kvs_client_close(c);

    /* Over tcp fills take the whole buffer: five keys in the first, looked up first. */
    setenv("KVS_PROTOCOL", "tcp", 1);
    c = staged_client(&st, 5000, NULL);
    unsetenv("KVS_PROTOCOL");
    read_all_exact(c, keys, sizes, 8);
    b = stats(c);
    CHECK_EQ_U64(b.staged_reads, 1);
    CHECK_EQ_U64(b.fills, 2);
    CHECK_EQ_U64(b.tcp_transfers, 8);
    CHECK(b.get_lookup_overlapped_ns > 0);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* A key of the rest whose fragments hold more than its object makes the call ineligible, as it
 * would have before any lookup: the first fill's receive is dropped unscattered and the whole
 * call reads direct (fallback_not_exact), each key's bytes exact and the room beyond an object
 * untouched. A first-part key of that kind is found before anything moves. */
static void test_staging_pipelined_lookup_finds_a_larger_destination(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    const char *keys[8] = {"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7"};
    uint64_t room[8];
    for (int i = 0; i < 8; i++)
        room[i] = 200000;
    for (int late = 0; late < 2; late++) {
        int small = late ? 6 : 0; /* q6 is looked up while the first fill runs, q0 before it */
        for (int i = 0; i < 8; i++)
            put_key(c, keys[i], i == small ? 150000 : 200000);
        dest_t d;
        dest_init(c, &d, room, 8);
        int64_t res[8];
        kvs_client_stats_t a = stats(c);
        CHECK_STATUS(read_keys(c, &d, keys, 8, res), KVS_OK);
        kvs_client_stats_t b = stats(c);
        for (int i = 0; i < 8; i++) {
            CHECK_EQ_INT(res[i], i == small ? 150000 : 200000);
            if (i != small)
                CHECK(key_exact(&d, i, keys[i]));
        }
        /* The small object's bytes, then its room beyond them as it was. */
        uint64_t off = 0;
        for (size_t j = 0; j < d.nbufs[small]; j++) {
            const uint8_t *p = d.frags[small][j].ptr;
            for (size_t q = 0; q < d.frags[small][j].len; q++, off++)
                CHECK(p[q] == (off < 150000 ? byte_of(keys[small], off) : GUARD));
        }
        CHECK_EQ_U64(b.fallback_not_exact - a.fallback_not_exact, 1);
        CHECK_EQ_U64(b.staged_reads - a.staged_reads, 0);
        CHECK_EQ_U64(b.fills - a.fills, 0);
        CHECK_EQ_U64(b.scatter_launches - a.scatter_launches, 0);
        CHECK_EQ_U64(b.get_direct_calls - a.get_direct_calls, 1);
        CHECK_EQ_U64(b.get_submissions - a.get_submissions, 8);
        /* Only the late case looked anything up beside a fill. */
        CHECK_EQ_INT(b.get_lookup_overlapped_ns > a.get_lookup_overlapped_ns, late);
        dest_free(c, &d);
        const char *rm[8];
        int rr[8];
        for (int i = 0; i < 8; i++)
            rm[i] = keys[i];
        CHECK_STATUS(kvs_client_batch_remove(c, 8, rm, false, rr), KVS_OK);
    }
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_changing_destinations_duplicates_and_missing(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "a", 200000);
    put_key(c, "b", 77777);
    /* a, missing, b, a again into other fragments, another missing. */
    const char *keys[5] = {"a", "gone", "b", "a", "gone2"};
    uint64_t sizes[5] = {200000, 5000, 77777, 200000, 300};
    for (int round = 0; round < 3; round++) {
        /* New destination memory each round: registered, used, unregistered. */
        dest_t d;
        dest_init(c, &d, sizes, 5);
        int64_t res[5];
        CHECK_STATUS(read_keys(c, &d, keys, 5, res), KVS_OK);
        CHECK_EQ_INT(res[0], 200000);
        CHECK_STATUS(res[1], KVS_OBJECT_NOT_FOUND);
        CHECK_EQ_INT(res[2], 77777);
        CHECK_EQ_INT(res[3], 200000);
        CHECK_STATUS(res[4], KVS_OBJECT_NOT_FOUND);
        CHECK(key_exact(&d, 0, "a"));
        CHECK(key_exact(&d, 2, "b"));
        CHECK(key_exact(&d, 3, "a"));
        CHECK(key_guarded(&d, 1));
        CHECK(key_guarded(&d, 4));
        dest_free(c, &d);
    }
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.staged_reads, 3);
    CHECK_EQ_U64(s.staged_keys, 9); /* only the present keys were planned */
    CHECK_EQ_U64(s.fills, 3);
    CHECK_EQ_U64(s.get_submissions, 0);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_overlap_and_other_domain_fall_back(void)
{
    store_t st;
    store_start(&st, NULL);
    /* One connection per owner: the direct reads into overlapping memory run one after the
     * other, so the test itself does not race (the bytes are unspecified either way). */
    setenv("KVS_TCP_CONNECTIONS", "1", 1);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "x", 5000);
    uint8_t *pool = malloc(8192);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, 8192), KVS_OK);
    /* The same key twice into overlapping destinations: not stageable, read directly. */
    kvs_buf_t f1 = {pool, 5000}, f2 = {pool + 1000, 5000};
    const kvs_buf_t *bufs[2] = {&f1, &f2};
    size_t nb[2] = {1, 1};
    const char *keys[2] = {"x", "x"};
    int64_t res[2];
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 2, keys, bufs, nb, false, res), KVS_OK);
    CHECK_EQ_INT(res[0], 5000);
    CHECK_EQ_INT(res[1], 5000);
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.fallback_overlap, 1);
    CHECK_EQ_U64(s.staged_reads, 0);
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    /* Many fragments, scattered over a wide range (the overlap check sorts them): adjacent but
     * disjoint stages; one byte of overlap between two distant ones falls back. */
    put_key(c, "y", 64000);
    size_t wide = 64u << 20;
    uint8_t *big = malloc(wide);
    CHECK_STATUS(kvs_client_register_buffer(c, big, wide), KVS_OK);
    enum { NF = 640 };
    kvs_buf_t yf[NF];
    for (int i = 0; i < NF; i++) /* 100-byte fragments at shuffled 100 KiB strides */
        yf[i] = (kvs_buf_t){big + (size_t)((i * 379) % NF) * 102400, 100};
    const kvs_buf_t *yb = yf;
    size_t yn = NF;
    const char *yk = "y";
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &yb, &yn, false, res), KVS_OK);
    CHECK_EQ_INT(res[0], 64000);
    CHECK_EQ_U64(stats(c).staged_reads, 1);
    yf[NF - 1].ptr = (uint8_t *)yf[7].ptr + 99; /* shares one byte with fragment 7 */
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &yb, &yn, false, res), KVS_OK);
    CHECK_EQ_U64(stats(c).fallback_overlap, 2);
    CHECK_EQ_U64(stats(c).staged_reads, 1);
    CHECK_STATUS(kvs_client_unregister_buffer(c, big), KVS_OK);
    /* Pages of a pool (the bitmap path of the check: 1 KiB pages and a 512-byte last one,
     * shuffled): stages, every byte in its page; the same page twice, or a fragment half-way
     * into another page, falls back. */
    enum { NP = 63 };
    kvs_buf_t pf[NP];
    for (int i = 0; i < NP; i++)
        pf[i] = (kvs_buf_t){big + (size_t)((i * 37) % NP) * 1024, i < NP - 1 ? 1024 : 512};
    CHECK_STATUS(kvs_client_register_buffer(c, big, wide), KVS_OK);
    const kvs_buf_t *pb = pf;
    size_t pn = NP;
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &pb, &pn, false, res), KVS_OK);
    CHECK_EQ_INT(res[0], 64000);
    CHECK_EQ_U64(stats(c).staged_reads, 2);
    bool exact = true;
    for (int i = 0; i < NP; i++)
        for (size_t b = 0; b < pf[i].len; b++)
            exact = exact && ((uint8_t *)pf[i].ptr)[b] == byte_of("y", (uint64_t)i * 1024 + b);
    CHECK(exact);
    kvs_buf_t keep = pf[5];
    pf[5].ptr = pf[20].ptr; /* the same page twice */
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &pb, &pn, false, res), KVS_OK);
    CHECK_EQ_U64(stats(c).fallback_overlap, 3);
    pf[5].ptr = (uint8_t *)pf[20].ptr + 512; /* half-way into another page */
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &pb, &pn, false, res), KVS_OK);
    CHECK_EQ_U64(stats(c).fallback_overlap, 4);
    pf[5] = keep;
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &yk, &pb, &pn, false, res), KVS_OK);
    CHECK_EQ_U64(stats(c).staged_reads, 3);
    CHECK_EQ_U64(stats(c).fallback_overlap, 4);
    CHECK_STATUS(kvs_client_unregister_buffer(c, big), KVS_OK);
    free(big);
    kvs_client_close(c);
    /* Without the host backend, host memory is no backend's domain: every call falls back. */
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    unsetenv("MC_STORE_GPU_STAGING_BACKEND");
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = st.master;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, 8192), KVS_OK);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, keys, bufs, nb, false, res), KVS_OK);
    CHECK_EQ_INT(res[0], 5000);
    s = stats(c);
    CHECK_EQ_U64(s.fallback_other_domain, 1);
    CHECK_EQ_U64(s.staged_reads, 0);
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    kvs_client_close(c);
    /* Off by default. */
    unsetenv("MC_STORE_GPU_STAGING");
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    CHECK(kvs__client_staging(c) == NULL);
    kvs_client_close(c);
    free(pool);
    server_stop(&st.srv);
}

/* ---- the buffer is busy ---------------------------------------------------------------------- */

typedef struct {
    kvs_client_t *c;
    dest_t *d;
    const char *const *keys;
    int n;
    int64_t res[8];
    int rc;
    atomic_int done;
    uint64_t ms;
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    uint64_t t0 = kvs__now_ns();
    r->rc = read_keys(r->c, r->d, r->keys, r->n, r->res);
    r->ms = (kvs__now_ns() - t0) / 1000000;
    atomic_store(&r->done, 1);
    return NULL;
}

static void test_staging_busy_buffer_falls_back(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "k", 30000);
    uint64_t sizes[1] = {30000};
    const char *keys[1] = {"k"};
    dest_t d;
    dest_init(c, &d, sizes, 1);
    CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), true), KVS_OK);
    int64_t r;
    CHECK_STATUS(read_keys(c, &d, keys, 1, &r), KVS_OK);
    CHECK_EQ_INT(r, 30000);
    CHECK(key_exact(&d, 0, "k"));
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.fallback_busy, 1);
    CHECK_EQ_U64(s.staged_reads, 0);
    CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), false), KVS_OK);
    memset(d.pool, GUARD, d.pool_len);
    CHECK_STATUS(read_keys(c, &d, keys, 1, &r), KVS_OK);
    CHECK(key_exact(&d, 0, "k"));
    CHECK_EQ_U64(stats(c).staged_reads, 1);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_busy_wait_is_honoured(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, "400000");
    put_key(c, "k", 30000);
    uint64_t sizes[1] = {30000};
    const char *keys[1] = {"k"};
    dest_t d;
    dest_init(c, &d, sizes, 1);
    kvs__staging_t *sg = kvs__client_staging(c);
    /* Released within the wait: the call stages. */
    CHECK_STATUS(kvs__staging_hold(sg, true), KVS_OK);
    reader_t r = {.c = c, .d = &d, .keys = keys, .n = 1};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, reader_main, &r), 0);
    usleep(100000);
    CHECK_EQ_INT(atomic_load(&r.done), 0);
    CHECK_STATUS(kvs__staging_hold(sg, false), KVS_OK);
    pthread_join(t, NULL);
    CHECK_STATUS(r.rc, KVS_OK);
    CHECK_EQ_INT(r.res[0], 30000);
    CHECK_EQ_U64(stats(c).staged_reads, 1);
    CHECK_EQ_U64(stats(c).fallback_busy, 0);
    /* Never released: after the wait, the direct path. */
    CHECK_STATUS(kvs__staging_hold(sg, true), KVS_OK);
    r.done = 0;
    CHECK_EQ_INT(pthread_create(&t, NULL, reader_main, &r), 0);
    pthread_join(t, NULL);
    CHECK_STATUS(r.rc, KVS_OK);
    CHECK_CMP_U64(r.ms, >=, 350);
    CHECK_EQ_U64(stats(c).fallback_busy, 1);
    CHECK(key_exact(&d, 0, "k"));
    CHECK_STATUS(kvs__staging_hold(sg, false), KVS_OK);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_concurrent_threads(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, "200000");
    enum { T = 4, ROUNDS = 6 };
    static const char *keys[T][2] = {
        {"t0a", "t0b"}, {"t1a", "t1b"}, {"t2a", "t2b"}, {"t3a", "t3b"}};
    uint64_t sizes[2] = {123457, 65536};
    dest_t d[T];
    for (int i = 0; i < T; i++) {
        put_key(c, keys[i][0], sizes[0]);
        put_key(c, keys[i][1], sizes[1]);
        dest_init(c, &d[i], sizes, 2);
    }
    for (int round = 0; round < ROUNDS; round++) {
        reader_t r[T];
        pthread_t t[T];
        for (int i = 0; i < T; i++) {
            memset(d[i].pool, GUARD, d[i].pool_len);
            r[i] = (reader_t){.c = c, .d = &d[i], .keys = keys[i], .n = 2};
            CHECK_EQ_INT(pthread_create(&t[i], NULL, reader_main, &r[i]), 0);
        }
        for (int i = 0; i < T; i++) {
            pthread_join(t[i], NULL);
            CHECK_STATUS(r[i].rc, KVS_OK);
            CHECK(key_exact(&d[i], 0, keys[i][0]));
            CHECK(key_exact(&d[i], 1, keys[i][1]));
        }
    }
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.staged_reads + s.fallback_busy, T * ROUNDS);
    CHECK(s.staged_reads > 0);
    for (int i = 0; i < T; i++)
        dest_free(c, &d[i]);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- failures -------------------------------------------------------------------------------- */

static void test_staging_injected_receive_failure(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    const char *keys[3] = {"r0", "r1", "r2"};
    uint64_t sizes[3] = {10000, 20000, 30000};
    for (int i = 0; i < 3; i++)
        put_key(c, keys[i], sizes[i]);
    dest_t d;
    dest_init(c, &d, sizes, 3);
    kvs__staging_hooks_t h = {.fail_transfer_key = -1, .fail_receive_key = 1};
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    int64_t res[3];
    CHECK_STATUS(read_keys(c, &d, keys, 3, res), KVS_OK);
    CHECK_EQ_INT(res[0], 10000);
    CHECK_STATUS(res[1], KVS_TRANSFER_FAIL);
    CHECK_EQ_INT(res[2], 30000);
    CHECK(key_exact(&d, 0, "r0"));
    CHECK(key_guarded(&d, 1)); /* never scattered, never replayed */
    CHECK(key_exact(&d, 2, "r2"));
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.staged_reads, 1);
    CHECK_EQ_U64(s.scatter_launches, 1);
    CHECK_EQ_U64(s.get_submissions, 0); /* no direct read happened */
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_injected_scatter_failure(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    const char *keys[3] = {"f0", "f1", "missing"};
    uint64_t sizes[3] = {40000, 50000, 100};
    put_key(c, "f0", sizes[0]);
    put_key(c, "f1", sizes[1]);
    dest_t d;
    dest_init(c, &d, sizes, 3);
    kvs__staging_hooks_t h = {
        .fail_transfer_key = -1, .fail_receive_key = -1, .fail_scatter = true};
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    int64_t res[3];
    CHECK_STATUS(read_keys(c, &d, keys, 3, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_TRANSFER_FAIL);
    CHECK_STATUS(res[1], KVS_TRANSFER_FAIL);
    CHECK_STATUS(res[2], KVS_OBJECT_NOT_FOUND);
    for (int i = 0; i < 3; i++)
        CHECK(key_guarded(&d, i));
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.get_submissions, 0);
    CHECK_EQ_U64(s.get_transfer_fail, 2);
    /* Without the fault the same call is exact. */
    h.fail_scatter = false;
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    CHECK_STATUS(read_keys(c, &d, keys, 2, res), KVS_OK);
    CHECK(key_exact(&d, 0, "f0"));
    CHECK(key_exact(&d, 1, "f1"));
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_stalled_scatter_is_aborted_at_the_deadline(void)
{
    /* A scatter that never finishes by itself (a kernel whose host stopped publishing): the call
     * waits for it only until its deadline (300 ms), aborts it there and fails its keys with
     * TIMED_OUT, nothing written and nothing replayed; the next call is exact. Before the wait
     * was bounded, such a call never returned. */
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 300, NULL);
    const char *keys[3] = {"h0", "h1", "h2"};
    uint64_t sizes[3] = {10000, 20000, 30000};
    for (int i = 0; i < 3; i++)
        put_key(c, keys[i], sizes[i]);
    dest_t d;
    dest_init(c, &d, sizes, 3);
    kvs__staging_hooks_t h = {
        .fail_transfer_key = -1, .fail_receive_key = -1, .stall_scatter = true};
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    int64_t res[3];
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(read_keys(c, &d, keys, 3, res), KVS_OK);
    uint64_t ms = (kvs__now_ns() - t0) / 1000000;
    printf("  stalled scatter: the call returned after %llu ms (deadline 300 ms)\n",
           (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 250); /* it did wait for the scatter, up to the deadline */
    CHECK_CMP_U64(ms, <, 400);  /* and no longer than the deadline plus 100 ms */
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(res[i], KVS_TIMED_OUT);
        CHECK(key_guarded(&d, i));
    }
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.scatter_launches, 1);
    CHECK_EQ_U64(s.get_submissions, 0); /* no direct replay */
    h.stall_scatter = false;
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    CHECK_STATUS(read_keys(c, &d, keys, 3, res), KVS_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
        CHECK(key_exact(&d, i, keys[i]));
    }
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_alloc_failure_disables_staging(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "k", 5000);
    uint64_t sizes[1] = {5000};
    const char *keys[1] = {"k"};
    dest_t d;
    dest_init(c, &d, sizes, 1);
    kvs__staging_hooks_t h = {.fail_transfer_key = -1, .fail_receive_key = -1, .fail_alloc = true};
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    int64_t r;
    for (int i = 0; i < 3; i++) {
        memset(d.pool, GUARD, d.pool_len);
        CHECK_STATUS(read_keys(c, &d, keys, 1, &r), KVS_OK);
        CHECK_EQ_INT(r, 5000);
        CHECK(key_exact(&d, 0, "k"));
        if (i == 0) { /* the allocation is never tried again, fault or not */
            h.fail_alloc = false;
            kvs__staging_set_hooks(kvs__client_staging(c), &h);
        }
    }
    kvs_client_stats_t s = stats(c);
    CHECK_EQ_U64(s.fallback_alloc_failed, 3);
    CHECK_EQ_U64(s.staged_reads, 0);
    uint64_t bytes;
    CHECK(kvs__staging_buffer(kvs__client_staging(c), &bytes) == NULL);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

static void test_staging_late_completion_lands_nowhere(void)
{
    /* Every data request of the owner stalls 600 ms; reads (over tcp, where the stall is on the
     * data path) give up after 200 ms. */
    setenv("KVS_PROTOCOL", "tcp", 1);
    store_t st;
    store_start(&st, "600000");
    kvs_client_t *w = staged_client(&st, 5000, NULL);
    put_key(w, "late", 64000);
    kvs_client_close(w);
    kvs_client_t *c = staged_client(&st, 200, NULL);
    uint64_t sizes[1] = {64000};
    const char *keys[1] = {"late"};
    dest_t d;
    dest_init(c, &d, sizes, 1);
    int64_t r;
    CHECK_STATUS(read_keys(c, &d, keys, 1, &r), KVS_OK);
    CHECK_STATUS(r, KVS_TIMED_OUT);
    uint64_t bytes = 0;
    uint8_t *buf = kvs__staging_buffer(kvs__client_staging(c), &bytes);
    CHECK(buf != NULL);
    memset(buf, GUARD, bytes);
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(read_keys(c, &d, keys, 1, &r), KVS_OK);
    CHECK_STATUS(r, KVS_TIMED_OUT);
    CHECK_CMP_U64((kvs__now_ns() - t0) / 1000000, <, 500);
    /* Well past the owner's answer: nothing arrived in the buffer or the destinations. */
    usleep(900000);
    for (uint64_t i = 0; i < bytes; i++) {
        if (buf[i] != GUARD)
            kvs_test_fail(__FILE__, __LINE__, "staging byte %llu written after return",
                          (unsigned long long)i);
    }
    CHECK(key_guarded(&d, 0));
    CHECK_EQ_U64(stats(c).get_timed_out, 2);
    CHECK_EQ_U64(stats(c).scatter_launches, 0);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- unregister and close during a staged read ----------------------------------------------- */

static void test_staging_unregister_and_close_wait_for_reads(void)
{
    setenv("KVS_PROTOCOL", "tcp", 1); /* the owner's stall holds the read in flight */
    store_t st;
    store_start(&st, "300000");
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    put_key(c, "u", 100000);
    uint64_t sizes[1] = {100000};
    const char *keys[1] = {"u"};
    dest_t d;
    dest_init(c, &d, sizes, 1);
    reader_t r = {.c = c, .d = &d, .keys = keys, .n = 1};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, reader_main, &r), 0);
    wait_call_in_flight(c);
    CHECK_STATUS(kvs_client_unregister_buffer(c, d.pool), KVS_OK);
    /* It returned only after the read was done with the memory: every byte is already there
     * (the reader thread may still be on its way out of the call). */
    CHECK(key_exact(&d, 0, "u"));
    pthread_join(t, NULL);
    CHECK_STATUS(r.rc, KVS_OK);
    CHECK_EQ_INT(r.res[0], 100000);
    CHECK(key_exact(&d, 0, "u"));
    CHECK_EQ_U64(stats(c).staged_reads, 1);
    /* close while a staged read is in flight. */
    memset(d.pool, GUARD, d.pool_len);
    CHECK_STATUS(kvs_client_register_buffer(c, d.pool, d.pool_len), KVS_OK);
    r.done = 0;
    CHECK_EQ_INT(pthread_create(&t, NULL, reader_main, &r), 0);
    wait_call_in_flight(c);
    kvs_client_close(c);
    CHECK(key_exact(&d, 0, "u")); /* close waited for the read */
    pthread_join(t, NULL);
    CHECK_STATUS(r.rc, KVS_OK);
    CHECK(key_exact(&d, 0, "u"));
    free(d.pool);
    server_stop(&st.srv);
}

/* Page-table reads: two regions of different page sizes and strides (say K and V of a layer),
 * page ids per key in random order, both fragment orders; staged when the pages cover the
 * object exactly. Page ids out of range are refused before any I/O; duplicate pages overlap and
 * fall back. Writes from pages put back what reads give. */
#define PT_PAGES 64
static void pt_expect(uint8_t *want, const char *key, size_t size)
{
    for (size_t i = 0; i < size; i++)
        want[i] = byte_of(key, i);
}

/* The bytes key i's pages hold, gathered in `order`, into out. */
static void pt_gather(const kvs_page_region_t *rg, size_t nr, kvs_page_order_t order,
                      const uint32_t *ids, size_t np, uint8_t *out)
{
    size_t o = 0;
    for (size_t a = 0; a < (order == KVS_PAGE_MAJOR ? np : nr); a++)
        for (size_t b = 0; b < (order == KVS_PAGE_MAJOR ? nr : np); b++) {
            size_t pg = order == KVS_PAGE_MAJOR ? a : b, r = order == KVS_PAGE_MAJOR ? b : a;
            memcpy(out + o, (uint8_t *)rg[r].base + ids[pg] * rg[r].stride, rg[r].page_bytes);
            o += rg[r].page_bytes;
        }
}

static void test_staging_page_table_reads(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    /* Region 0: 1 KiB pages every 1.5 KiB; region 1: 512-byte pages every 4 KiB. */
    size_t pool_len = PT_PAGES * 1536 + PT_PAGES * 4096;
    uint8_t *pool = malloc(pool_len);
    CHECK(pool != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
    kvs_page_region_t rg[2] = {{pool, 1024, 1536, PT_PAGES},
                               {pool + PT_PAGES * 1536, 512, 4096, PT_PAGES}};
    const size_t per_page = 1024 + 512, np = 8, size = np * per_page;
    const char *keys[3] = {"pt-a", "pt-b", "pt-c"};
    for (int k = 0; k < 3; k++)
        put_key(c, keys[k], size);
    uint8_t want[8 * 1536], got[8 * 1536];
    for (int order = KVS_PAGE_MAJOR; order <= KVS_REGION_MAJOR; order++) {
        /* 24 distinct pages, shuffled, 8 per key. */
        uint32_t ids[24];
        for (uint32_t i = 0; i < 24; i++)
            ids[i] = (i * 37 + (uint32_t)order * 11) % PT_PAGES;
        size_t npages[3] = {np, np, np};
        memset(pool, GUARD, pool_len);
        kvs_client_stats_t before = stats(c);
        int64_t res[3];
        CHECK_STATUS(kvs_client_batch_get_into_pages(c, 3, keys, rg, 2, (kvs_page_order_t)order,
                                                     ids, npages, false, res),
                     KVS_OK);
        for (int k = 0; k < 3; k++) {
            CHECK_EQ_INT(res[k], (int64_t)size);
            pt_gather(rg, 2, (kvs_page_order_t)order, ids + k * np, np, got);
            pt_expect(want, keys[k], size);
            CHECK_EQ_MEM(got, want, size);
        }
        /* Every byte of the pool outside the named pages is untouched. */
        for (int r = 0; r < 2; r++)
            for (uint32_t pg = 0; pg < PT_PAGES; pg++) {
                bool named = false;
                for (int j = 0; j < 24; j++)
                    named = named || ids[j] == pg;
                const uint8_t *at = (const uint8_t *)rg[r].base + pg * rg[r].stride;
                for (size_t b = named ? rg[r].page_bytes : 0;
                     b < rg[r].stride && at + b < pool + pool_len; b++)
                    CHECK_EQ_INT(at[b], GUARD);
            }
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(after.get_staged_calls - before.get_staged_calls, 1);
        CHECK_EQ_U64(after.planned_fragments - before.planned_fragments, 3 * np * 2);
        /* Write back from the pages under new keys: the same bytes come back by pointer. */
        const char *copies[3] = {order ? "pt-a2r" : "pt-a2p", order ? "pt-b2r" : "pt-b2p",
                                 order ? "pt-c2r" : "pt-c2p"};
        int pres[3];
        CHECK_STATUS(kvs_client_batch_put_from_pages(c, 3, copies, rg, 2, (kvs_page_order_t)order,
                                                     ids, npages, NULL, pres),
                     KVS_OK);
        for (int k = 0; k < 3; k++) {
            CHECK_STATUS(pres[k], KVS_OK);
            void *data = NULL;
            size_t dsize = 0;
            CHECK_STATUS(kvs_client_get(c, copies[k], &data, &dsize), KVS_OK);
            pt_expect(want, keys[k], size);
            CHECK_EQ_U64(dsize, size);
            CHECK_EQ_MEM(data, want, size);
            kvs_free(data);
        }
    }
    /* A page id past the region (in the second key): the call is refused before any I/O, the
     * pool untouched, and the message names the key and the page. */
    uint32_t bad2[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, PT_PAGES + 5};
    size_t two[2] = {np, np};
    int64_t r2[2] = {7, 7};
    CHECK_STATUS(
        kvs_client_batch_get_into_pages(c, 2, keys, rg, 2, KVS_REGION_MAJOR, bad2, two, false, r2),
        KVS_INVALID_PARAMS);
    CHECK(strstr(kvs_last_error(), "key 1 names page 69") != NULL);
    CHECK(r2[0] == 7 && r2[1] == 7);
    uint32_t bad[8] = {0, 1, 2, 3, 4, 5, 6, PT_PAGES};
    size_t one[1] = {np};
    int64_t r1 = 12345;
    memset(pool, GUARD, pool_len);
    kvs_client_stats_t before = stats(c);
    CHECK_STATUS(
        kvs_client_batch_get_into_pages(c, 1, keys, rg, 2, KVS_PAGE_MAJOR, bad, one, false, &r1),
        KVS_INVALID_PARAMS);
    CHECK(strstr(kvs_last_error(), "names page 64") != NULL);
    CHECK_EQ_INT(r1, 12345);
    CHECK_EQ_U64(stats(c).get_calls, before.get_calls);
    for (size_t b = 0; b < pool_len; b++)
        CHECK_EQ_INT(pool[b], GUARD);
    /* Bad regions: a stride below the page, no base, no pages; an unknown order. */
    kvs_page_region_t br = {pool, 1024, 512, PT_PAGES};
    uint32_t ok_ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK_STATUS(kvs_client_batch_get_into_pages(c, 1, keys, &br, 1, KVS_PAGE_MAJOR, ok_ids, one,
                                                 false, &r1),
                 KVS_INVALID_PARAMS);
    br = (kvs_page_region_t){NULL, 1024, 1024, PT_PAGES};
    CHECK_STATUS(kvs_client_batch_get_into_pages(c, 1, keys, &br, 1, KVS_PAGE_MAJOR, ok_ids, one,
                                                 false, &r1),
                 KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs_client_batch_get_into_pages(c, 1, keys, rg, 2, (kvs_page_order_t)7, ok_ids,
                                                 one, false, &r1),
                 KVS_INVALID_PARAMS);
    /* Duplicate pages overlap: the call is not staged (fallback_overlap) and still answers. */
    uint32_t dup[8] = {9, 9, 10, 11, 12, 13, 14, 15};
    before = stats(c);
    CHECK_STATUS(
        kvs_client_batch_get_into_pages(c, 1, keys, rg, 2, KVS_PAGE_MAJOR, dup, one, false, &r1),
        KVS_OK);
    CHECK_EQ_INT(r1, (int64_t)size);
    kvs_client_stats_t after = stats(c);
    CHECK_EQ_U64(after.fallback_overlap - before.fallback_overlap, 1);
    CHECK_EQ_U64(after.get_direct_calls - before.get_direct_calls, 1);
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    free(pool);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* Checks that pages named by ids hold key k's bytes and every other byte of `pool` is GUARD,
 * except the pages of `skip` (never written: GUARD too). */
static void pt_check_pool(const kvs_page_region_t *rg, size_t nr, kvs_page_order_t order,
                          const uint32_t *ids, size_t nkeys, size_t np, const char *const *keys,
                          int skip, const uint8_t *pool, size_t pool_len)
{
    size_t row = 0;
    for (size_t r = 0; r < nr; r++)
        row += rg[r].page_bytes;
    uint8_t *want = malloc(np * row), *got = malloc(np * row), *mine = calloc(pool_len, 1);
    CHECK(want != NULL && got != NULL && mine != NULL);
    for (size_t k = 0; k < nkeys; k++) {
        for (size_t r = 0; r < nr; r++)
            for (size_t j = 0; j < np; j++)
                memset(mine + ((const uint8_t *)rg[r].base - pool) + ids[k * np + j] * rg[r].stride,
                       (int)k == skip ? 0 : 1, rg[r].page_bytes);
        if ((int)k == skip)
            continue;
        pt_gather(rg, nr, order, ids + k * np, np, got);
        pt_expect(want, keys[k], np * row);
        CHECK_EQ_MEM(got, want, np * row);
    }
    for (size_t b = 0; b < pool_len; b++)
        if (!mine[b])
            CHECK_EQ_INT(pool[b], GUARD);
    free(want);
    free(got);
    free(mine);
}

/* The page scatter's plan (no fragment list on the staged path): K and V halves of one tensor
 * interleaved at one stride stage (they share no byte); pages over 64 KiB are cut into slices;
 * keys spread over two whole-buffer fills; a key whose receive fails is skipped within its fill's
 * launches,
 * its pages untouched; regions that do share bytes, and a page named twice among sparse ids (the
 * sorted check), fall back. Stats name the staging device, the last call's fills and the plan
 * time overlapped with the first fill. */
static void test_staging_page_table_plan(void)
{
    store_t st;
    store_start(&st, NULL);
    const char *half = getenv("MC_STORE_GPU_STAGING_HALF_FILLS");
    char *keep = half != NULL ? strdup(half) : NULL;
    setenv("MC_STORE_GPU_STAGING_HALF_FILLS", "0", 1); /* two keys a fill, so one can fail */
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    if (keep != NULL)
        setenv("MC_STORE_GPU_STAGING_HALF_FILLS", keep, 1);
    else
        unsetenv("MC_STORE_GPU_STAGING_HALF_FILLS");
    free(keep);
    enum { P = 16, NP = 3, NK = 4 };
    const size_t big = (80u << 10) + 5, kv = 3000;
    size_t pool_len = P * 8192 + P * (96u << 10);
    uint8_t *pool = malloc(pool_len);
    CHECK(pool != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
    kvs_page_region_t rg[3] = {
        {pool, kv, 8192, P}, {pool + 4096, kv, 8192, P}, {pool + P * 8192, big, 96u << 10, P}};
    const size_t size = NP * (2 * kv + big);
    const char *keys[NK] = {"pp-0", "pp-1", "pp-2", "pp-3"};
    for (int k = 0; k < NK; k++)
        put_key(c, keys[k], size);
    size_t npages[NK] = {NP, NP, NP, NP};
    for (int order = KVS_PAGE_MAJOR; order <= KVS_REGION_MAJOR; order++) {
        for (int fail = -1; fail <= 1; fail += 2) {
            uint32_t ids[NK * NP];
            for (uint32_t i = 0; i < NK * NP; i++)
                ids[i] = (i * 5 + (uint32_t)order * 3 + (uint32_t)(fail + 1)) % P;
            kvs__staging_hooks_t h = {.fail_transfer_key = -1, .fail_receive_key = fail};
            kvs__staging_set_hooks(kvs__client_staging(c), &h);
            memset(pool, GUARD, pool_len);
            kvs_client_stats_t before = stats(c);
            int64_t res[NK];
            CHECK_STATUS(kvs_client_batch_get_into_pages(
                             c, NK, keys, rg, 3, (kvs_page_order_t)order, ids, npages, false, res),
                         KVS_OK);
            for (int k = 0; k < NK; k++) {
                if (k == fail)
                    CHECK_STATUS(res[k], KVS_TRANSFER_FAIL);
                else
                    CHECK_EQ_INT(res[k], (int64_t)size);
            }
            pt_check_pool(rg, 3, (kvs_page_order_t)order, ids, NK, NP, keys, fail, pool, pool_len);
            kvs_client_stats_t after = stats(c);
            CHECK_EQ_U64(after.get_staged_calls - before.get_staged_calls, 1);
            CHECK_EQ_U64(after.get_page_table_calls - before.get_page_table_calls, 1);
            CHECK(after.get_lookup_ns > before.get_lookup_ns); /* one lookup RPC, timed */
            CHECK_EQ_U64(after.fallback_overlap - before.fallback_overlap, 0);
            CHECK_EQ_U64(after.get_submissions - before.get_submissions, 0);
            CHECK_EQ_U64(after.fills - before.fills, 2); /* 4 x 258 KiB in a 1 MiB buffer */
            CHECK_EQ_U64(after.staging_last_fills, 2);
            /* A failed key in the middle of a fill splits its launch in two. */
            CHECK_EQ_U64(after.scatter_launches - before.scatter_launches, fail < 0 ? 2 : 3);
            CHECK(after.plan_overlapped_ns > before.plan_overlapped_ns);
            /* Pipelined: three keys in the first fill, the fourth looked up beside it. */
            CHECK(after.get_lookup_overlapped_ns > before.get_lookup_overlapped_ns);
        }
    }
    kvs__staging_hooks_t none = {.fail_transfer_key = -1, .fail_receive_key = -1};
    kvs__staging_set_hooks(kvs__client_staging(c), &none);
    /* A key missing from the late part keeps its pages untouched; the rest are exact. */
    {
        const char *gone[NK] = {"pp-0", "pp-1", "pp-2", "pp-gone"};
        uint32_t ids[NK * NP];
        for (uint32_t i = 0; i < NK * NP; i++)
            ids[i] = (i * 7 + 1) % P;
        memset(pool, GUARD, pool_len);
        kvs_client_stats_t before = stats(c);
        int64_t res[NK];
        CHECK_STATUS(kvs_client_batch_get_into_pages(c, NK, gone, rg, 3, KVS_REGION_MAJOR, ids,
                                                     npages, false, res),
                     KVS_OK);
        for (int k = 0; k < NK; k++)
            CHECK_EQ_INT(res[k], k == 3 ? KVS_OBJECT_NOT_FOUND : (int64_t)size);
        pt_check_pool(rg, 3, KVS_REGION_MAJOR, ids, NK, NP, gone, 3, pool, pool_len);
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(after.get_staged_calls - before.get_staged_calls, 1);
        CHECK_EQ_U64(after.staged_keys - before.staged_keys, 3);
        CHECK_EQ_U64(after.fills - before.fills, 1); /* as one lookup would have planned */
        CHECK_EQ_U64(after.scatter_launches - before.scatter_launches, 1);
        CHECK(after.get_lookup_overlapped_ns > before.get_lookup_overlapped_ns);
    }
    /* A page named twice. Within the first fill the call falls back before anything is
     * submitted; among the later keys it is found while the first fill's transfers run, and the
     * call is drained unscattered and read direct (docs/staging.md, item 5). The twice-named
     * pages receive the same object twice, so every page's bytes are known. */
    for (int later = 0; later < 3; later++) {
        /* later 2: the first fill's keys are all missing, so nothing is in flight beside the
         * rest's check, which counts as serial planning */
        const char *dup2[NK] = {"pp-gone-0", "pp-gone-1", "pp-gone-2", "pp-0"};
        const char *dup1[NK] = {"pp-0", "pp-1", "pp-2", "pp-0"};
        const char *dup0[NK] = {"pp-0", "pp-0", "pp-2", "pp-3"};
        const char *const *dup = later == 2 ? dup2 : later ? dup1 : dup0;
        int twin = later ? 3 : 1;
        uint32_t ids[NK * NP];
        for (uint32_t i = 0; i < NK * NP; i++)
            ids[i] = (i * 5 + 2) % P;
        for (uint32_t j = 0; j < NP; j++)
            ids[twin * NP + j] = ids[j];
        memset(pool, GUARD, pool_len);
        kvs_client_stats_t before = stats(c);
        int64_t res[NK];
        CHECK_STATUS(kvs_client_batch_get_into_pages(c, NK, dup, rg, 3, KVS_PAGE_MAJOR, ids, npages,
                                                     false, res),
                     KVS_OK);
        for (int k = 0; k < NK; k++)
            CHECK_EQ_INT(res[k], later == 2 && k < 3 ? KVS_OBJECT_NOT_FOUND : (int64_t)size);
        if (later < 2)
            pt_check_pool(rg, 3, KVS_PAGE_MAJOR, ids, NK, NP, dup, -1, pool, pool_len);
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(after.fallback_overlap - before.fallback_overlap, 1);
        CHECK_EQ_U64(after.get_staged_calls - before.get_staged_calls, 0);
        CHECK_EQ_U64(after.get_direct_calls - before.get_direct_calls, 1);
        CHECK_EQ_U64(after.fills - before.fills, 0);
        CHECK_EQ_U64(after.scatter_launches - before.scatter_launches, 0);
        /* Only the later repeat was checked, and looked up, beside a fill's transfers. */
        CHECK_EQ_INT(after.plan_overlapped_ns > before.plan_overlapped_ns, later == 1);
        CHECK_EQ_INT(after.get_lookup_overlapped_ns > before.get_lookup_overlapped_ns, later == 1);
    }
    /* V starting 1 KiB into K's 3000-byte pages: the regions share bytes, not staged. */
    kvs_page_region_t bad[3] = {rg[0], {pool + 1024, kv, 8192, P}, rg[2]};
    uint32_t ids[NP] = {1, 2, 3};
    int64_t r1 = 0;
    kvs_client_stats_t before = stats(c);
    CHECK_STATUS(kvs_client_batch_get_into_pages(c, 1, keys, bad, 3, KVS_PAGE_MAJOR, ids, npages,
                                                 false, &r1),
                 KVS_OK);
    CHECK_EQ_INT(r1, (int64_t)size);
    kvs_client_stats_t after = stats(c);
    CHECK_EQ_U64(after.fallback_overlap - before.fallback_overlap, 1);
    CHECK_EQ_U64(after.get_direct_calls - before.get_direct_calls, 1);
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    free(pool);
    /* Sparse ids in a pool of 2^21 16-byte pages: the repeat check sorts them. */
    enum { SP = 1 << 21 };
    uint8_t *sp = malloc((size_t)SP * 16);
    CHECK(sp != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, sp, (size_t)SP * 16), KVS_OK);
    kvs_page_region_t srg = {sp, 16, 16, SP};
    put_key(c, "sparse", 64);
    const char *sk[1] = {"sparse"};
    size_t four[1] = {4};
    uint32_t sids[4] = {2000000, 7, 1500001, SP - 1};
    memset(sp, GUARD, (size_t)SP * 16);
    before = stats(c);
    CHECK_STATUS(
        kvs_client_batch_get_into_pages(c, 1, sk, &srg, 1, KVS_PAGE_MAJOR, sids, four, false, &r1),
        KVS_OK);
    CHECK_EQ_INT(r1, 64);
    uint8_t want[64];
    pt_expect(want, "sparse", 64);
    for (int j = 0; j < 4; j++)
        CHECK_EQ_MEM(sp + (size_t)sids[j] * 16, want + j * 16, 16);
    after = stats(c);
    CHECK_EQ_U64(after.get_staged_calls - before.get_staged_calls, 1);
    sids[2] = 7; /* the same page twice */
    CHECK_STATUS(
        kvs_client_batch_get_into_pages(c, 1, sk, &srg, 1, KVS_PAGE_MAJOR, sids, four, false, &r1),
        KVS_OK);
    CHECK_EQ_INT(r1, 64);
    CHECK_EQ_U64(stats(c).fallback_overlap - after.fallback_overlap, 1);
    CHECK_STATUS(kvs_client_unregister_buffer(c, sp), KVS_OK);
    free(sp);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* A grouped call (prefer_alloc_in_same_node) that cannot stage reads grouped: one submission
 * per owner, as without staging. */
static void test_staging_grouped_fallback_stays_grouped(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    const char *keys[3] = {"g0", "g1", "g2"};
    uint64_t sizes[3] = {BUDGET + 500000, BUDGET + 500000, BUDGET + 500000};
    for (int i = 0; i < 3; i++)
        put_key(c, keys[i], sizes[i]);
    for (int grouped = 0; grouped < 2; grouped++) {
        dest_t d;
        dest_init(c, &d, sizes, 3);
        int64_t res[3];
        kvs_client_stats_t a = stats(c);
        CHECK_STATUS(
            kvs_client_batch_get_into_multi_buffers(c, 3, keys, d.bufs, d.nbufs, grouped != 0, res),
            KVS_OK);
        kvs_client_stats_t b = stats(c);
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, keys[i]));
        }
        CHECK_EQ_U64(b.fallback_too_large - a.fallback_too_large, 1);
        CHECK_EQ_U64(b.get_submissions - a.get_submissions, grouped ? 1 : 3);
        CHECK_EQ_U64(b.get_grouped_unstaged_calls - a.get_grouped_unstaged_calls,
                     (uint64_t)grouped);
        dest_free(c, &d);
    }
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* Whatever allocation fails inside a pipelined read (one at a time, at every point of the
 * call), the call fails or each key's result is its object's size with exactly its bytes: never
 * success with bytes that were not written. The last key's pages hold more than its object,
 * so the rest of the lookup also makes the call ineligible (the path that builds fragments). */
static void test_staging_pipelined_read_under_allocation_failures(void)
{
    store_t st;
    store_start(&st, NULL);
    setenv("MC_STORE_GPU_STAGING_HALF_FILLS", "0", 1);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    unsetenv("MC_STORE_GPU_STAGING_HALF_FILLS");
    enum { P = 16, NP = 3, NK = 4 };
    const size_t big = (80u << 10) + 5, kv = 3000, size = NP * (2 * kv + big);
    size_t pool_len = P * 8192 + P * (96u << 10);
    uint8_t *pool = malloc(pool_len), *got = malloc(size), *want = malloc(size);
    CHECK(pool != NULL && got != NULL && want != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
    kvs_page_region_t rg[3] = {
        {pool, kv, 8192, P}, {pool + 4096, kv, 8192, P}, {pool + P * 8192, big, 96u << 10, P}};
    for (int shape = 0; shape < 2; shape++) {
        const char *names[2][NK] = {{"oom-0", "oom-1", "oom-2", "oom-3"},
                                    {"oomb-0", "oomb-1", "oomb-2", "oomb-3"}};
        const char *const *keys = names[shape];
        size_t osz[NK] = {size, size, size, shape ? size - 100 : size};
        for (int k = 0; k < NK; k++)
            put_key(c, keys[k], osz[k]);
        size_t npages[NK] = {NP, NP, NP, NP};
        uint32_t ids[NK * NP];
        for (uint32_t i = 0; i < NK * NP; i++)
            ids[i] = (i * 5 + 3) % P;
        int failed_calls = 0, whole = 0, clean = 0;
        kvs_client_stats_t before = stats(c);
        /* Until the injection point lies past every allocation of a call (calls it misses in a
         * row read everything). */
        for (long n = 0; n < 2000 && clean < 8; n++) {
            memset(pool, GUARD, pool_len);
            int64_t res[NK] = {0};
            kvs__alloc_inject_failure(n, false);
            int rc = kvs_client_batch_get_into_pages(c, NK, keys, rg, 3, KVS_REGION_MAJOR, ids,
                                                     npages, false, res);
            kvs__alloc_inject_failure(-1, false);
            if (rc != KVS_OK) {
                failed_calls++;
                continue;
            }
            int ok = 0;
            for (int k = 0; k < NK; k++) {
                if (res[k] < 0)
                    continue;
                CHECK_EQ_INT(res[k], (int64_t)osz[k]);
                pt_gather(rg, 3, KVS_REGION_MAJOR, ids + k * NP, NP, got);
                pt_expect(want, keys[k], osz[k]);
                CHECK_EQ_MEM(got, want, osz[k]);
                ok++;
            }
            whole += ok == NK;
            clean = ok == NK ? clean + 1 : 0;
        }
        /* Failures were injected, and calls they missed read every key; the calls were
         * pipelined, and with the larger key they read direct. */
        CHECK(failed_calls > 0);
        CHECK(whole > 0);
        kvs_client_stats_t after = stats(c);
        CHECK(after.get_lookup_overlapped_ns > before.get_lookup_overlapped_ns);
        if (shape)
            CHECK(after.fallback_not_exact > before.fallback_not_exact);
        else
            CHECK(after.staged_reads > before.staged_reads);
    }
    CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
    free(pool);
    free(got);
    free(want);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* Keys that lie one after another in the segment and in the buffer are one transfer of their
 * fill; keys read in another order are not merged. Bytes are exact either way. */
static void test_staging_adjacent_keys_are_one_transfer(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = staged_client(&st, 5000, NULL);
    enum { N = 8 };
    const char *keys[N] = {"adj-0", "adj-1", "adj-2", "adj-3", "adj-4", "adj-5", "adj-6", "adj-7"};
    uint64_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = 64u << 10;
        put_key(c, keys[i], sizes[i]);
    }
    for (int reversed = 0; reversed < 2; reversed++) {
        const char *order[N];
        for (int i = 0; i < N; i++)
            order[i] = keys[reversed ? N - 1 - i : i];
        dest_t d;
        dest_init(c, &d, sizes, N);
        kvs_client_stats_t before = stats(c);
        int64_t res[N];
        CHECK_STATUS(read_keys(c, &d, order, N, res), KVS_OK);
        for (int i = 0; i < N; i++) {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, order[i]));
        }
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(after.staged_reads - before.staged_reads, 1);
        uint64_t transfers = after.staging_transfers - before.staging_transfers;
        if (reversed)
            CHECK_EQ_U64(transfers, N);
        else
            CHECK(transfers < N); /* one put after another: the allocator placed them in order */
        dest_free(c, &d);
    }
    /* The transfer carrying key 3 fails: every key it carries fails, untouched; the others
     * land exactly. */
    dest_t d;
    dest_init(c, &d, sizes, N);
    kvs__staging_hooks_t h = {.fail_transfer_key = 3, .fail_receive_key = -1};
    kvs__staging_set_hooks(kvs__client_staging(c), &h);
    kvs_client_stats_t before = stats(c);
    int64_t res[N];
    CHECK_STATUS(read_keys(c, &d, keys, N, res), KVS_OK);
    uint64_t transfers = stats(c).staging_transfers - before.staging_transfers, failed = 0;
    for (int i = 0; i < N; i++) {
        if (res[i] == KVS_TRANSFER_FAIL) {
            failed++;
            CHECK(key_guarded(&d, i));
        } else {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, keys[i]));
        }
    }
    CHECK_STATUS(res[3], KVS_TRANSFER_FAIL);
    printf("  %llu transfer(s) for %d keys; the one carrying key 3 failed %llu key(s)\n",
           (unsigned long long)transfers, N, (unsigned long long)failed);
    if (transfers == 1)
        CHECK_EQ_U64(failed, N);
    dest_free(c, &d);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* The plan refuses ids above the call's checked largest (ids changed under a running call), as
 * does the fragment expansion. */
static void test_page_ids_rechecked_where_used(void)
{
    static uint8_t pool[64 * 16];
    kvs_page_region_t rg = {pool, 16, 16, 64};
    kvs__page_layout_t L = {&rg, 1, KVS_PAGE_MAJOR, 5};
    uint32_t ids[3] = {1, 5, 9}; /* 9: past the checked largest, 5 */
    kvs__pt_pages_t k = {ids, 3};
    uint32_t nslices;
    uint64_t row, off = 0;
    CHECK_STATUS(kvs__pt_slices(&L, &nslices, &row), KVS_OK);
    uint64_t blob[64];
    CHECK(kvs__pt_plan_bytes(&L, nslices, &k, sizeof(k), 1) <= sizeof(blob));
    kvs__pt_plan_t plan;
    CHECK_STATUS(
        kvs__pt_plan_build(&L, nslices, row, &k, sizeof(k), 1, &off, blob, (uintptr_t)blob, &plan),
        KVS_INVALID_PARAMS);
    struct iovec iov[3];
    CHECK(!kvs__pages_fragments(&L, ids, 3, iov));
    ids[2] = 4;
    CHECK_STATUS(
        kvs__pt_plan_build(&L, nslices, row, &k, sizeof(k), 1, &off, blob, (uintptr_t)blob, &plan),
        KVS_OK);
    CHECK(kvs__pages_fragments(&L, ids, 3, iov));
    CHECK(iov[2].iov_base == pool + 4 * 16 && iov[2].iov_len == 16);
}

/* The largest id, at every position of calls of every length up to 100 (the vectorised blocks
 * and the tail); the three repeat checks (a byte per id, a bit per id, sorting) agree on ids of
 * three keys, first all distinct, then with one repeated across keys and within a key. */
/* The repeat checks on fresh maps (theirs to keep, so that a call checks in parts). */
static bool repeat_bytes(const kvs__staged_key_t *keys, uint32_t n, uint8_t *seen, uint64_t np)
{
    memset(seen, 0, (size_t)np);
    return kvs__pt_ids_repeat_bytes(keys, n, seen, np);
}

static bool repeat_bits(const kvs__staged_key_t *keys, uint32_t n, uint64_t *bm, uint64_t np)
{
    memset(bm, 0, (size_t)(np + 63) / 64 * sizeof(*bm));
    return kvs__pt_ids_repeat(keys, n, bm, np);
}

static void test_page_id_max_and_repeats(void)
{
    uint32_t ids[100];
    for (uint32_t n = 0; n <= 100; n++)
        for (uint32_t at = 0; at < KVS_MAX(n, 1u); at++) {
            for (uint32_t j = 0; j < n; j++)
                ids[j] = (j * 37u) % 50u;
            if (n > 0)
                ids[at] = 1000u + at;
            CHECK_EQ_U64(kvs__pt_ids_max(ids, n), n > 0 ? 1000u + at : 0u);
        }
    enum { N = 300 };
    static uint32_t perm[N], tmp[N];
    static uint64_t bm[N / 64 + 1];
    static uint8_t seen[N];
    for (uint32_t j = 0; j < N; j++)
        perm[j] = (j * 7u) % N; /* 7 and 300 are coprime: a permutation */
    kvs__staged_key_t keys[3];
    memset(keys, 0, sizeof(keys));
    for (int i = 0; i < 3; i++)
        keys[i].pages = (kvs__pt_pages_t){perm + 100 * i, 100};
    CHECK(!repeat_bytes(keys, 3, seen, N));
    CHECK(!repeat_bits(keys, 3, bm, N));
    CHECK(!kvs__pt_ids_repeat_sorted(keys, 3, tmp));
    uint32_t keep = perm[250];
    perm[250] = perm[3]; /* key 2 names a page of key 0 */
    CHECK(repeat_bytes(keys, 3, seen, N));
    CHECK(repeat_bits(keys, 3, bm, N));
    CHECK(kvs__pt_ids_repeat_sorted(keys, 3, tmp));
    /* In parts, as a call checks its first fill and then the rest beside it: the map keeps
     * key 0's ids. */
    memset(seen, 0, sizeof(seen));
    memset(bm, 0, sizeof(bm));
    CHECK(!kvs__pt_ids_repeat_bytes(keys, 1, seen, N));
    CHECK(kvs__pt_ids_repeat_bytes(keys + 1, 2, seen, N));
    CHECK(!kvs__pt_ids_repeat(keys, 1, bm, N));
    CHECK(kvs__pt_ids_repeat(keys + 1, 2, bm, N));
    perm[250] = keep;
    perm[199] = perm[150]; /* twice within key 1 */
    CHECK(repeat_bytes(keys, 3, seen, N));
    CHECK(repeat_bits(keys, 3, bm, N));
    CHECK(kvs__pt_ids_repeat_sorted(keys, 3, tmp));
    /* An id past the map (changed by the caller after the call checked it): refused, not
     * indexed (the ASan stage would see the write). */
    for (uint32_t j = 0; j < N; j++)
        perm[j] = (j * 7u) % N;
    perm[120] = 1u << 30;
    CHECK(repeat_bytes(keys, 3, seen, N));
    CHECK(repeat_bits(keys, 3, bm, N));
    /* The direct path's fragments check every id as they are made. */
    static uint8_t pool[N * 16];
    kvs_page_region_t rg = {pool, 16, 16, N};
    kvs__page_layout_t L = {&rg, 1, KVS_PAGE_MAJOR, N - 1};
    static struct iovec iov[100];
    CHECK(!kvs__pages_fragments(&L, perm + 100, 100, iov));
    perm[120] = 5;
    CHECK(kvs__pages_fragments(&L, perm + 100, 100, iov));
    CHECK(iov[20].iov_base == pool + 5 * 16 && iov[20].iov_len == 16);
}

/* The scatter's launch options (issue 29): defaults, values, and malformed values refused with
 * the default kept; a malformed one is also told at client setup. */
static void test_scatter_options(void)
{
    kvs__scatter_options_t o;
    unsetenv("MC_STORE_GPU_STAGING_SCATTER_BLOCKS");
    unsetenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY");
    CHECK_STATUS(kvs__staging_scatter_options(&o), KVS_OK);
    /* Chosen from the interference benchmark (docs/scatter.md): a full grid at normal priority. */
    CHECK(o.blocks == 0 && !o.high_priority);
    setenv("MC_STORE_GPU_STAGING_SCATTER_BLOCKS", "16", 1);
    setenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY", "HIGH", 1);
    CHECK_STATUS(kvs__staging_scatter_options(&o), KVS_OK);
    CHECK(o.blocks == 16 && o.high_priority);
    setenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY", "normal", 1);
    CHECK_STATUS(kvs__staging_scatter_options(&o), KVS_OK);
    CHECK(o.blocks == 16 && !o.high_priority);
    setenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY", "", 1); /* empty: the default */
    CHECK_STATUS(kvs__staging_scatter_options(&o), KVS_OK);
    CHECK(o.blocks == 16 && !o.high_priority);
    setenv("MC_STORE_GPU_STAGING_SCATTER_BLOCKS", "70000", 1);
    setenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY", "urgent", 1);
    CHECK_STATUS(kvs__staging_scatter_options(&o), KVS_INVALID_PARAMS);
    CHECK(o.blocks == 0 && !o.high_priority);
    CHECK(strstr(kvs_last_error(), "MC_STORE_GPU_STAGING_SCATTER_PRIORITY=urgent") != NULL);
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    kvs__staging_config_t cfg;
    CHECK_STATUS(kvs__staging_config_init(&cfg), KVS_INVALID_PARAMS);
    unsetenv("MC_STORE_GPU_STAGING_SCATTER_BLOCKS");
    unsetenv("MC_STORE_GPU_STAGING_SCATTER_PRIORITY");
    CHECK_STATUS(kvs__staging_config_init(&cfg), KVS_OK);
    unsetenv("MC_STORE_GPU_STAGING");
}

/* The adaptive policy alone, on synthetic shapes and measurements (no timing): the model picks
 * staged where per-fragment costs dominate and direct where a fill costs more; a plausible mode
 * a shape has not measured is tried once; measurements then decide, and a shape measured slower
 * staged says so. */
static void test_policy_model_and_measurements(void)
{
    kvs__policy_t *p = kvs__policy_create();
    CHECK(p != NULL);
    kvs__staging_calib_t cal = {.frag_ns = 1000,
                                .call_ns = 0,
                                .scatter_ns_per_byte = 0.001,
                                .fill_ns = 20000,
                                .plan_ns_per_frag = 1};
    kvs__policy_set_calibration(p, &cal);
    kvs__policy_why_t why;
    /* 1536 fragments of 8 KiB: direct 1.5 ms of fragment cost, staged ~33 us. */
    kvs__read_shape_t many = {.bytes = 12u << 20,
                              .frags = 1536,
                              .keys = 1,
                              .owners = 1,
                              .fills = 1,
                              .cheap_submit = true};
    CHECK_EQ_INT(kvs__policy_choose(p, &many, true, &why), KVS_READ_STAGED);
    CHECK_EQ_INT(why, KVS_POLICY_BEST);
    CHECK(kvs__policy_choose(p, &many, false, &why) != KVS_READ_STAGED); /* cannot stage */
    /* One 64 KiB fragment: direct 1 us, staged 20 us of fill: not staged, by the model. */
    kvs__read_shape_t one = {
        .bytes = 64u << 10, .frags = 1, .keys = 1, .owners = 1, .fills = 1, .cheap_submit = true};
    kvs__read_mode_t m = kvs__policy_choose(p, &one, true, &why);
    CHECK(m == KVS_READ_DIRECT || m == KVS_READ_GROUPED);
    /* direct and grouped cost the same here: the other one is tried once, as a plausible mode */
    CHECK(why == KVS_POLICY_MODEL_SLOWER || why == KVS_POLICY_EXPLORE);
    /* 26 fragments of 80 KiB: direct 26 us, staged 22 us by the model, within 1.25x: the
     * first call already tries the unmeasured runner-up. */
    kvs__read_shape_t near = {.bytes = 26 * (80u << 10),
                              .frags = 26,
                              .keys = 1,
                              .owners = 1,
                              .fills = 1,
                              .cheap_submit = true};
    /* Shapes that differ only in their keys (one 12 MiB object, or 192 of 64 KiB, in 64 KiB
     * pages) never share measurements: direct costs per key. Measurements of the one that make
     * it read direct do not turn the other, whose 192 submissions the model counts, from
     * staged. */
    kvs__read_shape_t whole = {.bytes = 12u << 20,
                               .frags = 192,
                               .keys = 1,
                               .owners = 1,
                               .fills = 1,
                               .cheap_submit = false};
    kvs__read_shape_t split = whole;
    split.keys = split.owners = 192;
    CHECK_EQ_INT(kvs__policy_peek(p, &split, true), KVS_READ_STAGED);
    for (int i = 0; i < 4; i++)
        for (int q = 0; q < KVS_READ_MODES_; q++)
            kvs__policy_observe(p, &whole, (kvs__read_mode_t)q,
                                q == KVS_READ_DIRECT ? 1000 : 1000000000);
    CHECK_EQ_INT(kvs__policy_peek(p, &whole, true), KVS_READ_DIRECT);
    CHECK_EQ_INT(kvs__policy_peek(p, &split, true), KVS_READ_STAGED);
    /* A peek (a pipelined read asks before its lookup) answers what the choice will be and
     * counts nothing: the same exploration follows. */
    kvs__read_mode_t peeked = kvs__policy_peek(p, &near, true);
    CHECK_EQ_INT(kvs__policy_peek(p, &near, true), peeked);
    m = kvs__policy_choose(p, &near, true, &why);
    CHECK_EQ_INT(m, peeked);
    CHECK(m != KVS_READ_STAGED);
    CHECK_EQ_INT(why, KVS_POLICY_EXPLORE);
    /* 32 fragments of 64 KiB: direct 32 us, staged 20 us + 2 us: close, so both get measured. */
    kvs__read_shape_t close = {
        .bytes = 2u << 20, .frags = 32, .keys = 1, .owners = 1, .fills = 1, .cheap_submit = false};
    bool seen[KVS_READ_MODES_] = {false};
    for (int i = 0; i < 3; i++) {
        m = kvs__policy_choose(p, &close, true, &why);
        seen[m] = true;
        /* staged measures twice as slow as direct and grouped */
        kvs__policy_observe(p, &close, m, m == KVS_READ_STAGED ? 2000000 : 1000000);
    }
    CHECK(seen[KVS_READ_STAGED] && (seen[KVS_READ_DIRECT] || seen[KVS_READ_GROUPED]));
    m = kvs__policy_choose(p, &close, true, &why);
    CHECK(m != KVS_READ_STAGED);
    CHECK_EQ_INT(why, KVS_POLICY_MEASURED_SLOWER);
    /* Measurements that favour staging turn the shape around. */
    for (int i = 0; i < 8; i++)
        kvs__policy_observe(p, &close, KVS_READ_STAGED, 300000);
    CHECK_EQ_INT(kvs__policy_choose(p, &close, true, &why), KVS_READ_STAGED);
    /* 1536 keys of one 64 KiB fragment each, with submissions dear (the H200's shape where
     * auto once read grouped at 2x staged's time): a staged fill is one submission, not one per
     * key, so staging wins. */
    kvs__staging_calib_t dear_calls = {.frag_ns = 700,
                                       .call_ns = 10000,
                                       .scatter_ns_per_byte = 1.0 / 1700,
                                       .fill_ns = 30000,
                                       .plan_ns_per_frag = 2};
    kvs__policy_set_calibration(p, &dear_calls);
    kvs__read_shape_t keys = {.bytes = 1536ull << 16,
                              .frags = 1536,
                              .keys = 1536,
                              .owners = 1,
                              .fills = 1,
                              .cheap_submit = true};
    CHECK_EQ_INT(kvs__policy_choose(p, &keys, true, &why), KVS_READ_STAGED);
    kvs__policy_destroy(p);
}

/* A client in MC_STORE_GPU_STAGING=auto with host-backend staging and a 1 MiB buffer (the
 * environment is read at open), and its end with the store's. */
static kvs_client_t *auto_client(const store_t *st)
{
    setenv("MC_STORE_GPU_STAGING", "auto", 1);
    setenv("MC_STORE_GPU_STAGING_BACKEND", "host", 1);
    setenv("MC_STORE_GPU_STAGING_BUFFER_BYTES", "1MiB", 1);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = st->master;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    return c;
}

static void auto_client_close(kvs_client_t *c, store_t *st)
{
    kvs_client_close(c);
    server_stop(&st->srv);
    unsetenv("MC_STORE_GPU_STAGING");
    unsetenv("MC_STORE_GPU_STAGING_BACKEND");
    unsetenv("MC_STORE_GPU_STAGING_BUFFER_BYTES");
}

/* MC_STORE_GPU_STAGING=auto through a client (host backend): the first read calibrates the model
 * (once); with a model where fragments are dear a many-fragment read stages, with one where a
 * fill is dear it reads direct and counts why; bytes are exact either way. */
static void test_staging_auto_mode(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = auto_client(&st);
    kvs__staging_t *stg = kvs__client_staging(c);
    CHECK(stg != NULL && kvs__staging_policy(stg) != NULL);
    const char *keys[2] = {"auto-0", "auto-1"};
    uint64_t sizes[2] = {200000, 300000};
    for (int i = 0; i < 2; i++)
        put_key(c, keys[i], sizes[i]);
    for (int round = 0; round < 3; round++) {
        dest_t d;
        dest_init(c, &d, sizes, 2);
        kvs_client_stats_t before = stats(c);
        int64_t res[2];
        CHECK_STATUS(read_keys(c, &d, keys, 2, res), KVS_OK);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, keys[i]));
        }
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(after.auto_calibrations, 1); /* on first use only */
        /* the policy learned from the call, under the mode it chose */
        CHECK_EQ_U64(kvs__policy_observations(kvs__staging_policy(stg)), (uint64_t)round + 1);
        uint64_t chosen = (after.auto_direct_calls - before.auto_direct_calls) +
                          (after.auto_grouped_calls - before.auto_grouped_calls) +
                          (after.auto_staged_calls - before.auto_staged_calls);
        CHECK_EQ_U64(chosen, 1);
        CHECK_EQ_U64(after.staged_reads - before.staged_reads,
                     after.auto_staged_calls - before.auto_staged_calls);
        dest_free(c, &d);
        kvs__staging_calib_t cal;
        CHECK(kvs__policy_calibration(kvs__staging_policy(stg), &cal));
        CHECK(cal.frag_ns > 0 && cal.scatter_ns_per_byte > 0);
        /* Next rounds: fragments dear (round 1), then fills dear (round 2). */
        kvs__staging_calib_t dear_frags = {1e6, 0, 1e-6, 1, 0};
        kvs__staging_calib_t dear_fills = {1, 0, 1e-6, 1e9, 0};
        if (round < 2)
            kvs__policy_set_calibration(kvs__staging_policy(stg),
                                        round == 0 ? &dear_frags : &dear_fills);
        if (round == 1)
            CHECK_EQ_U64(after.auto_staged_calls - before.auto_staged_calls, 1);
        if (round == 2) {
            CHECK_EQ_U64(after.auto_staged_calls - before.auto_staged_calls, 0);
            CHECK(after.auto_not_staged_model - before.auto_not_staged_model +
                      (after.auto_explored - before.auto_explored) ==
                  1);
        }
    }
    auto_client_close(c, &st);
}

/* The adaptive mode pipelines a read's lookup when it would stage the call (asked before the
 * lookup, chosen from the first part's routes), and looks everything up first when it would
 * not. */
static void test_staging_auto_mode_pipelines_its_lookup(void)
{
    store_t st;
    store_start(&st, NULL);
    kvs_client_t *c = auto_client(&st);
    kvs__policy_t *pol = kvs__staging_policy(kvs__client_staging(c));
    CHECK(pol != NULL);
    enum { N = 8 };
    const char *keys[N] = {"ap-0", "ap-1", "ap-2", "ap-3", "ap-4", "ap-5", "ap-6", "ap-7"};
    uint64_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = 250000; /* two a half fill: the first fill hides the rest's lookup */
        put_key(c, keys[i], sizes[i]);
    }
    kvs__staging_calib_t dear_frags = {1e6, 0, 1e-6, 1, 0};
    kvs__staging_calib_t dear_fills = {1, 0, 1e-6, 1e9, 0};
    /* Round 2: staged chosen, but the buffer is busy: read unstaged, counted and learned once
     * as the staged choice. */
    for (int round = 0; round < 3; round++) {
        kvs__policy_set_calibration(pol, round == 1 ? &dear_fills : &dear_frags);
        if (round == 2)
            CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), true), KVS_OK);
        dest_t d;
        dest_init(c, &d, sizes, N);
        kvs_client_stats_t before = stats(c);
        uint64_t obs = kvs__policy_observations(pol);
        int64_t res[N];
        CHECK_STATUS(read_keys(c, &d, keys, N, res), KVS_OK);
        for (int i = 0; i < N; i++) {
            CHECK_EQ_INT(res[i], (int64_t)sizes[i]);
            CHECK(key_exact(&d, i, keys[i]));
        }
        kvs_client_stats_t after = stats(c);
        CHECK_EQ_U64(kvs__policy_observations(pol), obs + 1);
        uint64_t staged = after.auto_staged_calls - before.auto_staged_calls;
        uint64_t unstaged = (after.auto_direct_calls - before.auto_direct_calls) +
                            (after.auto_grouped_calls - before.auto_grouped_calls);
        CHECK_EQ_U64(staged, round == 1 ? 0 : 1);
        CHECK_EQ_U64(unstaged, round == 1 ? 1 : 0);
        CHECK_EQ_U64(after.staged_reads - before.staged_reads, round == 0 ? 1 : 0);
        CHECK_EQ_U64(after.fills - before.fills, round == 0 ? 4 : 0);
        CHECK_EQ_U64(after.fallback_busy - before.fallback_busy, round == 2 ? 1 : 0);
        CHECK_EQ_U64(after.get_submissions > before.get_submissions, round > 0);
        /* Staged: the rest was looked up beside the first fill. */
        CHECK_EQ_INT(after.get_lookup_overlapped_ns > before.get_lookup_overlapped_ns, round == 0);
        if (round == 2)
            CHECK_STATUS(kvs__staging_hold(kvs__client_staging(c), false), KVS_OK);
        dest_free(c, &d);
    }
    auto_client_close(c, &st);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_staging_exact_capacity),
        KVS_TEST_CASE(test_staging_seven_keys_four_fills),
        KVS_TEST_CASE(test_staging_half_buffer_fills),
        KVS_TEST_CASE(test_staging_pipelined_lookup),
        KVS_TEST_CASE(test_staging_pipelined_lookup_finds_a_larger_destination),
        KVS_TEST_CASE(test_staging_changing_destinations_duplicates_and_missing),
        KVS_TEST_CASE(test_staging_overlap_and_other_domain_fall_back),
        KVS_TEST_CASE(test_staging_busy_buffer_falls_back),
        KVS_TEST_CASE(test_staging_busy_wait_is_honoured),
        KVS_TEST_CASE(test_staging_concurrent_threads),
        KVS_TEST_CASE(test_staging_injected_receive_failure),
        KVS_TEST_CASE(test_staging_injected_scatter_failure),
        KVS_TEST_CASE(test_staging_stalled_scatter_is_aborted_at_the_deadline),
        KVS_TEST_CASE(test_staging_alloc_failure_disables_staging),
        KVS_TEST_CASE(test_staging_late_completion_lands_nowhere),
        KVS_TEST_CASE(test_staging_unregister_and_close_wait_for_reads),
        KVS_TEST_CASE(test_staging_page_table_reads),
        KVS_TEST_CASE(test_staging_page_table_plan),
        KVS_TEST_CASE(test_staging_adjacent_keys_are_one_transfer),
        KVS_TEST_CASE(test_staging_grouped_fallback_stays_grouped),
        KVS_TEST_CASE(test_staging_pipelined_read_under_allocation_failures),
        KVS_TEST_CASE(test_page_ids_rechecked_where_used),
        KVS_TEST_CASE(test_page_id_max_and_repeats),
        KVS_TEST_CASE(test_scatter_options),
        KVS_TEST_CASE(test_policy_model_and_measurements),
        KVS_TEST_CASE(test_staging_auto_mode),
        KVS_TEST_CASE(test_staging_auto_mode_pipelines_its_lookup),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
