/* Client internals shared by its setup/metadata half (client.c) and its data paths
 * (client_io.c): the registry of registered buffers, statistics, and master calls. */
#ifndef KVS_CLIENT_INT_H
#define KVS_CLIENT_INT_H

#include <kvstash/client.h>

#include "../common/metrics_int.h"
#include "../owner/owner_int.h"
#include "../staging/staging_int.h"
#include "../transport/shm/shm_int.h"
#include "../transport/transport_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>

typedef struct {
    uintptr_t start;
    uintptr_t end; /* exclusive */
    int domain;
    atomic_uint_fast64_t pins; /* in-flight calls using it */
    atomic_bool dead;          /* unregistered; freed when the last pin goes */
} kvs__reg_t;

/* Buffers a call holds on to until it completes. */
typedef struct {
    kvs__reg_t **regs;
    size_t n, cap;
} kvs__pinset_t;

/* The live counters behind kvs_client_stats_t, generated from the same table. Fields kept
 * elsewhere (registration, the staging module's) stay 0 here; kvs_client_get_stats fills them. */
#define KVS__STATS_ATOMIC_COUNTER atomic_uint_fast64_t
#define KVS__STATS_ATOMIC_GAUGE   atomic_uint_fast64_t
#define KVS__STATS_ATOMIC_HIST    kvs__hist_t
typedef struct {
#define KVS__STATS_FIELD_(kind, unit, field, family, labels, help) KVS__STATS_ATOMIC_##kind field;
    KVS_CLIENT_STATS(KVS__STATS_FIELD_)
#undef KVS__STATS_FIELD_
} kvs__client_stats_t;

/* The table as descriptors (the exposition and Python's get_stats walk it). */
extern const kvs__metric_desc_t kvs__client_metrics[];
extern const size_t kvs__client_nmetrics;
/* Where each metric lives in kvs_client_stats_t. */
extern const size_t kvs__client_metric_offsets[];
/* Renders the client's metrics (a kvs__metrics_render_cb; `arg` is the client). */
int kvs__client_metrics_render(void *arg, kvs__text_t *t);

typedef struct {
    kvs_transport_t *t;
    kvs_endpoint_t *ep;
    char *name;
} kvs__client_ep_t;

typedef struct kvs__put_session kvs__put_session_t;
/* Revokes the put sessions left open (at close). */
void kvs__put_sessions_close(kvs_client_t *c);

/* Read sessions: lookups kept for later reads (client_session.c). */
typedef struct kvs__sessions kvs__sessions_t;
#define KVS_MAX_SESSION_KEYS (1u << 20)
int kvs__sessions_create(kvs__sessions_t **s_p);
void kvs__sessions_destroy(kvs__sessions_t *s);
/* Queues the release of every session's lease (at close: sessions left open end). */
void kvs__sessions_release_all(kvs_client_t *c);
/* The placement of keys ks[0..m) from live sessions, built in `arena` (until_ns[j]: each key's
 * lease end). KVS_UNSUPPORTED when not every key has one with time left (then look them up);
 * no lease is taken or released. */
int kvs__sessions_placement(kvs_client_t *c, uint32_t m, const kvs__str_t *ks, kvs__arena_t *arena,
                            kvs__placement_rsp_t *pr, uint64_t *until_ns, void ***held_p);
/* This client replaced or removed keys[i] (where results[i] is OK; results NULL: all): their
 * sessions end, so its own later reads see what it did. */
void kvs__sessions_forget(kvs_client_t *c, size_t n, const char *const keys[], const int *results);
/* The read that got `held` from kvs__sessions_placement is over (NULL: none held). */
void kvs__sessions_done(kvs_client_t *c, uint32_t m, void **held);

struct kvs_client {
    char *master_host;
    kvs__auth_t auth; /* the secret from auth_token_file, if any */
    bool tls;         /* TLS to the master and owners, and on our own segments' data ports */
    uint16_t master_port;
    char *etcd; /* the master's etcd endpoints (master given as etcd://...); NULL: host:port */
    char *etcd_prefix;
    char *node;
    uint64_t transfer_timeout_ms;
    kvs__rpc_t *rpc;
    /* A batch call's request and reply buffers, kept for the next one (see batch_call). */
    _Atomic(struct kvs__call_bufs *) spare_bufs;
    kvs_transport_t *tcp; /* NULL with protocol "shm" */
    kvs_transport_t *shm; /* NULL with protocol "tcp" */
    uint64_t sweep_ms;    /* how often mapped segments are checked against the master */
    atomic_uint_fast64_t last_sweep_ns;
    atomic_uint_fast64_t incarnation; /* of the master, as last seen */
    kvs__staging_t *staging;          /* NULL unless MC_STORE_GPU_STAGING is on */

    /* Registered buffers, sorted by start, never overlapping. */
    pthread_rwlock_t reg_lock;
    kvs__reg_t **regs;
    size_t nregs, regs_cap;
    uint64_t reg_bytes;
    /* Wakes unregister and close when pins or calls drop. */
    pthread_mutex_t wait_lock;
    pthread_cond_t wait_cond;
    atomic_uint_fast64_t calls; /* public calls in progress */

    pthread_mutex_t owners_lock;
    kvs__owner_t **owners;
    size_t nowners;

    /* The endpoints this client talks to, each holding one reference (kvs__client_endpoint). */
    pthread_mutex_t eps_lock;
    kvs__client_ep_t *eps;
    size_t neps, eps_cap;

    /* Leases of finished reads, to be released by the next master request (keys owned). */
    pthread_mutex_t rel_lock;
    kvs__lease_release_t *rel;
    uint32_t nrel, cap_rel;

    kvs__sessions_t *sessions; /* read sessions (client_session.c) */
    /* Put sessions (client_io.c): open puts whose ranges are written by later calls. */
    pthread_mutex_t psess_lock;
    kvs__put_session_t *psess;

