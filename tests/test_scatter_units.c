/* The GPU scatter's host side (src/gpu/scatter_units.c), tested without a GPU: both unit writers
 * against a plain reference on random fragment lists, the streamed writer's publications, where
 * it stops when the buffer is full, and every kind of bad fragment. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "common/common_int.h"
#include "gpu/scatter_units.h"

#include <stdlib.h>
#include <string.h>

#define UNIT  KVS_SCATTER_UNIT_BYTES
#define SRC   ((const void *)(uintptr_t)0x7e0000000000ull)
#define GUARD 8 /* units */

/* The reference: one fragment at a time, every check spelled out. Writes up to `cap` units and
 * returns their total count in *count_p; INVALID_PARAMS as the library defines it. */
static int ref_units(const void *src, const kvs__scatter_frag_t *f, uint32_t n,
                     kvs__scatter_unit_t *out, size_t cap, size_t *count_p)
{
    uint64_t off = 0;
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (f[i].len > UINT64_MAX - off || off + f[i].len >= (1ull << 48))
            return KVS_INVALID_PARAMS;
        if (f[i].dst != NULL) {
            for (uint64_t o = 0; o < f[i].len; o += UNIT) {
                uint64_t l = KVS_MIN(f[i].len - o, (uint64_t)UNIT);
                if (k < cap)
                    out[k] = (kvs__scatter_unit_t){(uint64_t)(uintptr_t)f[i].dst + o,
                                                   (off + o) | ((l - 1) << 48)};
                k++;
            }
        }
        off += f[i].len;
    }
    if (k > KVS_SCATTER_MAX_UNITS || (uintptr_t)src > UINTPTR_MAX - off)
        return KVS_INVALID_PARAMS;
    *count_p = k;
    return KVS_OK;
}

static uint64_t frag_units(const kvs__scatter_frag_t *f)
{
    return f->dst == NULL ? 0 : (f->len + UNIT - 1) / UNIT;
}

/* A random fragment list of one of several kinds: pages, any one-unit length (64 KiB
 * included), multi-unit fragments among small ones, zero lengths and NULL destinations. */
static kvs__scatter_frag_t *random_frags(uint32_t n, unsigned kind)
{
    kvs__scatter_frag_t *f = calloc(n, sizeof(*f));
    CHECK(f != NULL);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t r = kvs_test_rand(), len;
        switch (kind % 4) {
        case 0:
            len = 4096;
            break;
        case 1:
            len = 1 + r % UNIT;
            break;
        case 2:
            len = r % 8 == 0 ? UNIT + 1 + (r >> 8) % (5 * UNIT) : 1 + (r >> 8) % 9000;
            break;
        default:
            len = r % 50 == 0 ? 0 : 1 + (r >> 8) % (UNIT + 5000);
            break;
        }
        bool null = kvs_test_rand() % (kind % 4 == 3 ? 5 : 40) == 0;
        f[i] = (kvs__scatter_frag_t){null ? NULL : (void *)(uintptr_t)(0x10000 + (r >> 20)), len};
    }
    return f;
}

static void test_build_matches_reference(void)
{
    for (unsigned t = 0; t < 400; t++) {
        uint32_t n = 1 + (uint32_t)(kvs_test_rand() % 5000);
        kvs__scatter_frag_t *f = random_frags(n, t);
        size_t want, got, counted, cap = (size_t)n * 6 + 8;
        kvs__scatter_unit_t *a = calloc(cap, sizeof(*a)), *b = calloc(cap, sizeof(*b));
        CHECK(a && b);
        CHECK_STATUS(ref_units(SRC, f, n, a, cap, &want), KVS_OK);
        CHECK_STATUS(kvs__scatter_build_units(SRC, f, n, b, cap, &got), KVS_OK);
        CHECK_EQ_INT(got, want);
        CHECK_EQ_MEM(b, a, want * sizeof(*a));
        CHECK_STATUS(kvs__scatter_build_units(SRC, f, n, NULL, 0, &counted), KVS_OK);
        CHECK_EQ_INT(counted, want);
        free(a);
        free(b);
        free(f);
    }
}

