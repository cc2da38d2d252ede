/* The wire schema: every message and every field, declared once. Structs, encoders, decoders,
 * size bounds, descriptors for logging and tests, and the fuzz targets are all generated from
 * these tables by schema_gen.h; docs/protocol.md explains the rules and lists every field.
 *
 * A record's fields: X(R, KIND, name, since, a, b), in wire order. `since` is the protocol
 * version that added the field: encoders write it, and decoders require it, only in frames of
 * that version or later. New fields are only ever appended to a record, with the next version.
 * KIND and its arguments:
 *   U8 U16 U32 U64 I32 I64   little-endian integers (a, b unused: 0)
 *   STR   a string: u32 length, then at most `a` bytes (kvs__str_t, borrowed from the payload)
 *   BLOB  bytes: u32 length, then at most `a` bytes (kvs__blob_t, borrowed)
 *   STRS  an array of strings of at most `a` bytes: u32 count (at most `b`), then each string
 *   I32S  an array of i32: u32 count (at most `b`), then each value
 *   ARR   an array of records `a`: u32 count (at most `b`), then each record
 * Arrays appear in structs as `uint32_t n<name>` followed by the element pointer `<name>`. */
#ifndef KVS_SCHEMA_H
#define KVS_SCHEMA_H

/* Protocol versions this build speaks. HELLO carries each side's range; peers use the highest
 * version both speak. KVS_PROTO_NEXT builds (tests only) speak one more version, with the test
 * fields below, to check that mixed-version peers interoperate. */
/* Version 3 added authentication, which version 2 peers cannot do: they are refused. Version 4
 * added tenants, upserts, pins, groups and the bulk removals (Mooncake's API); a version 3 peer
 * still works for everything else, and a request it cannot carry is refused by the client with
 * UNSUPPORTED. */
#define KVS_PROTO_VERSION_MIN 3u
#ifdef KVS_PROTO_NEXT
#define KVS_PROTO_VERSION_MAX 5u
#define KVS_PROTO_V_NEXT_     5
#else
#define KVS_PROTO_VERSION_MAX 4u
#define KVS_PROTO_V_NEXT_     1000 /* no such version: fields "since" it are never on the wire */
#endif

/* Limits that hold whatever the payload size (see also KVS_MAX_KEY_LEN). */
#define KVS_MAX_BATCH       65536u /* keys per call */
#define KVS_MAX_REPLICAS    16u
#define KVS_MAX_NAME_LEN    256u  /* segment, node and endpoint names */
#define KVS_MAX_SEGMENTS    4096u /* segments a master serves */
#define KVS_MAX_COUNTERS    1024u
#define KVS_MAX_MESSAGE_LEN 4096u
#define KVS_MAX_FENCES      65536u /* fences in one HEARTBEAT reply (more follow in the next) */
#define KVS_MAX_RELEASES    4096u  /* lease releases carried by one request */
#define KVS_MAX_TENANT_LEN  64u    /* tenant names: [A-Za-z0-9._-], "default" is the default */
#define KVS_MAX_INDEX_OPS   4096u  /* owner index entries in one HEARTBEAT reply or RECOVER */
/* A key as the master stores it: the tenant, a NUL byte, the client's key (docs/protocol.md). */
#define KVS_MAX_NS_KEY_LEN (KVS_MAX_TENANT_LEN + 1 + KVS_MAX_KEY_LEN)

/* ---- records used inside messages -------------------------------------------------------- */

/* `cap`: in PUT_START replies, the capability the owner wants with every write of this replica
 * (kvs__write_cap over the segment, the range and the put's token); 0 in lookups. */
#define KVS_FIELDS_replica(X, R)                                                                   \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, U64, offset, 2, 0, 0)                                                                     \
    X(R, U64, cap, 3, 0, 0)

#define KVS_FIELDS_seg_info(X, R)                                                                  \
    X(R, U64, id, 2, 0, 0)                                                                         \
    X(R, STR, name, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, STR, node, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, STR, endpoint, 2, KVS_MAX_NAME_LEN, 0) /* where the owner serves data, "host:port" */     \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, U64, used, 2, 0, 0)

