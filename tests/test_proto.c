/* Wire format: generated round trips of every record of the schema (random valid instances at
 * every version this build speaks), truncation, trailing bytes, newer peers' fields, forged
 * counts, encoder limits, frame headers, version negotiation and the frame limits the schema
 * implies. The same file is built against the KVS_PROTO_NEXT library (test_proto_next), where
 * the test fields of the next version are on the wire. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "proto/proto_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a schema of every field kind, run through the same generators ------------------------ */

#define KVS_FIELDS_t_elem(X, R)                                                                    \
    X(R, U16, tag, 2, 0, 0)                                                                        \
    X(R, STR, label, 2, 7, 0)

#define KVS_FIELDS_t_all(X, R)                                                                     \
    X(R, U8, u8, 2, 0, 0)                                                                          \
    X(R, U16, u16, 2, 0, 0)                                                                        \
    X(R, U32, u32, 2, 0, 0)                                                                        \
    X(R, U64, u64, 2, 0, 0)                                                                        \
    X(R, I32, i32, 2, 0, 0)                                                                        \
    X(R, I64, i64, 2, 0, 0)                                                                        \
    X(R, STR, str, 2, 9, 0)                                                                        \
    X(R, BLOB, blob, 2, 32, 0)                                                                     \
    X(R, STRS, strs, 2, 5, 6)                                                                      \
    X(R, I32S, ints, 2, 0, 7)                                                                      \
    X(R, ARR, elems, 2, t_elem, 3)

/* t_all as a peer one version newer would send it: one more field at the end. */
#define KVS_FIELDS_t_newer(X, R)                                                                   \
    KVS_FIELDS_t_all(X, R) X(R, U64, added, KVS_PROTO_VERSION_MAX + 1, 0, 0)

#define TEST_RECORDS(REC) REC(t_elem) REC(t_all) REC(t_newer)
TEST_RECORDS(KVS_GEN_DECLARE)
TEST_RECORDS(KVS_GEN_DEFINE)

static const kvs__rec_desc_t *const test_records[] = {&kvs__t_elem_desc, &kvs__t_all_desc};

/* ---- random valid instances and equality, from the descriptors ----------------------------- */

static uint32_t rnd(uint32_t bound)
{
    return bound ? (uint32_t)(kvs_test_rand() % bound) : 0;
}

/* Counts and lengths: mostly small, sometimes the limit itself (capped at len_cap for speed). */
static uint32_t len_cap = 300;

static uint32_t rnd_len(uint32_t max)
{
    uint32_t cap = KVS_MIN(max, len_cap);
    return rnd(8) == 0 ? cap : rnd(KVS_MIN(cap, 12u) + 1);
}

static char *rnd_bytes(kvs__arena_t *a, uint32_t n)
{
    char *p = kvs__arena_alloc(a, n);
    CHECK(p != NULL);
    for (uint32_t i = 0; i < n; i++)
        p[i] = (char)rnd(256);
    return p;
}

static void rnd_record(const kvs__rec_desc_t *d, void *m, unsigned v, kvs__arena_t *a);

static void rnd_field(const kvs__field_desc_t *f, char *m, unsigned v, kvs__arena_t *a)
{
    char *p = m + f->offset;
    if (f->since > v)
        return; /* not in this version: stays zero */
    uint64_t x = kvs_test_rand();
    uint32_t n;
    switch (f->kind) {
    case KVS__KIND_U8:
        *(uint8_t *)p = (uint8_t)x;
        break;
    case KVS__KIND_U16:
        *(uint16_t *)p = (uint16_t)x;
        break;
    case KVS__KIND_U32:
        *(uint32_t *)p = (uint32_t)x;
        break;
    case KVS__KIND_U64:
        *(uint64_t *)p = x;
        break;
    case KVS__KIND_I32:
        *(int32_t *)p = (int32_t)(uint32_t)x;
        break;
    case KVS__KIND_I64:
        *(int64_t *)p = (int64_t)x;
        break;
    case KVS__KIND_STR:
        n = rnd_len(f->max_len);
        *(kvs__str_t *)p = (kvs__str_t){rnd_bytes(a, n), n};
        break;
    case KVS__KIND_BLOB:
        n = rnd_len(f->max_len);
        *(kvs__blob_t *)p = (kvs__blob_t){(const uint8_t *)rnd_bytes(a, n), n};
        break;
    case KVS__KIND_STRS: {
        n = rnd_len(f->max_count);
        kvs__str_t *s = kvs__arena_alloc(a, (size_t)n * sizeof(*s));
        for (uint32_t i = 0; i < n; i++) {
            uint32_t l = rnd_len(f->max_len);
            s[i] = (kvs__str_t){rnd_bytes(a, l), l};
        }
        memcpy(m + f->count_offset, &n, sizeof(n));
        *(kvs__str_t **)p = s;
        break;
    }
    case KVS__KIND_I32S:
        n = rnd_len(f->max_count);
        memcpy(m + f->count_offset, &n, sizeof(n));
        *(int32_t **)p = (int32_t *)rnd_bytes(a, n * 4);
        break;
    case KVS__KIND_ARR: {
        n = rnd_len(f->max_count);
        char *e = kvs__arena_alloc(a, (size_t)n * f->elem->size);
        for (uint32_t i = 0; i < n; i++)
            rnd_record(f->elem, e + (size_t)i * f->elem->size, v, a);
        memcpy(m + f->count_offset, &n, sizeof(n));
        *(char **)p = e;
        break;
    }
    }
}

