/* An owner: a segment, its data server, its mount at the master and the heartbeat that keeps
 * it there. */
#define _GNU_SOURCE
#include "owner_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One complete object of the segment, as the master told us (HA): enough for a new leader to
 * serve it again. Chained by token. */
typedef struct ientry {
    struct ientry *next;
    uint64_t token, offset, size, writer, version;
    uint32_t flags;
    uint32_t key_len;
    char key[];
} ientry_t;

typedef struct {
    ientry_t **buckets;
    size_t nbuckets, n; /* nbuckets: a power of two, or 0 */
} index_t;

struct kvs__owner {
    kvs__owner_config_t cfg;
    char name[KVS_MAX_NAME_LEN + 1];
    char endpoint[KVS_MAX_NAME_LEN + 1];
    kvs__segment_mem_t mem;
    kvs__data_server_t *data;
    kvs__rpc_t *rpc;
    _Atomic uint64_t segment_id; /* read by other threads (kvs__owner_segment_id) */
    uint64_t incarnation;        /* of the master that mounted segment_id */
    uint64_t fence_applied;      /* every fence of the segment up to this one is applied */
    bool news;                   /* the last heartbeat brought fences or index changes */
    bool follows;                /* HA: the master is whoever leads in etcd */
    uint64_t term;               /* the highest leader term registered under (HA) */
    uint64_t index_applied;      /* every index change up to this one is applied */
    index_t index;               /* guarded by index_lock (read by kvs__owner_index_size) */
    pthread_mutex_t index_lock;
    _Atomic uint64_t recovered;
    pthread_t hb_thread;
    bool hb_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
};

/* One request/response with the master; the response payload is left in `rsp`. */
static int owner_call(kvs__owner_t *o, kvs__wbuf_t *req, kvs__wbuf_t *rsp)
{
    int rc = kvs__frame_end(req);
    return rc == KVS_OK ? kvs__rpc_call(o->rpc, req, rsp) : rc;
}

/* One MOUNT of our segment under a fresh write key (`key`, made here): `segment_id` 0 for a new
 * mount, else the id a re-registration keeps. *mr_p gets the reply. The request is wiped (it
 * carried the key). */
static int owner_mount_call(kvs__owner_t *o, uint64_t segment_id, uint8_t key[KVS_WRITE_KEY_LEN],
                            kvs__mount_rsp_t *mr_p)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(o->rpc, &req, KVS_MSG_MOUNT);
    /* A key per mount, told only to the master: writes then need its capabilities. */
    kvs__write_key_new(key);
    kvs__mount_req_t m = {.name = kvs__str_c(o->name),
                          .node = kvs__str_c(kvs__rpc_node(o->rpc)),
                          .endpoint = kvs__str_c(o->endpoint),
                          .size = o->mem.size,
                          .write_key = {key, KVS_WRITE_KEY_LEN},
                          .segment_id = segment_id};
    kvs__mount_req_encode(&req, &m);
    int rc = owner_call(o, &req, &rsp);
    if (rc == KVS_OK)
        rc = kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, mr_p);
    if (rc == KVS_OK)
        rc = mr_p->status;
    kvs__secret_wipe(req.data, req.len);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return rc;
}

/* ---- the index (HA) ---------------------------------------------------------------------- */

static size_t index_slot(const index_t *x, uint64_t token)
{
    return (size_t)(kvs__hash64(&token, sizeof(token)) & (x->nbuckets - 1));
}

static void index_clear(index_t *x)
{
    for (size_t b = 0; b < x->nbuckets; b++) {
        for (ientry_t *e = x->buckets[b], *next; e != NULL; e = next) {
            next = e->next;
            kvs__free(e);
        }
    }
    kvs__free(x->buckets);
    *x = (index_t){NULL, 0, 0};
}

static void index_del(index_t *x, uint64_t token)
{
    if (x->nbuckets == 0)
        return;
    for (ientry_t **p = &x->buckets[index_slot(x, token)]; *p != NULL; p = &(*p)->next) {
        if ((*p)->token == token) {
            ientry_t *e = *p;
            *p = e->next;
            kvs__free(e);
            x->n--;
            return;
        }
    }
}

