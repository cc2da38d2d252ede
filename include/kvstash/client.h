/* The kvstash client: puts objects into the store and reads them back, above all into
 * fragmented destinations (paged KV caches). One client may be shared by many threads.
 *
 * Results. Calls on one key return 0 (or a size) on success and a negative kvs_status_t on
 * failure. Batch calls return KVS_OK when the call itself was carried out and write one result
 * per key into `results`; a call-level failure (bad arguments, master unreachable) returns the
 * negative status, writes no results and leaves the store unchanged. After a failure,
 * kvs_last_error() gives a one-line explanation for the calling thread.
 *
 * Memory. Zero-copy calls (`*_from`, `*_into`) require every fragment to lie inside one buffer
 * registered with kvs_client_register_buffer(); a fragment that does not is refused with
 * KVS_INVALID_PARAMS for its key before any I/O. kvs_client_put() and kvs_client_get() copy and
 * take any memory. Every pointer argument is borrowed for the duration of the call unless said
 * otherwise; destinations belong to the caller again when the call returns, whatever happened. */
#ifndef KVSTASH_CLIENT_H
#define KVSTASH_CLIENT_H

#include <kvstash/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_client kvs_client_t;

/* ---- setup ---------------------------------------------------------------------------------- */

typedef struct {
    /* Master RPC address "HOST:PORT" (borrowed during open). NULL: $KVS_MASTER, else
     * 127.0.0.1:50051. */
    const char *master;
    /* "tcp" or "auto" ("auto" picks the best transport each owner supports; this version has
     * tcp only). NULL: $KVS_PROTOCOL, else "auto". */
    const char *protocol;
    /* This host's name for same-node placement. NULL: gethostname(). */
    const char *local_hostname;
    uint64_t rpc_timeout_ms;      /* each master call, reconnection included (5000) */
    uint64_t transfer_timeout_ms; /* each read or write call's data transfers (5000) */
    /* The cluster's shared secret (borrowed during open): a file of this user, mode 0600, of
     * 16..4096 bytes. With one, the client proves it to the master and owners and trusts only
     * those that prove it back (and its own segments require it). NULL or "": none.
     * Default: $KVS_AUTH_TOKEN_FILE. */
    const char *auth_token_file;
    /* TLS (1.3, keyed by the token: no certificates) on every master and tcp data connection;
     * needs auth_token_file, and servers started with --tls. Default: $KVS_TLS (0 or 1). */
    bool tls;
    /* The namespace of this client's keys (borrowed during open): 1..64 bytes of [A-Za-z0-9._-].
     * Clients of two tenants never see, list or remove each other's objects; segments (space)
     * are shared. NULL, "" or "default": the default tenant, which clients of protocol version 3
     * and the CLI use. Default: $KVS_TENANT. A named tenant needs a master of protocol version
     * 4 or later (KVS_UNSUPPORTED otherwise). Tenants are namespaces, not access control: any
     * client that proves the cluster's token may name any tenant (as in Mooncake). */
    const char *tenant;
} kvs_client_config_t;

/* Fills defaults, then KVS_MASTER, KVS_PROTOCOL, KVS_RPC_TIMEOUT_MS,
 * KVS_TRANSFER_TIMEOUT_MS, KVS_AUTH_TOKEN_FILE and KVS_TLS from the environment. Returns
 * KVS_INVALID_PARAMS (and keeps the default) for a malformed environment value. */
int kvs_client_config_init(kvs_client_config_t *cfg);

/* Connects to the master. On success *client_p is a new client (free with kvs_client_close). */
int kvs_client_open(const kvs_client_config_t *cfg, kvs_client_t **client_p);

/* Waits for this client's in-flight calls (bounded by their transfer deadline), unmounts its
 * segments and frees it. NULL is a no-op. No other call on the client may start after it. */
void kvs_client_close(kvs_client_t *client);

/* Makes this client an owner too: creates a memory segment of `size` bytes, serves it on a data
 * port of this host (tcp) and mounts it with the master under `name` (NULL: "HOST:PORT").
 * `advertise_host` is the address other hosts reach it at (NULL: 127.0.0.1). The segment lives
 * until the client closes. */
int kvs_client_mount_segment(kvs_client_t *client, uint64_t size, const char *name,
                             const char *advertise_host);

/* The name of the client's `index`-th mounted segment (0 for the first), or NULL when there is
 * no such segment. Borrowed: valid until the client closes. */
const char *kvs_client_segment_name(kvs_client_t *client, size_t index);

/* One round trip to the master within rpc_timeout_ms: KVS_OK when it answers, else the
 * failure (RPC_FAIL, TIMED_OUT, ...). */
int kvs_client_ping(kvs_client_t *client);

