/* Master state machine, driven with an explicit clock: two-phase puts, leases, removal,
 * eviction order, liveness, placement, discards, unmount and bad input. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "master/master_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MS  KVS_NS_PER_MS
#define KIB 1024ull

typedef struct {
    kvs__master_t *m;
    kvs__arena_t arena;
    uint64_t now;
    uint64_t client;
} fx_t;

static uint64_t fx_lease_id_start; /* the next fixture's cfg.lease_id_start (0: random) */

static void fx_init(fx_t *f, uint64_t lease_ms)
{
    kvs__master_config_t cfg;
    unsetenv("KVS_MASTER_LEASE_MS");
    CHECK_STATUS(kvs__master_config_init(&cfg), KVS_OK);
    cfg.lease_ms = lease_ms;
    cfg.lease_id_start = fx_lease_id_start;
    cfg.heartbeat_timeout_ms = 1000;
    cfg.put_discard_ms = 2000;
    CHECK_STATUS(kvs__master_create(&cfg, &f->m), KVS_OK);
    kvs__arena_init(&f->arena);
    f->now = 1000 * MS;
    f->client = kvs__master_new_client(f->m);
    CHECK(f->client != 0);
}

static void fx_fini(fx_t *f)
{
    kvs__arena_free(&f->arena);
    kvs__master_destroy(f->m);
}

static uint64_t mount(fx_t *f, uint64_t client, const char *name, const char *node, uint64_t size)
{
    kvs__mount_req_t req = {
        kvs__str_c(name), kvs__str_c(node), kvs__str_c("h:1"), size, {NULL, 0}, 0};
    uint64_t id = 0;
    CHECK_STATUS(kvs__master_mount(f->m, f->now, client, &req, &id), KVS_OK);
    return id;
}

/* Starts a put of one key; returns its status and the placement. */
static int put_start_ex(fx_t *f, const char *key, uint64_t size, uint32_t replicas,
                        const char *node, const char *preferred, uint32_t flags,
                        kvs__obj_desc_t *d_p)
{
    kvs__put_item_t it = {.key = kvs__str_c(key), .size = size};
    kvs__put_start_req_t req = {.node = kvs__str_c(node),
                                .replica_num = replicas,
                                .preferred_segment = kvs__str_c(preferred),
                                .flags = flags,
                                .nitems = 1,
                                .items = &it};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_put_start(f->m, f->now, f->client, &req, &f->arena, &rsp), KVS_OK);
    CHECK_EQ_INT(rsp.nobjs, 1);
    if (d_p)
        *d_p = rsp.objs[0];
    return rsp.objs[0].status;
}

static int put_start(fx_t *f, const char *key, uint64_t size)
{
    return put_start_ex(f, key, size, 1, "n", "", 0, NULL);
}

typedef int (*keys_fn)(kvs__master_t *, uint64_t, const kvs__keys_req_t *, kvs__arena_t *,
                       kvs__status_list_rsp_t *);

static int key_op(fx_t *f, keys_fn fn, const char *key, uint32_t flags)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t req = {.flags = flags, .nkeys = 1, .keys = &k};
    kvs__status_list_rsp_t rsp;
    CHECK_STATUS(fn(f->m, f->now, &req, &f->arena, &rsp), KVS_OK);
    CHECK_EQ_INT(rsp.nresults, 1);
    return rsp.results[0];
}

typedef int (*writer_fn)(kvs__master_t *, uint64_t, uint64_t, const kvs__keys_req_t *,
                         kvs__arena_t *, kvs__status_list_rsp_t *);

/* PUT_END or PUT_REVOKE of one key, as client `client`. */
static int writer_op(fx_t *f, writer_fn fn, const char *key, uint64_t client)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t req = {.nkeys = 1, .keys = &k};
    kvs__status_list_rsp_t rsp;
    CHECK_STATUS(fn(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    CHECK_EQ_INT(rsp.nresults, 1);
    return rsp.results[0];
}

#define END(f, k)        writer_op((f), kvs__master_put_end, (k), (f)->client)
#define REVOKE(f, k)     writer_op((f), kvs__master_put_revoke, (k), (f)->client)
#define EXISTS(f, k)     key_op((f), kvs__master_exists, (k), 0)
#define REMOVE(f, k, fl) key_op((f), kvs__master_remove, (k), (fl))

static int lookup(fx_t *f, const char *key, kvs__obj_desc_t *d_p)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t req = {.nkeys = 1, .keys = &k};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_lookup(f->m, f->now, f->client, &req, &f->arena, &rsp), KVS_OK);
    if (d_p)
        *d_p = rsp.objs[0];
    if (rsp.objs[0].status == KVS_OK) {
        /* Every replica's segment is described in the response. */
        for (uint32_t j = 0; j < rsp.objs[0].nreps; j++) {
            bool found = false;
            for (uint32_t s = 0; s < rsp.nsegs; s++)
                found |= rsp.segs[s].id == rsp.objs[0].reps[j].segment_id;
            CHECK(found);
        }
    }
    return rsp.objs[0].status;
}

static uint64_t counter(fx_t *f, const char *name)
{
    uint64_t v = kvs__master_counter(f->m, name);
    CHECK(v != UINT64_MAX);
    return v;
}

static void test_two_phase_put(void)
{
    fx_t f;
    fx_init(&f, 10000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    kvs__obj_desc_t d;
    CHECK_STATUS(put_start_ex(&f, "k", 1000, 1, "n", "", 0, &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 1);
    CHECK_EQ_U64(d.size, 1000);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_REPLICA_IS_NOT_READY);
    CHECK_EQ_INT(EXISTS(&f, "k"), 0);
    CHECK_STATUS(put_start(&f, "k", 1000), KVS_OBJECT_ALREADY_EXISTS);
    CHECK_EQ_U64(counter(&f, "objects_pending"), 1);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_INVALID_WRITE);
    CHECK_EQ_INT(EXISTS(&f, "k"), 1);
    kvs__obj_desc_t l;
    CHECK_STATUS(lookup(&f, "k", &l), KVS_OK);
    CHECK_EQ_U64(l.size, 1000);
    CHECK_EQ_INT(l.nreps, 1);
    CHECK_EQ_U64(l.reps[0].offset, d.reps[0].offset);
    CHECK_EQ_U64(l.lease_ms, 10000);
    CHECK_STATUS(END(&f, "missing"), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(lookup(&f, "missing", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_INT(EXISTS(&f, "missing"), 0);
    CHECK_EQ_U64(counter(&f, "objects"), 1);
    fx_fini(&f);
}

/* A heartbeat of `client` serving segment `seg` and acknowledging its fences up to `seq`;
 * returns the fences the reply lists, in *fences_p (from the fixture's arena). */
static uint32_t heartbeat_ack(fx_t *f, uint64_t client, uint64_t seg, uint64_t seq,
                              kvs__fence_t **fences_p)
{
    kvs__fence_ack_t ack = {seg, seq, 0};
    kvs__heartbeat_req_t req = {1, &ack, 0};
    kvs__heartbeat_rsp_t rsp;
    CHECK_STATUS(kvs__master_heartbeat(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.status, KVS_OK);
    if (fences_p)
        *fences_p = rsp.fences;
    return rsp.nfences;
}

/* A revoked put's space returns only once its owner has fenced the put: until then a late
 * write of it could still land there. */
static void test_revoke_frees_space(void)
{
    fx_t f;
    fx_init(&f, 10000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    kvs__obj_desc_t d;
    CHECK_STATUS(put_start_ex(&f, "k", 1 << 20, 1, "n", "", 0, &d), KVS_OK);
    CHECK(d.token != 0);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20);
    CHECK_STATUS(put_start(&f, "k2", 1), KVS_NO_AVAILABLE_HANDLE);
    CHECK_STATUS(REVOKE(&f, "k"), KVS_OK);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20); /* held for the fence */
    CHECK_STATUS(put_start(&f, "k2", 1), KVS_NO_AVAILABLE_HANDLE);
    kvs__fence_t *fences;
    CHECK_EQ_INT(heartbeat_ack(&f, f.client, s1, 0, &fences), 1);
    CHECK_EQ_U64(fences[0].segment_id, s1);
    CHECK_EQ_U64(fences[0].token, d.token);
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20); /* asked, not yet applied */
    /* Another client cannot acknowledge it (its heartbeat does not keep s1 either); the
     * owner can. */
    uint64_t other = kvs__master_new_client(f.m);
    uint64_t s_other = mount(&f, other, "s-other", "n", 1 << 16);
    kvs__fence_ack_t bad[2] = {{s_other, 0, 0}, {s1, fences[0].seq, 0}};
    kvs__heartbeat_req_t breq = {2, bad, 0};
    kvs__heartbeat_rsp_t brsp;
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, other, &breq, &f.arena, &brsp), KVS_OK);
    CHECK_EQ_INT(brsp.nfences, 0);
    CHECK_EQ_U64(counter(&f, "used_bytes"), (1 << 20) + 0);
    CHECK_EQ_INT(heartbeat_ack(&f, f.client, s1, fences[0].seq, NULL), 0);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 0);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(REVOKE(&f, "k"), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(put_start(&f, "k2", 1), KVS_OK);
    CHECK_STATUS(END(&f, "k2"), KVS_OK);
    CHECK_STATUS(REVOKE(&f, "k2"), KVS_INVALID_WRITE); /* complete objects are removed */
    fx_fini(&f);
}

static void test_leases_block_remove(void)
{
    fx_t f;
    fx_init(&f, 500);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "k", 10), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_REPLICA_IS_NOT_READY); /* pending */
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OK); /* never looked up: no lease */
    CHECK_STATUS(put_start(&f, "k", 10), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OK);
    f.now += 499 * MS;
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OBJECT_HAS_LEASE);
    kvs__obj_desc_t d;
    CHECK_STATUS(lookup(&f, "k", &d), KVS_OK); /* extends to now + 500 ms */
    CHECK_EQ_U64(d.lease_ms, 500);
    f.now += 499 * MS;
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OBJECT_HAS_LEASE);
    f.now += 1 * MS;
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OK);
    /* Forced removal ignores leases and pending state. */
    CHECK_STATUS(put_start(&f, "p", 10), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "p", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_STATUS(put_start(&f, "q", 10), KVS_OK);
    CHECK_STATUS(END(&f, "q"), KVS_OK);
    CHECK_STATUS(lookup(&f, "q", NULL), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "q", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "q", 0), KVS_OBJECT_NOT_FOUND);
    /* q's space stays a tombstone until its lease ends (DESIGN §6, fencing). */
    CHECK_CMP_U64(counter(&f, "used_bytes"), >, 0);
    f.now += 500 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 0);
    fx_fini(&f);
}

