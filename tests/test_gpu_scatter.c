/* GPU: the scatter kernel against random fragment sets (reordered, unaligned, odd sizes, 1 byte
 * to 12 MiB). Every destination byte is checked, and so are guard bytes around every fragment.
 * A streamed kernel whose host never publishes is aborted, or stops at its wait bound, and the
 * stream recovers. Without a GPU the program reports a skip (exit 77). */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "gpu_probe.h"
#include "common/common_int.h"
#include "gpu/scatter.h"
#include "gpu/scatter_pages.h"

#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GUARD_BYTE 0xEE

#define CHECK_CUDA(call) CHECK_EQ_INT((call), cudaSuccess)

typedef struct {
    uint64_t pool_off; /* where the fragment lies in the destination pool */
    uint64_t len;
} place_t;

/* Builds `n` fragments with lengths from `len_fn`, places them in shuffled order in a pool with
 * random gaps (guard bytes) and random misalignment, runs one scatter and checks everything. */
static void run_case_skipping(kvs__scatter_t *s, uint32_t n, uint64_t (*len_fn)(void),
                              unsigned src_mis, cudaStream_t stream, unsigned skip_every)
{
    place_t *pl = calloc(n, sizeof(*pl));
    uint32_t *order = calloc(n, sizeof(*order));
    CHECK(pl && order);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        pl[i].len = len_fn();
        total += pl[i].len;
        order[i] = i;
    }
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(kvs_test_rand() % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    uint64_t pos = 1 + kvs_test_rand() % 64;
    for (uint32_t k = 0; k < n; k++) {
        pl[order[k]].pool_off = pos;
        pos += pl[order[k]].len + 1 + kvs_test_rand() % 40;
    }
    uint64_t pool_len = pos + 64;
    uint8_t *h_src = malloc(total + 16), *h_pool = malloc(pool_len);
    CHECK(h_src && h_pool);
    for (uint64_t b = 0; b < total; b++)
        h_src[b] = (uint8_t)(kvs_test_rand() >> 24);
    char *d_src = NULL, *d_pool = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_src, total + 16));
    CHECK_CUDA(cudaMalloc((void **)&d_pool, pool_len));
    CHECK_CUDA(cudaMemcpy(d_src + src_mis, h_src, total, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_pool, GUARD_BYTE, pool_len));
    kvs__scatter_frag_t *frags = calloc(n, sizeof(*frags));
    CHECK(frags);
    /* Every skip_every-th fragment has no destination: its source bytes are passed over. */
    for (uint32_t i = 0; i < n; i++) {
        bool skip = skip_every && i % skip_every == skip_every - 1;
        frags[i] = (kvs__scatter_frag_t){skip ? NULL : d_pool + pl[i].pool_off, pl[i].len};
    }
    CHECK_STATUS(kvs__scatter_launch(s, d_src + src_mis, frags, n, stream), KVS_OK);
    /* The caller may reuse its descriptor array at once. */
    memset(frags, 0, n * sizeof(*frags));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(h_pool, d_pool, pool_len, cudaMemcpyDeviceToHost));
    /* Fragment bytes equal the source slice; everything else is still guard. */
    uint8_t *mark = calloc(pool_len, 1);
    CHECK(mark);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!(skip_every && i % skip_every == skip_every - 1)) {
            CHECK_EQ_MEM(h_pool + pl[i].pool_off, h_src + off, pl[i].len);
            memset(mark + pl[i].pool_off, 1, pl[i].len);
        }
        off += pl[i].len;
    }
    for (uint64_t b = 0; b < pool_len; b++) {
        if (!mark[b] && h_pool[b] != GUARD_BYTE)
            kvs_test_fail(__FILE__, __LINE__, "guard byte %llu of %llu overwritten (0x%02x)",
                          (unsigned long long)b, (unsigned long long)pool_len, h_pool[b]);
    }
    free(mark);
    free(frags);
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_pool));
    free(h_src);
    free(h_pool);
    free(pl);
    free(order);
}

static void run_case(kvs__scatter_t *s, uint32_t n, uint64_t (*len_fn)(void), unsigned src_mis,
                     cudaStream_t stream)
{
    run_case_skipping(s, n, len_fn, src_mis, stream, 0);
}

static uint64_t len_small_odd(void)
{
    return 1 + kvs_test_rand() % 9000;
}

static uint64_t len_tiny(void)
{
    return 1 + kvs_test_rand() % 17;
}