#define KVS_FIELDS_obj_desc(X, R)                                                                  \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, U64, lease_ms, 2, 0, 0) /* lookups: lease time left; puts: 0 */                           \
    X(R, ARR, reps, 2, replica, KVS_MAX_REPLICAS)                                                  \
    X(R, U64, token, 2, 0, 0)     /* PUT_START: the put's token, carried by its writes */          \
    X(R, U64, lease_id, 2, 0, 0)  /* LOOKUP: this read's lease, named by its release */            \
    X(R, U64, cap_epoch, 3, 0, 0) /* PUT_START: the epoch its capabilities were made in */         \
    X(R, U32, next_probe, KVS_PROTO_V_NEXT_, 0, 0)

/* `group` (Mooncake's group_ids): objects of one group are placed together, on the segments
 * the group's latest object went to, while they have room. Empty: no group. */
#define KVS_FIELDS_put_item(X, R)                                                                  \
    X(R, STR, key, 2, KVS_MAX_KEY_LEN, 0)                                                          \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, STR, group, 4, KVS_MAX_NAME_LEN, 0)

#define KVS_FIELDS_list_entry(X, R)                                                                \
    X(R, STR, key, 2, KVS_MAX_KEY_LEN, 0)                                                          \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, U32, state, 2, 0, 0) /* kvs__obj_state_t */                                               \
    X(R, U32, nrep, 2, 0, 0)

/* STAT counters travel by name so that new ones never break old readers. */
#define KVS_FIELDS_counter(X, R)                                                                   \
    X(R, STR, name, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, U64, value, 2, 0, 0)

/* ---- message payloads ----------------------------------------------------------------------- */

#define KVS_FIELDS_hello_req(X, R)                                                                 \
    X(R, U32, version_min, 2, 0, 0)                                                                \
    X(R, U32, version_max, 2, 0, 0)                                                                \
    X(R, STR, node, 2, KVS_MAX_NAME_LEN, 0) /* the peer's host, for same-node placement */         \
    X(R, U64, client_id, 2, 0, 0)           /* 0 on first contact, else the id received before */  \
    X(R, BLOB, auth_nonce, 3, KVS_AUTH_NONCE_LEN, 0) /* fresh per connection */                    \
    X(R, STR, tenant, 4, KVS_MAX_TENANT_LEN, 0)      /* the keys' namespace; empty: "default" */   \
    X(R, U64, next_probe, KVS_PROTO_V_NEXT_, 0, 0)

#define KVS_FIELDS_hello_rsp(X, R)                                                                 \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, U32, version, 2, 0, 0) /* the version both sides use from now on */                       \
    X(R, U64, client_id, 2, 0, 0)                                                                  \
    X(R, U64, incarnation, 2, 0, 0) /* random per master start; 0 from owners */                   \
    X(R, U64, lease_ms, 2, 0, 0)                                                                   \
    X(R, U64, heartbeat_timeout_ms, 2, 0, 0)                                                       \
    X(R, U32, auth, 3, 0, 0) /* KVS_HELLO_AUTH_*: what must follow before any request */           \
    X(R, BLOB, auth_nonce, 3, KVS_AUTH_NONCE_LEN, 0) /* the server's, fresh per connection */      \
    X(R, BLOB, auth_proof, 3, KVS_AUTH_PROOF_LEN, 0) /* the server's proof over both nonces */     \
    X(R, U64, term, 4, 0, 0) /* the leader's term (docs/ha.md); 0: no etcd, or not leading */      \
    X(R, U64, next_probe, KVS_PROTO_V_NEXT_, 0, 0) /* echoes the request's */

/* AUTH, after a HELLO answered with KVS_HELLO_AUTH_HMAC: the client's proof over both nonces.
 * Until it succeeds the connection has no identity: the master binds the client id (given in
 * HELLO, or new) only now, and answers it here (the HELLO reply's client_id is then 0). */
#define KVS_FIELDS_auth_req(X, R) X(R, BLOB, proof, 3, KVS_AUTH_PROOF_LEN, 0)

#define KVS_FIELDS_auth_rsp(X, R)                                                                  \
    X(R, I32, status, 3, 0, 0)                                                                     \
    X(R, U64, client_id, 3, 0, 0)

/* The owner is the connection's client (HELLO): ids in payloads are never trusted. */
#define KVS_FIELDS_mount_req(X, R)                                                                 \
    X(R, STR, name, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, STR, node, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, STR, endpoint, 2, KVS_MAX_NAME_LEN, 0)                                                    \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, BLOB, write_key, 3, KVS_WRITE_KEY_LEN, 0) /* the segment's key for write caps */          \
    X(R, U64, segment_id, 4, 0, 0) /* re-registration with a new leader: its id; else 0 */