static void test_bad_input(void)
{
    fx_t f;
    fx_init(&f, 1000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    /* Bad keys fail alone; good keys of the same batch proceed. A NUL byte is only valid as
     * the end of a tenant's name (the server makes those keys; "a b" is no tenant name). */
    kvs__put_item_t items[4] = {{.key = {"", 0}, .size = 10},
                                {.key = {"a b\0c", 5}, .size = 10},
                                {.key = kvs__str_c("good"), .size = 10},
                                {.key = kvs__str_c("zero")}};
    kvs__put_start_req_t req = {.node = kvs__str_c("n"),
                                .replica_num = 1,
                                .preferred_segment = kvs__str_c(""),
                                .nitems = 4,
                                .items = items};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_put_start(f.m, f.now, f.client, &req, &f.arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.objs[0].status, KVS_INVALID_PARAMS);
    CHECK_STATUS(rsp.objs[1].status, KVS_INVALID_PARAMS);
    CHECK_STATUS(rsp.objs[2].status, KVS_OK);
    CHECK_STATUS(rsp.objs[3].status, KVS_INVALID_PARAMS);
    req.replica_num = 0;
    items[2].key = kvs__str_c("other");
    CHECK_STATUS(kvs__master_put_start(f.m, f.now, f.client, &req, &f.arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.status, KVS_INVALID_PARAMS);
    CHECK_STATUS(rsp.objs[2].status, KVS_INVALID_PARAMS);
    CHECK_STATUS(lookup(&f, "other", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_INT(EXISTS(&f, ""), KVS_INVALID_PARAMS);
    kvs__put_item_t ns[3] = {{.key = {"\0k", 2}, .size = 10},
                             {.key = {"t\0", 2}, .size = 10},
                             {.key = {"t\0k", 3}, .size = 10}};
    kvs__put_start_req_t nsreq = {.node = kvs__str_c("n"),
                                  .replica_num = 1,
                                  .preferred_segment = kvs__str_c(""),
                                  .nitems = 3,
                                  .items = ns};
    CHECK_STATUS(kvs__master_put_start(f.m, f.now, f.client, &nsreq, &f.arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.objs[0].status, KVS_INVALID_PARAMS); /* no tenant name */
    CHECK_STATUS(rsp.objs[1].status, KVS_INVALID_PARAMS); /* no key */
    CHECK_STATUS(rsp.objs[2].status, KVS_OK);             /* tenant t's key k */
    CHECK_STATUS(REMOVE(&f, "", 0), KVS_INVALID_PARAMS);
    /* Mount validation. */
    kvs__mount_req_t mr = {kvs__str_c("s1"), kvs__str_c("n"), kvs__str_c("e"), 4096, {NULL, 0}, 0};
    uint64_t id;
    CHECK_STATUS(kvs__master_mount(f.m, f.now, f.client, &mr, &id), KVS_SEGMENT_ALREADY_EXISTS);
    mr.name = kvs__str_c("s2");
    mr.size = 10;
    CHECK_STATUS(kvs__master_mount(f.m, f.now, f.client, &mr, &id), KVS_INVALID_PARAMS);
    mr.size = 4096;
    CHECK_STATUS(kvs__master_mount(f.m, f.now, 0, &mr, &id), KVS_INVALID_PARAMS);
    mr.endpoint = kvs__str_c("");
    CHECK_STATUS(kvs__master_mount(f.m, f.now, f.client, &mr, &id), KVS_INVALID_PARAMS);
    CHECK_EQ_U64(counter(&f, "segments"), 1);
    CHECK_STATUS(kvs__master_unmount(f.m, f.client + 1, s1), KVS_INVALID_PARAMS);
    CHECK_STATUS(kvs__master_unmount(f.m, f.client, 999), KVS_SEGMENT_NOT_FOUND);
    fx_fini(&f);
}

static void test_no_space(void)
{
    fx_t f;
    fx_init(&f, 60000);
    CHECK_STATUS(put_start(&f, "k", 10), KVS_NO_AVAILABLE_HANDLE); /* no segments */
    mount(&f, f.client, "s1", "n", 256 * KIB);
    CHECK_STATUS(put_start(&f, "big", 257 * KIB), KVS_NO_AVAILABLE_HANDLE);
    /* Fill with leased objects: nothing may be evicted. */
    char key[16];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        CHECK_STATUS(put_start(&f, key, 64 * KIB), KVS_OK);
        CHECK_STATUS(END(&f, key), KVS_OK);
        CHECK_STATUS(lookup(&f, key, NULL), KVS_OK);
    }
    CHECK_STATUS(put_start(&f, "more", 64 * KIB), KVS_NO_AVAILABLE_HANDLE);
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        CHECK_STATUS(lookup(&f, key, NULL), KVS_OK); /* all still there */
    }
    CHECK_EQ_U64(counter(&f, "evictions"), 0);
    /* Once the leases run out, the same put evicts the least recently used object to make
     * room, and then one more because the segment is full past its 90% watermark. */
    f.now += 60001 * MS;
    CHECK_STATUS(put_start(&f, "more", 64 * KIB), KVS_OK);
    CHECK_EQ_U64(counter(&f, "evictions"), 2);
    CHECK_EQ_INT(EXISTS(&f, "k0"), 0);
    CHECK_EQ_INT(EXISTS(&f, "k1"), 0);
    CHECK_EQ_INT(EXISTS(&f, "k2"), 1);
    CHECK_EQ_INT(EXISTS(&f, "k3"), 1);
    fx_fini(&f);
}

static void test_eviction_order_at_watermark(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n", 1024 * KIB); /* 16 blocks of 64 KiB */
    char key[16];
    for (int i = 0; i < 14; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        CHECK_STATUS(put_start(&f, key, 64 * KIB), KVS_OK);
        CHECK_STATUS(END(&f, key), KVS_OK);
        f.now += MS;
    }
    CHECK_EQ_U64(counter(&f, "evictions"), 0);    /* 87.5% < 90% */
    CHECK_STATUS(lookup(&f, "k0", NULL), KVS_OK); /* k0 becomes most recently used */
    f.now += 200 * MS;                            /* and its lease expires */
    /* 15/16 = 93.75% > 90%: about 5% (one object) goes, the least recently used: k1. */
    CHECK_STATUS(put_start(&f, "k14", 64 * KIB), KVS_OK);
    CHECK_EQ_U64(counter(&f, "evictions"), 1);
    CHECK_STATUS(lookup(&f, "k1", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(lookup(&f, "k0", NULL), KVS_OK);
    CHECK_STATUS(lookup(&f, "k14", NULL), KVS_REPLICA_IS_NOT_READY); /* pending: kept */
    /* A lookup makes k2 the most recently used, so k3 is now the oldest and goes next. */
    f.now += 200 * MS;
    CHECK_STATUS(lookup(&f, "k2", NULL), KVS_OK);
    CHECK_STATUS(END(&f, "k14"), KVS_OK);
    f.now += 200 * MS;
    CHECK_STATUS(put_start(&f, "k15", 64 * KIB), KVS_OK);
    CHECK_STATUS(lookup(&f, "k3", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(lookup(&f, "k2", NULL), KVS_OK);
    CHECK_STATUS(lookup(&f, "k4", NULL), KVS_OK);
    CHECK_EQ_U64(counter(&f, "evictions"), 2);
    fx_fini(&f);
}

/* Puts and ends one object of `size` bytes with a pin request (flags: KVS_PUT_FLAG_*). */
static int put_pinned(fx_t *f, const char *key, uint64_t size, uint32_t flags, uint32_t action,
                      uint64_t ttl_ms)
{
    kvs__put_item_t it = {.key = kvs__str_c(key), .size = size};
    kvs__put_start_req_t req = {.node = kvs__str_c("n"),
                                .replica_num = 1,
                                .preferred_segment = kvs__str_c(""),
                                .flags = flags,
                                .nitems = 1,
                                .items = &it,
                                .soft_pin_action = action,
                                .soft_pin_ttl_ms = ttl_ms};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_put_start(f->m, f->now, f->client, &req, &f->arena, &rsp), KVS_OK);
    if (rsp.objs[0].status != KVS_OK)
        return rsp.objs[0].status;
    return END(f, key);
}

/* Unpinned objects go first, then soft-pinned ones whose pin still holds; hard-pinned ones
 * never; an expired soft pin is an ordinary object again. */
static void test_pins_and_eviction_order(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 10 << 10);
    /* Oldest first: hard, soft (60 s), soft (1 s), then six unpinned. 9 KiB of 10 KiB. */
    CHECK_STATUS(put_pinned(&f, "hard", 1024, KVS_PUT_FLAG_HARD_PIN, 0, 0), KVS_OK);
    CHECK_STATUS(put_pinned(&f, "soft-long", 1024, KVS_PUT_FLAG_PIN_TTL, 1, 60000), KVS_OK);
    CHECK_STATUS(put_pinned(&f, "soft-short", 1024, KVS_PUT_FLAG_PIN_TTL, 1, 1000), KVS_OK);
    char key[32];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "plain%d", i);
        CHECK_STATUS(put_pinned(&f, key, 1024, 0, 0, 0), KVS_OK);
    }
    /* A TTL above the master's maximum is refused; so is an unknown action. */
    CHECK_STATUS(put_pinned(&f, "too-long", 1024, KVS_PUT_FLAG_PIN_TTL, 1, 25ull * 3600 * 1000),
                 KVS_INVALID_PARAMS);
    CHECK_STATUS(put_pinned(&f, "bad-action", 1024, 0, 3, 0), KVS_INVALID_PARAMS);
    /* 4 KiB more: the four oldest unpinned objects go, the pinned ones stay. */
    CHECK_STATUS(put_pinned(&f, "big", 4096, 0, 0, 0), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "hard"), 1);
    CHECK_EQ_INT(EXISTS(&f, "soft-long"), 1);
    CHECK_EQ_INT(EXISTS(&f, "soft-short"), 1);
    CHECK_EQ_INT(EXISTS(&f, "plain0"), 0);
    CHECK_EQ_INT(EXISTS(&f, "plain3"), 0);
    CHECK_EQ_INT(EXISTS(&f, "plain4"), 1);
    CHECK_EQ_U64(kvs__master_counter(f.m, "soft_pin_evictions"), 0);
    /* After 1 s the short pin has ended: it is the oldest ordinary object and goes first. */
    f.now += 1001 * MS;
    CHECK_STATUS(put_pinned(&f, "next", 1024, 0, 0, 0), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "soft-short"), 0);
    CHECK_EQ_INT(EXISTS(&f, "plain4"), 1);
    CHECK_EQ_U64(kvs__master_counter(f.m, "soft_pin_evictions"), 0);
    /* Room that only the soft-pinned object can give: it goes (allowed by default) after
     * every unpinned one; the hard-pinned one never does. */
    CHECK_STATUS(put_pinned(&f, "huge", 8192, 0, 0, 0), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "soft-long"), 0);
    CHECK_EQ_INT(EXISTS(&f, "hard"), 1);
    CHECK_EQ_U64(kvs__master_counter(f.m, "soft_pin_evictions"), 1);
    CHECK_STATUS(put_pinned(&f, "no-room", 2048, 0, 0, 0), KVS_OK); /* evicts "huge" */
    CHECK_EQ_INT(EXISTS(&f, "hard"), 1);
    /* An explicit remove still takes a hard-pinned object. */
    CHECK_STATUS(REMOVE(&f, "hard", 0), KVS_OK);
    fx_fini(&f);
}