static int index_add(index_t *x, const kvs__index_op_t *op)
{
    if (x->n >= x->nbuckets) {
        size_t nb = x->nbuckets ? 2 * x->nbuckets : 1024;
        ientry_t **b = kvs__calloc(nb, sizeof(*b));
        if (b == NULL)
            return KVS_NO_MEMORY;
        index_t y = {b, nb, x->n};
        for (size_t i = 0; i < x->nbuckets; i++) {
            for (ientry_t *e = x->buckets[i], *next; e != NULL; e = next) {
                next = e->next;
                size_t k = index_slot(&y, e->token);
                e->next = b[k];
                b[k] = e;
            }
        }
        kvs__free(x->buckets);
        *x = y;
    }
    index_del(x, op->token);
    ientry_t *e = kvs__malloc(sizeof(*e) + op->key.len);
    if (e == NULL)
        return KVS_NO_MEMORY;
    *e = (ientry_t){NULL,       op->token,   op->offset, op->size,
                    op->writer, op->version, op->flags,  (uint32_t)op->key.len};
    memcpy(e->key, op->key.ptr, op->key.len);
    size_t k = index_slot(x, op->token);
    e->next = x->buckets[k];
    x->buckets[k] = e;
    x->n++;
    return KVS_OK;
}

/* Applies a HEARTBEAT reply's index changes that are new for our segment, in order. An entry
 * that cannot be added (no memory) is lost to a failover, not wrong: logged. */
static void owner_apply_index(kvs__owner_t *o, const kvs__heartbeat_rsp_t *hr, bool *applied_p)
{
    pthread_mutex_lock(&o->index_lock);
    for (uint32_t i = 0; i < hr->nindex; i++) {
        const kvs__index_op_t *op = &hr->index[i];
        if (op->segment_id != o->segment_id || op->seq <= o->index_applied)
            continue;
        if (op->op == KVS_INDEX_ADD && index_add(&o->index, op) != KVS_OK)
            kvs_warn("segment %llu: out of memory for the index; an object will not survive a "
                     "failover",
                     (unsigned long long)o->segment_id);
        else if (op->op == KVS_INDEX_DEL)
            index_del(&o->index, op->token);
        o->index_applied = op->seq;
        *applied_p = true;
    }
    pthread_mutex_unlock(&o->index_lock);
}

