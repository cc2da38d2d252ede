/* Buffers, arena, frame headers and the codec of every message. */
#include "proto_int.h"

#include <string.h>

static const char *const msg_names[KVS_MSG_MAX_] = {
    [KVS_MSG_HELLO] = "HELLO",
    [KVS_MSG_MOUNT] = "MOUNT",
    [KVS_MSG_UNMOUNT] = "UNMOUNT",
    [KVS_MSG_HEARTBEAT] = "HEARTBEAT",
    [KVS_MSG_PUT_START] = "PUT_START",
    [KVS_MSG_PUT_END] = "PUT_END",
    [KVS_MSG_PUT_REVOKE] = "PUT_REVOKE",
    [KVS_MSG_LOOKUP] = "LOOKUP",
    [KVS_MSG_EXISTS] = "EXISTS",
    [KVS_MSG_REMOVE] = "REMOVE",
    [KVS_MSG_LIST] = "LIST",
    [KVS_MSG_STAT] = "STAT",
    [KVS_MSG_ERROR] = "ERROR",
    [KVS_MSG_DATA_READ] = "DATA_READ",
    [KVS_MSG_DATA_WRITE] = "DATA_WRITE",
};

const char *kvs__msg_name(unsigned type)
{
    type &= ~KVS_RSP_FLAG;
    if (type == 0 || type >= KVS_MSG_MAX_)
        return "?";
    return msg_names[type];
}

/* ---- little-endian primitives ---------------------------------------------------------- */

static void store_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t load_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void kvs__frame_hdr_encode(const kvs__frame_hdr_t *hdr, uint8_t out[KVS_FRAME_HDR_LEN])
{
    store_le(out, hdr->magic, 4);
    store_le(out + 4, hdr->version, 2);
    store_le(out + 6, hdr->type, 2);
    store_le(out + 8, hdr->req_id, 4);
    store_le(out + 12, hdr->len, 4);
}

int kvs__frame_hdr_decode(const uint8_t *buf, size_t len, uint32_t max_payload,
                          kvs__frame_hdr_t *hdr_p)
{
    if (buf == NULL || hdr_p == NULL || len < KVS_FRAME_HDR_LEN)
        return KVS_PROTOCOL_ERROR;
    kvs__frame_hdr_t h = {
        .magic = (uint32_t)load_le(buf, 4),
        .version = (uint16_t)load_le(buf + 4, 2),
        .type = (uint16_t)load_le(buf + 6, 2),
        .req_id = (uint32_t)load_le(buf + 8, 4),
        .len = (uint32_t)load_le(buf + 12, 4),
    };
    if (h.magic != KVS_PROTO_MAGIC)
        return KVS_PROTOCOL_ERROR;
    if (h.version != KVS_PROTO_VERSION)
        return KVS_INVALID_VERSION;
    unsigned t = h.type & ~KVS_RSP_FLAG;
    if (t == 0 || t >= KVS_MSG_MAX_)
        return KVS_PROTOCOL_ERROR;
    if (h.len > max_payload || h.len > KVS_FRAME_MAX_PAYLOAD)
        return KVS_PROTOCOL_ERROR;
    *hdr_p = h;
    return KVS_OK;
}

/* ---- write buffer ---------------------------------------------------------------------- */

void kvs__wbuf_init(kvs__wbuf_t *w)
{
    memset(w, 0, sizeof(*w));
}

void kvs__wbuf_reset(kvs__wbuf_t *w)
{
    w->len = 0;
    w->failed = false;
}

void kvs__wbuf_free(kvs__wbuf_t *w)
{
    kvs__free(w->data);
    kvs__wbuf_init(w);
}

static uint8_t *wbuf_grow(kvs__wbuf_t *w, size_t n)
{
    if (w->failed)
        return NULL;
    if (n > SIZE_MAX - w->len) {
        w->failed = true;
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap = cap > SIZE_MAX / 2 ? w->len + n : cap * 2;
        uint8_t *d = kvs__realloc(w->data, cap);
        if (d == NULL) {
            w->failed = true;
            return NULL;
        }
        w->data = d;
        w->cap = cap;
    }
    uint8_t *p = w->data + w->len;
    w->len += n;
    return p;
}

