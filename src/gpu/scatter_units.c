/* The scatter's work units on the host (scatter_units.h). Both writers give the common
 * fragment, one unit long, no check of its own: 2^32 of them cannot carry the 64-bit offset past
 * 2^48, and the offsets are checked where they can grow large (longer fragments) and at the end
 * (or, when streaming, at each publication), which bounds everything before. */
#include "scatter_units.h"

#include "../common/common_int.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define UNIT  KVS_SCATTER_UNIT_BYTES
#define LIMIT (1ull << 48) /* source offsets travel in 48 bits */

static kvs__scatter_unit_t unit(uint64_t dst, uint64_t off, uint64_t len)
{
    return (kvs__scatter_unit_t){dst, off | ((len - 1) << 48)};
}

/* Stores a unit where a kernel reads it over PCIe. On x86 a non-temporal store: four of them fill
 * a line, which goes to memory without the cache first reading it for ownership (the line was
 * last read by the GPU). That wrote units 1.3-1.7x faster on the H200's host (docs/scatter.md,
 * step 11). Weakly ordered: store_fence() before a publication makes them visible first. */
static inline void put(kvs__scatter_unit_t *p, kvs__scatter_unit_t u)
{
#if defined(__SSE2__)
    _mm_stream_si128((__m128i *)p, _mm_set_epi64x((long long)u.off_len, (long long)u.dst));
#else
    *p = u;
#endif
}

static inline void store_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* Whether source offsets below `off` travel in 48 bits and keep src + offset in the address
 * space. */
static bool offsets_ok(const void *src, uint64_t off)
{
    return off < LIMIT && (uintptr_t)src <= UINTPTR_MAX - off;
}

int kvs__scatter_build_units(const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                             kvs__scatter_unit_t *out, size_t cap, size_t *nunits_p)
{
    uint64_t off = 0;
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = frags[i].len, dst = (uint64_t)(uintptr_t)frags[i].dst;
        if (len - 1 < UNIT && dst != 0) {
            if (k < cap)
                out[k] = unit(dst, off, len);
            k++;
            off += len;
            continue;
        }
        if (len > UINT64_MAX - off || off + len >= LIMIT)
            return KVS_INVALID_PARAMS;
        if (dst != 0) { /* split into units, written only when all fit (else only counted) */
            uint64_t units = (len + UNIT - 1) / UNIT;
            if (k > KVS_SCATTER_MAX_UNITS || units > KVS_SCATTER_MAX_UNITS - k)
                return KVS_INVALID_PARAMS;
            for (uint64_t o = 0; k + units <= cap && o < len; o += UNIT)
                out[k + o / UNIT] = unit(dst + o, off + o, len - o < UNIT ? len - o : UNIT);
            k += units;
        }
        off += len;
    }
    if (k > KVS_SCATTER_MAX_UNITS || !offsets_ok(src, off))
        return KVS_INVALID_PARAMS;
    *nunits_p = k;
    return KVS_OK;
}

int kvs__scatter_stream_units(const void *src, const kvs__scatter_frag_t *frags, uint32_t n,
                              kvs__scatter_unit_t *out, size_t cap, uint32_t *published,
                              kvs__scatter_streamed_t *r)
{
    if (((uintptr_t)out & 15) != 0) {
        *r = (kvs__scatter_streamed_t){0, 0, 0, 0};
        return KVS_INVALID_PARAMS;
    }
    if (cap > KVS_SCATTER_MAX_UNITS)
        cap = KVS_SCATTER_MAX_UNITS;
    uint64_t off = 0;
    size_t k = 0, valid = 0, next_pub = KVS_SCATTER_PUBLISH_UNITS;
    uint32_t i = 0;
    int rc = KVS_OK;
    while (i < n) {
        /* One-unit fragments up to the next publication or the buffer's end: each makes exactly
         * one unit, so these loops test nothing else. Four at a time with one test of their
         * lengths: 1.3-1.7x faster than one at a time (see docs/scatter.md). */
        size_t room = (next_pub < cap ? next_pub : cap) - k;
        uint32_t stop = (size_t)(n - i) <= room ? n : i + (uint32_t)room;
        for (; stop - i >= 4; i += 4) {
            const kvs__scatter_frag_t *f = frags + i;
            uint64_t l0 = f[0].len - 1, l1 = f[1].len - 1, l2 = f[2].len - 1, l3 = f[3].len - 1;
            uint64_t d0 = (uintptr_t)f[0].dst, d1 = (uintptr_t)f[1].dst, d2 = (uintptr_t)f[2].dst,
                     d3 = (uintptr_t)f[3].dst;
            if ((l0 | l1 | l2 | l3) >= UNIT || !(d0 && d1 && d2 && d3))
                break; /* one of them is not one unit long: the loop below finds it */
            put(out + k, unit(d0, off, l0 + 1));
            off += l0 + 1;
            put(out + k + 1, unit(d1, off, l1 + 1));
            off += l1 + 1;
            put(out + k + 2, unit(d2, off, l2 + 1));
            off += l2 + 1;
            put(out + k + 3, unit(d3, off, l3 + 1));
            off += l3 + 1;
            k += 4;
        }
        for (; i < stop; i++) {
            uint64_t len = frags[i].len, dst = (uint64_t)(uintptr_t)frags[i].dst;
            if (len - 1 >= UNIT || dst == 0)
                break;
            put(out + k++, unit(dst, off, len));
            off += len;
        }
        if (i < n && (i < stop || k == cap)) { /* not one unit long, or the buffer is full */
            uint64_t len = frags[i].len, dst = (uint64_t)(uintptr_t)frags[i].dst;
            if (len > UINT64_MAX - off || off + len >= LIMIT) {
                rc = KVS_INVALID_PARAMS;
                break;
            }
            if (dst != 0 && len != 0) {
                uint64_t units = (len + UNIT - 1) / UNIT;
                if (units > cap - k)
                    break; /* this fragment and the rest go to another launch */
                /* Whole units, then the last: no length test per unit (20% faster, step 11). */
                uint64_t o = 0;
                for (; o + UNIT < len; o += UNIT)
                    put(out + k++, unit(dst + o, off + o, UNIT));
                put(out + k++, unit(dst + o, off + o, len - o));
            }
            off += len;
            i++;
        }
        if (k >= next_pub) {
            if (!offsets_ok(src, off)) {
                rc = KVS_INVALID_PARAMS;
                break;
            }
            size_t lines = k & ~(size_t)7; /* whole 128-byte lines only */
            store_fence();
            __atomic_store_n(published, (uint32_t)lines, __ATOMIC_RELEASE);
            valid = lines;
            next_pub = lines + KVS_SCATTER_PUBLISH_UNITS;
        }
    }
    store_fence(); /* the caller publishes the final count next */
    if (rc == KVS_OK && !offsets_ok(src, off))
        rc = KVS_INVALID_PARAMS;
    *r = (kvs__scatter_streamed_t){i, off, k, rc == KVS_OK ? k : valid};
    return rc;
}