/* Segment ids are random per mount: never reused, also across master restarts, so an id
 * names one generation of one segment (a re-mount gets a new one). */
#define KVS_FIELDS_mount_rsp(X, R)                                                                 \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, U64, epoch, 3, 0, 0) /* the master's capability epoch now (see heartbeat_rsp) */

/* Fencing: the master lists in HEARTBEAT replies, numbered per segment, every put that is over
 * (ended, revoked, discarded, removed while pending); the owner refuses every later write with
 * those tokens and acknowledges the highest number it has applied in its next HEARTBEAT. Only
 * then does the space of a put ended early, or of an object removed, return to the allocator.
 * Capabilities are made in epochs (one per put discard time, counted by the master, told in
 * MOUNT and HEARTBEAT replies): an owner refuses capabilities older than the previous epoch,
 * so it forgets a fence once its put's epoch is that old. */
#define KVS_FIELDS_fence(X, R)                                                                     \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, U64, token, 2, 0, 0)                                                                      \
    X(R, U64, seq, 2, 0, 0)                                                                        \
    X(R, U64, epoch, 3, 0, 0) /* the put's capability epoch: the fence may go after it */

#define KVS_FIELDS_fence_ack(X, R)                                                                 \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, U64, seq, 2, 0, 0)       /* every fence of the segment up to this one is applied */       \
    X(R, U64, index_seq, 4, 0, 0) /* and every index change up to this one */

/* High availability (docs/ha.md): every owner keeps an index of the complete objects in its
 * segment, so that a new leader master can rebuild its metadata from the owners. The master
 * tells each owner what changes, in HEARTBEAT replies, numbered per segment like fences: ADD
 * (an object completed, with everything needed to serve it again) and DEL (it went: removed,
 * evicted, replaced, its copy cleared; only the token is set). The owner acknowledges the
 * highest number applied in fence_ack.index_seq. A RECOVER request carries the owner's index
 * (ADD entries, seq 0) to a new leader after the MOUNT that re-registers the segment under its
 * old id. `version` orders two versions of one key across owners (higher is newer). */
#define KVS_INDEX_ADD           1u
#define KVS_INDEX_DEL           2u
#define KVS_INDEX_FLAG_HARD_PIN 0x1u
#define KVS_FIELDS_index_op(X, R)                                                                  \
    X(R, U64, segment_id, 4, 0, 0)                                                                 \
    X(R, U64, seq, 4, 0, 0)                                                                        \
    X(R, U32, op, 4, 0, 0) /* KVS_INDEX_* */                                                       \
    X(R, STR, key, 4, KVS_MAX_NS_KEY_LEN, 0)                                                       \
    X(R, U64, offset, 4, 0, 0)                                                                     \
    X(R, U64, size, 4, 0, 0)                                                                       \
    X(R, U64, token, 4, 0, 0)   /* the put's: names the entry */                                   \
    X(R, U64, writer, 4, 0, 0)  /* the client that wrote it */                                     \
    X(R, U64, version, 4, 0, 0) /* grows with every completion, across leaders */                  \
    X(R, U32, flags, 4, 0, 0)   /* KVS_INDEX_FLAG_* */

#define KVS_FIELDS_recover_req(X, R)                                                               \
    X(R, U64, segment_id, 4, 0, 0)                                                                 \
    X(R, ARR, objects, 4, index_op, KVS_MAX_INDEX_OPS)                                             \
    X(R, U32, last, 4, 0, 0) /* the last page: the segment's free space may be handed out */

/* One ack per segment the owner serves: only the segments named stay mounted. */
/* wait_ms (HA): the master may hold the reply this long, until it has fences or index
 * changes to tell (the owner then hears of them at once, and acknowledges them at once). */
#define KVS_FIELDS_heartbeat_req(X, R)                                                             \
    X(R, ARR, acks, 2, fence_ack, KVS_MAX_SEGMENTS)                                                \
    X(R, U64, wait_ms, 4, 0, 0)

#define KVS_FIELDS_heartbeat_rsp(X, R)                                                             \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, ARR, fences, 2, fence, KVS_MAX_FENCES)                                                    \
    X(R, U64, epoch, 3, 0, 0)                        /* the master's capability epoch now */       \
    X(R, ARR, index, 4, index_op, KVS_MAX_INDEX_OPS) /* changes not yet acknowledged */