void kvs__wbuf_put_bytes(kvs__wbuf_t *w, const void *p, size_t n)
{
    uint8_t *d = wbuf_grow(w, n);
    if (d != NULL && n > 0)
        memcpy(d, p, n);
}

static void wbuf_put_le(kvs__wbuf_t *w, uint64_t v, unsigned n)
{
    uint8_t *d = wbuf_grow(w, n);
    if (d != NULL)
        store_le(d, v, n);
}

void kvs__wbuf_put_u8(kvs__wbuf_t *w, uint8_t v)
{
    wbuf_put_le(w, v, 1);
}

void kvs__wbuf_put_u16(kvs__wbuf_t *w, uint16_t v)
{
    wbuf_put_le(w, v, 2);
}

void kvs__wbuf_put_u32(kvs__wbuf_t *w, uint32_t v)
{
    wbuf_put_le(w, v, 4);
}

void kvs__wbuf_put_u64(kvs__wbuf_t *w, uint64_t v)
{
    wbuf_put_le(w, v, 8);
}

void kvs__wbuf_put_i32(kvs__wbuf_t *w, int32_t v)
{
    wbuf_put_le(w, (uint32_t)v, 4);
}

void kvs__wbuf_put_str(kvs__wbuf_t *w, kvs__str_t s)
{
    kvs__wbuf_put_u32(w, s.len);
    kvs__wbuf_put_bytes(w, s.ptr, s.len);
}

kvs__str_t kvs__str_c(const char *s)
{
    return (kvs__str_t){.ptr = s ? s : "", .len = s ? (uint32_t)strlen(s) : 0};
}

bool kvs__str_eq(kvs__str_t a, kvs__str_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

void kvs__frame_begin(kvs__wbuf_t *w, uint16_t type, uint32_t req_id)
{
    kvs__wbuf_reset(w);
    uint8_t *h = wbuf_grow(w, KVS_FRAME_HDR_LEN);
    if (h != NULL) {
        kvs__frame_hdr_t hdr = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION, type, req_id, 0};
        kvs__frame_hdr_encode(&hdr, h);
    }
}

int kvs__frame_end(kvs__wbuf_t *w)
{
    if (w->failed)
        return KVS_NO_MEMORY;
    size_t payload = w->len - KVS_FRAME_HDR_LEN;
    if (payload > KVS_FRAME_MAX_PAYLOAD)
        return KVS_PROTOCOL_ERROR;
    store_le(w->data + 12, payload, 4);
    return KVS_OK;
}

/* ---- read buffer ----------------------------------------------------------------------- */

void kvs__rbuf_init(kvs__rbuf_t *r, const void *p, size_t len)
{
    r->p = p;
    r->len = len;
    r->pos = 0;
    r->failed = false;
}

