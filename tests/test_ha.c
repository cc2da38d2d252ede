/* High availability in one process (docs/ha.md), so that the sanitizer builds run it too: the
 * etcd client against a real etcd, and two master candidates, an owner and a client following
 * the leader through a handover. Skips (77) where etcd or this build's etcd support is missing.
 * Process-level failover (kill -9, SIGSTOP, namespaces) is in tests/python/test_ha.py and
 * test_multihost.py. */
#define _GNU_SOURCE
#include "client_fixture.h"
#include "ha/etcd_int.h"
#include "kvs_test.h"
#include "master/master_server_int.h"
#include "owner/owner_int.h"

#include <kvstash/kvstash.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    char dir[64];
    char endpoint[64];
} etcd_t;

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &l) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A real etcd with short raft timings (leases of 1 s), in a temporary directory. */
static void etcd_start(etcd_t *e)
{
    if (!kvs__etcd_supported())
        kvs_test_skip("this build has no etcd support (libcurl, json-c)");
    if (access("/usr/bin/etcd", X_OK) != 0)
        kvs_test_skip("etcd is not installed (Debian: etcd-server)");
    snprintf(e->dir, sizeof(e->dir), "/tmp/kvs-etcd-XXXXXX");
    CHECK(mkdtemp(e->dir) != NULL);
    uint16_t cp = free_port(), pp = free_port();
    snprintf(e->endpoint, sizeof(e->endpoint), "127.0.0.1:%u", (unsigned)cp);
    char data[128], curl[96], purl[96], cluster[128];
    snprintf(data, sizeof(data), "%s/data", e->dir);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%u", (unsigned)cp);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%u", (unsigned)pp);
    snprintf(cluster, sizeof(cluster), "kvs=%s", purl);
    e->pid = fork();
    CHECK(e->pid >= 0);
    if (e->pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl("/usr/bin/etcd", "etcd", "--data-dir", data, "--name", "kvs", "--listen-client-urls",
              curl, "--advertise-client-urls", curl, "--listen-peer-urls", purl,
              "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
              "--heartbeat-interval", "10", "--election-timeout", "100", (char *)NULL);
        _exit(127);
    }
    kvs__etcd_t *c;
    CHECK_STATUS(kvs__etcd_open(e->endpoint, 500, &c), KVS_OK);
    kvs__etcd_kv_t kv;
    int rc = KVS_RPC_FAIL;
    for (int i = 0; i < 400 && rc != KVS_OBJECT_NOT_FOUND; i++) {
        rc = kvs__etcd_get(c, "/kvs-test-ready", &kv);
        if (rc != KVS_OBJECT_NOT_FOUND)
            sleep_ms(25);
    }
    kvs__etcd_close(c);
    CHECK_STATUS(rc, KVS_OBJECT_NOT_FOUND);
}