static int cmp_entry_offset(const void *a, const void *b)
{
    const ientry_t *x = *(ientry_t *const *)a, *y = *(ientry_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Gives a new leader the index, in pages, in ascending order of offset (the master claims
 * each range; ascending claims are O(1)). Entries it refuses leave the index: their space is
 * the master's again. */
static int owner_recover(kvs__owner_t *o)
{
    pthread_mutex_lock(&o->index_lock);
    size_t n = o->index.n;
    ientry_t **all = kvs__malloc(KVS_MAX(n, 1) * sizeof(*all));
    kvs__index_op_t *ops = kvs__malloc(KVS_MAX_INDEX_OPS * sizeof(*ops));
    int rc = all && ops ? KVS_OK : KVS_NO_MEMORY;
    size_t k = 0;
    for (size_t b = 0; rc == KVS_OK && b < o->index.nbuckets; b++)
        for (ientry_t *e = o->index.buckets[b]; e != NULL; e = e->next)
            all[k++] = e;
    uint64_t *refused = rc == KVS_OK ? kvs__calloc(KVS_MAX(n, 1), sizeof(*refused)) : NULL;
    size_t nrefused = 0, nok = 0;
    if (rc == KVS_OK && refused == NULL)
        rc = KVS_NO_MEMORY;
    if (rc == KVS_OK) {
        /* Two entries over the same bytes (a DEL that never came): only the newer can hold
         * them, and even it is offered only if nothing else claims its range. */
        qsort(all, n, sizeof(*all), cmp_entry_offset);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            ientry_t *prev = kept ? all[kept - 1] : NULL;
            if (prev == NULL || all[i]->offset >= prev->offset + prev->size) {
                all[kept++] = all[i];
            } else if (all[i]->version > prev->version) {
                refused[nrefused++] = prev->token;
                all[kept - 1] = all[i];
            } else {
                refused[nrefused++] = all[i]->token;
            }
        }
        n = kept;
    }
    /* Pages in ascending offset; the last (possibly empty) one says the index is all sent. */
    for (size_t start = 0; rc == KVS_OK && (start < n || start == 0); start += KVS_MAX_INDEX_OPS) {
        size_t m = KVS_MIN(n - start, (size_t)KVS_MAX_INDEX_OPS);
        for (size_t i = 0; i < m; i++) {
            const ientry_t *e = all[start + i];
            ops[i] = (kvs__index_op_t){.segment_id = o->segment_id,
                                       .op = KVS_INDEX_ADD,
                                       .key = {e->key, e->key_len},
                                       .offset = e->offset,
                                       .size = e->size,
                                       .token = e->token,
                                       .writer = e->writer,
                                       .version = e->version,
                                       .flags = e->flags};
        }
        kvs__wbuf_t req, rsp;
        kvs__wbuf_init(&req);
        kvs__wbuf_init(&rsp);
        kvs__rpc_begin(o->rpc, &req, KVS_MSG_RECOVER);
        kvs__recover_req_t r = {o->segment_id, (uint32_t)m, ops, start + m >= n};
        kvs__recover_req_encode(&req, &r);
        rc = owner_call(o, &req, &rsp);
        kvs__arena_t a;
        kvs__arena_init(&a);
        kvs__status_list_rsp_t sl;
        if (rc == KVS_OK)
            rc = kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sl);
        if (rc == KVS_OK)
            rc = sl.status != KVS_OK ? sl.status : sl.nresults == m ? KVS_OK : KVS_PROTOCOL_ERROR;
        for (size_t i = 0; rc == KVS_OK && i < m; i++) {
            if (sl.results[i] == KVS_OK)
                nok++;
            else
                refused[nrefused++] = all[start + i]->token;
        }
        kvs__arena_free(&a);
        kvs__wbuf_free(&req);
        kvs__wbuf_free(&rsp);
        if (start + m >= n)
            break;
    }
    for (size_t i = 0; rc == KVS_OK && i < nrefused; i++)
        index_del(&o->index, refused[i]);
    pthread_mutex_unlock(&o->index_lock);
    kvs__free(all);
    kvs__free(ops);
    kvs__free(refused);
    if (rc == KVS_OK) {
        o->recovered += nok;
        kvs_info("segment '%s' (%llu) re-registered with the new leader: %zu object(s) kept, "
                 "%zu refused",
                 o->name, (unsigned long long)o->segment_id, nok, nrefused);
    }
    return rc;
}

/* A new leader: the segment is registered again under its id, in the same memory, with a new
 * write key (every capability of the old leader fails from now on, writes in progress
 * included), then its index. NOT_LEADER when the new master's term is older than one we were
 * registered under. A MOUNT the master refuses (the id or name taken) falls back to a fresh
 * mount. */
static void owner_unmount(kvs__owner_t *o);