static const uint8_t *rbuf_take(kvs__rbuf_t *r, size_t n)
{
    if (r->failed || n > r->len - r->pos) {
        r->failed = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}

static uint64_t rbuf_le(kvs__rbuf_t *r, unsigned n)
{
    const uint8_t *p = rbuf_take(r, n);
    return p ? load_le(p, n) : 0;
}

uint8_t kvs__rbuf_u8(kvs__rbuf_t *r)
{
    return (uint8_t)rbuf_le(r, 1);
}

uint16_t kvs__rbuf_u16(kvs__rbuf_t *r)
{
    return (uint16_t)rbuf_le(r, 2);
}

uint32_t kvs__rbuf_u32(kvs__rbuf_t *r)
{
    return (uint32_t)rbuf_le(r, 4);
}

uint64_t kvs__rbuf_u64(kvs__rbuf_t *r)
{
    return rbuf_le(r, 8);
}

int32_t kvs__rbuf_i32(kvs__rbuf_t *r)
{
    return (int32_t)(uint32_t)rbuf_le(r, 4);
}

kvs__str_t kvs__rbuf_str(kvs__rbuf_t *r, uint32_t max_len)
{
    kvs__str_t s = {"", 0};
    uint32_t len = kvs__rbuf_u32(r);
    if (len > max_len) {
        r->failed = true;
        return s;
    }
    const uint8_t *p = rbuf_take(r, len);
    if (p != NULL) {
        s.ptr = (const char *)p;
        s.len = len;
    }
    return s;
}

uint32_t kvs__rbuf_count(kvs__rbuf_t *r, uint32_t max, size_t min_elem_bytes)
{
    uint32_t n = kvs__rbuf_u32(r);
    if (r->failed)
        return 0;
    if (n > max || (min_elem_bytes != 0 && n > (r->len - r->pos) / min_elem_bytes)) {
        r->failed = true;
        return 0;
    }
    return n;
}

/* ---- arena ----------------------------------------------------------------------------- */

struct kvs__arena_chunk {
    kvs__arena_chunk_t *next;
    size_t used;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

void kvs__arena_init(kvs__arena_t *a)
{
    a->head = NULL;
}

void *kvs__arena_alloc(kvs__arena_t *a, size_t size)
{
    size = KVS_ALIGN_UP(size ? size : 1, 16);
    kvs__arena_chunk_t *c = a->head;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = KVS_MAX(size, (size_t)16384);
        c = kvs__malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

void kvs__arena_free(kvs__arena_t *a)
{
    kvs__arena_chunk_t *c = a->head;
    while (c != NULL) {
        kvs__arena_chunk_t *next = c->next;
        kvs__free(c);
        c = next;
    }
    a->head = NULL;
}

/* ---- codecs ---------------------------------------------------------------------------- */

/* Common tail of every decoder: the payload must be consumed exactly. */
static int rbuf_finish(kvs__rbuf_t *r)
{
    return (!r->failed && r->pos == r->len) ? KVS_OK : KVS_PROTOCOL_ERROR;
}

#define ARENA_ARRAY_(a, n, type) ((type *)kvs__arena_alloc((a), (size_t)(n) * sizeof(type)))

void kvs__hello_req_encode(kvs__wbuf_t *w, const kvs__hello_req_t *m)
{
    kvs__wbuf_put_u32(w, m->version);
    kvs__wbuf_put_str(w, m->node);
    kvs__wbuf_put_u64(w, m->client_id);
}

int kvs__hello_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__hello_req_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->version = kvs__rbuf_u32(&r);
    m->node = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->client_id = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

void kvs__hello_rsp_encode(kvs__wbuf_t *w, const kvs__hello_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u64(w, m->client_id);
    kvs__wbuf_put_u64(w, m->lease_ms);
    kvs__wbuf_put_u64(w, m->heartbeat_timeout_ms);
}

int kvs__hello_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__hello_rsp_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->client_id = kvs__rbuf_u64(&r);
    m->lease_ms = kvs__rbuf_u64(&r);
    m->heartbeat_timeout_ms = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

void kvs__mount_req_encode(kvs__wbuf_t *w, const kvs__mount_req_t *m)
{
    kvs__wbuf_put_u64(w, m->client_id);
    kvs__wbuf_put_str(w, m->name);
    kvs__wbuf_put_str(w, m->node);
    kvs__wbuf_put_str(w, m->endpoint);
    kvs__wbuf_put_u64(w, m->size);
}

int kvs__mount_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__mount_req_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->client_id = kvs__rbuf_u64(&r);
    m->name = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->node = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->endpoint = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->size = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

void kvs__mount_rsp_encode(kvs__wbuf_t *w, const kvs__mount_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u64(w, m->segment_id);
}

int kvs__mount_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__mount_rsp_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->segment_id = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

void kvs__ids_req_encode(kvs__wbuf_t *w, const kvs__ids_req_t *m)
{
    kvs__wbuf_put_u64(w, m->a);
    kvs__wbuf_put_u64(w, m->b);
}

int kvs__ids_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__ids_req_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->a = kvs__rbuf_u64(&r);
    m->b = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

void kvs__keys_req_encode(kvs__wbuf_t *w, const kvs__keys_req_t *m)
{
    kvs__wbuf_put_u32(w, m->flags);
    kvs__wbuf_put_u32(w, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvs__wbuf_put_str(w, m->keys[i]);
}

int kvs__keys_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__keys_req_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->flags = kvs__rbuf_u32(&r);
    m->n = kvs__rbuf_count(&r, KVS_MAX_BATCH, 4);
    m->keys = ARENA_ARRAY_(a, m->n, kvs__str_t);
    if (m->keys == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->n && !r.failed; i++)
        m->keys[i] = kvs__rbuf_str(&r, KVS_MAX_KEY_LEN);
    return rbuf_finish(&r);
}

void kvs__status_list_rsp_encode(kvs__wbuf_t *w, const kvs__status_list_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u32(w, m->n);
    for (uint32_t i = 0; i < m->n; i++)
        kvs__wbuf_put_i32(w, m->results[i]);
}

int kvs__status_list_rsp_decode(const void *p, size_t len, kvs__arena_t *a,
                                kvs__status_list_rsp_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->n = kvs__rbuf_count(&r, KVS_MAX_BATCH, 4);
    m->results = ARENA_ARRAY_(a, m->n, int32_t);
    if (m->results == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->n && !r.failed; i++)
        m->results[i] = kvs__rbuf_i32(&r);
    return rbuf_finish(&r);
}

void kvs__put_start_req_encode(kvs__wbuf_t *w, const kvs__put_start_req_t *m)
{
    kvs__wbuf_put_str(w, m->node);
    kvs__wbuf_put_u32(w, m->replica_num);
    kvs__wbuf_put_str(w, m->preferred_segment);
    kvs__wbuf_put_u32(w, m->flags);
    kvs__wbuf_put_u32(w, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvs__wbuf_put_str(w, m->items[i].key);
        kvs__wbuf_put_u64(w, m->items[i].size);
    }
}

int kvs__put_start_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__put_start_req_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->node = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->replica_num = kvs__rbuf_u32(&r);
    m->preferred_segment = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
    m->flags = kvs__rbuf_u32(&r);
    m->n = kvs__rbuf_count(&r, KVS_MAX_BATCH, 12);
    m->items = ARENA_ARRAY_(a, m->n, kvs__put_item_t);
    if (m->items == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->n && !r.failed; i++) {
        m->items[i].key = kvs__rbuf_str(&r, KVS_MAX_KEY_LEN);
        m->items[i].size = kvs__rbuf_u64(&r);
    }
    return rbuf_finish(&r);
}

static void seg_info_encode(kvs__wbuf_t *w, const kvs__seg_info_t *s)
{
    kvs__wbuf_put_u64(w, s->id);
    kvs__wbuf_put_str(w, s->name);
    kvs__wbuf_put_str(w, s->node);
    kvs__wbuf_put_str(w, s->endpoint);
    kvs__wbuf_put_u64(w, s->size);
    kvs__wbuf_put_u64(w, s->used);
}

#define SEG_INFO_MIN_BYTES 36u

static void seg_info_decode(kvs__rbuf_t *r, kvs__seg_info_t *s)
{
    s->id = kvs__rbuf_u64(r);
    s->name = kvs__rbuf_str(r, KVS_MAX_NAME_LEN);
    s->node = kvs__rbuf_str(r, KVS_MAX_NAME_LEN);
    s->endpoint = kvs__rbuf_str(r, KVS_MAX_NAME_LEN);
    s->size = kvs__rbuf_u64(r);
    s->used = kvs__rbuf_u64(r);
}

static int seg_infos_decode(kvs__rbuf_t *r, kvs__arena_t *a, uint32_t *n_p,
                            kvs__seg_info_t **segs_p)
{
    *n_p = kvs__rbuf_count(r, KVS_MAX_BATCH, SEG_INFO_MIN_BYTES);
    *segs_p = ARENA_ARRAY_(a, *n_p, kvs__seg_info_t);
    if (*segs_p == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < *n_p && !r->failed; i++)
        seg_info_decode(r, &(*segs_p)[i]);
    return KVS_OK;
}

void kvs__placement_rsp_encode(kvs__wbuf_t *w, const kvs__placement_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u32(w, m->nseg);
    for (uint32_t i = 0; i < m->nseg; i++)
        seg_info_encode(w, &m->segs[i]);
    kvs__wbuf_put_u32(w, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        const kvs__obj_desc_t *o = &m->objs[i];
        kvs__wbuf_put_i32(w, o->status);
        kvs__wbuf_put_u64(w, o->size);
        kvs__wbuf_put_u64(w, o->lease_ms);
        kvs__wbuf_put_u32(w, o->nrep);
        for (uint32_t j = 0; j < o->nrep; j++) {
            kvs__wbuf_put_u64(w, o->reps[j].segment_id);
            kvs__wbuf_put_u64(w, o->reps[j].offset);
        }
    }
}

int kvs__placement_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__placement_rsp_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    if (seg_infos_decode(&r, a, &m->nseg, &m->segs) != KVS_OK)
        return KVS_NO_MEMORY;
    m->n = kvs__rbuf_count(&r, KVS_MAX_BATCH, 24);
    m->objs = ARENA_ARRAY_(a, m->n, kvs__obj_desc_t);
    if (m->objs == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->n && !r.failed; i++) {
        kvs__obj_desc_t *o = &m->objs[i];
        o->status = kvs__rbuf_i32(&r);
        o->size = kvs__rbuf_u64(&r);
        o->lease_ms = kvs__rbuf_u64(&r);
        o->nrep = kvs__rbuf_count(&r, KVS_MAX_REPLICAS, 16);
        o->reps = ARENA_ARRAY_(a, o->nrep, kvs__replica_t);
        if (o->reps == NULL)
            return KVS_NO_MEMORY;
        for (uint32_t j = 0; j < o->nrep && !r.failed; j++) {
            o->reps[j].segment_id = kvs__rbuf_u64(&r);
            o->reps[j].offset = kvs__rbuf_u64(&r);
        }
    }
    return rbuf_finish(&r);
}

void kvs__list_req_encode(kvs__wbuf_t *w, const kvs__list_req_t *m)
{
    kvs__wbuf_put_str(w, m->prefix);
    kvs__wbuf_put_u32(w, m->limit);
}

int kvs__list_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__list_req_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->prefix = kvs__rbuf_str(&r, KVS_MAX_KEY_LEN);
    m->limit = kvs__rbuf_u32(&r);
    return rbuf_finish(&r);
}

