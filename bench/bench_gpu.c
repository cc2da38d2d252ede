/* `kvstash bench gpu`: multi-buffer reads into randomly chosen device pages through the client
 * (its protocol from KVS_PROTOCOL): direct with one copy per fragment, direct with batched
 * copies, and staged (a second client with MC_STORE_GPU_STAGING=1: one transfer per key into the
 * staging buffer, one scatter launch per fill), next to what the copy engine does alone in the
 * same run: one pinned host-to-device copy of the same bytes, and the same fragments copied from
 * pinned host memory per fragment and as one batch. Every read's bytes are checked. CUDA builds
 * only. */
#define _GNU_SOURCE
#include "common/common_int.h"
#include "gpu/gpu_copy.h"
#include "tools/cli_int.h"

#include <kvstash/kvstash.h>

#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BCUDA(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench gpu: %s: %s\n", #call, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[n / 2];
}

/* The same fragments from pinned host memory: one copy each, or one batch. Returns GB/s. */
static double raw_fragments(const char *host, kvs_buf_t *frags, size_t nf, uint64_t total,
                            bool batched, cudaStream_t st)
{
    void **dsts = malloc(nf * sizeof(*dsts));
    const void **srcs = malloc(nf * sizeof(*srcs));
    size_t *sizes = malloc(nf * sizeof(*sizes));
    uint64_t off = 0;
    for (size_t i = 0; i < nf; i++) {
        dsts[i] = frags[i].ptr;
        srcs[i] = host + off;
        sizes[i] = frags[i].len;
        off += frags[i].len;
    }
    uint64_t t0 = kvs__now_ns();
    if (batched) {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.srcLocHint.type = cudaMemLocationTypeHost;
        attr.dstLocHint.type = cudaMemLocationTypeDevice;
        size_t idx = 0;
#if CUDART_VERSION >= 13000
        BCUDA(cudaMemcpyBatchAsync(dsts, srcs, sizes, nf, &attr, &idx, 1, st));
#else
        size_t fail = 0;
        BCUDA(cudaMemcpyBatchAsync(dsts, (void **)srcs, sizes, nf, &attr, &idx, 1, &fail, st));
#endif
    } else {
        for (size_t i = 0; i < nf; i++)
            BCUDA(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, st));
    }
    BCUDA(cudaStreamSynchronize(st));
    uint64_t t1 = kvs__now_ns();
    free(dsts);
    free(srcs);
    free(sizes);
    return (double)total / (double)(t1 - t0);
}

/* Median GB/s of `reps` reads (after one warm-up) of every key into its pages, each page then
 * checked against the source; -1 on failure. */
static double time_reads(kvs_client_t *c, uint64_t keys, const char **kp, const kvs_buf_t **bufs,
                         size_t *nbufs, char *pool, uint64_t pool_len, const char *host,
                         uint64_t size, uint64_t page, uint64_t reps, int64_t *res, double *v,
                         char *check)
{
    uint64_t total = keys * size, per = size / page;
    for (uint64_t r = 0; r <= reps; r++) {
        BCUDA(cudaMemset(pool, 0, pool_len));
        uint64_t t0 = kvs__now_ns();
        int rc = kvs_client_batch_get_into_multi_buffers(c, keys, kp, bufs, nbufs, false, res);
        uint64_t t1 = kvs__now_ns();
        for (uint64_t k = 0; rc == KVS_OK && k < keys; k++)
            rc = res[k] == (int64_t)size ? KVS_OK : (int)res[k];
        if (rc != KVS_OK) {
            fprintf(stderr, "kvstash bench gpu: read failed: %s\n", kvs_status_str(rc));
            return -1;
        }
        if (r > 0)
            v[r - 1] = (double)total / (double)(t1 - t0);
    }
    for (uint64_t k = 0; k < keys; k++) {
        for (uint64_t j = 0; j < per; j++)
            BCUDA(cudaMemcpy(check + j * page, bufs[k][j].ptr, page, cudaMemcpyDeviceToHost));
        if (memcmp(check, host + k * size, size) != 0) {
            fprintf(stderr, "kvstash bench gpu: key %llu has wrong bytes\n", (unsigned long long)k);
            return -1;
        }
    }
    return median(v, (unsigned)reps);
}

