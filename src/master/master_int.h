/* The metadata master's state machine: objects, segments, leases, eviction and liveness.
 *
 * It holds no sockets and reads no clock: every call takes `now_ns`, so tests drive time
 * directly and the server feeds it the monotonic clock. It is not thread-safe; the server
 * calls it from its one event-loop thread. Requests and responses use the wire structs of
 * proto_int.h so the server only decodes, calls and encodes. */
#ifndef KVS_MASTER_INT_H
#define KVS_MASTER_INT_H

#include "../common/metrics_int.h"
#include "../proto/proto_int.h"

typedef enum {
    KVS_OBJ_PENDING = 0,  /* put started, not ended: invisible to readers */
    KVS_OBJ_COMPLETE = 1, /* readable */
} kvs__obj_state_t;

typedef struct {
    uint64_t lease_ms;                /* read lease granted by each lookup (default 10 s) */
    uint64_t heartbeat_timeout_ms;    /* owner silent this long loses its segments (10 s) */
    uint64_t put_discard_ms;          /* a put not ended this long is revoked (30 s) */
    double high_watermark;            /* segment fill ratio that triggers eviction (0.90) */
    double evict_ratio;               /* share of the segment freed per eviction (0.05) */
    uint64_t default_soft_pin_ttl_ms; /* a soft pin's time-to-live when the put names none */
    uint64_t max_soft_pin_ttl_ms;     /* the longest a put may ask for (24 h) */
    bool allow_evict_soft_pinned;     /* soft-pinned objects may go after every unpinned one */
    /* High availability (docs/ha.md): owners keep an index of their complete objects, fed by
     * HEARTBEAT replies, that a new leader rebuilds from (RECOVER). */
    bool owner_index;
    uint64_t version_base; /* objects' versions start above this (the leader's term << 32) */
    /* Tests only: every object's first lease id (0, the default: a random one per object, so
     * that ids of different versions of a key do not meet). Lets a test cross the ids' wrap. */
    uint64_t lease_id_start;
} kvs__master_config_t;

/* Defaults, then KVS_MASTER_LEASE_MS, KVS_MASTER_HEARTBEAT_TIMEOUT_MS, KVS_MASTER_PUT_DISCARD_MS,
 * KVS_MASTER_HIGH_WATERMARK, KVS_MASTER_EVICT_RATIO, KVS_MASTER_DEFAULT_SOFT_PIN_TTL_MS and
 * KVS_MASTER_MAX_SOFT_PIN_TTL_MS from the environment. */
int kvs__master_config_init(kvs__master_config_t *cfg);
int kvs__master_config_check(const kvs__master_config_t *cfg);

typedef struct kvs__master kvs__master_t;

int kvs__master_create(const kvs__master_config_t *cfg, kvs__master_t **master_p);
void kvs__master_destroy(kvs__master_t *m);

/* A new client id (never 0, never reused while the master runs). */
uint64_t kvs__master_new_client(kvs__master_t *m);

/* Registers a segment of `size` bytes owned by `client_id` (the connection's). Names are
 * unique among mounted segments (SEGMENT_ALREADY_EXISTS). Ids are random and never reused. */
/* The capability epoch at `now_ns` (told to owners in MOUNT and HEARTBEAT replies). */
uint64_t kvs__master_cap_epoch(const kvs__master_t *m, uint64_t now_ns);
int kvs__master_mount(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                      const kvs__mount_req_t *req, uint64_t *segment_id_p);
/* Who holds a segment name (for a MOUNT refused with SEGMENT_ALREADY_EXISTS): the server may
 * prove that owner dead and replace it. Strings are borrowed, valid until the segment goes. */
typedef struct {
    uint64_t segment_id;
    uint64_t client_id;
    bool connected; /* the owner's client has a connection open */
    const char *node;
    const char *endpoint;
    const char *peer; /* the address its MOUNT came from ("" if unknown) */
} kvs__master_holder_t;
/* Records the address the MOUNT of `segment_id` came from (the holder's, for later MOUNTs of its
 * name). */
void kvs__master_segment_set_peer(kvs__master_t *m, uint64_t segment_id, const char *peer);
int kvs__master_holder(kvs__master_t *m, kvs__str_t name, kvs__master_holder_t *holder_p);
/* Drops a segment whose owner is proven dead, exactly as an expiry does (its replicas vanish,
 * objects left without one go), so that a new owner can mount under its name. */
int kvs__master_replace(kvs__master_t *m, uint64_t segment_id);
/* Unmounts a segment of that client: its replicas vanish and objects left without one go. */
int kvs__master_unmount(kvs__master_t *m, uint64_t client_id, uint64_t segment_id);
/* Refreshes the client's segments that `req` names (every one when `req` is NULL).
 * SEGMENT_NOT_FOUND when none is left (it was dropped and should mount again). `req`
 * acknowledges, per segment, the fences the owner has applied;
 * with `rsp` (and `arena` for its arrays) the reply lists the fences it has not yet
 * acknowledged: the puts whose space waits for them. */
