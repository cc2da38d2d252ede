/* Buffers, arena, frame headers, version rules, and the codec of every message generated from
 * the schema (schema.h). */
#include "proto_int.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- little-endian primitives ---------------------------------------------------------- */

void kvs__frame_hdr_encode(const kvs__frame_hdr_t *hdr, uint8_t out[KVS_FRAME_HDR_LEN])
{
    kvs__le_store(out, hdr->magic, 4);
    kvs__le_store(out + 4, hdr->version, 2);
    kvs__le_store(out + 6, hdr->type, 2);
    kvs__le_store(out + 8, hdr->req_id, 4);
    kvs__le_store(out + 12, hdr->len, 4);
}

int kvs__frame_hdr_decode(const uint8_t *buf, size_t len, uint32_t max_payload,
                          kvs__frame_hdr_t *hdr_p)
{
    if (buf == NULL || hdr_p == NULL || len < KVS_FRAME_HDR_LEN)
        return KVS_PROTOCOL_ERROR;
    kvs__frame_hdr_t h = {
        .magic = (uint32_t)kvs__le_load(buf, 4),
        .version = (uint16_t)kvs__le_load(buf + 4, 2),
        .type = (uint16_t)kvs__le_load(buf + 6, 2),
        .req_id = (uint32_t)kvs__le_load(buf + 8, 4),
        .len = (uint32_t)kvs__le_load(buf + 12, 4),
    };
    if (h.magic != KVS_PROTO_MAGIC)
        return KVS_PROTOCOL_ERROR;
    /* Only a HELLO request may come from a newer peer that does not yet know our range. */
    if (h.version < KVS_PROTO_VERSION_MIN ||
        (h.version > KVS_PROTO_VERSION_MAX && h.type != KVS_MSG_HELLO))
        return KVS_INVALID_VERSION;
    if ((h.type & ~KVS_RSP_FLAG) == 0)
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
    w->version = KVS_PROTO_VERSION_MAX;
}

void kvs__wbuf_reset(kvs__wbuf_t *w)
{
    w->len = 0;
    w->failed = false;
    w->invalid = false;
}

void kvs__wbuf_free(kvs__wbuf_t *w)
{
    if (!w->fixed)
        kvs__free(w->data);
    kvs__wbuf_init(w);
}

kvs__wbuf_t kvs__wbuf_over(void *buf, size_t cap, unsigned version)
{
    return (kvs__wbuf_t){.data = buf, .cap = cap, .fixed = true, .version = (uint16_t)version};
}

