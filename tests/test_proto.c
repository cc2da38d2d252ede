/* Wire format: round trips of every message, truncation, trailing bytes, forged counts,
 * oversized frames, bad magic and version. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "proto/proto_int.h"

/* One encoded sample payload per codec. */
static void encode_sample(const char *name, kvs__wbuf_t *w)
{
    kvs__str_t keys[3] = {kvs__str_c("k1"), kvs__str_c("key-two"), kvs__str_c("x")};
    kvs__replica_t reps[2] = {{1, 4096}, {7, 0}};
    kvs__seg_info_t segs[2] = {
        {1, kvs__str_c("seg-a"), kvs__str_c("node1"), kvs__str_c("10.0.0.1:9000"), 1 << 20, 64},
        {7, kvs__str_c("seg-b"), kvs__str_c("node2"), kvs__str_c("h2:9"), 1ull << 40, 0}};
    if (!strcmp(name, "hello_req")) {
        kvs__hello_req_t m = {KVS_PROTO_VERSION, kvs__str_c("host-1"), 42};
        kvs__hello_req_encode(w, &m);
    } else if (!strcmp(name, "hello_rsp")) {
        kvs__hello_rsp_t m = {0, 99, 10000, 5000};
        kvs__hello_rsp_encode(w, &m);
    } else if (!strcmp(name, "mount_req")) {
        kvs__mount_req_t m = {5, kvs__str_c("seg"), kvs__str_c("n"), kvs__str_c("e:1"), 1 << 30};
        kvs__mount_req_encode(w, &m);
    } else if (!strcmp(name, "mount_rsp")) {
        kvs__mount_rsp_t m = {-102, 3};
        kvs__mount_rsp_encode(w, &m);
    } else if (!strcmp(name, "ids_req")) {
        kvs__ids_req_t m = {UINT64_MAX, 1};
        kvs__ids_req_encode(w, &m);
    } else if (!strcmp(name, "keys_req")) {
        kvs__keys_req_t m = {KVS_KEYS_FLAG_FORCE, 3, keys};
        kvs__keys_req_encode(w, &m);
    } else if (!strcmp(name, "status_list_rsp")) {
        int32_t r[3] = {0, -704, 1};
        kvs__status_list_rsp_t m = {0, 3, r};
        kvs__status_list_rsp_encode(w, &m);
    } else if (!strcmp(name, "put_start_req")) {
        kvs__put_item_t items[2] = {{keys[0], 12 << 20}, {keys[1], 1}};
        kvs__put_start_req_t m = {kvs__str_c("n"), 2, kvs__str_c("seg-a"), 1, 2, items};
        kvs__put_start_req_encode(w, &m);
    } else if (!strcmp(name, "placement_rsp")) {
        kvs__obj_desc_t objs[2] = {{0, 100, 9000, 2, reps}, {-704, 0, 0, 0, NULL}};
        kvs__placement_rsp_t m = {0, 2, segs, 2, objs};
        kvs__placement_rsp_encode(w, &m);
    } else if (!strcmp(name, "list_req")) {
        kvs__list_req_t m = {kvs__str_c("pre"), 10};
        kvs__list_req_encode(w, &m);
    } else if (!strcmp(name, "list_rsp")) {
        kvs__list_entry_t e[2] = {{keys[0], 5, 1, 1}, {keys[2], 6, 0, 2}};
        kvs__list_rsp_t m = {0, 1, 2, e};
        kvs__list_rsp_encode(w, &m);
    } else if (!strcmp(name, "stat_rsp")) {
        kvs__counter_t c[2] = {{kvs__str_c("objects"), 3}, {kvs__str_c("used_bytes"), 1 << 20}};
        kvs__stat_rsp_t m = {0, 2, c, 2, segs};
        kvs__stat_rsp_encode(w, &m);
    } else if (!strcmp(name, "data_req")) {
        kvs__data_req_t m = {3, 12345, 1 << 20};
        kvs__data_req_encode(w, &m);
    } else if (!strcmp(name, "error_rsp")) {
        kvs__error_rsp_t m = {-600, kvs__str_c("bad")};
        kvs__error_rsp_encode(w, &m);
    } else {
        kvs_test_fail(__FILE__, __LINE__, "no sample for %s", name);
    }
    CHECK(!w->failed);
}

static void test_roundtrip_every_codec(void)
{
    for (size_t i = 0; i < kvs__codecs_count; i++) {
        kvs__wbuf_t in, out;
        kvs__wbuf_init(&in);
        kvs__wbuf_init(&out);
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        encode_sample(kvs__codecs[i].name, &in);
        CHECK_STATUS(kvs__codecs[i].fn(in.data, in.len, &arena, &out), KVS_OK);
        CHECK_EQ_U64(out.len, in.len);
        CHECK_EQ_MEM(out.data, in.data, in.len);
        kvs__arena_free(&arena);
        kvs__wbuf_free(&in);
        kvs__wbuf_free(&out);
    }
}

static void test_decoded_fields(void)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    encode_sample("placement_rsp", &w);
    kvs__placement_rsp_t m;
    CHECK_STATUS(kvs__placement_rsp_decode(w.data, w.len, &arena, &m), KVS_OK);
    CHECK_EQ_INT(m.nseg, 2);
    CHECK(kvs__str_eq(m.segs[0].endpoint, kvs__str_c("10.0.0.1:9000")));
    CHECK_EQ_U64(m.segs[1].size, 1ull << 40);
    CHECK_EQ_INT(m.n, 2);
    CHECK_EQ_INT(m.objs[0].nrep, 2);
    CHECK_EQ_U64(m.objs[0].reps[0].offset, 4096);
    CHECK_EQ_U64(m.objs[0].reps[1].segment_id, 7);
    CHECK_STATUS(m.objs[1].status, KVS_OBJECT_NOT_FOUND);
    kvs__arena_free(&arena);
    kvs__wbuf_free(&w);
}