static void rnd_record(const kvs__rec_desc_t *d, void *m, unsigned v, kvs__arena_t *a)
{
    memset(m, 0, d->size);
    for (uint32_t i = 0; i < d->nfields; i++)
        rnd_field(&d->fields[i], m, v, a);
}

static bool bytes_eq(const void *a, uint32_t al, const void *b, uint32_t bl)
{
    return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

/* Field-by-field equality; on a difference, `why` names the field. */
static bool record_eq(const kvs__rec_desc_t *d, const void *x, const void *y, const char **why)
{
    for (uint32_t i = 0; i < d->nfields; i++) {
        const kvs__field_desc_t *f = &d->fields[i];
        const char *p = (const char *)x + f->offset, *q = (const char *)y + f->offset;
        uint32_t nx = 0, ny = 0;
        bool ok = true;
        if (f->kind == KVS__KIND_STRS || f->kind == KVS__KIND_I32S || f->kind == KVS__KIND_ARR) {
            memcpy(&nx, (const char *)x + f->count_offset, 4);
            memcpy(&ny, (const char *)y + f->count_offset, 4);
            ok = nx == ny;
        }
        switch (f->kind) {
        case KVS__KIND_U8:
            ok = *(const uint8_t *)p == *(const uint8_t *)q;
            break;
        case KVS__KIND_U16:
            ok = *(const uint16_t *)p == *(const uint16_t *)q;
            break;
        case KVS__KIND_U32:
        case KVS__KIND_I32:
            ok = *(const uint32_t *)p == *(const uint32_t *)q;
            break;
        case KVS__KIND_U64:
        case KVS__KIND_I64:
            ok = *(const uint64_t *)p == *(const uint64_t *)q;
            break;
        case KVS__KIND_STR: {
            const kvs__str_t *s = (const void *)p, *t = (const void *)q;
            ok = bytes_eq(s->ptr, s->len, t->ptr, t->len);
            break;
        }
        case KVS__KIND_BLOB: {
            const kvs__blob_t *s = (const void *)p, *t = (const void *)q;
            ok = bytes_eq(s->ptr, s->len, t->ptr, t->len);
            break;
        }
        case KVS__KIND_STRS: {
            const kvs__str_t *s = *(kvs__str_t *const *)p, *t = *(kvs__str_t *const *)q;
            for (uint32_t j = 0; ok && j < nx; j++)
                ok = bytes_eq(s[j].ptr, s[j].len, t[j].ptr, t[j].len);
            break;
        }
        case KVS__KIND_I32S:
            ok = ok && bytes_eq(*(void *const *)p, nx * 4, *(void *const *)q, ny * 4);
            break;
        case KVS__KIND_ARR: {
            const char *s = *(const char *const *)p, *t = *(const char *const *)q;
            for (uint32_t j = 0; ok && j < nx; j++)
                ok = record_eq(f->elem, s + (size_t)j * f->elem->size,
                               t + (size_t)j * f->elem->size, why);
            break;
        }
        }
        if (!ok) {
            if (*why == NULL)
                *why = f->name;
            return false;
        }
    }
    return true;
}

static void each_record(void (*fn)(const kvs__rec_desc_t *d))
{
    for (size_t i = 0; i < kvs__records_count; i++)
        fn(kvs__records[i]);
    for (size_t i = 0; i < KVS_ARRAY_SIZE(test_records); i++)
        fn(test_records[i]);
}

/* ---- generated tests ------------------------------------------------------------------------ */

/* Random instance at version v, encoded at v, decoded at v, must be equal and re-encode to the
 * same bytes (encodings are canonical). */
static void roundtrip_record(const kvs__rec_desc_t *d)
{
    for (unsigned v = KVS_PROTO_VERSION_MIN; v <= KVS_PROTO_VERSION_MAX; v++) {
        for (int iter = 0; iter < 100; iter++) {
            kvs__arena_t a;
            kvs__arena_init(&a);
            void *m = kvs__arena_alloc(&a, d->size), *back = kvs__arena_alloc(&a, d->size);
            rnd_record(d, m, v, &a);
            kvs__wbuf_t w, w2;
            kvs__wbuf_init(&w);
            kvs__wbuf_init(&w2);
            w.version = w2.version = (uint16_t)v;
            d->encode(&w, m);
            CHECK(!w.failed && !w.invalid);
            int rc = d->decode(w.data, w.len, v, &a, back);
            if (rc != KVS_OK)
                kvs_test_fail(__FILE__, __LINE__, "%s v%u: %zu bytes do not decode: %s", d->name, v,
                              w.len, kvs_status_name(rc));
            const char *why = NULL;
            if (!record_eq(d, m, back, &why))
                kvs_test_fail(__FILE__, __LINE__, "%s v%u: field %s differs after a round trip",
                              d->name, v, why);
            d->encode(&w2, back);
            CHECK_EQ_U64(w2.len, w.len);
            CHECK_EQ_MEM(w2.data, w.data, w.len);
            kvs__wbuf_free(&w);
            kvs__wbuf_free(&w2);
            kvs__arena_free(&a);
        }
    }
}

static void test_roundtrip_every_record(void)
{
    each_record(roundtrip_record);
}

/* Every proper prefix of an encoding is refused, and so is one byte too many, unless the frame
 * is of a newer version, whose trailing fields this build skips. */
static void truncate_record(const kvs__rec_desc_t *d)
{
    for (int iter = 0; iter < 20; iter++) {
        kvs__arena_t a;
        kvs__arena_init(&a);
        void *m = kvs__arena_alloc(&a, d->size), *back = kvs__arena_alloc(&a, d->size);
        rnd_record(d, m, KVS_PROTO_VERSION_MAX, &a);
        kvs__wbuf_t w;
        kvs__wbuf_init(&w);
        d->encode(&w, m);
        for (size_t cut = 0; cut < w.len; cut++) {
            int rc = d->decode(w.data, cut, KVS_PROTO_VERSION_MAX, &a, back);
            if (rc != KVS_PROTOCOL_ERROR)
                kvs_test_fail(__FILE__, __LINE__, "%s decoded from %zu of %zu bytes: %s", d->name,
                              cut, w.len, kvs_status_name(rc));
        }
        kvs__wbuf_put_u8(&w, 0x5a);
        CHECK_STATUS(d->decode(w.data, w.len, KVS_PROTO_VERSION_MAX, &a, back), KVS_PROTOCOL_ERROR);
        CHECK_STATUS(d->decode(w.data, w.len, KVS_PROTO_VERSION_MAX + 1, &a, back), KVS_OK);
        const char *why = NULL;
        CHECK(record_eq(d, m, back, &why));
        kvs__wbuf_free(&w);
        kvs__arena_free(&a);
    }
}

static void test_truncation_and_trailing_bytes(void)
{
    len_cap = 16; /* every prefix of every instance is decoded: keep them short */
    each_record(truncate_record);
}

/* A newer peer's record with a field this build does not know: its frame (of the newer
 * version) decodes to the known fields. */
static void test_newer_peer_field_skipped(void)
{
    kvs__arena_t a;
    kvs__arena_init(&a);
    for (int iter = 0; iter < 100; iter++) {
        kvs__t_newer_t n;
        rnd_record(&kvs__t_all_desc, &n, KVS_PROTO_VERSION_MAX, &a);
        n.added = kvs_test_rand() | 1;
        /* What the newer peer sends: our fields, then its own. */
        kvs__wbuf_t w =
            kvs__wbuf_over(kvs__arena_alloc(&a, 65536), 65536, KVS_PROTO_VERSION_MAX + 1);
        kvs__t_newer_encode(&w, &n);
        CHECK(!w.failed);
        size_t known = w.len - 8;
        kvs__t_all_t old;
        CHECK_STATUS(kvs__t_all_decode(w.data, w.len, KVS_PROTO_VERSION_MAX + 1, &a, &old), KVS_OK);
        const char *why = NULL;
        CHECK(record_eq(&kvs__t_all_desc, &n, &old, &why));
        /* In a frame of our own version the same bytes are one field too many. */
        CHECK_STATUS(kvs__t_all_decode(w.data, w.len, KVS_PROTO_VERSION_MAX, &a, &old),
                     KVS_PROTOCOL_ERROR);
        CHECK_STATUS(kvs__t_all_decode(w.data, known, KVS_PROTO_VERSION_MAX, &a, &old), KVS_OK);
    }
    kvs__arena_free(&a);
}

/* Fields of a later version are neither written nor read in frames of an earlier one. */
static void test_fields_follow_the_frame_version(void)
{
    kvs__hello_rsp_t h = {.status = 0, .version = 2, .client_id = 7, .next_probe = 99};
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    w.version = KVS_PROTO_VERSION_MIN;
    kvs__hello_rsp_encode(&w, &h);
    CHECK_EQ_U64(w.len, KVS__MIN_BYTES_hello_rsp);
    kvs__hello_rsp_t back;
    CHECK_STATUS(kvs__hello_rsp_decode(w.data, w.len, KVS_PROTO_VERSION_MIN, NULL, &back), KVS_OK);
    CHECK_EQ_U64(back.next_probe, 0);
    CHECK_EQ_U64(back.client_id, 7);
#ifdef KVS_PROTO_NEXT
    /* The next version carries it. */
    kvs__wbuf_reset(&w);
    w.version = KVS_PROTO_VERSION_MAX;
    kvs__hello_rsp_encode(&w, &h);
    CHECK_EQ_U64(w.len, KVS__MIN_BYTES_hello_rsp + 8 /* term, version 4 */ + 8);
    CHECK_STATUS(kvs__hello_rsp_decode(w.data, w.len, KVS_PROTO_VERSION_MAX, NULL, &back), KVS_OK);
    CHECK_EQ_U64(back.next_probe, 99);
#endif
    kvs__wbuf_free(&w);
}

/* ---- hand-made inputs ----------------------------------------------------------------------- */

static void test_decoded_fields(void)
{
    kvs__replica_t reps[2] = {{1, 4096, 0}, {7, 0, 0}};
    kvs__seg_info_t segs[2] = {
        {1, kvs__str_c("seg-a"), kvs__str_c("node1"), kvs__str_c("10.0.0.1:9000"), 1 << 20, 64},
        {7, kvs__str_c("seg-b"), kvs__str_c("node2"), kvs__str_c("h2:9"), 1ull << 40, 0}};
    kvs__obj_desc_t objs[2] = {{.size = 100, .lease_ms = 9000, .nreps = 2, .reps = reps},
                               {.status = KVS_OBJECT_NOT_FOUND}};
    kvs__placement_rsp_t in = {0, 2, segs, 2, objs};
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__placement_rsp_encode(&w, &in);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__placement_rsp_t m;
    CHECK_STATUS(kvs__placement_rsp_decode(w.data, w.len, w.version, &arena, &m), KVS_OK);
    CHECK_EQ_INT(m.nsegs, 2);
    CHECK(kvs__str_eq(m.segs[0].endpoint, kvs__str_c("10.0.0.1:9000")));
    CHECK_EQ_U64(m.segs[1].size, 1ull << 40);
    CHECK_EQ_INT(m.nobjs, 2);
    CHECK_EQ_INT(m.objs[0].nreps, 2);
    CHECK_EQ_U64(m.objs[0].reps[0].offset, 4096);
    CHECK_EQ_U64(m.objs[0].reps[1].segment_id, 7);
    CHECK_STATUS(m.objs[1].status, KVS_OBJECT_NOT_FOUND);
    /* The log form names every field. */
    char text[512];
    kvs__record_format(&kvs__placement_rsp_desc, &m, text, sizeof(text));
    CHECK(strstr(text, "segs=[2: {id=1 name=\"seg-a\"") != NULL);
    CHECK(strstr(text, "reps=[2: {segment_id=1 offset=4096 cap=0}") != NULL);
    CHECK(strstr(text, "status=-704") != NULL);
    kvs__arena_free(&arena);
    kvs__wbuf_free(&w);
}

static void test_forged_counts_and_lengths(void)
{
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__keys_req_t m;
    unsigned v = KVS_PROTO_VERSION_MAX;
    /* flags, then a count of 2^32-1 keys in a 12-byte payload: refused before allocating. */
    uint8_t forged[12] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0};
    size_t live = kvs__alloc_live_bytes();
    CHECK_STATUS(kvs__keys_req_decode(forged, sizeof(forged), v, &arena, &m), KVS_PROTOCOL_ERROR);
    CHECK_CMP_U64(kvs__alloc_live_bytes(), <, live + 65536);
    /* A count just within the cap but beyond what the bytes can hold. */
    uint8_t forged2[8] = {0, 0, 0, 0, 0, 0, 1, 0}; /* 65536 keys, no bytes */
    CHECK_STATUS(kvs__keys_req_decode(forged2, sizeof(forged2), v, &arena, &m), KVS_PROTOCOL_ERROR);
    /* A key longer than KVS_MAX_KEY_LEN. */
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__wbuf_put_u32(&w, 0);
    kvs__wbuf_put_u32(&w, 1);
    kvs__wbuf_put_u32(&w, KVS_MAX_KEY_LEN + 1);
    for (unsigned i = 0; i <= KVS_MAX_KEY_LEN; i++)
        kvs__wbuf_put_u8(&w, 'a');
    CHECK_STATUS(kvs__keys_req_decode(w.data, w.len, v, &arena, &m), KVS_PROTOCOL_ERROR);
    /* More replicas than allowed. */
    kvs__wbuf_reset(&w);
    kvs__wbuf_put_i32(&w, 0);
    kvs__wbuf_put_u32(&w, 0); /* no segments */
    kvs__wbuf_put_u32(&w, 1);
    kvs__wbuf_put_i32(&w, 0);
    kvs__wbuf_put_u64(&w, 1);
    kvs__wbuf_put_u64(&w, 1);
    kvs__wbuf_put_u32(&w, KVS_MAX_REPLICAS + 1);
    for (unsigned i = 0; i <= KVS_MAX_REPLICAS; i++) {
        kvs__wbuf_put_u64(&w, 1);
        kvs__wbuf_put_u64(&w, 0);
    }
    kvs__placement_rsp_t p;
    CHECK_STATUS(kvs__placement_rsp_decode(w.data, w.len, v, &arena, &p), KVS_PROTOCOL_ERROR);
    kvs__wbuf_free(&w);
    kvs__arena_free(&arena);
}

