/* Metadata master state machine. See master_int.h for the contract. */
#include "master_int.h"
#include "allocator_int.h"

#include <stdlib.h>
#include <string.h>

/* The counters of KVS_MASTER_METRICS (its gauges are computed at each STAT). */
typedef struct {
#define COUNTER_FIELD_COUNTER(name) uint64_t name;
#define COUNTER_FIELD_GAUGE(name)
#define COUNTER_FIELD_(kind, unit, name, family, help) COUNTER_FIELD_##kind(name)
    KVS_MASTER_METRICS(COUNTER_FIELD_)
#undef COUNTER_FIELD_
#undef COUNTER_FIELD_GAUGE
#undef COUNTER_FIELD_COUNTER
} counters_t;

/* A fence the master asked a segment's owner for and that the owner has not acknowledged. */
typedef struct {
    uint64_t token;
    uint64_t seq;
    uint64_t epoch; /* the put's capability epoch */
} mfence_t;

/* A change of an owner's index not yet acknowledged (HA: kvs__master_config_t.owner_index). */
typedef struct {
    uint64_t seq, offset, size, token, writer, version;
    uint32_t op, flags;
    char *key; /* ADD only */
    uint32_t key_len;
} midx_t;

typedef struct seg {
    uint64_t id;
    uint64_t client_id;
    uint64_t fence_seq;   /* fences issued on this segment */
    uint64_t fence_acked; /* the owner has applied every fence up to this one */
    mfence_t *fences;     /* issued and not acknowledged, in order */
    uint32_t nfences, cap_fences;
    char *name, *node, *endpoint;
    uint64_t size;
    kvs__seg_alloc_t *alloc;
    uint64_t last_heartbeat_ns;
    bool graced;   /* got a pause's grace since its last heartbeat (at most one per heartbeat) */
    char peer[64]; /* the address its MOUNT came from, "" if unknown */
    kvs__cap_ctx_t *cap; /* keyed with the owner's write key: every replica's capability
                          * (NULL: the owner gave none, and checks none) */
    uint64_t idx_seq;    /* index changes issued on this segment */
    uint64_t idx_acked;  /* the owner has applied every change up to this one */
    midx_t *idx;         /* issued and not acknowledged, in order */
    uint32_t nidx, cap_idx;
    /* HA: re-registered with this leader (MOUNT naming its id) and its RECOVER not over: no
     * space of it is handed out, since what it holds is not all known yet. */
    bool recovering;
} seg_t;

typedef struct {
    seg_t *seg;
    uint64_t offset;
    uint32_t handle;
    uint64_t end_fence; /* the fence its PUT_END asked for (0: none yet) */
} mrep_t;

/* One lookup's lease on an object: until it ends or its reader releases it by id. An object's
 * grants take consecutive ids from a random start (obj_t.lease_next), so an id names one grant
 * only, never a later one, nor one of another object (or version) under the same key. */
typedef struct reader {
    uint64_t client_id;
    uint64_t lease_id;
    uint64_t until_ns; /* 0: released (dropped by the next obj_lease_end) */
} reader_t;

/* A placement group (put_item.group): its objects go where its latest one went, while there is
 * room. It lives while it has objects (pending or complete). */
typedef struct group {
    struct group *hnext;
    uint64_t hash;
    uint64_t refs;                      /* its objects */
    uint64_t seg_ids[KVS_MAX_REPLICAS]; /* where its latest object's copies went */
    uint32_t nsegs;
    uint32_t name_len;
    char name[];
} group_t;

/* Intrusive list link; it is an object's first member, so a link is also its object. */
typedef struct link {
    struct link *prev, *next;
} link_t;

typedef struct obj {
    link_t link; /* LRU list when complete, pending list when pending */
    struct obj *hnext;
    uint64_t hash;
    uint64_t size;
    uint64_t lease_until_ns; /* at least the latest end of any reader's lease; exact after
                              * obj_lease_end (obj_leased), which its readers use */
    /* Each reader's lease: until it ends or the reader releases it. In grant order, which is id
     * order (grants append, obj_lease_end keeps the order), so a release finds its grant by a
     * binary search, and R leases on one hot key cost O(log R) a release, not O(R). */
    struct reader *readers;
    uint32_t nreaders, cap_readers;
    uint64_t lease_next; /* the next grant's id (0: none granted yet) */
    uint64_t started_ns;
    uint64_t writer;    /* the client that started the put; only it may end or revoke it */
    uint64_t token;     /* random per put: its writes carry it, fences name it */
    uint64_t cap_epoch; /* the capability epoch of its PUT_START */
    uint64_t version;   /* at completion: orders versions across leaders (index_op.version) */
    /* HA: copies whose ADD the owners have not acknowledged yet. Until none is left the
     * object is complete but not visible (lookups answer REPLICA_IS_NOT_READY): a reader may
     * hold a lease only on what survives a failover. */
    uint32_t unindexed;
    mrep_t *reps;
    uint32_t nrep;
    /* Upserts: a new version of a complete object is held beside it (`next`, not in the table
     * and invisible to lookups) until its PUT_END swaps it in. `parent` is the version it
     * replaces (NULL once that one went: the upsert then fails at its end). */
    struct obj *next, *parent;
    bool in_table;
    /* Pins: a hard-pinned object is never evicted; a soft-pinned one only after every unpinned
     * one, until soft_pin_until_ns. A pending put keeps its pin request for its end. */
    bool hard_pin;
    uint8_t pin_action;         /* pending: KVS_SOFT_PIN_* */
    uint64_t pin_ttl_ns;        /* pending: the TTL ENABLE sets */
    uint64_t soft_pin_until_ns; /* 0: no soft pin */
    group_t *group;             /* NULL: none */
    uint32_t key_len;
    uint32_t state;
    char key[];
} obj_t;

/* Space that must not be reused yet, one replica each: the space of an object removed while a
 * reader's lease still covers it (a tombstone, until `until_ns`), or of a put ended early
 * (revoked, discarded, removed while pending) whose writes may still be on their way to the
 * owner (until the owner acknowledges fence `fence_seq`). Readers inside their lease and late
 * writes therefore never meet another object's bytes. */
/* The readers of a version removed or replaced while leased, shared by its replicas' limbo
 * entries: its space is free again once every one of them has released its lease or seen it
 * end, not only at the latest lease's end. */
typedef struct tomb {
    struct tomb *hnext;  /* in m->tombs, by its key's hash */
    uint64_t hash;       /* its key's */
    uint64_t lease_next; /* its object's at retirement: its readers' ids lie in order below it */
    uint32_t refs;       /* limbo entries */
    uint32_t nreaders;   /* in id order; a released one has until_ns 0 */
    uint32_t live;       /* not released */
    uint64_t until_ns;   /* the latest end of the readers' leases left */
    reader_t readers[];
} tomb_t;

typedef struct limbo {
    struct limbo *next;
    tomb_t *tomb; /* a tombstone's readers (NULL: not a tombstone) */
    struct seg *seg;
    uint32_t handle;
    uint64_t until_ns;
    uint64_t fence_seq; /* 0: no fence needed */
    /* HA: the owner's index still lists the object that lay here until it applies change
     * idx_seq (its DEL); reusing the space earlier could let a failover restore that object
     * over another's bytes. 0: none. */
    uint64_t idx_seq;
    /* A put's writer may still be copying into a same-host mapping, which no owner fence can
     * stop: the space also waits until the writer is known to be done with it (it ended or
     * revoked that key, or its connection closed). */
    uint64_t writer;
    bool writer_done;
    uint64_t token;              /* the put's */
    uint64_t writer_deadline_ns; /* the wait for the writer ends here at the latest */
    uint32_t key_len;
    char *key;
} limbo_t;

/* A client as the master's connections see it: a writer whose last connection closed more
 * than the put discard time ago is gone (a reconnection within it is not). */
typedef struct {
    uint64_t id;
    uint32_t nconns;
    uint64_t gone_since_ns;
} client_rec_t;

struct kvs__master {
    kvs__master_config_t cfg;
    limbo_t *limbo;
    uint32_t limbo_writers; /* limbo entries still waiting for their writer */
    uint32_t ntombs;        /* tombstones with readers (a release may end one) */
    tomb_t **tombs;         /* them by key hash, so that a release looks only at its key's */
    uint32_t ntomb_buckets; /* a power of two */
    client_rec_t *clients;
    uint32_t nclients, cap_clients;
    obj_t **buckets;
    size_t nbuckets; /* power of two */
    size_t nobjs;
    size_t npending;
    size_t nversions; /* pending upsert versions (pending, but not in the table) */
    link_t lru;       /* sentinel; lru.next is the most recently used */
    link_t pending;   /* sentinel; pending.next is the oldest put */
    seg_t **segs;
    uint32_t nseg, cap_seg;
    uint64_t completions; /* puts completed: with cfg.version_base, each one's version */
    bool idx_failed;      /* an index change could not be queued (no memory): logged once */
    kvs__index_mark_t marks[KVS_MAX_REPLICAS * 4]; /* ADDs of the current request (HA) */
    uint32_t nmarks;
    bool marks_overflow; /* more than fit: the request waits for all of its segments' acks */
    group_t **groups;    /* chained table of placement groups */
    size_t ngroup_buckets, ngroups;
    counters_t c;
};

/* ---- configuration ---------------------------------------------------------------------- */

static int env_ratio(const char *name, double *value_p)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return KVS_OK;
    char *end;
    double d = strtod(v, &end);
    if (*end != '\0' || !(d > 0.0 && d <= 1.0)) {
        kvs_error("%s=%s is not a ratio in (0, 1]", name, v);
        return KVS_INVALID_PARAMS;
    }
    *value_p = d;
    return KVS_OK;
}

int kvs__master_config_init(kvs__master_config_t *cfg)
{
    if (cfg == NULL)
        return KVS_INVALID_PARAMS;
    *cfg = (kvs__master_config_t){
        .lease_ms = 10000,
        .heartbeat_timeout_ms = 10000,
        .put_discard_ms = 30000,
        .high_watermark = 0.90,
        .evict_ratio = 0.05,
        .default_soft_pin_ttl_ms = 30 * 60 * 1000, /* Mooncake's defaults */
        .max_soft_pin_ttl_ms = 24 * 3600 * 1000,
        .allow_evict_soft_pinned = true,
    };
    const uint64_t day_ms = 86400000ull;
    int rc = KVS_OK;
    if (kvs__env_u64("KVS_MASTER_LEASE_MS", day_ms, &cfg->lease_ms) != KVS_OK ||
        kvs__env_u64("KVS_MASTER_HEARTBEAT_TIMEOUT_MS", day_ms, &cfg->heartbeat_timeout_ms) !=
            KVS_OK ||
        kvs__env_u64("KVS_MASTER_PUT_DISCARD_MS", day_ms, &cfg->put_discard_ms) != KVS_OK ||
        env_ratio("KVS_MASTER_HIGH_WATERMARK", &cfg->high_watermark) != KVS_OK ||
        env_ratio("KVS_MASTER_EVICT_RATIO", &cfg->evict_ratio) != KVS_OK ||
        kvs__env_u64("KVS_MASTER_DEFAULT_SOFT_PIN_TTL_MS", 30 * day_ms,
                     &cfg->default_soft_pin_ttl_ms) != KVS_OK ||
        kvs__env_u64("KVS_MASTER_MAX_SOFT_PIN_TTL_MS", 30 * day_ms, &cfg->max_soft_pin_ttl_ms) !=
            KVS_OK)
        rc = KVS_INVALID_PARAMS;
    return rc;
}

int kvs__master_config_check(const kvs__master_config_t *cfg)
{
    if (cfg == NULL || cfg->heartbeat_timeout_ms == 0 || cfg->put_discard_ms == 0 ||
        !(cfg->high_watermark > 0.0 && cfg->high_watermark <= 1.0) ||
        !(cfg->evict_ratio > 0.0 && cfg->evict_ratio <= 1.0) ||
        cfg->default_soft_pin_ttl_ms > cfg->max_soft_pin_ttl_ms)
        return KVS_INVALID_PARAMS;
    return KVS_OK;
}

/* ---- lists and hash table --------------------------------------------------------------- */

static void list_init(link_t *head)
{
    head->prev = head->next = head;
}

static void list_unlink(obj_t *o)
{
    link_t *l = &o->link;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = l;
}

static void list_push_front(link_t *head, obj_t *o)
{
    link_t *l = &o->link;
    l->next = head->next;
    l->prev = head;
    head->next->prev = l;
    head->next = l;
}