/* UNMOUNT: a segment of the connection's client. */
#define KVS_FIELDS_ids_req(X, R) X(R, U64, segment_id, 2, 0, 0)

/* A read done: the lease its lookup took on the key ends. */
#define KVS_FIELDS_lease_release(X, R)                                                             \
    X(R, STR, key, 2, KVS_MAX_KEY_LEN, 0)                                                          \
    X(R, U64, lease_id, 2, 0, 0)

#define KVS_FIELDS_put_token(X, R) X(R, U64, token, 2, 0, 0)

/* PUT_END, PUT_REVOKE, LOOKUP, EXISTS, REMOVE, RELEASE: keys and flags (KVS_KEYS_FLAG_*), and
 * the leases of reads the client has finished since its last request (applied first).
 * PUT_END and PUT_REVOKE name each key's put by its token (same order as the keys), so a late
 * end can never complete another put of the same key. */
#define KVS_FIELDS_keys_req(X, R)                                                                  \
    X(R, U32, flags, 2, 0, 0)                                                                      \
    X(R, STRS, keys, 2, KVS_MAX_KEY_LEN, KVS_MAX_BATCH)                                            \
    X(R, ARR, released, 2, lease_release, KVS_MAX_RELEASES)                                        \
    X(R, ARR, tokens, 2, put_token, KVS_MAX_BATCH)                                                 \
    X(R, STR, segment, 4, KVS_MAX_NAME_LEN, 0) /* REPLICA_CLEAR: its segment; else empty */

/* One status per key, and the status of the request itself. */
#define KVS_FIELDS_status_list_rsp(X, R)                                                           \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, I32S, results, 2, 0, KVS_MAX_BATCH)

#define KVS_FIELDS_put_start_req(X, R)                                                             \
    X(R, STR, node, 2, KVS_MAX_NAME_LEN, 0)                                                        \
    X(R, U32, replica_num, 2, 0, 0)                                                                \
    X(R, STR, preferred_segment, 2, KVS_MAX_NAME_LEN, 0) /* empty: none */                         \
    X(R, U32, flags, 2, 0, 0)                            /* KVS_PUT_FLAG_* */                      \
    X(R, ARR, items, 2, put_item, KVS_MAX_BATCH)                                                   \
    X(R, U32, soft_pin_action, 4, 0, 0) /* KVS_SOFT_PIN_* at the put's end */                      \
    X(R, U64, soft_pin_ttl_ms, 4, 0, 0) /* with KVS_PUT_FLAG_PIN_TTL; else the master's default */ \
    X(R, STRS, preferred_segments, 4, KVS_MAX_NAME_LEN, KVS_MAX_REPLICAS) /* copy i on the i-th */

/* PUT_START and LOOKUP replies: the segments referenced, then one descriptor per key. */
#define KVS_FIELDS_placement_rsp(X, R)                                                             \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, ARR, segs, 2, seg_info, KVS_MAX_SEGMENTS)                                                 \
    X(R, ARR, objs, 2, obj_desc, KVS_MAX_BATCH)

/* A listing comes in pages: each reply ends where the next one starts (next_cursor, 0 at the
 * end), so that any limit up to KVS_MAX_BATCH entries of the longest keys fits frames. */
#define KVS_FIELDS_list_req(X, R)                                                                  \
    X(R, STR, prefix, 2, KVS_MAX_KEY_LEN, 0)                                                       \
    X(R, U32, limit, 2, 0, 0)                                                                      \
    X(R, U64, cursor, 2, 0, 0) /* 0 at the start, else a reply's next_cursor */

#define KVS_FIELDS_list_rsp(X, R)                                                                  \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, U32, truncated, 2, 0, 0) /* more entries match: at next_cursor */                         \
    X(R, U64, next_cursor, 2, 0, 0)                                                                \
    X(R, ARR, entries, 2, list_entry, KVS_MAX_BATCH)

#define KVS_FIELDS_stat_rsp(X, R)                                                                  \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, ARR, counters, 2, counter, KVS_MAX_COUNTERS)                                              \
    X(R, ARR, segs, 2, seg_info, KVS_MAX_SEGMENTS)