/* Encoders refuse what decoders would refuse: the frame does not end. */
static void test_encoder_limits(void)
{
    char key[KVS_MAX_KEY_LEN + 1];
    memset(key, 'k', sizeof(key));
    kvs__str_t k = {key, sizeof(key)};
    kvs__keys_req_t kr = {.nkeys = 1, .keys = &k};
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, KVS_MSG_LOOKUP, 1, KVS_PROTO_VERSION_MAX);
    kvs__keys_req_encode(&w, &kr);
    CHECK(w.invalid);
    CHECK_STATUS(kvs__frame_end(&w), KVS_INVALID_PARAMS);
    k.len = KVS_MAX_KEY_LEN;
    kvs__frame_begin(&w, KVS_MSG_LOOKUP, 1, KVS_PROTO_VERSION_MAX);
    kvs__keys_req_encode(&w, &kr);
    CHECK_STATUS(kvs__frame_end(&w), KVS_OK);
    /* A count above its limit. */
    kvs__replica_t reps[KVS_MAX_REPLICAS + 1] = {{0, 0, 0}};
    kvs__obj_desc_t o = {.nreps = KVS_MAX_REPLICAS + 1, .reps = reps};
    kvs__placement_rsp_t pr = {.nobjs = 1, .objs = &o};
    kvs__frame_begin(&w, KVS_MSG_LOOKUP | KVS_RSP_FLAG, 1, KVS_PROTO_VERSION_MAX);
    kvs__placement_rsp_encode(&w, &pr);
    CHECK_STATUS(kvs__frame_end(&w), KVS_INVALID_PARAMS);
    kvs__wbuf_free(&w);
    /* A fixed buffer never grows past its end. */
    uint8_t small[8];
    kvs__wbuf_t f = kvs__wbuf_over(small, sizeof(small), KVS_PROTO_VERSION_MAX);
    kvs__data_req_t d = {1, 2, 3, 4, 0, 0, 0, 0};
    kvs__data_req_encode(&f, &d);
    CHECK(f.failed);
    CHECK_EQ_U64(KVS__MIN_BYTES_data_req, KVS_DATA_REQ_LEN);
    CHECK_EQ_U64(kvs__data_req_max_bytes(), KVS_DATA_REQ_LEN);
    CHECK_EQ_U64(kvs__data_status_max_bytes(), KVS_DATA_STATUS_LEN);
}

