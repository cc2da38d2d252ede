/* Wire format: framed little-endian messages between clients, owners and the master.
 *
 * Every frame starts with a 16-byte header (magic, version, type, request id, payload length).
 * The first frame on a connection is HELLO, which carries the protocol version again so that a
 * peer speaking another version is told so in plain words before anything else happens.
 * Decoders bound every count and length by what is left in the payload, so a forged count can
 * never make the receiver allocate or read more than the frame it already holds. */
#ifndef KVS_PROTO_INT_H
#define KVS_PROTO_INT_H

#include "../common/common_int.h"

#define KVS_PROTO_MAGIC   0x5453564bu /* "KVST" in memory order */
#define KVS_PROTO_VERSION 1u
#define KVS_FRAME_HDR_LEN 16u
/* Largest payload any decoder accepts unless a caller sets a smaller limit. */
#define KVS_FRAME_MAX_PAYLOAD (64u << 20)
/* Caps that hold whatever the payload size. */
#define KVS_MAX_BATCH    65536u
#define KVS_MAX_REPLICAS 16u
#define KVS_MAX_NAME_LEN 256u
#define KVS_RSP_FLAG     0x8000u

typedef enum {
    KVS_MSG_HELLO = 1,
    KVS_MSG_MOUNT = 2,
    KVS_MSG_UNMOUNT = 3,
    KVS_MSG_HEARTBEAT = 4,
    KVS_MSG_PUT_START = 5,
    KVS_MSG_PUT_END = 6,
    KVS_MSG_PUT_REVOKE = 7,
    KVS_MSG_LOOKUP = 8,
    KVS_MSG_EXISTS = 9,
    KVS_MSG_REMOVE = 10,
    KVS_MSG_LIST = 11,
    KVS_MSG_STAT = 12,
    KVS_MSG_ERROR = 13,      /* response only: a request the peer could not even decode */
    KVS_MSG_DATA_READ = 14,  /* owner data plane: data_req; response: i32 status + bytes */
    KVS_MSG_DATA_WRITE = 15, /* owner data plane: data_req + bytes; response: i32 status */
    KVS_MSG_MAX_ = 16,
} kvs_msg_type_t;

const char *kvs__msg_name(unsigned type);

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type; /* kvs_msg_type_t, with KVS_RSP_FLAG set on responses */
    uint32_t req_id;
    uint32_t len; /* payload bytes after the header */
} kvs__frame_hdr_t;

void kvs__frame_hdr_encode(const kvs__frame_hdr_t *hdr, uint8_t out[KVS_FRAME_HDR_LEN]);
/* Checks magic, version, type and that len <= max_payload. Returns OK, PROTOCOL_ERROR (bad
 * magic, unknown type, oversized) or INVALID_VERSION. */
int kvs__frame_hdr_decode(const uint8_t *buf, size_t len, uint32_t max_payload,
                          kvs__frame_hdr_t *hdr_p);

/* ---- buffers -------------------------------------------------------------------------------- */

/* Growable output buffer. A failed allocation sets `failed`; later puts are ignored. */
typedef struct {
    uint8_t *data;
    size_t len;
    size_t cap;
    bool failed;
} kvs__wbuf_t;

void kvs__wbuf_init(kvs__wbuf_t *w);
void kvs__wbuf_reset(kvs__wbuf_t *w);
void kvs__wbuf_free(kvs__wbuf_t *w);
void kvs__wbuf_put_bytes(kvs__wbuf_t *w, const void *p, size_t n);
void kvs__wbuf_put_u8(kvs__wbuf_t *w, uint8_t v);
void kvs__wbuf_put_u16(kvs__wbuf_t *w, uint16_t v);
void kvs__wbuf_put_u32(kvs__wbuf_t *w, uint32_t v);
void kvs__wbuf_put_u64(kvs__wbuf_t *w, uint64_t v);
void kvs__wbuf_put_i32(kvs__wbuf_t *w, int32_t v);

/* Borrowed byte string: points into the payload it was decoded from. */
typedef struct {
    const char *ptr;
    uint32_t len;
} kvs__str_t;

void kvs__wbuf_put_str(kvs__wbuf_t *w, kvs__str_t s);
kvs__str_t kvs__str_c(const char *s);
bool kvs__str_eq(kvs__str_t a, kvs__str_t b);

/* Starts a frame (reserves the header); kvs__frame_end writes the header with the final length.
 * Returns PROTOCOL_ERROR if the payload exceeds KVS_FRAME_MAX_PAYLOAD, NO_MEMORY on failure. */
void kvs__frame_begin(kvs__wbuf_t *w, uint16_t type, uint32_t req_id);
int kvs__frame_end(kvs__wbuf_t *w);

/* Bounds-checked reader. Any short read sets `failed` and yields zeros. */
typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
    bool failed;
} kvs__rbuf_t;

void kvs__rbuf_init(kvs__rbuf_t *r, const void *p, size_t len);
uint8_t kvs__rbuf_u8(kvs__rbuf_t *r);
uint16_t kvs__rbuf_u16(kvs__rbuf_t *r);
uint32_t kvs__rbuf_u32(kvs__rbuf_t *r);
uint64_t kvs__rbuf_u64(kvs__rbuf_t *r);
int32_t kvs__rbuf_i32(kvs__rbuf_t *r);
/* A string of at most max_len bytes (u32 length prefix). */
kvs__str_t kvs__rbuf_str(kvs__rbuf_t *r, uint32_t max_len);
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

/* ---- messages -------------------------------------------------------------------------------
 * Each message has an encoder (appends the payload to a wbuf) and a decoder (fills the struct
 * from a whole payload, arrays from the arena, strings borrowed from the payload). Decoders
 * return OK or PROTOCOL_ERROR and reject trailing bytes. */

