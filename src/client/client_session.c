/* Read sessions (Mooncake's batch_get_session_start/end) and replica inspection.
 *
 * A session is one LOOKUP whose answer the client keeps: each key's size, replicas, their
 * segments and the read lease the lookup took. Reads of session keys then need no lookup while
 * that lease has more than a margin left; the lease is released when the session ends. A read
 * whose keys are not all in a live session looks them up as usual. Bytes stay exact: the
 * master keeps a leased object's space (tombstoned if removed) until the lease ends, and a
 * transfer finishing after it is LEASE_EXPIRED, as for any read. */
#define _GNU_SOURCE
#include "client_int.h"

#include <stdlib.h>
#include <string.h>

/* A session's cached lease is used only while this much of it is left: a read started later
 * looks the key up again. */
#define SESSION_MARGIN_MIN_NS (100 * KVS_NS_PER_MS)

typedef struct sess {
    struct sess *next;
    uint64_t hash;
    uint32_t refs;
    /* Reads using this entry's placement now. An entry ended or replaced while reads are in
     * flight is detached (out of the table) and freed by the last of them; its lease is then
     * not released early but left to expire, so no read ever runs without one. */
    uint32_t inflight;
    bool detached;
    uint64_t size, lease_id, lease_until_ns, lease_ns;
    uint32_t nreps;
    kvs__replica_t reps[KVS_MAX_REPLICAS];
    kvs__seg_info_t segs[KVS_MAX_REPLICAS]; /* the segment of each replica; strings owned */
    uint32_t key_len;
    char key[];
} sess_t;

struct kvs__sessions {
    pthread_mutex_t lock;
    sess_t **buckets;
    size_t nbuckets; /* power of two */
    size_t n;
};

int kvs__sessions_create(kvs__sessions_t **s_p)
{
    kvs__sessions_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVS_NO_MEMORY;
    s->nbuckets = 1024;
    s->buckets = kvs__calloc(s->nbuckets, sizeof(*s->buckets));
    if (s->buckets == NULL) {
        kvs__free(s);
        return KVS_NO_MEMORY;
    }
    pthread_mutex_init(&s->lock, NULL);
    *s_p = s;
    return KVS_OK;
}

static void sess_free(sess_t *e)
{
    for (uint32_t i = 0; i < e->nreps; i++) {
        kvs__free((char *)e->segs[i].name.ptr);
        kvs__free((char *)e->segs[i].node.ptr);
        kvs__free((char *)e->segs[i].endpoint.ptr);
    }
    kvs__free(e);
}

void kvs__sessions_destroy(kvs__sessions_t *s)
{
    if (s == NULL)
        return;
    for (size_t b = 0; b < s->nbuckets; b++) {
        for (sess_t *e = s->buckets[b], *next; e != NULL; e = next) {
            next = e->next;
            sess_free(e);
        }
    }
    kvs__free(s->buckets);
    pthread_mutex_destroy(&s->lock);
    kvs__free(s);
}

void kvs__sessions_release_all(kvs_client_t *c)
{
    kvs__sessions_t *s = c->sessions;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    for (size_t b = 0; b < s->nbuckets; b++) {
        for (sess_t *e = s->buckets[b], *next; e != NULL; e = next) {
            next = e->next;
            kvs__str_t k = {e->key, e->key_len};
            kvs__client_release_later(c, 1, &k, &e->lease_id);
            sess_free(e);
        }
        s->buckets[b] = NULL;
    }
    s->n = 0;
    pthread_mutex_unlock(&s->lock);
}

static sess_t **sess_slot(kvs__sessions_t *s, kvs__str_t key, uint64_t hash)
{
    sess_t **p = &s->buckets[hash & (s->nbuckets - 1)];
    while (*p != NULL && ((*p)->hash != hash || !kvs__str_eq(kvs__str_c((*p)->key), key)))
        p = &(*p)->next;
    return p;
}

/* Takes the entry at *slot out of the table (the caller holds the lock). An entry reads still
 * use is detached: they free it and its lease expires. Returns the lease to release now, or 0. */
static uint64_t sess_unlink_locked(kvs__sessions_t *s, sess_t **slot)
{
    sess_t *e = *slot;
    *slot = e->next;
    s->n--;
    if (e->inflight > 0) {
        e->detached = true;
        return 0;
    }
    uint64_t lease = e->lease_id;
    sess_free(e);
    return lease;
}

static kvs__str_t str_dup(kvs__str_t s, bool *ok)
{
    char *p = kvs__strndup(s.ptr ? s.ptr : "", s.len);
    *ok &= p != NULL;
    return (kvs__str_t){p, p ? s.len : 0};
}