static void test_truncation_and_trailing_bytes(void)
{
    for (size_t i = 0; i < kvs__codecs_count; i++) {
        kvs__wbuf_t in, out;
        kvs__wbuf_init(&in);
        kvs__wbuf_init(&out);
        encode_sample(kvs__codecs[i].name, &in);
        for (size_t cut = 0; cut < in.len; cut++) {
            kvs__arena_t arena;
            kvs__arena_init(&arena);
            kvs__wbuf_reset(&out);
            int rc = kvs__codecs[i].fn(in.data, cut, &arena, &out);
            if (rc != KVS_PROTOCOL_ERROR)
                kvs_test_fail(__FILE__, __LINE__, "%s decoded from %zu of %zu bytes: %s",
                              kvs__codecs[i].name, cut, in.len, kvs_status_name(rc));
            kvs__arena_free(&arena);
        }
        kvs__wbuf_put_u8(&in, 0);
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        CHECK_STATUS(kvs__codecs[i].fn(in.data, in.len, &arena, &out), KVS_PROTOCOL_ERROR);
        kvs__arena_free(&arena);
        kvs__wbuf_free(&in);
        kvs__wbuf_free(&out);
    }
}

static void test_forged_counts_and_lengths(void)
{
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__keys_req_t m;
    /* flags, then a count of 2^32-1 keys in a 12-byte payload: refused before allocating. */
    uint8_t forged[12] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0};
    size_t live = kvs__alloc_live_bytes();
    CHECK_STATUS(kvs__keys_req_decode(forged, sizeof(forged), &arena, &m), KVS_PROTOCOL_ERROR);
    CHECK_CMP_U64(kvs__alloc_live_bytes(), <, live + 65536);
    /* A count just within the cap but beyond what the bytes can hold. */
    uint8_t forged2[8] = {0, 0, 0, 0, 0, 0, 1, 0}; /* 65536 keys, no bytes */
    CHECK_STATUS(kvs__keys_req_decode(forged2, sizeof(forged2), &arena, &m), KVS_PROTOCOL_ERROR);
    /* A key longer than KVS_MAX_KEY_LEN. */
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__wbuf_put_u32(&w, 0);
    kvs__wbuf_put_u32(&w, 1);
    kvs__wbuf_put_u32(&w, KVS_MAX_KEY_LEN + 1);
    for (unsigned i = 0; i <= KVS_MAX_KEY_LEN; i++)
        kvs__wbuf_put_u8(&w, 'a');
    CHECK_STATUS(kvs__keys_req_decode(w.data, w.len, &arena, &m), KVS_PROTOCOL_ERROR);
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
    CHECK_STATUS(kvs__placement_rsp_decode(w.data, w.len, &arena, &p), KVS_PROTOCOL_ERROR);
    kvs__wbuf_free(&w);
    kvs__arena_free(&arena);
}

static void test_frame_header(void)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__frame_begin(&w, KVS_MSG_STAT, 77);
    kvs__wbuf_put_u32(&w, 5);
    CHECK_STATUS(kvs__frame_end(&w), KVS_OK);
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, w.len, 1024, &h), KVS_OK);
    CHECK_EQ_INT(h.type, KVS_MSG_STAT);
    CHECK_EQ_INT(h.req_id, 77);
    CHECK_EQ_INT(h.len, 4);
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, KVS_FRAME_HDR_LEN - 1, 1024, &h),
                 KVS_PROTOCOL_ERROR);
    CHECK_STATUS(kvs__frame_hdr_decode(w.data, w.len, 3, &h), KVS_PROTOCOL_ERROR); /* oversize */

    uint8_t bad[KVS_FRAME_HDR_LEN];
    memcpy(bad, w.data, sizeof(bad));
    bad[0] ^= 1;
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_PROTOCOL_ERROR);
    memcpy(bad, w.data, sizeof(bad));
    bad[4] = 2; /* version 2 */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_INVALID_VERSION);
    memcpy(bad, w.data, sizeof(bad));
    bad[6] = 0x7f; /* unknown type */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), 1024, &h), KVS_PROTOCOL_ERROR);
    memcpy(bad, w.data, sizeof(bad));
    bad[15] = 0x80; /* 2 GiB payload */
    CHECK_STATUS(kvs__frame_hdr_decode(bad, sizeof(bad), UINT32_MAX, &h), KVS_PROTOCOL_ERROR);
    kvs__wbuf_free(&w);
}

static void test_wbuf_alloc_failure(void)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__alloc_inject_failure(0, true);
    kvs__frame_begin(&w, KVS_MSG_STAT, 1);
    kvs__wbuf_put_u64(&w, 1);
    kvs__alloc_inject_failure(-1, false);
    CHECK(w.failed);
    CHECK_STATUS(kvs__frame_end(&w), KVS_NO_MEMORY);
    kvs__wbuf_free(&w);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_roundtrip_every_codec),
        KVS_TEST_CASE(test_decoded_fields),
        KVS_TEST_CASE(test_truncation_and_trailing_bytes),
        KVS_TEST_CASE(test_forged_counts_and_lengths),
        KVS_TEST_CASE(test_frame_header),
        KVS_TEST_CASE(test_wbuf_alloc_failure),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
