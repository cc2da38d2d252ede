/* Concurrent stress: several processes run puts, forced removes and reads of the same keys
 * against a master and a separate owner that is stopped (SIGSTOP) and resumed now and then,
 * for a bounded time (KVS_STRESS_SECONDS, default 20). Every object describes itself (key,
 * writer, sequence number, size) and its bytes follow from that description, so every
 * successful read is checked in full: the test passes only with 0 wrong bytes (DESIGN §6). */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "common/common_int.h"

#include <kvstash/kvstash.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NKEYS    12
#define MAX_SIZE (192u << 10)
#define MAGIC    0x4b565354524553ull /* "KVSTRES" */

typedef struct {
    uint64_t magic, key, writer, seq, size;
} header_t;

/* What one worker did, sent to the parent through a pipe. */
typedef struct {
    uint64_t reads_ok, reads_failed, wrong, puts_ok, puts_failed, removes_ok;
} tally_t;

static uint8_t body_byte(const header_t *h, uint64_t off)
{
    uint64_t x = (h->key * 0x9E3779B97F4A7C15ull) ^ (h->writer << 40) ^ (h->seq << 8) ^ off;
    x *= 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(x >> 56);
}

static void make_object(uint8_t *p, uint64_t key, uint64_t writer, uint64_t seq, uint64_t size)
{
    header_t h = {MAGIC, key, writer, seq, size};
    memcpy(p, &h, sizeof(h));
    for (uint64_t i = sizeof(h); i < size; i++)
        p[i] = body_byte(&h, i);
}

