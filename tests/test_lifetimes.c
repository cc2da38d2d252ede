/* Lifetimes (issue "Calls that keep their deadline and survive their peers"): a long-running
 * client outlives 100 owner restarts with its threads, descriptors and memory bounded. Each
 * restart brings a new owner on a new port; the client writes and reads through it, and closes
 * the endpoints of owners that left once the master no longer lists them. (Before ep_close, the
 * client kept 8 threads, 8 sockets and their buffers for every owner it had ever talked to.) */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "proto/net_int.h"
#include "server_fixture.h"

#include <kvstash/kvstash.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    long threads, fds, rss_kib;
} usage_t;

static long status_field(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    }
    fclose(f);
    CHECK(v >= 0);
    return v;
}

static usage_t usage_now(void)
{
    usage_t u = {status_field("Threads"), 0, status_field("VmRSS")};
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d))
        u.fds += e->d_name[0] != '.';
    closedir(d);
    u.fds--; /* the directory's own descriptor */
    return u;
}

static void usage_print(const char *when, usage_t u)
{
    printf("  %-28s threads %3ld, descriptors %3ld, RSS %6ld KiB\n", when, u.threads, u.fds,
           u.rss_kib);
    fflush(stdout);
}

#define RESTARTS 100
/* RSS may grow by allocator caches, not by restarts; AddressSanitizer's quarantine (256 MiB by
 * default) holds freed memory on purpose. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RSS_SLACK_KIB (256 * 1024)
#else
#define RSS_SLACK_KIB (16 * 1024)
#endif
#define OBJ (256u * 1024)

static void restarts(const char *protocol)
{
    server_t m;
    const char *margs[] = {"--master-only", NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    setenv("KVS_SHM_SWEEP_MS", "1", 1); /* check for departed owners on every call */
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.protocol = protocol;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    unsetenv("KVS_SHM_SWEEP_MS");
    uint8_t *src = malloc(OBJ), *dst = malloc(OBJ);
    CHECK(src != NULL && dst != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, OBJ), KVS_OK);
    usage_t start = {0}, peak = {0};
    printf("protocol %s:\n", protocol);
    for (int r = 0; r <= RESTARTS; r++) {
        server_t o;
        const char *oargs[] = {"--owner-only", "--master", master, "--segment-size", "4MiB", NULL};
        server_start(&o, oargs);
        char key[32];
        snprintf(key, sizeof(key), "k%d", r);
        memset(src, r, OBJ);
        CHECK_STATUS(kvs_client_put(c, key, src, OBJ, NULL), KVS_OK);
        CHECK_EQ_INT(kvs_client_get_into(c, key, dst, OBJ), OBJ);
        CHECK_EQ_MEM(dst, src, OBJ);
        usage_t live = usage_now(); /* with this owner's endpoint open */
        peak.threads = KVS_MAX(peak.threads, live.threads);
        peak.fds = KVS_MAX(peak.fds, live.fds);
        peak.rss_kib = KVS_MAX(peak.rss_kib, live.rss_kib);
        server_stop(&o); /* unmounts: the master forgets the segment at once */
        /* A call after the owner left sweeps its endpoint (the key is gone with the owner). */
        CHECK_EQ_INT(kvs_client_exists(c, key), 0);
        CHECK(kvs_client_get_into(c, key, dst, OBJ) < 0);
        usage_t u = usage_now();
        if (r == 0) {
            start = u; /* after the first owner: every lazy setup is done */
            usage_print("after the first owner", u);
        }
        peak.threads = KVS_MAX(peak.threads, u.threads);
        peak.fds = KVS_MAX(peak.fds, u.fds);
        peak.rss_kib = KVS_MAX(peak.rss_kib, u.rss_kib);
        if (r == RESTARTS)
            usage_print("after 100 more restarts", u);
    }
    usage_print("peak, with an owner connected", peak);
    usage_t end = usage_now();
    /* Every departed owner's endpoint is closed: nothing grows with the number of restarts. */
    CHECK_CMP_U64((uint64_t)end.threads, <=, (uint64_t)start.threads);
    CHECK_CMP_U64((uint64_t)end.fds, <=, (uint64_t)start.fds);
    CHECK_CMP_U64((uint64_t)end.rss_kib, <=, (uint64_t)start.rss_kib + RSS_SLACK_KIB);
    CHECK_STATUS(kvs_client_unregister_buffer(c, dst), KVS_OK);
    kvs_client_close(c);
    free(src);
    free(dst);
    server_stop(&m);
}

static void test_100_owner_restarts_over_tcp(void)
{
    restarts("tcp");
}

static void test_100_owner_restarts_over_shm(void)
{
    restarts("shm");
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_100_owner_restarts_over_tcp),
        KVS_TEST_CASE(test_100_owner_restarts_over_shm),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