int kvs__master_heartbeat(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                          const kvs__heartbeat_req_t *req, kvs__arena_t *arena,
                          kvs__heartbeat_rsp_t *rsp);

/* The batch operations fill rsp (arrays from `arena`) with one result per request key;
 * rsp->status is the request-level status (OK unless the request itself is unusable).
 * `client_id` is the connection's: a put started by one client is ended or revoked only by
 * that client (another gets INVALID_WRITE, and the put is unchanged). */
int kvs__master_put_start(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                          const kvs__put_start_req_t *req, kvs__arena_t *arena,
                          kvs__placement_rsp_t *rsp);
int kvs__master_put_end(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__keys_req_t *req, kvs__arena_t *arena,
                        kvs__status_list_rsp_t *rsp);
int kvs__master_put_revoke(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                           const kvs__keys_req_t *req, kvs__arena_t *arena,
                           kvs__status_list_rsp_t *rsp);
/* Lookups grant each complete object a read lease of `client_id`, one per lookup, named by the
 * lease id in the reply. */
int kvs__master_lookup(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                       const kvs__keys_req_t *req, kvs__arena_t *arena, kvs__placement_rsp_t *rsp);
/* Ends the leases the entries name (key and lease id), if they are `client_id`'s. An object
 * whose readers have all released is no longer leased: it can be removed or evicted. Entries
 * naming no current lease (ended, other clients', absent keys) are ignored. */
int kvs__master_release(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__lease_release_t *rel, uint32_t n);
/* 1 complete, 0 absent or pending, negative for an invalid key. */
int kvs__master_exists(kvs__master_t *m, uint64_t now_ns, const kvs__keys_req_t *req,
                       kvs__arena_t *arena, kvs__status_list_rsp_t *rsp);
/* Refused with OBJECT_HAS_LEASE while leased, REPLICA_IS_NOT_READY while pending, unless
 * KVS_KEYS_FLAG_FORCE. */
int kvs__master_remove(kvs__master_t *m, uint64_t now_ns, const kvs__keys_req_t *req,
                       kvs__arena_t *arena, kvs__status_list_rsp_t *rsp);

/* REPLICA_CLEAR by `client_id` (see schema.h): one status per key in `rsp`. */
int kvs__master_replica_clear(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                              const kvs__keys_req_t *req, kvs__arena_t *arena,
                              kvs__status_list_rsp_t *rsp);
/* RECOVER: the owner `client_id` re-registered segment req->segment_id (a MOUNT naming its
 * id) and gives the complete objects it holds. Each becomes complete again with this replica
 * (joining the object of the same key and token from another owner), claiming its range, and
 * leased for one lease period as if read just now: a reader of the old leader may still read
 * it. One result per object: OK, INVALID_PARAMS (malformed, outside the segment, overlapping
 * one recovered before), OBJECT_ALREADY_EXISTS (a newer version of the key is known; its
 * range waits one lease period before reuse). SEGMENT_NOT_FOUND: not the client's segment. */
int kvs__master_recover(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__recover_req_t *req, kvs__arena_t *arena,
                        kvs__status_list_rsp_t *rsp);
int kvs__master_list(kvs__master_t *m, const kvs__list_req_t *req, kvs__arena_t *arena,
                     kvs__list_rsp_t *rsp);
/* The master's metrics, declared once: X(kind, unit, name, family, help). STAT carries each by
 * `name` (counters the state machine keeps, gauges computed at the STAT), in this order, and the
 * Prometheus endpoint exposes it as kvstash_master_<family>[_bytes][_total]. Per-segment usage
 * travels in STAT's segment list and is exposed as kvstash_master_segment_*{segment,node}. */
