/* `kvstash bench allocator`: replays allocations and frees of log-uniform sizes against the
 * master's segment allocator and reports the utilisation at which allocations fail and the
 * time each allocation and free takes.
 *
 * Workload, in two phases over one operation budget:
 *  1. Mixed fill: each operation allocates (probability 0.6) or frees a random live object,
 *     so frees fragment the space all the way up; it ends at the first failed allocation,
 *     whose utilisation (requested bytes live / capacity) is the headline figure.
 *  2. Cache under pressure, as the store runs at its watermark: allocate; on failure record
 *     the utilisation, free one random live object and try again. It also samples the
 *     utilisation after each successful allocation (the figure Mooncake's benchmark reports). */
#define _GNU_SOURCE
#include "master/allocator_int.h"
#include "tools/cli_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t handle;
    uint64_t size;
} live_t;

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double uniform01(void)
{
    return (double)(next_rand() >> 11) / 9007199254740992.0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct_u32(uint32_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u32);
    return v[(size_t)(p * (double)(n - 1))];
}

/* Frees a random live object, timing the call into *t_ns_p. Returns the bytes it held. */
static uint64_t free_random(kvs__seg_alloc_t *alloc, live_t *live, size_t *nlive_p,
                            uint32_t *t_ns_p)
{
    size_t k = (size_t)(next_rand() % *nlive_p);
    uint64_t f0 = kvs__now_ns();
    kvs__seg_alloc_free(alloc, live[k].handle);
    *t_ns_p = (uint32_t)KVS_MIN(kvs__now_ns() - f0, UINT32_MAX);
    uint64_t size = live[k].size;
    live[k] = live[--*nlive_p];
    return size;
}

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: kvstash bench allocator [--capacity SIZE] [--ops N] [--min SIZE]\n"
               "                               [--max SIZE] [--seed N]\n"
               "defaults: --capacity 4GiB --ops 1000000 --min 4KiB --max 16MiB --seed 1\n");
}