/* Registers [addr, addr + len) for zero-copy calls. Its memory type is decided here, once.
 * Registrations may not overlap (KVS_INVALID_PARAMS). Device memory is accepted by CUDA
 * builds (reads into it and writes from it go through the copy engine); builds without CUDA
 * refuse it with KVS_INVALID_PARAMS and a message. The memory
 * stays the caller's. */
int kvs_client_register_buffer(kvs_client_t *client, void *addr, size_t len);

/* Where [ptr, ptr + len) is, when one registered buffer holds all of it: -1 for host memory,
 * else the CUDA device ordinal; KVS_INVALID_PARAMS (-600) when no registered buffer does. */
int kvs_client_buffer_domain(kvs_client_t *client, const void *ptr, size_t len);

/* Unregisters the buffer registered at `addr`, waiting first for in-flight calls that use it
 * (bounded by their transfer deadline). KVS_INVALID_PARAMS if nothing is registered there. */
int kvs_client_unregister_buffer(kvs_client_t *client, void *addr);

/* ---- writes --------------------------------------------------------------------------------- */

/* What a put does to its object's soft pin (Mooncake's SoftPinAction numbers). A soft-pinned
 * object is evicted only after every unpinned one, and only when the master allows it
 * (--allow-evict-soft-pinned, default on), until its pin's time-to-live ends. */
typedef enum {
    KVS_SOFT_PIN_PRESERVE = 0, /* keep the key's pin (an upsert keeps the old version's; none) */
    KVS_SOFT_PIN_ENABLE = 1,   /* pin for soft_pin_ttl_ms (0 clears it) */
    KVS_SOFT_PIN_DISABLE = 2,  /* no pin */
} kvs_soft_pin_action_t;

/* Placement: copies go to distinct segments, the first to the most favoured that has room:
 * preferred_segment, then preferred_segments in order, then the segments of the object's
 * group, then (prefer_alloc_in_same_node) the batch's first segment and the writer's node,
 * then the segments with the most free space. */
typedef struct {
    uint32_t replica_num;           /* copies on distinct segments (default 1, at most 16) */
    const char *preferred_segment;  /* segment name to place the first copy on, or NULL */
    bool prefer_alloc_in_same_node; /* place a batch's objects together on one segment */
    /* Fields below need a master of protocol version 4 (with a version 3 master a put that
     * sets them is KVS_UNSUPPORTED). */
    kvs_soft_pin_action_t soft_pin_action; /* default PRESERVE */
    bool soft_pin_ttl_set;                 /* false: ENABLE takes the master's default TTL */
    uint64_t soft_pin_ttl_ms;              /* at most the master's --max-soft-pin-ttl-ms */
    bool with_hard_pin;                    /* never evicted (explicit removes still work) */
    /* Segment names for the copies, in order (after preferred_segment); at most 16. */
    const char *const *preferred_segments;
    size_t npreferred_segments;
    /* Placement groups (Mooncake's group_ids): the objects of a group are placed on the
     * segments where the group's latest object went, while those have room (else where there
     * is room). One group: every key of the call; as many as the call's keys: key i's is
     * group_ids[i]; none (NULL, 0): no group. Names are 1..256 bytes without NUL, in the
     * client's tenant. */
    const char *const *group_ids;
    size_t ngroup_ids;
} kvs_replicate_config_t;

/* Defaults: one replica, no preferred segment, spread placement. */
void kvs_replicate_config_init(kvs_replicate_config_t *rc);

/* A fragment of memory. */
typedef struct {
    void *ptr;
    size_t len;
} kvs_buf_t;

/* Stores `size` bytes from any memory under `key`. KVS_OBJECT_ALREADY_EXISTS if the key is
 * present (objects are immutable: remove first), KVS_NO_AVAILABLE_HANDLE if the store has no
 * room even after eviction. `rc` may be NULL for defaults. */
int kvs_client_put(kvs_client_t *client, const char *key, const void *data, size_t size,
                   const kvs_replicate_config_t *rc);

/* As kvs_client_put, from registered memory. */
int kvs_client_put_from(kvs_client_t *client, const char *key, const void *buf, size_t size,
                        const kvs_replicate_config_t *rc);

/* `n` objects from any memory, each one contiguous buffer, in one batch (one PUT_START and one
 * PUT_END for the lot); one result per key. */
int kvs_client_batch_put(kvs_client_t *client, size_t n, const char *const keys[],
                         const kvs_buf_t bufs[], const kvs_replicate_config_t *rc, int results[]);

/* `n` objects from registered memory, each one contiguous buffer; one result per key. */
int kvs_client_batch_put_from(kvs_client_t *client, size_t n, const char *const keys[],
                              const kvs_buf_t bufs[], const kvs_replicate_config_t *rc,
                              int results[]);