static uint64_t len_pages(void)
{
    static const uint64_t sizes[] = {4096, 8192, 16384, 65536};
    return sizes[kvs_test_rand() % 4];
}

static uint64_t len_wide(void)
{
    /* 1 byte to 12 MiB, log-uniform. */
    unsigned bits = (unsigned)(kvs_test_rand() % 24);
    uint64_t len = (1ull << bits) + kvs_test_rand() % (1ull << bits);
    return KVS_MIN(len, 12ull << 20);
}

static uint64_t len_some_multi_unit(void)
{
    /* One in 20 takes 2-4 units, the rest 1 byte to 9000. */
    uint64_t r = kvs_test_rand();
    return r % 20 == 0 ? KVS_SCATTER_UNIT_BYTES + 1 + (r >> 8) % (3 * KVS_SCATTER_UNIT_BYTES)
                       : 1 + (r >> 8) % 9000;
}

static uint64_t len_12mib(void)
{
    return 12ull << 20;
}

static kvs__scatter_t *make_pages(uint32_t max_blocks, bool persistent)
{
    kvs__scatter_config_t cfg = {
        .device = 0, .max_blocks = max_blocks, .persistent_pages = persistent};
    kvs__scatter_t *s = NULL;
    CHECK_STATUS(kvs__scatter_create(&cfg, &s), KVS_OK);
    return s;
}

static kvs__scatter_t *make(uint32_t max_blocks)
{
    return make_pages(max_blocks, false);
}

/* The page kernels a test runs: a warp per unit and persistent warps on the full grid, then
 * persistent warps on a bounded one. */
typedef struct {
    uint32_t blocks;
    bool persistent;
} pages_run_t;
static const pages_run_t kPagesRuns[] = {{0, false}, {0, true}, {8, false}};
enum { NPAGES_RUNS = sizeof(kPagesRuns) / sizeof(kPagesRuns[0]) };

static void test_inline_descriptors(void)
{
    kvs__scatter_t *s = make(0);
    /* <= 64 units and <= KVS_SCATTER_INLINE_UNITS (2000) travel as kernel parameters. */
    for (unsigned mis = 0; mis < 16; mis += 5) {
        run_case(s, 1, len_tiny, mis, NULL);
        run_case(s, 40, len_small_odd, mis, NULL);
        run_case(s, 900, len_small_odd, mis, NULL);
        run_case(s, 64, len_tiny, mis, NULL);
    }
    kvs__scatter_destroy(s);
}

static uint64_t len_1mib(void)
{
    return 1u << 20;
}

static void test_mapped_descriptors_and_reuse(void)
{
    kvs__scatter_t *s = make(0);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    /* Above the inline limit: read by the kernel from the two pinned buffers, which calls in a
     * row take in turn, grow and reuse (two streams, so a buffer's last reader may still be
     * queued). Chunks of 1, 2 and 8 units per warp, the last one partial. */
    for (int r = 0; r < 4; r++) {
        run_case(s, 3000, len_pages, (unsigned)r * 3, r % 2 ? st : NULL);
        run_case(s, 20000, len_small_odd, 7, st);
    }
    run_case(s, 70001, len_tiny, 2, NULL);
    /* Few fragments, many units (1 MiB each is 16). */
    run_case(s, 200, len_1mib, 5, st);
    CHECK_CUDA(cudaStreamDestroy(st));
    kvs__scatter_destroy(s);
}

static unsigned two_unit_left;

/* Two units (just over 64 KiB) while two_unit_left lasts, then 1..17 bytes. */
static uint64_t len_two_units_then_tiny(void)
{
    if (two_unit_left == 0)
        return len_tiny();
    two_unit_left--;
    return KVS_SCATTER_UNIT_BYTES + 1 + kvs_test_rand() % 4096;
}

static void test_streamed_units_that_outgrow_the_buffer(void)
{
    /* Above the inline limit the kernel starts before the units are written, its buffer sized
     * to the fragment count on a fresh context (2,001 rounded up to 3,072 units). 1,200
     * fragments of two units overflow it: the fragments that do not fit go to a second launch,
     * and the next call's buffer is sized for the units the first one made. */
    kvs__scatter_t *s = make(0);
    for (int r = 0; r < 2; r++) {
        two_unit_left = 1200;
        run_case(s, KVS_SCATTER_INLINE_UNITS + 1, len_two_units_then_tiny, 4u * (unsigned)r, NULL);
    }
    kvs__scatter_destroy(s);
}

