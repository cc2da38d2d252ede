/* Replica failover (DESIGN §6 rule 6): with two replicas of every key and one owner killed,
 * every read succeeds from the other copy, exactly, within its deadline — in every read mode
 * (single, batch, multi-buffer direct and grouped, staged) and over tcp, shm and auto. Each case
 * kills one of the two owners, so that for some keys the dead copy is the first one tried.
 * (Before failover, 13 of 20 such reads failed: the client never tried the other replica.) */
#define _GNU_SOURCE
#include "client/client_int.h"
#include "client_fixture.h"
#include "kvs_test.h"
#include "proto/net_int.h"
#include "server_fixture.h"

#include <kvstash/kvstash.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NKEYS       20
#define OBJ         (96u * 1024)
#define DEADLINE_MS 4000u

typedef struct {
    server_t master, owner[2];
    char addr[64];
} cluster_t;

static void cluster_start(cluster_t *cl)
{
    const char *margs[] = {"--master-only", NULL};
    server_start(&cl->master, margs);
    snprintf(cl->addr, sizeof(cl->addr), "127.0.0.1:%u", (unsigned)cl->master.port);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof(name), "seg-%d", i);
        const char *oargs[] = {"--owner-only", "--master",       cl->addr, "--segment-size",
                               "8MiB",         "--segment-name", name,     NULL};
        server_start(&cl->owner[i], oargs);
    }
}

static void fill(int key, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(key * 131 + i * 7 + (i >> 11));
}

static kvs_client_t *open_client(const char *master, const char *protocol)
{
    return client_open_timeouts(master, protocol, DEADLINE_MS, DEADLINE_MS);
}

/* Puts the NKEYS keys (names into names[] and keys[]) with two replicas each. */
static void put_keys(kvs_client_t *c, char names[][16], const char **keys)
{
    uint8_t *src = malloc(OBJ);
    CHECK(src != NULL);
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.replica_num = 2;
    for (int i = 0; i < NKEYS; i++) {
        snprintf(names[i], 16, "k%02d", i);
        keys[i] = names[i];
        fill(i, src, OBJ);
        CHECK_STATUS(kvs_client_put(c, keys[i], src, OBJ, &rc), KVS_OK);
    }
    free(src);
}

typedef enum { MODE_GET_INTO, MODE_BATCH, MODE_MULTI, MODE_GROUPED, MODE_COUNT } mode_t_;

static const char *mode_name[] = {"get_into", "batch_get_into", "multi_buffers (direct)",
                                  "multi_buffers (grouped)"};

/* Reads every key in `mode` and checks the bytes; returns the slowest call's time. */
static uint64_t read_all(kvs_client_t *c, mode_t_ mode, uint8_t *dst, const char *const *keys)
{
    uint8_t *want = malloc(OBJ);
    CHECK(want != NULL);
    memset(dst, 0, (size_t)NKEYS * OBJ);
    uint64_t worst = 0, t0 = kvs__now_ns();
    if (mode == MODE_GET_INTO) {
        for (int i = 0; i < NKEYS; i++) {
            uint64_t t = kvs__now_ns();
            CHECK_EQ_INT(kvs_client_get_into(c, keys[i], dst + (size_t)i * OBJ, OBJ), OBJ);
            worst = KVS_MAX(worst, kvs__now_ns() - t);
        }
    } else {
        int64_t got[NKEYS];
        kvs_buf_t one[NKEYS], halves[NKEYS][2];
        const kvs_buf_t *multi[NKEYS];
        size_t counts[NKEYS];
        for (int i = 0; i < NKEYS; i++) {
            one[i] = (kvs_buf_t){dst + (size_t)i * OBJ, OBJ};
            halves[i][0] = (kvs_buf_t){dst + (size_t)i * OBJ, OBJ / 2};
            halves[i][1] = (kvs_buf_t){dst + (size_t)i * OBJ + OBJ / 2, OBJ / 2};
            multi[i] = halves[i];
            counts[i] = 2;
        }
        int rc = mode == MODE_BATCH ? kvs_client_batch_get_into(c, NKEYS, keys, one, got)
                                    : kvs_client_batch_get_into_multi_buffers(
                                          c, NKEYS, keys, multi, counts, mode == MODE_GROUPED, got);
        CHECK_STATUS(rc, KVS_OK);
        for (int i = 0; i < NKEYS; i++)
            CHECK_EQ_INT(got[i], OBJ);
        worst = kvs__now_ns() - t0;
    }
    for (int i = 0; i < NKEYS; i++) {
        fill(i, want, OBJ);
        CHECK_EQ_MEM(dst + (size_t)i * OBJ, want, OBJ);
    }
    free(want);
    return worst / KVS_NS_PER_MS;
}

/* Puts NKEYS keys with two replicas, kills owner `victim`, then reads them back in every mode
 * through clients of each protocol (and, with `staged`, through host-backend staging). */