static void list_push_back(link_t *head, obj_t *o)
{
    list_push_front(head->prev, o);
}

static obj_t *link_obj(link_t *l)
{
    return (obj_t *)(void *)l;
}

static obj_t *obj_find(kvs__master_t *m, kvs__str_t key, uint64_t hash)
{
    for (obj_t *o = m->buckets[hash & (m->nbuckets - 1)]; o != NULL; o = o->hnext) {
        if (o->hash == hash && o->key_len == key.len && memcmp(o->key, key.ptr, key.len) == 0)
            return o;
    }
    return NULL;
}

static void table_grow(kvs__master_t *m)
{
    size_t n = m->nbuckets * 2;
    obj_t **b = kvs__calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* chains just get longer; correctness is unaffected */
    for (size_t i = 0; i < m->nbuckets; i++) {
        obj_t *o = m->buckets[i];
        while (o != NULL) {
            obj_t *next = o->hnext;
            o->hnext = b[o->hash & (n - 1)];
            b[o->hash & (n - 1)] = o;
            o = next;
        }
    }
    kvs__free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
}

static void table_insert(kvs__master_t *m, obj_t *o)
{
    if (m->nobjs >= m->nbuckets)
        table_grow(m);
    obj_t **slot = &m->buckets[o->hash & (m->nbuckets - 1)];
    o->hnext = *slot;
    *slot = o;
    o->in_table = true;
    m->nobjs++;
}

static void table_remove(kvs__master_t *m, obj_t *o)
{
    obj_t **p = &m->buckets[o->hash & (m->nbuckets - 1)];
    while (*p != o)
        p = &(*p)->hnext;
    *p = o->hnext;
    o->in_table = false;
    m->nobjs--;
}

/* ---- placement groups ------------------------------------------------------------------- */

static group_t *group_find(kvs__master_t *m, kvs__str_t name, uint64_t hash)
{
    for (group_t *g = m->groups[hash & (m->ngroup_buckets - 1)]; g != NULL; g = g->hnext) {
        if (g->hash == hash && g->name_len == name.len && memcmp(g->name, name.ptr, name.len) == 0)
            return g;
    }
    return NULL;
}

static void groups_grow(kvs__master_t *m)
{
    size_t n = m->ngroup_buckets * 2;
    group_t **b = kvs__calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* chains get longer; correctness is unaffected */
    for (size_t i = 0; i < m->ngroup_buckets; i++) {
        for (group_t *g = m->groups[i], *next; g != NULL; g = next) {
            next = g->hnext;
            g->hnext = b[g->hash & (n - 1)];
            b[g->hash & (n - 1)] = g;
        }
    }
    kvs__free(m->groups);
    m->groups = b;
    m->ngroup_buckets = n;
}

/* The group named `name`, created empty when absent; NULL on no memory. */
static group_t *group_get(kvs__master_t *m, kvs__str_t name)
{
    uint64_t hash = kvs__hash64(name.ptr, name.len);
    group_t *g = group_find(m, name, hash);
    if (g != NULL)
        return g;
    if ((g = kvs__calloc(1, sizeof(*g) + name.len)) == NULL)
        return NULL;
    g->hash = hash;
    g->name_len = name.len;
    memcpy(g->name, name.ptr, name.len);
    if (m->ngroups >= m->ngroup_buckets)
        groups_grow(m);
    group_t **slot = &m->groups[hash & (m->ngroup_buckets - 1)];
    g->hnext = *slot;
    *slot = g;
    m->ngroups++;
    return g;
}

/* Frees a group that has no objects (a new one whose first put failed, or its last went). */
static void group_put(kvs__master_t *m, group_t *g)
{
    if (g == NULL || g->refs > 0)
        return;
    group_t **p = &m->groups[g->hash & (m->ngroup_buckets - 1)];
    while (*p != g)
        p = &(*p)->hnext;
    *p = g->hnext;
    m->ngroups--;
    kvs__free(g);
}

/* Unlinks an object everywhere, frees its space in every segment, and frees it. */
/* ---- owners' indexes (HA) ------------------------------------------------------------- */

/* Queues an index change for the owner of `sg`. Without memory the owner's index misses it:
 * an ADD lost makes the object unrecoverable after a failover, a DEL lost leaves an entry that a
 * new leader refuses or tombstones (its version is older than what replaced it, or its range is
 * free again there only after a lease period); both are logged. */
static uint64_t idx_push(kvs__master_t *m, seg_t *sg, uint32_t op, const obj_t *o, uint64_t offset)
{
    if (!m->cfg.owner_index)
        return 0;
    if (sg->nidx == sg->cap_idx) {
        uint32_t cap = sg->cap_idx ? 2 * sg->cap_idx : 16;
        midx_t *x = kvs__realloc(sg->idx, cap * sizeof(*x));
        if (x == NULL)
            goto fail;
        sg->idx = x;
        sg->cap_idx = cap;
    }
    midx_t e = {.seq = sg->idx_seq + 1,
                .op = op,
                .token = o->token,
                .offset = offset,
                .size = o->size,
                .writer = o->writer,
                .version = o->version,
                .flags = o->hard_pin ? KVS_INDEX_FLAG_HARD_PIN : 0};
    if (op == KVS_INDEX_ADD) {
        if ((e.key = kvs__strndup(o->key, o->key_len)) == NULL)
            goto fail;
        e.key_len = o->key_len;
    }
    sg->idx[sg->nidx++] = e;
    sg->idx_seq++;
    uint32_t i = 0;
    while (i < m->nmarks && m->marks[i].segment_id != sg->id)
        i++;
    if (i < m->nmarks)
        m->marks[i].seq = sg->idx_seq;
    else if (m->nmarks < KVS_ARRAY_SIZE(m->marks))
        m->marks[m->nmarks++] = (kvs__index_mark_t){sg->id, sg->idx_seq};
    else
        m->marks_overflow = true;
    return sg->idx_seq;
fail:
    if (!m->idx_failed)
        kvs_error("out of memory: the owner of segment '%s' misses an index change (a failover "
                  "may lose that object)",
                  sg->name);
    m->idx_failed = true;
    return 0;
}

/* The space of a copy whose DEL is change `seq` of its segment: reusable once the owner has
 * applied it (limbo), at once without HA. Without memory for the wait the space is given up
 * (until the segment goes) rather than risk it. */
static void rep_release(kvs__master_t *m, const mrep_t *r, uint64_t seq)
{
    if (seq == 0) {
        kvs__seg_alloc_free(r->seg->alloc, r->handle);
        return;
    }
    limbo_t *l = kvs__calloc(1, sizeof(*l));
    if (l == NULL) {
        kvs_error("out of memory: %llu bytes of segment '%s' stay unused",
                  (unsigned long long)kvs__seg_alloc_used(r->seg->alloc), r->seg->name);
        return;
    }
    l->seg = r->seg;
    l->handle = r->handle;
    l->idx_seq = seq;
    l->writer_done = true;
    l->next = m->limbo;
    m->limbo = l;
}

static obj_t *obj_find(kvs__master_t *m, kvs__str_t key, uint64_t hash);

static void idx_acked(kvs__master_t *m, seg_t *sg, uint64_t seq)
{
    sg->idx_acked = KVS_MAX(sg->idx_acked, KVS_MIN(seq, sg->idx_seq));
    uint32_t k = 0;
    while (k < sg->nidx && sg->idx[k].seq <= seq) {
        midx_t *e = &sg->idx[k++];
        if (e->op == KVS_INDEX_ADD) {
            /* Indexed on this owner: once every copy is, the object is visible. */
            kvs__str_t key = {e->key, e->key_len};
            obj_t *o = obj_find(m, key, kvs__hash64(e->key, e->key_len));
            if (o != NULL && o->token == e->token && o->unindexed > 0)
                o->unindexed--;
        }
        kvs__free(e->key);
    }
    if (k == 0)
        return;
    memmove(sg->idx, sg->idx + k, (sg->nidx - k) * sizeof(*sg->idx));
    sg->nidx -= k;
}

static void obj_destroy(kvs__master_t *m, obj_t *o)
{
    for (uint32_t i = 0; i < o->nrep; i++) {
        uint64_t seq =
            o->state == KVS_OBJ_COMPLETE ? idx_push(m, o->reps[i].seg, KVS_INDEX_DEL, o, 0) : 0;
        rep_release(m, &o->reps[i], seq);
    }
    if (o->state == KVS_OBJ_PENDING)
        m->npending--;
    if (!o->in_table && o->state == KVS_OBJ_PENDING)
        m->nversions--;
    /* A pending upsert of this version is orphaned (its end fails; the discard fences it);
     * an upsert version that goes leaves its parent without one. */
    if (o->next != NULL)
        o->next->parent = NULL;
    if (o->parent != NULL)
        o->parent->next = NULL;
    if (o->in_table)
        table_remove(m, o);
    if (o->group != NULL) {
        o->group->refs--;
        group_put(m, o->group);
    }
    list_unlink(o);
    kvs__free(o->reps);
    kvs__free(o->readers);
    kvs__free(o);
}

/* Drops the leases that ended; returns the latest end of the others (0: none left). */
static uint64_t obj_lease_end(obj_t *o, uint64_t now_ns)
{
    uint64_t end = 0;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < o->nreaders; i++) {
        if (o->readers[i].until_ns > now_ns) {
            end = KVS_MAX(end, o->readers[i].until_ns);
            o->readers[kept++] = o->readers[i];
        }
    }
    o->nreaders = kept;
    o->lease_until_ns = end;
    return end;
}

static bool obj_leased(obj_t *o, uint64_t now_ns)
{
    return o->nreaders > 0 && obj_lease_end(o, now_ns) > now_ns;
}

/* A lookup by `client`: a lease of its own on the object until `until_ns`. Returns its id, or
 * 0 on no memory (the lookup then fails for that key). */
static uint64_t obj_lease(const kvs__master_t *m, obj_t *o, uint64_t client_id, uint64_t now_ns,
                          uint64_t until_ns)
{
    /* A full array first drops the ended and released leases; it grows when that freed at most
     * a quarter, so that a hot key whose leases end as fast as they come is not compacted at
     * every grant. A growth that fails is fine while compaction made room. */
    if (o->nreaders == o->cap_readers) {
        obj_lease_end(o, now_ns);
        if (o->nreaders >= o->cap_readers - o->cap_readers / 4) {
            uint32_t cap = o->cap_readers ? 2 * o->cap_readers : 2;
            reader_t *r = o->cap_readers <= UINT32_MAX / 2
                              ? kvs__realloc(o->readers, cap * sizeof(*r))
                              : NULL;
            if (r != NULL) {
                o->readers = r;
                o->cap_readers = cap;
            } else if (o->nreaders == o->cap_readers) {
                return 0;
            }
        }
    }
    if (o->lease_next == 0) /* the first grant */
        o->lease_next = m->cfg.lease_id_start != 0 ? m->cfg.lease_id_start : kvs__random_u64();
    /* Ids go up by one and skip 0 (no lease) when they wrap, so ages stay in order. */
    uint64_t id = o->lease_next++;
    if (o->lease_next == 0)
        o->lease_next = 1;
    if (id == 0)
        id = o->lease_next++;
    o->readers[o->nreaders++] = (reader_t){client_id, id, until_ns};
    o->lease_until_ns = KVS_MAX(o->lease_until_ns, until_ns);
    return id;
}

/* The capability epoch at `now_ns`: one per put discard time, so that every write of a put
 * (made before the put is discarded) carries a capability of this epoch or the previous one. */
static uint64_t cap_epoch(const kvs__master_t *m, uint64_t now_ns)
{
    return now_ns / (m->cfg.put_discard_ms * KVS_NS_PER_MS);
}

uint64_t kvs__master_cap_epoch(const kvs__master_t *m, uint64_t now_ns)
{
    return cap_epoch(m, now_ns);
}

/* Asks the owner of `seg` to fence `token` (of a put of capability epoch `epoch`); returns the
 * fence's number, 0 on no memory. */
static uint64_t fence_issue(struct seg *sg, uint64_t token, uint64_t epoch)
{
    if (sg->nfences == sg->cap_fences) {
        uint32_t cap = sg->cap_fences ? 2 * sg->cap_fences : 8;
        mfence_t *f = kvs__realloc(sg->fences, cap * sizeof(*f));
        if (f == NULL)
            return 0;
        sg->fences = f;
        sg->cap_fences = cap;
    }
    sg->fences[sg->nfences++] = (mfence_t){token, ++sg->fence_seq, epoch};
    return sg->fence_seq;
}

