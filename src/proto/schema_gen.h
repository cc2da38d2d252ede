/* Generators over a schema table (schema.h): the struct of each record, its encoder and decoder
 * and its descriptor. Applied to the product's schema in proto_int.h and wire.c; tests apply
 * them to schemas of their own. A record `rec` gives:
 *   kvs__rec_t                                          the struct
 *   void kvs__rec_encode(w, m)                          appends m at w->version
 *   int  kvs__rec_decode(p, len, version, arena, m_p)   fills m from a whole payload
 *   uint64_t kvs__rec_max_bytes(void)                   largest encoding at any version
 *   KVS__MIN_BYTES_rec                                  smallest encoding at any version
 *   const kvs__rec_desc_t kvs__rec_desc                 names, kinds and offsets of the fields
 * Decoders read the fields a frame of `version` carries. A frame of a version above the
 * highest this build speaks may carry fields appended after the known ones: they are skipped
 * (only at the top level; see docs/protocol.md). Otherwise the payload must be consumed
 * exactly. Arrays come from the arena; strings and blobs point into the payload. */
#ifndef KVS_SCHEMA_GEN_H
#define KVS_SCHEMA_GEN_H

#include <stddef.h>

/* ---- structs ------------------------------------------------------------------------------ */

#define KVS_F_TYPE_U8(name, a, b)   uint8_t name;
#define KVS_F_TYPE_U16(name, a, b)  uint16_t name;
#define KVS_F_TYPE_U32(name, a, b)  uint32_t name;
#define KVS_F_TYPE_U64(name, a, b)  uint64_t name;
#define KVS_F_TYPE_I32(name, a, b)  int32_t name;
#define KVS_F_TYPE_I64(name, a, b)  int64_t name;
#define KVS_F_TYPE_STR(name, a, b)  kvs__str_t name;
#define KVS_F_TYPE_BLOB(name, a, b) kvs__blob_t name;
#define KVS_F_TYPE_STRS(name, a, b)                                                                \
    uint32_t n##name;                                                                              \
    kvs__str_t *name;
#define KVS_F_TYPE_I32S(name, a, b)                                                                \
    uint32_t n##name;                                                                              \
    int32_t *name;
#define KVS_F_TYPE_ARR(name, elem, b)                                                              \
    uint32_t n##name;                                                                              \
    kvs__##elem##_t *name;

#define KVS_GEN_FIELD_TYPE_(R, kind, name, since, a, b) KVS_F_TYPE_##kind(name, a, b)
#define KVS_GEN_STRUCT(rec)                                                                        \
    typedef struct {                                                                               \
        KVS_FIELDS_##rec(KVS_GEN_FIELD_TYPE_, rec)                                                 \
    } kvs__##rec##_t;

/* ---- size bounds -------------------------------------------------------------------------- */