/* With --allow-evict-soft-pinned 0 a soft-pinned object is never evicted while pinned. */
static void test_soft_pins_kept_when_not_allowed(void)
{
    fx_t f;
    kvs__master_config_t cfg;
    CHECK_STATUS(kvs__master_config_init(&cfg), KVS_OK);
    cfg.allow_evict_soft_pinned = false;
    CHECK_STATUS(kvs__master_create(&cfg, &f.m), KVS_OK);
    kvs__arena_init(&f.arena);
    f.now = 1000 * MS;
    f.client = kvs__master_new_client(f.m);
    mount(&f, f.client, "s1", "n", 4 << 10);
    CHECK_STATUS(put_pinned(&f, "soft", 2048, 0, 1, 0), KVS_OK); /* the default TTL (30 min) */
    CHECK_STATUS(put_pinned(&f, "a", 2048, 0, 0, 0), KVS_OK);
    CHECK_STATUS(put_pinned(&f, "b", 2048, 0, 0, 0), KVS_OK); /* evicts a */
    CHECK_EQ_INT(EXISTS(&f, "a"), 0);
    CHECK_STATUS(put_pinned(&f, "c", 4096, 0, 0, 0), KVS_NO_AVAILABLE_HANDLE);
    CHECK_EQ_INT(EXISTS(&f, "soft"), 1);
    /* ENABLE with a TTL of 0 and DISABLE clear the pin (an upsert with PRESERVE keeps it). */
    CHECK_STATUS(put_pinned(&f, "soft", 2048, KVS_PUT_FLAG_UPSERT, 0, 0), KVS_OK);
    CHECK_STATUS(put_pinned(&f, "c", 4096, 0, 0, 0), KVS_NO_AVAILABLE_HANDLE);
    CHECK_STATUS(put_pinned(&f, "soft", 2048, KVS_PUT_FLAG_UPSERT | KVS_PUT_FLAG_PIN_TTL, 1, 0),
                 KVS_OK);
    CHECK_STATUS(put_pinned(&f, "c", 4096, 0, 0, 0), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "soft"), 0);
    fx_fini(&f);
}

/* An upsert's version is invisible until its end, which swaps it in; a reader's lease keeps the
 * old version's space; a revoked upsert leaves the old version. */
static void test_upsert_swap(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 64 << 10);
    CHECK_STATUS(put_pinned(&f, "k", 1000, 0, 0, 0), KVS_OK);
    kvs__obj_desc_t old;
    CHECK_STATUS(lookup(&f, "k", &old), KVS_OK); /* a reader holds a lease on version 1 */
    kvs__obj_desc_t d;
    CHECK_STATUS(put_start_ex(&f, "k", 2000, 1, "n", "", 0, NULL), KVS_OBJECT_ALREADY_EXISTS);
    CHECK_STATUS(put_start_ex(&f, "k", 2000, 1, "n", "", KVS_PUT_FLAG_UPSERT, &d), KVS_OK);
    CHECK(d.reps[0].offset != old.reps[0].offset);
    /* A second writer while it is open: not ready. */
    CHECK_STATUS(put_start_ex(&f, "k", 3000, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL),
                 KVS_REPLICA_IS_NOT_READY);
    kvs__obj_desc_t now;
    CHECK_STATUS(lookup(&f, "k", &now), KVS_OK);
    CHECK_EQ_U64(now.size, 1000); /* still version 1 */
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", &now), KVS_OK);
    CHECK_EQ_U64(now.size, 2000);
    CHECK_EQ_U64(now.reps[0].offset, d.reps[0].offset);
    CHECK_EQ_U64(kvs__master_counter(f.m, "tombstones"), 1); /* version 1 was leased */
    /* A revoked upsert: the current version stays. */
    CHECK_STATUS(put_start_ex(&f, "k", 500, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_STATUS(REVOKE(&f, "k"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", &now), KVS_OK);
    CHECK_EQ_U64(now.size, 2000);
    /* A remove while an upsert is open orphans it: its end finds no key. */
    CHECK_STATUS(put_start_ex(&f, "k", 700, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OBJECT_NOT_FOUND);
    /* An upsert of an absent key is a put. */
    CHECK_STATUS(put_pinned(&f, "fresh", 100, KVS_PUT_FLAG_UPSERT, 0, 0), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "fresh"), 1);
    fx_fini(&f);
}

static uint64_t seg_used(fx_t *f, uint64_t id);
static void release(fx_t *f, uint64_t client, const char *key, uint64_t lease_id);

/* A tombstone's space is free again as soon as its readers have released their leases, not
 * only at the end of the longest lease (replacements under reads filled segments with
 * tombstones for 10 s each, and evicted live objects for them). */
static void test_tombstone_ends_with_its_last_release(void)
{
    fx_t f;
    fx_init(&f, 10000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    uint64_t other = kvs__master_new_client(f.m);
    CHECK_STATUS(put_pinned(&f, "k", 4096, 0, 0, 0), KVS_OK);
    kvs__obj_desc_t a, b;
    CHECK_STATUS(lookup(&f, "k", &a), KVS_OK); /* two readers lease version 1 */
    uint64_t client = f.client;
    f.client = other;
    CHECK_STATUS(lookup(&f, "k", &b), KVS_OK);
    f.client = client;
    uint64_t one = seg_used(&f, s1);
    CHECK_STATUS(put_start_ex(&f, "k", 4096, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK); /* version 1 is a tombstone now */
    CHECK_EQ_U64(seg_used(&f, s1), 2 * one);
    release(&f, other, "k", a.lease_id); /* not its lease: nothing */
    release(&f, f.client, "k", a.lease_id);
    CHECK_EQ_U64(seg_used(&f, s1), 2 * one); /* the other reader still reads */
    release(&f, f.client, "k", a.lease_id);  /* twice: nothing more */
    f.now += 1 * MS;
    release(&f, other, "k", b.lease_id);
    CHECK_EQ_U64(seg_used(&f, s1), one); /* freed at once, 10 s before the leases' end */
    CHECK_EQ_U64(counter(&f, "lease_releases"), 2);
    /* A forced remove of a leased object: the same. */
    CHECK_STATUS(lookup(&f, "k", &a), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_EQ_U64(seg_used(&f, s1), one);
    release(&f, f.client, "k", a.lease_id);
    CHECK_EQ_U64(seg_used(&f, s1), 0);
    /* Unreleased, a tombstone lasts its lease. */
    CHECK_STATUS(put_pinned(&f, "k", 4096, 0, 0, 0), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", &a), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK);
    uint64_t t0 = f.now;
    while (f.now < t0 + 9999 * MS) { /* the owner keeps its segment */
        f.now = KVS_MIN(f.now + 500 * MS, t0 + 9999 * MS);
        heartbeat_ack(&f, f.client, s1, 0, NULL);
        kvs__master_tick(f.m, f.now);
    }
    CHECK_EQ_U64(seg_used(&f, s1), one);
    f.now += 2 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(seg_used(&f, s1), 0);
    fx_fini(&f);
}

/* A version with an upsert open is never evicted: under pressure (the segment over its
 * watermark, the version least recently used) the upsert still ends and replaces it. */
static void test_upsert_survives_eviction(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 64 << 10);
    kvs__obj_desc_t now;
    CHECK_STATUS(put_pinned(&f, "lru", 8 << 10, 0, 0, 0), KVS_OK);
    CHECK_STATUS(put_pinned(&f, "fill", 40 << 10, 0, 0, 0), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "lru", 12 << 10, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_EQ_INT(EXISTS(&f, "lru"), 1);
    CHECK_STATUS(END(&f, "lru"), KVS_OK);
    CHECK_STATUS(lookup(&f, "lru", &now), KVS_OK);
    CHECK_EQ_U64(now.size, 12 << 10);
    CHECK_EQ_INT(EXISTS(&f, "fill"), 0); /* the next least recently used went instead */
    /* The objects counter does not count upsert versions (it used to underflow). */
    CHECK_STATUS(put_start_ex(&f, "lru", 4 << 10, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_EQ_U64(kvs__master_counter(f.m, "objects"), 1);
    CHECK_STATUS(REMOVE(&f, "lru", KVS_KEYS_FLAG_FORCE), KVS_OK); /* orphans the upsert */
    CHECK_EQ_U64(kvs__master_counter(f.m, "objects"), 0);
    fx_fini(&f);
}

static void test_eviction_skips_leased(void)
{
    fx_t f;
    fx_init(&f, 10000);
    mount(&f, f.client, "s1", "n", 256 * KIB); /* 4 blocks of 64 KiB */
    CHECK_STATUS(put_start(&f, "k0", 64 * KIB), KVS_OK);
    CHECK_STATUS(END(&f, "k0"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k0", NULL), KVS_OK); /* leased for 10 s */
    CHECK_STATUS(put_start(&f, "k1", 64 * KIB), KVS_OK);
    CHECK_STATUS(END(&f, "k1"), KVS_OK);
    CHECK_STATUS(put_start(&f, "k2", 64 * KIB), KVS_OK);
    CHECK_STATUS(END(&f, "k2"), KVS_OK);
    /* LRU order, oldest first: k0 (leased), k1, k2. Filling to 100% evicts one: k1. */
    CHECK_STATUS(put_start(&f, "k3", 64 * KIB), KVS_OK);
    CHECK_EQ_U64(counter(&f, "evictions"), 1);
    CHECK_EQ_INT(EXISTS(&f, "k0"), 1);
    CHECK_EQ_INT(EXISTS(&f, "k1"), 0);
    CHECK_EQ_INT(EXISTS(&f, "k2"), 1);
    fx_fini(&f);
}

static void test_liveness(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t other = kvs__master_new_client(f.m);
    mount(&f, f.client, "s1", "n1", 1 << 20);
    mount(&f, other, "s2", "n2", 1 << 20);
    CHECK_STATUS(put_start_ex(&f, "k", 100, 2, "n1", "", 0, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "only1", 100, 1, "n1", "s1", 0, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "only1"), KVS_OK);
    uint64_t t0 = f.now;
    f.now = t0 + 900 * MS;
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, other, NULL, NULL, NULL), KVS_OK);
    f.now = t0 + 999 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 2);
    f.now = t0 + 1000 * MS; /* s1's owner silent for the whole time-out */
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 1);
    CHECK_EQ_U64(counter(&f, "segments_expired"), 1);
    CHECK_STATUS(lookup(&f, "only1", NULL), KVS_OBJECT_NOT_FOUND);
    kvs__obj_desc_t d;
    CHECK_STATUS(lookup(&f, "k", &d), KVS_OK); /* its other replica survives */
    CHECK_EQ_INT(d.nreps, 1);
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL),
                 KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, 0, NULL, NULL, NULL), KVS_INVALID_PARAMS);
    f.now = t0 + 1900 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 0);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_U64(counter(&f, "objects"), 0);
    fx_fini(&f);
}

static void test_put_discard(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    kvs__obj_desc_t dold, dyoung;
    CHECK_STATUS(put_start_ex(&f, "old", 1000, 1, "n", "", 0, &dold), KVS_OK);
    f.now += 1000 * MS;
    CHECK_STATUS(put_start_ex(&f, "young", 1000, 1, "n", "", 0, &dyoung), KVS_OK);
    f.now += 1000 * MS; /* "old" has waited 2 s */
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL), KVS_OK);
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "puts_discarded"), 1);
    CHECK_STATUS(END(&f, "old"), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(END(&f, "young"), KVS_OK);
    /* The discarded put's space waits for its fence; the ended put is fenced too (its writes
     * are over), its space in use by its object. */
    CHECK_EQ_U64(counter(&f, "used_bytes"), 2048);
    kvs__fence_t *fences;
    CHECK_EQ_INT(heartbeat_ack(&f, f.client, s1, 0, &fences), 2);
    CHECK_EQ_U64(fences[0].token, dold.token);
    CHECK_EQ_U64(fences[1].token, dyoung.token);
    CHECK_EQ_U64(fences[1].epoch, dyoung.cap_epoch);
    CHECK_EQ_INT(heartbeat_ack(&f, f.client, fences[1].segment_id, fences[1].seq, NULL), 0);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 1024);
    fx_fini(&f);
}