/* Whether `n` bytes read for key `key` are exactly one object written for that key. */
static bool object_ok(const uint8_t *p, uint64_t n, uint64_t key)
{
    header_t h;
    if (n < sizeof(h))
        return false;
    memcpy(&h, p, sizeof(h));
    if (h.magic != MAGIC || h.key != key || h.size != n)
        return false;
    for (uint64_t i = sizeof(h); i < n; i++) {
        if (p[i] != body_byte(&h, i))
            return false;
    }
    return true;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static kvs_client_t *worker_client(const char *master, const char *protocol)
{
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = master;
    cfg.protocol = protocol;
    cfg.rpc_timeout_ms = 5000;
    cfg.transfer_timeout_ms = 800;
    kvs_client_t *c = NULL;
    return kvs_client_open(&cfg, &c) == KVS_OK ? c : NULL;
}

enum role { WRITER, REMOVER, READER, MULTI_READER };

static void worker(enum role role, unsigned id, const char *master, const char *protocol,
                   uint64_t end_ns, tally_t *t)
{
    kvs_client_t *c = worker_client(master, protocol);
    if (c == NULL) {
        t->wrong = UINT64_MAX; /* reported as a failure */
        return;
    }
    uint64_t rng = 0x1234567ull * (id + 1);
    uint8_t *buf = malloc(NKEYS * (size_t)MAX_SIZE);
    kvs_client_register_buffer(c, buf, NKEYS * (size_t)MAX_SIZE);
    char names[NKEYS][16];
    const char *keys[NKEYS];
    for (unsigned k = 0; k < NKEYS; k++) {
        snprintf(names[k], sizeof(names[k]), "stress-%u", k);
        keys[k] = names[k];
    }
    for (uint64_t seq = 1; kvs__now_ns() < end_ns; seq++) {
        uint64_t k = rng_next(&rng) % NKEYS;
        if (role == WRITER) {
            uint64_t size = 64 + rng_next(&rng) % (MAX_SIZE - 64);
            make_object(buf, k, id, seq, size);
            int rc = kvs_client_put_from(c, keys[k], buf, size, NULL);
            if (rc == KVS_OBJECT_ALREADY_EXISTS && kvs_client_remove(c, keys[k], true) == KVS_OK)
                rc = kvs_client_put_from(c, keys[k], buf, size, NULL);
            *(rc == KVS_OK ? &t->puts_ok : &t->puts_failed) += 1;
        } else if (role == REMOVER) {
            t->removes_ok += kvs_client_remove(c, keys[k], true) == KVS_OK;
            usleep(2000 + rng_next(&rng) % 8000);
        } else if (role == READER) {
            int64_t n = kvs_client_get_into(c, keys[k], buf, MAX_SIZE);
            if (n >= 0) {
                t->reads_ok++;
                t->wrong += !object_ok(buf, (uint64_t)n, k);
            } else {
                t->reads_failed++;
            }
        } else {
            /* All keys at once, each into 4 KiB pages scattered across the buffer; an object
             * smaller than its pages is refused (-600) before any I/O, which is fine here:
             * sizes are learnt first. */
            int64_t sizes[NKEYS];
            for (unsigned j = 0; j < NKEYS; j++)
                sizes[j] = kvs_client_get_size(c, keys[j]);
            kvs_buf_t frags[NKEYS][MAX_SIZE / 4096 + 1];
            const kvs_buf_t *bufs[NKEYS];
            size_t nbufs[NKEYS];
            for (unsigned j = 0; j < NKEYS; j++) {
                uint64_t sz = sizes[j] > 0 ? (uint64_t)sizes[j] : 4096, left = sz;
                nbufs[j] = 0;
                for (uint64_t p = 0; left > 0; p++) {
                    uint64_t l = left < 4096 ? left : 4096;
                    /* page p of key j lives at slot (p * NKEYS + j): interleaved keys */
                    frags[j][nbufs[j]++] = (kvs_buf_t){buf + (p * NKEYS + j) * 4096, (size_t)l};
                    left -= l;
                }
                bufs[j] = frags[j];
            }
            int64_t res[NKEYS];
            if (kvs_client_batch_get_into_multi_buffers(c, NKEYS, keys, bufs, nbufs, seq % 2 == 0,
                                                        res) != KVS_OK)
                continue;
            static uint8_t flat[MAX_SIZE];
            for (unsigned j = 0; j < NKEYS; j++) {
                if (res[j] < 0) {
                    t->reads_failed++;
                    continue;
                }
                uint64_t off = 0;
                for (size_t f = 0; f < nbufs[j] && off < (uint64_t)res[j]; f++) {
                    memcpy(flat + off, frags[j][f].ptr, frags[j][f].len);
                    off += frags[j][f].len;
                }
                t->reads_ok++;
                t->wrong += !object_ok(flat, (uint64_t)res[j], j);
            }
        }
    }
    kvs_client_unregister_buffer(c, buf);
    kvs_client_close(c);
    free(buf);
}

static void test_concurrent_puts_removes_and_reads(void)
{
    const char *env = getenv("KVS_STRESS_SECONDS");
    uint64_t seconds = env && *env ? strtoull(env, NULL, 10) : 20;
    server_t m, o;
    const char *margs[] = {"--master-only", "--heartbeat-timeout-ms", "4000", "--lease-ms",
                           "1500",          "--put-discard-ms",       "2000", NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    const char *oargs[] = {"--owner-only", "--master", master, "--segment-size", "48MiB", NULL};
    server_start(&o, oargs);

    static const struct {
        enum role role;
        const char *protocol;
    } plan[] = {
        {WRITER, "tcp"}, {WRITER, "shm"},       {REMOVER, "tcp"},      {READER, "tcp"},
        {READER, "shm"}, {MULTI_READER, "tcp"}, {MULTI_READER, "shm"},
    };
    enum { NW = sizeof(plan) / sizeof(plan[0]) };
    uint64_t end_ns = kvs__now_ns() + seconds * KVS_NS_PER_S;
    int pipes[NW][2];
    pid_t pids[NW];
    fflush(stdout);
    /* Workers fork before this process has any thread (sanitizers need that). */
    for (unsigned i = 0; i < NW; i++) {
        CHECK_EQ_INT(pipe(pipes[i]), 0);
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            tally_t t = {0};
            worker(plan[i].role, i, master, plan[i].protocol, end_ns, &t);
            ssize_t w = write(pipes[i][1], &t, sizeof(t));
            _exit(w == (ssize_t)sizeof(t) ? 0 : 1);
        }
        close(pipes[i][1]);
    }
    /* Chaos: the owner stops now and then, with writes queued in its sockets; once, the shm
     * writer stops for longer than the put discard time, possibly in the middle of copying
     * into its mapping, and resumes after the master discarded its put. */
    unsigned stops = 0;
    bool writer_stopped = false;
    uint64_t start_ns = kvs__now_ns();
    while (kvs__now_ns() + 1500 * KVS_NS_PER_MS < end_ns) {
        usleep(1000000);
        CHECK_EQ_INT(kill(o.pid, SIGSTOP), 0);
        usleep(400000);
        CHECK_EQ_INT(kill(o.pid, SIGCONT), 0);
        stops++;
        if (!writer_stopped && kvs__now_ns() - start_ns > (end_ns - start_ns) / 3 &&
            kvs__now_ns() + 4 * KVS_NS_PER_S < end_ns) {
            CHECK_EQ_INT(kill(pids[1], SIGSTOP), 0); /* plan[1]: the shm writer */
            usleep(2600000);
            CHECK_EQ_INT(kill(pids[1], SIGCONT), 0);
            writer_stopped = true;
        }
    }
    tally_t sum = {0};
    for (unsigned i = 0; i < NW; i++) {
        tally_t t = {0};
        CHECK_EQ_INT(read(pipes[i][0], &t, sizeof(t)), (int)sizeof(t));
        close(pipes[i][0]);
        int st = 0;
        CHECK_EQ_INT(waitpid(pids[i], &st, 0), pids[i]);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        CHECK(t.wrong != UINT64_MAX); /* the worker could open its client */
        sum.reads_ok += t.reads_ok;
        sum.reads_failed += t.reads_failed;
        sum.wrong += t.wrong;
        sum.puts_ok += t.puts_ok;
        sum.puts_failed += t.puts_failed;
        sum.removes_ok += t.removes_ok;
    }
    printf("  %llu s, %u owner stops, writer stopped %d: %llu reads exact, %llu failed, %llu "
           "wrong; %llu puts, %llu "
           "failed; %llu forced removes\n",
           (unsigned long long)seconds, stops, writer_stopped, (unsigned long long)sum.reads_ok,
           (unsigned long long)sum.reads_failed, (unsigned long long)sum.wrong,
           (unsigned long long)sum.puts_ok, (unsigned long long)sum.puts_failed,
           (unsigned long long)sum.removes_ok);
    CHECK_EQ_U64(sum.wrong, 0);
    CHECK_CMP_U64(sum.reads_ok, >, 0); /* it did read, and the reads were checked */
    CHECK_CMP_U64(sum.puts_ok, >, 0);
    server_check_alive(&o);
    server_check_alive(&m);
    server_stop(&o);
    server_stop(&m);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_concurrent_puts_removes_and_reads),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