#define KVS_FIELDS_error_rsp(X, R)                                                                 \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, STR, message, 2, KVS_MAX_MESSAGE_LEN, 0)

/* The fixed part of a data request. A DATA_WRITE payload is this followed by exactly `length`
 * bytes; a DATA_READ reply is a data_status followed by `length` bytes when the status is OK.
 * Writes carry their put's token (an owner refuses tokens the master has fenced) and the
 * replica's capability for the range the master allocated: the write must lie inside it. */
#define KVS_FIELDS_data_req(X, R)                                                                  \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, U64, offset, 2, 0, 0)                                                                     \
    X(R, U64, length, 2, 0, 0)                                                                     \
    X(R, U64, token, 2, 0, 0)        /* writes: the put's token (never 0); reads: 0 */             \
    X(R, U64, alloc_offset, 3, 0, 0) /* writes: the replica's allocated range; reads: 0 */         \
    X(R, U64, alloc_size, 3, 0, 0)                                                                 \
    X(R, U64, cap, 3, 0, 0)       /* writes: kvs__write_cap of that range; reads: 0 */             \
    X(R, U64, cap_epoch, 3, 0, 0) /* writes: the epoch the capability was made in */

#define KVS_FIELDS_data_status(X, R) X(R, I32, status, 2, 0, 0)

/* The shm transport's handshake on the owner's unix socket (not framed; encoded in
 * KVS_PROTO_VERSION_MIN, a change of layout changes the magic; nonces and proofs are always
 * exactly KVS_AUTH_NONCE_LEN and KVS_AUTH_PROOF_LEN bytes, zeros where unused): the owner greets
 * with its nonce, the reader asks for a segment with its nonce and proof, and the owner answers
 * with the segment's size, its own proof and, on success, the memfd alongside (SCM_RIGHTS). */
#define KVS_FIELDS_shm_hello(X, R)                                                                 \
    X(R, U32, magic, 2, 0, 0) /* KVS_SHM_MAGIC */                                                  \
    X(R, U32, auth, 2, 0, 0)  /* KVS_HELLO_AUTH_* */                                               \
    X(R, BLOB, nonce, 2, KVS_AUTH_NONCE_LEN, 0)

#define KVS_FIELDS_shm_req(X, R)                                                                   \
    X(R, U32, magic, 2, 0, 0) /* KVS_SHM_MAGIC */                                                  \
    X(R, U64, segment_id, 2, 0, 0)                                                                 \
    X(R, BLOB, nonce, 2, KVS_AUTH_NONCE_LEN, 0)                                                    \
    X(R, BLOB, proof, 2, KVS_AUTH_PROOF_LEN, 0)

#define KVS_FIELDS_shm_rsp(X, R)                                                                   \
    X(R, I32, status, 2, 0, 0)                                                                     \
    X(R, U64, size, 2, 0, 0)                                                                       \
    X(R, BLOB, proof, 2, KVS_AUTH_PROOF_LEN, 0)

/* Every record, each after the records it contains. */
#define KVS_SCHEMA_RECORDS(REC)                                                                    \
    REC(replica)                                                                                   \
    REC(seg_info)                                                                                  \
    REC(obj_desc)                                                                                  \
    REC(put_item)                                                                                  \
    REC(lease_release)                                                                             \
    REC(put_token)                                                                                 \
    REC(list_entry)                                                                                \
    REC(counter)                                                                                   \
    REC(fence)                                                                                     \
    REC(index_op)                                                                                  \
    REC(recover_req)                                                                               \
    REC(fence_ack)                                                                                 \
    REC(hello_req)                                                                                 \
    REC(hello_rsp)                                                                                 \
    REC(auth_req)                                                                                  \
    REC(auth_rsp)                                                                                  \
    REC(mount_req)                                                                                 \
    REC(mount_rsp)                                                                                 \
    REC(ids_req)                                                                                   \
    REC(heartbeat_req)                                                                             \
    REC(heartbeat_rsp)                                                                             \
    REC(keys_req)                                                                                  \
    REC(status_list_rsp)                                                                           \
    REC(put_start_req)                                                                             \
    REC(placement_rsp)                                                                             \
    REC(list_req)                                                                                  \
    REC(list_rsp)                                                                                  \
    REC(stat_rsp)                                                                                  \
    REC(error_rsp)                                                                                 \
    REC(data_req)                                                                                  \
    REC(data_status)                                                                               \
    REC(shm_hello)                                                                                 \
    REC(shm_req)                                                                                   \
    REC(shm_rsp)