uint8_t *kvs__wbuf_grow(kvs__wbuf_t *w, size_t n)
{
    if (w->failed)
        return NULL;
    if (n > SIZE_MAX - w->len || (w->fixed && w->len + n > w->cap)) {
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
    uint8_t *d = kvs__wbuf_grow(w, n);
    if (d != NULL && n > 0)
        memcpy(d, p, n);
}

void kvs__wbuf_put_str(kvs__wbuf_t *w, kvs__str_t s, uint32_t max)
{
    if (s.len > max)
        w->invalid = true;
    kvs__wbuf_put_u32(w, s.len);
    kvs__wbuf_put_bytes(w, s.ptr, s.len);
}

void kvs__wbuf_put_count(kvs__wbuf_t *w, uint32_t n, uint32_t max)
{
    if (n > max)
        w->invalid = true;
    kvs__wbuf_put_u32(w, n);
}

void kvs__wbuf_put_i32s(kvs__wbuf_t *w, const int32_t *v, uint32_t n)
{
    uint8_t *d = kvs__wbuf_grow(w, (size_t)n * 4);
    if (d == NULL)
        return;
    for (uint32_t i = 0; i < n; i++)
        kvs__le_store(d + 4 * (size_t)i, (uint32_t)v[i], 4);
}

kvs__str_t kvs__str_c(const char *s)
{
    return (kvs__str_t){.ptr = s ? s : "", .len = s ? (uint32_t)strlen(s) : 0};
}

bool kvs__str_eq(kvs__str_t a, kvs__str_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

void kvs__frame_begin(kvs__wbuf_t *w, uint16_t type, uint32_t req_id, unsigned version)
{
    kvs__wbuf_reset(w);
    w->version = (uint16_t)version;
    uint8_t *h = kvs__wbuf_grow(w, KVS_FRAME_HDR_LEN);
    if (h != NULL) {
        kvs__frame_hdr_t hdr = {KVS_PROTO_MAGIC, (uint16_t)version, type, req_id, 0};
        kvs__frame_hdr_encode(&hdr, h);
    }
}

int kvs__frame_end(kvs__wbuf_t *w)
{
    if (w->failed)
        return KVS_NO_MEMORY;
    if (w->invalid)
        return KVS_INVALID_PARAMS;
    size_t payload = w->len - KVS_FRAME_HDR_LEN;
    if (payload > KVS_FRAME_MAX_PAYLOAD)
        return KVS_PROTOCOL_ERROR;
    kvs__le_store(w->data + 12, payload, 4);
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

kvs__blob_t kvs__rbuf_blob(kvs__rbuf_t *r, uint32_t max_len)
{
    kvs__str_t s = kvs__rbuf_str(r, max_len);
    return (kvs__blob_t){(const uint8_t *)s.ptr, s.len};
}

void kvs__rbuf_i32s(kvs__rbuf_t *r, int32_t *out, uint32_t n)
{
    const uint8_t *p = rbuf_take(r, (size_t)n * 4);
    for (uint32_t i = 0; p != NULL && i < n; i++)
        out[i] = (int32_t)(uint32_t)kvs__le_load(p + 4 * (size_t)i, 4);
}

int kvs__rbuf_finish(kvs__rbuf_t *r, unsigned version)
{
    if (r->failed)
        return KVS_PROTOCOL_ERROR;
    return (r->pos == r->len || version > KVS_PROTO_VERSION_MAX) ? KVS_OK : KVS_PROTOCOL_ERROR;
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

/* Freed chunks are kept, process-wide and bounded, for the next arena. A large batch's decode
 * arrays (a 1536-key lookup: about 300 KiB) went back to the C library after every call, which
 * trimmed them to the system, and the next call took a page fault per page: a quarter of such
 * a lookup's time. Chunks come in power-of-two sizes from 16 KiB to POOL_CHUNK_MAX, one stack
 * per size; larger ones are not kept. Under AddressSanitizer (the sanitizer stage, the fuzzers)
 * nothing is kept, so that a use after an arena's free still meets freed memory; nor while
 * allocation failures are being injected, so that every chunk can still fail. */
#if defined(__SANITIZE_ADDRESS__)
#define POOL_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ON 0
#endif
#endif
#ifndef POOL_ON
#define POOL_ON 1
#endif
#define POOL_CHUNK_MIN_LOG2 14u
#define POOL_CHUNK_MAX_LOG2 21u /* 2 MiB */
#define POOL_BYTES_MAX      ((size_t)16 << 20)
#define POOL_CLASSES        (POOL_CHUNK_MAX_LOG2 - POOL_CHUNK_MIN_LOG2 + 1)

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static kvs__arena_chunk_t *pool[POOL_CLASSES];
static size_t pool_bytes;

bool kvs__arena_pooling(void)
{
    return POOL_ON;
}

/* A fork while another thread holds the pool's lock would leave it held in the child: the
 * fork waits for it instead. Registered at load, before any thread can fork. */
static void pool_lock_take(void)
{
    pthread_mutex_lock(&pool_lock);
}
static void pool_lock_give(void)
{
    pthread_mutex_unlock(&pool_lock);
}
__attribute__((constructor)) static void pool_init(void)
{
    if (POOL_ON)
        pthread_atfork(pool_lock_take, pool_lock_give, pool_lock_give);
}

/* The pool's class for a chunk of `cap` bytes: -1 when not a pooled size (or no pool). */
static int pool_class(size_t cap)
{
    for (unsigned k = 0; POOL_ON && k < POOL_CLASSES; k++) {
        if (cap == (size_t)1 << (POOL_CHUNK_MIN_LOG2 + k))
            return (int)k;
    }
    return -1;
}

/* A chunk of at least `size` bytes: a kept one of its size class, or a new one. */
static kvs__arena_chunk_t *chunk_new(size_t size)
{
    size_t cap = (size_t)1 << POOL_CHUNK_MIN_LOG2;
    while (cap < size && cap < ((size_t)1 << POOL_CHUNK_MAX_LOG2))
        cap <<= 1;
    if (cap < size)
        cap = size; /* beyond the largest class: an exact, unpooled chunk */
    int k = kvs__alloc_injecting() ? -1 : pool_class(cap);
    kvs__arena_chunk_t *c = NULL;
    if (k >= 0) {
        pthread_mutex_lock(&pool_lock);
        c = pool[k];
        if (c != NULL) {
            pool[k] = c->next;
            pool_bytes -= cap;
        }
        pthread_mutex_unlock(&pool_lock);
    }
    if (c == NULL) {
        c = kvs__malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->cap = cap;
    }
    c->used = 0;
    return c;
}

static void chunk_drop(kvs__arena_chunk_t *c)
{
    int k = pool_class(c->cap);
    if (k >= 0) {
        pthread_mutex_lock(&pool_lock);
        bool keep = pool_bytes + c->cap <= POOL_BYTES_MAX;
        if (keep) {
            c->next = pool[k];
            pool[k] = c;
            pool_bytes += c->cap;
        }
        pthread_mutex_unlock(&pool_lock);
        if (keep)
            return;
    }
    kvs__free(c);
}

void kvs__arena_init(kvs__arena_t *a)
{
    a->head = NULL;
}

void *kvs__arena_alloc(kvs__arena_t *a, size_t size)
{
    size = KVS_ALIGN_UP(size ? size : 1, 16);
    kvs__arena_chunk_t *c = a->head;
    if (c == NULL || c->cap - c->used < size) {
        c = chunk_new(size);
        if (c == NULL)
            return NULL;
        c->next = a->head;
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
        chunk_drop(c);
        c = next;
    }
    a->head = NULL;
}

/* ---- versions and the message table ----------------------------------------------------- */

unsigned kvs__proto_reply_version(unsigned request_version)
{
    return kvs__proto_read_version(request_version);
}

unsigned kvs__proto_negotiate(unsigned peer_min, unsigned peer_max)
{
    unsigned hi = KVS_MIN(peer_max, KVS_PROTO_VERSION_MAX);
    unsigned lo = KVS_MAX(peer_min, KVS_PROTO_VERSION_MIN);
    return lo <= hi ? hi : 0;
}

/* ---- codecs: generated from the schema ---------------------------------------------------- */

KVS_SCHEMA_RECORDS(KVS_GEN_DEFINE)

/* The empty payload of messages whose table entry says `none`. */
static int none_decode(const void *p, size_t len, unsigned version, kvs__arena_t *a, void *m_p)
{
    KVS_UNUSED(p), KVS_UNUSED(a), KVS_UNUSED(m_p);
    return (len == 0 || version > KVS_PROTO_VERSION_MAX) ? KVS_OK : KVS_PROTOCOL_ERROR;
}

static void none_encode(kvs__wbuf_t *w, const void *m)
{
    KVS_UNUSED(w), KVS_UNUSED(m);
}

static const kvs__rec_desc_t kvs__none_desc = {"none", 1, 0, NULL, none_encode, none_decode};

static const kvs__msg_desc_t msg_descs[KVS_MSG_MAX_] = {
#define KVS_MSG_DESC_(name, num, req, rsp, raw)                                                    \
    [num] = {#name, num, &kvs__##req##_desc, &kvs__##rsp##_desc, raw},
    KVS_SCHEMA_MESSAGES(KVS_MSG_DESC_)
#undef KVS_MSG_DESC_
};

const kvs__msg_desc_t *kvs__msg_desc(unsigned type)
{
    type &= ~KVS_RSP_FLAG;
    if (type == 0 || type >= KVS_MSG_MAX_ || msg_descs[type].name == NULL)
        return NULL;
    return &msg_descs[type];
}

bool kvs__msg_known(unsigned type)
{
    return kvs__msg_desc(type) != NULL;
}

const char *kvs__msg_name(unsigned type)
{
    const kvs__msg_desc_t *d = kvs__msg_desc(type);
    return d ? d->name : "UNKNOWN";
}

const kvs__rec_desc_t *const kvs__records[] = {
#define KVS_REC_PTR_(rec) &kvs__##rec##_desc,
    KVS_SCHEMA_RECORDS(KVS_REC_PTR_)
#undef KVS_REC_PTR_
};
const size_t kvs__records_count = KVS_ARRAY_SIZE(kvs__records);

/* ---- formatting for logs -------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t cap;
    size_t len;
} fmt_t;

__attribute__((format(printf, 2, 3))) static void fmt_add(fmt_t *f, const char *fmt, ...)
{
    if (f->len + 1 >= f->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(f->buf + f->len, f->cap - f->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        f->len = KVS_MIN(f->len + (size_t)n, f->cap - 1);
}

/* Strings are shown up to 48 bytes, unprintable bytes as '.'; blobs in hex up to 16 bytes. */
static void fmt_str(fmt_t *f, const char *p, uint32_t len)
{
    char tmp[52];
    uint32_t n = KVS_MIN(len, 48u);
    for (uint32_t i = 0; i < n; i++)
        tmp[i] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"') ? p[i] : '.';
    tmp[n] = 0;
    fmt_add(f, "\"%s\"%s", tmp, len > n ? "..." : "");
}

#define FMT_MAX_ELEMS 4u

static void fmt_record(fmt_t *f, const kvs__rec_desc_t *d, const void *m, unsigned depth);

static void fmt_field(fmt_t *f, const kvs__field_desc_t *fd, const void *m, unsigned depth)
{
    const char *base = (const char *)m + fd->offset;
    uint32_t n = 0;
    if (fd->kind == KVS__KIND_STRS || fd->kind == KVS__KIND_I32S || fd->kind == KVS__KIND_ARR) {
        memcpy(&n, (const char *)m + fd->count_offset, sizeof(n));
        fmt_add(f, "[%u:", n);
    }
    switch (fd->kind) {
    case KVS__KIND_U8:
        fmt_add(f, "%u", *(const uint8_t *)base);
        break;
    case KVS__KIND_U16:
        fmt_add(f, "%u", *(const uint16_t *)base);
        break;
    case KVS__KIND_U32:
        fmt_add(f, "%u", *(const uint32_t *)base);
        break;
    case KVS__KIND_U64:
        /* Credentials (a client's id, a put's token, a write capability) stay out of logs. */
        if (strcmp(fd->name, "client_id") == 0 || strcmp(fd->name, "token") == 0 ||
            strcmp(fd->name, "cap") == 0)
            fmt_add(f, "%s", *(const uint64_t *)base ? "(set)" : "0");
        else
            fmt_add(f, "%llu", (unsigned long long)*(const uint64_t *)base);
        break;
    case KVS__KIND_I32:
        fmt_add(f, "%d", *(const int32_t *)base);
        break;
    case KVS__KIND_I64:
        fmt_add(f, "%lld", (long long)*(const int64_t *)base);
        break;
    case KVS__KIND_STR: {
        const kvs__str_t *s = (const kvs__str_t *)base;
        fmt_str(f, s->ptr, s->len);
        break;
    }
    case KVS__KIND_BLOB: {
        /* Blobs are nonces, proofs and keys: their length only, never their bytes in a log. */
        const kvs__blob_t *b = (const kvs__blob_t *)base;
        fmt_add(f, "%u bytes", b->len);
        break;
    }
    case KVS__KIND_STRS: {
        const kvs__str_t *s = *(kvs__str_t *const *)base;
        for (uint32_t i = 0; i < KVS_MIN(n, FMT_MAX_ELEMS); i++) {
            fmt_add(f, " ");
            fmt_str(f, s[i].ptr, s[i].len);
        }
        break;
    }
    case KVS__KIND_I32S: {
        const int32_t *v = *(int32_t *const *)base;
        for (uint32_t i = 0; i < KVS_MIN(n, FMT_MAX_ELEMS); i++)
            fmt_add(f, " %d", v[i]);
        break;
    }
    case KVS__KIND_ARR: {
        const char *e = *(const char *const *)base;
        for (uint32_t i = 0; i < KVS_MIN(n, FMT_MAX_ELEMS); i++) {
            fmt_add(f, " ");
            fmt_record(f, fd->elem, e + (size_t)i * fd->elem->size, depth + 1);
        }
        break;
    }
    }
    if (fd->kind == KVS__KIND_STRS || fd->kind == KVS__KIND_I32S || fd->kind == KVS__KIND_ARR)
        fmt_add(f, "%s]", n > FMT_MAX_ELEMS ? " ..." : "");
}

static void fmt_record(fmt_t *f, const kvs__rec_desc_t *d, const void *m, unsigned depth)
{
    fmt_add(f, "{");
    for (uint32_t i = 0; i < d->nfields; i++) {
        if (depth > 3) {
            fmt_add(f, "...");
            break;
        }
        fmt_add(f, "%s%s=", i ? " " : "", d->fields[i].name);
        fmt_field(f, &d->fields[i], m, depth);
    }
    fmt_add(f, "}");
}

char *kvs__record_format(const kvs__rec_desc_t *d, const void *m, char *buf, size_t cap)
{
    if (buf == NULL || cap == 0)
        return buf;
    buf[0] = 0;
    fmt_t f = {buf, cap, 0};
    if (d != NULL && m != NULL)
        fmt_record(&f, d, m, 0);
    return buf;
}

void kvs__frame_log(const char *who, const char *dir, const kvs__frame_hdr_t *h,
                    const void *payload, size_t len)
{
    const kvs__msg_desc_t *md = kvs__msg_desc(h->type);
    bool data = md && (md->type == KVS_MSG_DATA_READ || md->type == KVS_MSG_DATA_WRITE);
    if ((data ? KVS_LOG_TRACE : KVS_LOG_DEBUG) > kvs__log_level())
        return;
    bool rsp = (h->type & KVS_RSP_FLAG) != 0;
    char body[1024] = "";
    const kvs__rec_desc_t *rd = md ? (rsp ? md->rsp : md->req) : NULL;
    if (rd != NULL && payload != NULL) {
        /* Raw bytes after a data record are not shown: decode the record alone. */
        size_t rec_len = (md->raw == (rsp ? KVS_MSG_RAW_RSP : KVS_MSG_RAW_REQ))
                             ? KVS_MIN(len, (size_t)(rsp ? KVS_DATA_STATUS_LEN : KVS_DATA_REQ_LEN))
                             : len;
        kvs__arena_t a;
        kvs__arena_init(&a);
        void *m = kvs__arena_alloc(&a, rd->size);
        if (m != NULL && rd->decode(payload, rec_len, h->version, &a, m) == KVS_OK)
            kvs__record_format(rd, m, body, sizeof(body));
        else
            snprintf(body, sizeof(body), "(does not decode)");
        kvs__arena_free(&a);
    }
    KVS_LOG_(data ? KVS_LOG_TRACE : KVS_LOG_DEBUG, "%s %s %s%s #%u v%u %u bytes %s", who, dir,
             kvs__msg_name(h->type), rsp ? " reply" : "", h->req_id, h->version, h->len, body);
}

/* ---- the schema as documentation ------------------------------------------------------------ */

static const char *kind_name(kvs__kind_t k)
{
    switch (k) {
    case KVS__KIND_U8:
        return "u8";
    case KVS__KIND_U16:
        return "u16";
    case KVS__KIND_U32:
        return "u32";
    case KVS__KIND_U64:
        return "u64";
    case KVS__KIND_I32:
        return "i32";
    case KVS__KIND_I64:
        return "i64";
    case KVS__KIND_STR:
        return "string";
    case KVS__KIND_BLOB:
        return "bytes";
    case KVS__KIND_STRS:
        return "array of string";
    case KVS__KIND_I32S:
        return "array of i32";
    case KVS__KIND_ARR:
        return "array of";
    }
    return "?";
}

void kvs__schema_write_markdown(FILE *out)
{
    fprintf(out, "Protocol versions %u..%u.\n\n", KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
    fprintf(out, "| message | type | request | reply |\n|---|---|---|---|\n");
    for (unsigned t = 1; t < KVS_MSG_MAX_; t++) {
        const kvs__msg_desc_t *m = kvs__msg_desc(t);
        if (m == NULL)
            continue;
        fprintf(out, "| `%s` | %u | `%s`%s | `%s`%s |\n", m->name, m->type, m->req->name,
                m->raw == KVS_MSG_RAW_REQ ? " + bytes" : "", m->rsp->name,
                m->raw == KVS_MSG_RAW_RSP ? " + bytes" : "");
    }
    for (size_t i = 0; i < kvs__records_count; i++) {
        const kvs__rec_desc_t *d = kvs__records[i];
        fprintf(out, "\n#### `%s`\n\n| field | kind | since | limit |\n|---|---|---|---|\n",
                d->name);
        for (uint32_t j = 0; j < d->nfields; j++) {
            const kvs__field_desc_t *f = &d->fields[j];
            char kind[64], since[64], limit[64] = "";
            if (f->kind == KVS__KIND_ARR)
                snprintf(kind, sizeof(kind), "array of `%s`", f->elem->name);
            else
                snprintf(kind, sizeof(kind), "%s", kind_name(f->kind));
            if (f->since > KVS_PROTO_VERSION_MAX)
                snprintf(since, sizeof(since), "test builds only");
            else
                snprintf(since, sizeof(since), "%u", f->since);
            if (f->kind == KVS__KIND_STR || f->kind == KVS__KIND_BLOB)
                snprintf(limit, sizeof(limit), "<= %u bytes", f->max_len);
            else if (f->kind == KVS__KIND_STRS)
                snprintf(limit, sizeof(limit), "<= %u x <= %u bytes", f->max_count, f->max_len);
            else if (f->kind == KVS__KIND_I32S || f->kind == KVS__KIND_ARR)
                snprintf(limit, sizeof(limit), "<= %u", f->max_count);
            fprintf(out, "| `%s` | %s | %s | %s |\n", f->name, kind, since, limit);
        }
    }
}
