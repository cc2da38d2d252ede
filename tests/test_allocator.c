/* Segment allocator: alignment, no overlap, coalescing, exact fits, bad handles, invariants
 * under a random workload, and bookkeeping allocation failures. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "master/allocator_int.h"

#include <stdlib.h>

static void test_basic(void)
{
    kvs__seg_alloc_t *a;
    CHECK_STATUS(kvs__seg_alloc_create(10, &a), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_create(1 << 20, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_create((1 << 20) + 50, &a), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_capacity(a), 1 << 20); /* rounded down to the alignment */
    uint64_t off1, off2;
    uint32_t h1, h2;
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 0, &off1, &h1), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, (1 << 20) + 1, &off1, &h1), KVS_NO_AVAILABLE_HANDLE);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 1, &off1, &h1), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 100, &off2, &h2), KVS_OK);
    CHECK_EQ_U64(off1 % KVS_SEG_ALLOC_ALIGN, 0);
    CHECK_EQ_U64(off2 % KVS_SEG_ALLOC_ALIGN, 0);
    CHECK(off1 + 64 <= off2 || off2 + 128 <= off1);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 64 + 128);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_free(a, h1), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_free(a, h1), KVS_INVALID_PARAMS); /* double free refused */
    CHECK_STATUS(kvs__seg_alloc_free(a, 12345), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_free(a, h2), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 0);
    CHECK_EQ_U64(kvs__seg_alloc_largest_free(a), 1 << 20); /* fully coalesced */
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    kvs__seg_alloc_destroy(a);
    kvs__seg_alloc_destroy(NULL);
}

static void test_exact_fill(void)
{
    kvs__seg_alloc_t *a;
    CHECK_STATUS(kvs__seg_alloc_create(1 << 20, &a), KVS_OK);
    uint64_t off;
    uint32_t h[16];
    for (int i = 0; i < 16; i++) {
        CHECK_STATUS(kvs__seg_alloc_alloc(a, 64 << 10, &off, &h[i]), KVS_OK);
        CHECK_EQ_U64(off, (uint64_t)i * (64 << 10));
    }
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 1, &off, &h[0] + 0), KVS_NO_AVAILABLE_HANDLE);
    /* Free every other block, then the holes are 64 KiB each: 128 KiB cannot fit. */
    for (int i = 0; i < 16; i += 2)
        CHECK_STATUS(kvs__seg_alloc_free(a, h[i]), KVS_OK);
    uint32_t x;
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 128 << 10, &off, &x), KVS_NO_AVAILABLE_HANDLE);
    /* Freeing a neighbour merges three blocks into one 192 KiB hole. */
    CHECK_STATUS(kvs__seg_alloc_free(a, h[1]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 192 << 10, &off, &x), KVS_OK);
    CHECK_EQ_U64(off, 0);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    kvs__seg_alloc_destroy(a);

    /* A whole-capacity allocation fits exactly. */
    CHECK_STATUS(kvs__seg_alloc_create(12345 * 64, &a), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 12345 * 64, &off, &x), KVS_OK);
    CHECK_EQ_U64(off, 0);
    kvs__seg_alloc_destroy(a);
}

/* A hole that the rounded-up bin search skips must still be found by the fallback scan. */
static void test_fallback_finds_snug_hole(void)
{
    kvs__seg_alloc_t *a;
    uint64_t cap = 1000 * 64;
    CHECK_STATUS(kvs__seg_alloc_create(cap, &a), KVS_OK);
    uint64_t off;
    uint32_t h1, h2, h3;
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 100, &off, &h1), KVS_OK); /* 2 units */
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 530 * 64, &off, &h2), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 468 * 64, &off, &h3), KVS_OK); /* fills the rest */
    CHECK_STATUS(kvs__seg_alloc_free(a, h2), KVS_OK);                   /* one hole of 530 units */
    uint32_t x;
    /* 529 units rounds up to the next bin (which is empty); only the scan finds 530. */
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 529 * 64, &off, &x), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    kvs__seg_alloc_destroy(a);
}

typedef struct {
    uint64_t off, size;
    uint32_t h;
} blk_t;

static int cmp_off(const void *x, const void *y)
{
    const blk_t *a = x, *b = y;
    return (a->off > b->off) - (a->off < b->off);
}