/* The frame limit against the schema's bounds: every reply to a call within the documented
 * limits fits a frame, and each request that may not is one the client splits. A record added
 * to the schema that can outgrow a frame fails here until it is handled. */
static void test_limits_derived_from_schema(void)
{
    static const char *const split_or_truncated[] = {
        "keys_req",      /* split by the client (batch_call) */
        "put_start_req", /* split by the client (batch_call) */
        "list_rsp",      /* the master stops at a frame's worth and says truncated */
    };
    for (size_t i = 0; i < kvs__records_count; i++) {
        const kvs__rec_desc_t *d = kvs__records[i];
        bool handled = false;
        for (size_t j = 0; j < KVS_ARRAY_SIZE(split_or_truncated); j++)
            handled |= strcmp(d->name, split_or_truncated[j]) == 0;
        uint64_t max = 0;
#define MAX_OF_(rec)                                                                               \
    if (d == &kvs__##rec##_desc)                                                                   \
        max = kvs__##rec##_max_bytes();
        KVS_SCHEMA_RECORDS(MAX_OF_)
#undef MAX_OF_
        if (handled)
            CHECK_CMP_U64(max, >, KVS_FRAME_MAX_PAYLOAD); /* else it needs no handling */
        else if (max > KVS_FRAME_MAX_PAYLOAD)
            kvs_test_fail(__FILE__, __LINE__, "%s can take %llu bytes, more than a frame", d->name,
                          (unsigned long long)max);
    }
    /* One key per frame always fits (the client's split cannot get stuck). */
    CHECK_CMP_U64(KVS__MIN_BYTES_put_start_req + 2 * KVS_MAX_NAME_LEN + KVS__MIN_BYTES_put_item +
                      KVS_MAX_KEY_LEN,
                  <, KVS_FRAME_MAX_PAYLOAD);
}

static void test_frame_header(void)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, KVS_MSG_STAT, 77, KVS_PROTO_VERSION_MAX);
    kvs__wbuf_put_u32(&w, 5);
    CHECK_STATUS(kvs__frame_end(&w), KVS_OK);
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, w.len, 1024, &h), KVS_OK);
    CHECK_EQ_INT(h.type, KVS_MSG_STAT);
    CHECK_EQ_INT(h.req_id, 77);
    CHECK_EQ_INT(h.len, 4);
    CHECK_EQ_INT(h.version, KVS_PROTO_VERSION_MAX);
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, KVS_FRAME_HDR_LEN - 1, 1024, &h),
                 KVS_PROTOCOL_ERROR);
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, w.len, 3, &h), KVS_PROTOCOL_ERROR); /* oversize */

    uint8_t bad[KVS_FRAME_HDR_LEN];
    memcpy(bad, w.data, sizeof(bad));
    bad[0] ^= 1;
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_PROTOCOL_ERROR);
    memcpy(bad, w.data, sizeof(bad));
    bad[4] = KVS_PROTO_VERSION_MIN - 1; /* an older peer's version */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_INVALID_VERSION);
    bad[4] = KVS_PROTO_VERSION_MAX + 1; /* a newer one: only its HELLO is read */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_INVALID_VERSION);
    bad[6] = KVS_MSG_HELLO;
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_OK);
    bad[7] = 0x80; /* a HELLO reply of a newer version: never sent, refused */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_INVALID_VERSION);
    memcpy(bad, w.data, sizeof(bad));
    bad[6] = 0x7f; /* a type this build does not know passes, to be answered with an error */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_OK);
    CHECK(!kvs__msg_known(h.type));
    CHECK_EQ_STR(kvs__msg_name(h.type), "UNKNOWN");
    bad[6] = 0; /* type 0 is never valid */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_PROTOCOL_ERROR);
    memcpy(bad, w.data, sizeof(bad));
    bad[15] = 0x80; /* 2 GiB payload */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), UINT32_MAX, &h), KVS_PROTOCOL_ERROR);
    kvs__wbuf_free(&w);
}