static void test_placement(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t a1 = mount(&f, f.client, "a1", "nodeA", 1 << 20);
    uint64_t a2 = mount(&f, f.client, "a2", "nodeA", 1 << 20);
    uint64_t b1 = mount(&f, f.client, "b1", "nodeB", 1 << 20);
    /* Default: spread, each key to the segment with most free space. */
    kvs__obj_desc_t d[3];
    CHECK_STATUS(put_start_ex(&f, "s0", 4096, 1, "nodeB", "", 0, &d[0]), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "s1", 4096, 1, "nodeB", "", 0, &d[1]), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "s2", 4096, 1, "nodeB", "", 0, &d[2]), KVS_OK);
    CHECK(d[0].reps[0].segment_id != d[1].reps[0].segment_id);
    CHECK(d[0].reps[0].segment_id != d[2].reps[0].segment_id);
    CHECK(d[1].reps[0].segment_id != d[2].reps[0].segment_id);
    /* Same node: a batch from nodeB lands on b1, all of it. */
    kvs__put_item_t items[5];
    char keys[5][8];
    for (int i = 0; i < 5; i++) {
        snprintf(keys[i], sizeof(keys[i]), "b%d", i);
        items[i] = (kvs__put_item_t){.key = kvs__str_c(keys[i]), .size = 8192};
    }
    kvs__put_start_req_t req = {.node = kvs__str_c("nodeB"),
                                .replica_num = 1,
                                .preferred_segment = kvs__str_c(""),
                                .flags = KVS_PUT_FLAG_SAME_NODE,
                                .nitems = 5,
                                .items = items};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_put_start(f.m, f.now, f.client, &req, &f.arena, &rsp), KVS_OK);
    for (int i = 0; i < 5; i++) {
        CHECK_STATUS(rsp.objs[i].status, KVS_OK);
        CHECK_EQ_U64(rsp.objs[i].reps[0].segment_id, b1);
    }
    CHECK_EQ_INT(rsp.nsegs, 1);
    /* Same node from nodeA: co-located on one of A's segments. */
    for (int i = 0; i < 5; i++)
        keys[i][0] = 'a';
    req.node = kvs__str_c("nodeA");
    CHECK_STATUS(kvs__master_put_start(f.m, f.now, f.client, &req, &f.arena, &rsp), KVS_OK);
    uint64_t first = rsp.objs[0].reps[0].segment_id;
    CHECK(first == a1 || first == a2);
    for (int i = 1; i < 5; i++)
        CHECK_EQ_U64(rsp.objs[i].reps[0].segment_id, first);
    /* Preferred segment first; replicas on distinct segments; no more than exist. */
    kvs__obj_desc_t p;
    CHECK_STATUS(put_start_ex(&f, "pref", 4096, 1, "nodeA", "b1", 0, &p), KVS_OK);
    CHECK_EQ_U64(p.reps[0].segment_id, b1);
    CHECK_STATUS(put_start_ex(&f, "r2", 4096, 2, "nodeA", "", 0, &p), KVS_OK);
    CHECK_EQ_INT(p.nreps, 2);
    CHECK(p.reps[0].segment_id != p.reps[1].segment_id);
    CHECK_STATUS(put_start_ex(&f, "r9", 4096, 9, "nodeA", "", 0, &p), KVS_OK);
    CHECK_EQ_INT(p.nreps, 3);
    fx_fini(&f);
}

static void test_unmount_and_list(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    mount(&f, f.client, "s2", "n", 1 << 20);
    CHECK_STATUS(put_start_ex(&f, "on1", 10, 1, "n", "s1", 0, NULL), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "both", 10, 2, "n", "", 0, NULL), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "on2", 10, 1, "n", "s2", 0, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "on1"), KVS_OK);
    CHECK_STATUS(END(&f, "both"), KVS_OK);
    kvs__list_req_t lr = {kvs__str_c("o"), 0, 0};
    kvs__list_rsp_t ls;
    CHECK_STATUS(kvs__master_list(f.m, &lr, &f.arena, &ls), KVS_OK);
    CHECK_EQ_INT(ls.nentries, 2);
    CHECK(!ls.truncated);
    lr = (kvs__list_req_t){kvs__str_c(""), 2, 0};
    CHECK_STATUS(kvs__master_list(f.m, &lr, &f.arena, &ls), KVS_OK);
    CHECK_EQ_INT(ls.nentries, 2);
    CHECK(ls.truncated);
    CHECK_STATUS(kvs__master_unmount(f.m, f.client, s1), KVS_OK);
    CHECK_STATUS(lookup(&f, "on1", NULL), KVS_OBJECT_NOT_FOUND);
    kvs__obj_desc_t d;
    CHECK_STATUS(lookup(&f, "both", &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 1);
    CHECK_STATUS(END(&f, "on2"), KVS_OK);
    CHECK_EQ_U64(counter(&f, "segments_unmounted"), 1);
    CHECK_EQ_U64(counter(&f, "objects"), 2);
    fx_fini(&f);
}

/* A listing of KVS_MAX_BATCH keys of the longest length (67 MB of entries) comes in pages that
 * each fit a frame, and together list every key exactly once. (One reply used to outgrow the
 * frame: `ls --limit 65536` answered "malformed".) */
static void test_list_pages_cover_the_largest_listing(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n", 1ull << 40);
    const uint32_t n = KVS_MAX_BATCH;
    char *key = malloc(KVS_MAX_KEY_LEN + 1);
    CHECK(key != NULL);
    memset(key, 'k', KVS_MAX_KEY_LEN);
    key[KVS_MAX_KEY_LEN] = '\0';
    for (uint32_t i = 0; i < n; i++) {
        char head[16];
        snprintf(head, sizeof(head), "%08x", i);
        memcpy(key, head, 8);
        CHECK_STATUS(put_start_ex(&f, key, 1, 1, "n", "", 0, NULL), KVS_OK);
        CHECK_STATUS(END(&f, key), KVS_OK);
    }
    uint8_t *seen = calloc(n, 1);
    CHECK(seen != NULL);
    kvs__list_req_t lr = {kvs__str_c(""), n, 0};
    uint32_t total = 0, pages = 0;
    for (;;) {
        kvs__arena_t a;
        kvs__arena_init(&a);
        kvs__list_rsp_t ls;
        CHECK_STATUS(kvs__master_list(f.m, &lr, &a, &ls), KVS_OK);
        /* The page fits one frame. */
        kvs__wbuf_t w;
        kvs__wbuf_init(&w);
        kvs__frame_begin(&w, KVS_MSG_LIST | KVS_RSP_FLAG, 1, KVS_PROTO_VERSION_MAX);
        kvs__list_rsp_encode(&w, &ls);
        CHECK_STATUS(kvs__frame_end(&w), KVS_OK);
        kvs__wbuf_free(&w);
        for (uint32_t i = 0; i < ls.nentries; i++) {
            CHECK_EQ_U64(ls.entries[i].key.len, KVS_MAX_KEY_LEN);
            unsigned idx = 0;
            CHECK_EQ_INT(sscanf(ls.entries[i].key.ptr, "%8x", &idx), 1);
            CHECK(idx < n);
            CHECK_EQ_INT(seen[idx], 0);
            seen[idx] = 1;
        }
        total += ls.nentries;
        pages++;
        kvs__arena_free(&a);
        if (!ls.truncated)
            break;
        CHECK(ls.next_cursor != 0);
        lr.cursor = ls.next_cursor;
        lr.limit = n - total;
    }
    CHECK_EQ_U64(total, n);
    CHECK_CMP_U64(pages, >=, 2);
    free(seen);
    free(key);
    fx_fini(&f);
}

/* Pages of one entry each still list every key once: a page may end inside a hash bucket
 * (a cursor that only named buckets answered "truncated" with nowhere to resume). */
static void test_list_pages_of_one_entry(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n", 1 << 30);
    enum { N = 300 };
    for (int i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof(key), "key-%d", i);
        CHECK_STATUS(put_start_ex(&f, key, 1, 1, "n", "", 0, NULL), KVS_OK);
        CHECK_STATUS(END(&f, key), KVS_OK);
    }
    bool seen[N] = {false};
    kvs__list_req_t lr = {kvs__str_c("key-"), 1, 0};
    int total = 0;
    for (int page = 0; page <= N; page++) {
        kvs__list_rsp_t ls;
        CHECK_STATUS(kvs__master_list(f.m, &lr, &f.arena, &ls), KVS_OK);
        CHECK_CMP_U64(ls.nentries, <=, 1);
        for (uint32_t i = 0; i < ls.nentries; i++) {
            char k[16] = {0};
            CHECK_CMP_U64(ls.entries[i].key.len, <, sizeof(k));
            memcpy(k, ls.entries[i].key.ptr, ls.entries[i].key.len);
            int idx = atoi(k + 4);
            CHECK(idx >= 0 && idx < N && !seen[idx]);
            seen[idx] = true;
            total++;
        }
        if (!ls.truncated)
            break;
        CHECK(ls.next_cursor != 0);
        lr.cursor = ls.next_cursor;
    }
    CHECK_EQ_INT(total, N);
    fx_fini(&f);
}

static void test_alloc_failure_leaves_store_unchanged(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "a", 10), KVS_OK);
    uint64_t used = counter(&f, "used_bytes"), objs = counter(&f, "objects_pending");
    for (long k = 0; k < 6; k++) {
        kvs__alloc_inject_failure(k, true);
        int rc = put_start(&f, "b", 10);
        kvs__alloc_inject_failure(-1, false);
        if (rc == KVS_OK) {
            CHECK_STATUS(REVOKE(&f, "b"), KVS_OK);
            continue;
        }
        CHECK_STATUS(rc, KVS_NO_MEMORY);
        CHECK_EQ_U64(counter(&f, "used_bytes"), used);
        CHECK_EQ_U64(counter(&f, "objects_pending"), objs);
        CHECK_STATUS(lookup(&f, "b", NULL), KVS_OBJECT_NOT_FOUND);
    }
    fx_fini(&f);
}

/* Only the client that started a put may end or revoke it; anyone else is refused and the put
 * is left as it was. (Before, PUT_END and PUT_REVOKE acted on the key name alone.) */
static void test_only_the_writer_ends_or_revokes(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    uint64_t other = kvs__master_new_client(f.m);
    CHECK(other != f.client);
    CHECK_STATUS(put_start(&f, "k", 100), KVS_OK);
    CHECK_STATUS(writer_op(&f, kvs__master_put_end, "k", other), KVS_INVALID_WRITE);
    CHECK_STATUS(writer_op(&f, kvs__master_put_revoke, "k", other), KVS_INVALID_WRITE);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_REPLICA_IS_NOT_READY); /* still pending */
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OK);
    CHECK_STATUS(put_start(&f, "k2", 100), KVS_OK);
    CHECK_STATUS(writer_op(&f, kvs__master_put_revoke, "k2", 0), KVS_INVALID_WRITE);
    CHECK_STATUS(REVOKE(&f, "k2"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k2", NULL), KVS_OBJECT_NOT_FOUND);
    fx_fini(&f);
}

/* A forced remove of a leased object leaves a tombstone: the key is gone at once, the space
 * only when the lease ends, so a reader inside its lease cannot see another object there. */
static void test_forced_remove_keeps_leased_space(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "k", 4096), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    uint64_t used = counter(&f, "used_bytes");
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OK); /* a reader's lease, 1000 ms */
    CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_U64(counter(&f, "used_bytes"), used); /* still held */
    CHECK_EQ_U64(counter(&f, "tombstones"), 1);
    CHECK_STATUS(put_start(&f, "k", 4096), KVS_OK); /* the key is free: a new object */
    f.now += 999 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 2 * used);
    CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL), KVS_OK);
    f.now += 2 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "used_bytes"), used); /* the lease ended: space back */
    /* Without a lease a forced remove frees at once. */
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_EQ_U64(counter(&f, "used_bytes"), 0);
    fx_fini(&f);
}

