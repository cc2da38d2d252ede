/* `kvstash bench client`: what a user of the C client sees against a running store. Puts keys
 * from one registered buffer (batch_put_from), reads them back into randomly chosen pages of a
 * registered page pool (batch_get_into_multi_buffers, direct and grouped), checks every byte,
 * removes them, and reports the median throughput of each step over the repetitions. */
#define _GNU_SOURCE
#include "common/common_int.h"
#include "tools/cli_int.h"

#include <kvstash/kvstash.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: kvstash [--master HOST:PORT] bench client [options]\n"
               "  --keys N        keys per batch (default 32)\n"
               "  --size SIZE     object size (default 4MiB)\n"
               "  --page SIZE     destination page size (default 64KiB; the last page of an\n"
               "                  object is shorter when SIZE is not a multiple)\n"
               "  --reps N        repetitions; medians are reported (default 5)\n"
               "The store needs room for keys x size bytes.\n");
}

typedef struct {
    uint32_t keys, reps;
    uint64_t size, page;
} bench_opts_t;

static int parse_opts(int argc, char **argv, bench_opts_t *o)
{
    *o = (bench_opts_t){.keys = 32, .reps = 5, .size = 4u << 20, .page = 64u << 10};
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        uint64_t v = 0;
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = -1;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bench_usage(stdout);
            return 1;
        }
        if (val != NULL && strcmp(a, "--keys") == 0)
            ok =
                kvs__parse_u64(val, 65536, &v) == KVS_OK && v > 0 ? (o->keys = (uint32_t)v, 0) : -1;
        else if (val != NULL && strcmp(a, "--reps") == 0)
            ok = kvs__parse_u64(val, 1000, &v) == KVS_OK && v > 0 ? (o->reps = (uint32_t)v, 0) : -1;
        else if (val != NULL && strcmp(a, "--size") == 0)
            ok = kvs__parse_size(val, &o->size) == KVS_OK && o->size > 0 ? 0 : -1;
        else if (val != NULL && strcmp(a, "--page") == 0)
            ok = kvs__parse_size(val, &o->page) == KVS_OK && o->page > 0 ? 0 : -1;
        if (ok != 0) {
            fprintf(stderr, "kvstash bench client: bad option '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    if (o->page > o->size)
        o->page = o->size;
    return 0;
}

void kvs__bench_shuffle(uint64_t *perm, uint64_t n, uint64_t seed)
{
    for (uint64_t p = 0; p < n; p++)
        perm[p] = p;
    for (uint64_t p = n; p > 1; p--) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t j = (seed >> 33) % p, t = perm[p - 1];
        perm[p - 1] = perm[j];
        perm[j] = t;
    }
}

/* Fragment lists: key i reads into pages perm[i * per + j] of the pool. */
typedef struct {
    kvs_buf_t *frags;
    const kvs_buf_t **bufs;
    size_t *nbufs;
} layout_t;

static int layout_build(const bench_opts_t *o, char *pool, layout_t *l)
{
    uint64_t per = (o->size + o->page - 1) / o->page, npages = per * o->keys;
    uint64_t *perm = malloc(npages * sizeof(*perm));
    l->frags = malloc(npages * sizeof(*l->frags));
    l->bufs = malloc(o->keys * sizeof(*l->bufs));
    l->nbufs = malloc(o->keys * sizeof(*l->nbufs));
    if (perm == NULL || l->frags == NULL || l->bufs == NULL || l->nbufs == NULL) {
        free(perm);
        return -1;
    }
    kvs__bench_shuffle(perm, npages, 12345);
    for (uint32_t i = 0; i < o->keys; i++) {
        for (uint64_t j = 0; j < per; j++) {
            uint64_t len = KVS_MIN(o->page, o->size - j * o->page);
            l->frags[i * per + j] = (kvs_buf_t){pool + perm[i * per + j] * o->page, len};
        }
        l->bufs[i] = &l->frags[i * per];
        l->nbufs[i] = per;
    }
    free(perm);
    return 0;
}