int kvs__bench_allocator_main(int argc, char **argv)
{
    uint64_t capacity = 4ull << 30, ops = 1000000, min_sz = 4096, max_sz = 16u << 20, seed = 1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_usage(stdout);
            return 0;
        } else if (v == NULL) {
            bad = 1;
        } else if (!strcmp(a, "--capacity")) {
            bad = kvs__parse_size(v, &capacity) != KVS_OK;
        } else if (!strcmp(a, "--ops")) {
            bad = kvs__parse_u64(v, 1000000000ull, &ops) != KVS_OK;
        } else if (!strcmp(a, "--min")) {
            bad = kvs__parse_size(v, &min_sz) != KVS_OK;
        } else if (!strcmp(a, "--max")) {
            bad = kvs__parse_size(v, &max_sz) != KVS_OK;
        } else if (!strcmp(a, "--seed")) {
            bad = kvs__parse_u64(v, UINT64_MAX, &seed) != KVS_OK;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "kvstash bench allocator: bad option '%s %s'\n", a, v ? v : "");
            bench_usage(stderr);
            return 2;
        }
    }
    if (min_sz == 0 || min_sz > max_sz || max_sz > capacity || ops == 0) {
        fprintf(stderr, "kvstash bench allocator: need 0 < min <= max <= capacity, ops > 0\n");
        return 2;
    }
    rng = seed * 0x9e3779b97f4a7c15ull | 1;

    kvs__seg_alloc_t *alloc;
    if (kvs__seg_alloc_create(capacity, &alloc) != KVS_OK) {
        fprintf(stderr, "cannot create allocator\n");
        return 1;
    }
    size_t live_cap = (size_t)(capacity / min_sz) + 1;
    live_t *live = malloc(live_cap * sizeof(*live));
    uint32_t *t_alloc = malloc(ops * sizeof(*t_alloc));
    uint32_t *t_free = malloc(ops * sizeof(*t_free));
    size_t max_fail = ops;
    double *fail_util = malloc(max_fail * sizeof(*fail_util));
    if (!live || !t_alloc || !t_free || !fail_util) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    size_t nlive = 0, nalloc = 0, nfree = 0, nfail = 0;
    uint64_t live_bytes = 0, done = 0;
    double lmin = log((double)min_sz), lspan = log((double)max_sz) - lmin;
    uint64_t t_begin = kvs__now_ns();
    int check_rc = KVS_OK;

    printf("allocator replay: capacity %llu B, %llu ops, sizes log-uniform %llu..%llu B, "
           "one random object freed per failed allocation, seed %llu\n",
           (unsigned long long)capacity, (unsigned long long)ops, (unsigned long long)min_sz,
           (unsigned long long)max_sz, (unsigned long long)seed);
    uint64_t size = 0;
    double *ok_util = malloc(ops * sizeof(*ok_util));
    size_t nok = 0;
    bool mixed = true;
    if (ok_util == NULL)
        return 1;
    while (done < ops) {
        if (mixed && nlive > 0 && uniform01() < 0.4) {
            live_bytes -= free_random(alloc, live, &nlive, &t_free[nfree++]);
            done++;
            continue;
        }
        if (size == 0) {
            size = (uint64_t)exp(lmin + lspan * uniform01());
            size = KVS_MAX(KVS_MIN(size, max_sz), min_sz);
        }
        uint64_t off;
        uint32_t h;
        uint64_t t0 = kvs__now_ns();
        int rc = kvs__seg_alloc_alloc(alloc, size, &off, &h);
        uint64_t t1 = kvs__now_ns();
        t_alloc[nalloc++] = (uint32_t)KVS_MIN(t1 - t0, UINT32_MAX);
        done++;
        if (rc == KVS_OK) {
            live[nlive++] = (live_t){h, size};
            live_bytes += size;
            size = 0;
            if (!mixed)
                ok_util[nok++] = (double)live_bytes / (double)capacity;
            continue;
        }
        if (rc != KVS_NO_AVAILABLE_HANDLE) {
            fprintf(stderr, "allocation error: %s\n", kvs_status_str(rc));
            return 1;
        }
        double util = (double)live_bytes / (double)capacity;
        if (nfail < max_fail)
            fail_util[nfail++] = util;
        if (nfail == 1)
            printf("first failure after %zu allocations and %zu frees: utilisation %.2f%% "
                   "(request of %llu B, largest hole %llu B)\n",
                   nalloc, nfree, util * 100, (unsigned long long)size,
                   (unsigned long long)kvs__seg_alloc_largest_free(alloc));
        mixed = false;
        if (nfail % 64 == 1)
            check_rc |= kvs__seg_alloc_check(alloc);
        if (nlive > 0 && done < ops) {
            live_bytes -= free_random(alloc, live, &nlive, &t_free[nfree++]);
            done++;
        }
    }
    double secs = (double)(kvs__now_ns() - t_begin) / 1e9;
    check_rc |= kvs__seg_alloc_check(alloc);
    double first = nfail ? fail_util[0] : 0;
    qsort(fail_util, nfail, sizeof(*fail_util), cmp_double);
    double a50 = pct_u32(t_alloc, nalloc, 0.5), a99 = pct_u32(t_alloc, nalloc, 0.99);
    double f50 = pct_u32(t_free, nfree, 0.5), f99 = pct_u32(t_free, nfree, 0.99);
    printf("\n| metric | value |\n|---|---|\n");
    printf("| operations (allocations + frees) | %zu + %zu |\n", nalloc, nfree);
    printf("| allocation failures | %zu |\n", nfail);
    printf("| utilisation at first failure (mixed fill) | %.2f%% |\n", first * 100);
    if (nfail) {
        printf("| utilisation at failure under pressure: min / 1st pct / 10th pct / median | "
               "%.2f%% / %.2f%% / %.2f%% / %.2f%% |\n",
               fail_util[0] * 100, fail_util[(size_t)(0.01 * (double)(nfail - 1))] * 100,
               fail_util[(size_t)(0.10 * (double)(nfail - 1))] * 100, fail_util[nfail / 2] * 100);
    }
    qsort(ok_util, nok, sizeof(*ok_util), cmp_double);
    if (nok)
        printf("| utilisation after each allocation under pressure: 1st pct / median | "
               "%.2f%% / %.2f%% |\n",
               ok_util[(size_t)(0.01 * (double)(nok - 1))] * 100, ok_util[nok / 2] * 100);
    printf("| allocation time: median / p99 | %.0f ns / %.0f ns |\n", a50, a99);
    printf("| free time: median / p99 | %.0f ns / %.0f ns |\n", f50, f99);
    printf("| median allocation + median free | %.0f ns |\n", a50 + f50);
    printf("| wall time | %.2f s |\n", secs);
    printf("| allocator invariants | %s |\n", check_rc == KVS_OK ? "ok" : "BROKEN");
    printf("(per-call times include one clock read, about 20 ns)\n");
    kvs__seg_alloc_destroy(alloc);
    free(live);
    free(t_alloc);
    free(t_free);
    free(fail_util);
    free(ok_util);
    return check_rc == KVS_OK ? 0 : 1;
}