static void failover_case(int victim, bool staged)
{
    if (staged) {
        setenv("MC_STORE_GPU_STAGING", "1", 1);
        setenv("MC_STORE_GPU_STAGING_BACKEND", "host", 1);
        setenv("MC_STORE_GPU_STAGING_BUFFER_BYTES", "1MiB", 1);
    }
    cluster_t cl;
    cluster_start(&cl);
    const char *protocols[] = {"tcp", "shm", "auto"};
    kvs_client_t *clients[3];
    uint8_t *dst = malloc((size_t)NKEYS * OBJ);
    CHECK(dst != NULL);
    for (int p = 0; p < 3; p++) {
        clients[p] = open_client(cl.addr, protocols[p]);
        CHECK_STATUS(kvs_client_register_buffer(clients[p], dst, (size_t)NKEYS * OBJ), KVS_OK);
    }
    char names[NKEYS][16];
    const char *keys[NKEYS];
    put_keys(clients[0], names, keys);
    /* The shm client maps both segments before the kill, the others connect to both. */
    for (int p = 0; p < 3; p++)
        read_all(clients[p], MODE_BATCH, dst, keys);
    server_kill(&cl.owner[victim]);
    for (int p = 0; p < 3; p++) {
        /* A client that never talked to the dead owner too: its first contact is refused. */
        kvs_client_t *fresh = open_client(cl.addr, protocols[p]);
        CHECK_STATUS(kvs_client_register_buffer(fresh, dst, (size_t)NKEYS * OBJ), KVS_OK);
        for (int m = 0; m < MODE_COUNT; m++) {
            if (staged && m != MODE_MULTI && m != MODE_GROUPED)
                continue; /* staging serves the multi-buffer calls */
            for (int f = 0; f < 2; f++) {
                uint64_t ms = read_all(f ? fresh : clients[p], (mode_t_)m, dst, keys);
                printf("  owner %d killed, %s%s, %s client, %s: slowest call %llu ms (deadline %u "
                       "ms)\n",
                       victim, protocols[p], staged ? " staged" : "", f ? "new" : "connected",
                       mode_name[m], (unsigned long long)ms, DEADLINE_MS);
                /* A dead owner refuses at once: failing over costs no time-out (a round that
                 * timed out would have taken half the deadline). */
                CHECK_CMP_U64(ms, <, DEADLINE_MS / 2);
            }
        }
        CHECK_STATUS(kvs_client_unregister_buffer(fresh, dst), KVS_OK);
        kvs_client_close(fresh);
    }
    for (int p = 0; p < 3; p++) {
        CHECK_STATUS(kvs_client_unregister_buffer(clients[p], dst), KVS_OK);
        kvs_client_close(clients[p]);
    }
    free(dst);
    server_stop(&cl.owner[1 - victim]);
    server_stop(&cl.master);
}

static void test_first_owner_killed(void)
{
    failover_case(0, false);
}

static void test_second_owner_killed(void)
{
    failover_case(1, false);
}

static void test_staged_reads_fail_over(void)
{
    failover_case(0, true);
    failover_case(1, true);
}

/* A stopped owner (SIGSTOP) refuses nothing: its replica fails only by time-out. A read whose
 * every key has another replica gives the first attempt half of what is left, then reads the
 * other copy, all within the deadline. */
static void test_stopped_owner_fails_over(void)
{
    cluster_t cl;
    cluster_start(&cl);
    uint8_t *dst = malloc((size_t)NKEYS * OBJ);
    CHECK(dst != NULL);
    kvs_client_t *c = client_open_timeouts(cl.addr, "tcp", 3000, 1000);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, (size_t)NKEYS * OBJ), KVS_OK);
    char names[NKEYS][16];
    const char *keys[NKEYS];
    put_keys(c, names, keys);
    read_all(c, MODE_BATCH, dst, keys); /* connections to both owners in place */
    for (int v = 0; v < 2; v++) {
        CHECK_EQ_INT(kill(cl.owner[v].pid, SIGSTOP), 0);
        int st = 0;
        CHECK_EQ_INT(waitpid(cl.owner[v].pid, &st, WUNTRACED), cl.owner[v].pid);
        for (int m = 0; m < MODE_COUNT; m++) {
            if (m == MODE_GET_INTO)
                continue; /* one key per call: the same path, 20 times slower */
            uint64_t ms = read_all(c, (mode_t_)m, dst, keys);
            printf("  owner %d stopped, tcp, %s: %llu ms (deadline 1000 ms)\n", v, mode_name[m],
                   (unsigned long long)ms);
            CHECK_CMP_U64(ms, <=, 1000 + 100);
        }
        CHECK_EQ_INT(kill(cl.owner[v].pid, SIGCONT), 0);
    }
    CHECK_STATUS(kvs_client_unregister_buffer(c, dst), KVS_OK);
    kvs_client_close(c);
    free(dst);
    server_stop(&cl.owner[0]);
    server_stop(&cl.owner[1]);
    server_stop(&cl.master);
}