/* Every fragment of every key holds the matching slice of its source. */
static int verify(const bench_opts_t *o, const char *src, const layout_t *l, const int64_t *results)
{
    for (uint32_t i = 0; i < o->keys; i++) {
        if (results[i] != (int64_t)o->size) {
            fprintf(stderr, "key %u: result %lld (%s), expected %llu bytes\n", i,
                    (long long)results[i],
                    results[i] < 0 ? kvs_status_str((int)results[i]) : "wrong size",
                    (unsigned long long)o->size);
            return -1;
        }
        const char *s = src + (uint64_t)i * o->size;
        for (size_t j = 0; j < l->nbufs[i]; j++) {
            if (memcmp(l->bufs[i][j].ptr, s, l->bufs[i][j].len) != 0) {
                fprintf(stderr, "key %u: fragment %zu differs from what was put\n", i, j);
                return -1;
            }
            s += l->bufs[i][j].len;
        }
    }
    return 0;
}

static double gbps(uint64_t bytes, uint64_t ns)
{
    return ns ? (double)bytes / (double)ns : 0.0;
}

static int run(kvs_client_t *c, const bench_opts_t *o)
{
    uint64_t total = (uint64_t)o->keys * o->size;
    char *src = malloc(total), *pool = malloc((total + o->page) / o->page * o->page + o->page);
    char **names = calloc(o->keys, sizeof(*names));
    const char **keys = calloc(o->keys, sizeof(*keys));
    kvs_buf_t *srcbufs = calloc(o->keys, sizeof(*srcbufs));
    int64_t *results = calloc(o->keys, sizeof(*results));
    int *put_results = calloc(o->keys, sizeof(*put_results));
    double *put_gbps = calloc(o->reps, sizeof(double)), *direct_gbps = calloc(o->reps, 8),
           *grouped_gbps = calloc(o->reps, 8);
    layout_t l = {0};
    uint64_t get_ns = 0; /* every timed read, for the lookup's share */
    int ret = 1;
    if (!src || !pool || !names || !keys || !srcbufs || !results || !put_results || !put_gbps ||
        !direct_gbps || !grouped_gbps || layout_build(o, pool, &l) != 0) {
        fprintf(stderr, "kvstash bench client: out of memory for %llu bytes\n",
                (unsigned long long)total);
        goto out;
    }
    for (uint64_t b = 0; b < total; b++)
        src[b] = (char)(b * 2654435761u >> 13);
    for (uint32_t i = 0; i < o->keys; i++) {
        names[i] = malloc(64);
        if (names[i] == NULL)
            goto out;
        keys[i] = names[i];
        srcbufs[i] = (kvs_buf_t){src + (uint64_t)i * o->size, o->size};
    }
    uint64_t pool_len = (total + o->page) / o->page * o->page;
    if (kvs_client_register_buffer(c, src, total) != KVS_OK ||
        kvs_client_register_buffer(c, pool, pool_len) != KVS_OK) {
        fprintf(stderr, "kvstash bench client: %s\n", kvs_last_error());
        goto out;
    }
    char sz[32], pg[32];
    printf("%u keys x %s read into %s pages (%zu per key), %u repetitions\n", o->keys,
           kvs__format_size(o->size, sz, sizeof(sz)), kvs__format_size(o->page, pg, sizeof(pg)),
           l.nbufs[0], o->reps);
    fflush(stdout);
    kvs__progress_t prog;
    kvs__progress_start(&prog, "bench client: rounds", o->reps, false);
    kvs__progress_set(&prog, 0);
    for (uint32_t r = 0; r < o->reps; r++) {
        for (uint32_t i = 0; i < o->keys; i++)
            snprintf(names[i], 64, "bench-client-%d-%u-%u", (int)getpid(), r, i);
        uint64_t t0 = kvs__now_ns();
        int rc = kvs_client_batch_put_from(c, o->keys, keys, srcbufs, NULL, put_results);
        uint64_t t1 = kvs__now_ns();
        for (uint32_t i = 0; rc == KVS_OK && i < o->keys; i++)
            rc = put_results[i];
        if (rc != KVS_OK) {
            fprintf(stderr, "kvstash bench client: put failed: %s (%s)\n", kvs_status_str(rc),
                    kvs_last_error());
            goto out;
        }
        put_gbps[r] = gbps(total, t1 - t0);
        for (int grouped = 0; grouped <= 1; grouped++) {
            memset(pool, 0, pool_len);
            t0 = kvs__now_ns();
            rc = kvs_client_batch_get_into_multi_buffers(c, o->keys, keys, l.bufs, l.nbufs, grouped,
                                                         results);
            t1 = kvs__now_ns();
            get_ns += t1 - t0;
            if (rc != KVS_OK || verify(o, src, &l, results) != 0) {
                fprintf(stderr, "kvstash bench client: %s read failed: %s\n",
                        grouped ? "grouped" : "direct", kvs_last_error());
                goto out;
            }
            (grouped ? grouped_gbps : direct_gbps)[r] = gbps(total, t1 - t0);
        }
        for (uint32_t i = 0; i < o->keys; i++)
            kvs_client_remove(c, keys[i], true);
        kvs__progress_clear(&prog);
        printf("  round %u: put %.2f GB/s, get direct %.2f GB/s, get grouped %.2f GB/s\n", r + 1,
               put_gbps[r], direct_gbps[r], grouped_gbps[r]);
        fflush(stdout);
        kvs__progress_set(&prog, r + 1);
    }
    kvs__progress_end(&prog, true);
    qsort(put_gbps, o->reps, sizeof(double), cmp_double);
    qsort(direct_gbps, o->reps, sizeof(double), cmp_double);
    qsort(grouped_gbps, o->reps, sizeof(double), cmp_double);
    kvs_client_stats_t st;
    kvs_client_get_stats(c, &st);
    printf("median: put %.2f GB/s, get direct %.2f GB/s, get grouped %.2f GB/s; every byte "
           "checked\n",
           put_gbps[o->reps / 2], direct_gbps[o->reps / 2], grouped_gbps[o->reps / 2]);
    printf("client: %llu put calls (p50 <= %.0f us), %llu get calls (p50 <= %.0f us, p99 <= "
           "%.0f us), %llu failed keys\n",
           (unsigned long long)st.put_calls, kvs_histogram_quantile_us(&st.put_latency, 0.5),
           (unsigned long long)st.get_calls, kvs_histogram_quantile_us(&st.get_latency, 0.5),
           kvs_histogram_quantile_us(&st.get_latency, 0.99),
           (unsigned long long)(st.put_failed_keys + st.get_failed_keys));
    /* The master's answer is a serial step of every read: what it costs per key. */
    uint64_t gets = 2ull * o->reps;
    printf("lookup: %.1f us per read (%.0f ns per key), %.1f%% of the reads' time\n",
           (double)st.get_lookup_ns / 1e3 / (double)gets,
           (double)st.get_lookup_ns / (double)gets / o->keys,
           get_ns ? 100.0 * (double)st.get_lookup_ns / (double)get_ns : 0.0);
    ret = 0;
out:
    for (uint32_t i = 0; names && i < o->keys; i++)
        free(names[i]);
    free(names);
    free(keys);
    free(srcbufs);
    free(results);
    free(put_results);
    free(put_gbps);
    free(direct_gbps);
    free(grouped_gbps);
    free(l.frags);
    free(l.bufs);
    free(l.nbufs);
    /* Unregistered by kvs_client_close before the memory goes. */
    kvs_client_close(c);
    free(src);
    free(pool);
    return ret;
}

int kvs__bench_client_main(const char *master, int argc, char **argv)
{
    bench_opts_t o;
    int r = parse_opts(argc, argv, &o);
    if (r != 0)
        return r == 1 ? 0 : r;
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    if (master != NULL)
        cfg.master = master;
    kvs_client_t *c;
    if (kvs_client_open(&cfg, &c) != KVS_OK) {
        fprintf(stderr, "kvstash bench client: %s\n", kvs_last_error());
        return 1;
    }
    return run(c, &o);
}