/* `n` objects from any memory, object i gathered in order from the `nbufs[i]` fragments
 * `bufs[i]` (a key's fragments all host memory, or all on one GPU in CUDA builds); `upsert`
 * replaces existing objects as kvs_client_upsert does. */
int kvs_client_batch_put_multi(kvs_client_t *client, size_t n, const char *const keys[],
                               const kvs_buf_t *const bufs[], const size_t nbufs[],
                               const kvs_replicate_config_t *rc, bool upsert, int results[]);

/* `n` objects, object i gathered in order from the `nbufs[i]` fragments `bufs[i]`. */
int kvs_client_batch_put_from_multi(kvs_client_t *client, size_t n, const char *const keys[],
                                    const kvs_buf_t *const bufs[], const size_t nbufs[],
                                    const kvs_replicate_config_t *rc, int results[]);

/* Upserts: as the put family, but an existing object is replaced. The new version becomes
 * visible atomically when its put ends: lookups before see the old bytes, lookups after the
 * new, never a mix; readers inside their lease keep reading the old bytes exactly (its space is
 * tombstoned until their leases end). A failed or revoked upsert leaves the old version. An
 * object whose put or upsert is still in progress is KVS_REPLICA_IS_NOT_READY (try again). A
 * master of protocol version 3 has no upsert: KVS_UNSUPPORTED. */
int kvs_client_upsert(kvs_client_t *client, const char *key, const void *data, size_t size,
                      const kvs_replicate_config_t *rc);
int kvs_client_upsert_from(kvs_client_t *client, const char *key, const void *buf, size_t size,
                           const kvs_replicate_config_t *rc);
int kvs_client_batch_upsert(kvs_client_t *client, size_t n, const char *const keys[],
                            const kvs_buf_t bufs[], const kvs_replicate_config_t *rc,
                            int results[]);
int kvs_client_batch_upsert_from(kvs_client_t *client, size_t n, const char *const keys[],
                                 const kvs_buf_t bufs[], const kvs_replicate_config_t *rc,
                                 int results[]);
int kvs_client_batch_upsert_from_multi(kvs_client_t *client, size_t n, const char *const keys[],
                                       const kvs_buf_t *const bufs[], const size_t nbufs[],
                                       const kvs_replicate_config_t *rc, int results[]);

/* ---- reads ---------------------------------------------------------------------------------- */

/* Reads object `key` into the registered buffer [buf, buf + size), which must be at least as
 * large as the object (else KVS_INVALID_PARAMS, buffer untouched). Returns the object size. */
int64_t kvs_client_get_into(kvs_client_t *client, const char *key, void *buf, size_t size);

/* Batch of kvs_client_get_into; results[i] is the size of object i or a negative status. */
int kvs_client_batch_get_into(kvs_client_t *client, size_t n, const char *const keys[],
                              const kvs_buf_t bufs[], int64_t results[]);

/* Reads object i into the `nbufs[i]` registered fragments `bufs[i]`, in order; the fragments
 * must hold at least the object's size (else KVS_INVALID_PARAMS for that key before any I/O,
 * its fragments untouched). Fragments beyond the object's end are left as they were (as in
 * Mooncake); a call with such a key is not staged (fallback_not_exact). A key may appear more than
 * once (into different fragments). Fragments that overlap get unspecified bytes. results[i] is the
 * object size or a negative status: KVS_OBJECT_NOT_FOUND, KVS_REPLICA_IS_NOT_READY,
 * KVS_LEASE_EXPIRED (the transfer finished after the read lease from the lookup ran out: the bytes
 * cannot be trusted), KVS_TIMED_OUT, KVS_TRANSFER_FAIL. A failed key's fragments may hold partial
 * data.
 *
 * `prefer_alloc_in_same_node` selects grouped reads: a replica on this host is preferred and all
 * keys read from one owner go in one submission. Otherwise each key is its own submission, all
 * in flight together. */
int kvs_client_batch_get_into_multi_buffers(kvs_client_t *client, size_t n,
                                            const char *const keys[], const kvs_buf_t *const bufs[],
                                            const size_t nbufs[], bool prefer_alloc_in_same_node,
                                            int64_t results[]);

/* ---- page-table reads and writes ------------------------------------------------------------ */

/* A destination (or source) region of pages in registered memory: page p of the region is
 * [base + p * stride, base + p * stride + page_bytes), for p < npages. A paged KV pool names one
 * region per layer (or per layer and K/V) and, per key, the page ids of its block. */
typedef struct {
    void *base;
    size_t page_bytes; /* bytes of one page (>= 1) */
    size_t stride;     /* bytes from one page to the next (>= page_bytes) */
    uint64_t npages;   /* page ids must be below this */
} kvs_page_region_t;

