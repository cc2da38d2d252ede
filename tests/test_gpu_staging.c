/* GPU: read staging with the CUDA backend into device pages, against a real kvstash-server, over
 * shm and tcp, staged and grouped staged: bytes and guard bytes checked, fills and launches
 * counted, busy fallback, injected receive and scatter failures, a stalled scatter kernel aborted
 * at the call's deadline. Without a GPU the program
 * reports a skip (exit 77). */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "gpu_probe.h"
#include "server_fixture.h"
#include "client/client_int.h"

#include <kvstash/kvstash.h>

#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define GUARD            0x3C
#define CHECK_CUDA(call) CHECK_EQ_INT((call), cudaSuccess)
#define NK               7

/* Fills in exactly four with a 1 MiB buffer: {0,1} {2,3} {4} {5,6}. */
static const uint64_t sizes[NK] = {600001, 300000, 512000, 512000, 1u << 20, 100000, 50000};
static const char *keys[NK] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6"};

static uint8_t byte_of(int k, uint64_t off)
{
    return (uint8_t)(((off + (uint64_t)k * 104729) * 0x9E3779B97F4A7C15ull) >> 56);
}

typedef struct {
    server_t srv;
    kvs_client_t *c;
    char *pool; /* device */
    uint64_t pool_len;
    kvs_buf_t f[NK][160];
    size_t n[NK];
    const kvs_buf_t *bufs[NK];
} fix_t;

/* The transfer deadline of the next fix_start's client (0: the default). */
static uint64_t fix_transfer_ms;

static void fix_start(fix_t *x, const char *protocol)
{
    const char *args[] = {"--segment-size", "64MiB", NULL};
    server_start(&x->srv, args);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)x->srv.port);
    setenv("KVS_PROTOCOL", protocol, 1);
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    setenv("MC_STORE_GPU_STAGING_BUFFER_BYTES", "1MiB", 1);
    unsetenv("MC_STORE_GPU_STAGING_BACKEND"); /* the CUDA backend */
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = master;
    if (fix_transfer_ms != 0)
        cfg.transfer_timeout_ms = fix_transfer_ms;
    CHECK_STATUS(kvs_client_open(&cfg, &x->c), KVS_OK);
    CHECK(kvs__client_staging(x->c) != NULL);
    /* Objects put from host memory. */
    for (int k = 0; k < NK; k++) {
        uint8_t *b = malloc(sizes[k]);
        for (uint64_t i = 0; i < sizes[k]; i++)
            b[i] = byte_of(k, i);
        CHECK_STATUS(kvs_client_put(x->c, keys[k], b, sizes[k], NULL), KVS_OK);
        free(b);
    }
    CHECK_CUDA(cudaSetDevice(0));
    x->pool_len = 8u << 20;
    CHECK_CUDA(cudaMalloc((void **)&x->pool, x->pool_len));
    CHECK_STATUS(kvs_client_register_buffer(x->c, x->pool, x->pool_len), KVS_OK);
}

/* New random 4-60 KiB fragments (odd sizes, unaligned, reversed) and guard everywhere. */
static void fix_layout(fix_t *x)
{
    CHECK_CUDA(cudaMemset(x->pool, GUARD, x->pool_len));
    uint64_t pos = 5;
    for (int k = 0; k < NK; k++) {
        uint64_t off = 0;
        x->n[k] = 0;
        while (off < sizes[k]) {
            uint64_t want = 4096 + kvs_test_rand() % 57344;
            uint64_t len = KVS_MIN(want | 1, sizes[k] - off);
            CHECK(x->n[k] < 160);
            x->f[k][x->n[k]++] = (kvs_buf_t){NULL, len};
            off += len;
        }
        for (size_t j = x->n[k]; j-- > 0;) {
            x->f[k][j].ptr = x->pool + pos;
            pos += x->f[k][j].len + 1 + kvs_test_rand() % 13;
        }
        x->bufs[k] = x->f[k];
    }
    CHECK(pos <= x->pool_len);
}

/* ok[k]: key k must hold its bytes; otherwise its fragments must still be guard. Everything
 * outside the fragments is guard. */