/* Every message type: M(NAME, number, request record, response record, raw bytes after them).
 * `none` means an empty payload; `raw` says which side carries bytes after its record
 * (DATA_WRITE requests, DATA_READ replies). ERROR is a response only: the reply to a request
 * that could not be served at all. Numbers are never reused. */
#define KVS_SCHEMA_MESSAGES(M)                                                                     \
    M(HELLO, 1, hello_req, hello_rsp, 0)                                                           \
    M(MOUNT, 2, mount_req, mount_rsp, 0)                                                           \
    M(UNMOUNT, 3, ids_req, status_list_rsp, 0)                                                     \
    M(HEARTBEAT, 4, heartbeat_req, heartbeat_rsp, 0)                                               \
    M(PUT_START, 5, put_start_req, placement_rsp, 0)                                               \
    M(PUT_END, 6, keys_req, status_list_rsp, 0)                                                    \
    M(PUT_REVOKE, 7, keys_req, status_list_rsp, 0)                                                 \
    M(LOOKUP, 8, keys_req, placement_rsp, 0)                                                       \
    M(EXISTS, 9, keys_req, status_list_rsp, 0)                                                     \
    M(REMOVE, 10, keys_req, status_list_rsp, 0)                                                    \
    M(LIST, 11, list_req, list_rsp, 0)                                                             \
    M(STAT, 12, none, stat_rsp, 0)                                                                 \
    M(ERROR, 13, none, error_rsp, 0)                                                               \
    M(DATA_READ, 14, data_req, data_status, KVS_MSG_RAW_RSP)                                       \
    M(DATA_WRITE, 15, data_req, data_status, KVS_MSG_RAW_REQ)                                      \
    M(RELEASE, 16, keys_req, status_list_rsp, 0) /* only releases; no keys */                      \
    M(AUTH, 17, auth_req, auth_rsp, 0)                                                             \
    M(REPLICA_CLEAR, 18, keys_req, status_list_rsp, 0) /* version 4 */                             \
    M(RECOVER, 19, recover_req, status_list_rsp, 0)    /* version 4: one result per object */

/* hello_rsp.auth and shm_hello.auth. */
#define KVS_HELLO_AUTH_NONE 0u /* the server has no secret: requests may follow at once */
#define KVS_HELLO_AUTH_HMAC 1u /* AUTH must succeed first (HMAC-SHA256 over both nonces) */

#define KVS_MSG_RAW_REQ 1u
#define KVS_MSG_RAW_RSP 2u

#define KVS_KEYS_FLAG_FORCE    0x1u /* REMOVE: even while leased or pending */
#define KVS_PUT_FLAG_SAME_NODE 0x1u /* PUT_START: prefer the writer's node, co-locate the batch */
/* PUT_START (version 4): an existing complete object is replaced. The new version is placed
 * beside it and swapped in atomically at PUT_END; the old one retires as a removal does
 * (tombstoned while leased). An object whose put or upsert is in progress is
 * REPLICA_IS_NOT_READY. */
#define KVS_PUT_FLAG_UPSERT 0x2u
/* PUT_START (version 4): the objects are never evicted (removes still work). */
#define KVS_PUT_FLAG_HARD_PIN 0x4u
/* PUT_START (version 4): soft_pin_ttl_ms is given (else ENABLE takes the master's default). */
#define KVS_PUT_FLAG_PIN_TTL 0x8u
#define KVS_PUT_FLAGS_ALL_                                                                         \
    (KVS_PUT_FLAG_SAME_NODE | KVS_PUT_FLAG_UPSERT | KVS_PUT_FLAG_HARD_PIN | KVS_PUT_FLAG_PIN_TTL)

/* REPLICA_CLEAR (version 4, Mooncake's BatchReplicaClear): per key, an object this client
 * wrote that is complete and unleased loses its replicas on keys_req.segment, or (segment
 * empty) goes whole; an object left without replicas goes. Results per key: OK (cleared),
 * OBJECT_NOT_FOUND, INVALID_PARAMS (another client's object), REPLICA_IS_NOT_READY (pending
 * or being upserted), OBJECT_HAS_LEASE, SEGMENT_NOT_FOUND (no replica on that segment). */

#endif