/* A pending put removed by someone else: its writer may still be copying into a same-host
 * mapping, which no owner fence stops. The space waits for the fence and for the writer to be
 * done (its end or revoke of that key, or its connection gone). */
static void test_pending_remove_waits_for_the_writer(void)
{
    fx_t f;
    fx_init(&f, 10000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    uint64_t writer = kvs__master_new_client(f.m);
    for (int how = 0; how < 2; how++) {
        kvs__put_item_t it = {.key = kvs__str_c("p"), .size = 1 << 20};
        kvs__put_start_req_t ps = {.node = kvs__str_c("n"),
                                   .replica_num = 1,
                                   .preferred_segment = kvs__str_c(""),
                                   .nitems = 1,
                                   .items = &it};
        kvs__placement_rsp_t pr;
        CHECK_STATUS(kvs__master_put_start(f.m, f.now, writer, &ps, &f.arena, &pr), KVS_OK);
        CHECK_STATUS(pr.objs[0].status, KVS_OK);
        CHECK_STATUS(REMOVE(&f, "p", KVS_KEYS_FLAG_FORCE), KVS_OK); /* by another client */
        kvs__fence_t *fences;
        CHECK_EQ_INT(heartbeat_ack(&f, f.client, s1, 0, &fences), 1);
        CHECK_EQ_INT(heartbeat_ack(&f, f.client, s1, fences[0].seq, NULL), 0);
        CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20); /* fenced, the writer not done */
        CHECK_STATUS(put_start(&f, "q", 1), KVS_NO_AVAILABLE_HANDLE);
        if (how == 0) {
            /* The writer's end of the key (refused: the put is gone) says it is done. */
            CHECK_STATUS(writer_op(&f, kvs__master_put_end, "p", writer), KVS_OBJECT_NOT_FOUND);
        } else {
            /* A reconnection is no departure; the put discard time (2 s) without a connection
             * is. */
            kvs__master_client_connected(f.m, f.now, writer);
            kvs__master_client_disconnected(f.m, f.now, writer);
            kvs__master_client_connected(f.m, f.now, writer);
            for (int t = 0; t < 10; t++) {
                f.now += 500 * MS;
                CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL), KVS_OK);
                kvs__master_tick(f.m, f.now);
            }
            CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20); /* 5 s, still connected */
            kvs__master_client_disconnected(f.m, f.now, writer);
            for (int t = 0; t < 3; t++) {
                f.now += 500 * MS;
                CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL), KVS_OK);
                kvs__master_tick(f.m, f.now);
            }
            CHECK_EQ_U64(counter(&f, "used_bytes"), 1 << 20); /* gone 1.5 s */
            f.now += 600 * MS;
            CHECK_STATUS(kvs__master_heartbeat(f.m, f.now, f.client, NULL, NULL, NULL), KVS_OK);
            kvs__master_tick(f.m, f.now);
        }
        CHECK_EQ_U64(counter(&f, "used_bytes"), 0);
    }
    fx_fini(&f);
}

/* Releases lease `lease_id` of `client` on `key`. */
static void release(fx_t *f, uint64_t client, const char *key, uint64_t lease_id)
{
    kvs__lease_release_t r = {kvs__str_c(key), lease_id};
    CHECK_STATUS(kvs__master_release(f->m, f->now, client, &r, 1), KVS_OK);
}

/* A lookup of `key` by `client`; returns the lease id it granted. */
static uint64_t lookup_as(fx_t *f, uint64_t client, const char *key)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t req = {.nkeys = 1, .keys = &k};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_lookup(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.objs[0].status, KVS_OK);
    CHECK(rsp.objs[0].lease_id != 0);
    return rsp.objs[0].lease_id;
}

/* Each lookup holds its own lease, named by its id; a release ends that one lease only (not
 * the client's later ones, not other clients'), expiry ends the rest. */
static void test_leases_per_reader(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "k", 100), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    uint64_t other = kvs__master_new_client(f.m);
    uint64_t a = lookup_as(&f, f.client, "k"), b = lookup_as(&f, f.client, "k");
    uint64_t o = lookup_as(&f, other, "k");
    CHECK(a != b);
    release(&f, f.client, "k", a);
    release(&f, f.client, "k", a); /* twice: the second names no lease */
    release(&f, f.client, "k", o); /* another client's lease: not ours to end */
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OBJECT_HAS_LEASE); /* b and o */
    release(&f, f.client, "k", b);
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OBJECT_HAS_LEASE); /* o */
    release(&f, other, "k", o);
    CHECK_EQ_U64(counter(&f, "lease_releases"), 3);
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OK);

    /* A late release of an expired lease must not end a newer lease of the same client on the
     * same object: the stale read's release used to decrement the count the new read set. */
    CHECK_STATUS(put_start(&f, "e", 100), KVS_OK);
    CHECK_STATUS(END(&f, "e"), KVS_OK);
    uint64_t old = lookup_as(&f, f.client, "e");
    f.now += 1001 * MS; /* old's lease has ended */
    uint64_t fresh = lookup_as(&f, f.client, "e");
    CHECK(fresh != old);
    release(&f, f.client, "e", old);
    CHECK_STATUS(REMOVE(&f, "e", 0), KVS_OBJECT_HAS_LEASE);
    /* Unreleased leases still end by expiry. */
    f.now += 1000 * MS;
    CHECK_STATUS(REMOVE(&f, "e", 0), KVS_OK);
    fx_fini(&f);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A hot key (a shared prompt prefix) read by many: every lookup holds a lease until its reader
 * releases it or it ends. A release used to scan all of the key's leases, twice, so R leases
 * cost O(R) per release and 1536-key lookups slowed from 0.5 to 4-6 ms once each key held 1000.
 * 50,000 leases released in random order must cost well under a second of CPU (the scan took
 * seconds), and each release still ends exactly its own lease. */
static void test_many_leases_on_one_key(void)
{
    enum { N = 50000, CLIENTS = 4 };
    fx_t f;
    fx_init(&f, 60000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "hot", 100), KVS_OK);
    CHECK_STATUS(END(&f, "hot"), KVS_OK);
    uint64_t clients[CLIENTS] = {f.client};
    for (int c = 1; c < CLIENTS; c++)
        clients[c] = kvs__master_new_client(f.m);
    uint64_t *ids = malloc(N * sizeof(*ids)), *sorted = malloc(N * sizeof(*sorted));
    uint32_t *order = malloc(N * sizeof(*order));
    CHECK(ids != NULL && sorted != NULL && order != NULL);
    for (uint32_t i = 0; i < N; i++) {
        ids[i] = lookup_as(&f, clients[i % CLIENTS], "hot");
        kvs__arena_free(&f.arena); /* each lookup's placement */
        kvs__arena_init(&f.arena);
        f.now += 1000; /* 1 us apart */
    }
    memcpy(sorted, ids, N * sizeof(*ids));
    qsort(sorted, N, sizeof(*sorted), cmp_u64);
    for (uint32_t i = 1; i < N; i++)
        CHECK(sorted[i] != sorted[i - 1]); /* every grant has an id of its own */
    uint64_t rng = 12345;
    for (uint32_t i = 0; i < N; i++)
        order[i] = i;
    for (uint32_t i = N - 1; i > 0; i--) { /* a fixed shuffle */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t j = (uint32_t)((rng >> 33) % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    uint32_t keep = order[N / 2]; /* one lease stays */
    uint64_t before = counter(&f, "lease_releases");
    for (uint32_t i = 0; i < N; i++) /* every lease released by another client: nothing */
        release(&f, clients[(i + 1) % CLIENTS], "hot", ids[i]);
    CHECK_EQ_U64(counter(&f, "lease_releases"), before);
    double t0 = thread_cpu_s();
    for (uint32_t q = 0; q < N; q++) {
        uint32_t i = order[q];
        if (i == keep)
            continue;
        release(&f, clients[(i + 1) % CLIENTS], "hot", ids[i]); /* another client's: nothing */
        release(&f, clients[i % CLIENTS], "hot", ids[i]);
        release(&f, clients[i % CLIENTS], "hot", ids[i]); /* twice: nothing more */
    }
    double took = thread_cpu_s() - t0;
    printf("  %d leases on one key: %.1f ms of CPU for %d releases (and twice as many that "
           "name no lease)\n",
           N, took * 1e3, N - 1);
    CHECK_EQ_U64(counter(&f, "lease_releases") - before, N - 1);
    CHECK(took < 1.0);
    CHECK_STATUS(REMOVE(&f, "hot", 0), KVS_OBJECT_HAS_LEASE); /* `keep` still holds */
    release(&f, clients[keep % CLIENTS], "hot", ids[keep]);
    CHECK_STATUS(REMOVE(&f, "hot", 0), KVS_OK);

    /* A lease on a removed version (now in its tombstone, found through the key's chain)
     * never ends one on the next version of the same key, even from the same client. */
    CHECK_STATUS(put_start(&f, "v", 100), KVS_OK);
    CHECK_STATUS(END(&f, "v"), KVS_OK);
    uint64_t old = lookup_as(&f, f.client, "v");
    CHECK_STATUS(REMOVE(&f, "v", KVS_KEYS_FLAG_FORCE), KVS_OK);
    CHECK_STATUS(put_start(&f, "v", 100), KVS_OK);
    CHECK_STATUS(END(&f, "v"), KVS_OK);
    uint64_t fresh = lookup_as(&f, f.client, "v");
    before = counter(&f, "lease_releases");
    release(&f, f.client, "v", old); /* ends the tombstone's lease */
    CHECK_EQ_U64(counter(&f, "lease_releases") - before, 1);
    CHECK_STATUS(REMOVE(&f, "v", 0), KVS_OBJECT_HAS_LEASE); /* fresh still holds */
    release(&f, f.client, "v", fresh);
    CHECK_STATUS(REMOVE(&f, "v", 0), KVS_OK);

    free(ids);
    free(sorted);
    free(order);
    fx_fini(&f);
}

/* Lease ids run up by one per grant from each object's start and skip 0 (no lease) when they
 * wrap: grants across the wrap keep distinct ids, and each release still ends its own lease. A
 * start near 2^64 (a test-only setting; it is random per object otherwise) crosses it. */
static void test_lease_ids_across_their_wrap(void)
{
    fx_lease_id_start = UINT64_MAX - 2;
    fx_t f;
    fx_init(&f, 1000);
    fx_lease_id_start = 0;
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "k", 100), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    uint64_t id[6];
    for (int i = 0; i < 6; i++) {
        id[i] = lookup_as(&f, f.client, "k");
        for (int j = 0; j < i; j++)
            CHECK(id[j] != id[i]);
    }
    CHECK_EQ_U64(id[0], UINT64_MAX - 2);
    CHECK_EQ_U64(id[3], 1); /* past UINT64_MAX, 0 skipped */
    uint64_t before = counter(&f, "lease_releases");
    const int order[6] = {4, 1, 5, 0, 2, 3};
    for (int q = 0; q < 6; q++) {
        CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OBJECT_HAS_LEASE);
        release(&f, f.client, "k", id[order[q]]);
        CHECK_EQ_U64(counter(&f, "lease_releases") - before, (uint64_t)q + 1);
    }
    CHECK_STATUS(REMOVE(&f, "k", 0), KVS_OK);
    fx_fini(&f);
}

/* A full lease array that compaction leaves with room but not a quarter of it grows; when that
 * growth fails for memory the grant still takes the freed slot (it used to fail the lookup). */