/* The order of a key's fragments: page-major takes, for each of the key's pages, that page of
 * every region in turn (vLLM's per-block layout); region-major takes every page of the first
 * region, then of the next (SGLang's per-layer layout). */
typedef enum {
    KVS_PAGE_MAJOR = 0,
    KVS_REGION_MAJOR = 1,
} kvs_page_order_t;

/* Reads object i into the pages page_ids[first_i .. first_i + npages[i]) of the `nregions`
 * regions (first_i = npages[0] + ... + npages[i-1]), in `order`: as
 * kvs_client_batch_get_into_multi_buffers with those fragments (the same planner, staging,
 * grouping and results), without a pointer per page from the caller. A key's pages hold
 * npages[i] x (the regions' page_bytes summed) bytes. A page id at or past a region's npages, a
 * region that is not whole in registered memory, regions in different memory domains, or bad
 * arguments: KVS_INVALID_PARAMS for the call, with the reason, before any I/O. Duplicate page
 * ids overlap (unspecified bytes, never staged), as overlapping fragments do. Staged reads hand
 * the page ids to the scatter kernel (no fragment list is built); direct ones expand them. */
int kvs_client_batch_get_into_pages(kvs_client_t *client, size_t n, const char *const keys[],
                                    const kvs_page_region_t regions[], size_t nregions,
                                    kvs_page_order_t order, const uint32_t page_ids[],
                                    const size_t npages[], bool prefer_alloc_in_same_node,
                                    int64_t results[]);

/* Stores object i gathered from its pages, as kvs_client_batch_get_into_pages names them, as
 * kvs_client_batch_put_from_multi does; one result per key. */
int kvs_client_batch_put_from_pages(kvs_client_t *client, size_t n, const char *const keys[],
                                    const kvs_page_region_t regions[], size_t nregions,
                                    kvs_page_order_t order, const uint32_t page_ids[],
                                    const size_t npages[], const kvs_replicate_config_t *rc,
                                    int results[]);

/* ---- ranged reads, sessions and inspection --------------------------------------------------- */

/* A fragment of registered memory and where it lies in the object. */
typedef struct {
    void *ptr;
    size_t len;
    uint64_t offset; /* in the object */
} kvs_range_t;

/* Range j of key i reads object bytes [offset, offset + len) into registered memory at ptr.
 * results[i] is the bytes read for key i, or a negative status; a range outside the object is
 * KVS_INVALID_PARAMS for its key before any I/O (its destinations untouched). A key's ranges
 * whose offsets follow each other are one transfer (and, with staging on, one staged read). */
int kvs_client_batch_get_ranges(kvs_client_t *client, size_t n, const char *const keys[],
                                const kvs_range_t *const ranges[], const size_t nranges[],
                                int64_t results[]);

/* Read sessions: one LOOKUP and read lease for keys that are read many times (per layer). While
 * a key's session lease has more than a tenth of its time (at least 100 ms) left, reads whose
 * keys all have one need no lookup; otherwise a read looks its keys up as usual. results[i] is
 * the object size or a negative status. Starting a key again refreshes its lease and counts;
 * each start is ended by one end, which releases the lease. At most 2^20 keys are in sessions
 * (KVS_NO_RESOURCE beyond). Sessions end with the client. */
int kvs_client_read_session_start(kvs_client_t *client, size_t n, const char *const keys[],
                                  int results[]);
/* Ends a session start of each key (unknown keys are ignored). */
int kvs_client_read_session_end(kvs_client_t *client, size_t n, const char *const keys[]);

/* Put sessions (Mooncake's batch_put_session_*): place objects of the given sizes now, write
 * their bytes in ranges by later calls, then make them readable. start: results[i] 0, or a
 * negative status (KVS_OBJECT_ALREADY_EXISTS for a key that exists, KVS_INVALID_PARAMS for one
 * with a session already). write: range j of key i writes len bytes from registered memory at
 * ptr to object bytes [offset, offset + len) on every replica; results[i] 0 or a negative
 * status (a range outside the object is KVS_INVALID_PARAMS before any I/O; a failed transfer
 * marks the session failed). end: makes each object readable once every byte was written;
 * a session with bytes never written, or a failed one, is revoked instead and answers
 * KVS_INVALID_WRITE (or the failure): never an object of whatever the space held. revoke:
 * revokes. Keys without a session: KVS_INVALID_PARAMS. Sessions left open are revoked at
 * close, and by the master after its put discard time. */
int kvs_client_put_session_start(kvs_client_t *client, size_t n, const char *const keys[],
                                 const uint64_t sizes[], const kvs_replicate_config_t *rc,
                                 int results[]);