/* A new entry from a lookup's answer for one key; NULL on no memory. */
static sess_t *sess_new(kvs__str_t key, uint64_t hash, const kvs__placement_rsp_t *pr,
                        const kvs__obj_desc_t *d, uint64_t t_lookup)
{
    sess_t *e = kvs__calloc(1, sizeof(*e) + key.len + 1);
    if (e == NULL)
        return NULL;
    memcpy(e->key, key.ptr, key.len);
    e->key_len = key.len;
    e->hash = hash;
    e->size = d->size;
    e->lease_id = d->lease_id;
    e->lease_ns = d->lease_ms * KVS_NS_PER_MS;
    e->lease_until_ns = t_lookup + e->lease_ns;
    bool ok = true;
    for (uint32_t q = 0; q < d->nreps && q < KVS_MAX_REPLICAS; q++) {
        const kvs__seg_info_t *si = NULL;
        for (uint32_t g = 0; g < pr->nsegs && si == NULL; g++)
            si = pr->segs[g].id == d->reps[q].segment_id ? &pr->segs[g] : NULL;
        if (si == NULL)
            continue; /* its owner left: not a replica to read */
        e->reps[e->nreps] = d->reps[q];
        e->segs[e->nreps] = *si;
        e->segs[e->nreps].name = str_dup(si->name, &ok);
        e->segs[e->nreps].node = str_dup(si->node, &ok);
        e->segs[e->nreps].endpoint = str_dup(si->endpoint, &ok);
        e->nreps++;
    }
    if (!ok) {
        sess_free(e);
        return NULL;
    }
    return e;
}

/* Checks a call's arguments and keys; *ks_p (caller frees) gets the keys as wire strings. */
static int wire_keys(const char *op, kvs_client_t *c, size_t n, const char *const keys[],
                     bool outputs, kvs__str_t **ks_p)
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || !outputs)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: a client, 1..%u keys and the output arrays are "
                         "required",
                         op, KVS_MAX_BATCH);
    kvs__str_t *ks = kvs__calloc(n, sizeof(*ks));
    if (ks == NULL)
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory", op);
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK) {
            kvs__free(ks);
            return kvs__fail(KVS_INVALID_PARAMS, "%s: key %zu is empty, NULL or longer than %u", op,
                             i, KVS_MAX_KEY_LEN);
        }
        ks[i] = kvs__str_c(keys[i]);
    }
    *ks_p = ks;
    return KVS_OK;
}

int kvs_client_read_session_start(kvs_client_t *c, size_t n, const char *const keys[],
                                  int results[])
{
    kvs__str_t *ks;
    int krc = wire_keys("read_session_start", c, n, keys, results != NULL, &ks);
    if (krc != KVS_OK)
        return krc;
    kvs__client_enter(c);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__placement_rsp_t pr;
    /* Leases run from before the lookup was sent: never later than the master's clock. */
    uint64_t t_lookup = kvs__now_ns();
    int rc = kvs__client_keys_call(c, KVS_MSG_LOOKUP, 0, (uint32_t)n, ks, NULL, &arena, NULL, &pr,
                                   kvs__client_rpc_deadline(c));
    if (rc != KVS_OK) {
        rc = kvs__fail(rc, "read_session_start: lookup failed: %s", kvs_status_str(rc));
        goto out;
    }
    /* Leases this start takes but does not keep (duplicate keys, no memory), and those of the
     * entries it replaces, go back with the next request. */
    uint64_t *drop = kvs__calloc(n, sizeof(*drop));
    kvs__str_t *drop_keys = kvs__calloc(n, sizeof(*drop_keys));
    char **drop_own = kvs__calloc(n, sizeof(*drop_own));
    kvs__sessions_t *s = c->sessions;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        const kvs__obj_desc_t *d = &pr.objs[i];
        results[i] = d->status == KVS_OK ? (int)KVS_MIN(d->size, (uint64_t)INT32_MAX) : d->status;
        if (d->status != KVS_OK)
            continue;
        uint64_t hash = kvs__hash64(ks[i].ptr, ks[i].len);
        sess_t **slot = sess_slot(s, ks[i], hash);
        sess_t *e = s->n < KVS_MAX_SESSION_KEYS || *slot != NULL
                        ? sess_new(ks[i], hash, &pr, d, t_lookup)
                        : NULL;
        if (e == NULL) {
            results[i] = s->n < KVS_MAX_SESSION_KEYS ? KVS_NO_MEMORY : KVS_NO_RESOURCE;
            if (drop != NULL && drop_keys != NULL) {
                drop[i] = d->lease_id;
                drop_keys[i] = ks[i];
            }
            continue;
        }
        if (*slot != NULL) { /* started again: the fresh lookup replaces the old lease */
            sess_t *old = *slot;
            e->refs = old->refs + 1;
            e->next = old->next;
            if (old->inflight > 0) {
                old->detached = true; /* its readers free it; its lease expires */
            } else {
                if (drop != NULL && drop_keys != NULL && drop_own != NULL &&
                    (drop_own[i] = kvs__strndup(old->key, old->key_len)) != NULL) {
                    drop[i] = old->lease_id;
                    drop_keys[i] = (kvs__str_t){drop_own[i], old->key_len};
                }
                sess_free(old);
            }
        } else {
            e->refs = 1;
            e->next = NULL;
            s->n++;
        }
        *slot = e;
    }
    pthread_mutex_unlock(&s->lock);
    if (drop != NULL && drop_keys != NULL)
        kvs__client_release_later(c, (uint32_t)n, drop_keys, drop);
    for (size_t i = 0; drop_own != NULL && i < n; i++)
        kvs__free(drop_own[i]);
    kvs__free(drop);
    kvs__free(drop_keys);
    kvs__free(drop_own);
