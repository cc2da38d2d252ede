/* libFuzzer target for one decoder (chosen at build time by KVS_FUZZ_CODEC, an index into
 * kvs__codecs, or -1 for the frame header). Whatever decodes must re-encode to the same
 * bytes: decoders accept only canonical payloads, so a mismatch is a bug. */
#include "proto/proto_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
#if KVS_FUZZ_CODEC < 0
    kvs__frame_hdr_t h;
    if (kvs__frame_hdr_decode(data, size, KVS_FRAME_MAX_PAYLOAD, &h) == KVS_OK) {
        uint8_t out[KVS_FRAME_HDR_LEN];
        kvs__frame_hdr_encode(&h, out);
        if (memcmp(out, data, sizeof(out)) != 0)
            abort();
    }
#else
    kvs__arena_t arena;
    kvs__wbuf_t w;
    kvs__arena_init(&arena);
    kvs__wbuf_init(&w);
    if (kvs__codecs[KVS_FUZZ_CODEC].fn(data, size, &arena, &w) == KVS_OK) {
        if (w.len != size || (size && memcmp(w.data, data, size) != 0))
            abort();
    }
    kvs__wbuf_free(&w);
    kvs__arena_free(&arena);
#endif
    return 0;
}