static void test_bad_fragment_while_streaming(void)
{
    /* A bad fragment found after the kernel started: INVALID_PARAMS, the kernel ends (the
     * stream drains), nothing from the bad fragment on is written, and the context still works. */
    enum { N = 5000, BAD = 4700, LEN = 4096 };
    kvs__scatter_t *s = make(0);
    char *d_src = NULL, *d_dst = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_src, (size_t)N * LEN));
    CHECK_CUDA(cudaMalloc((void **)&d_dst, (size_t)N * LEN));
    CHECK_CUDA(cudaMemset(d_src, 0x5A, (size_t)N * LEN));
    CHECK_CUDA(cudaMemset(d_dst, GUARD_BYTE, (size_t)N * LEN));
    kvs__scatter_frag_t *frags = calloc(N, sizeof(*frags));
    CHECK(frags);
    for (uint32_t i = 0; i < N; i++)
        frags[i] = (kvs__scatter_frag_t){d_dst + (size_t)i * LEN, LEN};
    frags[BAD].len = UINT64_MAX - 8;
    CHECK_STATUS(kvs__scatter_launch(s, d_src, frags, N, NULL), KVS_INVALID_PARAMS);
    CHECK_CUDA(cudaDeviceSynchronize());
    size_t rest = (size_t)(N - BAD) * LEN;
    uint8_t *h = malloc(rest), *want = malloc(rest);
    CHECK(h && want);
    memset(want, GUARD_BYTE, rest);
    CHECK_CUDA(cudaMemcpy(h, d_dst + (size_t)BAD * LEN, rest, cudaMemcpyDeviceToHost));
    CHECK_EQ_MEM(h, want, rest);
    frags[BAD].len = LEN;
    CHECK_STATUS(kvs__scatter_launch(s, d_src, frags, N, NULL), KVS_OK);
    CHECK_CUDA(cudaDeviceSynchronize());
    memset(want, 0x5A, rest);
    CHECK_CUDA(cudaMemcpy(h, d_dst + (size_t)BAD * LEN, rest, cudaMemcpyDeviceToHost));
    CHECK_EQ_MEM(h, want, rest);
    free(h);
    free(want);
    free(frags);
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_dst));
    kvs__scatter_destroy(s);
}

/* ---- a streamed kernel whose host never publishes: abort, time bound, recovery ------------- */

enum { HN = 6000, HLEN = 4096 }; /* 6,000 one-unit fragments: the streamed kernel */

typedef struct {
    char *src, *dst; /* device: HN * HLEN each; dst starts as guard */
    kvs__scatter_frag_t frags[HN];
    uint8_t *h;
} held_t;