out:
    kvs__arena_free(&arena);
    kvs__free(ks);
    kvs__client_leave(c);
    return rc;
}

int kvs_client_read_session_end(kvs_client_t *c, size_t n, const char *const keys[])
{
    if (c == NULL || n > KVS_MAX_BATCH || (n > 0 && keys == NULL))
        return kvs__fail(KVS_INVALID_PARAMS,
                         "read_session_end: a client and up to %u keys are "
                         "required",
                         KVS_MAX_BATCH);
    kvs__sessions_t *s = c->sessions;
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK)
            continue; /* never started */
        kvs__str_t k = kvs__str_c(keys[i]);
        uint64_t lease = 0;
        pthread_mutex_lock(&s->lock);
        sess_t **slot = sess_slot(s, k, kvs__hash64(k.ptr, k.len));
        if (*slot != NULL && --(*slot)->refs == 0) {
            lease = sess_unlink_locked(s, slot);
        }
        pthread_mutex_unlock(&s->lock);
        if (lease != 0)
            kvs__client_release_later(c, 1, &k, &lease);
    }
    return KVS_OK;
}

void kvs__sessions_forget(kvs_client_t *c, size_t n, const char *const keys[], const int *results)
{
    kvs__sessions_t *s = c->sessions;
    if (s == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        if ((results != NULL && results[i] != KVS_OK) || keys[i] == NULL)
            continue;
        kvs__str_t k = kvs__str_c(keys[i]);
        uint64_t lease = 0;
        pthread_mutex_lock(&s->lock);
        if (s->n == 0) {
            pthread_mutex_unlock(&s->lock);
            return;
        }
        sess_t **slot = sess_slot(s, k, kvs__hash64(k.ptr, k.len));
        if (*slot != NULL)
            lease = sess_unlink_locked(s, slot);
        pthread_mutex_unlock(&s->lock);
        if (lease != 0)
            kvs__client_release_later(c, 1, &k, &lease);
    }
}

void kvs__sessions_done(kvs_client_t *c, uint32_t m, void **held)
{
    if (held == NULL)
        return;
    kvs__sessions_t *s = c->sessions;
    pthread_mutex_lock(&s->lock);
    for (uint32_t j = 0; j < m; j++) {
        sess_t *e = held[j];
        if (e != NULL && --e->inflight == 0 && e->detached)
            sess_free(e);
    }
    pthread_mutex_unlock(&s->lock);
    kvs__free(held);
}