void kvs__list_rsp_encode(kvs__wbuf_t *w, const kvs__list_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u32(w, m->truncated);
    kvs__wbuf_put_u32(w, m->n);
    for (uint32_t i = 0; i < m->n; i++) {
        kvs__wbuf_put_str(w, m->entries[i].key);
        kvs__wbuf_put_u64(w, m->entries[i].size);
        kvs__wbuf_put_u32(w, m->entries[i].state);
        kvs__wbuf_put_u32(w, m->entries[i].nrep);
    }
}

int kvs__list_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__list_rsp_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->truncated = kvs__rbuf_u32(&r);
    m->n = kvs__rbuf_count(&r, KVS_MAX_BATCH, 20);
    m->entries = ARENA_ARRAY_(a, m->n, kvs__list_entry_t);
    if (m->entries == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->n && !r.failed; i++) {
        m->entries[i].key = kvs__rbuf_str(&r, KVS_MAX_KEY_LEN);
        m->entries[i].size = kvs__rbuf_u64(&r);
        m->entries[i].state = kvs__rbuf_u32(&r);
        m->entries[i].nrep = kvs__rbuf_u32(&r);
    }
    return rbuf_finish(&r);
}

void kvs__stat_rsp_encode(kvs__wbuf_t *w, const kvs__stat_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_u32(w, m->ncounters);
    for (uint32_t i = 0; i < m->ncounters; i++) {
        kvs__wbuf_put_str(w, m->counters[i].name);
        kvs__wbuf_put_u64(w, m->counters[i].value);
    }
    kvs__wbuf_put_u32(w, m->nseg);
    for (uint32_t i = 0; i < m->nseg; i++)
        seg_info_encode(w, &m->segs[i]);
}