static void tomb_add(kvs__master_t *m, tomb_t *t);

/* Removes an object whose space a reader may still read or a writer still write: each
 * replica's space waits in limbo for the lease to end (complete objects) or for the owner to
 * fence the put (pending ones). NO_MEMORY, with nothing changed, when that cannot be set up. */
static int obj_retire(kvs__master_t *m, uint64_t now_ns, obj_t *o, bool writer_done)
{
    bool pending = o->state == KVS_OBJ_PENDING;
    bool leased = !pending && obj_leased(o, now_ns);
    if (pending || leased) {
        limbo_t *l[KVS_MAX_REPLICAS];
        uint32_t n = 0;
        for (; n < o->nrep; n++) {
            if ((l[n] = kvs__calloc(1, sizeof(*l[n]))) == NULL)
                break;
            if (pending && !writer_done && (l[n]->key = kvs__strndup(o->key, o->key_len)) == NULL) {
                kvs__free(l[n]);
                break;
            }
        }
        tomb_t *tomb = n == o->nrep && leased
                           ? kvs__malloc(sizeof(*tomb) + (size_t)o->nreaders * sizeof(reader_t))
                           : NULL;
        bool made = n == o->nrep && (!leased || tomb != NULL);
        bool fenced = true;
        if (made && pending) {
            /* Each fence is issued once its limbo entry exists, so none is lost. */
            for (uint32_t i = 0; i < n && fenced; i++) {
                l[i]->fence_seq = fence_issue(o->reps[i].seg, o->token, o->cap_epoch);
                fenced = l[i]->fence_seq != 0;
            }
        }
        if (!made || !fenced) {
            /* Fences already issued stay harmless: their token belongs to no live put. */
            for (uint32_t i = 0; i < n; i++) {
                kvs__free(l[i]->key);
                kvs__free(l[i]);
            }
            kvs__free(tomb);
            return KVS_NO_MEMORY;
        }
        if (tomb != NULL) {
            /* obj_leased compacted the readers: all live, in id order. */
            tomb->hash = o->hash;
            tomb->lease_next = o->lease_next;
            tomb->refs = n;
            tomb->nreaders = tomb->live = o->nreaders;
            tomb->until_ns = o->lease_until_ns;
            memcpy(tomb->readers, o->readers, (size_t)o->nreaders * sizeof(reader_t));
            tomb_add(m, tomb);
        }
        for (uint32_t i = 0; i < n; i++) {
            l[i]->seg = o->reps[i].seg;
            l[i]->tomb = tomb;
            l[i]->handle = o->reps[i].handle;
            l[i]->until_ns = leased ? o->lease_until_ns : 0;
            if (!pending)
                l[i]->fence_seq = 0;
            l[i]->writer = o->writer;
            l[i]->writer_done = !pending || writer_done;
            l[i]->token = o->token;
            /* A writer stalled this long in a copy is not waited for any more (bounded). */
            l[i]->writer_deadline_ns = now_ns + 10 * m->cfg.put_discard_ms * KVS_NS_PER_MS;
            m->limbo_writers += !l[i]->writer_done;
            l[i]->key_len = o->key_len;
            l[i]->next = m->limbo;
            m->limbo = l[i];
        }
        for (uint32_t i = 0; i < n && !pending; i++)
            l[i]->idx_seq = idx_push(m, o->reps[i].seg, KVS_INDEX_DEL, o, 0);
        o->nrep = 0; /* the space is limbo's now */
        m->c.tombstones += leased;
    }
    obj_destroy(m, o);
    return KVS_OK;
}

static client_rec_t *client_rec(kvs__master_t *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->nclients; i++) {
        if (m->clients[i].id == id)
            return &m->clients[i];
    }
    return NULL;
}

/* The record of `id`, made (as disconnected since `now_ns`) if there is none; NULL on no
 * memory. */
static client_rec_t *client_rec_add(kvs__master_t *m, uint64_t now_ns, uint64_t id)
{
    client_rec_t *r = client_rec(m, id);
    if (r != NULL)
        return r;
    if (m->nclients == m->cap_clients) {
        uint32_t cap = m->cap_clients ? 2 * m->cap_clients : 16;
        client_rec_t *c = kvs__realloc(m->clients, cap * sizeof(*c));
        if (c == NULL)
            return NULL;
        m->clients = c;
        m->cap_clients = cap;
    }
    m->clients[m->nclients] = (client_rec_t){id, 0, now_ns};
    return &m->clients[m->nclients++];
}

/* Whether writes of `id` can no longer be in progress: it has had no connection for the put
 * discard time (an unknown client is one whose record went after that). */
static bool writer_gone(kvs__master_t *m, uint64_t id, uint64_t now_ns)
{
    const client_rec_t *r = client_rec(m, id);
    return r == NULL ||
           (r->nconns == 0 && now_ns - r->gone_since_ns >= m->cfg.put_discard_ms * KVS_NS_PER_MS);
}

/* Returns to the allocators the limbo space whose lease has ended, whose fence the owner has
 * applied and whose writer is done (all of it, without freeing, when `all`: the allocators go
 * too). */
static uint64_t limbo_until(const limbo_t *l)
{
    return l->tomb != NULL ? l->tomb->until_ns : l->until_ns;
}

/* Indexes a new tombstone; a failed growth keeps the smaller table (longer chains). */
static void tomb_add(kvs__master_t *m, tomb_t *t)
{
    if ((uint64_t)m->ntombs >= 4 * (uint64_t)m->ntomb_buckets &&
        m->ntomb_buckets <= UINT32_MAX / 2) {
        uint32_t n = 2 * m->ntomb_buckets;
        tomb_t **b = kvs__calloc(n, sizeof(*b));
        for (uint32_t i = 0; b != NULL && i < m->ntomb_buckets; i++) {
            for (tomb_t *x = m->tombs[i], *next; x != NULL; x = next) {
                next = x->hnext;
                x->hnext = b[x->hash & (n - 1)];
                b[x->hash & (n - 1)] = x;
            }
        }
        if (b != NULL) {
            kvs__free(m->tombs);
            m->tombs = b;
            m->ntomb_buckets = n;
        }
    }
    tomb_t **head = &m->tombs[t->hash & (m->ntomb_buckets - 1)];
    t->hnext = *head;
    *head = t;
    m->ntombs++;
}

/* Frees a limbo entry (not its space) unlinked from the list. */
static void limbo_free(kvs__master_t *m, limbo_t *l)
{
    m->limbo_writers -= !l->writer_done;
    if (l->tomb != NULL && --l->tomb->refs == 0) {
        tomb_t **pp = &m->tombs[l->tomb->hash & (m->ntomb_buckets - 1)];
        while (*pp != NULL && *pp != l->tomb) /* every tombstone is indexed (tomb_add) */
            pp = &(*pp)->hnext;
        if (*pp != NULL)
            *pp = l->tomb->hnext;
        else
            kvs_error("master: a tombstone was missing from its index (a bug)");
        kvs__free(l->tomb);
        m->ntombs--;
    }
    kvs__free(l->key);
    kvs__free(l);
}

static void limbo_sweep(kvs__master_t *m, uint64_t now_ns, bool all)
{
    for (limbo_t **pp = &m->limbo; *pp != NULL;) {
        limbo_t *l = *pp;
        bool writer_ok =
            l->writer_done || now_ns >= l->writer_deadline_ns || writer_gone(m, l->writer, now_ns);
        bool due = limbo_until(l) <= now_ns && l->fence_seq <= l->seg->fence_acked && writer_ok &&
                   l->idx_seq <= l->seg->idx_acked;
        if (all || due) {
            if (!all)
                kvs__seg_alloc_free(l->seg->alloc, l->handle);
            *pp = l->next;
            limbo_free(m, l);
        } else {
            pp = &l->next;
        }
    }
}

/* The writer `client_id` is done with its put of `key` named by `token` (0: any of that key):
 * it ended or revoked it, which it does only after its transfers returned. */
static void limbo_writer_done(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                              const kvs__str_t *key, uint64_t token)
{
    bool any = false;
    for (limbo_t *l = m->limbo; l != NULL; l = l->next) {
        if (l->writer_done || l->writer != client_id)
            continue;
        if (token != 0 ? l->token != token : !kvs__str_eq(*key, (kvs__str_t){l->key, l->key_len}))
            continue;
        l->writer_done = true;
        m->limbo_writers--;
        any = true;
    }
    if (any)
        limbo_sweep(m, now_ns, false);
}

void kvs__master_client_connected(kvs__master_t *m, uint64_t now_ns, uint64_t client_id)
{
    client_rec_t *r = m && client_id ? client_rec_add(m, now_ns, client_id) : NULL;
    if (r != NULL)
        r->nconns++;
}

void kvs__master_client_disconnected(kvs__master_t *m, uint64_t now_ns, uint64_t client_id)
{
    client_rec_t *r = m && client_id ? client_rec(m, client_id) : NULL;
    if (r != NULL && r->nconns > 0 && --r->nconns == 0)
        r->gone_since_ns = now_ns;
}

/* Forgets clients gone for good (their limbo entries then count them gone, which they are). */
static void clients_prune(kvs__master_t *m, uint64_t now_ns)
{
    for (uint32_t i = 0; i < m->nclients;) {
        client_rec_t *r = &m->clients[i];
        if (r->nconns == 0 && now_ns - r->gone_since_ns > 2 * m->cfg.put_discard_ms * KVS_NS_PER_MS)
            m->clients[i] = m->clients[--m->nclients];
        else
            i++;
    }
}

/* A segment going away takes its limbo space with it: nothing can read or write it any more. */
static void limbo_drop_segment(kvs__master_t *m, const struct seg *s)
{
    for (limbo_t **pp = &m->limbo; *pp != NULL;) {
        limbo_t *l = *pp;
        if (l->seg == s) {
            *pp = l->next;
            limbo_free(m, l);
        } else {
            pp = &l->next;
        }
    }
}

/* ---- lifetime --------------------------------------------------------------------------- */

int kvs__master_create(const kvs__master_config_t *cfg, kvs__master_t **master_p)
{
    if (master_p == NULL || kvs__master_config_check(cfg) != KVS_OK)
        return KVS_INVALID_PARAMS;
    kvs__master_t *m = kvs__calloc(1, sizeof(*m));
    if (m == NULL)
        return KVS_NO_MEMORY;
    m->cfg = *cfg;
    m->nbuckets = 1024;
    m->buckets = kvs__calloc(m->nbuckets, sizeof(*m->buckets));
    m->ngroup_buckets = 64;
    m->groups = kvs__calloc(m->ngroup_buckets, sizeof(*m->groups));
    m->ntomb_buckets = 64;
    m->tombs = kvs__calloc(m->ntomb_buckets, sizeof(*m->tombs));
    if (m->buckets == NULL || m->groups == NULL || m->tombs == NULL) {
        kvs__free(m->buckets);
        kvs__free(m->groups);
        kvs__free(m->tombs);
        kvs__free(m);
        return KVS_NO_MEMORY;
    }
    list_init(&m->lru);
    list_init(&m->pending);
    *master_p = m;
    return KVS_OK;
}

static void seg_destroy(seg_t *s)
{
    if (s == NULL)
        return;
    kvs__seg_alloc_destroy(s->alloc);
    kvs__cap_ctx_free(s->cap);
    kvs__free(s->fences);
    for (uint32_t i = 0; i < s->nidx; i++)
        kvs__free(s->idx[i].key);
    kvs__free(s->idx);
    kvs__free(s->name);
    kvs__free(s->node);
    kvs__free(s->endpoint);
    kvs__free(s);
}

void kvs__master_destroy(kvs__master_t *m)
{
    if (m == NULL)
        return;
    /* Upsert versions live only on the pending list (walked before the table frees the rest). */
    while (m->pending.next != &m->pending) {
        obj_t *o = link_obj(m->pending.next);
        list_unlink(o);
        if (!o->in_table) {
            kvs__free(o->reps);
            kvs__free(o->readers);
            kvs__free(o);
        }
    }
    for (size_t i = 0; i < m->nbuckets; i++) {
        obj_t *o = m->buckets[i];
        while (o != NULL) {
            obj_t *next = o->hnext;
            kvs__free(o->reps);
            kvs__free(o->readers);
            kvs__free(o);
            o = next;
        }
    }
    kvs__free(m->buckets);
    for (size_t i = 0; i < m->ngroup_buckets; i++) {
        for (group_t *g = m->groups[i], *next; g != NULL; g = next) {
            next = g->hnext;
            kvs__free(g);
        }
    }
    kvs__free(m->groups);
    limbo_sweep(m, 0, true);
    kvs__free(m->tombs); /* emptied by the sweep */
    kvs__free(m->clients);
    for (uint32_t i = 0; i < m->nseg; i++)
        seg_destroy(m->segs[i]);
    kvs__free(m->segs);
    kvs__free(m);
}