/* The adaptive mode stages a pipelined page-table read from its first part's lookup; the rest's
 * finds a key whose pages hold more than its object, so the call may not stage and reads direct.
 * With an owner killed, keys whose first replica was on it are read again in a second round:
 * that round must not stage either (it did once, which scattered whatever followed the object in
 * the staging buffer into the key's extra page, as success). */
static void test_auto_pipelined_read_fails_over_unstaged(void)
{
    enum { PAGE = 8192, PER = OBJ / PAGE, SLOT = PER + 1, GUARD = 0x5a };
    setenv("MC_STORE_GPU_STAGING", "auto", 1);
    setenv("MC_STORE_GPU_STAGING_BACKEND", "host", 1);
    setenv("MC_STORE_GPU_STAGING_BUFFER_BYTES", "1MiB", 1);
    size_t pool_len = (size_t)NKEYS * SLOT * PAGE;
    uint8_t *pool = malloc(pool_len), *want = malloc(OBJ);
    CHECK(pool != NULL && want != NULL);
    uint32_t ids[NKEYS * SLOT];
    size_t npages[NKEYS];
    size_t nids = 0;
    for (int i = 0; i < NKEYS; i++) {
        npages[i] = i == NKEYS - 1 ? SLOT : PER; /* the last key: one page more than its object */
        for (size_t j = 0; j < npages[i]; j++)
            ids[nids++] = (uint32_t)(i * SLOT + j);
    }
    kvs_page_region_t rg = {pool, PAGE, PAGE, (size_t)NKEYS * SLOT};
    for (int v = 0; v < 2; v++) {
        cluster_t cl;
        cluster_start(&cl);
        kvs_client_t *c = open_client(cl.addr, "tcp"); /* whole-buffer fills: 10 keys a fill */
        kvs__staging_calib_t dear_frags = {1e6, 0, 1e-6, 1, 0};
        kvs__policy_set_calibration(kvs__staging_policy(kvs__client_staging(c)), &dear_frags);
        CHECK_STATUS(kvs_client_register_buffer(c, pool, pool_len), KVS_OK);
        char names[NKEYS][16];
        const char *keys[NKEYS];
        put_keys(c, names, keys);
        for (int round = 0; round < 2; round++) {
            if (round == 1)
                server_kill(&cl.owner[v]);
            memset(pool, GUARD, pool_len);
            kvs_client_stats_t a, b;
            kvs_client_get_stats(c, &a);
            int64_t res[NKEYS];
            CHECK_STATUS(kvs_client_batch_get_into_pages(c, NKEYS, keys, &rg, 1, KVS_PAGE_MAJOR,
                                                         ids, npages, false, res),
                         KVS_OK);
            kvs_client_get_stats(c, &b);
            for (int i = 0; i < NKEYS; i++) {
                CHECK_EQ_INT(res[i], OBJ);
                fill(i, want, OBJ);
                CHECK_EQ_MEM(pool + (size_t)i * SLOT * PAGE, want, OBJ);
                for (size_t q = 0; q < PAGE; q++) /* no key's bytes past its object */
                    CHECK_EQ_INT(pool[((size_t)i * SLOT + PER) * PAGE + q], GUARD);
            }
            CHECK_EQ_U64(b.staged_reads - a.staged_reads, 0);
            CHECK_EQ_U64(b.get_staged_calls - a.get_staged_calls, 0);
            CHECK_EQ_U64(b.fallback_not_exact - a.fallback_not_exact, 1);
            CHECK(b.get_lookup_overlapped_ns > a.get_lookup_overlapped_ns); /* it was pipelined */
            /* Counted once, as the unstaged mode it read. */
            CHECK_EQ_U64(b.auto_staged_calls - a.auto_staged_calls, 0);
            CHECK_EQ_U64((b.auto_direct_calls - a.auto_direct_calls) +
                             (b.auto_grouped_calls - a.auto_grouped_calls),
                         1);
        }
        CHECK_STATUS(kvs_client_unregister_buffer(c, pool), KVS_OK);
        kvs_client_close(c);
        server_stop(&cl.owner[1 - v]);
        server_stop(&cl.master);
    }
    free(pool);
    free(want);
    unsetenv("MC_STORE_GPU_STAGING");
    unsetenv("MC_STORE_GPU_STAGING_BACKEND");
    unsetenv("MC_STORE_GPU_STAGING_BUFFER_BYTES");
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_first_owner_killed),
        KVS_TEST_CASE(test_second_owner_killed),
        KVS_TEST_CASE(test_staged_reads_fail_over),
        KVS_TEST_CASE(test_stopped_owner_fails_over),
        KVS_TEST_CASE(test_auto_pipelined_read_fails_over_unstaged),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