static void held_init(held_t *x)
{
    CHECK_CUDA(cudaMalloc((void **)&x->src, (size_t)HN * HLEN));
    CHECK_CUDA(cudaMalloc((void **)&x->dst, (size_t)HN * HLEN));
    x->h = malloc((size_t)HN * HLEN);
    CHECK(x->h != NULL);
    for (size_t b = 0; b < (size_t)HN * HLEN; b++)
        x->h[b] = (uint8_t)(b * 131 + b / 4096);
    CHECK_CUDA(cudaMemcpy(x->src, x->h, (size_t)HN * HLEN, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(x->dst, GUARD_BYTE, (size_t)HN * HLEN));
    /* Reversed destinations, so that "not beyond what was published" is about units, not
     * addresses. */
    for (uint32_t i = 0; i < HN; i++)
        x->frags[i] = (kvs__scatter_frag_t){x->dst + (size_t)(HN - 1 - i) * HLEN, HLEN};
}

static void held_free(held_t *x)
{
    CHECK_CUDA(cudaFree(x->src));
    CHECK_CUDA(cudaFree(x->dst));
    free(x->h);
}

/* Fragments [0, copied) hold their source bytes, fragments [copied, HN) are still guard. */
static void held_check(const held_t *x, uint32_t copied)
{
    uint8_t *d = malloc((size_t)HN * HLEN), *guard = malloc(HLEN);
    CHECK(d != NULL && guard != NULL);
    memset(guard, GUARD_BYTE, HLEN);
    CHECK_CUDA(cudaMemcpy(d, x->dst, (size_t)HN * HLEN, cudaMemcpyDeviceToHost));
    for (uint32_t i = 0; i < HN; i++) {
        const uint8_t *got = d + (size_t)(HN - 1 - i) * HLEN;
        if (i < copied)
            CHECK_EQ_MEM(got, x->h + (size_t)i * HLEN, HLEN);
        else if (memcmp(got, guard, HLEN) != 0)
            kvs_test_fail(__FILE__, __LINE__, "fragment %u of %u written, only %u published", i,
                          (unsigned)HN, copied);
    }
    free(d);
    free(guard);
}

/* Waits for the stream at most `ms`: false when it is still busy then. */
static bool stream_done_within(cudaStream_t st, unsigned ms)
{
    uint64_t until = kvs__now_ns() + (uint64_t)ms * 1000000;
    for (;;) {
        cudaError_t e = cudaStreamQuery(st);
        if (e == cudaSuccess)
            return true;
        CHECK_EQ_INT(e, cudaErrorNotReady);
        if (kvs__now_ns() > until)
            return false;
        usleep(100);
    }
}

/* The stream and context still work: a streamed and an inline scatter on them are exact, and the
 * streamed one reports COMPLETE. */
static void check_recovered(kvs__scatter_t *s, cudaStream_t st, held_t *x)
{
    CHECK_CUDA(cudaMemset(x->dst, GUARD_BYTE, (size_t)HN * HLEN));
    kvs__scatter_ticket_t t;
    CHECK_STATUS(kvs__scatter_launch_opts(s, x->src, x->frags, HN, st, NULL, &t), KVS_OK);
    CHECK_EQ_INT(t.n, 1);
    CHECK(stream_done_within(st, 5000));
    CHECK_EQ_INT(kvs__scatter_result(s, &t), KVS_SCATTER_COMPLETE);
    held_check(x, HN);
    run_case(s, 3000, len_pages, 3, st);
    run_case(s, 300, len_small_odd, 1, st);
}

static void test_streamed_kernel_aborted_without_publication(void)
{
    /* The host writes every unit but publishes only the first 1,000 and never the final count:
     * the kernel copies those and waits. Without the abort it would wait forever (here: its
     * 60 s bound); aborted, it stops at once, reports ABORTED, has written nothing past what was
     * published, and the stream runs the next scatters correctly. */
    enum { PUBLISHED = 1000 };
    kvs__scatter_t *s = make(0);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    held_t *x = calloc(1, sizeof(*x));
    CHECK(x != NULL);
    held_init(x);
    kvs__scatter_opts_t o = {
        .wait_ns = 60000000000ull, .test_hold = true, .test_publish_units = PUBLISHED};
    kvs__scatter_ticket_t t;
    CHECK_STATUS(kvs__scatter_launch_opts(s, x->src, x->frags, HN, st, &o, &t), KVS_OK);
    CHECK_EQ_INT(t.n, 1);
    CHECK(!stream_done_within(st, 50)); /* it waits for units that never come */
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs__scatter_abort(s, &t), KVS_OK);
    bool done = stream_done_within(st, 2000);
    uint64_t us = (kvs__now_ns() - t0) / 1000;
    printf("  aborted: the stream drained %llu us after the abort\n", (unsigned long long)us);
    CHECK(done);
    CHECK_CUDA(cudaGetLastError());
    CHECK_EQ_INT(kvs__scatter_result(s, &t), KVS_SCATTER_ABORTED);
    held_check(x, PUBLISHED);
    /* A stale abort (of the launch that already ended) leaves later launches alone: the next two
     * take both slots, the second the aborted one's. */
    check_recovered(s, st, x);
    CHECK_STATUS(kvs__scatter_abort(s, &t), KVS_OK);
    check_recovered(s, st, x);
    held_free(x);
    free(x);
    CHECK_CUDA(cudaStreamDestroy(st));
    kvs__scatter_destroy(s);
}