#define KVS_MASTER_METRICS(X)                                                                      \
    X(GAUGE, NONE, objects, objects, "Complete objects stored")                                    \
    X(GAUGE, NONE, objects_pending, objects_pending, "Objects whose put has not ended")            \
    X(GAUGE, NONE, segments, segments, "Mounted segments")                                         \
    X(GAUGE, BYTES, capacity_bytes, capacity, "Bytes of every mounted segment")                    \
    X(GAUGE, BYTES, used_bytes, used, "Bytes of the segments allocated to objects")                \
    X(GAUGE, NONE, groups, groups, "Placement groups with objects")                                \
    X(COUNTER, NONE, segments_mounted, segments_mounted, "Segments mounted")                       \
    X(COUNTER, NONE, segments_unmounted, segments_unmounted, "Segments unmounted by their owner")  \
    X(COUNTER, NONE, segments_expired, segments_expired, "Segments dropped: owner silent")         \
    X(COUNTER, NONE, segments_replaced, segments_replaced, "Segments replaced by a new owner")     \
    X(COUNTER, NONE, puts_started, puts_started, "Puts started (one per key)")                     \
    X(COUNTER, NONE, puts_ended, puts_ended, "Puts completed")                                     \
    X(COUNTER, NONE, puts_revoked, puts_revoked, "Puts revoked by their writer")                   \
    X(COUNTER, NONE, puts_discarded, puts_discarded, "Puts discarded: never ended in time")        \
    X(COUNTER, NONE, puts_no_space, puts_no_space, "Puts refused for want of space")               \
    X(COUNTER, NONE, lookups, lookups, "Keys looked up")                                           \
    X(COUNTER, NONE, lookup_hits, lookup_hits, "Keys looked up and found complete")                \
    X(COUNTER, NONE, removes, removes, "Objects removed")                                          \
    X(COUNTER, NONE, tombstones, tombstones, "Removed objects kept until their leases end")        \
    X(COUNTER, NONE, leases_granted, leases_granted, "Read leases granted (one per hit)")          \
    X(COUNTER, NONE, lease_releases, lease_releases, "Read leases released early by readers")      \
    X(COUNTER, NONE, evictions, evictions, "Objects evicted to make room")                         \
    X(COUNTER, NONE, upserts_started, upserts_started, "Upserts started")                          \
    X(COUNTER, NONE, upserts_ended, upserts_ended, "Upserts completed")                            \
    X(COUNTER, NONE, soft_pin_evictions, soft_pin_evictions, "Soft-pinned objects evicted")        \
    X(COUNTER, NONE, replicas_cleared, replicas_cleared, "Replicas cleared by their writer")       \
    X(COUNTER, NONE, objects_recovered, objects_recovered, "Objects recovered from owners")        \
    X(COUNTER, NONE, objects_recover_refused, objects_recover_refused,                             \
      "Objects owners offered at recovery and refused")                                            \
    X(COUNTER, BYTES, evicted_bytes, evicted, "Bytes evicted to make room")

int kvs__master_stat(kvs__master_t *m, uint64_t now_ns, kvs__arena_t *arena, kvs__stat_rsp_t *rsp);
/* The table as descriptors (*n_p entries; tests check it). */
const kvs__metric_desc_t *kvs__master_metrics_table(size_t *n_p);
/* Writes a STAT reply (kvs__master_stat's) as Prometheus text, kvstash_master_*. */
void kvs__master_metrics_write(const kvs__stat_rsp_t *rsp, kvs__text_t *t);

/* A connection of the client said HELLO, or closed. A client without connections for the put
 * discard time is gone: the space of its puts ended early no longer waits for it (a reconnection
 * within that time, after a failed call, is not a departure). */
void kvs__master_client_connected(kvs__master_t *m, uint64_t now_ns, uint64_t client_id);
void kvs__master_client_disconnected(kvs__master_t *m, uint64_t now_ns, uint64_t client_id);

/* The caller did not run until `now_ns` (its process was stopped or starved): no owner could
 * be heard, so every segment's silence starts again from now. */
void kvs__master_resumed(kvs__master_t *m, uint64_t now_ns);

/* Time-driven work: discards stale puts and drops silent owners. Cheap when nothing is due. */
void kvs__master_tick(kvs__master_t *m, uint64_t now_ns);

/* HA: the owners' index changes the last requests added (ADDs, per segment its highest
 * number), taken and forgotten: a PUT_END's reply waits until every mark is acknowledged
 * (kvs__master_mark_acked), so an object readers can see survives a failover. *all_p: more
 * marks than `cap` (wait for kvs__master_segments_synced instead). */
typedef struct {
    uint64_t segment_id, seq;
} kvs__index_mark_t;
uint32_t kvs__master_take_marks(kvs__master_t *m, kvs__index_mark_t *out, uint32_t cap,
                                bool *all_p);
/* Whether the owner has applied the mark (or the segment is gone). */
bool kvs__master_mark_acked(kvs__master_t *m, const kvs__index_mark_t *mk);
/* Whether every owner has applied every index change. */
bool kvs__master_segments_synced(kvs__master_t *m);
/* Whether a HEARTBEAT of this client has something to tell now (fences or index changes not
 * yet acknowledged): a waiting heartbeat (heartbeat_req.wait_ms) is answered then. */
bool kvs__master_heartbeat_due(kvs__master_t *m, uint64_t client_id);
/* Reads one named counter (as in the STAT response); UINT64_MAX when unknown. For tests. */
uint64_t kvs__master_counter(kvs__master_t *m, const char *name);

#endif