/* Smallest encoding of a field (a length or count prefix for variable ones). */
#define KVS_F_MIN_U8(a, b)   1
#define KVS_F_MIN_U16(a, b)  2
#define KVS_F_MIN_U32(a, b)  4
#define KVS_F_MIN_U64(a, b)  8
#define KVS_F_MIN_I32(a, b)  4
#define KVS_F_MIN_I64(a, b)  8
#define KVS_F_MIN_STR(a, b)  4
#define KVS_F_MIN_BLOB(a, b) 4
#define KVS_F_MIN_STRS(a, b) 4
#define KVS_F_MIN_I32S(a, b) 4
#define KVS_F_MIN_ARR(a, b)  4
/* Fields every supported version carries count towards the minimum. */
#define KVS_GEN_FIELD_MIN_(R, kind, name, since, a, b)                                             \
    +((since) <= KVS_PROTO_VERSION_MIN ? KVS_F_MIN_##kind(a, b) : 0)

#define KVS_F_MAX_U8(a, b)                             1u
#define KVS_F_MAX_U16(a, b)                            2u
#define KVS_F_MAX_U32(a, b)                            4u
#define KVS_F_MAX_U64(a, b)                            8u
#define KVS_F_MAX_I32(a, b)                            4u
#define KVS_F_MAX_I64(a, b)                            8u
#define KVS_F_MAX_STR(a, b)                            (4u + (uint64_t)(a))
#define KVS_F_MAX_BLOB(a, b)                           (4u + (uint64_t)(a))
#define KVS_F_MAX_STRS(a, b)                           (4u + (uint64_t)(b) * (4u + (uint64_t)(a)))
#define KVS_F_MAX_I32S(a, b)                           (4u + (uint64_t)(b)*4u)
#define KVS_F_MAX_ARR(a, b)                            (4u + (uint64_t)(b)*kvs__##a##_max_bytes())
#define KVS_GEN_FIELD_MAX_(R, kind, name, since, a, b) +KVS_F_MAX_##kind(a, b)

/* Declarations: the struct, its bounds, codec and descriptor. */
#define KVS_GEN_DECLARE(rec)                                                                       \
    KVS_GEN_STRUCT(rec)                                                                            \
    enum { KVS__MIN_BYTES_##rec = 0 KVS_FIELDS_##rec(KVS_GEN_FIELD_MIN_, rec) };                   \
    __attribute__((unused)) static inline uint64_t kvs__##rec##_max_bytes(void)                    \
    {                                                                                              \
        return 0 KVS_FIELDS_##rec(KVS_GEN_FIELD_MAX_, rec);                                        \
    }                                                                                              \
    void kvs__##rec##_encode(kvs__wbuf_t *w, const kvs__##rec##_t *m);                             \
    int kvs__##rec##_decode(const void *p, size_t len, unsigned version, kvs__arena_t *a,          \
                            kvs__##rec##_t *m_p);                                                  \
    extern const kvs__rec_desc_t kvs__##rec##_desc;

/* ---- encoders ----------------------------------------------------------------------------- */

/* Strings and arrays beyond their limits mark the buffer invalid: the peer would refuse them. */
#define KVS_F_PUT_U8(name, a, b)  kvs__wbuf_put_u8(w, m->name);
#define KVS_F_PUT_U16(name, a, b) kvs__wbuf_put_u16(w, m->name);
#define KVS_F_PUT_U32(name, a, b) kvs__wbuf_put_u32(w, m->name);
#define KVS_F_PUT_U64(name, a, b) kvs__wbuf_put_u64(w, m->name);
#define KVS_F_PUT_I32(name, a, b) kvs__wbuf_put_u32(w, (uint32_t)m->name);
#define KVS_F_PUT_I64(name, a, b) kvs__wbuf_put_u64(w, (uint64_t)m->name);
#define KVS_F_PUT_STR(name, a, b) kvs__wbuf_put_str(w, m->name, (a));
#define KVS_F_PUT_BLOB(name, a, b)                                                                 \
    kvs__wbuf_put_str(w, (kvs__str_t){(const char *)m->name.ptr, m->name.len}, (a));
#define KVS_F_PUT_STRS(name, a, b)                                                                 \
    kvs__wbuf_put_count(w, m->n##name, (b));                                                       \
    for (uint32_t i_ = 0; i_ < m->n##name; i_++)                                                   \
        kvs__wbuf_put_str(w, m->name[i_], (a));
#define KVS_F_PUT_I32S(name, a, b)                                                                 \
    kvs__wbuf_put_count(w, m->n##name, (b));                                                       \
    kvs__wbuf_put_i32s(w, m->name, m->n##name);
#define KVS_F_PUT_ARR(name, elem, b)                                                               \
    kvs__wbuf_put_count(w, m->n##name, (b));                                                       \
    for (uint32_t i_ = 0; i_ < m->n##name; i_++)                                                   \
        kvs__##elem##_put_(w, &m->name[i_], v);
#define KVS_GEN_FIELD_PUT_(R, kind, name, since, a, b)                                             \
    if ((since) <= v) {                                                                            \
        KVS_F_PUT_##kind(name, a, b)                                                               \
    }

/* ---- decoders ----------------------------------------------------------------------------- */

#define KVS_F_GET_U8(name, a, b)   m->name = kvs__rbuf_u8(r);
#define KVS_F_GET_U16(name, a, b)  m->name = kvs__rbuf_u16(r);
#define KVS_F_GET_U32(name, a, b)  m->name = kvs__rbuf_u32(r);
#define KVS_F_GET_U64(name, a, b)  m->name = kvs__rbuf_u64(r);
#define KVS_F_GET_I32(name, a, b)  m->name = (int32_t)kvs__rbuf_u32(r);
#define KVS_F_GET_I64(name, a, b)  m->name = (int64_t)kvs__rbuf_u64(r);
#define KVS_F_GET_STR(name, a, b)  m->name = kvs__rbuf_str(r, (a));
#define KVS_F_GET_BLOB(name, a, b) m->name = kvs__rbuf_blob(r, (a));
#define KVS_F_GET_STRS(name, a, b)                                                                 \
    m->n##name = kvs__rbuf_count(r, (b), 4);                                                       \
    if ((m->name = kvs__arena_alloc(ar, (size_t)m->n##name * sizeof(*m->name))) == NULL)           \
        return KVS_NO_MEMORY;                                                                      \
    for (uint32_t i_ = 0; i_ < m->n##name && !r->failed; i_++)                                     \
        m->name[i_] = kvs__rbuf_str(r, (a));
#define KVS_F_GET_I32S(name, a, b)                                                                 \
    m->n##name = kvs__rbuf_count(r, (b), 4);                                                       \
    if ((m->name = kvs__arena_alloc(ar, (size_t)m->n##name * sizeof(*m->name))) == NULL)           \
        return KVS_NO_MEMORY;                                                                      \
    kvs__rbuf_i32s(r, m->name, m->n##name);
#define KVS_F_GET_ARR(name, elem, b)                                                               \
    m->n##name = kvs__rbuf_count(r, (b), KVS__MIN_BYTES_##elem);                                   \
    if ((m->name = kvs__arena_alloc(ar, (size_t)m->n##name * sizeof(*m->name))) == NULL)           \
        return KVS_NO_MEMORY;                                                                      \
    for (uint32_t i_ = 0; i_ < m->n##name && !r->failed; i_++) {                                   \
        int rc_ = kvs__##elem##_get_(r, ar, &m->name[i_], v);                                      \
        if (rc_ != KVS_OK)                                                                         \
            return rc_;                                                                            \
    }
#define KVS_GEN_FIELD_GET_(R, kind, name, since, a, b)                                             \
    if ((since) <= v) {                                                                            \
        KVS_F_GET_##kind(name, a, b)                                                               \
    }

/* ---- descriptors -------------------------------------------------------------------------- */

#define KVS_F_DESC_(R, kind, name, since, a, b, count_off, elem)                                   \
    {#name,         KVS__KIND_##kind,                                                              \
     (since),       (uint32_t)(a),                                                                 \
     (uint32_t)(b), offsetof(kvs__##R##_t, name),                                                  \
     (count_off),   (elem)},
#define KVS_F_DESC_U8(R, name, since, a, b)   KVS_F_DESC_(R, U8, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_U16(R, name, since, a, b)  KVS_F_DESC_(R, U16, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_U32(R, name, since, a, b)  KVS_F_DESC_(R, U32, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_U64(R, name, since, a, b)  KVS_F_DESC_(R, U64, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_I32(R, name, since, a, b)  KVS_F_DESC_(R, I32, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_I64(R, name, since, a, b)  KVS_F_DESC_(R, I64, name, since, 0, 0, 0, NULL)
#define KVS_F_DESC_STR(R, name, since, a, b)  KVS_F_DESC_(R, STR, name, since, a, 0, 0, NULL)
#define KVS_F_DESC_BLOB(R, name, since, a, b) KVS_F_DESC_(R, BLOB, name, since, a, 0, 0, NULL)
#define KVS_F_DESC_STRS(R, name, since, a, b)                                                      \
    KVS_F_DESC_(R, STRS, name, since, a, b, offsetof(kvs__##R##_t, n##name), NULL)
#define KVS_F_DESC_I32S(R, name, since, a, b)                                                      \
    KVS_F_DESC_(R, I32S, name, since, 0, b, offsetof(kvs__##R##_t, n##name), NULL)
#define KVS_F_DESC_ARR(R, name, since, elem, b)                                                    \
    KVS_F_DESC_(R, ARR, name, since, 0, b, offsetof(kvs__##R##_t, n##name), &kvs__##elem##_desc)
#define KVS_GEN_FIELD_DESC_(R, kind, name, since, a, b) KVS_F_DESC_##kind(R, name, since, a, b)

/* ---- definitions -------------------------------------------------------------------------- */

/* Encoder and decoder of one record, its descriptor, and type-erased entry points for the
 * descriptor (logging, tests, fuzzers). `v` is the version being written or read. */
#define KVS_GEN_DEFINE(rec)                                                                        \
    static void kvs__##rec##_put_(kvs__wbuf_t *w, const kvs__##rec##_t *m, unsigned v)             \
    {                                                                                              \
        (void)w, (void)m, (void)v;                                                                 \
        KVS_FIELDS_##rec(KVS_GEN_FIELD_PUT_, rec)                                                  \
    }                                                                                              \
    static int kvs__##rec##_get_(kvs__rbuf_t *r, kvs__arena_t *ar, kvs__##rec##_t *m, unsigned v)  \
    {                                                                                              \
        (void)ar;                                                                                  \
        KVS_FIELDS_##rec(KVS_GEN_FIELD_GET_, rec) return r->failed ? KVS_PROTOCOL_ERROR : KVS_OK;  \
    }                                                                                              \
    void kvs__##rec##_encode(kvs__wbuf_t *w, const kvs__##rec##_t *m)                              \
    {                                                                                              \
        kvs__##rec##_put_(w, m, w->version);                                                       \
    }                                                                                              \
    int kvs__##rec##_decode(const void *p, size_t len, unsigned version, kvs__arena_t *a,          \
                            kvs__##rec##_t *m_p)                                                   \
    {                                                                                              \
        kvs__rbuf_t r;                                                                             \
        kvs__rbuf_init(&r, p, len);                                                                \
        memset(m_p, 0, sizeof(*m_p));                                                              \
        unsigned v = kvs__proto_read_version(version);                                             \
        int rc = kvs__##rec##_get_(&r, a, m_p, v);                                                 \
        return rc != KVS_OK ? rc : kvs__rbuf_finish(&r, version);                                  \
    }                                                                                              \
    static int kvs__##rec##_decode_any_(const void *p, size_t len, unsigned version,               \
                                        kvs__arena_t *a, void *m_p)                                \
    {                                                                                              \
        return kvs__##rec##_decode(p, len, version, a, m_p);                                       \
    }                                                                                              \
    static void kvs__##rec##_encode_any_(kvs__wbuf_t *w, const void *m)                            \
    {                                                                                              \
        kvs__##rec##_encode(w, m);                                                                 \
    }                                                                                              \
    static const kvs__field_desc_t kvs__##rec##_fields_[] = {                                      \
        KVS_FIELDS_##rec(KVS_GEN_FIELD_DESC_, rec)};                                               \
    const kvs__rec_desc_t kvs__##rec##_desc = {                                                    \
        #rec,                                                                                      \
        sizeof(kvs__##rec##_t),                                                                    \
        (uint32_t)(sizeof(kvs__##rec##_fields_) / sizeof(kvs__##rec##_fields_[0])),                \
        kvs__##rec##_fields_,                                                                      \
        kvs__##rec##_encode_any_,                                                                  \
        kvs__##rec##_decode_any_};

#endif