static void test_random_workload_invariants(void)
{
    kvs__seg_alloc_t *a;
    uint64_t cap = 256ull << 20;
    CHECK_STATUS(kvs__seg_alloc_create(cap, &a), KVS_OK);
    enum { MAXB = 20000 };
    blk_t *b = malloc(MAXB * sizeof(*b));
    blk_t *sorted = malloc(MAXB * sizeof(*sorted));
    size_t n = 0;
    for (int step = 0; step < 200000; step++) {
        if (n < MAXB && (kvs_test_rand() % 100 < 55 || n == 0)) {
            uint64_t size = 1 + kvs_test_rand() % (kvs_test_rand() % 4 == 0 ? 4 << 20 : 64 << 10);
            uint64_t off;
            uint32_t h;
            int rc = kvs__seg_alloc_alloc(a, size, &off, &h);
            if (rc == KVS_OK) {
                CHECK_CMP_U64(off + size, <=, cap);
                b[n++] = (blk_t){off, size, h};
            } else {
                CHECK_STATUS(rc, KVS_NO_AVAILABLE_HANDLE);
            }
        } else {
            size_t k = kvs_test_rand() % n;
            CHECK_STATUS(kvs__seg_alloc_free(a, b[k].h), KVS_OK);
            b[k] = b[--n];
        }
        if (step % 5000 == 0) {
            CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
            memcpy(sorted, b, n * sizeof(*b));
            qsort(sorted, n, sizeof(*sorted), cmp_off);
            for (size_t i = 1; i < n; i++)
                CHECK_CMP_U64(sorted[i - 1].off + sorted[i - 1].size, <=, sorted[i].off);
        }
    }
    while (n > 0)
        CHECK_STATUS(kvs__seg_alloc_free(a, b[--n].h), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 0);
    CHECK_EQ_U64(kvs__seg_alloc_largest_free(a), cap);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    kvs__seg_alloc_destroy(a);
    free(b);
    free(sorted);
}

static void test_bookkeeping_alloc_failure(void)
{
    kvs__seg_alloc_t *a;
    CHECK_STATUS(kvs__seg_alloc_create(64 << 20, &a), KVS_OK);
    uint64_t off;
    uint32_t h;
    /* Fill the node table's first 64 entries, then make growing it fail. */
    int ok = 0;
    for (;;) {
        kvs__alloc_inject_failure(0, true);
        int rc = kvs__seg_alloc_alloc(a, 4096, &off, &h);
        kvs__alloc_inject_failure(-1, false);
        if (rc == KVS_NO_MEMORY)
            break;
        CHECK_STATUS(rc, KVS_OK);
        CHECK(++ok < 1000);
    }
    uint64_t used = kvs__seg_alloc_used(a);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 4096, &off, &h), KVS_OK); /* works again */
    CHECK_EQ_U64(kvs__seg_alloc_used(a), used + 4096);
    kvs__seg_alloc_destroy(a);
}

/* A new leader claims the exact ranges owners re-register: in any order, never overlapping,
 * and the claimed space frees and coalesces like any allocation. */
static void test_claim_exact_ranges(void)
{
    kvs__seg_alloc_t *a;
    CHECK_STATUS(kvs__seg_alloc_create(1 << 20, &a), KVS_OK);
    uint32_t h[8];
    CHECK_STATUS(kvs__seg_alloc_claim(a, 4096, 1000, &h[0]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 8192, 64, &h[1]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 0, 64, &h[2]), KVS_OK); /* before the others */
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 1024 + 64 + 64);
    /* Taken, partly taken, outside, unaligned, empty: refused and nothing changes. */
    CHECK_STATUS(kvs__seg_alloc_claim(a, 4096, 64, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 4096 - 64, 128, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 4096 + 960, 64, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, (1 << 20) - 64, 65, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 1 << 20, 64, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 100, 64, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_claim(a, 65536, 0, &h[3]), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 1024 + 64 + 64);
    /* The last unit of the segment can be claimed. */
    CHECK_STATUS(kvs__seg_alloc_claim(a, (1 << 20) - 64, 64, &h[3]), KVS_OK);
    /* Allocation works around claims; frees coalesce back to one block. */
    uint64_t off;
    CHECK_STATUS(kvs__seg_alloc_alloc(a, 2000, &off, &h[4]), KVS_OK);
    static const uint64_t taken[4][2] = {
        {0, 64}, {4096, 5120}, {8192, 8256}, {(1 << 20) - 64, 1 << 20}};
    for (int i = 0; i < 4; i++)
        CHECK(off + 2000 <= taken[i][0] || off >= taken[i][1]);
    for (int i = 0; i < 5; i++)
        CHECK_STATUS(kvs__seg_alloc_free(a, h[i]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 0);
    CHECK_EQ_U64(kvs__seg_alloc_largest_free(a), 1 << 20);
    /* Many ascending claims (a segment's whole index), then a full free. */
    uint32_t *hs = kvs__calloc(4096, sizeof(*hs));
    CHECK(hs != NULL);
    for (uint32_t i = 0; i < 4096; i++)
        CHECK_STATUS(kvs__seg_alloc_claim(a, (uint64_t)i * 256, 200, &hs[i]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    for (uint32_t i = 0; i < 4096; i++)
        CHECK_STATUS(kvs__seg_alloc_free(a, hs[i]), KVS_OK);
    CHECK_STATUS(kvs__seg_alloc_check(a), KVS_OK);
    CHECK_EQ_U64(kvs__seg_alloc_used(a), 0);
    kvs__free(hs);
    kvs__seg_alloc_destroy(a);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_basic),
        KVS_TEST_CASE(test_exact_fill),
        KVS_TEST_CASE(test_fallback_finds_snug_hole),
        KVS_TEST_CASE(test_random_workload_invariants),
        KVS_TEST_CASE(test_bookkeeping_alloc_failure),
        KVS_TEST_CASE(test_claim_exact_ranges),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
