/* GPU: puts from device buffers and multi-buffer reads into randomly chosen device pages (4-64
 * KiB fragments, odd sizes, unaligned offsets) over tcp and shm, direct and grouped, against a
 * real kvstash-server. Every byte is checked, and the guard bytes around every page. Without a
 * GPU the program reports a skip (exit 77). */
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

#define GUARD            0xC3
#define NKEYS            6
#define MAXFRAG          2048
#define CHECK_CUDA(call) CHECK_EQ_INT((call), cudaSuccess)

static uint8_t byte_of(int key, uint64_t off)
{
    return (uint8_t)(((off + (uint64_t)key * 7919) * 0x9E3779B97F4A7C15ull) >> 56);
}

static const uint64_t sizes[NKEYS] = {1, 4097, 65536, 1000003, 3u << 20, 777777};

typedef struct {
    kvs_buf_t f[NKEYS][MAXFRAG];
    size_t n[NKEYS];
    const kvs_buf_t *bufs[NKEYS];
} layout_t;

/* Fragments of 4-64 KiB (odd sizes included) at shuffled, unaligned places of `pool`, with at
 * least one guard byte between any two. Returns the bytes of the pool used. */
static uint64_t layout_make(layout_t *l, char *pool, uint64_t pool_len)
{
    uint64_t pos = 3;
    for (int k = 0; k < NKEYS; k++) {
        uint64_t off = 0;
        l->n[k] = 0;
        while (off < sizes[k]) {
            uint64_t want = 4096 + kvs_test_rand() % 61440;
            if (kvs_test_rand() % 3 == 0)
                want |= 1; /* odd */
            uint64_t len = KVS_MIN(want, sizes[k] - off);
            CHECK(l->n[k] < MAXFRAG);
            l->f[k][l->n[k]++] = (kvs_buf_t){NULL, len};
            off += len;
        }
        /* Reverse order inside the key's region, gaps of 1..17 bytes. */
        for (size_t j = l->n[k]; j-- > 0;) {
            l->f[k][j].ptr = pool + pos;
            pos += l->f[k][j].len + 1 + kvs_test_rand() % 17;
        }
        l->bufs[k] = l->f[k];
    }
    CHECK(pos <= pool_len);
    return pos;
}

/* Copies the device pool back and checks every fragment and every other byte. */
static void check_pool(const layout_t *l, const char *d_pool, uint64_t pool_len, const int64_t *res)
{
    uint8_t *h = malloc(pool_len), *mark = calloc(pool_len, 1);
    CHECK(h && mark);
    CHECK_CUDA(cudaMemcpy(h, d_pool, pool_len, cudaMemcpyDeviceToHost));
    for (int k = 0; k < NKEYS; k++) {
        CHECK_EQ_INT(res[k], (int64_t)sizes[k]);
        uint64_t off = 0;
        for (size_t j = 0; j < l->n[k]; j++) {
            uint64_t at = (uint64_t)((const char *)l->f[k][j].ptr - d_pool);
            for (uint64_t b = 0; b < l->f[k][j].len; b++) {
                if (h[at + b] != byte_of(k, off + b))
                    kvs_test_fail(__FILE__, __LINE__, "key %d byte %llu wrong", k,
                                  (unsigned long long)(off + b));
            }
            memset(mark + at, 1, l->f[k][j].len);
            off += l->f[k][j].len;
        }
    }
    for (uint64_t b = 0; b < pool_len; b++) {
        if (!mark[b] && h[b] != GUARD)
            kvs_test_fail(__FILE__, __LINE__, "guard byte %llu overwritten", (unsigned long long)b);
    }
    free(h);
    free(mark);
}