static void test_streamed_kernel_stops_at_its_wait_bound(void)
{
    /* Nobody aborts: the kernel stops by itself once a warp has waited past its bound (device
     * time), reports TIMED_OUT, and the stream recovers. First an explicit 50 ms bound with
     * nothing published, then the bound derived from a deadline 200 ms away, 512 units
     * published. */
    kvs__scatter_t *s = make(0);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    held_t *x = calloc(1, sizeof(*x));
    CHECK(x != NULL);
    held_init(x);
    struct {
        uint64_t wait_ms, deadline_ms;
        uint32_t published;
    } cases[2] = {{50, 0, 0}, {0, 200, 512}};
    for (int k = 0; k < 2; k++) {
        CHECK_CUDA(cudaMemset(x->dst, GUARD_BYTE, (size_t)HN * HLEN));
        uint64_t t0 = kvs__now_ns();
        kvs__scatter_opts_t o = {.deadline_ns =
                                     cases[k].deadline_ms ? t0 + cases[k].deadline_ms * 1000000 : 0,
                                 .wait_ns = cases[k].wait_ms * 1000000,
                                 .test_hold = true,
                                 .test_publish_units = cases[k].published};
        kvs__scatter_ticket_t t;
        CHECK_STATUS(kvs__scatter_launch_opts(s, x->src, x->frags, HN, st, &o, &t), KVS_OK);
        bool done = stream_done_within(st, 5000);
        uint64_t ms = (kvs__now_ns() - t0) / 1000000;
        uint64_t bound = cases[k].wait_ms + cases[k].deadline_ms;
        printf("  bound %llu ms: the kernel stopped by itself after %llu ms\n",
               (unsigned long long)bound, (unsigned long long)ms);
        CHECK(done);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CMP_U64(ms, >=, bound * 9 / 10);
        CHECK_EQ_INT(kvs__scatter_result(s, &t), KVS_SCATTER_TIMED_OUT);
        held_check(x, cases[k].published);
        check_recovered(s, st, x);
    }
    held_free(x);
    free(x);
    CHECK_CUDA(cudaStreamDestroy(st));
    kvs__scatter_destroy(s);
}

static void test_random_sets_1_byte_to_12_mib(void)
{
    kvs__scatter_t *s = make(0);
    for (int r = 0; r < 12; r++)
        run_case(s, 1 + (uint32_t)(kvs_test_rand() % 40), len_wide, (unsigned)(r % 16), NULL);
    run_case(s, 3, len_12mib, 3, NULL);
    kvs__scatter_destroy(s);
}

static void test_bounded_blocks(void)
{
    /* One block or a handful must still copy everything. */
    kvs__scatter_t *one = make(1), *few = make(7);
    run_case(one, 500, len_small_odd, 1, NULL);
    run_case(few, 5000, len_pages, 0, NULL);
    run_case(few, 4, len_12mib, 9, NULL);
    kvs__scatter_destroy(one);
    kvs__scatter_destroy(few);
}

static void test_skipped_source_ranges(void)
{
    /* Fragments without a destination (staging padding, failed keys) leave their bytes out. */
    kvs__scatter_t *s = make(0);
    run_case_skipping(s, 30, len_small_odd, 0, NULL, 3);
    run_case_skipping(s, 1000, len_pages, 5, NULL, 2);
    run_case_skipping(s, 4000, len_small_odd, 1, NULL, 7);
    /* Streamed (above the inline limit), every other fragment skipped, and skips among
     * multi-unit fragments. */
    run_case_skipping(s, 9000, len_pages, 3, NULL, 2);
    run_case_skipping(s, 3000, len_some_multi_unit, 6, NULL, 5);
    kvs__scatter_destroy(s);
}

static void test_bad_arguments(void)
{
    kvs__scatter_t *s = make(0);
    char *d = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d, 4096));
    kvs__scatter_frag_t f[2] = {{d, 100}, {NULL, 5}};
    CHECK_STATUS(kvs__scatter_launch(NULL, d, f, 1, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__scatter_launch(s, NULL, f, 1, NULL), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__scatter_launch(s, d, NULL, 1, NULL), KVS_INVALID_PARAMS);
    /* Source offsets that would wrap around the address space. */
    kvs__scatter_frag_t wrap = {d, UINT64_MAX - 8};
    CHECK_STATUS(kvs__scatter_launch(s, d + 2048, &wrap, 1, NULL), KVS_INVALID_PARAMS);
    f[1] = (kvs__scatter_frag_t){NULL, 0}; /* empty fragments are skipped */
    CHECK_STATUS(kvs__scatter_launch(s, d + 2048, f, 2, NULL), KVS_OK);
    CHECK_STATUS(kvs__scatter_launch(s, d, f, 0, NULL), KVS_OK);
    kvs__scatter_config_t bad = {.device = 4096};
    kvs__scatter_t *none = NULL;
    CHECK_STATUS(kvs__scatter_create(&bad, &none), KVS_UNSUPPORTED);
    bad.device = -1;
    CHECK_STATUS(kvs__scatter_create(&bad, &none), KVS_INVALID_PARAMS);
    CHECK(none == NULL);
    kvs__scatter_ticket_t t = {0, {0, 0}, {0, 0}};
    CHECK_STATUS(kvs__scatter_abort(NULL, &t), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__scatter_abort(s, NULL), KVS_INVALID_PARAMS);
    CHECK_EQ_INT(kvs__scatter_result(NULL, &t), KVS_SCATTER_UNKNOWN);
    CHECK_EQ_INT(kvs__scatter_result(s, &t), KVS_SCATTER_COMPLETE); /* no streamed kernel */
    t.n = 3;
    CHECK_STATUS(kvs__scatter_abort(s, &t), KVS_INVALID_PARAMS);
    CHECK_EQ_INT(kvs__scatter_result(s, &t), KVS_SCATTER_UNKNOWN);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(d));
    kvs__scatter_destroy(s);
    kvs__scatter_destroy(NULL);
}