static int owner_reregister(kvs__owner_t *o)
{
    kvs__hello_rsp_t h = kvs__rpc_hello(o->rpc);
    if (h.term != 0 && h.term < o->term) {
        kvs_warn("master of term %llu is older than term %llu: not registering with it",
                 (unsigned long long)h.term, (unsigned long long)o->term);
        return KVS_NOT_LEADER;
    }
    uint8_t key[KVS_WRITE_KEY_LEN];
    kvs__mount_rsp_t mr;
    int rc = owner_mount_call(o, o->segment_id, key, &mr);
    if (rc == KVS_OK && mr.segment_id != o->segment_id)
        rc = KVS_PROTOCOL_ERROR;
    if (rc == KVS_OK)
        rc = kvs__data_server_rekey(o->data, o->segment_id, key, mr.epoch);
    kvs__secret_wipe(key, sizeof(key));
    if (rc == KVS_OK) {
        h = kvs__rpc_hello(o->rpc);
        o->fence_applied = 0;
        o->index_applied = 0;
        rc = owner_recover(o);
        if (rc == KVS_OK) {
            /* Only a whole recovery counts: a part given to the leader is taken back (its
             * segment unmounted) and the next round registers it again from the start. */
            o->incarnation = h.incarnation;
            o->term = KVS_MAX(o->term, h.term);
            return KVS_OK;
        }
        kvs_warn("segment '%s': giving the new leader its index failed (%s); trying again", o->name,
                 kvs_status_str(rc));
        owner_unmount(o);
        return rc;
    }
    if (rc == KVS_SEGMENT_ALREADY_EXISTS) {
        kvs_warn("segment '%s' cannot keep id %llu at the new leader: mounting it afresh", o->name,
                 (unsigned long long)o->segment_id);
        return KVS_SEGMENT_NOT_FOUND;
    }
    kvs_warn("cannot re-register segment '%s' with the new leader: %s", o->name,
             kvs_status_str(rc));
    return rc;
}

static int owner_mount(kvs__owner_t *o)
{
    /* A re-mount gets fresh memory: readers may still hold mappings of the old segment (a
     * lookup's lease outlives the master's memory of it), and those must never show the new
     * segment's objects. The old pages live on in their mappings until those go. */
    kvs__segment_mem_t fresh = {.fd = -1};
    if (o->segment_id != 0) {
        int mrc = kvs__segment_mem_create("kvstash-segment", o->cfg.segment_size, &fresh);
        if (mrc != KVS_OK) {
            kvs_error("cannot mount segment '%s' again: no memory for a fresh segment (%s)",
                      o->name, kvs_status_str(mrc));
            return mrc;
        }
    }
    uint8_t key[KVS_WRITE_KEY_LEN];
    kvs__mount_rsp_t mr;
    int rc = owner_mount_call(o, 0, key, &mr);
    if (rc == KVS_OK) {
        /* A fresh mount starts empty at the master; serve it under its new id, in new memory. */
        if (o->segment_id != 0) {
            kvs__data_server_remove(o->data, o->segment_id); /* waits for requests using it */
            kvs__segment_mem_destroy(&o->mem);
            o->mem = fresh;
            fresh = (kvs__segment_mem_t){.fd = -1};
            o->segment_id = 0;
        }
        rc = kvs__data_server_add(o->data, mr.segment_id, o->mem.base, o->mem.size, o->mem.fd, key,
                                  mr.epoch);
        if (rc == KVS_OK) {
            o->segment_id = mr.segment_id;
            o->incarnation = kvs__rpc_incarnation(o->rpc);
            o->fence_applied = 0; /* a new segment id: its fences start afresh */
            o->index_applied = 0;
            o->term = KVS_MAX(o->term, kvs__rpc_hello(o->rpc).term);
            pthread_mutex_lock(&o->index_lock);
            index_clear(&o->index);
            pthread_mutex_unlock(&o->index_lock);
        }
    }
    kvs__secret_wipe(key, sizeof(key));
    if (fresh.fd >= 0)
        kvs__segment_mem_destroy(&fresh);
    if (rc == KVS_OK)
        kvs_info("segment '%s' (%llu bytes) mounted as %llu, served at %s", o->name,
                 (unsigned long long)o->mem.size, (unsigned long long)o->segment_id, o->endpoint);
    else
        kvs_error("cannot mount segment '%s': %s", o->name, kvs_status_str(rc));
    return rc;
}

/* Applies the fences of a HEARTBEAT reply that are new for our segment; *applied_p says
 * whether there were any (so they can be acknowledged at once). */