static void fix_check(fix_t *x, const bool *ok)
{
    uint8_t *h = malloc(x->pool_len), *mark = calloc(x->pool_len, 1);
    CHECK_CUDA(cudaMemcpy(h, x->pool, x->pool_len, cudaMemcpyDeviceToHost));
    for (int k = 0; k < NK; k++) {
        uint64_t off = 0;
        for (size_t j = 0; j < x->n[k]; j++) {
            uint64_t at = (uint64_t)((char *)x->f[k][j].ptr - x->pool);
            for (uint64_t b = 0; b < x->f[k][j].len; b++) {
                uint8_t want = ok[k] ? byte_of(k, off + b) : GUARD;
                if (h[at + b] != want)
                    kvs_test_fail(__FILE__, __LINE__, "key %d byte %llu: 0x%02x, want 0x%02x", k,
                                  (unsigned long long)(off + b), h[at + b], want);
            }
            memset(mark + at, 1, x->f[k][j].len);
            off += x->f[k][j].len;
        }
    }
    for (uint64_t b = 0; b < x->pool_len; b++) {
        if (!mark[b] && h[b] != GUARD)
            kvs_test_fail(__FILE__, __LINE__, "guard byte %llu overwritten", (unsigned long long)b);
    }
    free(h);
    free(mark);
}

static void fix_stop(fix_t *x)
{
    CHECK_STATUS(kvs_client_unregister_buffer(x->c, x->pool), KVS_OK);
    kvs_client_close(x->c);
    CHECK_CUDA(cudaFree(x->pool));
    server_stop(&x->srv);
}

static kvs_client_stats_t stats(fix_t *x)
{
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(x->c, &s), KVS_OK);
    return s;
}

static void staged_case(const char *protocol)
{
    fix_t *x = calloc(1, sizeof(*x));
    fix_start(x, protocol);
    bool all[NK] = {true, true, true, true, true, true, true};
    for (int grouped = 0; grouped <= 1; grouped++) {
        fix_layout(x);
        int64_t res[NK];
        CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n,
                                                             grouped != 0, res),
                     KVS_OK);
        for (int k = 0; k < NK; k++)
            CHECK_EQ_INT(res[k], (int64_t)sizes[k]);
        fix_check(x, all);
    }
    kvs_client_stats_t s = stats(x);
    CHECK_EQ_U64(s.staged_reads, 2);
    CHECK_EQ_U64(s.fills, 8); /* four per call */
    CHECK_EQ_U64(s.scatter_launches, 8);
    CHECK_EQ_U64(s.get_submissions, 0);
    bool shm = strcmp(protocol, "shm") == 0;
    CHECK(shm ? s.shm_transfers > 0 && s.tcp_transfers == 0 : s.tcp_transfers > 0);
    printf("  %s: %llu staged reads, %llu fills, %llu launches\n", protocol,
           (unsigned long long)s.staged_reads, (unsigned long long)s.fills,
           (unsigned long long)s.scatter_launches);
    fix_stop(x);
    free(x);
}

static void test_gpu_staged_over_shm(void)
{
    staged_case("shm");
}

static void test_gpu_staged_over_tcp(void)
{
    staged_case("tcp");
}

static void test_gpu_staging_busy_and_injected_failures(void)
{
    fix_t *x = calloc(1, sizeof(*x));
    fix_start(x, "shm");
    kvs__staging_t *sg = kvs__client_staging(x->c);
    bool all[NK] = {true, true, true, true, true, true, true};
    int64_t res[NK];
    /* Busy: the direct GPU path, exact bytes. */
    CHECK_STATUS(kvs__staging_hold(sg, true), KVS_OK);
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    fix_check(x, all);
    CHECK_EQ_U64(stats(x).fallback_busy, 1);
    CHECK_EQ_U64(stats(x).staged_reads, 0);
    CHECK_STATUS(kvs__staging_hold(sg, false), KVS_OK);
    uint64_t direct_subs = stats(x).get_submissions;
    /* A failed receive fails its key only; nothing is replayed directly. */
    kvs__staging_hooks_t h = {.fail_transfer_key = -1, .fail_receive_key = 3};
    kvs__staging_set_hooks(sg, &h);
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    bool but3[NK] = {true, true, true, false, true, true, true};
    CHECK_STATUS(res[3], KVS_TRANSFER_FAIL);
    fix_check(x, but3);
    /* A failed scatter fails the keys of every fill; destinations untouched. */
    h = (kvs__staging_hooks_t){.fail_receive_key = -1, .fail_scatter = true};
    kvs__staging_set_hooks(sg, &h);
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    bool none[NK] = {false};
    for (int k = 0; k < NK; k++)
        CHECK_STATUS(res[k], KVS_TRANSFER_FAIL);
    fix_check(x, none);
    kvs_client_stats_t s = stats(x);
    CHECK_EQ_U64(s.get_submissions, direct_subs); /* no direct replay */
    CHECK_EQ_U64(s.staged_reads, 2);
    fix_stop(x);
    free(x);
}

