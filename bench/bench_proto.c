/* `kvstash bench proto`: encoding and decoding rates of the wire format, measured on the
 * message the read path decodes most: a LOOKUP reply (placement_rsp) for a batch of keys, each
 * with one or more replicas on a few segments. One thread, in this process. */
#include "proto/proto_int.h"
#include "tools/cli_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr, "usage: kvstash bench proto [--keys N] [--replicas N] [--segments N] "
                    "[--reps N] [--iters N]\n");
}

/* Builds a LOOKUP reply of `n` objects with `nrep` replicas each over `nseg` segments. */
static int build_sample(kvs__arena_t *a, uint32_t n, uint32_t nrep, uint32_t nseg, kvs__wbuf_t *w)
{
    kvs__seg_info_t *segs = kvs__arena_alloc(a, nseg * sizeof(*segs));
    kvs__obj_desc_t *objs = kvs__arena_alloc(a, n * sizeof(*objs));
    kvs__replica_t *reps = kvs__arena_alloc(a, (size_t)n * nrep * sizeof(*reps));
    if (segs == NULL || objs == NULL || reps == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t s = 0; s < nseg; s++)
        segs[s] = (kvs__seg_info_t){s + 1,
                                    kvs__str_c("owner-segment"),
                                    kvs__str_c("node-1"),
                                    kvs__str_c("10.0.0.1:50100"),
                                    1ull << 34,
                                    1ull << 33};
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < nrep; j++)
            reps[i * nrep + j] = (kvs__replica_t){(i + j) % nseg + 1, (uint64_t)i << 24, 0};
        objs[i] = (kvs__obj_desc_t){
            .size = 12u << 20, .lease_ms = 9800, .nreps = nrep, .reps = &reps[i * nrep]};
    }
    kvs__placement_rsp_t m = {0, nseg, segs, n, objs};
    kvs__placement_rsp_encode(w, &m);
    return w->failed ? KVS_NO_MEMORY : KVS_OK;
}

int kvs__bench_proto_main(int argc, char **argv)
{
    uint64_t n = 96, nrep = 1, nseg = 2, reps = 7, iters = 200000;
    for (int i = 1; i < argc; i++) {
        uint64_t *dst = NULL, max = 0;
        if (!strcmp(argv[i], "--keys"))
            dst = &n, max = KVS_MAX_BATCH;
        else if (!strcmp(argv[i], "--replicas"))
            dst = &nrep, max = KVS_MAX_REPLICAS;
        else if (!strcmp(argv[i], "--segments"))
            dst = &nseg, max = 4096;
        else if (!strcmp(argv[i], "--reps"))
            dst = &reps, max = 1000;
        else if (!strcmp(argv[i], "--iters"))
            dst = &iters, max = 100000000;
        if (dst == NULL || i + 1 >= argc || kvs__parse_u64(argv[++i], max, dst) != KVS_OK ||
            *dst == 0) {
            usage();
            return 2;
        }
    }
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    if (build_sample(&a, (uint32_t)n, (uint32_t)nrep, (uint32_t)nseg, &w) != KVS_OK) {
        fprintf(stderr, "kvstash bench proto: out of memory\n");
        return 1;
    }
    double *dec = calloc(reps, sizeof(double)), *enc = calloc(reps, sizeof(double));
    kvs__wbuf_t out;
    kvs__wbuf_init(&out);
    int rc = KVS_OK;
    for (uint64_t r = 0; r < reps && rc == KVS_OK; r++) {
        uint64_t t0 = kvs__now_ns();
        for (uint64_t k = 0; k < iters && rc == KVS_OK; k++) {
            kvs__arena_t da;
            kvs__arena_init(&da);
            kvs__placement_rsp_t m;
            rc = kvs__placement_rsp_decode(w.data, w.len, w.version, &da, &m);
            if (rc == KVS_OK && m.nobjs != n)
                rc = KVS_PROTOCOL_ERROR;
            kvs__arena_free(&da);
        }
        uint64_t t1 = kvs__now_ns();
        dec[r] = (double)iters * 1e9 / (double)(t1 - t0);
        kvs__placement_rsp_t m;
        kvs__arena_t da;
        kvs__arena_init(&da);
        if (rc == KVS_OK)
            rc = kvs__placement_rsp_decode(w.data, w.len, w.version, &da, &m);
        uint64_t t2 = kvs__now_ns();
        for (uint64_t k = 0; k < iters && rc == KVS_OK; k++) {
            kvs__wbuf_reset(&out);
            kvs__placement_rsp_encode(&out, &m);
        }
        enc[r] = (double)iters * 1e9 / (double)(kvs__now_ns() - t2);
        kvs__arena_free(&da);
    }
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash bench proto: decoding failed: %s\n", kvs_status_str(rc));
    } else {
        qsort(dec, reps, sizeof(double), cmp_double);
        qsort(enc, reps, sizeof(double), cmp_double);
        printf("LOOKUP reply: %llu keys x %llu replicas over %llu segments, %zu bytes; "
               "%llu reps x %llu messages\n",
               (unsigned long long)n, (unsigned long long)nrep, (unsigned long long)nseg, w.len,
               (unsigned long long)reps, (unsigned long long)iters);
        printf("decode: median %.0f msgs/s (%.1f ns/msg; min %.0f, max %.0f)\n", dec[reps / 2],
               1e9 / dec[reps / 2], dec[0], dec[reps - 1]);
        printf("encode: median %.0f msgs/s (%.1f ns/msg; min %.0f, max %.0f)\n", enc[reps / 2],
               1e9 / enc[reps / 2], enc[0], enc[reps - 1]);
    }
    free(dec);
    free(enc);
    kvs__wbuf_free(&out);
    kvs__wbuf_free(&w);
    kvs__arena_free(&a);
    return rc == KVS_OK ? 0 : 1;
}
