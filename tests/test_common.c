/* Common layer: status table, sizes, environment, keys, allocation wrapper. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "common/common_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_status_table(void)
{
    CHECK_EQ_INT(KVS_OK, 0);
    CHECK_EQ_INT(KVS_NO_AVAILABLE_HANDLE, -200);
    CHECK_EQ_INT(KVS_INVALID_PARAMS, -600);
    CHECK_EQ_INT(KVS_REPLICA_IS_NOT_READY, -703);
    CHECK_EQ_INT(KVS_OBJECT_NOT_FOUND, -704);
    CHECK_EQ_INT(KVS_OBJECT_HAS_LEASE, -706);
    CHECK_EQ_INT(KVS_LEASE_EXPIRED, -707);
    CHECK_EQ_INT(KVS_TRANSFER_FAIL, -800);
    CHECK_EQ_INT(KVS_RPC_FAIL, -900);
    CHECK_EQ_STR(kvs_status_name(-704), "OBJECT_NOT_FOUND");
    CHECK_EQ_STR(kvs_status_str(-704), "object not found");
    CHECK_EQ_STR(kvs_status_str(12345), "unknown status");
    CHECK_EQ_STR(kvs_status_name(12345), "UNKNOWN");
}

static void test_parse_size(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {
        {"0", 0},
        {"65536", 65536},
        {"4GiB", 4ull << 30},
        {"4 GiB", 4ull << 30},
        {"4g", 4ull << 30},
        {"512MB", 512000000ull},
        {"16MB", 16000000ull},
        {"1.5KiB", 1536},
        {"1.5 gib", 3ull << 29},
        {"12MiB", 12ull << 20},
        {"2T", 2ull << 40},
        {"7b", 7},
        {" 8 KiB ", 8192},
    };
    for (size_t i = 0; i < KVS_ARRAY_SIZE(ok); i++) {
        uint64_t v = 1234;
        CHECK_STATUS(kvs__parse_size(ok[i].text, &v), KVS_OK);
        CHECK_EQ_U64(v, ok[i].bytes);
    }
    static const char *const bad[] = {
        "",    "GiB", "-1", "10%", "1.", "4 GiBs", "4 XB", "99999999999999999999", "20000000000T",
        "1e9", NULL};
    for (size_t i = 0; bad[i] != NULL; i++) {
        uint64_t v = 77;
        CHECK_STATUS(kvs__parse_size(bad[i], &v), KVS_INVALID_PARAMS);
        CHECK_EQ_U64(v, 77); /* untouched on failure */
    }
    CHECK_STATUS(kvs__parse_size(NULL, NULL), KVS_INVALID_PARAMS);
    char buf[32];
    CHECK_EQ_STR(kvs__format_size(3ull << 29, buf, sizeof(buf)), "1.50 GiB");
    CHECK_EQ_STR(kvs__format_size(100, buf, sizeof(buf)), "100 B");
}

static void test_env(void)
{
    uint64_t v = 5;
    unsetenv("KVS_TEST_ENV");
    CHECK_STATUS(kvs__env_size("KVS_TEST_ENV", &v), KVS_OK);
    CHECK_EQ_U64(v, 5);
    setenv("KVS_TEST_ENV", "256MiB", 1);
    CHECK_STATUS(kvs__env_size("KVS_TEST_ENV", &v), KVS_OK);
    CHECK_EQ_U64(v, 256ull << 20);
    setenv("KVS_TEST_ENV", "lots", 1);
    CHECK_STATUS(kvs__env_size("KVS_TEST_ENV", &v), KVS_INVALID_PARAMS);
    CHECK_EQ_U64(v, 256ull << 20);
    setenv("KVS_TEST_ENV", "70", 1);
    CHECK_STATUS(kvs__env_u64("KVS_TEST_ENV", 50, &v), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__env_u64("KVS_TEST_ENV", 100, &v), KVS_OK);
    CHECK_EQ_U64(v, 70);
    bool b = false;
    setenv("KVS_TEST_ENV", "yes", 1);
    CHECK_STATUS(kvs__env_bool("KVS_TEST_ENV", &b), KVS_OK);
    CHECK(b);
    setenv("KVS_TEST_ENV", "0", 1);
    CHECK_STATUS(kvs__env_bool("KVS_TEST_ENV", &b), KVS_OK);
    CHECK(!b);
    setenv("KVS_TEST_ENV", "maybe", 1);
    CHECK_STATUS(kvs__env_bool("KVS_TEST_ENV", &b), KVS_INVALID_PARAMS);
}

static void test_keys_and_hosts(void)
{
    CHECK_STATUS(kvs__key_check("a", 1), KVS_OK);
    CHECK_STATUS(kvs__key_check("", 0), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__key_check(NULL, 3), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__key_check("a\0b", 3), KVS_INVALID_PARAMS);
    char big[KVS_MAX_KEY_LEN + 1];
    memset(big, 'k', sizeof(big));
    CHECK_STATUS(kvs__key_check(big, KVS_MAX_KEY_LEN), KVS_OK);
    CHECK_STATUS(kvs__key_check(big, KVS_MAX_KEY_LEN + 1), KVS_INVALID_PARAMS);

    char *host;
    uint16_t port;
    CHECK_STATUS(kvs__parse_host_port("10.0.0.1:7000", "x", &host, &port), KVS_OK);
    CHECK_EQ_STR(host, "10.0.0.1");
    CHECK_EQ_INT(port, 7000);
    kvs__free(host);
    CHECK_STATUS(kvs__parse_host_port(":9", "127.0.0.1", &host, &port), KVS_OK);
    CHECK_EQ_STR(host, "127.0.0.1");
    CHECK_EQ_INT(port, 9);
    kvs__free(host);
    CHECK_STATUS(kvs__parse_host_port("h:70000", "x", &host, &port), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__parse_host_port("h:", "x", &host, &port), KVS_INVALID_PARAMS);
    CHECK(kvs__hash64("a", 1) != kvs__hash64("b", 1));
}