static void gpu_paths_case(const char *protocol)
{
    server_t srv;
    const char *args[] = {"--segment-size", "64MiB", NULL};
    server_start(&srv, args);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)srv.port);
    setenv("KVS_PROTOCOL", protocol, 1);
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = master;
    kvs_client_t *c;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    CHECK_CUDA(cudaSetDevice(0));

    /* Sources: each key's bytes scattered over device pages too. */
    uint64_t pool_len = 12u << 20;
    char *d_src = NULL, *d_dst = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_src, pool_len));
    CHECK_CUDA(cudaMalloc((void **)&d_dst, pool_len));
    layout_t *ls = calloc(1, sizeof(*ls)), *ld = calloc(1, sizeof(*ld));
    CHECK(ls && ld);
    layout_make(ls, d_src, pool_len);
    uint8_t *h = malloc(pool_len);
    CHECK(h);
    memset(h, 0, pool_len);
    for (int k = 0; k < NKEYS; k++) {
        uint64_t off = 0;
        for (size_t j = 0; j < ls->n[k]; j++) {
            uint64_t at = (uint64_t)((char *)ls->f[k][j].ptr - d_src);
            for (uint64_t b = 0; b < ls->f[k][j].len; b++)
                h[at + b] = byte_of(k, off + b);
            off += ls->f[k][j].len;
        }
    }
    CHECK_CUDA(cudaMemcpy(d_src, h, pool_len, cudaMemcpyHostToDevice));
    CHECK_STATUS(kvs_client_register_buffer(c, d_src, pool_len), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, d_dst, pool_len), KVS_OK);
    const char *keys[NKEYS] = {"g0", "g1", "g2", "g3", "g4", "g5"};
    int put_res[NKEYS];
    CHECK_STATUS(kvs_client_batch_put_from_multi(c, NKEYS, keys, ls->bufs, ls->n, NULL, put_res),
                 KVS_OK);
    for (int k = 0; k < NKEYS; k++) {
        CHECK_STATUS(put_res[k], KVS_OK);
        /* What the store holds, read back to host memory. */
        void *data;
        size_t size;
        CHECK_STATUS(kvs_client_get(c, keys[k], &data, &size), KVS_OK);
        CHECK_EQ_U64(size, sizes[k]);
        for (uint64_t b = 0; b < size; b++)
            CHECK_EQ_INT(((uint8_t *)data)[b], byte_of(k, b));
        kvs_free(data);
    }
    for (int grouped = 0; grouped <= 1; grouped++) {
        layout_make(ld, d_dst, pool_len);
        CHECK_CUDA(cudaMemset(d_dst, GUARD, pool_len));
        int64_t res[NKEYS];
        CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, NKEYS, keys, ld->bufs, ld->n,
                                                             grouped != 0, res),
                     KVS_OK);
        check_pool(ld, d_dst, pool_len, res);
    }
    /* A key whose fragments mix host and device memory is refused before any I/O. */
    char *hbuf = malloc(4096);
    CHECK_STATUS(kvs_client_register_buffer(c, hbuf, 4096), KVS_OK);
    kvs_buf_t mixed[2] = {{hbuf, 1}, {d_dst, 4096}};
    const kvs_buf_t *mb = mixed;
    size_t mn = 2;
    int64_t r;
    CHECK_STATUS(kvs_client_batch_get_into_multi_buffers(c, 1, &keys[1], &mb, &mn, false, &r),
                 KVS_OK);
    CHECK_STATUS(r, KVS_INVALID_PARAMS);
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    bool shm = strcmp(protocol, "shm") == 0;
    CHECK(shm ? s.shm_transfers > 0 && s.tcp_transfers == 0
              : s.tcp_transfers > 0 && s.shm_transfers == 0);
    printf("  %s: %llu transfers, all bytes and guards checked\n", protocol,
           (unsigned long long)(shm ? s.shm_transfers : s.tcp_transfers));
    CHECK_STATUS(kvs_client_unregister_buffer(c, hbuf), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(c, d_src), KVS_OK);
    CHECK_STATUS(kvs_client_unregister_buffer(c, d_dst), KVS_OK);
    kvs_client_close(c);
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_dst));
    free(hbuf);
    free(h);
    free(ls);
    free(ld);
    server_stop(&srv);
}

static void test_gpu_over_tcp(void)
{
    gpu_paths_case("tcp");
}

static void test_gpu_over_shm(void)
{
    gpu_paths_case("shm");
}

/* Registered in 64 KiB chunks, most objects span several registrations: no copy may span two. */
static void test_gpu_over_shm_small_pin_chunks(void)
{
    setenv("KVS_SHM_PIN_CHUNK_BYTES", "64KiB", 1);
    gpu_paths_case("shm");
}

static void test_gpu_over_shm_per_fragment_copies(void)
{
    setenv("KVS_GPU_COPY", "each", 1);
    gpu_paths_case("shm");
}

int main(int argc, char **argv)
{
    if (!have_gpu()) {
        printf("SKIP: no CUDA device\n");
        return KVS_TEST_SKIP;
    }
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_gpu_over_tcp),
        KVS_TEST_CASE(test_gpu_over_shm),
        KVS_TEST_CASE(test_gpu_over_shm_small_pin_chunks),
        KVS_TEST_CASE(test_gpu_over_shm_per_fragment_copies),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