static void test_message_table(void)
{
    CHECK_EQ_STR(kvs__msg_name(KVS_MSG_LOOKUP | KVS_RSP_FLAG), "LOOKUP");
    CHECK(kvs__msg_desc(KVS_MSG_LOOKUP)->req == &kvs__keys_req_desc);
    CHECK(kvs__msg_desc(KVS_MSG_LOOKUP)->rsp == &kvs__placement_rsp_desc);
    CHECK(kvs__msg_desc(KVS_MSG_DATA_WRITE)->raw == KVS_MSG_RAW_REQ);
    CHECK(kvs__msg_desc(0) == NULL && kvs__msg_desc(KVS_MSG_MAX_) == NULL);
    /* STAT's empty request: nothing, or (from a newer peer) fields to skip. */
    const kvs__rec_desc_t *none = kvs__msg_desc(KVS_MSG_STAT)->req;
    uint8_t b = 1;
    CHECK_STATUS(none->decode(&b, 0, KVS_PROTO_VERSION_MAX, NULL, NULL), KVS_OK);
    CHECK_STATUS(none->decode(&b, 1, KVS_PROTO_VERSION_MAX, NULL, NULL), KVS_PROTOCOL_ERROR);
    CHECK_STATUS(none->decode(&b, 1, KVS_PROTO_VERSION_MAX + 1, NULL, NULL), KVS_OK);
}

