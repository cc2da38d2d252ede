/* Mixed-version peers: this program is built against the KVS_PROTO_NEXT library, which speaks
 * one protocol version more than this build (with the schema's test fields), and runs against
 * real processes of both: a newer client with an older store, a newer client with a newer
 * store, and the older command line against a newer store. Each pair must agree on the highest
 * version both speak and move exact bytes over tcp and shm. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "client_fixture.h"
#include "client/client_int.h"
#include "proto/net_int.h"

#include <kvstash/kvstash.h>

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KVS_PROTO_NEXT
#error "test_mixed_version is built against kvstash_next"
#endif
#define OLD_VERSION  (KVS_PROTO_VERSION_MAX - 1)
#define NEXT_VERSION KVS_PROTO_VERSION_MAX

static void start(server_t *s, const char *path, char *master, size_t cap)
{
    const char *args[] = {"--segment-size", "64MiB", NULL};
    server_start_path(s, path, args);
    snprintf(master, cap, "127.0.0.1:%u", (unsigned)s->port);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 12));
}

/* Puts two objects in one batch and reads them back exactly, over `protocol`. */
static void put_get(kvs_client_t *c, const char *tag)
{
    enum { N = 2, SIZE = 3 << 20 };
    char k0[64], k1[64];
    snprintf(k0, sizeof(k0), "%s/a", tag);
    snprintf(k1, sizeof(k1), "%s/b", tag);
    const char *keys[N] = {k0, k1};
    uint8_t *src = malloc(N * SIZE), *dst = malloc(N * SIZE);
    CHECK(src != NULL && dst != NULL);
    fill(src, N * SIZE, 3);
    memset(dst, 0, N * SIZE);
    CHECK_STATUS(kvs_client_register_buffer(c, src, N * SIZE), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, dst, N * SIZE), KVS_OK);
    kvs_buf_t bufs[N] = {{src, SIZE}, {src + SIZE, SIZE}};
    int res[N];
    CHECK_STATUS(kvs_client_batch_put_from(c, N, keys, bufs, NULL, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_STATUS(res[1], KVS_OK);
    kvs_buf_t dbufs[N] = {{dst, SIZE}, {dst + SIZE, SIZE}};
    int64_t got[N];
    CHECK_STATUS(kvs_client_batch_get_into(c, N, keys, dbufs, got), KVS_OK);
    CHECK_EQ_U64((uint64_t)got[0], SIZE);
    CHECK_EQ_U64((uint64_t)got[1], SIZE);
    CHECK_EQ_MEM(dst, src, N * SIZE);
    CHECK_EQ_INT(kvs_client_exists(c, k0), 1);
    CHECK_STATUS(kvs_client_remove(c, k0, true), KVS_OK); /* the read still holds a lease */
    CHECK_EQ_INT(kvs_client_exists(c, k0), 0);
    CHECK_STATUS(kvs_client_unregister_buffer(c, src), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(c, dst), KVS_OK);
    free(src);
    free(dst);
}

static void newer_client_with(const char *server_path, unsigned want_version)
{
    server_t s;
    char master[64];
    start(&s, server_path, master, sizeof(master));
    static const char *const protocols[] = {"tcp", "shm"};
    for (size_t i = 0; i < KVS_ARRAY_SIZE(protocols); i++) {
        kvs_client_t *c = client_open_protocol(master, protocols[i]);
        CHECK_EQ_INT(kvs__rpc_version(c->rpc), want_version);
        /* Only a peer of the next version echoes the next version's HELLO field. */
        CHECK_EQ_U64(kvs__rpc_hello(c->rpc).next_probe,
                     want_version == NEXT_VERSION ? NEXT_VERSION : 0);
        CHECK(kvs__rpc_hello(c->rpc).incarnation != 0);
        put_get(c, protocols[i]);
        kvs_client_close(c);
    }
    server_check_alive(&s);
    server_stop(&s);
}

static void test_newer_client_older_store(void)
{
    newer_client_with(KVS_SERVER_PATH, OLD_VERSION);
}

static void test_newer_client_newer_store(void)
{
    newer_client_with(KVS_SERVER_NEXT_PATH, NEXT_VERSION);
}

static void test_older_cli_newer_store(void)
{
    server_t s;
    char master[64];
    start(&s, KVS_SERVER_NEXT_PATH, master, sizeof(master));
    char in[64], out[64];
    snprintf(in, sizeof(in), "/tmp/kvs-mixed-in-%d", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/kvs-mixed-out-%d", (int)getpid());
    enum { SIZE = 5 << 20 };
    uint8_t *src = malloc(SIZE), *back = malloc(SIZE);
    fill(src, SIZE, 9);
    FILE *f = fopen(in, "wb");
    CHECK(f != NULL && fwrite(src, 1, SIZE, f) == SIZE);
    fclose(f);
    const char *put[] = {"put", "cli/obj", in, NULL};
    CHECK_EQ_INT(run_cli(master, put), 0);
    const char *get[] = {"get", "cli/obj", out, NULL};
    CHECK_EQ_INT(run_cli(master, get), 0);
    f = fopen(out, "rb");
    CHECK(f != NULL && fread(back, 1, SIZE, f) == SIZE);
    fclose(f);
    CHECK_EQ_MEM(back, src, SIZE);
    const char *ls[] = {"ls", "cli/", NULL};
    CHECK_EQ_INT(run_cli(master, ls), 0);
    /* And the newer client sees what the older one wrote. */
    kvs_client_t *c = client_open_protocol(master, "tcp");
    CHECK_EQ_INT(kvs__rpc_version(c->rpc), NEXT_VERSION);
    CHECK_EQ_INT(kvs_client_get_size(c, "cli/obj"), SIZE);
    kvs_client_close(c);
    unlink(in);
    unlink(out);
    free(src);
    free(back);
    server_check_alive(&s);
    server_stop(&s);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_newer_client_older_store),
        KVS_TEST_CASE(test_newer_client_newer_store),
        KVS_TEST_CASE(test_older_cli_newer_store),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