/* A plan of `keys` twice: for the device layout L, uploaded (dev, in d_plan), and for its host
 * mirror HL (host, in hblob), the reference the kernel's result is compared with. */
typedef struct {
    kvs__pt_plan_t dev, host;
    char *d_plan;
    void *hblob;
} plans_t;

static void plans_make(const kvs__page_layout_t *L, const kvs__page_layout_t *HL,
                       const kvs__pt_pages_t *keys, uint32_t n, const uint64_t *off, plans_t *p)
{
    uint32_t nslices;
    uint64_t row;
    CHECK_STATUS(kvs__pt_slices(L, &nslices, &row), KVS_OK);
    size_t bytes = kvs__pt_plan_bytes(L, nslices, keys, sizeof(*keys), n);
    void *blob = malloc(bytes);
    p->hblob = malloc(bytes);
    CHECK(blob && p->hblob);
    CHECK_CUDA(cudaMalloc((void **)&p->d_plan, bytes));
    CHECK_STATUS(kvs__pt_plan_build(L, nslices, row, keys, sizeof(*keys), n, off, blob,
                                    (uintptr_t)p->d_plan, &p->dev),
                 KVS_OK);
    CHECK_STATUS(kvs__pt_plan_build(HL, nslices, row, keys, sizeof(*keys), n, off, p->hblob,
                                    (uintptr_t)p->hblob, &p->host),
                 KVS_OK);
    CHECK_CUDA(cudaMemcpy(p->d_plan, blob, bytes, cudaMemcpyHostToDevice));
    free(blob);
}

static void plans_free(plans_t *p)
{
    CHECK_CUDA(cudaFree(p->d_plan));
    free(p->hblob);
}

/* The page-table kernel against the host backend's copy of the same plan (the mapping both run
 * is shared, so this checks the kernel's chunking, shuffles and copies): K/V halves interleaved
 * at one stride, an 80 KiB + 5 region (two slices) at an odd base; keys of 1..9 pages at odd
 * source offsets; both orders, launches of sub-ranges of keys, every page kernel. A second pass
 * aligns the K/V pages (4 KiB), the keys' sources and the large region's length to 16 bytes (the
 * copy loop's aligned path), beside the large region's misaligned base. Every byte of the device
 * pool equals the host pool, guard bytes included. */