static void test_lease_grant_survives_a_failed_growth(void)
{
    fx_t f;
    fx_init(&f, 1000);
    mount(&f, f.client, "s1", "n", 1 << 20);
    CHECK_STATUS(put_start(&f, "k", 100), KVS_OK);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    uint64_t id[8];
    for (int i = 0; i < 8; i++) /* the array grows 2, 4, 8: full */
        id[i] = lookup_as(&f, f.client, "k");
    release(&f, f.client, "k", id[3]);  /* a released slot mid-array: compaction frees 1 of 8 */
    kvs__alloc_inject_failure(0, true); /* every allocation fails: the growth too */
    kvs__str_t k = kvs__str_c("k");
    kvs__keys_req_t req = {.nkeys = 1, .keys = &k};
    kvs__placement_rsp_t rsp;
    int rc = kvs__master_lookup(f.m, f.now, f.client, &req, &f.arena, &rsp);
    kvs__alloc_inject_failure(-1, false);
    CHECK_STATUS(rc, KVS_OK);
    CHECK_STATUS(rsp.objs[0].status, KVS_OK);
    CHECK(rsp.objs[0].lease_id != 0);
    fx_fini(&f);
}

/* A tombstone's space waits for the latest end of the leases still held on it: releasing the
 * latest one brings that end forward to the next one's, releasing an earlier one leaves it. */
static void test_tombstone_waits_for_its_latest_lease(void)
{
    fx_t f;
    fx_init(&f, 10000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    for (int latest_first = 1; latest_first >= 0; latest_first--) {
        CHECK_STATUS(put_pinned(&f, "k", 4096, 0, 0, 0), KVS_OK);
        uint64_t t0 = f.now;
        uint64_t early = lookup_as(&f, f.client, "k"); /* ends at t0 + 10 s */
        f.now += 4000 * MS;
        uint64_t late = lookup_as(&f, f.client, "k"); /* ends at t0 + 14 s */
        f.now += 1000 * MS;
        uint64_t mid = lookup_as(&f, f.client, "k");                /* ends at t0 + 15 s */
        CHECK_STATUS(REMOVE(&f, "k", KVS_KEYS_FLAG_FORCE), KVS_OK); /* a tombstone of three */
        uint64_t one = seg_used(&f, s1);
        CHECK(one > 0);
        if (latest_first) {
            release(&f, f.client, "k", mid);  /* the latest end goes: now t0 + 14 s */
            release(&f, f.client, "k", late); /* and the next: now t0 + 10 s */
        } else {
            release(&f, f.client, "k", early); /* not the latest: still t0 + 15 s */
        }
        uint64_t end = t0 + (latest_first ? 10000 : 15000) * MS;
        while (f.now + 500 * MS < end) { /* the owner keeps its segment */
            f.now += 500 * MS;
            heartbeat_ack(&f, f.client, s1, 0, NULL);
            kvs__master_tick(f.m, f.now);
            CHECK_EQ_U64(seg_used(&f, s1), one);
        }
        f.now = end + 1 * MS;
        heartbeat_ack(&f, f.client, s1, 0, NULL);
        kvs__master_tick(f.m, f.now);
        CHECK_EQ_U64(seg_used(&f, s1), 0);
    }
    fx_fini(&f);
}

/* Releases that name no lease on their key's object (a lease that ended, a retired version's,
 * or none) look for a tombstone holding them. They used to walk every tombstone in limbo, so
 * with T tombstones a stray release cost O(T): one 64 MiB request of them could stall the
 * master. Only the key's tombstones are looked at now: 100,000 stray releases among 4000
 * tombstones cost about what they cost beside one (the walk made it hundreds of times more), and
 * every tombstone still ends with its own reader's release. */
static void test_stray_releases_among_many_tombstones(void)
{
    enum { T = 4000, N = 100000 };
    fx_t f;
    fx_init(&f, 60000);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 256 << 20);
    CHECK_STATUS(put_start(&f, "probe", 100), KVS_OK);
    CHECK_STATUS(END(&f, "probe"), KVS_OK);
    uint64_t *lease = malloc(T * sizeof(*lease));
    CHECK(lease != NULL);
    char key[32];
    double cost[2] = {0, 0};
    for (uint32_t i = 0; i < T; i++) {
        snprintf(key, sizeof(key), "t%u", i);
        CHECK_STATUS(put_start(&f, key, 100), KVS_OK);
        CHECK_STATUS(END(&f, key), KVS_OK);
        lease[i] = lookup_as(&f, f.client, key);
        CHECK_STATUS(REMOVE(&f, key, KVS_KEYS_FLAG_FORCE), KVS_OK); /* a tombstone */
        kvs__arena_free(&f.arena);
        kvs__arena_init(&f.arena);
        if (i != 0 && i != T - 1)
            continue;
        uint64_t rng = 99, before = counter(&f, "lease_releases");
        double t0 = thread_cpu_s();
        for (uint32_t q = 0; q < N; q++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            /* No such lease: on the live key, or on a key whose tombstone is searched. */
            if (q % 2 == 0) {
                release(&f, f.client, "probe", rng | 1);
            } else {
                snprintf(key, sizeof(key), "t%u", (uint32_t)(rng >> 40) % (i + 1));
                release(&f, f.client, key, rng | 1);
            }
        }
        cost[i != 0] = thread_cpu_s() - t0;
        CHECK_EQ_U64(counter(&f, "lease_releases"), before);
    }
    printf("  %d stray releases: %.1f ms of CPU beside 1 tombstone, %.1f ms beside %d\n", N,
           cost[0] * 1e3, cost[1] * 1e3, T);
    CHECK(cost[1] < 20 * cost[0] + 0.05);
    CHECK_EQ_U64(counter(&f, "tombstones"), T);
    uint64_t all = seg_used(&f, s1);
    for (uint32_t i = 0; i < T; i++) {
        snprintf(key, sizeof(key), "t%u", i);
        release(&f, f.client, key, lease[i]);
    }
    CHECK_CMP_U64(seg_used(&f, s1), <, all);
    CHECK_EQ_U64(seg_used(&f, s1), all / (T + 1)); /* only the probe's space is in use */
    free(lease);
    fx_fini(&f);
}

/* Segment ids are random and never reused, so an id names one generation of a segment. */
static void test_segment_ids_are_never_reused(void)
{
    uint64_t seen[64];
    size_t n = 0;
    for (int round = 0; round < 8; round++) {
        fx_t f; /* a fresh master each round: as after a restart */
        fx_init(&f, 1000);
        for (int i = 0; i < 8; i++) {
            char name[16];
            snprintf(name, sizeof(name), "s%d", i);
            uint64_t id = mount(&f, f.client, name, "n", 1 << 16);
            CHECK(id != 0);
            for (size_t j = 0; j < n; j++)
                CHECK(seen[j] != id);
            seen[n++] = id;
        }
        fx_fini(&f);
    }
}

/* After a pause of the server (kvs__master_resumed), every owner has a whole heartbeat
 * time-out from the resume: silence it could not have heard does not count. */
static void test_resumed_restarts_owner_silence(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n1", 1 << 20);
    uint64_t t0 = f.now;
    f.now = t0 + 2500 * MS; /* the server did not run: 2.5 time-outs */
    kvs__master_resumed(f.m, f.now);
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 1);
    f.now += 999 * MS;
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 1);
    f.now += 1 * MS; /* silent for a whole time-out after the resume */
    kvs__master_tick(f.m, f.now);
    CHECK_EQ_U64(counter(&f, "segments"), 0);
    CHECK_EQ_U64(counter(&f, "segments_expired"), 1);
    fx_fini(&f);
}

/* Pauses that keep coming give a silent owner one grace, not one per pause: a dead owner still
 * expires. (Every pause used to restart every owner's time-out, so a master that stalled often
 * enough never dropped a dead owner.) */
static void test_repeated_pauses_grace_a_dead_owner_once(void)
{
    fx_t f;
    fx_init(&f, 100);
    mount(&f, f.client, "s1", "n1", 1 << 20);
    f.now += 900 * MS;
    kvs__master_resumed(f.m, f.now); /* grace: expiry no sooner than now + 1 s */
    for (int i = 0; i < 5; i++) {
        f.now += 300 * MS;
        kvs__master_resumed(f.m, f.now); /* more pauses: no more grace */
        kvs__master_tick(f.m, f.now);
        if (counter(&f, "segments") == 0)
            break;
    }
    CHECK_EQ_U64(counter(&f, "segments"), 0);
    CHECK_EQ_U64(counter(&f, "segments_expired"), 1);
    fx_fini(&f);
}

/* A put of `key` with a group and preferred segments (NULL: none). */
static int put_start_grouped(fx_t *f, const char *key, uint64_t size, uint32_t replicas,
                             const char *group, const char *const *pref, uint32_t npref,
                             kvs__obj_desc_t *d_p)
{
    kvs__str_t ps[KVS_MAX_REPLICAS];
    for (uint32_t i = 0; i < npref; i++)
        ps[i] = kvs__str_c(pref[i]);
    kvs__put_item_t it = {
        .key = kvs__str_c(key), .size = size, .group = kvs__str_c(group ? group : "")};
    kvs__put_start_req_t req = {.node = kvs__str_c("n"),
                                .replica_num = replicas,
                                .preferred_segment = kvs__str_c(""),
                                .nitems = 1,
                                .items = &it,
                                .npreferred_segments = npref,
                                .preferred_segments = ps};
    kvs__placement_rsp_t rsp;
    CHECK_STATUS(kvs__master_put_start(f->m, f->now, f->client, &req, &f->arena, &rsp), KVS_OK);
    if (d_p)
        *d_p = rsp.objs[0];
    return rsp.objs[0].status;
}