/* The table hash is SipHash-1-3 (known values under the all-zero key, a 64-bit result) under a
 * random key per process: two processes hash a key differently, so a peer cannot choose keys
 * that collide. (It was unkeyed FNV, the same in every process.) */
static void test_keyed_hash(void)
{
    CHECK_EQ_U64(kvs__siphash13(0, 0, "", 0), 0xd1fba762150c532cull);
    CHECK_EQ_U64(kvs__siphash13(0, 0, "siphash", 7), 0x8264ceeccb16bcbeull);
    CHECK_EQ_U64(kvs__siphash13(0, 0, "digest-sip_hash", 15), 0xce31007e34130c0aull);
    uint64_t h[2];
    for (int i = 0; i < 2; i++) {
        int fd[2];
        CHECK_EQ_INT(pipe(fd), 0);
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) { /* a fresh process: its key is drawn on first use */
            uint64_t v = kvs__hash64("the same key", 12);
            _exit(write(fd[1], &v, sizeof(v)) == (ssize_t)sizeof(v) ? 0 : 1);
        }
        close(fd[1]);
        CHECK_EQ_INT(read(fd[0], &h[i], sizeof(h[i])), (int)sizeof(h[i]));
        close(fd[0]);
        int st = 0;
        CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    CHECK(h[0] != h[1]);
    CHECK_EQ_U64(kvs__hash64("x", 1), kvs__hash64("x", 1)); /* stable within a process */
}

static void test_alloc_counting_and_injection(void)
{
    size_t bytes0 = kvs__alloc_live_bytes(), count0 = kvs__alloc_live_count();
    char *p = kvs__malloc(100);
    CHECK(p != NULL);
    CHECK_EQ_U64(kvs__alloc_live_bytes(), bytes0 + 100);
    CHECK_EQ_U64(kvs__alloc_live_count(), count0 + 1);
    p = kvs__realloc(p, 300);
    CHECK(p != NULL);
    CHECK_EQ_U64(kvs__alloc_live_bytes(), bytes0 + 300);
    kvs__free(p);
    CHECK_EQ_U64(kvs__alloc_live_bytes(), bytes0);
    CHECK_EQ_U64(kvs__alloc_live_count(), count0);
    kvs__free(NULL);

    kvs__alloc_inject_failure(1, false); /* the second allocation fails, once */
    void *a = kvs__malloc(8), *b = kvs__malloc(8), *c = kvs__malloc(8);
    CHECK(a != NULL);
    CHECK(b == NULL);
    CHECK(c != NULL);
    kvs__alloc_inject_failure(0, true);
    CHECK(kvs__malloc(1) == NULL);
    CHECK(kvs__strdup("x") == NULL);
    kvs__alloc_inject_failure(-1, false);
    CHECK(kvs__calloc(SIZE_MAX / 2, 4) == NULL); /* overflow refused */
    kvs__free(a);
    kvs__free(c);
    CHECK_EQ_U64(kvs__alloc_live_count(), count0);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Random values (served from per-thread pools of the kernel's generator): never 0, no repeat in
 * many pools' worth, and a forked child's values are not the ones its parent goes on to get
 * from the pool they shared at fork. */
static void test_random_values(void)
{
    enum { N = 5000, K = 64 };
    static uint64_t v[N + K];
    for (int i = 0; i < N; i++) {
        v[i] = kvs__random_u64();
        CHECK(v[i] != 0);
    }
    int fds[2];
    CHECK_EQ_INT(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        uint64_t w[K];
        for (int i = 0; i < K; i++)
            w[i] = kvs__random_u64();
        _exit(write(fds[1], w, sizeof(w)) == (ssize_t)sizeof(w) ? 0 : 1);
    }
    uint64_t child[K];
    for (int i = 0; i < K; i++)
        v[N + i] = kvs__random_u64(); /* the parent's next values, from the same pool */
    CHECK_EQ_INT(read(fds[0], child, sizeof(child)), (int)sizeof(child));
    int st = 0;
    CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fds[0]);
    close(fds[1]);
    for (int i = 0; i < K; i++)
        for (int j = 0; j < N + K; j++)
            CHECK(child[i] != v[j]);
    qsort(v, N + K, sizeof(v[0]), cmp_u64);
    for (int i = 1; i < N + K; i++)
        CHECK(v[i] != v[i - 1]);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_status_table),
        KVS_TEST_CASE(test_keyed_hash),
        KVS_TEST_CASE(test_random_values),
        KVS_TEST_CASE(test_parse_size),
        KVS_TEST_CASE(test_env),
        KVS_TEST_CASE(test_keys_and_hosts),
        KVS_TEST_CASE(test_alloc_counting_and_injection),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