int kvs_client_put_session_write(kvs_client_t *client, size_t n, const char *const keys[],
                                 const kvs_range_t *const ranges[], const size_t nranges[],
                                 int results[]);
int kvs_client_put_session_end(kvs_client_t *client, size_t n, const char *const keys[],
                               int results[]);
int kvs_client_put_session_revoke(kvs_client_t *client, size_t n, const char *const keys[],
                                  int results[]);

/* Reads whole objects into new memory: data[i] (caller frees with kvs_free) and sizes[i] where
 * results[i] (the size, or a negative status) is not negative; data[i] is NULL otherwise. */
int kvs_client_batch_get(kvs_client_t *client, size_t n, const char *const keys[], void *data[],
                         size_t sizes[], int64_t results[]);

/* Where each complete object's replicas are (one LOOKUP, its leases released at once). */
#define KVS_REPLICA_NAME_MAX  257
#define KVS_MAX_REPLICA_DESCS 16
typedef struct {
    uint64_t segment_id;
    char segment_name[KVS_REPLICA_NAME_MAX];
    char endpoint[KVS_REPLICA_NAME_MAX]; /* the owner's data endpoint "host:port" */
    char node[KVS_REPLICA_NAME_MAX];
    uint64_t offset; /* in the segment */
    uint64_t size;
} kvs_replica_desc_t;
/* descs has n * KVS_MAX_REPLICA_DESCS entries: key i's replicas are descs[i * 16 ..
 * i * 16 + nreps[i]). results[i]: 0, KVS_OBJECT_NOT_FOUND or KVS_REPLICA_IS_NOT_READY. */
int kvs_client_batch_get_replica_desc(kvs_client_t *client, size_t n, const char *const keys[],
                                      kvs_replica_desc_t descs[], uint32_t nreps[], int results[]);

/* Reads a whole object into new memory: *data_p (caller frees with kvs_free) and *size_p. */
int kvs_client_get(kvs_client_t *client, const char *key, void **data_p, size_t *size_p);

/* Frees memory returned by kvs_client_get. NULL is a no-op. */
void kvs_free(void *ptr);

/* ---- metadata ------------------------------------------------------------------------------- */

/* Removes an object. Refused with KVS_OBJECT_HAS_LEASE while a reader holds a lease and with
 * KVS_REPLICA_IS_NOT_READY while its put is in progress, unless `force`. */
int kvs_client_remove(kvs_client_t *client, const char *key, bool force);

/* 1 if the object exists and is complete, 0 if not, negative on error. */
int kvs_client_exists(kvs_client_t *client, const char *key);
int kvs_client_batch_exists(kvs_client_t *client, size_t n, const char *const keys[],
                            int results[]);

/* The object's size, or a negative status. Takes a read lease like any lookup. */
int64_t kvs_client_get_size(kvs_client_t *client, const char *key);

/* ---- bulk removal (Mooncake's remove_all, remove_by_regex, batch_remove) -------------------- */

/* Removes each key as kvs_client_remove does; results[i] is 0 or its failure
 * (KVS_OBJECT_NOT_FOUND, KVS_OBJECT_HAS_LEASE, KVS_REPLICA_IS_NOT_READY). */
int kvs_client_batch_remove(kvs_client_t *client, size_t n, const char *const keys[], bool force,
                            int results[]);

/* Removes every complete object the master lists (objects of puts in progress are never
 * removed in bulk; leased ones only with `force`, and then tombstoned until their leases end).
 * Returns how many were removed, or a negative status when the listing failed. Not atomic:
 * objects stored while it runs may stay. */
int64_t kvs_client_remove_all(kvs_client_t *client, bool force);

/* As kvs_client_remove_all, for keys that match `pattern`, a POSIX extended regular expression
 * (at most 1024 bytes; matched anywhere in the key unless anchored). Mooncake uses ECMAScript
 * std::regex: the common forms (^prefix, .*, [a-z]+, alternation) mean the same. A bad pattern
 * is KVS_INVALID_PARAMS with the reason. */
int64_t kvs_client_remove_by_regex(kvs_client_t *client, const char *pattern, bool force);

/* Mooncake's batch_replica_clear: frees the space of objects this client wrote (as identified
 * by its client id) once they are complete and no read lease is left on them. With `segment`
 * NULL or "", each object goes whole; otherwise only its replicas on that segment go, and an
 * object left without replicas goes. results[i] is 0 when key i was cleared, else why not:
 * KVS_OBJECT_NOT_FOUND, KVS_INVALID_PARAMS (another client's object), KVS_REPLICA_IS_NOT_READY
 * (a put or upsert in progress), KVS_OBJECT_HAS_LEASE, KVS_SEGMENT_NOT_FOUND (no replica on
 * `segment`). Needs a master of protocol version 4 (else KVS_UNSUPPORTED). */