static int replica_clear(fx_t *f, uint64_t client, const char *key, const char *segment)
{
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t req = {.nkeys = 1, .keys = &k, .segment = kvs__str_c(segment)};
    kvs__status_list_rsp_t rsp;
    CHECK_STATUS(kvs__master_replica_clear(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    return rsp.results[0];
}

static uint64_t seg_used(fx_t *f, uint64_t id)
{
    kvs__stat_rsp_t st;
    CHECK_STATUS(kvs__master_stat(f->m, f->now, &f->arena, &st), KVS_OK);
    for (uint32_t i = 0; i < st.nsegs; i++) {
        if (st.segs[i].id == id)
            return st.segs[i].used;
    }
    CHECK(!"segment not in STAT");
    return 0;
}

/* Mooncake's BatchReplicaClear: only the writer's own objects, never pending or leased ones;
 * one segment's replicas or the whole object, and the space returns at once. */
static void test_replica_clear(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    uint64_t s2 = mount(&f, f.client, "s2", "n", 1 << 20);
    uint64_t other = kvs__master_new_client(f.m);
    kvs__obj_desc_t d;
    CHECK_STATUS(put_start_ex(&f, "k", 4096, 2, "n", "", 0, &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 2);
    CHECK_STATUS(replica_clear(&f, f.client, "k", ""), KVS_REPLICA_IS_NOT_READY);
    CHECK_STATUS(END(&f, "k"), KVS_OK);
    CHECK_STATUS(replica_clear(&f, other, "k", ""), KVS_INVALID_PARAMS);
    CHECK_STATUS(replica_clear(&f, f.client, "absent", ""), KVS_OBJECT_NOT_FOUND);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OK); /* a read lease for 100 ms */
    CHECK_STATUS(replica_clear(&f, f.client, "k", "s1"), KVS_OBJECT_HAS_LEASE);
    f.now += 101 * MS;
    CHECK(seg_used(&f, s1) > 0);
    CHECK_STATUS(replica_clear(&f, f.client, "k", "nowhere"), KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(replica_clear(&f, f.client, "k", "s1"), KVS_OK);
    CHECK_EQ_U64(seg_used(&f, s1), 0);
    CHECK(seg_used(&f, s2) > 0);
    CHECK_STATUS(lookup(&f, "k", &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 1);
    CHECK_EQ_U64(d.reps[0].segment_id, s2);
    f.now += 101 * MS;
    CHECK_STATUS(replica_clear(&f, f.client, "k", "s1"), KVS_SEGMENT_NOT_FOUND);
    /* Its last replica goes: the object goes. */
    CHECK_STATUS(replica_clear(&f, f.client, "k", "s2"), KVS_OK);
    CHECK_STATUS(lookup(&f, "k", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_U64(seg_used(&f, s2), 0);
    /* The whole object. */
    CHECK_STATUS(put_start_ex(&f, "w", 4096, 2, "n", "", 0, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "w"), KVS_OK);
    CHECK_STATUS(replica_clear(&f, f.client, "w", ""), KVS_OK);
    CHECK_STATUS(lookup(&f, "w", NULL), KVS_OBJECT_NOT_FOUND);
    CHECK_EQ_U64(seg_used(&f, s1) + seg_used(&f, s2), 0);
    CHECK_EQ_U64(counter(&f, "replicas_cleared"), 4); /* copies: 1 + 1, then 2 */
    /* An object with an upsert open is not ready. */
    CHECK_STATUS(put_start_ex(&f, "u", 4096, 1, "n", "", 0, NULL), KVS_OK);
    CHECK_STATUS(END(&f, "u"), KVS_OK);
    CHECK_STATUS(put_start_ex(&f, "u", 4096, 1, "n", "", KVS_PUT_FLAG_UPSERT, NULL), KVS_OK);
    CHECK_STATUS(replica_clear(&f, f.client, "u", ""), KVS_REPLICA_IS_NOT_READY);
    fx_fini(&f);
}

/* Objects of a group follow its first object, even where spread placement would not; the
 * group lives while it has objects. */
static void test_group_placement(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t ids[3] = {mount(&f, f.client, "s1", "n", 1 << 20),
                       mount(&f, f.client, "s2", "n", 1 << 20),
                       mount(&f, f.client, "s3", "n", 1 << 20)};
    kvs__obj_desc_t d;
    CHECK_STATUS(put_start_grouped(&f, "g0", 64 * KIB, 1, "req-1", NULL, 0, &d), KVS_OK);
    uint64_t home = d.reps[0].segment_id;
    CHECK_EQ_U64(counter(&f, "groups"), 1);
    /* Spread placement alone would now pick another (emptier) segment for each. */
    for (int i = 1; i < 8; i++) {
        char key[16];
        snprintf(key, sizeof(key), "g%d", i);
        CHECK_STATUS(put_start_grouped(&f, key, 64 * KIB, 1, "req-1", NULL, 0, &d), KVS_OK);
        CHECK_EQ_U64(d.reps[0].segment_id, home);
    }
    CHECK_STATUS(put_start_grouped(&f, "x", 64 * KIB, 1, NULL, NULL, 0, &d), KVS_OK);
    CHECK(d.reps[0].segment_id != home);
    CHECK_STATUS(put_start_grouped(&f, "h0", 64 * KIB, 1, "req-2", NULL, 0, &d), KVS_OK);
    CHECK(d.reps[0].segment_id != home);
    CHECK_EQ_U64(counter(&f, "groups"), 2);
    /* A full home: the group's objects go elsewhere, and it follows them there. */
    CHECK_STATUS(put_start_grouped(&f, "big", 900 * KIB, 1, "req-1", NULL, 0, &d), KVS_OK);
    CHECK(d.reps[0].segment_id != home);
    uint64_t spill = d.reps[0].segment_id;
    CHECK_STATUS(put_start_grouped(&f, "after", 4096, 1, "req-1", NULL, 0, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, spill);
    /* An explicit preference beats the group. */
    uint64_t other = ids[0] == home ? ids[1] : ids[0];
    const char *other_name = ids[0] == home ? "s2" : "s1";
    CHECK_STATUS(put_start_grouped(&f, "p", 4096, 1, "req-1", &other_name, 1, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, other);
    /* Revoked and removed objects drop their group; the last one frees it. */
    const char *mine[] = {"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7", "big", "after", "p"};
    for (size_t i = 0; i < KVS_ARRAY_SIZE(mine); i++)
        CHECK_STATUS(REVOKE(&f, mine[i]), KVS_OK);
    CHECK_EQ_U64(counter(&f, "groups"), 1);
    CHECK_STATUS(END(&f, "h0"), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "h0", 0), KVS_OK);
    CHECK_EQ_U64(counter(&f, "groups"), 0);
    /* A group that failed to place anything leaves nothing behind. */
    CHECK_STATUS(put_start_grouped(&f, "huge", 8 << 20, 1, "req-3", NULL, 0, NULL),
                 KVS_NO_AVAILABLE_HANDLE);
    CHECK_EQ_U64(counter(&f, "groups"), 0);
    fx_fini(&f);
}

/* A favoured segment that is full is passed over while another has room: its complete
 * objects are not evicted for the newcomer. (A group's second object evicted its first.) */
static void test_full_favoured_segment_is_not_evicted(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    uint64_t s2 = mount(&f, f.client, "s2", "n", 1 << 20);
    kvs__obj_desc_t d;
    const char *pref = "s1";
    CHECK_STATUS(put_start_grouped(&f, "a", 600 * KIB, 1, "g", &pref, 1, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, s1);
    CHECK_STATUS(END(&f, "a"), KVS_OK);
    CHECK_STATUS(put_start_grouped(&f, "b", 600 * KIB, 1, "g", NULL, 0, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, s2);
    CHECK_STATUS(END(&f, "b"), KVS_OK);
    CHECK_EQ_U64(counter(&f, "evictions"), 0);
    CHECK_STATUS(lookup(&f, "a", NULL), KVS_OK);
    /* The same for an explicit preference. */
    uint64_t s3 = mount(&f, f.client, "s3", "n", 1 << 20);
    CHECK_STATUS(put_start_grouped(&f, "c", 500 * KIB, 1, NULL, &pref, 1, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, s3);
    CHECK_EQ_U64(counter(&f, "evictions"), 0);
    /* With no room anywhere, eviction makes it, in the same order (s1 first). */
    CHECK_STATUS(END(&f, "c"), KVS_OK);
    f.now += 101 * MS; /* a's lease from the lookup ends */
    CHECK_STATUS(put_start_grouped(&f, "e", 600 * KIB, 1, NULL, &pref, 1, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, s1);
    CHECK_EQ_U64(counter(&f, "evictions"), 1);
    CHECK_STATUS(lookup(&f, "a", NULL), KVS_OBJECT_NOT_FOUND);
    fx_fini(&f);
}

/* preferred_segments name a segment for each copy, in order. */
static void test_preferred_segments_for_every_copy(void)
{
    fx_t f;
    fx_init(&f, 100);
    uint64_t ids[4];
    const char *names[4] = {"s1", "s2", "s3", "s4"};
    for (int i = 0; i < 4; i++)
        ids[i] = mount(&f, f.client, names[i], "n", (uint64_t)(i + 1) << 20);
    kvs__obj_desc_t d;
    /* s1 and s2 are the fullest-last in spread order; asked for, they are taken in order. */
    const char *pref[] = {"s2", "s1", "s3"};
    CHECK_STATUS(put_start_grouped(&f, "a", 4096, 3, NULL, pref, 3, &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 3);
    CHECK_EQ_U64(d.reps[0].segment_id, ids[1]);
    CHECK_EQ_U64(d.reps[1].segment_id, ids[0]);
    CHECK_EQ_U64(d.reps[2].segment_id, ids[2]);
    /* Fewer preferences than copies: the rest by free space (s4 is the emptiest). */
    CHECK_STATUS(put_start_grouped(&f, "b", 4096, 2, NULL, pref, 1, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, ids[1]);
    CHECK_EQ_U64(d.reps[1].segment_id, ids[3]);
    /* Unknown names are skipped; bad names are refused. */
    const char *unknown[] = {"nope", "s1"};
    CHECK_STATUS(put_start_grouped(&f, "c", 4096, 1, NULL, unknown, 2, &d), KVS_OK);
    CHECK_EQ_U64(d.reps[0].segment_id, ids[0]);
    const char *bad[] = {""};
    CHECK_STATUS(put_start_grouped(&f, "d", 4096, 1, NULL, bad, 1, NULL), KVS_INVALID_PARAMS);
    fx_fini(&f);
}

/* ---- owners' indexes and recovery (HA) ------------------------------------------------------ */

static kvs__master_t *ha_master(uint64_t term)
{
    kvs__master_config_t cfg;
    CHECK_STATUS(kvs__master_config_init(&cfg), KVS_OK);
    cfg.lease_ms = 1000;
    cfg.heartbeat_timeout_ms = 1000;
    cfg.put_discard_ms = 2000;
    cfg.owner_index = true;
    cfg.version_base = term << 32;
    kvs__master_t *m;
    CHECK_STATUS(kvs__master_create(&cfg, &m), KVS_OK);
    return m;
}

/* A heartbeat acknowledging index changes up to `iseq`; returns the changes listed. */
static uint32_t heartbeat_index(fx_t *f, uint64_t client, uint64_t seg, uint64_t iseq,
                                kvs__index_op_t **ops_p)
{
    kvs__fence_ack_t ack = {seg, 0, iseq};
    kvs__heartbeat_req_t req = {1, &ack, 0};
    kvs__heartbeat_rsp_t rsp;
    CHECK_STATUS(kvs__master_heartbeat(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    CHECK_STATUS(rsp.status, KVS_OK);
    *ops_p = rsp.index;
    return rsp.nindex;
}

static uint64_t mount_id(fx_t *f, uint64_t client, const char *name, uint64_t size, uint64_t id,
                         int want)
{
    kvs__mount_req_t req = {.name = kvs__str_c(name),
                            .node = kvs__str_c("n"),
                            .endpoint = kvs__str_c("h:1"),
                            .size = size,
                            .segment_id = id};
    uint64_t got = 0;
    CHECK_STATUS(kvs__master_mount(f->m, f->now, client, &req, &got), want);
    return got;
}

static int recover_page(fx_t *f, uint64_t client, uint64_t seg, uint32_t n, kvs__index_op_t *ops,
                        int *results, bool last)
{
    kvs__recover_req_t req = {seg, n, ops, last};
    kvs__status_list_rsp_t rsp;
    CHECK_STATUS(kvs__master_recover(f->m, f->now, client, &req, &f->arena, &rsp), KVS_OK);
    if (rsp.status == KVS_OK) {
        CHECK_EQ_INT(rsp.nresults, n);
        memcpy(results, rsp.results, n * sizeof(*results));
    }
    return rsp.status;
}

static int recover(fx_t *f, uint64_t client, uint64_t seg, uint32_t n, kvs__index_op_t *ops,
                   int *results)
{
    return recover_page(f, client, seg, n, ops, results, false);
}

/* The master tells each owner what its segment holds (ADD at the end of a put, DEL when it
 * goes), in order, until acknowledged. */
static void test_owner_index_follows_puts_and_removes(void)
{
    fx_t f = {.m = ha_master(1), .now = 1000 * MS};
    kvs__arena_init(&f.arena);
    f.client = kvs__master_new_client(f.m);
    uint64_t s1 = mount(&f, f.client, "s1", "n", 1 << 20);
    kvs__obj_desc_t da, db;
    CHECK_STATUS(put_start_ex(&f, "a", 1000, 1, "n", "", 0, &da), KVS_OK);
    kvs__index_op_t *ops;
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, 0, &ops), 0); /* pending: not in the index */
    CHECK_STATUS(END(&f, "a"), KVS_OK);
    /* Complete, but readable only once its owner has indexed it. */
    CHECK_EQ_INT(lookup(&f, "a", NULL), KVS_REPLICA_IS_NOT_READY);
    CHECK_EQ_INT(EXISTS(&f, "a"), 0);
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, 0, &ops), 1);
    CHECK_EQ_INT(ops[0].op, KVS_INDEX_ADD);
    CHECK(kvs__str_eq(ops[0].key, kvs__str_c("a")));
    CHECK_EQ_U64(ops[0].offset, da.reps[0].offset);
    CHECK_EQ_U64(ops[0].size, 1000);
    CHECK_EQ_U64(ops[0].token, da.token);
    CHECK_EQ_U64(ops[0].writer, f.client);
    CHECK(ops[0].version > (1ull << 32));
    uint64_t va = ops[0].version, sa = ops[0].seq;
    CHECK_EQ_INT(lookup(&f, "a", NULL), KVS_REPLICA_IS_NOT_READY); /* sent, not yet applied */
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, sa, &ops), 0);
    CHECK_EQ_INT(EXISTS(&f, "a"), 1);
    kvs__obj_desc_t la;
    CHECK_STATUS(lookup(&f, "a", &la), KVS_OK);
    release(&f, f.client, "a", la.lease_id);
    CHECK_STATUS(put_start_ex(&f, "b", 3000, 1, "n", "", 0, &db), KVS_OK);
    CHECK_STATUS(END(&f, "b"), KVS_OK);
    uint64_t used = seg_used(&f, s1);
    CHECK_STATUS(REMOVE(&f, "b", 0), KVS_OK);
    /* Its space waits for the owner to drop it from the index. */
    CHECK_EQ_U64(seg_used(&f, s1), used);
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, sa, &ops), 2);
    CHECK_EQ_INT(ops[0].op, KVS_INDEX_ADD);
    CHECK_EQ_U64(ops[0].token, db.token);
    CHECK(ops[0].version > va);
    CHECK_EQ_INT(ops[1].op, KVS_INDEX_DEL);
    CHECK_EQ_U64(ops[1].token, db.token);
    CHECK(sa < ops[0].seq && ops[0].seq < ops[1].seq);
    /* Acknowledged changes are not sent again; only the DEL's acknowledgement frees space. */
    uint64_t del_seq = ops[1].seq;
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, ops[0].seq, &ops), 1);
    CHECK_EQ_INT(ops[0].op, KVS_INDEX_DEL);
    CHECK_EQ_U64(seg_used(&f, s1), used);
    CHECK_EQ_INT(heartbeat_index(&f, f.client, s1, del_seq, &ops), 0);
    CHECK_EQ_U64(seg_used(&f, s1), used - 3008);
    fx_fini(&f);
}

/* A new leader rebuilds from what owners re-register: the objects read as before, every one
 * leased for a lease period (a reader of the old leader may still read it), and bad or
 * overlapping entries are refused without touching what was recovered. */
static void test_recover_rebuilds_from_owners(void)
{
    fx_t f = {.m = ha_master(7), .now = 5000 * MS};
    kvs__arena_init(&f.arena);
    f.client = kvs__master_new_client(f.m);
    uint64_t other = kvs__master_new_client(f.m);
    uint64_t old_id = 0x1234567890abcdefull;
    CHECK_EQ_U64(mount_id(&f, f.client, "s1", 1 << 20, old_id, KVS_OK), old_id);
    mount_id(&f, other, "s9", 1 << 20, old_id, KVS_SEGMENT_ALREADY_EXISTS); /* the id is taken */
    uint64_t s2 = mount_id(&f, other, "s2", 1 << 20, 0xabcdefull, KVS_OK);
    /* Until their index is all given, re-registered segments hand out no space. */
    CHECK_STATUS(put_start(&f, "new", 64), KVS_NO_AVAILABLE_HANDLE);
    kvs__index_op_t ops[6] = {
        {.op = KVS_INDEX_ADD,
         .key = kvs__str_c("a"),
         .offset = 0,
         .size = 1000,
         .token = 11,
         .writer = 5,
         .version = 100},
        {.op = KVS_INDEX_ADD,
         .key = kvs__str_c("b"),
         .offset = 512,
         .size = 64,
         .token = 12,
         .version = 101}, /* overlaps a */
        {.op = KVS_INDEX_ADD,
         .key = kvs__str_c("c"),
         .offset = (1 << 20) - 64,
         .size = 128,
         .token = 13,
         .version = 102}, /* past the end */
        {.op = KVS_INDEX_DEL, .key = kvs__str_c("d"), .offset = 4096, .size = 64, .token = 14},
        {.op = KVS_INDEX_ADD,
         .key = kvs__str_c("e"),
         .offset = 8192,
         .size = 4096,
         .token = 15,
         .version = 103,
         .flags = KVS_INDEX_FLAG_HARD_PIN},
        {.op = KVS_INDEX_ADD,
         .key = kvs__str_c("f"),
         .offset = 100,
         .size = 64,
         .token = 16,
         .version = 104}, /* unaligned */
    };
    int res[6];
    CHECK_STATUS(recover(&f, other, old_id, 1, ops, res), KVS_SEGMENT_NOT_FOUND); /* not its own */
    CHECK_STATUS(recover(&f, f.client, old_id, 6, ops, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_STATUS(res[1], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[2], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[3], KVS_INVALID_PARAMS);
    CHECK_STATUS(res[4], KVS_OK);
    CHECK_STATUS(res[5], KVS_INVALID_PARAMS);
    CHECK_EQ_U64(counter(&f, "objects_recovered"), 2);
    kvs__obj_desc_t d;
    CHECK_STATUS(lookup(&f, "a", &d), KVS_OK);
    CHECK_EQ_U64(d.size, 1000);
    CHECK_EQ_INT(d.nreps, 1);
    CHECK_EQ_U64(d.reps[0].segment_id, old_id);
    CHECK_EQ_U64(d.reps[0].offset, 0);
    CHECK_EQ_INT(lookup(&f, "b", NULL), KVS_OBJECT_NOT_FOUND);
    /* Our lookup's lease aside, the recovered object is leased for a lease period. */
    kvs__lease_release_t rel = {kvs__str_c("a"), d.lease_id};
    CHECK_STATUS(kvs__master_release(f.m, f.now, f.client, &rel, 1), KVS_OK);
    CHECK_STATUS(REMOVE(&f, "a", 0), KVS_OBJECT_HAS_LEASE);
    /* The same object's copy from another owner joins it (same key and token). */
    kvs__index_op_t copy = ops[0];
    copy.offset = 4096;
    CHECK_STATUS(recover(&f, other, s2, 1, &copy, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_STATUS(lookup(&f, "a", &d), KVS_OK);
    CHECK_EQ_INT(d.nreps, 2);
    rel.lease_id = d.lease_id;
    CHECK_STATUS(kvs__master_release(f.m, f.now, f.client, &rel, 1), KVS_OK);
    /* An older version of a key is refused; a newer one replaces it. */
    kvs__index_op_t older = {.op = KVS_INDEX_ADD,
                             .key = kvs__str_c("e"),
                             .offset = 65536,
                             .size = 64,
                             .token = 21,
                             .version = 50};
    CHECK_STATUS(recover(&f, other, s2, 1, &older, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OBJECT_ALREADY_EXISTS);
    kvs__index_op_t newer = older;
    newer.token = 22;
    newer.version = 500;
    newer.offset = 131072; /* the older one's range waits in limbo */
    CHECK_STATUS(recover(&f, other, s2, 1, &newer, res), KVS_OK);
    CHECK_STATUS(res[0], KVS_OK);
    CHECK_STATUS(lookup(&f, "e", &d), KVS_OK);
    CHECK_EQ_U64(d.size, 64);
    CHECK_EQ_U64(d.reps[0].segment_id, s2);
    /* s2 holds a's copy, e's newer version and, for a lease period, the older version's range
     * (a reader of the old leader may still read it). */
    CHECK_EQ_U64(seg_used(&f, s2), 1024 + 64 + 64);
    /* The last pages: space may be handed out, and no more recovery is taken. */
    CHECK_STATUS(recover_page(&f, f.client, old_id, 0, NULL, res, true), KVS_OK);
    CHECK_STATUS(recover_page(&f, other, s2, 0, NULL, res, true), KVS_OK);
    CHECK_STATUS(recover(&f, other, s2, 1, &newer, res), KVS_SEGMENT_NOT_FOUND);
    CHECK_STATUS(put_start(&f, "new", 64), KVS_OK);
    CHECK_EQ_U64(counter(&f, "objects_recovered"), 4);
    /* After the lease period the recovered object is the store's like any other. */
    f.now += 1001 * MS;
    CHECK_STATUS(REMOVE(&f, "a", 0), KVS_OK);
    CHECK_EQ_INT(lookup(&f, "a", NULL), KVS_OBJECT_NOT_FOUND);
    fx_fini(&f);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_only_the_writer_ends_or_revokes),
        KVS_TEST_CASE(test_segment_ids_are_never_reused),
        KVS_TEST_CASE(test_forced_remove_keeps_leased_space),
        KVS_TEST_CASE(test_leases_per_reader),
        KVS_TEST_CASE(test_many_leases_on_one_key),
        KVS_TEST_CASE(test_lease_ids_across_their_wrap),
        KVS_TEST_CASE(test_lease_grant_survives_a_failed_growth),
        KVS_TEST_CASE(test_tombstone_waits_for_its_latest_lease),
        KVS_TEST_CASE(test_stray_releases_among_many_tombstones),
        KVS_TEST_CASE(test_pending_remove_waits_for_the_writer),
        KVS_TEST_CASE(test_two_phase_put),
        KVS_TEST_CASE(test_revoke_frees_space),
        KVS_TEST_CASE(test_leases_block_remove),
        KVS_TEST_CASE(test_bad_input),
        KVS_TEST_CASE(test_no_space),
        KVS_TEST_CASE(test_eviction_order_at_watermark),
        KVS_TEST_CASE(test_eviction_skips_leased),
        KVS_TEST_CASE(test_pins_and_eviction_order),
        KVS_TEST_CASE(test_soft_pins_kept_when_not_allowed),
        KVS_TEST_CASE(test_upsert_swap),
        KVS_TEST_CASE(test_tombstone_ends_with_its_last_release),
        KVS_TEST_CASE(test_owner_index_follows_puts_and_removes),
        KVS_TEST_CASE(test_recover_rebuilds_from_owners),
        KVS_TEST_CASE(test_upsert_survives_eviction),
        KVS_TEST_CASE(test_liveness),
        KVS_TEST_CASE(test_put_discard),
        KVS_TEST_CASE(test_placement),
        KVS_TEST_CASE(test_replica_clear),
        KVS_TEST_CASE(test_group_placement),
        KVS_TEST_CASE(test_preferred_segments_for_every_copy),
        KVS_TEST_CASE(test_full_favoured_segment_is_not_evicted),
        KVS_TEST_CASE(test_unmount_and_list),
        KVS_TEST_CASE(test_list_pages_cover_the_largest_listing),
        KVS_TEST_CASE(test_list_pages_of_one_entry),
        KVS_TEST_CASE(test_alloc_failure_leaves_store_unchanged),
        KVS_TEST_CASE(test_resumed_restarts_owner_silence),
        KVS_TEST_CASE(test_repeated_pauses_grace_a_dead_owner_once),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