int kvs__bench_gpu_main(const char *master, int argc, char **argv)
{
    uint64_t keys = 96, size = 12u << 20, page = 8192, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        int ok = 0;
        if (strcmp(argv[i], "--keys") == 0)
            ok = kvs__parse_u64(argv[i + 1], 100000, &keys) == KVS_OK && keys > 0;
        else if (strcmp(argv[i], "--size") == 0)
            ok = kvs__parse_size(argv[i + 1], &size) == KVS_OK && size > 0;
        else if (strcmp(argv[i], "--page") == 0)
            ok = kvs__parse_size(argv[i + 1], &page) == KVS_OK && page > 0 && size % page == 0;
        else if (strcmp(argv[i], "--reps") == 0)
            ok = kvs__parse_u64(argv[i + 1], 1000, &reps) == KVS_OK && reps > 0;
        if (!ok) {
            fprintf(stderr, "usage: kvstash bench gpu [--keys N] [--size SIZE] [--page SIZE "
                            "dividing it] [--reps N]\n");
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "kvstash bench gpu: options take a value\n");
        return 2;
    }
    uint64_t total = keys * size, per = size / page, npages = keys * per;
    double *v = calloc(reps, sizeof(double));
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    if (master != NULL)
        cfg.master = master;
    kvs_client_t *c;
    int ret = 1;
    if (kvs_client_open(&cfg, &c) != KVS_OK) {
        fprintf(stderr, "kvstash bench gpu: %s\n", kvs_last_error());
        return 1;
    }
    BCUDA(cudaSetDevice(0));
    char *host = NULL, *pool = NULL, *check = malloc(size);
    BCUDA(cudaMallocHost((void **)&host, total));
    BCUDA(cudaMalloc((void **)&pool, npages * page));
    for (uint64_t b = 0; b < total; b++)
        host[b] = (char)((b * 2654435761u) >> 11);
    char **names = calloc(keys, sizeof(*names));
    const char **kp = calloc(keys, sizeof(*kp));
    kvs_buf_t *src = calloc(keys, sizeof(*src)), *frags = calloc(npages, sizeof(*frags));
    const kvs_buf_t **bufs = calloc(keys, sizeof(*bufs));
    size_t *nbufs = calloc(keys, sizeof(*nbufs));
    int64_t *res = calloc(keys, sizeof(*res));
    int *pres = calloc(keys, sizeof(*pres));
    uint64_t *perm = malloc(npages * sizeof(*perm));
    if (perm == NULL || names == NULL || kp == NULL || src == NULL || frags == NULL ||
        bufs == NULL || nbufs == NULL || res == NULL || pres == NULL || check == NULL ||
        v == NULL) {
        fprintf(stderr, "kvstash bench gpu: out of memory\n");
        goto out;
    }
    kvs__bench_shuffle(perm, npages, 7);
    for (uint64_t k = 0; k < keys; k++) {
        names[k] = malloc(48);
        snprintf(names[k], 48, "bench-gpu-%d-%llu", (int)getpid(), (unsigned long long)k);
        kp[k] = names[k];
        src[k] = (kvs_buf_t){host + k * size, size};
        for (uint64_t j = 0; j < per; j++)
            frags[k * per + j] = (kvs_buf_t){pool + perm[k * per + j] * page, page};
        bufs[k] = &frags[k * per];
        nbufs[k] = per;
    }
    if (kvs_client_register_buffer(c, host, total) != KVS_OK ||
        kvs_client_register_buffer(c, pool, npages * page) != KVS_OK ||
        kvs_client_batch_put_from(c, keys, kp, src, NULL, pres) != KVS_OK) {
        fprintf(stderr, "kvstash bench gpu: setup failed: %s\n", kvs_last_error());
        goto out;
    }
    for (uint64_t k = 0; k < keys; k++) {
        if (pres[k] != KVS_OK) {
            fprintf(stderr, "kvstash bench gpu: put %s: %s\n", kp[k], kvs_status_str(pres[k]));
            goto out;
        }
    }
    char sz[32], pg[32];
    printf("%llu keys x %s into %s device pages (%llu fragments), protocol %s, %llu reps\n",
           (unsigned long long)keys, kvs__format_size(size, sz, sizeof(sz)),
           kvs__format_size(page, pg, sizeof(pg)), (unsigned long long)npages,
           getenv("KVS_PROTOCOL") ? getenv("KVS_PROTOCOL") : "auto", (unsigned long long)reps);
    double direct[2] = {0, 0}, staged = 0;
    for (int batched = 0; batched <= 1; batched++) {
        kvs__gpu_set_batched(batched != 0);
        direct[batched] = time_reads(c, keys, kp, bufs, nbufs, pool, npages * page, host, size,
                                     page, reps, res, v, check);
        if (direct[batched] < 0)
            goto out;
    }
    /* Staged: a second client, staging on (its buffer made on its first call). */
    setenv("MC_STORE_GPU_STAGING", "1", 1);
    kvs_client_config_t scfg;
    kvs_client_config_init(&scfg);
    scfg.master = cfg.master;
    kvs_client_t *sc = NULL;
    if (kvs_client_open(&scfg, &sc) != KVS_OK ||
        kvs_client_register_buffer(sc, pool, npages * page) != KVS_OK) {
        fprintf(stderr, "kvstash bench gpu: staged client: %s\n", kvs_last_error());
        kvs_client_close(sc);
        goto out;
    }
    kvs_client_stats_t ds; /* the direct client's, before the staged calls */
    kvs_client_get_stats(c, &ds);
    staged = time_reads(sc, keys, kp, bufs, nbufs, pool, npages * page, host, size, page, reps, res,
                        v, check);
    kvs_client_stats_t ss;
    kvs_client_get_stats(sc, &ss);
    kvs_client_close(sc);
    if (staged < 0)
        goto out;
    if (ss.staged_reads != reps + 1) {
        fprintf(stderr,
                "kvstash bench gpu: only %llu of %llu reads were staged (fallbacks: "
                "busy %llu, too_large %llu, other_domain %llu, alloc_failed %llu)\n",
                (unsigned long long)ss.staged_reads, (unsigned long long)(reps + 1),
                (unsigned long long)ss.fallback_busy, (unsigned long long)ss.fallback_too_large,
                (unsigned long long)ss.fallback_other_domain,
                (unsigned long long)ss.fallback_alloc_failed);
        goto out;
    }
    /* The copy engine alone, same run: one contiguous pinned copy, and the same fragments. */
    cudaStream_t st;
    BCUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    double contig[8], each[8], batch[8];
    unsigned rr = reps < 8 ? (unsigned)reps : 8;
    for (unsigned r = 0; r < rr; r++) {
        uint64_t t0 = kvs__now_ns();
        BCUDA(cudaMemcpyAsync(pool, host, total, cudaMemcpyHostToDevice, st));
        BCUDA(cudaStreamSynchronize(st));
        contig[r] = (double)total / (double)(kvs__now_ns() - t0);
        each[r] = raw_fragments(host, frags, npages, total, false, st);
        batch[r] = raw_fragments(host, frags, npages, total, true, st);
    }
    double c_gb = median(contig, rr), e_gb = median(each, rr), b_gb = median(batch, rr);
    printf("direct read, one copy per fragment:  %6.2f GB/s\n", direct[0]);
    printf("direct read, batched copies:         %6.2f GB/s\n", direct[1]);
    printf("raw: pinned host->device, one copy:  %6.2f GB/s\n", c_gb);
    printf("raw: same fragments, one copy each:  %6.2f GB/s\n", e_gb);
    printf("raw: same fragments, one batch:      %6.2f GB/s\n", b_gb);
    double best = direct[1] > direct[0] ? direct[1] : direct[0];
    printf("staged read (%llu fills per call):    %6.2f GB/s\n",
           (unsigned long long)(ss.fills / ss.staged_reads), staged);
    printf("direct (better mode) / raw batched:  %5.1f%%\n", 100.0 * best / b_gb);
    printf("host planning per call: direct %.0f us (%.1f ns/fragment), staged %.0f us (%.1f "
           "ns/fragment)\n",
           (double)ds.plan_ns_total / 1e3 / (double)ds.get_calls,
           (double)ds.plan_ns_total / (double)ds.planned_fragments,
           (double)ss.plan_ns_total / 1e3 / (double)ss.get_calls,
           (double)ss.plan_ns_total / (double)ss.planned_fragments);
    printf("staged / direct (better mode):       %5.2fx; every byte checked\n", staged / best);
    cudaStreamDestroy(st);
    ret = 0;
out:
    for (uint64_t k = 0; names != NULL && k < keys; k++)
        if (names[k] != NULL)
            kvs_client_remove(c, kp[k], true);
    kvs_client_close(c);
    cudaFreeHost(host);
    cudaFree(pool);
    for (uint64_t k = 0; names && k < keys; k++)
        free(names[k]);
    free(names);
    free(kp);
    free(src);
    free(frags);
    free(bufs);
    free(nbufs);
    free(res);
    free(pres);
    free(perm);
    free(check);
    free(v);
    return ret;
}