static void etcd_stop(etcd_t *e)
{
    kill(e->pid, SIGKILL);
    waitpid(e->pid, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", e->dir);
    CHECK(system(cmd) == 0);
}

/* The v3 calls election and discovery rely on, against etcd itself. */
static void test_etcd_client(void)
{
    etcd_t e;
    etcd_start(&e);
    kvs__etcd_t *c;
    CHECK_STATUS(kvs__etcd_open("etcd://127.0.0.1:1,no-such-host.invalid:2,x", 500, &c),
                 KVS_INVALID_PARAMS);
    char list[160];
    /* A dead endpoint first: calls go on to the next. */
    snprintf(list, sizeof(list), "127.0.0.1:%u,%s", (unsigned)free_port(), e.endpoint);
    CHECK_STATUS(kvs__etcd_open(list, 1000, &c), KVS_OK);
    int64_t lease, ttl, rev, rev2;
    CHECK_STATUS(kvs__etcd_lease_grant(c, 5, &lease, &ttl), KVS_OK);
    CHECK(lease != 0 && ttl >= 5);
    CHECK_STATUS(kvs__etcd_create(c, "/t/leader", "127.0.0.1:7 abc", lease, &rev), KVS_OK);
    CHECK(rev > 0);
    CHECK_STATUS(kvs__etcd_create(c, "/t/leader", "127.0.0.1:8 def", lease, &rev2),
                 KVS_OBJECT_ALREADY_EXISTS);
    kvs__etcd_leader_t l;
    CHECK_STATUS(kvs__etcd_leader(c, "/t", &l), KVS_OK);
    CHECK_EQ_STR(l.host, "127.0.0.1");
    CHECK_EQ_INT(l.port, 7);
    CHECK_EQ_U64(l.incarnation, 0xabc);
    CHECK_EQ_U64(l.term, (uint64_t)rev);
    CHECK_STATUS(kvs__etcd_lease_keepalive(c, lease, &ttl), KVS_OK);
    CHECK(ttl >= 4);
    /* A delete naming another revision does nothing; the right one deletes. */
    CHECK_STATUS(kvs__etcd_delete_if(c, "/t/leader", rev + 100), KVS_OK);
    CHECK_STATUS(kvs__etcd_leader(c, "/t", &l), KVS_OK);
    CHECK_STATUS(kvs__etcd_delete_if(c, "/t/leader", rev), KVS_OK);
    CHECK_STATUS(kvs__etcd_leader(c, "/t", &l), KVS_NO_LEADER);
    /* A record that is not a leader's is refused, not half-parsed. */
    CHECK_STATUS(kvs__etcd_create(c, "/u/leader", "not a record", 0, &rev), KVS_OK);
    CHECK_STATUS(kvs__etcd_leader(c, "/u", &l), KVS_PROTOCOL_ERROR);
    /* A revoked lease takes its keys with it and cannot be renewed. */
    CHECK_STATUS(kvs__etcd_create(c, "/v/leader", "127.0.0.1:9 1", lease, &rev), KVS_OK);
    CHECK_STATUS(kvs__etcd_lease_revoke(c, lease), KVS_OK);
    CHECK_STATUS(kvs__etcd_leader(c, "/v", &l), KVS_NO_LEADER);
    CHECK_STATUS(kvs__etcd_lease_keepalive(c, lease, &ttl), KVS_OBJECT_NOT_FOUND);
    kvs__etcd_close(c);
    /* etcd gone: RPC_FAIL, in bounded time. */
    etcd_stop(&e);
    CHECK_STATUS(kvs__etcd_open(e.endpoint, 300, &c), KVS_OK);
    kvs__etcd_kv_t kv;
    CHECK_STATUS(kvs__etcd_get(c, "/t/leader", &kv), KVS_RPC_FAIL);
    kvs__etcd_close(c);
}

static kvs__master_server_t *candidate(const etcd_t *e)
{
    kvs__master_server_config_t cfg;
    CHECK_STATUS(kvs__master_server_config_init(&cfg), KVS_OK);
    cfg.port = 0;
    cfg.etcd = e->endpoint;
    cfg.etcd_prefix = "/ha-test";
    cfg.etcd_ttl_s = 1;
    cfg.etcd_poll_ms = 20;
    cfg.recovery_ms = 100;
    kvs__master_server_t *s;
    CHECK_STATUS(kvs__master_server_create(&cfg, &s), KVS_OK);
    CHECK_STATUS(kvs__master_server_start(s), KVS_OK);
    return s;
}

static uint16_t leader_port(const etcd_t *e)
{
    kvs__etcd_t *c;
    CHECK_STATUS(kvs__etcd_open(e->endpoint, 500, &c), KVS_OK);
    kvs__etcd_leader_t l = {.port = 0};
    for (int i = 0; i < 200 && kvs__etcd_leader(c, "/ha-test", &l) != KVS_OK; i++)
        sleep_ms(20);
    kvs__etcd_close(c);
    return l.port;
}

#define NOBJ 24

static void fill(int i, uint8_t *p, size_t n)
{
    for (size_t j = 0; j < n; j++)
        p[j] = (uint8_t)(i * 37 + j * 11 + (j >> 9));
}

static void check_all(kvs_client_t *cl)
{
    uint8_t want[70000];
    for (int i = 0; i < NOBJ; i++) {
        char key[32];
        snprintf(key, sizeof(key), "ha-%d", i);
        void *got = NULL;
        size_t n = 0;
        CHECK_STATUS(kvs_client_get(cl, key, &got, &n), KVS_OK);
        CHECK_EQ_U64(n, 1000 + (size_t)i * 2000);
        fill(i, want, n);
        CHECK_EQ_MEM(got, want, n);
        kvs_free(got);
    }
}

/* A leader that steps down (its lease revoked as it stops) is replaced at once: the standby
 * rebuilds from the owner, and the client's next calls reach it with every object intact. */
static void test_handover_keeps_the_cache(void)
{
    etcd_t e;
    etcd_start(&e);
    kvs__master_server_t *m[2] = {candidate(&e), candidate(&e)};
    uint16_t lp = leader_port(&e);
    CHECK(lp != 0);
    int lead = kvs__master_server_port(m[0]) == lp ? 0 : 1;
    CHECK_EQ_INT(kvs__master_server_port(m[lead]), lp);
    kvs__owner_config_t oc = {.etcd = e.endpoint,
                              .etcd_prefix = "/ha-test",
                              .segment_size = 8 << 20,
                              .segment_name = "ha-seg",
                              .rpc_timeout_ms = 5000};
    kvs__data_server_config_init(&oc.data);
    kvs__owner_t *o;
    CHECK_STATUS(kvs__owner_create(&oc, &o), KVS_OK);
    char master[96];
    snprintf(master, sizeof(master), "etcd://%s/ha-test", e.endpoint);
    kvs_client_t *cl = client_open_timeouts(master, "tcp", 5000, 5000);
    uint8_t buf[70000];
    for (int i = 0; i < NOBJ; i++) {
        char key[32];
        snprintf(key, sizeof(key), "ha-%d", i);
        fill(i, buf, 1000 + (size_t)i * 2000);
        CHECK_STATUS(kvs_client_put(cl, key, buf, 1000 + (size_t)i * 2000, NULL), KVS_OK);
    }
    /* A put's end returned: its owner has the object in its index already. */
    CHECK_EQ_U64(kvs__owner_index_size(o), NOBJ);
    CHECK_STATUS(kvs_client_remove(cl, "ha-0", false), KVS_OK);
    CHECK_STATUS(kvs_client_put(cl, "ha-0", buf, 0, NULL), KVS_INVALID_PARAMS);
    fill(0, buf, 1000);
    CHECK_STATUS(kvs_client_put(cl, "ha-0", buf, 1000, NULL), KVS_OK);
    check_all(cl);
    kvs__master_server_destroy(m[lead]);
    check_all(cl); /* rides through the handover */
    CHECK(kvs__owner_recovered(o) >= NOBJ);
    CHECK_EQ_INT(leader_port(&e), kvs__master_server_port(m[1 - lead]));
    CHECK_STATUS(kvs_client_put(cl, "after", buf, 100, NULL), KVS_OK);
    /* Recovered objects count as leased for a lease period (a reader of the old leader may
     * still be reading them): a plain remove waits, a forced one tombstones. */
    CHECK_STATUS(kvs_client_remove(cl, "ha-1", false), KVS_OBJECT_HAS_LEASE);
    CHECK_STATUS(kvs_client_remove(cl, "ha-1", true), KVS_OK);
    CHECK_STATUS(kvs_client_remove(cl, "after", false), KVS_OK); /* written since: not leased */
    kvs_client_close(cl);
    kvs__owner_destroy(o);
    kvs__master_server_destroy(m[1 - lead]);
    etcd_stop(&e);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_etcd_client),
        KVS_TEST_CASE(test_handover_keeps_the_cache),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