int kvs__stat_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__stat_rsp_t *m)
{
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->ncounters = kvs__rbuf_count(&r, 1024, 12);
    m->counters = ARENA_ARRAY_(a, m->ncounters, kvs__counter_t);
    if (m->counters == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->ncounters && !r.failed; i++) {
        m->counters[i].name = kvs__rbuf_str(&r, KVS_MAX_NAME_LEN);
        m->counters[i].value = kvs__rbuf_u64(&r);
    }
    if (seg_infos_decode(&r, a, &m->nseg, &m->segs) != KVS_OK)
        return KVS_NO_MEMORY;
    return rbuf_finish(&r);
}

void kvs__error_rsp_encode(kvs__wbuf_t *w, const kvs__error_rsp_t *m)
{
    kvs__wbuf_put_i32(w, m->status);
    kvs__wbuf_put_str(w, m->message);
}

int kvs__error_rsp_decode(const void *p, size_t len, kvs__arena_t *a, kvs__error_rsp_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->status = kvs__rbuf_i32(&r);
    m->message = kvs__rbuf_str(&r, 4096);
    return rbuf_finish(&r);
}

void kvs__data_req_encode(kvs__wbuf_t *w, const kvs__data_req_t *m)
{
    kvs__wbuf_put_u64(w, m->segment_id);
    kvs__wbuf_put_u64(w, m->offset);
    kvs__wbuf_put_u64(w, m->length);
}