typedef struct {
    uint32_t version;
    kvs__str_t node;    /* the client's host name, used for same-node placement */
    uint64_t client_id; /* 0 on first contact; the id received before, on reconnection */
} kvs__hello_req_t;

typedef struct {
    int32_t status;
    uint64_t client_id;
    uint64_t lease_ms;
    uint64_t heartbeat_timeout_ms;
} kvs__hello_rsp_t;

typedef struct {
    uint64_t client_id;
    kvs__str_t name;
    kvs__str_t node;
    kvs__str_t endpoint; /* where the owner serves data, "host:port" */
    uint64_t size;
} kvs__mount_req_t;

typedef struct {
    int32_t status;
    uint64_t segment_id;
} kvs__mount_rsp_t;

/* UNMOUNT (a = client id, b = segment id) and HEARTBEAT (a = client id). */
typedef struct {
    uint64_t a;
    uint64_t b;
} kvs__ids_req_t;

/* PUT_END, PUT_REVOKE, LOOKUP, EXISTS, REMOVE: a list of keys and flags. */
#define KVS_KEYS_FLAG_FORCE 0x1u
typedef struct {
    uint32_t flags;
    uint32_t n;
    kvs__str_t *keys;
} kvs__keys_req_t;

/* Response carrying one status per key (and the status of the request itself). */
typedef struct {
    int32_t status;
    uint32_t n;
    int32_t *results;
} kvs__status_list_rsp_t;

typedef struct {
    kvs__str_t key;
    uint64_t size;
} kvs__put_item_t;

#define KVS_PUT_FLAG_SAME_NODE 0x1u
typedef struct {
    kvs__str_t node;
    uint32_t replica_num;
    kvs__str_t preferred_segment; /* empty: none */
    uint32_t flags;
    uint32_t n;
    kvs__put_item_t *items;
} kvs__put_start_req_t;

typedef struct {
    uint64_t segment_id;
    uint64_t offset;
} kvs__replica_t;

typedef struct {
    int32_t status;
    uint64_t size;
    uint64_t lease_ms; /* lookups: lease time left; puts: 0 */
    uint32_t nrep;
    kvs__replica_t *reps;
} kvs__obj_desc_t;

typedef struct {
    uint64_t id;
    kvs__str_t name;
    kvs__str_t node;
    kvs__str_t endpoint;
    uint64_t size;
    uint64_t used;
} kvs__seg_info_t;

/* PUT_START and LOOKUP responses: the segments referenced, then one descriptor per key. */
typedef struct {
    int32_t status;
    uint32_t nseg;
    kvs__seg_info_t *segs;
    uint32_t n;
    kvs__obj_desc_t *objs;
} kvs__placement_rsp_t;

typedef struct {
    kvs__str_t prefix;
    uint32_t limit;
} kvs__list_req_t;

typedef struct {
    kvs__str_t key;
    uint64_t size;
    uint32_t state; /* kvs__obj_state_t */
    uint32_t nrep;
} kvs__list_entry_t;

typedef struct {
    int32_t status;
    uint32_t truncated;
    uint32_t n;
    kvs__list_entry_t *entries;
} kvs__list_rsp_t;

/* STAT response: counters by name so new ones never break old readers. */
typedef struct {
    kvs__str_t name;
    uint64_t value;
} kvs__counter_t;

typedef struct {
    int32_t status;
    uint32_t ncounters;
    kvs__counter_t *counters;
    uint32_t nseg;
    kvs__seg_info_t *segs;
} kvs__stat_rsp_t;

typedef struct {
    int32_t status;
    kvs__str_t message;
} kvs__error_rsp_t;

/* The fixed part of a data request. A WRITE frame's payload is this (KVS_DATA_REQ_LEN bytes)
 * followed by exactly `length` bytes; a READ response's is an i32 status followed by `length`
 * bytes when the status is OK. */
#define KVS_DATA_REQ_LEN 24u
/* Largest data chunk in one frame; transports split longer transfers. */
#define KVS_DATA_MAX_CHUNK (16u << 20)
typedef struct {
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
} kvs__data_req_t;

#define KVS_DECLARE_CODEC_(name)                                                                   \
    void kvs__##name##_encode(kvs__wbuf_t *w, const kvs__##name##_t *m);                           \
    int kvs__##name##_decode(const void *p, size_t len, kvs__arena_t *a, kvs__##name##_t *m_p);

KVS_DECLARE_CODEC_(hello_req)
KVS_DECLARE_CODEC_(hello_rsp)
KVS_DECLARE_CODEC_(mount_req)
KVS_DECLARE_CODEC_(mount_rsp)
KVS_DECLARE_CODEC_(ids_req)
KVS_DECLARE_CODEC_(keys_req)
KVS_DECLARE_CODEC_(status_list_rsp)
KVS_DECLARE_CODEC_(put_start_req)
KVS_DECLARE_CODEC_(placement_rsp)
KVS_DECLARE_CODEC_(list_req)
KVS_DECLARE_CODEC_(list_rsp)
KVS_DECLARE_CODEC_(stat_rsp)
KVS_DECLARE_CODEC_(error_rsp)
KVS_DECLARE_CODEC_(data_req)

/* For tests and fuzzers: every decoder behind one signature that decodes, re-encodes and
 * returns the re-encoded payload in `w` on success. */
typedef int (*kvs__roundtrip_fn)(const void *p, size_t len, kvs__arena_t *a, kvs__wbuf_t *w);
typedef struct {
    const char *name;
    kvs__roundtrip_fn fn;
} kvs__codec_entry_t;
extern const kvs__codec_entry_t kvs__codecs[];
extern const size_t kvs__codecs_count;

#endif