uint64_t kvs__master_new_client(kvs__master_t *m)
{
    /* Random, so that ids cannot be guessed and ids from a restarted master do not collide
     * with ones its old clients still hold. */
    KVS_UNUSED(m);
    return kvs__random_u64();
}

/* ---- segments --------------------------------------------------------------------------- */

static seg_t *seg_by_id(kvs__master_t *m, uint64_t id)
{
    for (uint32_t i = 0; i < m->nseg; i++) {
        if (m->segs[i]->id == id)
            return m->segs[i];
    }
    return NULL;
}

static seg_t *seg_by_name(kvs__master_t *m, kvs__str_t name)
{
    for (uint32_t i = 0; i < m->nseg; i++) {
        if (kvs__str_eq(kvs__str_c(m->segs[i]->name), name))
            return m->segs[i];
    }
    return NULL;
}

/* A key as the master stores it: a client's key, or a tenant's (tenant name, NUL, the client's
 * key; master_server.c makes them). */
static int ns_key_check(const char *k, size_t len)
{
    const char *nul = memchr(k, '\0', len);
    if (nul == NULL)
        return kvs__key_check(k, len);
    size_t t = (size_t)(nul - k);
    return kvs__tenant_ok(k, t) ? kvs__key_check(nul + 1, len - t - 1) : KVS_INVALID_PARAMS;
}

static bool name_ok(kvs__str_t s)
{
    return s.len > 0 && s.len <= KVS_MAX_NAME_LEN && memchr(s.ptr, '\0', s.len) == NULL;
}

/* A segment id no mounted segment has: random, so that ids are never reused across master
 * restarts either (a client's caches keyed by id cannot confuse two generations). */
static uint64_t new_segment_id(kvs__master_t *m)
{
    for (;;) {
        uint64_t id = kvs__random_u64();
        if (seg_by_id(m, id) == NULL)
            return id;
    }
}

int kvs__master_mount(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                      const kvs__mount_req_t *req, uint64_t *segment_id_p)
{
    if (m == NULL || req == NULL || segment_id_p == NULL || client_id == 0 || !name_ok(req->name) ||
        !name_ok(req->node) || !name_ok(req->endpoint) || req->size < KVS_SEG_ALLOC_ALIGN ||
        (req->write_key.len != 0 && req->write_key.len != KVS_WRITE_KEY_LEN))
        return KVS_INVALID_PARAMS;
    if (seg_by_name(m, req->name) != NULL)
        return KVS_SEGMENT_ALREADY_EXISTS;
    /* The schema's bound: every segment fits a LOOKUP or STAT reply. */
    if (m->nseg >= KVS_MAX_SEGMENTS)
        return KVS_NO_AVAILABLE_HANDLE;
    if (m->nseg == m->cap_seg) {
        uint32_t cap = m->cap_seg ? m->cap_seg * 2 : 8;
        seg_t **segs = kvs__realloc(m->segs, cap * sizeof(*segs));
        if (segs == NULL)
            return KVS_NO_MEMORY;
        m->segs = segs;
        m->cap_seg = cap;
    }
    seg_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->name = kvs__strndup(req->name.ptr, req->name.len);
    s->node = kvs__strndup(req->node.ptr, req->node.len);
    s->endpoint = kvs__strndup(req->endpoint.ptr, req->endpoint.len);
    if (s->name == NULL || s->node == NULL || s->endpoint == NULL ||
        kvs__seg_alloc_create(req->size, &s->alloc) != KVS_OK) {
        seg_destroy(s);
        return KVS_NO_MEMORY;
    }
    /* A re-registration keeps its id (readers' mappings and placements name it); ids are
     * random, so a collision with a live segment only comes from a confused owner. */
    if (req->segment_id != 0 && seg_by_id(m, req->segment_id) != NULL) {
        seg_destroy(s);
        return KVS_SEGMENT_ALREADY_EXISTS;
    }
    s->id = req->segment_id != 0 ? req->segment_id : new_segment_id(m);
    s->recovering = req->segment_id != 0; /* until its RECOVER's last page */
    s->client_id = client_id;
    if (req->write_key.len == KVS_WRITE_KEY_LEN &&
        kvs__cap_ctx_new(req->write_key.ptr, &s->cap) != KVS_OK) {
        seg_destroy(s);
        return KVS_NO_MEMORY;
    }
    s->size = kvs__seg_alloc_capacity(s->alloc);
    s->last_heartbeat_ns = now_ns;
    m->segs[m->nseg++] = s;
    m->c.segments_mounted++;
    kvs_info("segment %llu '%s' mounted: %llu bytes on node '%s' at %s", (unsigned long long)s->id,
             s->name, (unsigned long long)s->size, s->node, s->endpoint);
    *segment_id_p = s->id;
    return KVS_OK;
}

/* Drops every replica on `s`, destroys objects left without one, then the segment. */
/* An object loses its replicas on a segment that went; one left without any goes too. */
static void obj_drop_seg(kvs__master_t *m, obj_t *o, const seg_t *s)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < o->nrep; i++) {
        if (o->reps[i].seg != s)
            o->reps[kept++] = o->reps[i];
    }
    o->nrep = kept;
    if (kept == 0)
        obj_destroy(m, o);
}

static void seg_remove(kvs__master_t *m, seg_t *s)
{
    limbo_drop_segment(m, s);
    for (size_t b = 0; b < m->nbuckets; b++) {
        obj_t *o = m->buckets[b];
        while (o != NULL) {
            obj_t *next = o->hnext;
            obj_drop_seg(m, o, s);
            o = next;
        }
    }
    /* Upsert versions are not in the table: they lose their replicas there too. */
    for (link_t *l = m->pending.next; l != &m->pending;) {
        link_t *next = l->next;
        if (!link_obj(l)->in_table)
            obj_drop_seg(m, link_obj(l), s);
        l = next;
    }
    for (uint32_t i = 0; i < m->nseg; i++) {
        if (m->segs[i] == s) {
            m->segs[i] = m->segs[--m->nseg];
            break;
        }
    }
    seg_destroy(s);
}

int kvs__master_unmount(kvs__master_t *m, uint64_t client_id, uint64_t segment_id)
{
    if (m == NULL)
        return KVS_INVALID_PARAMS;
    seg_t *s = seg_by_id(m, segment_id);
    if (s == NULL)
        return KVS_SEGMENT_NOT_FOUND;
    if (s->client_id != client_id)
        return KVS_INVALID_PARAMS;
    kvs_info("segment %llu '%s' unmounted", (unsigned long long)s->id, s->name);
    seg_remove(m, s);
    m->c.segments_unmounted++;
    return KVS_OK;
}

int kvs__master_holder(kvs__master_t *m, kvs__str_t name, kvs__master_holder_t *holder_p)
{
    if (m == NULL || holder_p == NULL)
        return KVS_INVALID_PARAMS;
    seg_t *s = seg_by_name(m, name);
    if (s == NULL)
        return KVS_SEGMENT_NOT_FOUND;
    const client_rec_t *r = client_rec(m, s->client_id);
    *holder_p = (kvs__master_holder_t){.segment_id = s->id,
                                       .client_id = s->client_id,
                                       .connected = r != NULL && r->nconns > 0,
                                       .node = s->node,
                                       .endpoint = s->endpoint,
                                       .peer = s->peer};
    return KVS_OK;
}

void kvs__master_segment_set_peer(kvs__master_t *m, uint64_t segment_id, const char *peer)
{
    seg_t *s = m != NULL && peer != NULL ? seg_by_id(m, segment_id) : NULL;
    if (s != NULL)
        snprintf(s->peer, sizeof(s->peer), "%s", peer);
}

int kvs__master_replace(kvs__master_t *m, uint64_t segment_id)
{
    seg_t *s = m ? seg_by_id(m, segment_id) : NULL;
    if (s == NULL)
        return KVS_SEGMENT_NOT_FOUND;
    kvs_warn("segment %llu '%s' dropped: its owner at %s is gone and a new one takes the name",
             (unsigned long long)s->id, s->name, s->endpoint);
    seg_remove(m, s); /* as an expiry: its replicas and objects go, its limbo space with it */
    m->c.segments_replaced++;
    return KVS_OK;
}

/* The owner has applied every fence of `s` up to `seq`: forget them, free what they held. */
static void fence_acked(kvs__master_t *m, seg_t *s, uint64_t seq, uint64_t now_ns)
{
    if (seq <= s->fence_acked)
        return;
    s->fence_acked = KVS_MIN(seq, s->fence_seq);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < s->nfences; i++) {
        if (s->fences[i].seq > s->fence_acked)
            s->fences[kept++] = s->fences[i];
    }
    s->nfences = kept;
    limbo_sweep(m, now_ns, false);
}

int kvs__master_heartbeat(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                          const kvs__heartbeat_req_t *req, kvs__arena_t *arena,
                          kvs__heartbeat_rsp_t *rsp)
{
    if (m == NULL || client_id == 0 || (rsp != NULL && arena == NULL))
        return KVS_INVALID_PARAMS;
    uint32_t found = 0, nfences = 0, nidx = 0;
    for (uint32_t i = 0; i < m->nseg; i++) {
        seg_t *s = m->segs[i];
        if (s->client_id != client_id)
            continue;
        /* A heartbeat names the segments its owner serves (one ack each): only those stay
         * mounted. A segment the owner does not know it has (a MOUNT whose reply was lost)
         * expires instead of holding space and unacknowledged fences for ever. */
        bool served = req == NULL;
        for (uint32_t j = 0; req != NULL && j < req->nacks; j++) {
            if (req->acks[j].segment_id == s->id) {
                served = true;
                uint64_t before = s->idx_acked;
                idx_acked(m, s, req->acks[j].index_seq);
                fence_acked(m, s, req->acks[j].seq, now_ns);
                if (s->idx_acked != before)
                    limbo_sweep(m, now_ns, false);
            }
        }
        if (!served)
            continue;
        s->last_heartbeat_ns = now_ns;
        s->graced = false;
        found++;
        nfences += s->nfences;
        nidx += s->nidx;
    }
    if (rsp == NULL)
        return found ? KVS_OK : KVS_SEGMENT_NOT_FOUND;
    /* The fences still unacknowledged, oldest first; the rest follow in later replies. */
    memset(rsp, 0, sizeof(*rsp));
    rsp->status = found ? KVS_OK : KVS_SEGMENT_NOT_FOUND;
    rsp->epoch = cap_epoch(m, now_ns);
    nfences = KVS_MIN(nfences, KVS_MAX_FENCES);
    rsp->fences = kvs__arena_alloc(arena, (size_t)nfences * sizeof(*rsp->fences));
    if (rsp->fences == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->nseg && rsp->nfences < nfences; i++) {
        seg_t *s = m->segs[i];
        bool served = req == NULL;
        for (uint32_t j = 0; req != NULL && j < req->nacks; j++)
            served |= req->acks[j].segment_id == s->id;
        for (uint32_t j = 0;
             served && s->client_id == client_id && j < s->nfences && rsp->nfences < nfences; j++)
            rsp->fences[rsp->nfences++] =
                (kvs__fence_t){s->id, s->fences[j].token, s->fences[j].seq, s->fences[j].epoch};
    }
    /* Index changes likewise, oldest first (the keys borrowed: encoded before anything runs). */
    nidx = KVS_MIN(nidx, KVS_MAX_INDEX_OPS);
    rsp->index = kvs__arena_alloc(arena, (size_t)KVS_MAX(nidx, 1) * sizeof(*rsp->index));
    if (rsp->index == NULL)
        return KVS_NO_MEMORY;
    for (uint32_t i = 0; i < m->nseg && rsp->nindex < nidx; i++) {
        seg_t *s = m->segs[i];
        bool served = req == NULL;
        for (uint32_t j = 0; req != NULL && j < req->nacks; j++)
            served |= req->acks[j].segment_id == s->id;
        for (uint32_t j = 0;
             served && s->client_id == client_id && j < s->nidx && rsp->nindex < nidx; j++) {
            const midx_t *e = &s->idx[j];
            rsp->index[rsp->nindex++] = (kvs__index_op_t){.segment_id = s->id,
                                                          .seq = e->seq,
                                                          .op = e->op,
                                                          .key = {e->key, e->key_len},
                                                          .offset = e->offset,
                                                          .size = e->size,
                                                          .token = e->token,
                                                          .writer = e->writer,
                                                          .version = e->version,
                                                          .flags = e->flags};
        }
    }
    return KVS_OK;
}