static int owner_apply_fences(kvs__owner_t *o, const kvs__heartbeat_rsp_t *hr, bool *applied_p)
{
    uint64_t *tokens = kvs__malloc(2 * KVS_MAX(hr->nfences, 1) * sizeof(*tokens));
    if (tokens == NULL)
        return KVS_NO_MEMORY;
    uint64_t *epochs = tokens + KVS_MAX(hr->nfences, 1);
    size_t n = 0;
    uint64_t seq = o->fence_applied;
    for (uint32_t i = 0; i < hr->nfences; i++) {
        const kvs__fence_t *f = &hr->fences[i];
        if (f->segment_id == o->segment_id && f->seq > o->fence_applied) {
            epochs[n] = f->epoch;
            tokens[n++] = f->token;
            seq = KVS_MAX(seq, f->seq);
        }
    }
    int rc = n ? kvs__data_server_fence(o->data, o->segment_id, tokens, epochs, n) : KVS_OK;
    /* After the fences: a fence of an old epoch is applied (it may matter to a write in
     * progress) before the epoch says it can go. */
    if (rc == KVS_OK && o->segment_id != 0)
        kvs__data_server_epoch(o->data, o->segment_id, hr->epoch);
    kvs__free(tokens);
    if (rc == KVS_OK && n > 0) {
        kvs_debug("segment %llu: %zu put(s) fenced, up to fence %llu",
                  (unsigned long long)o->segment_id, n, (unsigned long long)seq);
        o->fence_applied = seq;
        *applied_p = true;
    }
    return rc;
}

/* One HEARTBEAT: keeps the segment alive, acknowledges the fences applied so far and applies
 * the ones the reply lists. */
static uint64_t owner_period_ms(const kvs__owner_t *o);

static int owner_heartbeat_once(kvs__owner_t *o, bool *applied_p)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(o->rpc, &req, KVS_MSG_HEARTBEAT);
    kvs__fence_ack_t ack = {o->segment_id, o->fence_applied, o->index_applied};
    /* Following a leader, the master holds the heartbeat until it has news (index changes,
     * fences), so they reach us at once; other masters answer at once. */
    kvs__heartbeat_req_t hb = {o->segment_id != 0 ? 1 : 0, &ack,
                               o->follows && o->segment_id != 0 ? owner_period_ms(o) : 0};
    kvs__heartbeat_req_encode(&req, &hb);
    int rc = owner_call(o, &req, &rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__heartbeat_rsp_t hr;
    if (rc == KVS_OK)
        rc = kvs__heartbeat_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &hr);
    if (rc == KVS_OK)
        rc = hr.status;
    kvs__hello_rsp_t h = kvs__rpc_hello(o->rpc);
    if (rc == KVS_OK && o->follows && h.term != 0 && h.term < o->term)
        rc = KVS_NOT_LEADER; /* a leader of an older term: nothing it says is applied */
    if (rc == KVS_OK)
        rc = owner_apply_fences(o, &hr, applied_p);
    if (rc == KVS_OK)
        owner_apply_index(o, &hr, applied_p);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return rc;
}

/* A heartbeat; newly applied fences and index changes are acknowledged by a second one right
 * away, so the master can reuse their space (and answer a PUT_END) without waiting a
 * heartbeat period. */
static int owner_heartbeat(kvs__owner_t *o)
{
    bool applied = false;
    int rc = owner_heartbeat_once(o, &applied);
    o->news = applied;
    if (rc == KVS_OK && applied) {
        bool again = false;
        rc = owner_heartbeat_once(o, &again);
        o->news = again;
    }
    return rc;
}

/* The heartbeat period: a third of the time-out of the master we last said HELLO to, read
 * again after every call (a restarted master may have another time-out, and a period computed
 * once would let it expire us over and over), and at most cfg.heartbeat_max_ms, because a
 * heartbeat is also how the owner notices that the master restarted. */
static uint64_t owner_period_ms(const kvs__owner_t *o)
{
    uint64_t period_ms = kvs__rpc_hello(o->rpc).heartbeat_timeout_ms / 3;
    period_ms = KVS_MIN(period_ms, o->cfg.heartbeat_max_ms);
    return period_ms ? period_ms : 1;
}

