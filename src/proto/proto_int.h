/* Wire format: framed little-endian messages between clients, owners and the master.
 *
 * Every frame starts with a 16-byte header (magic, version, type, request id, payload length).
 * The first frame on a connection is HELLO, which carries the protocol version again so that a
 * peer speaking another version is told so in plain words before anything else happens.
 * Decoders bound every count and length by what is left in the payload, so a forged count can
 * never make the receiver allocate or read more than the frame it already holds. */
#ifndef KVS_PROTO_INT_H
#define KVS_PROTO_INT_H

#include "../common/auth_int.h"
#include "../common/common_int.h"

#include "schema.h"

#include <stdio.h>

#define KVS_PROTO_MAGIC   0x5453564bu /* "KVST" in memory order */
#define KVS_FRAME_HDR_LEN 16u
/* Largest payload any decoder accepts unless a caller sets a smaller limit. */
#define KVS_FRAME_MAX_PAYLOAD (64u << 20)
#define KVS_RSP_FLAG          0x8000u

/* Largest payload a server reads before the connection's handshake is done: HELLO (and what
 * follows it to authenticate) is a few hundred bytes, so a peer that has not identified itself
 * cannot make a server allocate more (the frame cap above holds after it). */
#define KVS_HANDSHAKE_MAX_PAYLOAD 4096u

typedef enum {
#define KVS_MSG_ENUM_(name, num, req, rsp, raw) KVS_MSG_##name = (num),
    KVS_SCHEMA_MESSAGES(KVS_MSG_ENUM_)
#undef KVS_MSG_ENUM_
        KVS_MSG_MAX_ /* one past the highest number */
} kvs_msg_type_t;

/* "LOOKUP", or "UNKNOWN" for a type this build does not know (the response flag is ignored). */
const char *kvs__msg_name(unsigned type);
/* Whether this build knows the message type (the response flag is ignored). */
bool kvs__msg_known(unsigned type);

/* The version a peer should be answered in: the request's, or the highest this build speaks
 * if the request's is higher (only HELLO may be). */
unsigned kvs__proto_reply_version(unsigned request_version);
/* The version whose fields a decoder reads from a frame of `version`. */
static inline unsigned kvs__proto_read_version(unsigned version)
{
    return version < KVS_PROTO_VERSION_MAX ? version : KVS_PROTO_VERSION_MAX;
}
/* The highest version in both [min, max] and this build's range, or 0 when there is none. */
unsigned kvs__proto_negotiate(unsigned peer_min, unsigned peer_max);

typedef struct {
    uint32_t magic;
    uint16_t version; /* the protocol version the payload is encoded in */
    uint16_t type;    /* kvs_msg_type_t, with KVS_RSP_FLAG set on responses */
    uint32_t req_id;
    uint32_t len; /* payload bytes after the header */
} kvs__frame_hdr_t;

void kvs__frame_hdr_encode(const kvs__frame_hdr_t *hdr, uint8_t out[KVS_FRAME_HDR_LEN]);
/* Checks magic, version, type and that len <= max_payload. Returns OK, PROTOCOL_ERROR (bad
 * magic, type 0, oversized) or INVALID_VERSION (below this build's range, or above it on
 * anything but a HELLO request). Types this build does not know pass, so that the receiver
 * can skip the payload and answer with a clear error (kvs__msg_known). */
int kvs__frame_hdr_decode(const uint8_t *buf, size_t len, uint32_t max_payload,
                          kvs__frame_hdr_t *hdr_p);

/* ---- buffers -------------------------------------------------------------------------------- */

/* Growable output buffer. A failed allocation sets `failed`; later puts are ignored. A string or
 * array beyond its schema limit sets `invalid`. `version` is the protocol version encoders
 * write (set by kvs__frame_begin); for a received payload, the version it was encoded in. */
typedef struct {
    uint8_t *data;
    size_t len;
    size_t cap;
    bool failed;
    bool invalid;
    bool fixed; /* over caller memory: never grows (an overflow sets `failed`) */
    uint16_t version;
} kvs__wbuf_t;

void kvs__wbuf_init(kvs__wbuf_t *w);
/* A buffer over `cap` bytes of caller memory, encoding in `version`; never reallocated. */
kvs__wbuf_t kvs__wbuf_over(void *buf, size_t cap, unsigned version);
void kvs__wbuf_reset(kvs__wbuf_t *w);
void kvs__wbuf_free(kvs__wbuf_t *w);
void kvs__wbuf_put_bytes(kvs__wbuf_t *w, const void *p, size_t n);
/* Where the next `n` bytes go, growing the buffer if needed; NULL (and `failed`) when it
 * cannot. The inline puts below take the fast path without a call. */