static void test_stream_matches_reference(void)
{
    for (unsigned t = 0; t < 400; t++) {
        uint32_t n = 1 + (uint32_t)(kvs_test_rand() % (t % 8 == 0 ? 40000 : 5000));
        kvs__scatter_frag_t *f = random_frags(n, t);
        size_t want, cap = (size_t)n * 6 + 8;
        kvs__scatter_unit_t *a = calloc(cap, sizeof(*a)), *b = calloc(cap, sizeof(*b));
        CHECK(a && b);
        CHECK_STATUS(ref_units(SRC, f, n, a, cap, &want), KVS_OK);
        uint32_t published = 12345; /* never a multiple of 8: a publication must replace it */
        kvs__scatter_streamed_t r;
        CHECK_STATUS(kvs__scatter_stream_units(SRC, f, n, b, cap, &published, &r), KVS_OK);
        CHECK_EQ_INT(r.frags, n);
        CHECK_EQ_INT(r.units, want);
        CHECK_EQ_INT(r.valid_units, want);
        CHECK_EQ_MEM(b, a, want * sizeof(*a));
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; i++)
            total += f[i].len;
        CHECK_EQ_INT(r.off, total);
        /* Publications: whole lines, never past what is written, and not far behind it (one
         * publication interval plus a line plus the largest fragment of these lists). */
        if (want >= KVS_SCATTER_PUBLISH_UNITS) {
            CHECK(published % 8 == 0);
            CHECK(published <= want);
            CHECK(want - published < KVS_SCATTER_PUBLISH_UNITS + 8 + 6);
        } else {
            CHECK_EQ_INT(published, 12345);
        }
        free(a);
        free(b);
        free(f);
    }
}

static void test_stream_stops_where_units_do_not_fit(void)
{
    for (unsigned t = 0; t < 300; t++) {
        uint32_t n = 100 + (uint32_t)(kvs_test_rand() % 4000);
        kvs__scatter_frag_t *f = random_frags(n, 2 + 4 * (t % 2)); /* multi-unit among small */
        size_t want;
        CHECK_STATUS(ref_units(SRC, f, n, NULL, 0, &want), KVS_OK);
        size_t cap = 1 + kvs_test_rand() % want;
        /* Guard units after the buffer: the writer's non-temporal stores are not seen by
         * AddressSanitizer, so this checks that it writes nothing past `cap`. */
        kvs__scatter_unit_t *a = calloc(want, sizeof(*a)), *b = calloc(cap + GUARD, sizeof(*b));
        CHECK(a && b);
        memset(b + cap, 0xa5, GUARD * sizeof(*b));
        CHECK_STATUS(ref_units(SRC, f, n, a, want, &want), KVS_OK);
        uint32_t published = 0;
        kvs__scatter_streamed_t r;
        CHECK_STATUS(kvs__scatter_stream_units(SRC, f, n, b, cap, &published, &r), KVS_OK);
        CHECK(r.units <= cap);
        CHECK_EQ_INT(r.valid_units, r.units);
        /* Exactly the units of the fragments before r.frags, and that fragment did not fit. */
        size_t before;
        uint64_t off = 0;
        CHECK_STATUS(ref_units(SRC, f, r.frags, NULL, 0, &before), KVS_OK);
        for (uint32_t i = 0; i < r.frags; i++)
            off += f[i].len;
        CHECK_EQ_INT(r.units, before);
        CHECK_EQ_INT(r.off, off);
        CHECK_EQ_MEM(b, a, r.units * sizeof(*a));
        for (size_t g = 0; g < GUARD * sizeof(*b); g++)
            CHECK_EQ_INT(((const unsigned char *)(b + cap))[g], 0xa5);
        if (r.frags < n)
            CHECK(frag_units(&f[r.frags]) > cap - r.units);
        else
            CHECK_EQ_INT(r.units, want);
        free(a);
        free(b);
        free(f);
    }
}