static void test_negotiation(void)
{
    CHECK_EQ_INT(kvs__proto_negotiate(KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX),
                 KVS_PROTO_VERSION_MAX);
    CHECK_EQ_INT(kvs__proto_negotiate(1, KVS_PROTO_VERSION_MAX + 5), KVS_PROTO_VERSION_MAX);
    CHECK_EQ_INT(kvs__proto_negotiate(KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MIN),
                 KVS_PROTO_VERSION_MIN);
    CHECK_EQ_INT(kvs__proto_negotiate(1, KVS_PROTO_VERSION_MIN - 1), 0); /* all older */
    CHECK_EQ_INT(kvs__proto_negotiate(KVS_PROTO_VERSION_MAX + 1, KVS_PROTO_VERSION_MAX + 3), 0);
    CHECK_EQ_INT(kvs__proto_negotiate(5, 4), 0); /* an empty range */
    CHECK_EQ_INT(kvs__proto_reply_version(KVS_PROTO_VERSION_MAX + 7), KVS_PROTO_VERSION_MAX);
    CHECK_EQ_INT(kvs__proto_reply_version(KVS_PROTO_VERSION_MIN), KVS_PROTO_VERSION_MIN);
}

/* docs/protocol.md holds the schema's tables as `kvstash schema` prints them: the document
 * cannot drift from the code. */