static void test_page_table_kernel(void)
{
    enum { P = 64, NK = 12 };
    size_t pool_len = P * 8192 + P * (96u << 10) + 64;
    uint8_t *h_pool = malloc(pool_len), *h_ref = malloc(pool_len), *h_dev = malloc(pool_len);
    CHECK(h_pool && h_ref && h_dev);
    char *d_pool = NULL, *d_src = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d_pool, pool_len));
    for (int pass = 0; pass < 4 * NPAGES_RUNS; pass++) {
        int order = KVS_PAGE_MAJOR + pass % 2, aligned = pass / 2 % 2;
        const pages_run_t *run = &kPagesRuns[pass / 4];
        {
            kvs__scatter_t *s = make_pages(run->blocks, run->persistent);
            const size_t kv = aligned ? 4096 : 3000, big = (80u << 10) + (aligned ? 16 : 5);
            memset(h_ref, GUARD_BYTE, pool_len);
            CHECK_CUDA(cudaMemset(d_pool, GUARD_BYTE, pool_len));
            kvs_page_region_t rg[3] = {{d_pool, kv, 8192, P},
                                       {d_pool + 4096, kv, 8192, P},
                                       {d_pool + P * 8192 + 3, big, 96u << 10, P - 1}};
            kvs_page_region_t hrg[3];
            for (int r = 0; r < 3; r++)
                hrg[r] = (kvs_page_region_t){h_ref + ((char *)rg[r].base - d_pool),
                                             rg[r].page_bytes, rg[r].stride, rg[r].npages};
            kvs__page_layout_t L = {rg, 3, (kvs_page_order_t)order, P - 1};
            kvs__page_layout_t HL = {hrg, 3, (kvs_page_order_t)order, P - 1};
            uint32_t nslices;
            uint64_t row;
            CHECK_STATUS(kvs__pt_slices(&L, &nslices, &row), KVS_OK);
            CHECK_EQ_U64(nslices, 4);
            /* Distinct page ids for every key, shuffled. */
            uint32_t perm[P - 1], used = 0;
            for (uint32_t i = 0; i < P - 1; i++)
                perm[i] = i;
            for (uint32_t i = P - 1; i > 1; i--) {
                uint32_t j = (uint32_t)(kvs_test_rand() % i), t = perm[i - 1];
                perm[i - 1] = perm[j];
                perm[j] = t;
            }
            kvs__pt_pages_t keys[NK];
            uint64_t off[NK], pos = 0;
            for (int k = 0; k < NK; k++) {
                uint64_t np = 1 + kvs_test_rand() % 5;
                keys[k] = (kvs__pt_pages_t){perm + used, np};
                used += (uint32_t)np;
                off[k] = aligned ? KVS_ALIGN_UP(pos, 16)
                                 : pos + kvs_test_rand() % 7; /* odd source offsets */
                pos = off[k] + np * row;
            }
            CHECK(used <= P - 1);
            uint8_t *h_src = malloc(pos);
            CHECK(h_src != NULL);
            for (uint64_t b = 0; b < pos; b++)
                h_src[b] = (uint8_t)(kvs_test_rand() >> 24);
            CHECK_CUDA(cudaMalloc((void **)&d_src, pos));
            CHECK_CUDA(cudaMemcpy(d_src, h_src, pos, cudaMemcpyHostToDevice));
            plans_t pl;
            plans_make(&L, &HL, keys, NK, off, &pl);
            /* Keys [0, 5) and [6, 12) (key 5 skipped, as a failed receive would be). */
            const uint32_t runs[2][2] = {{0, 5}, {6, NK}};
            for (int r = 0; r < 2; r++) {
                uint32_t a = runs[r][0], b = runs[r][1];
                CHECK_STATUS(kvs__scatter_pages_launch(s, d_src, &pl.dev, a, b,
                                                       pl.host.keys[a].unit_start,
                                                       pl.host.keys[b].unit_start, NULL),
                             KVS_OK);
                kvs__pt_copy_host(h_src, &pl.host, a, b);
            }
            CHECK_CUDA(cudaDeviceSynchronize());
            CHECK_CUDA(cudaMemcpy(h_dev, d_pool, pool_len, cudaMemcpyDeviceToHost));
            CHECK_EQ_MEM(h_dev, h_ref, pool_len);
            /* Bad arguments are refused: an empty or reversed key range, no plan. */
            CHECK_STATUS(kvs__scatter_pages_launch(s, d_src, &pl.dev, 3, 3, 0, 1, NULL),
                         KVS_INVALID_PARAMS);
            CHECK_STATUS(kvs__scatter_pages_launch(s, d_src, &pl.dev, 0, NK + 1, 0, 1, NULL),
                         KVS_INVALID_PARAMS);
            CHECK_STATUS(kvs__scatter_pages_launch(s, d_src, NULL, 0, 1, 0, 1, NULL),
                         KVS_INVALID_PARAMS);
            plans_free(&pl);
            CHECK_CUDA(cudaFree(d_src));
            free(h_src);
            kvs__scatter_destroy(s);
        }
    }
    CHECK_CUDA(cudaFree(d_pool));
    free(h_pool);
    free(h_ref);
    free(h_dev);
}

/* Many small pages (16,384 units of 512 bytes, region-major over two regions): on a bounded grid
 * of 8 blocks every warp takes 32-unit chunks, so the chunk mapping and its shuffles run; the
 * full grid runs each page kernel. Compared byte for
 * byte with the host copy of the plan. */