int kvs__sessions_placement(kvs_client_t *c, uint32_t m, const kvs__str_t *ks, kvs__arena_t *arena,
                            kvs__placement_rsp_t *pr, uint64_t *until_ns, void ***held_p)
{
    *held_p = NULL;
    kvs__sessions_t *s = c->sessions;
    if (s == NULL || m == 0)
        return KVS_UNSUPPORTED;
    pthread_mutex_lock(&s->lock);
    if (s->n == 0) {
        pthread_mutex_unlock(&s->lock);
        return KVS_UNSUPPORTED;
    }
    uint64_t now = kvs__now_ns();
    memset(pr, 0, sizeof(*pr));
    sess_t **held = kvs__calloc(m, sizeof(*held));
    pr->objs = kvs__arena_alloc(arena, (size_t)m * sizeof(*pr->objs));
    pr->segs = kvs__arena_alloc(arena, (size_t)m * KVS_MAX_REPLICAS * sizeof(*pr->segs));
    int rc = pr->objs && pr->segs && held ? KVS_OK : KVS_NO_MEMORY;
    for (uint32_t j = 0; rc == KVS_OK && j < m; j++) {
        sess_t *e = *sess_slot(s, ks[j], kvs__hash64(ks[j].ptr, ks[j].len));
        uint64_t margin = e ? KVS_MAX(e->lease_ns / 10, SESSION_MARGIN_MIN_NS) : 0;
        if (e == NULL || e->lease_until_ns < now + margin) {
            rc = KVS_UNSUPPORTED; /* not every key is in a live session: look them up */
            break;
        }
        kvs__obj_desc_t *d = &pr->objs[j];
        *d = (kvs__obj_desc_t){.status = KVS_OK,
                               .size = e->size,
                               .lease_ms = (e->lease_until_ns - now) / KVS_NS_PER_MS,
                               .nreps = e->nreps};
        d->reps = kvs__arena_alloc(arena, KVS_MAX(e->nreps, 1) * sizeof(*d->reps));
        if (d->reps == NULL) {
            rc = KVS_NO_MEMORY;
            break;
        }
        memcpy(d->reps, e->reps, e->nreps * sizeof(*d->reps));
        until_ns[j] = e->lease_until_ns;
        held[j] = e;
        /* Segment strings are copied into the arena: the entry may go while the read runs. */
        for (uint32_t q = 0; q < e->nreps; q++) {
            bool have = false;
            for (uint32_t g = 0; g < pr->nsegs && !have; g++)
                have = pr->segs[g].id == e->segs[q].id;
            if (have)
                continue;
            kvs__seg_info_t si = e->segs[q];
            const kvs__str_t *strs[3] = {&si.name, &si.node, &si.endpoint};
            for (int t = 0; t < 3; t++) {
                char *p = kvs__arena_alloc(arena, strs[t]->len + 1);
                if (p == NULL) {
                    rc = KVS_NO_MEMORY;
                    break;
                }
                memcpy(p, strs[t]->ptr, strs[t]->len);
                p[strs[t]->len] = '\0';
                *(kvs__str_t *)strs[t] = (kvs__str_t){p, strs[t]->len};
            }
            pr->segs[pr->nsegs++] = si;
        }
    }
    /* The entries are held until the read is over (kvs__sessions_done). */
    for (uint32_t j = 0; rc == KVS_OK && j < m; j++)
        held[j]->inflight++;
    pthread_mutex_unlock(&s->lock);
    pr->nobjs = m;
    if (rc == KVS_OK)
        *held_p = (void **)held;
    else
        kvs__free(held);
    return rc;
}

/* ---- replica inspection --------------------------------------------------------------------- */

static void name_copy(char *dst, kvs__str_t s)
{
    size_t n = KVS_MIN(s.len, (size_t)KVS_REPLICA_NAME_MAX - 1);
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

int kvs_client_batch_get_replica_desc(kvs_client_t *c, size_t n, const char *const keys[],
                                      kvs_replica_desc_t descs[], uint32_t nreps[], int results[])
{
    kvs__str_t *ks;
    int krc = wire_keys("batch_get_replica_desc", c, n, keys,
                        descs != NULL && nreps != NULL && results != NULL, &ks);
    if (krc != KVS_OK)
        return krc;
    kvs__client_enter(c);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__placement_rsp_t pr;
    int rc = kvs__client_keys_call(c, KVS_MSG_LOOKUP, 0, (uint32_t)n, ks, NULL, &arena, NULL, &pr,
                                   kvs__client_rpc_deadline(c));
    if (rc == KVS_OK) {
        uint64_t *leases = kvs__calloc(n, sizeof(*leases));
        for (size_t i = 0; i < n; i++) {
            const kvs__obj_desc_t *d = &pr.objs[i];
            results[i] = d->status;
            nreps[i] = 0;
            if (d->status != KVS_OK)
                continue;
            if (leases != NULL)
                leases[i] = d->lease_id;
            for (uint32_t q = 0; q < d->nreps && q < KVS_MAX_REPLICA_DESCS; q++) {
                const kvs__seg_info_t *si = NULL;
                for (uint32_t g = 0; g < pr.nsegs && si == NULL; g++)
                    si = pr.segs[g].id == d->reps[q].segment_id ? &pr.segs[g] : NULL;
                if (si == NULL)
                    continue;
                kvs_replica_desc_t *x = &descs[i * KVS_MAX_REPLICA_DESCS + nreps[i]++];
                x->segment_id = si->id;
                name_copy(x->segment_name, si->name);
                name_copy(x->endpoint, si->endpoint);
                name_copy(x->node, si->node);
                x->offset = d->reps[q].offset;
                x->size = d->size;
            }
        }
        /* Inspection reads nothing: its leases end at once (with the next request). */
        if (leases != NULL)
            kvs__client_release_later(c, (uint32_t)n, ks, leases);
        kvs__free(leases);
    } else {
        rc = kvs__fail(rc, "batch_get_replica_desc: lookup failed: %s", kvs_status_str(rc));
    }
    kvs__arena_free(&arena);
    kvs__free(ks);
    kvs__client_leave(c);
    return rc;
}