#ifndef KVS_PROTO_NEXT /* the document describes the product's schema, not the next one's */
static void test_protocol_doc_matches_schema(void)
{
    FILE *f = fopen(KVS_SOURCE_DIR "/docs/protocol.md", "r");
    CHECK(f != NULL);
    static char doc[1 << 18];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    fclose(f);
    doc[n] = 0;
    const char *begin = strstr(doc, "<!-- schema:begin");
    const char *end = strstr(doc, "<!-- schema:end -->");
    CHECK(begin != NULL && end != NULL && end > begin);
    begin = strchr(begin, '\n') + 1;
    char *gen = NULL;
    size_t gen_len = 0;
    FILE *m = open_memstream(&gen, &gen_len);
    CHECK(m != NULL);
    kvs__schema_write_markdown(m);
    fclose(m);
    if ((size_t)(end - begin) != gen_len || memcmp(begin, gen, gen_len) != 0)
        kvs_test_fail(__FILE__, __LINE__,
                      "docs/protocol.md's schema section differs from `kvstash schema`; "
                      "regenerate it");
    free(gen);
}

/* README's Limits table states each limit with the constant that enforces it: every row must
 * name a known constant and its value, and every constant must have a row. */
static void test_readme_limits_match_the_code(void)
{
    FILE *f = fopen(KVS_SOURCE_DIR "/README.md", "r");
    CHECK(f != NULL);
    static const struct {
        const char *name;
        uint64_t value;
    } limits[] = {
        {"KVS_MAX_BATCH", KVS_MAX_BATCH},
        {"KVS_MAX_KEY_LEN", KVS_MAX_KEY_LEN},
        {"KVS_MAX_REPLICAS", KVS_MAX_REPLICAS},
        {"KVS_MAX_NAME_LEN", KVS_MAX_NAME_LEN},
        {"KVS_MAX_SEGMENTS", KVS_MAX_SEGMENTS},
        {"KVS_FRAME_MAX_PAYLOAD", KVS_FRAME_MAX_PAYLOAD},
        {"KVS_DATA_MAX_CHUNK", KVS_DATA_MAX_CHUNK},
        {"KVS_HANDSHAKE_MAX_PAYLOAD", KVS_HANDSHAKE_MAX_PAYLOAD},
    };
    bool seen[KVS_ARRAY_SIZE(limits)] = {false};
    char line[512];
    bool in_section = false;
    unsigned rows = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "## ", 3) == 0)
            in_section = strncmp(line, "## Limits", 9) == 0;
        if (!in_section || line[0] != '|' || strstr(line, "`KVS_") == NULL)
            continue;
        /* | what | value | `CONSTANT` | */
        char *value = strchr(line + 1, '|');
        CHECK(value != NULL);
        uint64_t v = strtoull(value + 1, NULL, 10);
        char *name = strstr(line, "`KVS_") + 1;
        *strchr(name, '`') = '\0';
        bool known = false;
        for (size_t i = 0; i < KVS_ARRAY_SIZE(limits); i++) {
            if (strcmp(limits[i].name, name) == 0) {
                known = true;
                seen[i] = true;
                if (v != limits[i].value)
                    kvs_test_fail(__FILE__, __LINE__, "README says %s is %llu, the code %llu", name,
                                  (unsigned long long)v, (unsigned long long)limits[i].value);
            }
        }
        if (!known)
            kvs_test_fail(__FILE__, __LINE__, "README's limit %s is not checked here", name);
        rows++;
    }
    fclose(f);
    CHECK_CMP_U64(rows, >=, KVS_ARRAY_SIZE(limits));
    for (size_t i = 0; i < KVS_ARRAY_SIZE(limits); i++) {
        if (!seen[i])
            kvs_test_fail(__FILE__, __LINE__, "README's Limits table lacks %s", limits[i].name);
    }
}
#endif