/* One round of the heartbeat thread: a heartbeat, and a mount when the master no longer
 * knows our segment (it dropped it, or it is a new master: another incarnation). */
static int owner_keepalive(kvs__owner_t *o)
{
    int rc = owner_heartbeat(o);
    if (rc == KVS_OK && kvs__rpc_incarnation(o->rpc) != o->incarnation)
        rc = KVS_SEGMENT_NOT_FOUND; /* a new master: it cannot know the segment */
    if (rc == KVS_SEGMENT_NOT_FOUND && o->follows && o->segment_id != 0 &&
        kvs__rpc_incarnation(o->rpc) != o->incarnation) {
        /* A new leader: it knows nothing yet, but we keep what the segment holds. */
        rc = owner_reregister(o);
        if (rc != KVS_SEGMENT_NOT_FOUND)
            return rc;
    }
    if (rc == KVS_SEGMENT_NOT_FOUND) {
        kvs_warn("the master dropped segment %llu; mounting again",
                 (unsigned long long)o->segment_id);
        rc = owner_mount(o);
    } else if (rc != KVS_OK) {
        kvs_warn("heartbeat failed: %s", kvs_status_str(rc));
    }
    return rc;
}

/* Heartbeats every period. A failed round (the master went away, or refused the mount) is
 * retried after a short back-off that doubles up to the period, rather than a whole period
 * later: a restarted master sees the owner mounted again within about one period. */