int kvs_client_batch_replica_clear(kvs_client_t *client, size_t n, const char *const keys[],
                                   const char *segment, int results[]);

/* ---- statistics ----------------------------------------------------------------------------- */

/* Latency histogram: bucket 0 counts calls under 1 µs, bucket i (i >= 1) calls of
 * [2^(i-1), 2^i) µs; the last bucket also takes everything longer. */
#define KVS_HIST_BUCKETS 32
typedef struct {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t max_ns;
    uint64_t buckets[KVS_HIST_BUCKETS];
} kvs_histogram_t;

/* An upper bound (µs) of the q-quantile (0 < q <= 1) of the calls in `h`; 0 when empty. */
double kvs_histogram_quantile_us(const kvs_histogram_t *h, double q);

/* The client's metrics, declared once: kvs_client_stats_t, Python's get_stats(), and the
 * Prometheus exposition of a client's metrics endpoint are all generated from this table.
 *
 * X(kind, unit, field, family, labels, help): kind is COUNTER (only grows), GAUGE (a value now)
 * or HIST (a kvs_histogram_t); unit NONE, BYTES or NS (exposed in seconds); `field` names the
 * struct member and the get_stats() key; `family` and `labels` name the exposition's metric,
 * kvstash_client_<family>[_bytes|_seconds][_total]{labels}; `help` is its HELP text (a family's
 * first member's).
 *
 * ABI: kvs_client_stats_t stays ABI-stable. Members are only ever appended to this table (never
 * reordered, removed or retyped), and the caller says how large its struct is (see
 * kvs_client_get_stats below), so a program built against an older header reads the prefix it
 * knows and nothing is written past it. "calls" count API calls, "keys" the keys they carried. */