    kvs__client_stats_t st;
    kvs__metrics_http_t *metrics; /* the client's metrics endpoint (owners_lock), or NULL */
};

/* Memory type of addr, from the CUDA driver if the process has loaded it: KVS_DOMAIN_HOST or
 * the device ordinal. */
int kvs__classify_memory(const void *addr, int *domain_p);

/* Counts a public call in progress (kvs_client_close waits for them). */
void kvs__client_enter(kvs_client_t *c);
void kvs__client_leave(kvs_client_t *c);

/* Finds the registered buffer holding all of [ptr, ptr + len), pins it into `ps` and gives its
 * memory domain. Returns false (nothing pinned) when no single registered buffer holds it.
 * Caller holds reg_lock for reading. */
bool kvs__reg_pin_locked(kvs_client_t *c, const void *ptr, size_t len, kvs__pinset_t *ps,
                         int *domain_p);

/* Unmaps shm segments and closes endpoints of owners the master no longer lists, at most every
 * sweep_ms, within the calling call's deadline. */
void kvs__client_sweep(kvs_client_t *c, uint64_t deadline_ns);

/* Page-table reads (client_io.c): the call's arguments checked by client_pages.c, which
 * started at t0 (planning time counts from there). */
int kvs__get_pages(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                   const kvs__page_layout_t *layout, const uint32_t *ids, const size_t npages[],
                   bool same_node, uint64_t t0, int64_t results[]);
/* Writes one key's npages x nregions fragments, in the layout's order, to out[]; false (nothing
 * usable) when an id is above layout->max_id (changed since the call checked it). */
bool kvs__pages_fragments(const kvs__page_layout_t *L, const uint32_t *ids, size_t npages,
                          struct iovec *out);

/* The client's staging state (NULL when off); for tests. */
kvs__staging_t *kvs__client_staging(kvs_client_t *c);
/* Lets go of every buffer in `ps` and frees its array. */
void kvs__pinset_release(kvs_client_t *c, kvs__pinset_t *ps);

/* One request/response with the master before the call's deadline (kvs__now_ns() clock); counts
 * failures. `req` holds a begun frame. */
int kvs__client_call(kvs_client_t *c, kvs__wbuf_t *req, kvs__wbuf_t *rsp, uint64_t deadline_ns);
/* Frees the batch-call buffers the client kept (at close). */
void kvs__client_bufs_destroy(kvs_client_t *c);
/* get_size with the caller's deadline. */
int64_t kvs__client_get_size_until(kvs_client_t *c, const char *key, uint64_t deadline_ns);
/* A reference to the endpoint `name` of transport `t` (give it back with t->ops->ep_close).
 * The client keeps one reference of its own per endpoint until the owner leaves the master's
 * list (the sweep), so endpoints live across calls. */
int kvs__client_endpoint(kvs_client_t *c, kvs_transport_t *t, const char *name,
                         uint64_t deadline_ns, kvs_endpoint_t **ep_p);
/* A keys call whose answer is one status per key (REMOVE, EXISTS): results[i] for keys[i]. */
int kvs__client_status_list_call(kvs_client_t *c, uint16_t type, uint32_t flags, size_t n,
                                 const char *const keys[], int results[]);
/* The same with keys_req.segment set (REPLICA_CLEAR). */
int kvs__client_status_list_call_seg(kvs_client_t *c, uint16_t type, uint32_t flags,
                                     const char *segment, size_t n, const char *const keys[],
                                     int results[]);
/* The deadline of a metadata call starting now (rpc_timeout_ms). */
uint64_t kvs__client_rpc_deadline(const kvs_client_t *c);
/* Master calls over a batch, split into as many frames as the frame limit needs and joined
 * again (`tokens`, one per key or NULL, names the puts of PUT_END and PUT_REVOKE): one status per
 * key into `sl` (PUT_END, PUT_REVOKE, EXISTS, REMOVE; `pr` NULL), one placement per key into `pr`
 * (LOOKUP; `sl` NULL) or per item (PUT_START). Every answer lives in `arena`. A part (frame) that
 * fails — the transport's failure, PROTOCOL_ERROR for a malformed answer or one of another length,
 * or the master's refusal — gives each of its keys that status; the call returns it only if every
 * part failed, else OK. */
int kvs__client_keys_call(kvs_client_t *c, uint16_t type, uint32_t flags, uint32_t n,
                          const kvs__str_t *keys, const kvs__put_token_t *tokens,
                          kvs__arena_t *arena, kvs__status_list_rsp_t *sl, kvs__placement_rsp_t *pr,
                          uint64_t deadline_ns);
int kvs__client_put_start(kvs_client_t *c, const kvs__put_start_req_t *ps, kvs__arena_t *arena,
                          kvs__placement_rsp_t *pr, uint64_t deadline_ns);

/* kvs__client_keys_call: the pending lease releases wait for the next request (a pipelined
 * read's first lookup leaves them to its second, which runs beside a transfer). Never sent. */
#define KVS__CALL_KEEP_RELEASES 0x80000000u

/* Joins the placement of one part into `all` (objs sized for the whole batch): its objects at
 * `first`, its segments unless already listed (the joined list in `arena`). */
int kvs__placement_join(kvs__placement_rsp_t *all, const kvs__placement_rsp_t *part, uint32_t first,
                        kvs__arena_t *arena);

/* A read of keys[i] (its lookup granted lease lease_ids[i]) is over: the lease goes back with
 * the next master request, at the latest at close. Ids 0 (no lease granted) are skipped. */
void kvs__client_release_later(kvs_client_t *c, uint32_t n, const kvs__str_t *keys,
                               const uint64_t *lease_ids);

#endif
