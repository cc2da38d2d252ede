/* libFuzzer target for one record of the schema (KVS_FUZZ_RECORD, its name) or, with
 * KVS_FUZZ_FRAME_HDR, the frame header. The first input byte picks the version the payload
 * is decoded in (each version this build speaks, or one above); the rest is the payload.
 * Whatever decodes must re-encode to the same bytes: decoders accept only canonical payloads,
 * and a newer version's payload must start with the fields this build knows. */
#include "proto/proto_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KVS_FUZZ_DESC_(rec)  KVS_FUZZ_DESC2_(rec)
#define KVS_FUZZ_DESC2_(rec) (&kvs__##rec##_desc)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
#ifdef KVS_FUZZ_FRAME_HDR
    kvs__frame_hdr_t h;
    if (kvs__frame_hdr_decode(data, size, KVS_FRAME_MAX_PAYLOAD, &h) == KVS_OK) {
        uint8_t out[KVS_FRAME_HDR_LEN];
        kvs__frame_hdr_encode(&h, out);
        if (memcmp(out, data, sizeof(out)) != 0)
            abort();
    }
#else
    if (size == 0)
        return 0;
    const kvs__rec_desc_t *d = KVS_FUZZ_DESC_(KVS_FUZZ_RECORD);
    unsigned span = KVS_PROTO_VERSION_MAX - KVS_PROTO_VERSION_MIN + 2;
    unsigned v = KVS_PROTO_VERSION_MIN + data[0] % span;
    const uint8_t *p = data + 1;
    size_t len = size - 1;
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    void *m = kvs__arena_alloc(&arena, d->size);
    if (m != NULL && d->decode(p, len, v, &arena, m) == KVS_OK) {
        kvs__wbuf_t w;
        kvs__wbuf_init(&w);
        w.version = (uint16_t)kvs__proto_read_version(v);
        d->encode(&w, m);
        if (w.failed || w.invalid)
            abort(); /* what decodes is within every limit */
        bool exact = v <= KVS_PROTO_VERSION_MAX;
        if ((exact ? w.len != len : w.len > len) || (w.len && memcmp(w.data, p, w.len) != 0))
            abort();
        char text[256];
        kvs__record_format(d, m, text, sizeof(text));
        kvs__wbuf_free(&w);
    }
    kvs__arena_free(&arena);
#endif
    return 0;
}