#define KVS_CLIENT_STATS(X)                                                                        \
    X(COUNTER, NONE, put_calls, put_calls, "", "Put calls")                                        \
    X(COUNTER, NONE, put_keys, put_keys, "", "Keys carried by put calls")                          \
    X(COUNTER, BYTES, put_bytes, put, "", "Bytes written by put calls")                            \
    X(COUNTER, NONE, put_failed_keys, put_failed_keys, "", "Keys whose put failed")                \
    X(COUNTER, NONE, get_calls, get_calls, "", "Read calls, every mode")                           \
    X(COUNTER, NONE, get_keys, get_keys, "", "Keys carried by read calls")                         \
    X(COUNTER, BYTES, get_bytes, get, "", "Bytes read by read calls")                              \
    X(COUNTER, NONE, get_failed_keys, get_failed_keys, "", "Keys whose read failed")               \
    /* reads asked for in grouped mode (staged or not) */                                          \
    X(COUNTER, NONE, get_grouped_calls, grouped_calls, "", "Read calls asked for in grouped mode") \
    X(COUNTER, NONE, get_submissions, get_submissions, "", "Transport submissions of reads")       \
    X(COUNTER, NONE, get_lease_expired, read_failures, "reason=\"lease_expired\"",                 \
      "Keys whose read failed, by reason")                                                         \
    X(COUNTER, NONE, get_timed_out, read_failures, "reason=\"timed_out\"", "")                     \
    X(COUNTER, NONE, get_transfer_fail, read_failures, "reason=\"transfer_fail\"", "")             \
    X(COUNTER, NONE, remove_calls, remove_calls, "", "Remove calls")                               \
    X(COUNTER, NONE, exists_calls, exists_calls, "", "Exists calls")                               \
    X(COUNTER, NONE, size_calls, size_calls, "", "Size calls")                                     \
    X(COUNTER, NONE, rpc_failures, rpc_failures, "", "Master calls that failed")                   \
    /* key transfers (reads and replica writes) over tcp, and over shm (owner on this host) */     \
    X(COUNTER, NONE, tcp_transfers, transfers, "transport=\"tcp\"",                                \
      "Key transfers (reads and replica writes) by transport")                                     \
    X(COUNTER, NONE, shm_transfers, transfers, "transport=\"shm\"", "")                            \
    /* Host planning of read calls: validation, replica and route choice, staging eligibility  */  \
    /* and fills, up to the first submission; the lookup RPC and the transfers excluded.        */ \
    X(COUNTER, NS, plan_ns_total, plan, "", "Host planning time of read calls")                    \
    X(COUNTER, NONE, planned_fragments, planned_fragments, "",                                     \
      "Destination fragments of planned read calls")                                               \
    X(GAUGE, NONE, registered_buffers, registered_buffers, "", "Buffers registered now")           \
    X(GAUGE, BYTES, registered_bytes, registered, "", "Bytes of the buffers registered now")       \
    /* GPU read staging (all 0 while it is off): staged rounds (a retry is one more), their    */  \
    /* keys, buffer fills (one submission each), scatter launches (one per fill with keys)     */  \
    X(COUNTER, NONE, staged_reads, staging_rounds, "", "Staged read rounds (a retry is another)")  \
    X(COUNTER, NONE, staged_keys, staging_keys, "", "Keys carried by staged rounds")               \
    X(COUNTER, NONE, fills, staging_fills, "", "Staging buffer fills")                             \
    X(COUNTER, NONE, scatter_launches, scatter_launches, "", "Scatter kernel launches")            \
    /* Calls that fell back to direct reads, by the first reason found: another call held the  */  \
    /* buffer (after the busy wait), a key larger than the buffer, two fragments overlap, a    */  \
    /* fragment outside the backend's memory (or mixed), the buffer lives on another device,   */  \
    /* the buffer could not be allocated (staging now off).                                     */ \
    X(COUNTER, NONE, fallback_busy, staging_fallbacks, "reason=\"busy\"",                          \
      "Read calls that fell back from staging to direct, by reason")                               \
    X(COUNTER, NONE, fallback_too_large, staging_fallbacks, "reason=\"too_large\"", "")            \
    X(COUNTER, NONE, fallback_overlap, staging_fallbacks, "reason=\"overlap\"", "")                \
    X(COUNTER, NONE, fallback_other_domain, staging_fallbacks, "reason=\"other_domain\"", "")      \
    X(COUNTER, NONE, fallback_other_gpu, staging_fallbacks, "reason=\"other_gpu\"", "")            \
    X(COUNTER, NONE, fallback_alloc_failed, staging_fallbacks, "reason=\"alloc_failed\"", "")      \
    X(HIST, NS, put_latency, put_latency, "", "Put call latency, end to end")                      \
    X(HIST, NS, get_latency, get_latency, "", "Read call latency, end to end, every mode")         \
    /* Read calls that went direct because a key's fragments hold more than the object         */  \
    /* (kvs_client_batch_get_into_multi_buffers accepts them; staging needs an exact cover).    */ \
    X(COUNTER, NONE, fallback_not_exact, staging_fallbacks, "reason=\"not_exact\"", "")            \
    /* Appended after 0.1.0 (KVS_CLIENT_STATS_V0_SIZE ends before them): the mode each read  */    \
    /* call took, exclusive (their sum is get_calls): direct, grouped and not staged, staged    */ \
    X(COUNTER, NONE, get_direct_calls, reads, "mode=\"direct\"", "Read calls by the mode taken")   \
    X(COUNTER, NONE, get_grouped_unstaged_calls, reads, "mode=\"grouped\"", "")                    \
    X(COUNTER, NONE, get_staged_calls, reads, "mode=\"staged\"", "")                               \
    X(COUNTER, BYTES, get_direct_bytes, read, "mode=\"direct\"", "Bytes read, by mode")            \
    X(COUNTER, BYTES, get_grouped_bytes, read, "mode=\"grouped\"", "")                             \
    X(COUNTER, BYTES, get_staged_bytes, read, "mode=\"staged\"", "")                               \
    X(HIST, NS, get_direct_latency, read_latency, "mode=\"direct\"",                               \
      "Read call latency, end to end, by mode")                                                    \
    X(HIST, NS, get_grouped_latency, read_latency, "mode=\"grouped\"", "")                         \
    X(HIST, NS, get_staged_latency, read_latency, "mode=\"staged\"", "")                           \
    /* GPU (or host-backend) memory the staging buffer holds now, 0 before first use           */  \
    X(GAUGE, BYTES, staging_held_bytes, staging_held, "", "Memory the staging buffer holds")       \
    /* The device the staging buffer is on (CUDA ordinal; 0 for the host backend), meaningful  */  \
    /* once staging_held_bytes is not 0; buffer fills of the last staged call                  */  \
    X(GAUGE, NONE, staging_device, staging_device, "", "Device of the staging buffer")             \
    X(GAUGE, NONE, staging_last_fills, staging_last_call_fills, "",                                \
      "Buffer fills of the last staged read call")                                                 \
    /* Read calls in page-table form (kvs_client_batch_get_into_pages), and the host time their */ \
    /* staged reads spent building page plans while the first fill was in flight               */  \
    X(COUNTER, NONE, get_page_table_calls, page_table_reads, "", "Read calls in page-table form")  \
    X(COUNTER, NS, plan_overlapped_ns, plan_overlapped, "",                                        \
      "Host planning of staged page-table reads overlapped with the first fill")                   \
    /* Transfers of staged fills: keys next to each other in a segment and in the buffer are  */   \
    /* one transfer                                                                             */ \
    X(COUNTER, NONE, staging_transfers, staging_transfers, "", "Transfers of staged fills")        \
    /* Adaptive mode (MC_STORE_GPU_STAGING=auto): read calls by the mode it chose; calls that  */  \
    /* could stage but did not, because the model predicts staging slower or calls of the same */  \
    /* shape measured it slower; calls that tried a mode their shape had not measured; and     */  \
    /* calibrations (one per client, on first use)                                             */  \
    X(COUNTER, NONE, auto_direct_calls, auto_reads, "mode=\"direct\"",                             \
      "Read calls by the mode the adaptive policy chose")                                          \
    X(COUNTER, NONE, auto_grouped_calls, auto_reads, "mode=\"grouped\"", "")                       \
    X(COUNTER, NONE, auto_staged_calls, auto_reads, "mode=\"staged\"", "")                         \
    X(COUNTER, NONE, auto_not_staged_model, auto_not_staged, "reason=\"model_slower\"",            \
      "Adaptive read calls not staged, by reason")                                                 \
    X(COUNTER, NONE, auto_not_staged_measured, auto_not_staged, "reason=\"measured_slower\"", "")  \
    X(COUNTER, NONE, auto_explored, auto_explored, "",                                             \
      "Adaptive calls that tried an unmeasured mode")                                              \
    X(COUNTER, NONE, auto_calibrations, auto_calibrations, "", "Adaptive mode calibrations")       \
    /* The master lookup RPCs of read calls, from sending one to its answer.                  */   \
    X(COUNTER, NS, get_lookup_ns, read_lookup, "", "Master lookup time of read calls")             \
    /* The part of it run while the read's first staged fill was in flight (a pipelined read */    \
    /* looks up the keys after its first fill then)                                            */  \
    X(COUNTER, NS, get_lookup_overlapped_ns, read_lookup_overlapped, "",                           \
      "Master lookup time of read calls overlapped with their first staged fill")