/* A fill's scatter kernel whose units are never published (the host failed between launch and
 * publication): the call waits for it until its deadline (500 ms), aborts it there and returns
 * within the deadline plus 100 ms, every key TIMED_OUT, no destination written, nothing replayed;
 * the next call on the same device (its lane, context and stream) is exact. */
static void test_gpu_staging_stalled_scatter_is_aborted_at_the_deadline(void)
{
    fix_transfer_ms = 500;
    fix_t *x = calloc(1, sizeof(*x));
    fix_start(x, "shm");
    fix_transfer_ms = 0;
    kvs__staging_t *sg = kvs__client_staging(x->c);
    kvs__staging_hooks_t h = {
        .fail_transfer_key = -1, .fail_receive_key = -1, .stall_scatter = true};
    kvs__staging_set_hooks(sg, &h);
    fix_layout(x);
    int64_t res[NK];
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    uint64_t ms = (kvs__now_ns() - t0) / 1000000;
    printf("  stalled scatter kernel: the call returned after %llu ms (deadline 500 ms)\n",
           (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 400);
    CHECK_CMP_U64(ms, <, 600);
    for (int k = 0; k < NK; k++)
        CHECK_STATUS(res[k], KVS_TIMED_OUT);
    bool none[NK] = {false};
    fix_check(x, none);
    kvs_client_stats_t s = stats(x);
    CHECK_EQ_U64(s.scatter_launches, 1); /* the later fills found the deadline passed */
    CHECK_EQ_U64(s.get_submissions, 0);
    h.stall_scatter = false;
    kvs__staging_set_hooks(sg, &h);
    bool all[NK] = {true, true, true, true, true, true, true};
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    for (int k = 0; k < NK; k++)
        CHECK_EQ_INT(res[k], (int64_t)sizes[k]);
    fix_check(x, all);
    fix_stop(x);
    free(x);
}

/* The buffer is bound to the device of the first staged call: a call into another GPU's pages
 * falls back (other_gpu) and is exact through the direct path. Needs two GPUs. */
static void test_gpu_staging_other_gpu_falls_back(void)
{
    int ngpu = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ngpu));
    if (ngpu < 2) {
        printf("  SKIP: needs two GPUs (%d here); run by scripts/device.sh on nvidia-h200-x2\n",
               ngpu);
        return;
    }
    fix_t *x = calloc(1, sizeof(*x));
    fix_start(x, "shm");
    bool all[NK] = {true, true, true, true, true, true, true};
    int64_t res[NK];
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    fix_check(x, all);
    CHECK_EQ_U64(stats(x).staged_reads, 1); /* the buffer now lives on GPU 0 */
    char *gpu0 = x->pool, *gpu1 = NULL;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc((void **)&gpu1, x->pool_len));
    CHECK_STATUS(kvs_client_register_buffer(x->c, gpu1, x->pool_len), KVS_OK);
    x->pool = gpu1;
    fix_layout(x);
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(x->c, NK, keys, x->bufs, x->n, false, res),
                 KVS_OK);
    fix_check(x, all);
    kvs_client_stats_t s = stats(x);
    CHECK_EQ_U64(s.fallback_other_gpu, 1);
    CHECK_EQ_U64(s.staged_reads, 1);
    printf("  GPU 1 pages: fallback other_gpu, bytes exact through the direct path\n");
    CHECK_STATUS(kvs_client_unregister_buffer(x->c, gpu1), KVS_OK);
    CHECK_CUDA(cudaFree(gpu1));
    CHECK_CUDA(cudaSetDevice(0));
    x->pool = gpu0;
    fix_stop(x);
    free(x);
}

int main(int argc, char **argv)
{
    if (!have_gpu()) {
        printf("SKIP: no CUDA device\n");
        return KVS_TEST_SKIP;
    }
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_gpu_staged_over_shm),
        KVS_TEST_CASE(test_gpu_staged_over_tcp),
        KVS_TEST_CASE(test_gpu_staging_busy_and_injected_failures),
        KVS_TEST_CASE(test_gpu_staging_stalled_scatter_is_aborted_at_the_deadline),
        KVS_TEST_CASE(test_gpu_staging_other_gpu_falls_back),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