/* ---- eviction --------------------------------------------------------------------------- */

static bool obj_on_seg(const obj_t *o, const seg_t *s)
{
    for (uint32_t i = 0; i < o->nrep; i++) {
        if (o->reps[i].seg == s)
            return true;
    }
    return false;
}

/* Evicts complete, unleased objects with a replica on `s`, least recently used first, until
 * `need` bytes of `s` are free again or nothing more may go. Returns the bytes freed on s. */
/* Soft pins' action numbers on the wire (Mooncake's SoftPinAction). */
enum { PIN_PRESERVE = 0, PIN_ENABLE = 1, PIN_DISABLE = 2 };

static bool soft_pinned(const obj_t *o, uint64_t now_ns)
{
    return o->soft_pin_until_ns > now_ns;
}

/* One eviction pass over the LRU list, least recently used first: unpinned objects, or (the
 * second pass) soft-pinned ones. */
static uint64_t evict_pass(kvs__master_t *m, uint64_t now_ns, seg_t *s, uint64_t need,
                           bool soft_pins)
{
    uint64_t freed = 0;
    link_t *l = m->lru.prev;
    while (l != &m->lru && freed < need) {
        link_t *prev = l->prev;
        obj_t *o = link_obj(l);
        /* A version with an upsert open is kept: evicting it would orphan the upsert and
         * lose the key. */
        if (!o->hard_pin && o->next == NULL && soft_pinned(o, now_ns) == soft_pins &&
            !obj_leased(o, now_ns) && obj_on_seg(o, s)) {
            m->c.soft_pin_evictions += soft_pins;
            uint64_t before = kvs__seg_alloc_used(s->alloc);
            m->c.evictions++;
            m->c.evicted_bytes += o->size;
            kvs_debug("evicting '%.*s' (%llu bytes) from segment '%s'", (int)o->key_len, o->key,
                      (unsigned long long)o->size, s->name);
            obj_destroy(m, o);
            freed += before - kvs__seg_alloc_used(s->alloc);
        }
        l = prev;
    }
    return freed;
}

static uint64_t evict_from(kvs__master_t *m, uint64_t now_ns, seg_t *s, uint64_t need)
{
    /* Unpinned objects first; soft-pinned ones (pin still on) only after all of them, and only
     * when allowed; hard-pinned ones never. */
    uint64_t freed = 0;
    for (int pass = 0; pass < (m->cfg.allow_evict_soft_pinned ? 2 : 1) && freed < need; pass++)
        freed += evict_pass(m, now_ns, s, need - freed, pass == 1);
    return freed;
}

static void evict_if_high(kvs__master_t *m, uint64_t now_ns, seg_t *s)
{
    double used = (double)kvs__seg_alloc_used(s->alloc);
    if (used > m->cfg.high_watermark * (double)s->size)
        evict_from(m, now_ns, s, (uint64_t)(m->cfg.evict_ratio * (double)s->size));
}

/* ---- placement -------------------------------------------------------------------------- */

static uint64_t seg_free(const seg_t *s)
{
    return s->size - kvs__seg_alloc_used(s->alloc);
}

static int cmp_free_desc(const void *a, const void *b)
{
    uint64_t fa = seg_free(*(seg_t *const *)a), fb = seg_free(*(seg_t *const *)b);
    return fa < fb ? 1 : fa > fb ? -1 : 0;
}

/* Moves `s` (if a candidate) to the front of out[0..n), keeping the others' order. */
static void promote(seg_t **out, uint32_t n, const seg_t *s)
{
    for (uint32_t i = 0; s != NULL && i < n; i++) {
        if (out[i] == s) {
            memmove(&out[1], &out[0], i * sizeof(*out));
            out[0] = (seg_t *)s;
            return;
        }
    }
}

/* Orders candidate segments for one object, copy i going to the i-th that has room: the
 * preferred segment and then the preferred segments, in the caller's order; then the
 * segments of the object's group; then (same-node puts) the batch's segment and the writer's
 * node; then the rest by free space, most first. */
static uint32_t order_candidates(kvs__master_t *m, const kvs__put_start_req_t *req,
                                 const group_t *g, seg_t *batch_seg, seg_t **out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->nseg; i++)
        out[n++] = m->segs[i];
    qsort(out, n, sizeof(*out), cmp_free_desc);
    bool same_node = (req->flags & KVS_PUT_FLAG_SAME_NODE) != 0;
    if (same_node) {
        uint32_t w = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (kvs__str_eq(kvs__str_c(out[i]->node), req->node)) {
                seg_t *t = out[i];
                memmove(&out[w + 1], &out[w], (i - w) * sizeof(*out));
                out[w++] = t;
            }
        }
    }
    /* The favoured segments, most favoured first, promoted last. */
    const seg_t *fav[2 * KVS_MAX_REPLICAS + 2];
    uint32_t nfav = 0;
    if (req->preferred_segment.len)
        fav[nfav++] = seg_by_name(m, req->preferred_segment);
    for (uint32_t i = 0; i < req->npreferred_segments && i < KVS_MAX_REPLICAS; i++)
        fav[nfav++] = seg_by_name(m, req->preferred_segments[i]);
    for (uint32_t i = 0; g != NULL && i < g->nsegs; i++)
        fav[nfav++] = seg_by_id(m, g->seg_ids[i]);
    if (same_node)
        fav[nfav++] = batch_seg;
    while (nfav-- > 0)
        promote(out, n, fav[nfav]);
    return n;
}

static int alloc_on(kvs__master_t *m, uint64_t now_ns, seg_t *s, uint64_t size, bool may_evict,
                    mrep_t *rep)
{
    if (s->recovering)
        return KVS_NO_AVAILABLE_HANDLE; /* not all of what it holds is known yet */
    int rc = kvs__seg_alloc_alloc(s->alloc, size, &rep->offset, &rep->handle);
    if (rc == KVS_NO_AVAILABLE_HANDLE && may_evict && size <= s->size) {
        uint64_t want = KVS_MAX(size, (uint64_t)(m->cfg.evict_ratio * (double)s->size));
        if (evict_from(m, now_ns, s, want) > 0)
            rc = kvs__seg_alloc_alloc(s->alloc, size, &rep->offset, &rep->handle);
    }
    rep->seg = s;
    return rc;
}

/* Adds `s` to the response's segment table unless present; returns false on no memory. */
static bool rsp_add_seg(kvs__placement_rsp_t *rsp, uint32_t cap, const seg_t *s)
{
    for (uint32_t i = 0; i < rsp->nsegs; i++) {
        if (rsp->segs[i].id == s->id)
            return true;
    }
    if (rsp->nsegs >= cap)
        return false;
    rsp->segs[rsp->nsegs++] = (kvs__seg_info_t){
        .id = s->id,
        .name = kvs__str_c(s->name),
        .node = kvs__str_c(s->node),
        .endpoint = kvs__str_c(s->endpoint),
        .size = s->size,
        .used = kvs__seg_alloc_used(s->alloc),
    };
    return true;
}

static int placement_rsp_init(kvs__master_t *m, uint32_t n, kvs__arena_t *arena,
                              kvs__placement_rsp_t *rsp)
{
    memset(rsp, 0, sizeof(*rsp));
    rsp->nobjs = n;
    rsp->objs = kvs__arena_alloc(arena, (size_t)n * sizeof(*rsp->objs));
    rsp->segs = kvs__arena_alloc(arena, (size_t)m->nseg * sizeof(*rsp->segs));
    if (rsp->objs == NULL || rsp->segs == NULL)
        return KVS_NO_MEMORY;
    return KVS_OK;
}

static int put_start_one(kvs__master_t *m, uint64_t now_ns, uint64_t writer,
                         const kvs__put_start_req_t *req, const kvs__put_item_t *it, seg_t **cand,
                         seg_t **batch_seg, kvs__arena_t *arena, kvs__obj_desc_t *d)
{
    if (ns_key_check(it->key.ptr, it->key.len) != KVS_OK || it->size == 0)
        return KVS_INVALID_PARAMS;
    uint64_t hash = kvs__hash64(it->key.ptr, it->key.len);
    obj_t *cur = obj_find(m, it->key, hash);
    if (cur != NULL && (req->flags & KVS_PUT_FLAG_UPSERT) == 0)
        return KVS_OBJECT_ALREADY_EXISTS;
    /* An upsert replaces a complete object; one whose put or upsert is still in progress is
     * not ready for another writer yet. */
    if (cur != NULL && (cur->state != KVS_OBJ_COMPLETE || cur->next != NULL))
        return KVS_REPLICA_IS_NOT_READY;
    uint32_t want = req->replica_num;
    obj_t *o = kvs__calloc(1, sizeof(*o) + it->key.len + 1);
    mrep_t *reps = kvs__calloc(want, sizeof(*reps));
    d->reps = kvs__arena_alloc(arena, want * sizeof(*d->reps));
    group_t *g = o && reps && d->reps && it->group.len ? group_get(m, it->group) : NULL;
    if (o == NULL || reps == NULL || d->reps == NULL || (it->group.len && g == NULL)) {
        kvs__free(o);
        kvs__free(reps);
        return KVS_NO_MEMORY;
    }
    if (g != NULL)
        g->refs++; /* held while placing (eviction may take its other objects) */
    uint32_t ncand = order_candidates(m, req, g, *batch_seg, cand), got = 0;
    int last_rc = KVS_NO_AVAILABLE_HANDLE;
    /* Copies go where there is room, in the candidates' order; only when that is not enough
     * does eviction make room, again in that order (so a favoured segment that is full does
     * not lose objects while another has space). */
    for (int pass = 0; pass < 2 && got < want; pass++) {
        for (uint32_t i = 0; i < ncand && got < want; i++) {
            bool used = false;
            for (uint32_t j = 0; j < got; j++)
                used |= reps[j].seg == cand[i];
            if (used)
                continue;
            int rc = alloc_on(m, now_ns, cand[i], it->size, pass == 1, &reps[got]);
            if (rc == KVS_OK)
                got++;
            else if (rc != KVS_NO_AVAILABLE_HANDLE)
                last_rc = rc;
        }
    }
    if (got == 0) {
        kvs__free(o);
        kvs__free(reps);
        if (g != NULL) {
            g->refs--;
            group_put(m, g);
        }
        m->c.puts_no_space++;
        return last_rc;
    }
    if (g != NULL) {
        /* Where this object's copies went is where the group's next objects go. */
        for (uint32_t i = 0; i < got; i++)
            g->seg_ids[i] = reps[i].seg->id;
        g->nsegs = got;
    }
    o->group = g;
    memcpy(o->key, it->key.ptr, it->key.len);
    o->key_len = it->key.len;
    o->hash = hash;
    o->size = it->size;
    o->state = KVS_OBJ_PENDING;
    o->started_ns = now_ns;
    o->writer = writer;
    o->token = kvs__random_u64();
    o->cap_epoch = cap_epoch(m, now_ns);
    o->hard_pin = (req->flags & KVS_PUT_FLAG_HARD_PIN) != 0;
    o->pin_action = (uint8_t)req->soft_pin_action;
    o->pin_ttl_ns = ((req->flags & KVS_PUT_FLAG_PIN_TTL) ? req->soft_pin_ttl_ms
                                                         : m->cfg.default_soft_pin_ttl_ms) *
                    KVS_NS_PER_MS;
    o->reps = reps;
    o->nrep = got;
    if (cur != NULL) {
        /* The new version waits beside the current one, which readers keep seeing. The
         * placement above may have evicted it (it was complete and unleased): then the key
         * is absent and this is a plain put. */
        cur = obj_find(m, it->key, hash);
    }
    if (cur != NULL) {
        o->parent = cur;
        cur->next = o;
        m->nversions++;
        m->c.upserts_started++;
    } else {
        table_insert(m, o);
    }
    list_push_back(&m->pending, o);
    m->npending++;
    m->c.puts_started++;
    if (*batch_seg == NULL)
        *batch_seg = reps[0].seg;
    d->size = it->size;
    d->token = o->token;
    d->cap_epoch = o->cap_epoch;
    d->nreps = got;
    for (uint32_t i = 0; i < got; i++) {
        const seg_t *rs = reps[i].seg;
        uint64_t cap = rs->cap ? kvs__cap_ctx_compute(rs->cap, rs->id, reps[i].offset, it->size,
                                                      o->token, o->cap_epoch)
                               : 0;
        d->reps[i] = (kvs__replica_t){rs->id, reps[i].offset, cap};
    }
    return KVS_OK;
}