#define KVS_STATS_TYPE_COUNTER uint64_t
#define KVS_STATS_TYPE_GAUGE   uint64_t
#define KVS_STATS_TYPE_HIST    kvs_histogram_t
typedef struct {
#define KVS_STATS_FIELD_(kind, unit, field, family, labels, help) KVS_STATS_TYPE_##kind field;
    KVS_CLIENT_STATS(KVS_STATS_FIELD_)
#undef KVS_STATS_FIELD_
} kvs_client_stats_t;

/* The size of kvs_client_stats_t in kvstash 0.1.0: what kvs_client_get_stats fills for a program
 * built against that header. */
#define KVS_CLIENT_STATS_V0_SIZE 832u

/* Copies a snapshot of the counters into *stats_p, `size` bytes of it (the caller's
 * sizeof(kvs_client_stats_t)): a program built against an older, shorter struct gets the prefix
 * it knows and nothing past it; a newer, longer one gets 0 in the fields this library does not
 * have. KVS_INVALID_PARAMS for a size below KVS_CLIENT_STATS_V0_SIZE. Needs a library newer than
 * 0.1.0 (which has only kvs_client_get_stats, with the 0.1.0 struct). */
int kvs_client_get_stats_sized(kvs_client_t *client, kvs_client_stats_t *stats_p, size_t size);

/* kvs_client_get_stats(client, stats_p): the sized call with this header's struct size. (The
 * library's function of that name, which programs built against 0.1.0 call, fills the 0.1.0
 * prefix only.) */
int kvs_client_get_stats(kvs_client_t *client, kvs_client_stats_t *stats_p);
#define kvs_client_get_stats(client, stats_p)                                                      \
    kvs_client_get_stats_sized((client), (stats_p), sizeof(kvs_client_stats_t))

/* Serves this client's metrics (the table above) in Prometheus text format at
 * http://bind_host:port/metrics until the client closes. bind_host NULL: every address; port 0:
 * any free port (kvs_client_metrics_port tells which). Mooncake's client HTTP server uses port
 * 9300. kvs_client_open does this itself when $KVS_CLIENT_METRICS_PORT is set. KVS_UNSUPPORTED
 * when this build has no HTTP server (libmicrohttpd), KVS_IO_ERROR when the port cannot be
 * bound, KVS_INVALID_PARAMS when already serving. */
int kvs_client_serve_metrics(kvs_client_t *client, const char *bind_host, uint16_t port);
/* The port the client's metrics are served on, 0 when they are not. */
int kvs_client_metrics_port(kvs_client_t *client);

#ifdef __cplusplus
}
#endif
#endif