int kvs__data_req_decode(const void *p, size_t len, kvs__arena_t *a, kvs__data_req_t *m)
{
    KVS_UNUSED(a);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, len);
    m->segment_id = kvs__rbuf_u64(&r);
    m->offset = kvs__rbuf_u64(&r);
    m->length = kvs__rbuf_u64(&r);
    return rbuf_finish(&r);
}

/* ---- decoder table for tests and fuzzers ------------------------------------------------ */

#define ROUNDTRIP_(name)                                                                           \
    static int roundtrip_##name(const void *p, size_t len, kvs__arena_t *a, kvs__wbuf_t *w)        \
    {                                                                                              \
        kvs__##name##_t m;                                                                         \
        int rc = kvs__##name##_decode(p, len, a, &m);                                              \
        if (rc != KVS_OK)                                                                          \
            return rc;                                                                             \
        kvs__##name##_encode(w, &m);                                                               \
        return w->failed ? KVS_NO_MEMORY : KVS_OK;                                                 \
    }
ROUNDTRIP_(hello_req)
ROUNDTRIP_(hello_rsp)
ROUNDTRIP_(mount_req)
ROUNDTRIP_(mount_rsp)
ROUNDTRIP_(ids_req)
ROUNDTRIP_(keys_req)
ROUNDTRIP_(status_list_rsp)
ROUNDTRIP_(put_start_req)
ROUNDTRIP_(placement_rsp)
ROUNDTRIP_(list_req)
ROUNDTRIP_(list_rsp)
ROUNDTRIP_(stat_rsp)
ROUNDTRIP_(error_rsp)
ROUNDTRIP_(data_req)

const kvs__codec_entry_t kvs__codecs[] = {
    {"hello_req", roundtrip_hello_req},
    {"hello_rsp", roundtrip_hello_rsp},
    {"mount_req", roundtrip_mount_req},
    {"mount_rsp", roundtrip_mount_rsp},
    {"ids_req", roundtrip_ids_req},
    {"keys_req", roundtrip_keys_req},
    {"status_list_rsp", roundtrip_status_list_rsp},
    {"put_start_req", roundtrip_put_start_req},
    {"placement_rsp", roundtrip_placement_rsp},
    {"list_req", roundtrip_list_req},
    {"list_rsp", roundtrip_list_rsp},
    {"stat_rsp", roundtrip_stat_rsp},
    {"error_rsp", roundtrip_error_rsp},
    {"data_req", roundtrip_data_req},
};
const size_t kvs__codecs_count = KVS_ARRAY_SIZE(kvs__codecs);