int kvs__master_put_start(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                          const kvs__put_start_req_t *req, kvs__arena_t *arena,
                          kvs__placement_rsp_t *rsp)
{
    if (m == NULL || req == NULL || arena == NULL || rsp == NULL || client_id == 0)
        return KVS_INVALID_PARAMS;
    /* Writers are known, so that their puts' limbo space can tell when they are gone. */
    if (client_rec_add(m, now_ns, client_id) == NULL)
        return KVS_NO_MEMORY;
    int rc = placement_rsp_init(m, req->nitems, arena, rsp);
    if (rc != KVS_OK)
        return rc;
    bool bad = req->replica_num == 0 || req->replica_num > KVS_MAX_REPLICAS ||
               (req->preferred_segment.len && !name_ok(req->preferred_segment)) ||
               req->soft_pin_action > PIN_DISABLE ||
               ((req->flags & KVS_PUT_FLAG_PIN_TTL) &&
                req->soft_pin_ttl_ms > m->cfg.max_soft_pin_ttl_ms) ||
               (req->flags & ~KVS_PUT_FLAGS_ALL_) != 0;
    for (uint32_t i = 0; i < req->npreferred_segments; i++)
        bad |= !name_ok(req->preferred_segments[i]);
    seg_t **cand = kvs__arena_alloc(arena, (size_t)m->nseg * sizeof(*cand));
    if (cand == NULL)
        return KVS_NO_MEMORY;
    seg_t *batch_seg = NULL;
    for (uint32_t i = 0; i < req->nitems; i++) {
        kvs__obj_desc_t *d = &rsp->objs[i];
        d->status = bad ? KVS_INVALID_PARAMS
                        : put_start_one(m, now_ns, client_id, req, &req->items[i], cand, &batch_seg,
                                        arena, d);
    }
    /* Eviction after the whole batch: the batch's own objects are pending and never evicted,
     * and the segment table then reports the state the writer will find. */
    for (uint32_t i = 0; i < m->nseg; i++)
        evict_if_high(m, now_ns, m->segs[i]);
    for (uint32_t i = 0; i < req->nitems; i++) {
        for (uint32_t j = 0; j < rsp->objs[i].nreps; j++)
            rsp_add_seg(rsp, m->nseg, seg_by_id(m, rsp->objs[i].reps[j].segment_id));
    }
    rsp->status = bad ? KVS_INVALID_PARAMS : KVS_OK;
    return KVS_OK;
}

/* ---- per-key operations ----------------------------------------------------------------- */

static int status_rsp_init(uint32_t n, kvs__arena_t *arena, kvs__status_list_rsp_t *rsp)
{
    memset(rsp, 0, sizeof(*rsp));
    rsp->nresults = n;
    rsp->results = kvs__arena_alloc(arena, (size_t)n * sizeof(*rsp->results));
    return rsp->results ? KVS_OK : KVS_NO_MEMORY;
}

/* Looks a key up after validating it; writes a status for the failures. */
static obj_t *key_lookup(kvs__master_t *m, kvs__str_t key, int *rc_p)
{
    if (ns_key_check(key.ptr, key.len) != KVS_OK) {
        *rc_p = KVS_INVALID_PARAMS;
        return NULL;
    }
    obj_t *o = obj_find(m, key, kvs__hash64(key.ptr, key.len));
    *rc_p = o ? KVS_OK : KVS_OBJECT_NOT_FOUND;
    return o;
}

/* What a per-key operation knows of its request. */
typedef struct {
    uint64_t now_ns;
    uint32_t flags;
    uint64_t client_id; /* the connection's */
    uint64_t token;     /* PUT_END/PUT_REVOKE: the put the key's entry names (0: any) */
    kvs__str_t segment; /* REPLICA_CLEAR: the segment (empty: every replica) */
} key_ctx_t;

typedef int (*key_op_fn)(kvs__master_t *m, const key_ctx_t *k, obj_t *o);

static int for_each_key(kvs__master_t *m, key_ctx_t *ctx, const kvs__keys_req_t *req,
                        kvs__arena_t *arena, kvs__status_list_rsp_t *rsp, key_op_fn fn)
{
    if (m == NULL || req == NULL || arena == NULL || rsp == NULL ||
        (req->ntokens != 0 && req->ntokens != req->nkeys))
        return KVS_INVALID_PARAMS;
    int rc = status_rsp_init(req->nkeys, arena, rsp);
    if (rc != KVS_OK)
        return rc;
    for (uint32_t i = 0; i < req->nkeys; i++) {
        ctx->token = req->ntokens ? req->tokens[i].token : 0;
        obj_t *o = key_lookup(m, req->keys[i], &rc);
        rsp->results[i] = o ? fn(m, ctx, o) : rc;
    }
    return KVS_OK;
}

/* Whether the request names this very put: its writer, and its token when one is given. */
static bool is_the_put(const key_ctx_t *k, const obj_t *o)
{
    return o->state == KVS_OBJ_PENDING && o->writer == k->client_id &&
           (k->token == 0 || k->token == o->token);
}

/* The put a PUT_END or PUT_REVOKE names: the key's object, or the upsert waiting beside it. */
static obj_t *the_put(const key_ctx_t *k, obj_t *o)
{
    if (o->next != NULL && is_the_put(k, o->next))
        return o->next;
    return is_the_put(k, o) ? o : NULL;
}

static int op_put_end(kvs__master_t *m, const key_ctx_t *k, obj_t *o)
{
    obj_t *cur = NULL;
    if (o->next != NULL && is_the_put(k, o->next)) {
        cur = o;
        o = o->next;
    }
    if (!is_the_put(k, o))
        return KVS_INVALID_WRITE;
    /* The put is over: its owners fence its token, so its writer's capabilities stop working
     * (a write after the end would change a committed object, or later another's). A fence
     * issued before a failure here is harmless: the writer is done writing. */
    for (uint32_t i = 0; i < o->nrep; i++) {
        if ((o->reps[i].end_fence = fence_issue(o->reps[i].seg, o->token, o->cap_epoch)) == 0)
            return KVS_NO_MEMORY;
    }
    /* The pin the put asked for, from the version it replaces when it keeps the pin. */
    uint64_t keep = cur != NULL ? cur->soft_pin_until_ns : 0;
    o->soft_pin_until_ns = o->pin_action == PIN_ENABLE
                               ? (o->pin_ttl_ns ? k->now_ns + o->pin_ttl_ns : 0)
                           : o->pin_action == PIN_DISABLE ? 0
                                                          : keep;
    o->hard_pin |= cur != NULL && cur->hard_pin;
    if (cur != NULL) {
        /* The swap: the old version retires (tombstoned while readers hold leases, so they
         * keep reading its bytes), and the new one takes its place, all in this one step. */
        int rc = obj_retire(m, k->now_ns, cur, false);
        if (rc != KVS_OK)
            return rc; /* nothing changed: the fences issued name a put that is over anyway */
        table_insert(m, o);
        m->nversions--;
        m->c.upserts_ended++;
    }
    list_unlink(o);
    o->state = KVS_OBJ_COMPLETE;
    /* Versions of one term stay below the next term's (a term's 2^32nd completion and later
     * tie, and a tie keeps the copy recovered first). */
    if (m->completions < UINT32_MAX)
        m->completions++;
    o->version = m->cfg.version_base + m->completions;
    o->unindexed = 0;
    for (uint32_t i = 0; i < o->nrep; i++)
        o->unindexed += idx_push(m, o->reps[i].seg, KVS_INDEX_ADD, o, o->reps[i].offset) != 0;
    m->npending--;
    list_push_front(&m->lru, o);
    m->c.puts_ended++;
    return KVS_OK;
}

static int op_put_revoke(kvs__master_t *m, const key_ctx_t *k, obj_t *o)
{
    o = the_put(k, o);
    if (o == NULL)
        return KVS_INVALID_WRITE;
    int rc = obj_retire(m, k->now_ns, o, true); /* the writer itself, after its transfers */
    if (rc == KVS_OK)
        m->c.puts_revoked++;
    return rc;
}

static int op_exists(kvs__master_t *m, const key_ctx_t *k, obj_t *o)
{
    KVS_UNUSED(m);
    KVS_UNUSED(k);
    return o->state == KVS_OBJ_COMPLETE && o->unindexed == 0 ? 1 : 0;
}

static int op_remove(kvs__master_t *m, const key_ctx_t *k, obj_t *o)
{
    bool force = (k->flags & KVS_KEYS_FLAG_FORCE) != 0;
    if (!force && o->state == KVS_OBJ_PENDING)
        return KVS_REPLICA_IS_NOT_READY;
    if (!force && obj_leased(o, k->now_ns))
        return KVS_OBJECT_HAS_LEASE;
    int rc = obj_retire(m, k->now_ns, o, false);
    if (rc == KVS_OK)
        m->c.removes++;
    return rc;
}

/* Mooncake's replica clear: only the writer's own objects, complete and unleased. */
static int op_replica_clear(kvs__master_t *m, const key_ctx_t *k, obj_t *o)
{
    if (o->writer != k->client_id)
        return KVS_INVALID_PARAMS;
    if (o->state != KVS_OBJ_COMPLETE || o->next != NULL || o->unindexed > 0)
        return KVS_REPLICA_IS_NOT_READY;
    if (obj_leased(o, k->now_ns))
        return KVS_OBJECT_HAS_LEASE;
    if (k->segment.len == 0) {
        m->c.replicas_cleared += o->nrep;
        obj_destroy(m, o); /* unleased: no reader may rely on its bytes any more */
        return KVS_OK;
    }
    uint32_t kept = 0;
    for (uint32_t i = 0; i < o->nrep; i++) {
        if (kvs__str_eq(kvs__str_c(o->reps[i].seg->name), k->segment))
            rep_release(m, &o->reps[i], idx_push(m, o->reps[i].seg, KVS_INDEX_DEL, o, 0));
        else
            o->reps[kept++] = o->reps[i];
    }
    if (kept == o->nrep)
        return KVS_SEGMENT_NOT_FOUND;
    m->c.replicas_cleared += o->nrep - kept;
    o->nrep = kept;
    if (kept == 0)
        obj_destroy(m, o);
    return KVS_OK;
}

int kvs__master_replica_clear(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                              const kvs__keys_req_t *req, kvs__arena_t *arena,
                              kvs__status_list_rsp_t *rsp)
{
    if (req != NULL && req->segment.len > 0 && !name_ok(req->segment))
        return KVS_INVALID_PARAMS;
    key_ctx_t k = {.now_ns = now_ns,
                   .flags = req ? req->flags : 0,
                   .client_id = client_id,
                   .segment = req ? req->segment : (kvs__str_t){0}};
    return for_each_key(m, &k, req, arena, rsp, op_replica_clear);
}

/* PUT_END or PUT_REVOKE by the writer `client_id`: the op per key, after which the writer is
 * known to be done with those keys (it ends or revokes them only after its transfers). */
static int writer_keys(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                       const kvs__keys_req_t *req, kvs__arena_t *arena, kvs__status_list_rsp_t *rsp,
                       key_op_fn fn)
{
    key_ctx_t k = {.now_ns = now_ns, .flags = req ? req->flags : 0, .client_id = client_id};
    int rc = for_each_key(m, &k, req, arena, rsp, fn);
    for (uint32_t i = 0; rc == KVS_OK && m->limbo_writers > 0 && i < req->nkeys; i++)
        limbo_writer_done(m, now_ns, client_id, &req->keys[i],
                          req->ntokens ? req->tokens[i].token : 0);
    return rc;
}

int kvs__master_put_end(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__keys_req_t *req, kvs__arena_t *arena,
                        kvs__status_list_rsp_t *rsp)
{
    return writer_keys(m, now_ns, client_id, req, arena, rsp, op_put_end);
}

int kvs__master_put_revoke(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                           const kvs__keys_req_t *req, kvs__arena_t *arena,
                           kvs__status_list_rsp_t *rsp)
{
    return writer_keys(m, now_ns, client_id, req, arena, rsp, op_put_revoke);
}

/* The live lease `lease_id` of `client_id` among rd[0..n), or NULL. Grants are in id order,
 * the newest just below `next` (the object's lease_next): a binary search on each id's age
 * (next - id, which wraps like the ids). An id from before the object, or of another one, has
 * no such age here. */