static void test_bad_fragments(void)
{
    enum { N = 3000 };
    kvs__scatter_frag_t *f = random_frags(N, 0);
    kvs__scatter_unit_t *out = calloc(4 * N, sizeof(*out));
    CHECK(out != NULL);
    size_t count;
    uint32_t published;
    kvs__scatter_streamed_t r;
    /* A length that wraps the offset, at the start, in the middle and at the end. */
    const uint32_t at[] = {0, 1700, N - 1};
    for (size_t j = 0; j < KVS_ARRAY_SIZE(at); j++) {
        uint64_t keep = f[at[j]].len;
        f[at[j]].len = UINT64_MAX - 8;
        CHECK_STATUS(kvs__scatter_build_units(SRC, f, N, out, 4 * N, &count), KVS_INVALID_PARAMS);
        published = 0;
        CHECK_STATUS(kvs__scatter_stream_units(SRC, f, N, out, 4 * N, &published, &r),
                     KVS_INVALID_PARAMS);
        /* What may be copied is what was published: whole lines, all before the bad fragment. */
        CHECK_EQ_INT(r.valid_units, published);
        CHECK(published % 8 == 0 && published <= at[j]);
        CHECK_EQ_INT(r.frags, at[j]);
        f[at[j]].len = keep;
    }
    /* Skipped source ranges (NULL destinations) that carry the offsets to 2^48. */
    f[10] = (kvs__scatter_frag_t){NULL, 1ull << 47};
    f[2000] = (kvs__scatter_frag_t){NULL, 1ull << 47};
    CHECK_STATUS(kvs__scatter_build_units(SRC, f, N, out, 4 * N, &count), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__scatter_stream_units(SRC, f, N, out, 4 * N, &published, &r),
                 KVS_INVALID_PARAMS);
    f[2000].len = (1ull << 47) - (uint64_t)N * 4096; /* just below 2^48 in all: fine */
    CHECK_STATUS(kvs__scatter_build_units(SRC, f, N, NULL, 0, &count), KVS_OK);
    CHECK_STATUS(kvs__scatter_stream_units(SRC, f, N, out, 4 * N, &published, &r), KVS_OK);
    CHECK_EQ_INT(r.units, count);
    /* A source so high that src + offset would wrap around the address space. */
    const void *high = (const void *)(UINTPTR_MAX - 4096);
    CHECK_STATUS(kvs__scatter_build_units(high, f, N, out, 4 * N, &count), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__scatter_stream_units(high, f, N, out, 4 * N, &published, &r),
                 KVS_INVALID_PARAMS);
    /* More units than one launch carries (counted only: 2^31 units, 2^47 bytes). */
    kvs__scatter_frag_t huge = {(void *)(uintptr_t)0x10000, 1ull << 47};
    CHECK_STATUS(kvs__scatter_build_units(SRC, &huge, 1, NULL, 0, &count), KVS_INVALID_PARAMS);
    huge.len = (uint64_t)KVS_SCATTER_MAX_UNITS * UNIT;
    CHECK_STATUS(kvs__scatter_build_units(SRC, &huge, 1, NULL, 0, &count), KVS_OK);
    CHECK_EQ_INT(count, KVS_SCATTER_MAX_UNITS);
    free(out);
    free(f);
}

static void test_unit_encoding(void)
{
    /* Exactly 64 KiB is one unit; 64 KiB + 1 is two; empty fragments make none; a NULL
     * destination skips its bytes of the source. */
    kvs__scatter_frag_t f[] = {
        {(void *)(uintptr_t)0x1000, UNIT}, {(void *)(uintptr_t)0x900000, UNIT + 1},
        {(void *)(uintptr_t)0x5000, 0},    {NULL, 100},
        {(void *)(uintptr_t)0x7003, 1},
    };
    kvs__scatter_unit_t u[8];
    size_t count;
    CHECK_STATUS(kvs__scatter_build_units(SRC, f, 5, u, 8, &count), KVS_OK);
    CHECK_EQ_INT(count, 4);
    const kvs__scatter_unit_t want[] = {
        {0x1000, 0 | ((uint64_t)(UNIT - 1) << 48)},
        {0x900000, (uint64_t)UNIT | ((uint64_t)(UNIT - 1) << 48)},
        {0x900000 + UNIT, (uint64_t)2 * UNIT},
        {0x7003, (uint64_t)2 * UNIT + 1 + 100},
    };
    CHECK_EQ_MEM(u, want, sizeof(want));
    uint32_t published = 0;
    kvs__scatter_streamed_t r;
    memset(u, 0, sizeof(u));
    CHECK_STATUS(kvs__scatter_stream_units(SRC, f, 5, u, 8, &published, &r), KVS_OK);
    CHECK_EQ_INT(r.units, 4);
    CHECK_EQ_MEM(u, want, sizeof(want));
    /* The streamed writer's stores need 16-byte alignment: a misaligned buffer is refused
     * before anything is written. */
    memset(u, 0, sizeof(u));
    published = 7;
    kvs__scatter_unit_t *odd = (kvs__scatter_unit_t *)(void *)((char *)u + 8);
    CHECK_STATUS(kvs__scatter_stream_units(SRC, f, 5, odd, 6, &published, &r), KVS_INVALID_PARAMS);
    CHECK_EQ_INT(r.units, 0);
    CHECK_EQ_INT(r.valid_units, 0);
    CHECK_EQ_INT(published, 7);
    const kvs__scatter_unit_t zero[8] = {{0, 0}};
    CHECK_EQ_MEM(u, zero, sizeof(zero));
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_unit_encoding),
        KVS_TEST_CASE(test_build_matches_reference),
        KVS_TEST_CASE(test_stream_matches_reference),
        KVS_TEST_CASE(test_stream_stops_where_units_do_not_fit),
        KVS_TEST_CASE(test_bad_fragments),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