uint8_t *kvs__wbuf_grow(kvs__wbuf_t *w, size_t n);

static inline void kvs__le_store(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t kvs__le_load(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline void kvs__wbuf_put_le_(kvs__wbuf_t *w, uint64_t v, unsigned n)
{
    uint8_t *p;
    if (!w->failed && w->cap - w->len >= n) {
        p = w->data + w->len;
        w->len += n;
    } else if ((p = kvs__wbuf_grow(w, n)) == NULL) {
        return;
    }
    kvs__le_store(p, v, n);
}

static inline void kvs__wbuf_put_u8(kvs__wbuf_t *w, uint8_t v)
{
    kvs__wbuf_put_le_(w, v, 1);
}

static inline void kvs__wbuf_put_u16(kvs__wbuf_t *w, uint16_t v)
{
    kvs__wbuf_put_le_(w, v, 2);
}

static inline void kvs__wbuf_put_u32(kvs__wbuf_t *w, uint32_t v)
{
    kvs__wbuf_put_le_(w, v, 4);
}

static inline void kvs__wbuf_put_u64(kvs__wbuf_t *w, uint64_t v)
{
    kvs__wbuf_put_le_(w, v, 8);
}

static inline void kvs__wbuf_put_i32(kvs__wbuf_t *w, int32_t v)
{
    kvs__wbuf_put_le_(w, (uint32_t)v, 4);
}

/* Borrowed byte string: points into the payload it was decoded from. */
typedef struct {
    const char *ptr;
    uint32_t len;
} kvs__str_t;

/* Borrowed bytes (nonces, digests): point into the payload they were decoded from. */
typedef struct {
    const uint8_t *ptr;
    uint32_t len;
} kvs__blob_t;

/* A u32 length and the bytes; beyond `max` bytes marks the buffer invalid. */
void kvs__wbuf_put_str(kvs__wbuf_t *w, kvs__str_t s, uint32_t max);
/* An array count; beyond `max` marks the buffer invalid. */
void kvs__wbuf_put_count(kvs__wbuf_t *w, uint32_t n, uint32_t max);
void kvs__wbuf_put_i32s(kvs__wbuf_t *w, const int32_t *v, uint32_t n);
kvs__str_t kvs__str_c(const char *s);
bool kvs__str_eq(kvs__str_t a, kvs__str_t b);

/* Starts a frame of protocol `version` (reserves the header); kvs__frame_end writes the header
 * with the final length. Returns PROTOCOL_ERROR if the payload exceeds KVS_FRAME_MAX_PAYLOAD,
 * INVALID_PARAMS if a field broke its schema limit, NO_MEMORY on allocation failure. */
void kvs__frame_begin(kvs__wbuf_t *w, uint16_t type, uint32_t req_id, unsigned version);
int kvs__frame_end(kvs__wbuf_t *w);

/* Bounds-checked reader. Any short read sets `failed` and yields zeros. */
typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
    bool failed;
} kvs__rbuf_t;

void kvs__rbuf_init(kvs__rbuf_t *r, const void *p, size_t len);

static inline uint64_t kvs__rbuf_le_(kvs__rbuf_t *r, unsigned n)
{
    if (r->failed || r->len - r->pos < n) {
        r->failed = true;
        return 0;
    }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return kvs__le_load(p, n);
}

static inline uint8_t kvs__rbuf_u8(kvs__rbuf_t *r)
{
    return (uint8_t)kvs__rbuf_le_(r, 1);
}

static inline uint16_t kvs__rbuf_u16(kvs__rbuf_t *r)
{
    return (uint16_t)kvs__rbuf_le_(r, 2);
}

static inline uint32_t kvs__rbuf_u32(kvs__rbuf_t *r)
{
    return (uint32_t)kvs__rbuf_le_(r, 4);
}

static inline uint64_t kvs__rbuf_u64(kvs__rbuf_t *r)
{
    return kvs__rbuf_le_(r, 8);
}

static inline int32_t kvs__rbuf_i32(kvs__rbuf_t *r)
{
    return (int32_t)(uint32_t)kvs__rbuf_le_(r, 4);
}
/* A string of at most max_len bytes (u32 length prefix). */
kvs__str_t kvs__rbuf_str(kvs__rbuf_t *r, uint32_t max_len);
kvs__blob_t kvs__rbuf_blob(kvs__rbuf_t *r, uint32_t max_len);
void kvs__rbuf_i32s(kvs__rbuf_t *r, int32_t *out, uint32_t n);
/* The end of a decode: OK when nothing failed and the payload was consumed, or when it was
 * encoded in a version above this build's (newer trailing fields are skipped). */
int kvs__rbuf_finish(kvs__rbuf_t *r, unsigned version);
/* An element count, refused when above `max` or when `count * min_elem_bytes` exceeds what is
 * left in the payload. */
uint32_t kvs__rbuf_count(kvs__rbuf_t *r, uint32_t max, size_t min_elem_bytes);

/* Bump allocator for decoded arrays; everything goes when the arena is reset or freed. */
typedef struct kvs__arena_chunk kvs__arena_chunk_t;
typedef struct {
    kvs__arena_chunk_t *head;
} kvs__arena_t;

void kvs__arena_init(kvs__arena_t *a);
void *kvs__arena_alloc(kvs__arena_t *a, size_t size);
void kvs__arena_free(kvs__arena_t *a);
/* Whether freed chunks are kept for later arenas (not under AddressSanitizer). */
bool kvs__arena_pooling(void);

/* ---- schema ------------------------------------------------------------------------------
 * Every message's struct, codec and descriptor, generated from schema.h by schema_gen.h. */

typedef enum {
    KVS__KIND_U8,
    KVS__KIND_U16,
    KVS__KIND_U32,
    KVS__KIND_U64,
    KVS__KIND_I32,
    KVS__KIND_I64,
    KVS__KIND_STR,
    KVS__KIND_BLOB,
    KVS__KIND_STRS,
    KVS__KIND_I32S,
    KVS__KIND_ARR,
} kvs__kind_t;

typedef struct kvs__rec_desc kvs__rec_desc_t;

/* One field as the schema declares it, with where it lives in the struct. */
typedef struct {
    const char *name;
    kvs__kind_t kind;
    unsigned since;
    uint32_t max_len;   /* STR, BLOB, STRS: bytes per string */
    uint32_t max_count; /* STRS, I32S, ARR */
    size_t offset;
    size_t count_offset;         /* arrays: where the uint32_t count lives */
    const kvs__rec_desc_t *elem; /* ARR: the element record */
} kvs__field_desc_t;

struct kvs__rec_desc {
    const char *name;
    size_t size; /* of the struct */
    uint32_t nfields;
    const kvs__field_desc_t *fields;
    void (*encode)(kvs__wbuf_t *w, const void *m);
    int (*decode)(const void *p, size_t len, unsigned version, kvs__arena_t *a, void *m_p);
};

#include "schema_gen.h"

KVS_SCHEMA_RECORDS(KVS_GEN_DECLARE)

/* The fixed part of a data request, and the largest data chunk of one frame (transports split
 * longer transfers). */
#define KVS_DATA_REQ_LEN    64u
#define KVS_DATA_STATUS_LEN 4u
#define KVS_DATA_MAX_CHUNK  (16u << 20)

/* Every message type with its request and response records (NULL: empty payload). */
typedef struct {
    const char *name;
    unsigned type;
    const kvs__rec_desc_t *req;
    const kvs__rec_desc_t *rsp;
    unsigned raw; /* KVS_MSG_RAW_REQ / KVS_MSG_RAW_RSP: bytes follow the record */
} kvs__msg_desc_t;
/* The descriptor of a known type (response flag ignored), NULL otherwise. */
const kvs__msg_desc_t *kvs__msg_desc(unsigned type);

/* Every top-level and nested record, in schema order (tests, fuzzers, documentation). */
extern const kvs__rec_desc_t *const kvs__records[];
extern const size_t kvs__records_count;

/* Formats a decoded record as `{field=value ...}` for logs, arrays shortened to their first
 * few elements. Always NUL-terminates; returns buf. */
char *kvs__record_format(const kvs__rec_desc_t *d, const void *m, char *buf, size_t cap);
/* Writes every message and record of the schema as Markdown tables (docs/protocol.md holds
 * this output; `kvstash schema` prints it). */
void kvs__schema_write_markdown(FILE *out);
/* At debug level (trace for data frames), logs one frame: who saw it, its header and, when
 * the payload decodes, its fields. */
void kvs__frame_log(const char *who, const char *dir, const kvs__frame_hdr_t *h,
                    const void *payload, size_t len);

#endif