static reader_t *reader_find(reader_t *rd, uint32_t n, uint64_t next, uint64_t client_id,
                             uint64_t lease_id)
{
    uint64_t age = next - lease_id;
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint64_t a = next - rd[mid].lease_id;
        if (a == age)
            return rd[mid].client_id == client_id && rd[mid].until_ns != 0 ? &rd[mid] : NULL;
        if (a > age) /* rd[mid] is older */
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Drops the lease `lease_id` of `client_id` from the tombstone of key hash `hash` holding it
 * (a version removed or replaced since); true when that tombstone's space may now be free
 * sooner (its last lease left, or its latest one gone). Only the key's tombstones are looked
 * at, each by a binary search: a stray release (of a lease that ended, or of none) costs the
 * chain of its hash, not a walk of every tombstone. */
static bool tomb_release(kvs__master_t *m, uint64_t now_ns, uint64_t client_id, uint64_t hash,
                         uint64_t lease_id)
{
    for (tomb_t *t = m->tombs[hash & (m->ntomb_buckets - 1)]; t != NULL; t = t->hnext) {
        reader_t *r = t->hash == hash && t->live > 0
                          ? reader_find(t->readers, t->nreaders, t->lease_next, client_id, lease_id)
                          : NULL;
        if (r == NULL)
            continue;
        uint64_t was = r->until_ns;
        r->until_ns = 0;
        t->live--;
        m->c.lease_releases++;
        while (t->nreaders > 0 && t->readers[t->nreaders - 1].until_ns == 0)
            t->nreaders--;
        /* The latest end left. until_ns bounds every remaining lease that has not ended: none
         * is left when it has passed or no reader is; it is unchanged unless this lease held
         * it; else the others are looked at. */
        uint64_t until = t->until_ns;
        if (t->live == 0 || t->until_ns <= now_ns) {
            until = 0;
        } else if (was >= t->until_ns) {
            until = 0;
            for (uint32_t k = 0; k < t->nreaders; k++) {
                if (t->readers[k].until_ns > now_ns)
                    until = KVS_MAX(until, t->readers[k].until_ns);
            }
        }
        bool sooner = until < t->until_ns;
        t->until_ns = until;
        return sooner;
    }
    return false;
}

int kvs__master_release(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__lease_release_t *rel, uint32_t n)
{
    if (m == NULL || (rel == NULL && n > 0))
        return KVS_INVALID_PARAMS;
    bool swept = false;
    for (uint32_t i = 0; i < n; i++) {
        if (ns_key_check(rel[i].key.ptr, rel[i].key.len) != KVS_OK)
            continue;
        uint64_t hash = kvs__hash64(rel[i].key.ptr, rel[i].key.len);
        obj_t *o = obj_find(m, rel[i].key, hash);
        /* Only the grant the release names, and only the client's own. It is marked released
         * in place (the order stays); trailing released ones go at once, the rest at the next
         * obj_lease_end. lease_until_ns stays an upper bound until then. */
        reader_t *r =
            o != NULL && o->lease_next != 0 && rel[i].lease_id != 0
                ? reader_find(o->readers, o->nreaders, o->lease_next, client_id, rel[i].lease_id)
                : NULL;
        bool found = r != NULL;
        if (found) {
            r->until_ns = 0;
            m->c.lease_releases++;
            while (o->nreaders > 0 && o->readers[o->nreaders - 1].until_ns == 0)
                o->nreaders--;
        }
        /* Not on the key's object: a lease on a version removed or replaced since, whose
         * tombstone may end with it. */
        if (!found && m->ntombs > 0)
            swept |= tomb_release(m, now_ns, client_id, hash, rel[i].lease_id);
    }
    if (swept)
        limbo_sweep(m, now_ns, false);
    return KVS_OK;
}

int kvs__master_remove(kvs__master_t *m, uint64_t now_ns, const kvs__keys_req_t *req,
                       kvs__arena_t *arena, kvs__status_list_rsp_t *rsp)
{
    key_ctx_t k = {.now_ns = now_ns, .flags = req ? req->flags : 0};
    return for_each_key(m, &k, req, arena, rsp, op_remove);
}

int kvs__master_exists(kvs__master_t *m, uint64_t now_ns, const kvs__keys_req_t *req,
                       kvs__arena_t *arena, kvs__status_list_rsp_t *rsp)
{
    key_ctx_t k = {.now_ns = now_ns, .flags = req ? req->flags : 0};
    int rc = for_each_key(m, &k, req, arena, rsp, op_exists);
    /* A missing object is an answer (0), not an error. */
    for (uint32_t i = 0; rc == KVS_OK && i < rsp->nresults; i++) {
        if (rsp->results[i] == KVS_OBJECT_NOT_FOUND)
            rsp->results[i] = 0;
    }
    return rc;
}

int kvs__master_lookup(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                       const kvs__keys_req_t *req, kvs__arena_t *arena, kvs__placement_rsp_t *rsp)
{
    if (m == NULL || req == NULL || arena == NULL || rsp == NULL)
        return KVS_INVALID_PARAMS;
    int rc = placement_rsp_init(m, req->nkeys, arena, rsp);
    if (rc != KVS_OK)
        return rc;
    uint64_t lease_ns = m->cfg.lease_ms * KVS_NS_PER_MS;
    for (uint32_t i = 0; i < req->nkeys; i++) {
        kvs__obj_desc_t *d = &rsp->objs[i];
        m->c.lookups++;
        obj_t *o = key_lookup(m, req->keys[i], &d->status);
        if (o == NULL)
            continue;
        if (o->state != KVS_OBJ_COMPLETE || o->unindexed > 0) {
            d->status = KVS_REPLICA_IS_NOT_READY;
            continue;
        }
        d->reps = kvs__arena_alloc(arena, o->nrep * sizeof(*d->reps));
        if (d->reps == NULL)
            return KVS_NO_MEMORY;
        d->lease_id = obj_lease(m, o, client_id, now_ns, now_ns + lease_ns);
        if (d->lease_id == 0) {
            d->status = KVS_NO_MEMORY;
            continue;
        }
        m->c.lookup_hits++;
        m->c.leases_granted++;
        list_unlink(o);
        list_push_front(&m->lru, o);
        d->size = o->size;
        d->lease_ms = lease_ns / KVS_NS_PER_MS;
        d->nreps = o->nrep;
        for (uint32_t j = 0; j < o->nrep; j++) {
            d->reps[j] = (kvs__replica_t){o->reps[j].seg->id, o->reps[j].offset, 0};
            rsp_add_seg(rsp, m->nseg, o->reps[j].seg);
        }
    }
    return KVS_OK;
}

/* ---- listing and statistics ------------------------------------------------------------- */

#define LIST_DEFAULT_LIMIT 1000u
/* Cursor: bucket << LIST_CURSOR_POS_BITS | entries of that bucket already listed. */
#define LIST_CURSOR_POS_BITS 24
/* Room for entries in a LIST reply: a frame less the reply's fixed fields. */
#define LIST_MAX_BYTES (KVS_FRAME_MAX_PAYLOAD - KVS__MIN_BYTES_list_rsp)

static bool default_prefix_ok(kvs__str_t prefix, const obj_t *o)
{
    return (prefix.len > 0 && memchr(prefix.ptr, '\0', prefix.len) != NULL) ||
           memchr(o->key, '\0', o->key_len) == NULL;
}

/* ---- recovery (HA) ------------------------------------------------------------------------ */

/* Space a new leader keeps unused until `until_ns`: a reader of the old leader may still read
 * what lay there. NO_MEMORY: the caller frees nothing (the space stays taken for good). */
static int limbo_hold(kvs__master_t *m, seg_t *sg, uint32_t handle, uint64_t until_ns)
{
    limbo_t *l = kvs__calloc(1, sizeof(*l));
    if (l == NULL)
        return KVS_NO_MEMORY;
    l->seg = sg;
    l->handle = handle;
    l->until_ns = until_ns;
    l->writer_done = true;
    l->next = m->limbo;
    m->limbo = l;
    return KVS_OK;
}

/* One object of a RECOVER: see kvs__master_recover. */
static int recover_one(kvs__master_t *m, uint64_t now_ns, seg_t *sg, const kvs__index_op_t *e)
{
    if (e->op != KVS_INDEX_ADD || e->size == 0 || e->token == 0 ||
        ns_key_check(e->key.ptr, e->key.len) != KVS_OK)
        return KVS_INVALID_PARAMS;
    uint32_t handle;
    int rc = kvs__seg_alloc_claim(sg->alloc, e->offset, e->size, &handle);
    if (rc != KVS_OK)
        return rc;
    uint64_t until = now_ns + m->cfg.lease_ms * KVS_NS_PER_MS;
    uint64_t hash = kvs__hash64(e->key.ptr, e->key.len);
    obj_t *o = obj_find(m, e->key, hash);
    if (o != NULL && o->state == KVS_OBJ_COMPLETE && o->token == e->token && o->size == e->size &&
        !obj_on_seg(o, sg) && o->nrep < KVS_MAX_REPLICAS) {
        mrep_t *r = kvs__realloc(o->reps, (o->nrep + 1) * sizeof(*r));
        if (r == NULL) {
            kvs__seg_alloc_free(sg->alloc, handle);
            return KVS_NO_MEMORY;
        }
        o->reps = r;
        o->reps[o->nrep++] = (mrep_t){sg, e->offset, handle, 0};
        return KVS_OK;
    }
    if (o != NULL &&
        (o->state != KVS_OBJ_COMPLETE || o->version >= e->version || o->token == e->token)) {
        /* A newer version (or a put since the failover, or a duplicate): this copy is stale. */
        if (limbo_hold(m, sg, handle, until) != KVS_OK)
            kvs__seg_alloc_free(sg->alloc, handle); /* no reader could be told it anyway */
        return KVS_OBJECT_ALREADY_EXISTS;
    }
    obj_t *n = kvs__calloc(1, sizeof(*n) + e->key.len + 1);
    mrep_t *reps = kvs__calloc(1, sizeof(*reps));
    if (n == NULL || reps == NULL || obj_lease(m, n, 0, now_ns, until) == 0) {
        if (n != NULL)
            kvs__free(n->readers);
        kvs__free(n);
        kvs__free(reps);
        kvs__seg_alloc_free(sg->alloc, handle);
        return KVS_NO_MEMORY;
    }
    if (o != NULL && obj_retire(m, now_ns, o, false) != KVS_OK) {
        /* An older version stays; this one cannot replace it now. */
        kvs__free(n->readers);
        kvs__free(n);
        kvs__free(reps);
        kvs__seg_alloc_free(sg->alloc, handle);
        return KVS_NO_MEMORY;
    }
    reps[0] = (mrep_t){sg, e->offset, handle, 0};
    memcpy(n->key, e->key.ptr, e->key.len);
    n->key_len = e->key.len;
    n->hash = hash;
    n->size = e->size;
    n->state = KVS_OBJ_COMPLETE;
    n->started_ns = now_ns;
    n->writer = e->writer;
    n->token = e->token;
    n->version = e->version;
    n->cap_epoch = cap_epoch(m, now_ns);
    n->hard_pin = (e->flags & KVS_INDEX_FLAG_HARD_PIN) != 0;
    n->reps = reps;
    n->nrep = 1;
    table_insert(m, n);
    list_push_front(&m->lru, n);
    return KVS_OK;
}

int kvs__master_recover(kvs__master_t *m, uint64_t now_ns, uint64_t client_id,
                        const kvs__recover_req_t *req, kvs__arena_t *arena,
                        kvs__status_list_rsp_t *rsp)
{
    if (m == NULL || req == NULL || arena == NULL || rsp == NULL)
        return KVS_INVALID_PARAMS;
    int rc = status_rsp_init(req->nobjects, arena, rsp);
    if (rc != KVS_OK)
        return rc;
    seg_t *sg = seg_by_id(m, req->segment_id);
    if (sg == NULL || sg->client_id != client_id || !sg->recovering) {
        /* Only the owner that re-registered the segment, and only until its last page. */
        rsp->status = KVS_SEGMENT_NOT_FOUND;
        rsp->nresults = 0;
        return KVS_OK;
    }
    for (uint32_t i = 0; i < req->nobjects; i++) {
        const kvs__index_op_t *e = &req->objects[i];
        rsp->results[i] = recover_one(m, now_ns, sg, e);
        if (rsp->results[i] == KVS_OK) {
            m->c.objects_recovered++;
            /* The new leader's index entry: this owner already has it (under its token). */
        } else {
            m->c.objects_recover_refused++;
        }
    }
    if (req->last)
        sg->recovering = false; /* all it holds is known: its free space is free */
    return KVS_OK;
}

int kvs__master_list(kvs__master_t *m, const kvs__list_req_t *req, kvs__arena_t *arena,
                     kvs__list_rsp_t *rsp)
{
    if (m == NULL || req == NULL || arena == NULL || rsp == NULL)
        return KVS_INVALID_PARAMS;
    uint32_t limit = req->limit ? KVS_MIN(req->limit, KVS_MAX_BATCH) : LIST_DEFAULT_LIMIT;
    uint64_t bytes = 0;
    memset(rsp, 0, sizeof(*rsp));
    rsp->entries =
        kvs__arena_alloc(arena, (size_t)KVS_MIN(limit, m->nobjs) * sizeof(*rsp->entries));
    if (rsp->entries == NULL)
        return KVS_NO_MEMORY;
    /* The cursor names where the previous page stopped: a bucket and how many of its matching
     * entries were listed, plus one (0 is the start). A key present through the whole listing
     * (with no table growth meanwhile) is listed exactly once. */
    size_t b0 = req->cursor ? (size_t)((req->cursor - 1) >> LIST_CURSOR_POS_BITS) : 0;
    uint64_t skip = req->cursor ? (req->cursor - 1) & ((1ull << LIST_CURSOR_POS_BITS) - 1) : 0;
    for (size_t b = b0; b < m->nbuckets; b++) {
        uint64_t pos = 0; /* matching entries of this bucket seen */
        for (obj_t *o = m->buckets[b]; o != NULL; o = o->hnext) {
            if (o->key_len < req->prefix.len ||
                (req->prefix.len && memcmp(o->key, req->prefix.ptr, req->prefix.len) != 0))
                continue;
            /* A listing of the default tenant (a prefix without a namespace) skips the keys of
             * named tenants, which hold a NUL byte. */
            if (!default_prefix_ok(req->prefix, o))
                continue;
            if (b == b0 && pos < skip) {
                pos++;
                continue;
            }
            /* Entries stop at the limit or where the reply would outgrow a frame. */
            bytes += KVS__MIN_BYTES_list_entry + o->key_len;
            if (rsp->nentries == limit || bytes > LIST_MAX_BYTES ||
                pos + 1 >= (1ull << LIST_CURSOR_POS_BITS)) {
                rsp->truncated = 1;
                rsp->next_cursor = (((uint64_t)b << LIST_CURSOR_POS_BITS) | pos) + 1;
                return KVS_OK;
            }
            rsp->entries[rsp->nentries++] = (kvs__list_entry_t){
                .key = {o->key, o->key_len}, .size = o->size, .state = o->state, .nrep = o->nrep};
            pos++;
        }
    }
    return KVS_OK;
}

static const kvs__metric_desc_t master_metrics[] = {
#define DESC_(kind, unit, name, family, help)                                                      \
    {KVS_METRIC_##kind, KVS_UNIT_##unit, #name, #family, "", help},
    KVS_MASTER_METRICS(DESC_)
#undef DESC_
};

const kvs__metric_desc_t *kvs__master_metrics_table(size_t *n_p)
{
    *n_p = KVS_ARRAY_SIZE(master_metrics);
    return master_metrics;
}

int kvs__master_stat(kvs__master_t *m, uint64_t now_ns, kvs__arena_t *arena, kvs__stat_rsp_t *rsp)
{
    if (m == NULL || arena == NULL || rsp == NULL)
        return KVS_INVALID_PARAMS;
    KVS_UNUSED(now_ns);
    memset(rsp, 0, sizeof(*rsp));
    rsp->counters =
        kvs__arena_alloc(arena, KVS_ARRAY_SIZE(master_metrics) * sizeof(*rsp->counters));
    rsp->segs = kvs__arena_alloc(arena, (size_t)m->nseg * sizeof(*rsp->segs));
    if (rsp->counters == NULL || rsp->segs == NULL)
        return KVS_NO_MEMORY;
    uint64_t cap = 0, used = 0;
    for (uint32_t i = 0; i < m->nseg; i++) {
        seg_t *s = m->segs[i];
        cap += s->size;
        used += kvs__seg_alloc_used(s->alloc);
        rsp->segs[rsp->nsegs++] = (kvs__seg_info_t){
            s->id,   kvs__str_c(s->name),          kvs__str_c(s->node), kvs__str_c(s->endpoint),
            s->size, kvs__seg_alloc_used(s->alloc)};
    }
    const uint64_t objects = m->nobjs - (m->npending - m->nversions), objects_pending = m->npending,
                   segments = m->nseg, capacity_bytes = cap, used_bytes = used, groups = m->ngroups;
#define VALUE_COUNTER(name) m->c.name
#define VALUE_GAUGE(name)   name
#define VALUE_(kind, unit, name, family, help)                                                     \
    rsp->counters[rsp->ncounters++] = (kvs__counter_t){kvs__str_c(#name), VALUE_##kind(name)};
    KVS_MASTER_METRICS(VALUE_)
#undef VALUE_
#undef VALUE_GAUGE
#undef VALUE_COUNTER
    return KVS_OK;
}

void kvs__master_metrics_write(const kvs__stat_rsp_t *rsp, kvs__text_t *t)
{
    kvs__metric_value_t v[KVS_ARRAY_SIZE(master_metrics)];
    size_t n = 0;
    for (size_t i = 0; i < KVS_ARRAY_SIZE(master_metrics); i++) {
        for (uint32_t j = 0; j < rsp->ncounters; j++) {
            if (kvs__str_eq(rsp->counters[j].name, kvs__str_c(master_metrics[i].name))) {
                v[n++] =
                    (kvs__metric_value_t){&master_metrics[i], NULL, rsp->counters[j].value, NULL};
                break;
            }
        }
    }
    kvs__metrics_write(t, "kvstash_master_", v, n);
    static const kvs__metric_desc_t seg_cap = {KVS_METRIC_GAUGE,
                                               KVS_UNIT_BYTES,
                                               "segment_capacity",
                                               "segment_capacity",
                                               "",
                                               "A segment's size"},
                                    seg_used = {KVS_METRIC_GAUGE,
                                                KVS_UNIT_BYTES,
                                                "segment_used",
                                                "segment_used",
                                                "",
                                                "A segment's bytes allocated to objects"};
    /* Per segment: labels of at most ~3 escaped names each. */
    enum { LABEL_LEN = 8 * KVS_MAX_NAME_LEN };
    kvs__metric_value_t *sv = kvs__calloc((size_t)rsp->nsegs * 2 + 1, sizeof(*sv));
    char *labels = kvs__malloc((size_t)rsp->nsegs * LABEL_LEN + 1);
    if (sv == NULL || labels == NULL) {
        t->failed = true;
    } else {
        for (uint32_t j = 0; j < rsp->nsegs; j++) {
            const kvs__seg_info_t *g = &rsp->segs[j];
            char rawn[KVS_MAX_NAME_LEN + 1], rawd[KVS_MAX_NAME_LEN + 1];
            char name[3 * KVS_MAX_NAME_LEN + 1], node[3 * KVS_MAX_NAME_LEN + 1];
            snprintf(rawn, sizeof(rawn), "%.*s", (int)g->name.len, g->name.ptr);
            snprintf(rawd, sizeof(rawd), "%.*s", (int)g->node.len, g->node.ptr);
            kvs__metrics_label_escape(rawn, name, sizeof(name));
            kvs__metrics_label_escape(rawd, node, sizeof(node));
            char *lb = labels + (size_t)j * LABEL_LEN;
            snprintf(lb, LABEL_LEN, "segment=\"%s\",node=\"%s\",id=\"%llu\"", name, node,
                     (unsigned long long)g->id);
            sv[2 * j] = (kvs__metric_value_t){&seg_cap, lb, g->size, NULL};
            sv[2 * j + 1] = (kvs__metric_value_t){&seg_used, lb, g->used, NULL};
        }
        kvs__metrics_write(t, "kvstash_master_", sv, (size_t)rsp->nsegs * 2);
    }
    kvs__free(labels);
    kvs__free(sv);
}

uint32_t kvs__master_take_marks(kvs__master_t *m, kvs__index_mark_t *out, uint32_t cap, bool *all_p)
{
    uint32_t n = KVS_MIN(m->nmarks, cap);
    if (out != NULL)
        memcpy(out, m->marks, n * sizeof(*out));
    if (all_p != NULL)
        *all_p = m->marks_overflow || n < m->nmarks;
    m->nmarks = 0;
    m->marks_overflow = false;
    return n;
}

bool kvs__master_mark_acked(kvs__master_t *m, const kvs__index_mark_t *mk)
{
    seg_t *s = seg_by_id(m, mk->segment_id);
    return s == NULL || s->idx_acked >= mk->seq;
}

bool kvs__master_segments_synced(kvs__master_t *m)
{
    for (uint32_t i = 0; i < m->nseg; i++)
        if (m->segs[i]->idx_acked < m->segs[i]->idx_seq)
            return false;
    return true;
}

bool kvs__master_heartbeat_due(kvs__master_t *m, uint64_t client_id)
{
    for (uint32_t i = 0; i < m->nseg; i++) {
        const seg_t *s = m->segs[i];
        if (s->client_id == client_id && (s->nidx > 0 || s->nfences > 0))
            return true;
    }
    return false;
}

uint64_t kvs__master_counter(kvs__master_t *m, const char *name)
{
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__stat_rsp_t rsp;
    uint64_t v = UINT64_MAX;
    if (kvs__master_stat(m, 0, &arena, &rsp) == KVS_OK) {
        for (uint32_t i = 0; i < rsp.ncounters; i++) {
            if (kvs__str_eq(rsp.counters[i].name, kvs__str_c(name)))
                v = rsp.counters[i].value;
        }
    }
    kvs__arena_free(&arena);
    return v;
}

/* ---- time-driven work ------------------------------------------------------------------- */

/* The master's clock already skipped the pause, so no silence was counted during it. The
 * grace covers the owners' retries after it (their requests during the pause failed or wait
 * unread): each owner is given at least PAUSE_GRACE_MS before it can expire — once per heartbeat
 * it sends, so that pauses that keep coming cannot keep a dead owner mounted. */
#define PAUSE_GRACE_MS 2000u

void kvs__master_resumed(kvs__master_t *m, uint64_t now_ns)
{
    uint64_t hb_ns = m->cfg.heartbeat_timeout_ms * KVS_NS_PER_MS;
    uint64_t grace_ns = KVS_MIN((uint64_t)PAUSE_GRACE_MS * KVS_NS_PER_MS, hb_ns);
    for (uint32_t i = 0; i < m->nseg; i++) {
        seg_t *s = m->segs[i];
        /* Expiry comes at last_heartbeat + hb: push it to at least now + grace. */
        if (s->graced || now_ns + grace_ns < hb_ns)
            continue;
        uint64_t floor = now_ns + grace_ns - hb_ns;
        if (s->last_heartbeat_ns < floor) {
            s->last_heartbeat_ns = floor;
            s->graced = true;
        }
    }
}

void kvs__master_tick(kvs__master_t *m, uint64_t now_ns)
{
    limbo_sweep(m, now_ns, false);
    clients_prune(m, now_ns);
    uint64_t discard_ns = m->cfg.put_discard_ms * KVS_NS_PER_MS;
    while (m->pending.next != &m->pending &&
           link_obj(m->pending.next)->started_ns + discard_ns <= now_ns) {
        obj_t *o = link_obj(m->pending.next);
        kvs_warn("discarding put of '%.*s': not ended within %llu ms", (int)o->key_len, o->key,
                 (unsigned long long)m->cfg.put_discard_ms);
        if (obj_retire(m, now_ns, o, false) != KVS_OK)
            break; /* out of memory: the next tick tries again */
        m->c.puts_discarded++;
    }
    uint64_t hb_ns = m->cfg.heartbeat_timeout_ms * KVS_NS_PER_MS;
    for (uint32_t i = 0; i < m->nseg;) {
        seg_t *s = m->segs[i];
        if (s->last_heartbeat_ns + hb_ns <= now_ns) {
            kvs_warn("segment %llu '%s' dropped: owner silent for %llu ms",
                     (unsigned long long)s->id, s->name,
                     (unsigned long long)((now_ns - s->last_heartbeat_ns) / KVS_NS_PER_MS));
            seg_remove(m, s); /* moves the last segment into slot i */
            m->c.segments_expired++;
        } else {
            i++;
        }
    }
}