static void *heartbeat_thread(void *arg)
{
    kvs__owner_t *o = arg;
    uint64_t period_ms = owner_period_ms(o), backoff_ms = 0;
    bool again = false;
    pthread_mutex_lock(&o->lock);
    while (!o->stopping) {
        uint64_t wait_ms = again ? 0 : backoff_ms ? backoff_ms : period_ms;
        /* Retries get up to a quarter more at random, so that the owners of a restarted master
         * do not all come back in the same millisecond. */
        if (backoff_ms != 0)
            wait_ms += kvs__random_u64() % (backoff_ms / 4 + 1);
        uint64_t until = kvs__now_ns() + wait_ms * KVS_NS_PER_MS;
        while (!o->stopping && kvs__cond_wait_until(&o->cond, &o->lock, until))
            ;
        if (o->stopping)
            break;
        pthread_mutex_unlock(&o->lock);
        uint64_t t0 = kvs__now_ns();
        int rc = owner_keepalive(o);
        period_ms = owner_period_ms(o);
        if (rc == KVS_OK)
            backoff_ms = 0;
        else
            backoff_ms = KVS_MIN(backoff_ms ? 2 * backoff_ms : o->cfg.retry_min_ms, period_ms);
        pthread_mutex_lock(&o->lock);
        /* A heartbeat the master held (following a leader) was the wait: go again at once. */
        uint64_t took_ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
        /* So was one that brought news: more may be on the way (a stream of puts). */
        again = rc == KVS_OK && o->follows && (took_ms >= period_ms / 2 || o->news);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

int kvs__owner_create(const kvs__owner_config_t *cfg, kvs__owner_t **owner_p)
{
    if (cfg == NULL || owner_p == NULL ||
        (cfg->etcd == NULL && (cfg->master_host == NULL || cfg->master_port == 0)) ||
        cfg->segment_size < 4096 || cfg->rpc_timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    kvs__owner_t *o = kvs__calloc(1, sizeof(*o));
    if (o == NULL)
        return KVS_NO_MEMORY;
    o->cfg = *cfg;
    o->follows = cfg->etcd != NULL;
    if (o->cfg.heartbeat_max_ms == 0)
        o->cfg.heartbeat_max_ms =
            o->follows ? KVS_OWNER_HA_HEARTBEAT_MAX_MS : KVS_OWNER_HEARTBEAT_MAX_MS;
    pthread_mutex_init(&o->index_lock, NULL);
    if (o->cfg.retry_min_ms == 0)
        o->cfg.retry_min_ms = KVS_OWNER_RETRY_MIN_MS;
    pthread_mutex_init(&o->lock, NULL);
    kvs__cond_init(&o->cond);
    o->mem.fd = -1;
    int rc = kvs__segment_mem_create("kvstash-segment", cfg->segment_size, &o->mem);
    if (rc != KVS_OK)
        goto err;
    kvs__data_server_config_t dcfg = cfg->data;
    dcfg.advertise_host = cfg->advertise_host ? cfg->advertise_host : cfg->data.advertise_host;
    rc = kvs__data_server_create(&dcfg, &o->data);
    if (rc != KVS_OK)
        goto err;
    kvs__rpc_config_t rcfg = {.host = cfg->master_host,
                              .port = cfg->master_port,
                              .node = cfg->node,
                              .timeout_ms = cfg->rpc_timeout_ms,
                              .auth = cfg->data.auth,
                              .tls = cfg->data.tls,
                              .etcd = cfg->etcd,
                              .etcd_prefix = cfg->etcd_prefix};
    rc = kvs__rpc_open(&rcfg, &o->rpc);
    if (rc != KVS_OK)
        goto err;
    /* The name the data server proves itself under: readers dial exactly this. */
    snprintf(o->endpoint, sizeof(o->endpoint), "%s", kvs__data_server_name(o->data));
    if (cfg->segment_name != NULL)
        snprintf(o->name, sizeof(o->name), "%s", cfg->segment_name);
    else
        snprintf(o->name, sizeof(o->name), "%s:%u", kvs__rpc_node(o->rpc),
                 (unsigned)kvs__data_server_port(o->data));
    rc = owner_mount(o);
    if (rc != KVS_OK)
        goto err;
    if (pthread_create(&o->hb_thread, NULL, heartbeat_thread, o) != 0) {
        rc = KVS_INTERNAL_ERROR;
        goto err;
    }
    o->hb_started = true;
    *owner_p = o;
    return KVS_OK;
err:
    kvs__owner_destroy(o);
    return rc;
}

uint64_t kvs__owner_segment_id(const kvs__owner_t *o)
{
    return o->segment_id;
}

const char *kvs__owner_name(const kvs__owner_t *o)
{
    return o->name;
}

uint16_t kvs__owner_data_port(const kvs__owner_t *o)
{
    return kvs__data_server_port(o->data);
}

kvs__data_server_t *kvs__owner_data_server(kvs__owner_t *o)
{
    return o->data;
}

size_t kvs__owner_index_size(kvs__owner_t *o)
{
    pthread_mutex_lock(&o->index_lock);
    size_t n = o->index.n;
    pthread_mutex_unlock(&o->index_lock);
    return n;
}

uint64_t kvs__owner_recovered(kvs__owner_t *o)
{
    return o->recovered;
}

/* Tells the master the segment is gone (best effort). */
static void owner_unmount(kvs__owner_t *o)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(o->rpc, &req, KVS_MSG_UNMOUNT);
    kvs__ids_req_t u = {o->segment_id};
    kvs__ids_req_encode(&req, &u);
    if (owner_call(o, &req, &rsp) != KVS_OK)
        kvs_warn("could not unmount segment %llu", (unsigned long long)o->segment_id);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
}

void kvs__owner_destroy(kvs__owner_t *o)
{
    if (o == NULL)
        return;
    if (o->hb_started) {
        pthread_mutex_lock(&o->lock);
        o->stopping = true;
        pthread_cond_signal(&o->cond);
        pthread_mutex_unlock(&o->lock);
        pthread_join(o->hb_thread, NULL);
    }
    if (o->rpc != NULL && o->segment_id != 0)
        owner_unmount(o);
    /* The data server goes before the memory it serves. */
    kvs__data_server_destroy(o->data);
    kvs__rpc_close(o->rpc);
    kvs__segment_mem_destroy(&o->mem);
    index_clear(&o->index);
    pthread_mutex_destroy(&o->index_lock);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->cond);
    kvs__free(o);
}