static void test_page_table_kernel_many_small_pages(void)
{
    enum { P = 8192, NK = 16, PER = 512 };
    size_t pool_len = 2 * (size_t)P * 512;
    uint8_t *h_ref = malloc(pool_len), *h_dev = malloc(pool_len);
    char *d_pool = NULL, *d_src = NULL;
    CHECK(h_ref && h_dev);
    CHECK_CUDA(cudaMalloc((void **)&d_pool, pool_len));
    uint32_t *ids = malloc(NK * PER * sizeof(*ids));
    CHECK(ids != NULL);
    for (uint32_t i = 0; i < NK * PER; i++)
        ids[i] = i;
    for (uint32_t i = NK * PER; i > 1; i--) {
        uint32_t j = (uint32_t)(kvs_test_rand() % i), t = ids[i - 1];
        ids[i - 1] = ids[j];
        ids[j] = t;
    }
    const size_t src_len = (size_t)NK * PER * 1024;
    uint8_t *h_src = malloc(src_len);
    CHECK(h_src != NULL);
    for (size_t b = 0; b < src_len; b++)
        h_src[b] = (uint8_t)(kvs_test_rand() >> 24);
    CHECK_CUDA(cudaMalloc((void **)&d_src, src_len));
    CHECK_CUDA(cudaMemcpy(d_src, h_src, src_len, cudaMemcpyHostToDevice));
    for (int run = 0; run < NPAGES_RUNS; run++) {
        kvs__scatter_t *s = make_pages(kPagesRuns[run].blocks, kPagesRuns[run].persistent);
        memset(h_ref, GUARD_BYTE, pool_len);
        CHECK_CUDA(cudaMemset(d_pool, GUARD_BYTE, pool_len));
        kvs_page_region_t rg[2] = {{d_pool, 512, 512, P}, {d_pool + (size_t)P * 512, 512, 512, P}};
        kvs_page_region_t hrg[2] = {{h_ref, 512, 512, P}, {h_ref + (size_t)P * 512, 512, 512, P}};
        kvs__page_layout_t L = {rg, 2, KVS_REGION_MAJOR, P - 1};
        kvs__page_layout_t HL = {hrg, 2, KVS_REGION_MAJOR, P - 1};
        uint32_t nslices;
        uint64_t row, off[NK];
        CHECK_STATUS(kvs__pt_slices(&L, &nslices, &row), KVS_OK);
        kvs__pt_pages_t keys[NK];
        for (int k = 0; k < NK; k++) {
            keys[k] = (kvs__pt_pages_t){ids + k * PER, PER};
            off[k] = (uint64_t)k * PER * row;
        }
        plans_t pl;
        plans_make(&L, &HL, keys, NK, off, &pl);
        CHECK_STATUS(kvs__scatter_pages_launch(s, d_src, &pl.dev, 0, NK, 0,
                                               pl.host.keys[NK].unit_start, NULL),
                     KVS_OK);
        kvs__pt_copy_host(h_src, &pl.host, 0, NK);
        CHECK_EQ_U64(pl.host.keys[NK].unit_start, (uint64_t)NK * PER * 2);
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(h_dev, d_pool, pool_len, cudaMemcpyDeviceToHost));
        CHECK_EQ_MEM(h_dev, h_ref, pool_len);
        plans_free(&pl);
        kvs__scatter_destroy(s);
    }
    CHECK_CUDA(cudaFree(d_src));
    CHECK_CUDA(cudaFree(d_pool));
    free(h_src);
    free(ids);
    free(h_ref);
    free(h_dev);
}

int main(int argc, char **argv)
{
    if (!have_gpu()) {
        printf("SKIP: no CUDA device\n");
        return KVS_TEST_SKIP;
    }
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_inline_descriptors),
        KVS_TEST_CASE(test_mapped_descriptors_and_reuse),
        KVS_TEST_CASE(test_streamed_units_that_outgrow_the_buffer),
        KVS_TEST_CASE(test_bad_fragment_while_streaming),
        KVS_TEST_CASE(test_streamed_kernel_aborted_without_publication),
        KVS_TEST_CASE(test_streamed_kernel_stops_at_its_wait_bound),
        KVS_TEST_CASE(test_random_sets_1_byte_to_12_mib),
        KVS_TEST_CASE(test_bounded_blocks),
        KVS_TEST_CASE(test_skipped_source_ranges),
        KVS_TEST_CASE(test_bad_arguments),
        KVS_TEST_CASE(test_page_table_kernel),
        KVS_TEST_CASE(test_page_table_kernel_many_small_pages),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