static void test_wbuf_alloc_failure(void)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__alloc_inject_failure(0, true);
    kvs__frame_begin(&w, KVS_MSG_STAT, 1, KVS_PROTO_VERSION_MAX);
    kvs__wbuf_put_u64(&w, 1);
    kvs__alloc_inject_failure(-1, false);
    CHECK(w.failed);
    CHECK_STATUS(kvs__frame_end(&w), KVS_NO_MEMORY);
    kvs__wbuf_free(&w);
}

/* Arenas keep freed chunks for the next one (not under ASan): a chunk comes back zeroed where
 * handed out, the same memory serves the next arena of its size (no new allocation), injected
 * allocation failures still reach arenas, and chunks beyond the largest kept size go back to
 * the C library. */
static void test_arena_chunks_are_kept_zeroed_and_bounded(void)
{
    kvs__arena_t a;
    kvs__arena_init(&a);
    uint8_t *p = kvs__arena_alloc(&a, 100000);
    CHECK(p != NULL);
    memset(p, 0xA5, 100000);
    kvs__arena_free(&a);
    size_t count = kvs__alloc_live_count();
    kvs__arena_init(&a);
    uint8_t *q = kvs__arena_alloc(&a, 90000); /* the same 128 KiB class */
    CHECK(q != NULL);
    if (kvs__arena_pooling()) {
        CHECK(q == p);                                /* the chunk just freed */
        CHECK_EQ_U64(kvs__alloc_live_count(), count); /* kept, not allocated anew */
    } else {
        CHECK_EQ_U64(kvs__alloc_live_count(), count + 1); /* ASan: nothing is kept */
    }
    for (size_t i = 0; i < 90000; i++) {
        if (q[i] != 0) {
            CHECK_EQ_INT(q[i], 0);
            break;
        }
    }
    kvs__arena_free(&a);
    /* While failures are injected, a chunk is allocated afresh: it can fail. */
    kvs__alloc_inject_failure(0, false);
    kvs__arena_init(&a);
    CHECK(kvs__arena_alloc(&a, 90000) == NULL);
    kvs__alloc_inject_failure(-1, false);
    kvs__arena_free(&a);
    /* 8 MiB: beyond the kept sizes, so freed for good. */
    count = kvs__alloc_live_count();
    kvs__arena_init(&a);
    CHECK(kvs__arena_alloc(&a, (size_t)8 << 20) != NULL);
    CHECK_EQ_U64(kvs__alloc_live_count(), count + 1);
    kvs__arena_free(&a);
    CHECK_EQ_U64(kvs__alloc_live_count(), count);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_arena_chunks_are_kept_zeroed_and_bounded),
        KVS_TEST_CASE(test_roundtrip_every_record),
        KVS_TEST_CASE(test_truncation_and_trailing_bytes),
        KVS_TEST_CASE(test_newer_peer_field_skipped),
        KVS_TEST_CASE(test_fields_follow_the_frame_version),
        KVS_TEST_CASE(test_decoded_fields),
        KVS_TEST_CASE(test_forged_counts_and_lengths),
        KVS_TEST_CASE(test_encoder_limits),
        KVS_TEST_CASE(test_limits_derived_from_schema),
        KVS_TEST_CASE(test_frame_header),
        KVS_TEST_CASE(test_message_table),
        KVS_TEST_CASE(test_negotiation),
#ifndef KVS_PROTO_NEXT
        KVS_TEST_CASE(test_protocol_doc_matches_schema),
        KVS_TEST_CASE(test_readme_limits_match_the_code),
#endif
        KVS_TEST_CASE(test_wbuf_alloc_failure),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
