/* Client data paths: puts (two-phase: placement from the master, writes to every replica, then
 * end or revoke) and reads (lookup, replica choice, transfers in direct or grouped mode, lease
 * check). Every entry point reduces to one batch of keys, each with an ordered list of
 * fragments, so the single-key calls share the batch code. */
#define _GNU_SOURCE
#include "client_int.h"
#include "../gpu/gpu_copy.h"

#include <stdlib.h>
#include <string.h>

/* One call's keys and fragments. */
typedef struct {
    size_t n;
    const char *const *keys;
    struct iovec *iov; /* every fragment, key after key */
    size_t *first;     /* key i owns iov[first[i] .. first[i] + cnt[i]) */
    uint32_t *cnt;
    uint64_t *total; /* bytes of key i's fragments */
    int64_t *res;    /* 0 while the key is usable, else its failure */
    int *domain;     /* memory domain of all of key i's fragments, or KVS_DOMAIN_MIXED */
    kvs__pinset_t pins;
    uint64_t deadline; /* of the whole call: master requests, connects and transfers */
    /* Ranged reads: key i reads [src_off[i], src_off[i] + total[i]) of its object (NULL: the
     * whole object). */
    const uint64_t *src_off;
    bool allow_larger; /* fragments may hold more than the object (filled in order) */
    bool upsert;       /* puts: replace an existing object (KVS_PUT_FLAG_UPSERT) */
    bool staged;       /* reads: a round took the staged path (the call counts as staged) */
    /* Page-table reads (client_pages.c): key i's pages are ids[ids_first[i] ..] in `layout`;
     * iov stays NULL unless the call reads direct (call_fragments builds it then). */
    const kvs__page_layout_t *layout;
    const uint32_t *ids;
    const size_t *npages;
    uint64_t *ids_first;
    bool sliced; /* the page scatter takes the layout (kvs__pt_slices), else fragments are built */
    /* Adaptive mode (MC_STORE_GPU_STAGING=auto): the first round's shape and the mode it took
     * (mode_used < 0: no choice was made), for the policy to learn from once the call is over. */
    kvs__read_shape_t shape;
    int mode_used;
} call_t;

/* How a call reaches one segment, decided once per call and segment. Each route holds a
 * reference on its endpoint until the call ends, so a sweep closing the endpoint of an owner
 * that left cannot free it under the call. */
typedef struct {
    uint64_t seg_id;
    kvs_transport_t *t;
    kvs_endpoint_t *ep;
    int rc;
} route_t;

typedef struct {
    route_t *r;
    uint32_t n, cap;
} routes_t;

static void routes_free(routes_t *rs)
{
    for (uint32_t i = 0; i < rs->n; i++) {
        if (rs->r[i].ep != NULL)
            rs->r[i].t->ops->ep_close(rs->r[i].t, rs->r[i].ep);
    }
    kvs__free(rs->r);
    *rs = (routes_t){0};
}

/* The transports' name for a memory domain: 0 host, d + 1 for CUDA device d. */
static uint32_t gpu_of(int domain)
{
    return domain >= 0 ? (uint32_t)domain + 1 : 0;
}

static void call_free(kvs_client_t *c, call_t *k)
{
    kvs__pinset_release(c, &k->pins);
    kvs__free(k->iov);
    kvs__free(k->first);
    kvs__free(k->cnt);
    kvs__free(k->total);
    kvs__free(k->res);
    kvs__free(k->domain);
    kvs__free(k->ids_first);
}

/* Refuses key i of a call with INVALID_PARAMS, saying why. */
static void key_refuse(call_t *k, size_t i, const char *op, const char *why)
{
    k->res[i] = kvs__fail(KVS_INVALID_PARAMS, "%s: key '%s' %s", op, k->keys[i], why);
}

/* Validates the arguments and copies the fragments. A failure of the call as a whole returns
 * non-OK; a bad key only marks that key. Fragments of zero-copy calls are pinned. */
static int call_init(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                     const kvs_buf_t *const bufs[], const size_t nbufs[], bool registered,
                     call_t *k)
{
    memset(k, 0, sizeof(*k));
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || bufs == NULL || nbufs == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: a client, 1..%u keys and their buffers are required", op,
                         KVS_MAX_BATCH);
    size_t nfrag = 0;
    for (size_t i = 0; i < n; i++) {
        if (nbufs[i] > UINT32_MAX || nfrag + nbufs[i] < nfrag)
            return kvs__fail(KVS_INVALID_PARAMS, "%s: key %zu has too many fragments", op, i);
        nfrag += nbufs[i];
    }
    k->n = n;
    k->keys = keys;
    k->iov = kvs__malloc(KVS_MAX(nfrag, 1) * sizeof(*k->iov));
    k->first = kvs__malloc(n * sizeof(*k->first));
    k->cnt = kvs__malloc(n * sizeof(*k->cnt));
    k->total = kvs__malloc(n * sizeof(*k->total));
    k->res = kvs__calloc(n, sizeof(*k->res));
    k->domain = kvs__malloc(n * sizeof(*k->domain));
    if (k->iov == NULL || k->first == NULL || k->cnt == NULL || k->total == NULL ||
        k->res == NULL || k->domain == NULL) {
        call_free(c, k);
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory", op);
    }
    size_t f = 0;
    if (registered)
        pthread_rwlock_rdlock(&c->reg_lock);
    for (size_t i = 0; i < n; i++) {
        k->first[i] = f;
        k->cnt[i] = (uint32_t)nbufs[i];
        k->domain[i] = KVS_DOMAIN_MIXED; /* unregistered memory belongs to no domain */
        uint64_t total = 0;
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK) {
            k->res[i] = kvs__fail(KVS_INVALID_PARAMS,
                                  "%s: key %zu is NULL, empty or longer "
                                  "than %u bytes",
                                  op, i, KVS_MAX_KEY_LEN);
        } else if (nbufs[i] == 0 || bufs[i] == NULL) {
            key_refuse(k, i, op, "has no buffer");
        }
        for (size_t j = 0; j < nbufs[i] && k->res[i] == 0; j++) {
            const kvs_buf_t *b = &bufs[i][j];
            int dom = KVS_DOMAIN_MIXED;
            k->iov[f + j] = (struct iovec){b->ptr, b->len};
            if (b->ptr == NULL || b->len == 0 || total + b->len < total)
                key_refuse(k, i, op, "has a NULL or empty fragment");
            else if (registered && !kvs__reg_pin_locked(c, b->ptr, b->len, &k->pins, &dom))
                key_refuse(k, i, op, "has a fragment not inside one registered buffer");
            else if (!registered)
                kvs__classify_memory(b->ptr, &dom); /* copying calls take any memory */
            if (dom >= 0 && !KVS_GPU_BUILT && k->res[i] == 0)
                key_refuse(k, i, op, "is in GPU memory, which needs a CUDA build of kvstash");
            k->domain[i] = j == 0 || k->domain[i] == dom ? dom : KVS_DOMAIN_MIXED;
            if (k->domain[i] == KVS_DOMAIN_MIXED && (dom >= 0 || j > 0) && k->res[i] == 0)
                key_refuse(k, i, op, "mixes host and GPU memory (or two GPUs) in its fragments");
            total += b->len;
        }
        k->total[i] = total;
        f += nbufs[i];
    }
    if (registered)
        pthread_rwlock_unlock(&c->reg_lock);
    return KVS_OK;
}

/* The keys of a call still usable, as wire strings; *map_p[j] is the call index of entry j. */
static int usable_keys(const call_t *k, kvs__str_t **keys_p, size_t **map_p, uint32_t *n_p)
{
    kvs__str_t *ks = kvs__malloc(k->n * sizeof(*ks));
    size_t *map = kvs__malloc(k->n * sizeof(*map));
    if (ks == NULL || map == NULL) {
        kvs__free(ks);
        kvs__free(map);
        return KVS_NO_MEMORY;
    }
    uint32_t m = 0;
    for (size_t i = 0; i < k->n; i++) {
        if (k->res[i] == 0) {
            ks[m] = kvs__str_c(k->keys[i]);
            map[m++] = i;
        }
    }
    *keys_p = ks;
    *map_p = map;
    *n_p = m;
    return KVS_OK;
}

static const kvs__seg_info_t *seg_find(const kvs__placement_rsp_t *pr, uint64_t id)
{
    for (uint32_t i = 0; i < pr->nsegs; i++) {
        if (pr->segs[i].id == id)
            return &pr->segs[i];
    }
    return NULL;
}

/* The transport and endpoint that reach segment `s`: shm when its owner is on this host and
 * hands over the segment (protocol shm or auto), else tcp (protocol tcp or auto). */
/* Route setup (a same-host handshake, a name lookup) may take half of what is left of the call:
 * an owner that does not answer leaves the other half to the call's other keys and replicas,
 * which are routed one after another before anything is submitted. */
static uint64_t route_deadline(uint64_t deadline)
{
    uint64_t now = kvs__now_ns();
    return now >= deadline ? deadline : now + (deadline - now) / 2;
}

static int route_open(kvs_client_t *c, const kvs__seg_info_t *s, uint64_t deadline, route_t *r)
{
    char name[KVS_MAX_NAME_LEN + 1];
    *r = (route_t){.seg_id = s ? s->id : 0, .rc = KVS_TRANSFER_FAIL};
    if (s == NULL || s->endpoint.len == 0 || s->endpoint.len > KVS_MAX_NAME_LEN)
        return r->rc;
    memcpy(name, s->endpoint.ptr, s->endpoint.len);
    name[s->endpoint.len] = '\0';
    uint64_t until = route_deadline(deadline);
    kvs_endpoint_t *ep = NULL;
    int why = KVS_TRANSFER_FAIL;
    if (c->shm != NULL && kvs__client_endpoint(c, c->shm, name, until, &ep) == KVS_OK) {
        why = kvs__shm_map_segment(c->shm, ep, s->id, until);
        if (why == KVS_OK) {
            *r = (route_t){s->id, c->shm, ep, KVS_OK};
            return KVS_OK;
        }
        c->shm->ops->ep_close(c->shm, ep);
    }
    /* protocol shm without this owner on reach: no route */
    if (c->tcp != NULL) {
        why = kvs__client_endpoint(c, c->tcp, name, until, &ep);
        if (why == KVS_OK)
            *r = (route_t){s->id, c->tcp, ep, KVS_OK};
    }
    /* The call's own time-out is reported as such; other reasons are a failed transfer. */
    if (why != KVS_OK)
        r->rc = why == KVS_TIMED_OUT || why == KVS_NO_MEMORY ? why : KVS_TRANSFER_FAIL;
    return r->rc;
}

static int route_for(kvs_client_t *c, routes_t *rs, const kvs__seg_info_t *s, uint64_t deadline,
                     kvs_transport_t **t_p, kvs_endpoint_t **ep_p)
{
    uint64_t id = s ? s->id : 0;
    route_t *r = NULL;
    for (uint32_t i = rs->n; i-- > 0 && r == NULL;) /* the last one is the likeliest */
        r = rs->r[i].seg_id == id ? &rs->r[i] : NULL;
    if (r == NULL) {
        if (rs->n == rs->cap) {
            uint32_t cap = rs->cap ? 2 * rs->cap : 8;
            route_t *grown = kvs__realloc(rs->r, cap * sizeof(*grown));
            if (grown == NULL)
                return KVS_NO_MEMORY;
            rs->r = grown;
            rs->cap = cap;
        }
        r = &rs->r[rs->n++];
        route_open(c, s, deadline, r);
    }
    if (r->rc != KVS_OK)
        return r->rc;
    *t_p = r->t;
    *ep_p = r->ep;
    atomic_fetch_add(r->t == c->shm ? &c->st.shm_transfers : &c->st.tcp_transfers, 1);
    return KVS_OK;
}

/* Submits reqs[0..n) (each request's transport in ts[]) as one batch per transport and waits
 * for them; statuses land in the requests. */
static void submit_by_transport(kvs_client_t *c, kvs_xfer_req_t *reqs, kvs_transport_t **ts,
                                uint32_t n, uint64_t deadline)
{
    KVS_UNUSED(c);
    kvs__xfer_group_t g = {.sub = kvs__malloc(KVS_MAX(n, 1) * sizeof(*g.sub)),
                           .back = kvs__malloc(KVS_MAX(n, 1) * sizeof(*g.back)),
                           .tk = kvs__malloc(KVS_MAX(n, 1))};
    int rc = g.sub != NULL && g.back != NULL && g.tk != NULL ? KVS_OK : KVS_NO_MEMORY;
    if (rc == KVS_OK)
        rc = kvs__xfer_group_submit(&g, reqs, ts, n, deadline);
    if (rc == KVS_OK)
        kvs__xfer_group_wait(&g, reqs, deadline);
    for (uint32_t i = 0; rc != KVS_OK && i < n; i++)
        reqs[i].status = rc == KVS_UNSUPPORTED ? KVS_TRANSFER_FAIL : rc;
    kvs__free(g.sub);
    kvs__free(g.back);
    kvs__free(g.tk);
}

/* ---- puts ------------------------------------------------------------------------------------ */

/* A put that failed at its deadline still gets this long to revoke its placements, so that
 * their space returns at once rather than at the master's discard time (within the 100 ms a
 * call may overrun its deadline by, DESIGN §6 rule 5). */
#define REVOKE_GRACE_MS 50

/* Ends (ok) or revokes the listed keys, each naming its put (`tokens`, parallel to idx); a
 * failed PUT_END becomes the key's result. */
static void put_finish(kvs_client_t *c, call_t *k, const size_t *idx,
                       const kvs__put_token_t *tokens, uint32_t m, bool ok)
{
    if (m == 0)
        return;
    kvs__str_t *ks = kvs__malloc(m * sizeof(*ks));
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    int rc = ks ? KVS_OK : KVS_NO_MEMORY;
    for (uint32_t j = 0; rc == KVS_OK && j < m; j++)
        ks[j] = kvs__str_c(k->keys[idx[j]]);
    kvs__status_list_rsp_t sl;
    if (rc == KVS_OK)
        rc = kvs__client_keys_call(
            c, ok ? KVS_MSG_PUT_END : KVS_MSG_PUT_REVOKE, 0, m, ks, tokens, &arena, &sl, NULL,
            ok ? k->deadline
               : KVS_MAX(k->deadline, kvs__now_ns() + REVOKE_GRACE_MS * KVS_NS_PER_MS));
    if (ok) {
        /* A put whose end was not confirmed is not readable; the master revokes it in time. */
        for (uint32_t j = 0; j < m; j++)
            k->res[idx[j]] = rc != KVS_OK ? rc : sl.results[j];
    } else if (rc != KVS_OK) {
        kvs_warn("put: revoking %u failed puts failed (%s); the master discards them later", m,
                 kvs_status_str(rc));
    }
    kvs__arena_free(&arena);
    kvs__free(ks);
}

static bool name_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && strlen(s) <= KVS_MAX_NAME_LEN;
}

/* The PUT_START request for a call of `ncall` keys with config `rc_` (NULL: defaults), checked;
 * `pref` holds the preferred segments' names. Items are the caller's (put_item_group). */
static int put_start_init(kvs_client_t *c, const char *op, const kvs_replicate_config_t *rc_,
                          bool upsert, size_t ncall, kvs__str_t pref[KVS_MAX_REPLICAS],
                          kvs__put_start_req_t *ps)
{
    static const kvs_replicate_config_t defaults = {.replica_num = 1};
    if (rc_ == NULL)
        rc_ = &defaults;
    if (rc_->replica_num == 0 || rc_->replica_num > KVS_MAX_REPLICAS ||
        (unsigned)rc_->soft_pin_action > KVS_SOFT_PIN_DISABLE ||
        (rc_->preferred_segment != NULL && strlen(rc_->preferred_segment) > KVS_MAX_NAME_LEN))
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: replica_num must be 1..%u and preferred_segment at most %u bytes", op,
                         KVS_MAX_REPLICAS, KVS_MAX_NAME_LEN);
    if (rc_->npreferred_segments > KVS_MAX_REPLICAS ||
        (rc_->npreferred_segments > 0 && rc_->preferred_segments == NULL))
        return kvs__fail(KVS_INVALID_PARAMS, "%s: at most %u preferred_segments", op,
                         KVS_MAX_REPLICAS);
    for (size_t i = 0; i < rc_->npreferred_segments; i++) {
        if (!name_ok(rc_->preferred_segments[i]))
            return kvs__fail(KVS_INVALID_PARAMS, "%s: preferred_segments[%zu] must be 1..%u bytes",
                             op, i, KVS_MAX_NAME_LEN);
        pref[i] = kvs__str_c(rc_->preferred_segments[i]);
    }
    if ((rc_->ngroup_ids > 0 && rc_->group_ids == NULL) ||
        (rc_->ngroup_ids > 1 && rc_->ngroup_ids != ncall))
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: group_ids must name one group or one per key (%zu given for %zu "
                         "keys)",
                         op, rc_->ngroup_ids, ncall);
    for (size_t i = 0; i < rc_->ngroup_ids; i++) {
        const char *g = rc_->group_ids[i];
        if (!name_ok(g) || kvs__key_check(g, strlen(g)) != KVS_OK)
            return kvs__fail(KVS_INVALID_PARAMS, "%s: group_ids[%zu] must be 1..%u bytes", op, i,
                             KVS_MAX_NAME_LEN);
    }
    /* A version 3 master would drop these fields and place or keep the objects otherwise. */
    bool v4 = rc_->ngroup_ids > 0 || rc_->npreferred_segments > 0 || rc_->with_hard_pin ||
              rc_->soft_pin_ttl_set || rc_->soft_pin_action != KVS_SOFT_PIN_PRESERVE;
    if (v4 && kvs__rpc_version(c->rpc) < 4)
        return kvs__fail(KVS_UNSUPPORTED,
                         "%s: groups, preferred_segments and pins need a master of protocol "
                         "version 4 or later (this one speaks %u)",
                         op, kvs__rpc_version(c->rpc));
    *ps = (kvs__put_start_req_t){
        .node = kvs__str_c(c->node),
        .replica_num = rc_->replica_num,
        .preferred_segment = kvs__str_c(rc_->preferred_segment ? rc_->preferred_segment : ""),
        .flags = (rc_->prefer_alloc_in_same_node ? KVS_PUT_FLAG_SAME_NODE : 0) |
                 (upsert ? KVS_PUT_FLAG_UPSERT : 0) |
                 (rc_->with_hard_pin ? KVS_PUT_FLAG_HARD_PIN : 0) |
                 (rc_->soft_pin_ttl_set ? KVS_PUT_FLAG_PIN_TTL : 0),
        .soft_pin_action = (uint32_t)rc_->soft_pin_action,
        .soft_pin_ttl_ms = rc_->soft_pin_ttl_ms,
        .npreferred_segments = (uint32_t)rc_->npreferred_segments,
        .preferred_segments = pref,
    };
    return KVS_OK;
}

/* The group of the call's key i (checked by put_start_init). */
static kvs__str_t put_item_group(const kvs_replicate_config_t *rc_, size_t i)
{
    if (rc_ == NULL || rc_->ngroup_ids == 0)
        return (kvs__str_t){"", 0};
    return kvs__str_c(rc_->group_ids[rc_->ngroup_ids == 1 ? 0 : i]);
}

/* One put call's working state, from PUT_START to the last end or revoke. */
typedef struct {
    kvs__str_t *ks; /* usable keys, as wire strings; entry j is call key map[j] */
    size_t *map;
    uint32_t m;
    kvs__put_item_t *items;
    kvs__placement_rsp_t pr;
    kvs__arena_t arena;
    kvs_xfer_req_t *reqs; /* one write per replica */
    kvs_transport_t **req_t;
    size_t *req_key, *done;
    kvs__put_token_t *done_tok;
    routes_t routes;
} put_t;

static void put_free(put_t *p)
{
    routes_free(&p->routes);
    kvs__arena_free(&p->arena);
    kvs__free(p->done);
    kvs__free(p->done_tok);
    kvs__free(p->req_key);
    kvs__free(p->req_t);
    kvs__free(p->reqs);
    kvs__free(p->items);
    kvs__free(p->ks);
    kvs__free(p->map);
}

/* PUT_START for every usable key: the master's placement of each. */
static int put_place(kvs_client_t *c, call_t *k, const kvs_replicate_config_t *rc_,
                     kvs__put_start_req_t *ps, put_t *p)
{
    p->items = kvs__malloc(p->m * sizeof(*p->items));
    if (p->items == NULL)
        return kvs__fail(KVS_NO_MEMORY, "put: out of memory");
    for (uint32_t j = 0; j < p->m; j++)
        p->items[j] = (kvs__put_item_t){
            .key = p->ks[j], .size = k->total[p->map[j]], .group = put_item_group(rc_, p->map[j])};
    ps->nitems = p->m;
    ps->items = p->items;
    int rc = kvs__client_put_start(c, ps, &p->arena, &p->pr, k->deadline);
    if (rc != KVS_OK)
        return kvs__fail(rc, "put: the master refused the batch: %s", kvs_status_str(rc));
    uint32_t nreq = 0;
    for (uint32_t j = 0; j < p->m; j++)
        nreq += p->pr.objs[j].status == KVS_OK ? p->pr.objs[j].nreps : 0;
    p->reqs = kvs__calloc(KVS_MAX(nreq, 1), sizeof(*p->reqs));
    p->req_t = kvs__malloc(KVS_MAX(nreq, 1) * sizeof(*p->req_t));
    p->req_key = kvs__malloc(KVS_MAX(nreq, 1) * sizeof(*p->req_key));
    p->done = kvs__malloc(p->m * sizeof(*p->done));
    p->done_tok = kvs__malloc(p->m * sizeof(*p->done_tok));
    if (p->reqs == NULL || p->req_t == NULL || p->req_key == NULL || p->done == NULL ||
        p->done_tok == NULL) /* the placements stay pending until the master discards them */
        return kvs__fail(KVS_NO_MEMORY, "put: out of memory");
    return KVS_OK;
}

/* One write per replica of every placed key, each on its route; returns the writes. A key whose
 * replica has no route fails. */
static uint32_t put_route(kvs_client_t *c, call_t *k, put_t *p)
{
    uint32_t r = 0;
    for (uint32_t j = 0; j < p->m; j++) {
        const kvs__obj_desc_t *d = &p->pr.objs[j];
        size_t i = p->map[j];
        if (d->status != KVS_OK) {
            k->res[i] = d->status;
            continue;
        }
        for (uint32_t q = 0; q < d->nreps; q++) {
            kvs_endpoint_t *ep = NULL;
            int erc = route_for(c, &p->routes, seg_find(&p->pr, d->reps[q].segment_id), k->deadline,
                                &p->req_t[r], &ep);
            if (erc != KVS_OK) {
                k->res[i] = erc;
                continue;
            }
            p->reqs[r] = (kvs_xfer_req_t){.op = KVS_XFER_WRITE,
                                          .ep = ep,
                                          .segment_id = d->reps[q].segment_id,
                                          .offset = d->reps[q].offset,
                                          .length = k->total[i],
                                          .iov = &k->iov[k->first[i]],
                                          .iovcnt = k->cnt[i],
                                          .status = KVS_OK,
                                          .gpu = gpu_of(k->domain[i]),
                                          .token = d->token,
                                          .cap = d->reps[q].cap,
                                          .cap_epoch = d->cap_epoch};
            p->req_key[r++] = i;
        }
    }
    return r;
}

/* Every key that got a placement is either ended (all its writes landed) or revoked, naming its
 * put. */
static void put_settle(kvs_client_t *c, call_t *k, put_t *p)
{
    uint32_t nok = 0, nbad = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t j = 0; j < p->m; j++) {
            if (p->pr.objs[j].status != KVS_OK || (k->res[p->map[j]] == 0) != (pass == 0))
                continue;
            uint32_t at = pass == 0 ? nok++ : nok + nbad++;
            p->done_tok[at] = (kvs__put_token_t){p->pr.objs[j].token};
            p->done[at] = p->map[j];
        }
    }
    put_finish(c, k, p->done, p->done_tok, nok, true);
    put_finish(c, k, p->done + nok, p->done_tok + nok, nbad, false);
}

/* A put: place -> route -> submit -> settle. */
static int put_call(kvs_client_t *c, call_t *k, const kvs_replicate_config_t *rc_)
{
    kvs__str_t pref[KVS_MAX_REPLICAS];
    kvs__put_start_req_t ps;
    int rc = put_start_init(c, "put", rc_, k->upsert, k->n, pref, &ps);
    if (rc != KVS_OK)
        return rc;
    put_t p = {0};
    kvs__arena_init(&p.arena);
    if (usable_keys(k, &p.ks, &p.map, &p.m) != KVS_OK)
        rc = kvs__fail(KVS_NO_MEMORY, "put: out of memory");
    if (rc == KVS_OK && p.m > 0)
        rc = put_place(c, k, rc_, &ps, &p);
    if (rc == KVS_OK && p.m > 0) {
        uint32_t r = put_route(c, k, &p);
        if (r > 0)
            submit_by_transport(c, p.reqs, p.req_t, r, k->deadline);
        for (uint32_t q = 0; q < r; q++) {
            int st = p.reqs[q].status;
            if (st != KVS_OK && k->res[p.req_key[q]] == 0)
                k->res[p.req_key[q]] = st == KVS_TIMED_OUT ? st : KVS_TRANSFER_FAIL;
        }
        put_settle(c, k, &p);
    }
    put_free(&p);
    return rc;
}

void kvs_replicate_config_init(kvs_replicate_config_t *rc)
{
    if (rc != NULL)
        *rc = (kvs_replicate_config_t){.replica_num = 1};
}

/* Runs a put call and accounts for it. */
static int put_run(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                   const kvs_buf_t *const bufs[], const size_t nbufs[], bool registered,
                   const kvs_replicate_config_t *rcfg, bool upsert, int results[])
{
    if (results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: results is NULL", op);
    /* A version 3 master would take the flag for a plain put (and answer -705). */
    if (upsert && c != NULL && kvs__rpc_version(c->rpc) < 4)
        return kvs__fail(KVS_UNSUPPORTED,
                         "%s: the master speaks protocol version %u, which has "
                         "no upsert (4 or later is needed)",
                         op, kvs__rpc_version(c->rpc));
    uint64_t t0 = kvs__now_ns();
    call_t k;
    int rc = call_init(c, op, n, keys, bufs, nbufs, registered, &k);
    if (rc != KVS_OK)
        return rc;
    k.deadline = t0 + c->transfer_timeout_ms * KVS_NS_PER_MS;
    k.upsert = upsert;
    kvs__client_enter(c);
    kvs__client_sweep(c, k.deadline);
    rc = put_call(c, &k, rcfg);
    if (rc == KVS_OK && upsert) {
        for (size_t i = 0; i < n; i++) {
            int ok = k.res[i] == 0 ? KVS_OK : KVS_INTERNAL_ERROR;
            kvs__sessions_forget(c, 1, &keys[i], &ok);
        }
    }
    uint64_t bytes = 0, failed = 0;
    if (rc == KVS_OK) {
        for (size_t i = 0; i < n; i++) {
            results[i] = (int)k.res[i];
            if (k.res[i] == 0)
                bytes += k.total[i];
            else
                failed++;
        }
    }
    atomic_fetch_add(&c->st.put_calls, 1);
    atomic_fetch_add(&c->st.put_keys, n);
    atomic_fetch_add(&c->st.put_bytes, bytes);
    atomic_fetch_add(&c->st.put_failed_keys, rc == KVS_OK ? failed : n);
    kvs__hist_add(&c->st.put_latency, kvs__now_ns() - t0);
    call_free(c, &k);
    kvs__client_leave(c);
    return rc;
}

/* A per-key pointer table for calls that take one buffer per key. */
static int one_buf_each(size_t n, const kvs_buf_t bufs[], const kvs_buf_t ***ptrs_p,
                        size_t **counts_p)
{
    if (n == 0 || n > KVS_MAX_BATCH || bufs == NULL)
        return KVS_INVALID_PARAMS;
    const kvs_buf_t **ptrs = kvs__malloc(n * sizeof(*ptrs));
    size_t *counts = kvs__malloc(n * sizeof(*counts));
    if (ptrs == NULL || counts == NULL) {
        kvs__free(ptrs);
        kvs__free(counts);
        return KVS_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        ptrs[i] = &bufs[i];
        counts[i] = 1;
    }
    *ptrs_p = ptrs;
    *counts_p = counts;
    return KVS_OK;
}

static int put_single(kvs_client_t *c, const char *op, const char *key, const void *data,
                      size_t size, bool registered, const kvs_replicate_config_t *rc, bool upsert)
{
    kvs_buf_t b = {(void *)data, size};
    const kvs_buf_t *bp = &b;
    size_t one = 1;
    int result = 0;
    int rc_ = put_run(c, op, 1, &key, &bp, &one, registered, rc, upsert, &result);
    if (rc_ != KVS_OK)
        return rc_;
    /* Refused arguments were explained where they were found. */
    if (result != KVS_OK && result != KVS_INVALID_PARAMS)
        return kvs__fail(result, "%s '%s': %s", op, key, kvs_status_str(result));
    return result;
}

int kvs_client_put(kvs_client_t *c, const char *key, const void *data, size_t size,
                   const kvs_replicate_config_t *rc)
{
    return put_single(c, "put", key, data, size, false, rc, false);
}

int kvs_client_put_from(kvs_client_t *c, const char *key, const void *buf, size_t size,
                        const kvs_replicate_config_t *rc)
{
    return put_single(c, "put_from", key, buf, size, true, rc, false);
}

static int batch_single_put(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                            const kvs_buf_t bufs[], bool registered,
                            const kvs_replicate_config_t *rc, bool upsert, int results[])
{
    const kvs_buf_t **ptrs;
    size_t *counts;
    int r = one_buf_each(n, bufs, &ptrs, &counts);
    if (r != KVS_OK)
        return kvs__fail(r, "%s: 1..%u keys with buffers are required", op, KVS_MAX_BATCH);
    r = put_run(c, op, n, keys, ptrs, counts, registered, rc, upsert, results);
    kvs__free(ptrs);
    kvs__free(counts);
    return r;
}

int kvs_client_batch_put_from(kvs_client_t *c, size_t n, const char *const keys[],
                              const kvs_buf_t bufs[], const kvs_replicate_config_t *rc,
                              int results[])
{
    return batch_single_put(c, "batch_put_from", n, keys, bufs, true, rc, false, results);
}

int kvs_client_batch_put(kvs_client_t *c, size_t n, const char *const keys[],
                         const kvs_buf_t bufs[], const kvs_replicate_config_t *rc, int results[])
{
    return batch_single_put(c, "batch_put", n, keys, bufs, false, rc, false, results);
}

int kvs_client_batch_upsert(kvs_client_t *c, size_t n, const char *const keys[],
                            const kvs_buf_t bufs[], const kvs_replicate_config_t *rc, int results[])
{
    return batch_single_put(c, "batch_upsert", n, keys, bufs, false, rc, true, results);
}

int kvs_client_batch_put_multi(kvs_client_t *c, size_t n, const char *const keys[],
                               const kvs_buf_t *const bufs[], const size_t nbufs[],
                               const kvs_replicate_config_t *rc, bool upsert, int results[])
{
    return put_run(c, upsert ? "batch_upsert_multi" : "batch_put_multi", n, keys, bufs, nbufs,
                   false, rc, upsert, results);
}

int kvs_client_batch_put_from_multi(kvs_client_t *c, size_t n, const char *const keys[],
                                    const kvs_buf_t *const bufs[], const size_t nbufs[],
                                    const kvs_replicate_config_t *rc, int results[])
{
    return put_run(c, "batch_put_from_multi", n, keys, bufs, nbufs, true, rc, false, results);
}

int kvs_client_upsert(kvs_client_t *c, const char *key, const void *data, size_t size,
                      const kvs_replicate_config_t *rc)
{
    return put_single(c, "upsert", key, data, size, false, rc, true);
}

int kvs_client_upsert_from(kvs_client_t *c, const char *key, const void *buf, size_t size,
                           const kvs_replicate_config_t *rc)
{
    return put_single(c, "upsert_from", key, buf, size, true, rc, true);
}

int kvs_client_batch_upsert_from(kvs_client_t *c, size_t n, const char *const keys[],
                                 const kvs_buf_t bufs[], const kvs_replicate_config_t *rc,
                                 int results[])
{
    return batch_single_put(c, "batch_upsert_from", n, keys, bufs, true, rc, true, results);
}

int kvs_client_batch_upsert_from_multi(kvs_client_t *c, size_t n, const char *const keys[],
                                       const kvs_buf_t *const bufs[], const size_t nbufs[],
                                       const kvs_replicate_config_t *rc, int results[])
{
    return put_run(c, "batch_upsert_from_multi", n, keys, bufs, nbufs, true, rc, true, results);
}

/* ---- reads ----------------------------------------------------------------------------------- */

/* One key's read, kept apart from kvs_xfer_req_t so that grouped mode can sort them. */
typedef struct {
    kvs_transport_t *t;
    kvs_endpoint_t *ep;
    size_t key;     /* in the call */
    uint32_t entry; /* in the lookup */
    uint64_t segment_id, offset, size;
} read_slot_t;

static int cmp_slot_ep(const void *a, const void *b)
{
    const read_slot_t *x = a, *y = b;
    if (x->ep != y->ep)
        return (uintptr_t)x->ep < (uintptr_t)y->ep ? -1 : 1;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The read is over (every transfer has completed or been cancelled): the leases its lookup
 * took go back with the next request. */
static void release_leases(kvs_client_t *c, const kvs__placement_rsp_t *pr, const kvs__str_t *ks,
                           uint32_t m)
{
    uint64_t *tokens = kvs__malloc(KVS_MAX(m, 1) * sizeof(*tokens)); /* lease ids */
    if (tokens == NULL)
        return; /* the leases end by expiry */
    for (uint32_t j = 0; j < m; j++)
        tokens[j] = pr->objs[j].status == KVS_OK ? pr->objs[j].lease_id : 0;
    kvs__client_release_later(c, m, ks, tokens);
    kvs__free(tokens);
}

/* The order in which key `d`'s replicas are tried: those on this host first when asked, else
 * the master's order. Writes up to KVS_MAX_REPLICAS indices into order[]; returns how many. */
static uint32_t replica_order(kvs_client_t *c, const kvs__placement_rsp_t *pr,
                              const kvs__obj_desc_t *d, bool same_node, uint8_t *order)
{
    uint32_t n = 0;
    for (int pass = same_node ? 0 : 1; pass < 2; pass++) {
        for (uint32_t q = 0; q < d->nreps && n < KVS_MAX_REPLICAS; q++) {
            const kvs__seg_info_t *s = seg_find(pr, d->reps[q].segment_id);
            bool local = s != NULL && kvs__str_eq(s->node, kvs__str_c(c->node));
            if (pass == 1 && same_node && local)
                continue; /* tried in the first pass */
            if (pass == 0 && !local)
                continue;
            order[n++] = (uint8_t)q;
        }
    }
    return n;
}

/* Key i's destination as the staging planner takes it (its source comes from its slot). */
static kvs__staged_key_t staged_dest(const call_t *k, size_t i)
{
    kvs__staged_key_t d = {.size = k->total[i], .domain = k->domain[i], .status = KVS_OK};
    if (k->layout != NULL && k->sliced) {
        d.pages = (kvs__pt_pages_t){k->ids + k->ids_first[i], k->npages[i]};
    } else {
        d.iov = &k->iov[k->first[i]];
        d.iovcnt = k->cnt[i];
    }
    return d;
}

/* Slot sl's source in staged key *d; a slot without a transport leaves the key absent. */
static void staged_source(kvs__staged_key_t *d, const read_slot_t *sl, uint64_t lease_until)
{
    d->t = sl->t;
    d->ep = sl->ep;
    d->segment_id = sl->segment_id;
    d->offset = sl->offset;
    d->size = sl->t != NULL ? sl->size : d->size;
    d->lease_until_ns = lease_until;
    d->status = sl->t != NULL ? KVS_OK : KVS_UNSUPPORTED; /* absent: never OK */
}

/* The staged path for the keys of `slots` (call order). KVS_UNSUPPORTED: fall back, nothing was
 * submitted; KVS_OK: the keys' results are in st[]; else a failure of the whole call. */
static int read_staged(kvs_client_t *c, call_t *k, const read_slot_t *slots, uint32_t ns,
                       const uint64_t *lease_until, int *st, uint64_t deadline)
{
    kvs__staged_key_t *sk = kvs__malloc(ns * sizeof(*sk));
    if (sk == NULL)
        return kvs__fail(KVS_NO_MEMORY, "read: out of memory");
    for (uint32_t s = 0; s < ns; s++) {
        sk[s] = staged_dest(k, slots[s].key);
        staged_source(&sk[s], &slots[s], lease_until[slots[s].key]);
    }
    int rc = kvs__staging_read(c->staging, sk, ns, k->sliced ? k->layout : NULL, NULL, deadline);
    if (rc == KVS_OK) {
        for (uint32_t s = 0; s < ns; s++)
            st[s] = sk[s].status;
    }
    kvs__free(sk);
    return rc;
}

/* Direct (one submission per key) or grouped (one per owner) transfers of `slots`, all in flight
 * together; statuses into st[] (slot order). */
static void read_direct(kvs_client_t *c, call_t *k, read_slot_t *slots, uint32_t ns, bool grouped,
                        kvs_xfer_req_t *reqs, kvs_batch_t **batches, kvs_transport_t **batch_t,
                        int *st, uint64_t deadline)
{
    if (grouped)
        qsort(slots, ns, sizeof(*slots), cmp_slot_ep);
    for (uint32_t s = 0; s < ns; s++) {
        const read_slot_t *sl = &slots[s];
        reqs[s] = (kvs_xfer_req_t){.op = KVS_XFER_READ,
                                   .ep = sl->ep,
                                   .segment_id = sl->segment_id,
                                   .offset = sl->offset,
                                   .length = sl->size,
                                   .iov = &k->iov[k->first[sl->key]],
                                   .iovcnt = k->cnt[sl->key],
                                   .status = KVS_OK,
                                   .gpu = gpu_of(k->domain[sl->key])};
    }
    uint32_t nb = 0;
    for (uint32_t s = 0; s < ns;) {
        uint32_t e = s + 1;
        while (grouped && e < ns && slots[e].ep == slots[s].ep)
            e++;
        kvs_transport_t *t = slots[s].t;
        int src = t->ops->submit(t, &reqs[s], e - s, deadline, &batches[nb]);
        if (src == KVS_OK) {
            batch_t[nb++] = t;
        } else {
            for (uint32_t q = s; q < e; q++)
                reqs[q].status = src;
        }
        s = e;
    }
    atomic_fetch_add(&c->st.get_submissions, nb);
    for (uint32_t b = 0; b < nb; b++)
        batch_t[b]->ops->wait(batch_t[b], batches[b], deadline);
    for (uint32_t s = 0; s < ns; s++)
        st[s] = reqs[s].status;
}

/* Whether a read that failed with `st` may be tried on another replica: failures of the owner or
 * the path to it, a round's time-out included (a stopped owner). A lease that ran out ends the
 * key; so do bad arguments and local shortages, which another replica would not cure. */
static bool read_retryable(int st)
{
    return st != KVS_OK && st != KVS_LEASE_EXPIRED && st != KVS_INVALID_PARAMS &&
           st != KVS_NO_MEMORY;
}

static int call_fragments(call_t *k);

/* ---- the read pipeline: validate (call_init*) -> lookup -> check -> route -> submit ->
 * complete, in rounds until every key has its result ----------------------------------------- */

/* One read call's working state, from the lookup to the last round. Per lookup entry j:
 * tried[2j] replicas tried so far, tried[2j + 1] replicas in order[j * KVS_MAX_REPLICAS ..]. */
typedef struct {
    kvs__str_t *ks; /* usable keys, as wire strings */
    size_t *map;    /* entry j is call key map[j] */
    uint32_t m;
    kvs__placement_rsp_t pr;
    kvs__arena_t arena;
    bool looked_up, from_session;
    void **sess_held; /* the session entries this read uses, until it is over */
    uint64_t *sess_until, *lease_until, t_lookup;
    kvs_xfer_req_t *reqs;
    read_slot_t *slots;
    kvs_batch_t **batches;
    kvs_transport_t **batch_t;
    int *st;
    uint8_t *order, *tried;
    routes_t routes;
    uint32_t pending;
    bool larger; /* a key's fragments hold more than its object: the call is not staged */
    bool staged; /* a round staged */
    /* A pipelined read (read_lead): entries [0, m1) are looked up first, the rest while the
     * first fill runs (m1 == m once every entry is); its first round's staged keys, one per
     * entry, and the second lookup's answer. */
    uint32_t m1;
    kvs__staged_key_t *sk;
    kvs__arena_t arena2;
} read_t;

static void read_free(kvs_client_t *c, read_t *r)
{
    routes_free(&r->routes);
    if (r->looked_up) /* the entries looked up so far: all, or a pipelined read's lead */
        release_leases(c, &r->pr, r->ks, r->pr.nobjs);
    kvs__sessions_done(c, r->m, r->sess_held);
    kvs__arena_free(&r->arena);
    kvs__arena_free(&r->arena2);
    kvs__free(r->sk);
    kvs__free(r->lease_until);
    kvs__free(r->sess_until);
    kvs__free(r->batches);
    kvs__free(r->batch_t);
    kvs__free(r->slots);
    kvs__free(r->reqs);
    kvs__free(r->st);
    kvs__free(r->order);
    kvs__free(r->tried);
    kvs__free(r->ks);
    kvs__free(r->map);
}

static uint64_t key_frags(const call_t *k, size_t i)
{
    return k->layout != NULL ? (uint64_t)k->npages[i] * k->layout->nregions : k->cnt[i];
}

/* Slots [0, ns)'s transports and owners in the shape: distinct endpoints, the previous 64
 * compared; slots without a transport (a pipelined first round's missing keys) left out. */
static void shape_routes(const read_t *r, uint32_t ns, kvs__read_shape_t *sh)
{
    for (uint32_t s = 0; s < ns; s++) {
        const read_slot_t *sl = &r->slots[s];
        if (sl->t == NULL)
            continue;
        sh->cheap_submit &= (sl->t->ops->caps & KVS_TRANSPORT_CAP_CHEAP_SUBMIT) != 0;
        bool seen = false;
        for (uint32_t q = s; q-- > 0 && q + 64 > s && !seen;)
            seen = r->slots[q].t != NULL && r->slots[q].ep == sl->ep;
        sh->owners += !seen;
    }
}

/* The first round's shape, for the adaptive mode. */
static void read_shape(const call_t *k, const read_t *r, uint32_t ns, kvs__read_shape_t *sh)
{
    *sh = (kvs__read_shape_t){.keys = ns, .cheap_submit = true};
    for (uint32_t s = 0; s < ns; s++) {
        sh->bytes += r->slots[s].size;
        sh->frags += key_frags(k, r->slots[s].key);
    }
    shape_routes(r, ns, sh);
}

/* A pipelined read's shape before the rest of its lookup: every entry's bytes and fragments
 * from its destination; transports and owners from the lead's routes once they are known
 * (`routed`), before that shm when the client may use it, and one owner. */
static void lead_shape(const kvs_client_t *c, const call_t *k, const read_t *r, bool routed,
                       kvs__read_shape_t *sh)
{
    *sh = (kvs__read_shape_t){
        .keys = r->m, .cheap_submit = routed || c->shm != NULL, .owners = routed ? 0 : 1};
    for (uint32_t j = 0; j < r->m; j++) {
        sh->bytes += k->total[r->map[j]];
        sh->frags += key_frags(k, r->map[j]);
    }
    if (routed)
        shape_routes(r, r->m1, sh);
    if (sh->owners == 0) { /* no key of the lead is there: as before its lookup */
        sh->cheap_submit = c->shm != NULL;
        sh->owners = 1;
    }
}

/* A pipelined read looks up its first fill's keys, starts that fill, and looks up the rest
 * while the fill's copies run, which takes the lookup of all but the first fill off the read's
 * serial path (docs/store_bench.md). Its eligibility is the whole call's, from destinations
 * known before any lookup: only calls that must stage (MC_STORE_GPU_STAGING=1), in exact mode,
 * whose destinations may all stage, and whose first fill is large enough to hide the rest's
 * lookup (LEAD_BYTES_PER_LATE_KEY of it per key looked up later: a lookup costs about 0.5 us a
 * key on the H200, the time a 25 KiB copy takes). */
#define LEAD_BYTES_PER_LATE_KEY (64u << 10)

/* The entries to look up first: r->m unless the read is pipelined (then r->sk holds every
 * entry's destination). */
static uint32_t read_lead(kvs_client_t *c, const call_t *k, read_t *r, bool exact)
{
    if (c->staging == NULL || !exact || k->src_off != NULL || r->m < 2)
        return r->m;
    r->sk = kvs__malloc((size_t)r->m * sizeof(*r->sk));
    if (r->sk == NULL)
        return r->m; /* not pipelined; the read goes on */
    for (uint32_t j = 0; j < r->m; j++)
        r->sk[j] = staged_dest(k, r->map[j]);
    uint32_t lead = kvs__staging_lead(c->staging, r->sk, r->m, c->shm != NULL);
    uint64_t lead_bytes = 0;
    for (uint32_t j = 0; j < lead; j++)
        lead_bytes += r->sk[j].size;
    kvs__read_shape_t sh;
    if (kvs__staging_policy(c->staging) != NULL) /* the adaptive mode: if it would stage */
        lead_shape(c, k, r, false, &sh);
    if (lead == 0 || lead >= r->m ||
        lead_bytes < (uint64_t)(r->m - lead) * LEAD_BYTES_PER_LATE_KEY ||
        (kvs__staging_policy(c->staging) != NULL &&
         !kvs__staging_would_stage(c->staging, k->domain[r->map[0]], &sh))) {
        kvs__free(r->sk);
        r->sk = NULL;
        return r->m;
    }
    return lead;
}

/* One LOOKUP of entries [j0, j1) into *pr, its answer in *arena; timed. A pipelined read's
 * first one leaves the pending lease releases (the previous reads', about 0.4 us each on the
 * master) to its second. */
static int lookup_part(kvs_client_t *c, const call_t *k, const read_t *r, uint32_t j0, uint32_t j1,
                       kvs__arena_t *arena, kvs__placement_rsp_t *pr)
{
    uint64_t t = kvs__now_ns();
    uint32_t flags = j1 < r->m ? KVS__CALL_KEEP_RELEASES : 0;
    int rc = kvs__client_keys_call(c, KVS_MSG_LOOKUP, flags, j1 - j0, r->ks + j0, NULL, arena, NULL,
                                   pr, k->deadline);
    atomic_fetch_add(&c->st.get_lookup_ns, kvs__now_ns() - t);
    return rc;
}

/* The placement of every usable key: from live read sessions when they hold them all (their
 * leases stay the sessions'), else one LOOKUP (of a pipelined read's lead only). Leases run
 * from before it was sent. */
static int read_lookup(kvs_client_t *c, call_t *k, read_t *r, bool exact)
{
    r->t_lookup = kvs__now_ns();
    r->m1 = r->m;
    r->sess_until = kvs__malloc((size_t)r->m * sizeof(*r->sess_until));
    if (r->sess_until == NULL)
        return kvs__fail(KVS_NO_MEMORY, "read: out of memory");
    r->from_session = kvs__sessions_placement(c, r->m, r->ks, &r->arena, &r->pr, r->sess_until,
                                              &r->sess_held) == KVS_OK;
    if (r->from_session)
        return KVS_OK;
    kvs__arena_free(&r->arena);
    kvs__arena_init(&r->arena);
    r->m1 = read_lead(c, k, r, exact);
    for (uint32_t j = r->m1; j < r->m; j++)
        k->res[r->map[j]] = KVS_TRANSFER_FAIL; /* never success before its lookup is checked */
    r->t_lookup = kvs__now_ns();
    int rc = lookup_part(c, k, r, 0, r->m1, &r->arena, &r->pr);
    r->looked_up = rc == KVS_OK;
    return rc == KVS_OK ? rc : kvs__fail(rc, "read: lookup failed: %s", kvs_status_str(rc));
}

static int read_alloc(const call_t *k, read_t *r)
{
    uint32_t m = r->m;
    r->reqs = kvs__calloc(m, sizeof(*r->reqs));
    r->slots = kvs__malloc(m * sizeof(*r->slots));
    r->batches = kvs__calloc(m, sizeof(*r->batches));
    r->batch_t = kvs__calloc(m, sizeof(*r->batch_t));
    r->lease_until = kvs__malloc(k->n * sizeof(*r->lease_until));
    r->st = kvs__malloc(m * sizeof(*r->st));
    r->order = kvs__malloc((size_t)m * KVS_MAX_REPLICAS);
    r->tried = kvs__calloc(m, 2);
    if (r->reqs == NULL || r->slots == NULL || r->batches == NULL || r->batch_t == NULL ||
        r->lease_until == NULL || r->st == NULL || r->order == NULL || r->tried == NULL)
        return kvs__fail(KVS_NO_MEMORY, "read: out of memory");
    return KVS_OK;
}

/* Whether key i's destination fits object d (an exact cover, room for it, or the asked range);
 * else the key fails with the reason. */
static bool read_fits(call_t *k, size_t i, const kvs__obj_desc_t *d, bool exact)
{
    bool bad = k->src_off != NULL ? k->src_off[i] > d->size || k->total[i] > d->size - k->src_off[i]
               : exact && !k->allow_larger ? k->total[i] != d->size
                                           : k->total[i] < d->size;
    if (!bad)
        return true;
    if (k->src_off != NULL)
        k->res[i] = kvs__fail(
            KVS_INVALID_PARAMS, "read '%s': bytes %llu..%llu are outside the %llu-byte object",
            k->keys[i], (unsigned long long)k->src_off[i],
            (unsigned long long)(k->src_off[i] + k->total[i]), (unsigned long long)d->size);
    else
        k->res[i] =
            kvs__fail(KVS_INVALID_PARAMS, "read '%s': the buffers hold %llu bytes, the object %llu",
                      k->keys[i], (unsigned long long)k->total[i], (unsigned long long)d->size);
    return false;
}

/* Cuts key i's larger destination to the object's size (exact calls already match it). */
static int read_cut(call_t *k, size_t i, uint64_t size)
{
    if (k->iov == NULL) {
        int rc = call_fragments(k);
        if (rc != KVS_OK)
            return rc;
    }
    uint64_t left = size;
    uint32_t used = 0;
    struct iovec *iov = &k->iov[k->first[i]];
    while (left > 0) {
        if (iov[used].iov_len > left)
            iov[used].iov_len = (size_t)left;
        left -= iov[used++].iov_len;
    }
    k->cnt[i] = used;
    k->total[i] = size;
    return KVS_OK;
}

/* Everything that can fail a key without I/O, decided before the first transfer: the lookup's
 * answer, the destination's size, a replica to read. The rest become pending (res 1). */
static int read_check(kvs_client_t *c, call_t *k, read_t *r, bool exact, bool grouped, uint32_t j0,
                      uint32_t j1, uint64_t t_lookup)
{
    bool larger = false;
    for (uint32_t j = j0; j < j1; j++) {
        const kvs__obj_desc_t *d = &r->pr.objs[j];
        size_t i = r->map[j];
        r->tried[2 * j] = r->tried[2 * j + 1] = 0;
        if (d->status != KVS_OK) {
            k->res[i] = d->status;
            continue;
        }
        if (!read_fits(k, i, d, exact))
            continue;
        r->tried[2 * j + 1] =
            (uint8_t)replica_order(c, &r->pr, d, grouped, &r->order[j * KVS_MAX_REPLICAS]);
        if (r->tried[2 * j + 1] == 0) {
            k->res[i] = KVS_OBJECT_NOT_FOUND; /* every replica's owner is gone */
            continue;
        }
        if (k->src_off == NULL && (!exact || k->total[i] > d->size)) {
            larger |= exact; /* an exact-mode call with more room than the object */
            int rc = read_cut(k, i, d->size);
            if (rc != KVS_OK)
                return rc;
        }
        r->lease_until[i] =
            r->from_session ? r->sess_until[j] : t_lookup + d->lease_ms * KVS_NS_PER_MS;
        k->res[i] = 1; /* pending: positive never reaches a caller */
        r->pending++;
    }
    if (larger && !r->larger)
        atomic_fetch_add(&c->st.fallback_not_exact, 1);
    r->larger |= larger;
    return KVS_OK;
}

/* This round's slot per pending key of entries [j0, j1): its next replica that has a route; a
 * key with none left fails. `aligned` (a pipelined read's first round): entry j's slot is
 * slots[j], without a transport when the key has no read in this round. Returns the slots (in
 * aligned mode, j1). */
static uint32_t read_route(kvs_client_t *c, call_t *k, read_t *r, uint32_t j0, uint32_t j1,
                           bool aligned)
{
    uint32_t ns = aligned ? j0 : 0;
    for (uint32_t j = j0; j < j1; j++) {
        size_t i = r->map[j];
        if (aligned)
            r->slots[j] = (read_slot_t){.key = i, .entry = j};
        if (k->res[i] != 1)
            continue;
        const kvs__obj_desc_t *d = &r->pr.objs[j];
        int why = KVS_TRANSFER_FAIL;
        while (why != KVS_OK && r->tried[2 * j] < r->tried[2 * j + 1]) {
            const kvs__replica_t *rep =
                &d->reps[r->order[j * KVS_MAX_REPLICAS + r->tried[2 * j]++]];
            kvs_transport_t *t = NULL;
            kvs_endpoint_t *ep = NULL;
            why = route_for(c, &r->routes, seg_find(&r->pr, rep->segment_id), k->deadline, &t, &ep);
            if (why == KVS_OK)
                r->slots[aligned ? j : ns++] =
                    (read_slot_t){t,
                                  ep,
                                  i,
                                  j,
                                  rep->segment_id,
                                  rep->offset + (k->src_off != NULL ? k->src_off[i] : 0),
                                  k->src_off != NULL ? k->total[i] : d->size};
        }
        if (why != KVS_OK) {
            k->res[i] = why == KVS_TIMED_OUT || why == KVS_NO_MEMORY ? why : KVS_TRANSFER_FAIL;
            r->pending--;
        }
    }
    return aligned ? j1 : ns;
}

/* A round in which every key has another replica to go to gets half of what is left, so that a
 * stopped owner (which fails by time-out only) leaves time for the next replica; otherwise the
 * round has the call's deadline. */
static uint64_t round_deadline(const call_t *k, const read_t *r, uint32_t ns)
{
    bool spare = true, any = false; /* slots without a transport (no read) do not count */
    for (uint32_t s = 0; s < ns && spare; s++) {
        if (r->slots[s].t == NULL)
            continue;
        any = true;
        spare = r->tried[2 * r->slots[s].entry] < r->tried[2 * r->slots[s].entry + 1];
    }
    spare &= any;
    return spare ? route_deadline(k->deadline) : k->deadline;
}

/* The round's mode: staged when the call may stage (MC_STORE_GPU_STAGING=1), or as the
 * adaptive policy chooses on the first round (later rounds keep that choice); else direct or
 * grouped as the caller asked. */
static kvs__read_mode_t read_mode(kvs_client_t *c, call_t *k, const read_t *r, uint32_t ns,
                                  bool can_stage, bool grouped)
{
    kvs__read_mode_t asked = grouped ? KVS_READ_GROUPED : KVS_READ_DIRECT;
    if (c->staging == NULL)
        return asked;
    if (kvs__staging_policy(c->staging) == NULL)
        return can_stage ? KVS_READ_STAGED : asked;
    if (k->mode_used >= 0) /* never staged where the call may not stage (an exact cover) */
        return k->mode_used == KVS_READ_STAGED && !can_stage ? asked
                                                             : (kvs__read_mode_t)k->mode_used;
    read_shape(k, r, ns, &k->shape);
    kvs__read_mode_t m =
        kvs__staging_choose(c->staging, k->domain[r->slots[0].key], &k->shape, can_stage);
    k->mode_used = (int)m;
    return m;
}

/* A round that does not stage: direct or grouped reads, unless an earlier round staged (then
 * its keys fail: a retry never reads direct into destinations a failed scatter may have
 * touched). */
static int read_unstaged(kvs_client_t *c, call_t *k, read_t *r, uint32_t ns, bool grouped,
                         uint64_t deadline)
{
    if (r->staged) {
        for (uint32_t s = 0; s < ns; s++) {
            r->st[s] = KVS_TRANSFER_FAIL;
            r->tried[2 * r->slots[s].entry] = r->tried[2 * r->slots[s].entry + 1];
        }
        return KVS_OK;
    }
    if (k->iov == NULL) { /* page-table form: fragments only now, for the direct read */
        int rc = call_fragments(k);
        if (rc != KVS_OK)
            return rc;
    }
    read_direct(c, k, r->slots, ns, grouped, r->reqs, r->batches, r->batch_t, r->st, deadline);
    return KVS_OK;
}

/* ---- pipelined reads (read_lead) ----------------------------------------------------------- */

static int read_submit(kvs_client_t *c, call_t *k, read_t *r, uint32_t ns, bool exact, bool grouped,
                       uint64_t deadline);

/* The second lookup's answer joined to the first's (every entry's placement in r->pr): a
 * failed lookup fails its keys with its status, as a failed frame of one batch lookup does;
 * out of memory fails them with NO_MEMORY, their leases given back. */
static void late_join(kvs_client_t *c, call_t *k, read_t *r, kvs__placement_rsp_t *part, int rc)
{
    uint32_t j0 = r->m1, m = r->m;
    kvs__obj_desc_t *all = kvs__arena_alloc(&r->arena, (size_t)m * sizeof(*all));
    if (all != NULL) {
        memcpy(all, r->pr.objs, (size_t)j0 * sizeof(*all));
        r->pr.objs = all;
        r->pr.nobjs = m;
    }
    if (rc == KVS_OK && all != NULL && kvs__placement_join(&r->pr, part, j0, &r->arena) == KVS_OK)
        return;
    if (rc == KVS_OK) { /* looked up, but no memory to keep it: the leases go back */
        release_leases(c, part, r->ks + j0, part->nobjs);
        rc = kvs__fail(KVS_NO_MEMORY, "read: out of memory");
    }
    for (uint32_t j = j0; j < m; j++) {
        if (all != NULL)
            all[j] = (kvs__obj_desc_t){.status = rc};
        else
            k->res[r->map[j]] = rc;
    }
}

/* The rest of a pipelined read's lookup: entries [m1, m) looked up, checked and routed into
 * their aligned slots. `inflight`: a fill's copies run meanwhile. Non-OK: the call fails (as a
 * call whose one lookup's check fails). */
static int read_late(kvs_client_t *c, call_t *k, read_t *r, bool grouped, bool inflight)
{
    uint32_t j0 = r->m1, m = r->m;
    if (j0 >= m)
        return KVS_OK;
    uint64_t t = kvs__now_ns();
    kvs__placement_rsp_t part = {0};
    int rc = lookup_part(c, k, r, j0, m, &r->arena2, &part);
    if (inflight)
        atomic_fetch_add(&c->st.get_lookup_overlapped_ns, kvs__now_ns() - t);
    late_join(c, k, r, &part, rc);
    r->m1 = m;
    for (uint32_t j = j0; j < m; j++)
        r->slots[j] = (read_slot_t){.key = r->map[j], .entry = j};
    if (r->pr.nobjs < m)
        return KVS_OK; /* out of memory: those keys failed */
    rc = read_check(c, k, r, true, grouped, j0, m, t);
    if (rc == KVS_OK)
        read_route(c, k, r, j0, m, true);
    return rc;
}

typedef struct {
    kvs_client_t *c;
    call_t *k;
    read_t *r;
    bool grouped;
    int rc; /* the rest's lookup failed the call */
    kvs__staging_late_t late;
} late_ctx_t;

/* The staging planner's call for the rest of the keys: false when one of them makes the call
 * ineligible (its fragments hold more than its object) or the call failed. The round's
 * deadline becomes the call's when a key of the rest has no other replica to go to. */
static bool late_more(void *ctx, kvs__staged_key_t *keys, uint32_t from, uint32_t n, bool inflight)
{
    late_ctx_t *x = ctx;
    read_t *r = x->r;
    x->rc = read_late(x->c, x->k, r, x->grouped, inflight);
    for (uint32_t j = from; j < n && x->rc == KVS_OK; j++) {
        const read_slot_t *sl = &r->slots[j];
        staged_source(&keys[j], sl, sl->t != NULL ? r->lease_until[sl->key] : 0);
    }
    /* Raised to the call's when a later key has no spare replica; set either way when nothing
     * was submitted before (no first-part key had a read). */
    bool lead_read = false;
    for (uint32_t j = 0; j < from && !lead_read; j++)
        lead_read = r->slots[j].t != NULL;
    uint64_t d = x->rc == KVS_OK ? round_deadline(x->k, r, r->m) : 0;
    if (x->rc == KVS_OK && (d == x->k->deadline || !lead_read))
        x->late.deadline_ns = d;
    return x->rc == KVS_OK && !r->larger;
}

/* Drops the slots without a transport. Returns how many are left. */
static uint32_t slots_compact(read_t *r, uint32_t ns)
{
    uint32_t out = 0;
    for (uint32_t s = 0; s < ns; s++) {
        if (r->slots[s].t != NULL)
            r->slots[out++] = r->slots[s];
    }
    return out;
}

/* Whether the lead's routes are what read_lead planned its first fill for: with shm possible
 * it took fills of half the buffer, which a key read over tcp rules out. */
static bool lead_as_planned(kvs_client_t *c, const read_t *r)
{
    for (uint32_t j = 0; j < r->m1 && c->shm != NULL; j++) {
        const kvs_transport_t *t = r->slots[j].t;
        if (t != NULL && !(t->ops->caps & KVS_TRANSPORT_CAP_CHEAP_SUBMIT))
            return false;
    }
    return true;
}

/* The adaptive mode's choice for a pipelined read, made from its lead's routes (lead_shape). */
static kvs__read_mode_t lead_mode(kvs_client_t *c, call_t *k, const read_t *r)
{
    lead_shape(c, k, r, true, &k->shape);
    k->mode_used = (int)kvs__staging_choose(c->staging, k->domain[r->map[0]], &k->shape, true);
    return (kvs__read_mode_t)k->mode_used;
}

/* A pipelined read's first round (slots aligned to entries; *ns_p: its slots). A call that
 * falls back, that the rest of the lookup made ineligible, or that the adaptive mode does not
 * stage after all, reads unstaged. */
static int read_first_pipelined(kvs_client_t *c, call_t *k, read_t *r, bool grouped, uint32_t *ns_p)
{
    uint32_t m = r->m;
    read_route(c, k, r, 0, r->m1, true);
    bool planned = lead_as_planned(c, r);
    bool adaptive = kvs__staging_policy(c->staging) != NULL;
    int src = KVS_UNSUPPORTED;
    late_ctx_t x = {c, k, r, grouped, KVS_OK, {r->m1, late_more, NULL, 0}};
    x.late.ctx = &x;
    if (planned && !r->larger && (!adaptive || lead_mode(c, k, r) == KVS_READ_STAGED)) {
        for (uint32_t j = 0; j < r->m1; j++) {
            const read_slot_t *sl = &r->slots[j];
            staged_source(&r->sk[j], sl, sl->t != NULL ? r->lease_until[sl->key] : 0);
        }
        src = kvs__staging_read(c->staging, r->sk, m, k->sliced ? k->layout : NULL, &x.late,
                                round_deadline(k, r, r->m1));
    }
    if (x.rc != KVS_OK)
        return x.rc; /* nothing is in flight any more */
    if (src == KVS_OK) {
        for (uint32_t j = 0; j < m; j++)
            r->st[j] = r->sk[j].status;
        r->staged = k->staged = true;
        *ns_p = m;
        return KVS_OK;
    }
    if (src != KVS_UNSUPPORTED)
        return src;
    int rc = read_late(c, k, r, grouped, false);
    if (rc != KVS_OK)
        return rc;
    if (k->mode_used == KVS_READ_STAGED && r->larger) {
        /* The rest's lookup found a key larger than its object: the call could never stage,
         * so the adaptive mode chooses again, among the unstaged modes, as one lookup would. */
        kvs__staging_unchoose(c->staging, KVS_READ_STAGED);
        k->mode_used = -1;
    }
    uint32_t ns = slots_compact(r, m);
    *ns_p = ns;
    uint64_t d = round_deadline(k, r, ns);
    /* No mode chosen yet (the lead was routed otherwise, or the adaptive mode has not chosen):
     * as one lookup would. Else the chosen unstaged mode, or after a staged fallback the
     * caller's. */
    if (k->mode_used < 0 && (!planned || adaptive))
        return read_submit(c, k, r, ns, true, grouped, d);
    bool g = k->mode_used == KVS_READ_GROUPED || (k->mode_used != KVS_READ_DIRECT && grouped);
    return read_unstaged(c, k, r, ns, g, d);
}

/* Runs one round's transfers in its mode. A staged round that falls back reads direct (the
 * adaptive policy learns the mode taken). A retry of keys whose staged read failed goes through
 * staging or not at all: never a direct read into destinations a failed scatter may have
 * touched. Statuses land in r->st (slot order). */
static int read_submit(kvs_client_t *c, call_t *k, read_t *r, uint32_t ns, bool exact, bool grouped,
                       uint64_t deadline)
{
    kvs__read_mode_t mode = read_mode(c, k, r, ns, exact && !r->larger, grouped);
    int src = KVS_UNSUPPORTED;
    if (mode == KVS_READ_STAGED)
        src = read_staged(c, k, r->slots, ns, r->lease_until, r->st, deadline);
    if (src == KVS_OK) {
        r->staged = k->staged = true;
        return KVS_OK;
    }
    if (src != KVS_UNSUPPORTED)
        return src; /* a failure of the whole call */
    /* Fell back: the caller's unstaged mode. The adaptive policy still learns the call's time
     * as the staged choice's (what choosing staged cost), so a shape whose staging keeps falling
     * back stops being tried until its next re-measurement. */
    return read_unstaged(
        c, k, r, ns, mode == KVS_READ_GROUPED || (mode == KVS_READ_STAGED && grouped), deadline);
}

/* The round's results: a lease that ran out fails the key; a retryable failure with another
 * replica left stays pending for the next round; anything else is the key's result. */
static void read_complete(call_t *k, read_t *r, uint32_t ns)
{
    uint64_t now = kvs__now_ns();
    for (uint32_t s = 0; s < ns; s++) {
        if (r->slots[s].t == NULL)
            continue; /* no read this round (a pipelined first round's failed key) */
        size_t i = r->slots[s].key, j = r->slots[s].entry;
        int st = r->st[s];
        if (st == KVS_OK && now > r->lease_until[i])
            st = KVS_LEASE_EXPIRED;
        if (read_retryable(st) && r->tried[2 * j] < r->tried[2 * j + 1] && now < k->deadline)
            continue;
        if (st != KVS_OK && st != KVS_TIMED_OUT && st != KVS_LEASE_EXPIRED &&
            st != KVS_INVALID_PARAMS && st != KVS_NO_MEMORY)
            st = KVS_TRANSFER_FAIL;
        k->res[i] = st;
        r->pending--;
    }
}

/* `exact`: fragments must add up to the object; otherwise they may be larger and are cut.
 * Reads go in rounds: each key on its next replica, all in flight together; keys whose replica
 * failed (owner gone, refused, connection lost) go again on the next one, inside the call's
 * deadline. In staged mode a retry is a new staged read of the whole key (never a direct replay
 * of what a failed receive left behind). *plan_ns_p: host time spent before the first
 * submission, the lookup RPC excluded (the staging planner counts its own share). */
static int get_call(kvs_client_t *c, call_t *k, bool exact, bool grouped, uint64_t *plan_ns_p)
{
    uint64_t t_enter = kvs__now_ns();
    read_t r = {0};
    kvs__arena_init(&r.arena);
    kvs__arena_init(&r.arena2);
    int rc = usable_keys(k, &r.ks, &r.map, &r.m);
    if (rc != KVS_OK)
        rc = kvs__fail(KVS_NO_MEMORY, "read: out of memory");
    if (rc == KVS_OK && r.m > 0)
        rc = read_lookup(c, k, &r, exact);
    uint64_t t_after = kvs__now_ns();
    if (rc == KVS_OK && r.m > 0)
        rc = read_alloc(k, &r);
    if (rc == KVS_OK && r.m > 0)
        rc = read_check(c, k, &r, exact, grouped, 0, r.m1, r.t_lookup);
    /* A pipelined read's first round also looks up the rest of its keys. */
    for (bool first = true; rc == KVS_OK && (r.pending > 0 || r.m1 < r.m); first = false) {
        uint32_t ns = 0;
        if (r.m1 < r.m) {
            *plan_ns_p = (r.t_lookup - t_enter) + (kvs__now_ns() - t_after);
            rc = read_first_pipelined(c, k, &r, grouped, &ns);
        } else {
            ns = read_route(c, k, &r, 0, r.m, false);
            if (ns == 0)
                break;
            if (first)
                *plan_ns_p = (r.t_lookup - t_enter) + (kvs__now_ns() - t_after);
            rc = read_submit(c, k, &r, ns, exact, grouped, round_deadline(k, &r, ns));
        }
        if (rc == KVS_OK)
            read_complete(k, &r, ns);
    }
    read_free(c, &r);
    return rc;
}

/* Counts a finished read call in the client's stats. */
static void get_account(kvs_client_t *c, const call_t *k, bool grouped, int rc, uint64_t t0,
                        uint64_t plan_ns, uint64_t nfrag)
{
    uint64_t bytes = 0, failed = 0, expired = 0, timed_out = 0, xfer = 0;
    for (size_t i = 0; rc == KVS_OK && i < k->n; i++) {
        if (k->res[i] == 0) {
            bytes += k->total[i];
            continue;
        }
        failed++;
        expired += k->res[i] == KVS_LEASE_EXPIRED;
        timed_out += k->res[i] == KVS_TIMED_OUT;
        xfer += k->res[i] == KVS_TRANSFER_FAIL;
    }
    kvs__client_stats_t *st = &c->st;
    atomic_fetch_add(&st->plan_ns_total, plan_ns);
    atomic_fetch_add(&st->planned_fragments, nfrag);
    atomic_fetch_add(&st->get_calls, 1);
    atomic_fetch_add(&st->get_grouped_calls, grouped);
    atomic_fetch_add(&st->get_keys, k->n);
    atomic_fetch_add(&st->get_bytes, bytes);
    atomic_fetch_add(&st->get_page_table_calls, k->layout != NULL);
    /* Each call counts in one mode: staged if any round staged, else grouped or direct. */
    atomic_uint_fast64_t *calls = &st->get_direct_calls, *mode_bytes = &st->get_direct_bytes;
    kvs__hist_t *mode_latency = &st->get_direct_latency;
    if (k->staged) {
        calls = &st->get_staged_calls;
        mode_bytes = &st->get_staged_bytes;
        mode_latency = &st->get_staged_latency;
    } else if (grouped) {
        calls = &st->get_grouped_unstaged_calls;
        mode_bytes = &st->get_grouped_bytes;
        mode_latency = &st->get_grouped_latency;
    }
    atomic_fetch_add(calls, 1);
    atomic_fetch_add(mode_bytes, bytes);
    atomic_fetch_add(&st->get_failed_keys, rc == KVS_OK ? failed : k->n);
    atomic_fetch_add(&st->get_lease_expired, expired);
    atomic_fetch_add(&st->get_timed_out, timed_out);
    atomic_fetch_add(&st->get_transfer_fail, xfer);
    uint64_t took = kvs__now_ns() - t0;
    kvs__hist_add(&st->get_latency, took);
    kvs__hist_add(mode_latency, took);
}

/* Runs an initialised read call (it is freed here), writes the results and accounts for it.
 * deadline: the call's (0: transfer_timeout_ms from t0). */
static int get_exec(kvs_client_t *c, call_t *k, bool exact, bool grouped, uint64_t t0,
                    uint64_t deadline, int64_t results[])
{
    uint64_t init_ns = kvs__now_ns() - t0, plan_ns = 0, nfrag = 0;
    for (size_t i = 0; i < k->n; i++)
        nfrag += k->layout != NULL ? (uint64_t)k->npages[i] * k->layout->nregions : k->cnt[i];
    k->deadline = deadline ? deadline : t0 + c->transfer_timeout_ms * KVS_NS_PER_MS;
    k->mode_used = -1;
    kvs__client_enter(c);
    kvs__client_sweep(c, k->deadline);
    int rc = get_call(c, k, exact, grouped, &plan_ns);
    if (k->mode_used >= 0 && rc == KVS_OK) /* the adaptive policy learns from the call */
        kvs__policy_observe(kvs__staging_policy(c->staging), &k->shape,
                            (kvs__read_mode_t)k->mode_used, kvs__now_ns() - t0);
    for (size_t i = 0; rc == KVS_OK && i < k->n; i++)
        results[i] = k->res[i] == 0 ? (int64_t)k->total[i] : k->res[i];
    get_account(c, k, grouped, rc, t0, init_ns + plan_ns, nfrag);
    call_free(c, k);
    kvs__client_leave(c);
    return rc;
}

/* Runs a read call of fragment lists. */
static int get_run(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                   const kvs_buf_t *const bufs[], const size_t nbufs[], bool registered, bool exact,
                   bool grouped, uint64_t deadline, const uint64_t *src_off, bool allow_larger,
                   int64_t results[])
{
    if (results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: results is NULL", op);
    uint64_t t0 = kvs__now_ns();
    call_t k;
    int rc = call_init(c, op, n, keys, bufs, nbufs, registered, &k);
    if (rc != KVS_OK)
        return rc;
    k.src_off = src_off;
    k.allow_larger = allow_larger;
    return get_exec(c, &k, exact, grouped, t0, deadline, results);
}

/* ---- page-table reads ------------------------------------------------------------------------ */

/* The fragments of a page-table call, for a direct read (staged reads need none). */
static int call_fragments(call_t *k)
{
    size_t total = 0;
    for (size_t i = 0; i < k->n; i++)
        total += (size_t)k->npages[i] * k->layout->nregions;
    k->iov = kvs__malloc(KVS_MAX(total, 1) * sizeof(*k->iov));
    if (k->iov == NULL)
        return kvs__fail(KVS_NO_MEMORY, "read: out of memory for %zu fragments", total);
    for (size_t i = 0; i < k->n; i++)
        if (!kvs__pages_fragments(k->layout, k->ids + k->ids_first[i], k->npages[i],
                                  &k->iov[k->first[i]]))
            return kvs__fail(KVS_INVALID_PARAMS, "read: page ids changed during the call");
    return KVS_OK;
}

/* Pins the call's regions (each whole in one registered buffer, all in one memory domain) and
 * returns that domain. */
static int pages_pin(kvs_client_t *c, const char *op, call_t *k, int *domain_p)
{
    const kvs__page_layout_t *L = k->layout;
    int rc = KVS_OK, domain = KVS_DOMAIN_MIXED;
    pthread_rwlock_rdlock(&c->reg_lock);
    for (uint32_t r = 0; r < L->nregions && rc == KVS_OK; r++) {
        const kvs_page_region_t *g = &L->regions[r];
        size_t span = (size_t)(g->npages - 1) * g->stride + g->page_bytes;
        int dom = KVS_DOMAIN_MIXED;
        if (!kvs__reg_pin_locked(c, g->base, span, &k->pins, &dom))
            rc = kvs__fail(KVS_INVALID_PARAMS,
                           "%s: region %u (%zu bytes at %p) is not whole in one registered buffer",
                           op, r, span, g->base);
        else if (r > 0 && dom != domain)
            rc = kvs__fail(KVS_INVALID_PARAMS,
                           "%s: the regions mix host and GPU memory (or two GPUs)", op);
        else if (dom >= 0 && !KVS_GPU_BUILT)
            rc = kvs__fail(KVS_INVALID_PARAMS,
                           "%s: the regions are in GPU memory, which needs a CUDA build of kvstash",
                           op);
        domain = dom;
    }
    pthread_rwlock_unlock(&c->reg_lock);
    *domain_p = domain;
    return rc;
}

/* A page-table call's keys: sizes from the page counts, no fragment list (unless it cannot be
 * staged at all, when it is built at once). The layout and ids were checked by the caller. */
static int call_init_pages(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                           const kvs__page_layout_t *L, const uint32_t *ids, const size_t npages[],
                           call_t *k)
{
    memset(k, 0, sizeof(*k));
    k->n = n;
    k->keys = keys;
    k->layout = L;
    k->ids = ids;
    k->npages = npages;
    k->first = kvs__malloc(n * sizeof(*k->first));
    k->cnt = kvs__malloc(n * sizeof(*k->cnt));
    k->total = kvs__malloc(n * sizeof(*k->total));
    k->res = kvs__calloc(n, sizeof(*k->res));
    k->domain = kvs__malloc(n * sizeof(*k->domain));
    k->ids_first = kvs__malloc(n * sizeof(*k->ids_first));
    if (k->first == NULL || k->cnt == NULL || k->total == NULL || k->res == NULL ||
        k->domain == NULL || k->ids_first == NULL) {
        call_free(c, k);
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory", op);
    }
    int domain;
    int rc = pages_pin(c, op, k, &domain);
    uint32_t nslices;
    uint64_t row = 0, f = 0, id = 0;
    bool sliced = kvs__pt_slices(L, &nslices, &row) == KVS_OK;
    k->sliced = sliced;
    if (!sliced)
        for (uint32_t r = 0; r < L->nregions; r++)
            row += L->regions[r].page_bytes;
    for (size_t i = 0; i < n && rc == KVS_OK; i++) {
        k->first[i] = f;
        k->cnt[i] = (uint32_t)(npages[i] * L->nregions);
        k->ids_first[i] = id;
        k->total[i] = npages[i] * row;
        k->domain[i] = domain;
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK)
            k->res[i] =
                kvs__fail(KVS_INVALID_PARAMS, "%s: key %zu is NULL, empty or longer than %u bytes",
                          op, i, KVS_MAX_KEY_LEN);
        f += k->cnt[i];
        id += npages[i];
    }
    /* Without staging (or a layout the page scatter cannot take) the call reads direct. */
    if (rc == KVS_OK && (c->staging == NULL || !sliced))
        rc = call_fragments(k);
    if (rc != KVS_OK)
        call_free(c, k);
    return rc;
}

int kvs__get_pages(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                   const kvs__page_layout_t *layout, const uint32_t *ids, const size_t npages[],
                   bool same_node, uint64_t t0, int64_t results[])
{
    call_t k;
    int rc = call_init_pages(c, op, n, keys, layout, ids, npages, &k);
    if (rc != KVS_OK)
        return rc;
    k.allow_larger = true; /* as kvs_client_batch_get_into_multi_buffers */
    return get_exec(c, &k, true, same_node, t0, 0, results);
}

static int64_t get_single(kvs_client_t *c, const char *op, const char *key, void *buf, size_t size,
                          bool registered, uint64_t deadline)
{
    kvs_buf_t b = {buf, size};
    const kvs_buf_t *bp = &b;
    size_t one = 1;
    int64_t result = 0;
    int rc = get_run(c, op, 1, &key, &bp, &one, registered, false, false, deadline, NULL, false,
                     &result);
    if (rc != KVS_OK)
        return rc;
    if (result < 0 && result != KVS_INVALID_PARAMS)
        return kvs__fail((int)result, "%s '%s': %s", op, key, kvs_status_str((int)result));
    return result;
}

int64_t kvs_client_get_into(kvs_client_t *c, const char *key, void *buf, size_t size)
{
    return get_single(c, "get_into", key, buf, size, true, 0);
}

int kvs_client_batch_get_into(kvs_client_t *c, size_t n, const char *const keys[],
                              const kvs_buf_t bufs[], int64_t results[])
{
    const kvs_buf_t **ptrs;
    size_t *counts;
    int r = one_buf_each(n, bufs, &ptrs, &counts);
    if (r != KVS_OK)
        return kvs__fail(r, "batch_get_into: 1..%u keys with buffers are required", KVS_MAX_BATCH);
    r = get_run(c, "batch_get_into", n, keys, ptrs, counts, true, false, false, 0, NULL, false,
                results);
    kvs__free(ptrs);
    kvs__free(counts);
    return r;
}

int kvs_client_batch_get_into_multi_buffers(kvs_client_t *c, size_t n, const char *const keys[],
                                            const kvs_buf_t *const bufs[], const size_t nbufs[],
                                            bool prefer_alloc_in_same_node, int64_t results[])
{
    return get_run(c, "batch_get_into_multi_buffers", n, keys, bufs, nbufs, true, true,
                   prefer_alloc_in_same_node, 0, NULL, true, results);
}

int kvs_client_get(kvs_client_t *c, const char *key, void **data_p, size_t *size_p)
{
    if (data_p == NULL || size_p == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "get: data_p and size_p are required");
    /* One deadline for both steps. */
    uint64_t deadline = c != NULL ? kvs__now_ns() + c->transfer_timeout_ms * KVS_NS_PER_MS : 0;
    int64_t size = kvs__client_get_size_until(c, key, deadline);
    if (size < 0)
        return (int)size;
    void *buf = kvs__malloc(size > 0 ? (size_t)size : 1);
    if (buf == NULL)
        return kvs__fail(KVS_NO_MEMORY, "get '%s': cannot allocate %lld bytes", key,
                         (long long)size);
    /* The object may have been replaced by a larger one in between: then its size is refused
     * as INVALID_PARAMS and reported as such. */
    int64_t got = get_single(c, "get", key, buf, (size_t)size, false, deadline);
    if (got < 0) {
        kvs__free(buf);
        return (int)got;
    }
    *data_p = buf;
    *size_p = (size_t)got;
    return KVS_OK;
}

/* ---- ranged reads and reads into new memory ----------------------------------------------------
 */

int kvs_client_batch_get_ranges(kvs_client_t *c, size_t n, const char *const keys[],
                                const kvs_range_t *const ranges[], const size_t nranges[],
                                int64_t results[])
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || ranges == NULL ||
        nranges == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_get_ranges: a client, 1..%u keys, their "
                         "ranges and a results array are required",
                         KVS_MAX_BATCH);
    /* Each run of ranges whose offsets follow each other is one entry of the read: one
     * transfer into its fragments. */
    size_t nfrag = 0, nruns = 0;
    for (size_t i = 0; i < n; i++) {
        if (nranges[i] > 0 && ranges[i] == NULL)
            return kvs__fail(KVS_INVALID_PARAMS, "batch_get_ranges: key %zu has no ranges", i);
        nfrag += nranges[i];
        for (size_t j = 0; j < nranges[i]; j++)
            nruns += j == 0 || ranges[i][j].offset !=
                                   ranges[i][j - 1].offset + (uint64_t)ranges[i][j - 1].len;
        nruns += nranges[i] == 0;
    }
    if (nruns > KVS_MAX_BATCH)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_get_ranges: %zu separate ranges (at most %u per call)", nruns,
                         KVS_MAX_BATCH);
    const char **rkeys = kvs__malloc(nruns * sizeof(*rkeys));
    kvs_buf_t *frags = kvs__malloc(KVS_MAX(nfrag, 1) * sizeof(*frags));
    const kvs_buf_t **rbufs = kvs__malloc(nruns * sizeof(*rbufs));
    size_t *rn = kvs__calloc(nruns, sizeof(*rn)), *owner = kvs__malloc(nruns * sizeof(*owner));
    uint64_t *off = kvs__malloc(nruns * sizeof(*off));
    int64_t *rres = kvs__malloc(nruns * sizeof(*rres));
    int rc = KVS_OK;
    if (!rkeys || !frags || !rbufs || !rn || !owner || !off || !rres) {
        rc = kvs__fail(KVS_NO_MEMORY, "batch_get_ranges: out of memory");
        goto out;
    }
    size_t r = 0, f = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < KVS_MAX(nranges[i], 1); j++) {
            bool start = j == 0 || ranges[i][j].offset !=
                                       ranges[i][j - 1].offset + (uint64_t)ranges[i][j - 1].len;
            if (start) {
                rkeys[r] = keys[i];
                rbufs[r] = &frags[f];
                off[r] = nranges[i] ? ranges[i][j].offset : 0;
                owner[r++] = i;
            }
            if (nranges[i] == 0)
                break; /* no fragment: call_init refuses the key */
            frags[f++] = (kvs_buf_t){ranges[i][j].ptr, ranges[i][j].len};
            rn[r - 1]++;
        }
    }
    rc = get_run(c, "batch_get_ranges", nruns, rkeys, rbufs, rn, true, true, false, 0, off, false,
                 rres);
    if (rc == KVS_OK) {
        for (size_t i = 0; i < n; i++)
            results[i] = 0;
        for (size_t q = 0; q < nruns; q++) {
            int64_t *res = &results[owner[q]];
            if (*res >= 0)
                *res = rres[q] < 0 ? rres[q] : *res + rres[q];
        }
    }
out:
    kvs__free(rkeys);
    kvs__free(frags);
    kvs__free(rbufs);
    kvs__free(rn);
    kvs__free(owner);
    kvs__free(off);
    kvs__free(rres);
    return rc;
}

int kvs_client_batch_get(kvs_client_t *c, size_t n, const char *const keys[], void *data[],
                         size_t sizes[], int64_t results[])
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || data == NULL || sizes == NULL ||
        results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_get: a client, 1..%u keys and the output "
                         "arrays are required",
                         KVS_MAX_BATCH);
    for (size_t i = 0; i < n; i++) {
        data[i] = NULL;
        sizes[i] = 0;
    }
    uint64_t deadline = kvs__now_ns() + c->transfer_timeout_ms * KVS_NS_PER_MS;
    /* The sizes first (a lookup whose leases end at once), then one read of every key found
     * into memory of its size. */
    int *sz = kvs__malloc(n * sizeof(*sz));
    kvs_replica_desc_t *d = NULL;
    uint32_t *nreps = kvs__malloc(n * sizeof(*nreps));
    kvs_buf_t *bufs = kvs__calloc(n, sizeof(*bufs));
    const kvs_buf_t **bp = kvs__malloc(n * sizeof(*bp));
    size_t *one = kvs__malloc(n * sizeof(*one));
    int rc = KVS_NO_MEMORY;
    if (sz && nreps && bufs && bp && one &&
        (d = kvs__malloc(n * KVS_MAX_REPLICA_DESCS * sizeof(*d))) != NULL)
        rc = kvs_client_batch_get_replica_desc(c, n, keys, d, nreps, sz);
    else
        kvs__fail(rc, "batch_get: out of memory");
    for (size_t i = 0; rc == KVS_OK && i < n; i++) {
        bp[i] = &bufs[i];
        one[i] = 1;
        if (sz[i] != KVS_OK || nreps[i] == 0)
            continue;
        size_t size = (size_t)d[i * KVS_MAX_REPLICA_DESCS].size;
        if ((bufs[i].ptr = kvs__malloc(KVS_MAX(size, 1))) == NULL) {
            rc = kvs__fail(KVS_NO_MEMORY, "batch_get: cannot allocate %zu bytes", size);
            break;
        }
        bufs[i].len = size;
    }
    if (rc == KVS_OK) {
        /* Keys not found keep their status (a NULL buffer would be refused as -600). */
        const char **ks = kvs__malloc(n * sizeof(*ks));
        size_t *map = kvs__malloc(n * sizeof(*map));
        int64_t *res = kvs__malloc(n * sizeof(*res));
        const kvs_buf_t **kb = kvs__malloc(n * sizeof(*kb));
        size_t m = 0;
        if (ks && map && res && kb) {
            for (size_t i = 0; i < n; i++) {
                results[i] = sz[i] != KVS_OK ? sz[i] : nreps[i] == 0 ? KVS_OBJECT_NOT_FOUND : 0;
                if (results[i] == 0) {
                    ks[m] = keys[i];
                    kb[m] = &bufs[i];
                    map[m++] = i;
                }
            }
            rc = m == 0 ? KVS_OK
                        : get_run(c, "batch_get", m, ks, kb, one, false, false, false, deadline,
                                  NULL, false, res);
            for (size_t q = 0; rc == KVS_OK && q < m; q++) {
                size_t i = map[q];
                results[i] = res[q];
                if (res[q] >= 0) {
                    data[i] = bufs[i].ptr;
                    sizes[i] = (size_t)res[q];
                    bufs[i].ptr = NULL;
                }
            }
        } else {
            rc = kvs__fail(KVS_NO_MEMORY, "batch_get: out of memory");
        }
        kvs__free(ks);
        kvs__free(map);
        kvs__free(res);
        kvs__free(kb);
    }
    for (size_t i = 0; bufs != NULL && i < n; i++)
        kvs__free(bufs[i].ptr);
    kvs__free(sz);
    kvs__free(d);
    kvs__free(nreps);
    kvs__free(bufs);
    kvs__free(bp);
    kvs__free(one);
    return rc;
}

/* ---- put sessions (Mooncake's batch_put_session_*) --------------------------------------------
 */

/* A byte range [lo, hi) of an object written so far. */
typedef struct {
    uint64_t lo, hi;
} span_t;

/* An open put's placement. */
typedef struct {
    uint64_t size, token, cap_epoch;
    uint32_t nreps;
    kvs__replica_t reps[KVS_MAX_REPLICAS];
    kvs__seg_info_t segs[KVS_MAX_REPLICAS]; /* each replica's segment */
} psess_place_t;

/* An open put: its placement (segment strings owned), kept between the calls that write its
 * ranges, and the bytes written so far. */
struct kvs__put_session {
    struct kvs__put_session *next;
    psess_place_t pl;
    span_t *cov; /* written, sorted, merged */
    uint32_t ncov, cap_cov;
    int failed; /* a write failed: the end revokes it with this status */
    char key[];
};

static void psess_free(kvs__put_session_t *p)
{
    for (uint32_t q = 0; q < p->pl.nreps; q++) {
        kvs__free((char *)p->pl.segs[q].name.ptr);
        kvs__free((char *)p->pl.segs[q].node.ptr);
        kvs__free((char *)p->pl.segs[q].endpoint.ptr);
    }
    kvs__free(p->cov);
    kvs__free(p);
}

/* The session of `key` (the caller holds psess_lock); *prev_p gets the link to it. */
static kvs__put_session_t *psess_find(kvs_client_t *c, const char *key,
                                      kvs__put_session_t ***prev_p)
{
    kvs__put_session_t **p = &c->psess;
    while (*p != NULL && strcmp((*p)->key, key) != 0)
        p = &(*p)->next;
    if (prev_p != NULL)
        *prev_p = p;
    return *p;
}

/* Adds [lo, hi) to the written spans (merging); false on no memory. */
static bool psess_cover(kvs__put_session_t *p, uint64_t lo, uint64_t hi)
{
    if (p->ncov == p->cap_cov) {
        uint32_t cap = p->cap_cov ? 2 * p->cap_cov : 4;
        span_t *g = kvs__realloc(p->cov, cap * sizeof(*g));
        if (g == NULL)
            return false;
        p->cov = g;
        p->cap_cov = cap;
    }
    uint32_t w = 0;
    span_t cur = {lo, hi};
    span_t *out = p->cov;
    /* In place: spans before the new one, the merge of those touching it, the rest. */
    uint32_t n = p->ncov, i = 0;
    while (i < n && out[i].hi < cur.lo)
        out[w++] = out[i++];
    while (i < n && out[i].lo <= cur.hi) {
        cur.lo = KVS_MIN(cur.lo, out[i].lo);
        cur.hi = KVS_MAX(cur.hi, out[i].hi);
        i++;
    }
    uint32_t rest = n - i;
    memmove(&out[w + 1], &out[i], rest * sizeof(*out));
    out[w] = cur;
    p->ncov = w + 1 + rest;
    return true;
}

static bool str_copy(kvs__str_t *dst, kvs__str_t src)
{
    char *s = kvs__strndup(src.ptr ? src.ptr : "", src.len);
    *dst = (kvs__str_t){s, s ? src.len : 0};
    return s != NULL;
}

int kvs_client_put_session_start(kvs_client_t *c, size_t n, const char *const keys[],
                                 const uint64_t sizes[], const kvs_replicate_config_t *rc,
                                 int results[])
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || sizes == NULL ||
        results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "put_session_start: a client, 1..%u keys, their "
                         "sizes and a results array are required",
                         KVS_MAX_BATCH);
    kvs__str_t pref[KVS_MAX_REPLICAS];
    kvs__put_start_req_t ps;
    int prc = put_start_init(c, "put_session_start", rc, false, n, pref, &ps);
    if (prc != KVS_OK)
        return prc;
    kvs__put_item_t *items = kvs__malloc(n * sizeof(*items));
    size_t *map = kvs__malloc(n * sizeof(*map));
    if (items == NULL || map == NULL) {
        kvs__free(items);
        kvs__free(map);
        return kvs__fail(KVS_NO_MEMORY, "put_session_start: out of memory");
    }
    kvs__client_enter(c);
    uint32_t m = 0;
    pthread_mutex_lock(&c->psess_lock);
    for (size_t i = 0; i < n; i++) {
        results[i] = KVS_OK;
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK || sizes[i] == 0)
            results[i] = kvs__fail(KVS_INVALID_PARAMS,
                                   "put_session_start: key %zu is invalid "
                                   "or its size 0",
                                   i);
        else if (psess_find(c, keys[i], NULL) != NULL)
            results[i] = kvs__fail(KVS_INVALID_PARAMS,
                                   "put_session_start: '%s' has a put session already", keys[i]);
        for (uint32_t j = 0; results[i] == KVS_OK && j < m; j++) {
            if (strcmp(keys[map[j]], keys[i]) == 0)
                results[i] = kvs__fail(KVS_INVALID_PARAMS,
                                       "put_session_start: '%s' is in the call twice", keys[i]);
        }
        if (results[i] == KVS_OK) {
            items[m] = (kvs__put_item_t){
                .key = kvs__str_c(keys[i]), .size = sizes[i], .group = put_item_group(rc, i)};
            map[m++] = i;
        }
    }
    pthread_mutex_unlock(&c->psess_lock);
    int rc2 = KVS_OK;
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    if (m > 0) {
        ps.nitems = m;
        ps.items = items;
        kvs__placement_rsp_t pr;
        rc2 = kvs__client_put_start(c, &ps, &arena, &pr, kvs__client_rpc_deadline(c));
        if (rc2 != KVS_OK)
            rc2 = kvs__fail(rc2, "put_session_start: the master refused: %s", kvs_status_str(rc2));
        for (uint32_t j = 0; rc2 == KVS_OK && j < m; j++) {
            const kvs__obj_desc_t *d = &pr.objs[j];
            size_t i = map[j];
            if (d->status != KVS_OK) {
                results[i] = d->status;
                continue;
            }
            size_t klen = strlen(keys[i]);
            kvs__put_session_t *p = kvs__calloc(1, sizeof(*p) + klen + 1);
            bool ok = p != NULL;
            for (uint32_t q = 0; ok && q < d->nreps && q < KVS_MAX_REPLICAS; q++) {
                const kvs__seg_info_t *si = seg_find(&pr, d->reps[q].segment_id);
                if (si == NULL)
                    continue;
                p->pl.reps[p->pl.nreps] = d->reps[q];
                kvs__seg_info_t *g = &p->pl.segs[p->pl.nreps];
                *g = *si;
                /* Each copied (never short-circuited), so psess_free frees only owned strings. */
                bool a = str_copy(&g->name, si->name), b = str_copy(&g->node, si->node),
                     e = str_copy(&g->endpoint, si->endpoint);
                ok = a && b && e;
                p->pl.nreps++;
            }
            if (!ok) {
                if (p != NULL)
                    psess_free(p);
                results[i] = KVS_NO_MEMORY; /* its placement is discarded by the master */
                continue;
            }
            memcpy(p->key, keys[i], klen + 1);
            p->pl.size = d->size;
            p->pl.token = d->token;
            p->pl.cap_epoch = d->cap_epoch;
            pthread_mutex_lock(&c->psess_lock);
            p->next = c->psess;
            c->psess = p;
            pthread_mutex_unlock(&c->psess_lock);
        }
    }
    kvs__arena_free(&arena);
    kvs__free(items);
    kvs__free(map);
    kvs__client_leave(c);
    return rc2;
}

/* Copies key i's session placement into *snap (strings into the arena: another thread may end
 * the session while this one writes) and checks its ranges; the key's result says why not. */
static void psess_snapshot(kvs_client_t *c, call_t *k, size_t i, const kvs_range_t *ranges,
                           kvs__arena_t *arena, psess_place_t *snap)
{
    const char *key = k->keys[i];
    kvs__put_session_t *p = psess_find(c, key, NULL);
    if (p == NULL || p->failed) {
        k->res[i] =
            p ? p->failed
              : kvs__fail(KVS_INVALID_PARAMS, "put_session_write: '%s' has no put session", key);
        return;
    }
    *snap = p->pl;
    for (uint32_t q = 0; q < p->pl.nreps; q++) {
        const kvs__str_t *src[3] = {&p->pl.segs[q].name, &p->pl.segs[q].node,
                                    &p->pl.segs[q].endpoint};
        kvs__str_t *dst[3] = {&snap->segs[q].name, &snap->segs[q].node, &snap->segs[q].endpoint};
        for (int t = 0; t < 3; t++) {
            char *s = kvs__arena_alloc(arena, src[t]->len + 1);
            if (s != NULL) {
                memcpy(s, src[t]->ptr, src[t]->len);
                s[src[t]->len] = '\0';
            }
            *dst[t] = (kvs__str_t){s ? s : "", s ? src[t]->len : 0};
        }
    }
    for (uint32_t j = 0; j < k->cnt[i]; j++) {
        const kvs_range_t *r = &ranges[j];
        if (r->offset > p->pl.size || r->len > p->pl.size - r->offset)
            k->res[i] =
                kvs__fail(KVS_INVALID_PARAMS,
                          "put_session_write '%s': bytes %llu..%llu are outside the "
                          "%llu-byte object",
                          key, (unsigned long long)r->offset,
                          (unsigned long long)(r->offset + r->len), (unsigned long long)p->pl.size);
    }
}

/* One write per range and replica of every usable key; returns the writes. */
static uint32_t psess_route(kvs_client_t *c, call_t *k, const kvs_range_t *const ranges[],
                            const psess_place_t *snap, routes_t *routes, kvs_xfer_req_t *reqs,
                            kvs_transport_t **req_t, size_t *req_key)
{
    uint32_t r = 0;
    for (size_t i = 0; i < k->n; i++) {
        for (uint32_t q = 0; k->res[i] == 0 && q < snap[i].nreps; q++) {
            for (uint32_t j = 0; j < k->cnt[i]; j++) {
                kvs_endpoint_t *ep = NULL;
                int erc = route_for(c, routes, &snap[i].segs[q], k->deadline, &req_t[r], &ep);
                if (erc != KVS_OK) {
                    k->res[i] = erc;
                    break;
                }
                const kvs__replica_t *rep = &snap[i].reps[q];
                reqs[r] = (kvs_xfer_req_t){.op = KVS_XFER_WRITE,
                                           .ep = ep,
                                           .segment_id = rep->segment_id,
                                           .offset = rep->offset + ranges[i][j].offset,
                                           .length = ranges[i][j].len,
                                           .iov = &k->iov[k->first[i] + j],
                                           .iovcnt = 1,
                                           .status = KVS_OK,
                                           .gpu = gpu_of(k->domain[i]),
                                           .token = snap[i].token,
                                           .cap = rep->cap,
                                           .cap_epoch = snap[i].cap_epoch,
                                           .alloc_offset = rep->offset,
                                           .alloc_size = snap[i].size};
                req_key[r++] = i;
            }
        }
    }
    return r;
}

/* Records what the writes covered in each session still open (a failed write fails it: the end
 * revokes it). */
static void psess_record(kvs_client_t *c, call_t *k, const kvs_range_t *const ranges[],
                         const psess_place_t *snap)
{
    pthread_mutex_lock(&c->psess_lock);
    for (size_t i = 0; i < k->n; i++) {
        kvs__put_session_t *p = snap[i].size ? psess_find(c, k->keys[i], NULL) : NULL;
        if (p == NULL || p->pl.token != snap[i].token)
            continue; /* ended meanwhile */
        if (k->res[i] != 0 && k->res[i] != KVS_INVALID_PARAMS) {
            p->failed = (int)k->res[i];
            continue;
        }
        for (uint32_t j = 0; k->res[i] == 0 && j < k->cnt[i]; j++) {
            if (!psess_cover(p, ranges[i][j].offset, ranges[i][j].offset + ranges[i][j].len))
                p->failed = k->res[i] = KVS_NO_MEMORY;
        }
    }
    pthread_mutex_unlock(&c->psess_lock);
}

/* The writes of a put-session call: snapshot -> route -> submit -> record. */
static int psess_write(kvs_client_t *c, call_t *k, const kvs_range_t *const ranges[],
                       psess_place_t *snap)
{
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    uint32_t nreq = 0;
    pthread_mutex_lock(&c->psess_lock);
    for (size_t i = 0; i < k->n; i++) {
        if (k->res[i] == 0)
            psess_snapshot(c, k, i, ranges[i], &arena, &snap[i]);
        if (k->res[i] == 0)
            nreq += k->cnt[i] * snap[i].nreps;
    }
    pthread_mutex_unlock(&c->psess_lock);
    kvs_xfer_req_t *reqs = kvs__calloc(KVS_MAX(nreq, 1), sizeof(*reqs));
    kvs_transport_t **req_t = kvs__malloc(KVS_MAX(nreq, 1) * sizeof(*req_t));
    size_t *req_key = kvs__malloc(KVS_MAX(nreq, 1) * sizeof(*req_key));
    routes_t routes = {0};
    int rc = KVS_OK;
    if (reqs == NULL || req_t == NULL || req_key == NULL) {
        rc = kvs__fail(KVS_NO_MEMORY, "put_session_write: out of memory");
    } else {
        uint32_t r = psess_route(c, k, ranges, snap, &routes, reqs, req_t, req_key);
        if (r > 0)
            submit_by_transport(c, reqs, req_t, r, k->deadline);
        for (uint32_t q = 0; q < r; q++) {
            int st = reqs[q].status;
            if (st != KVS_OK && k->res[req_key[q]] == 0)
                k->res[req_key[q]] = st == KVS_TIMED_OUT ? st : KVS_TRANSFER_FAIL;
        }
        psess_record(c, k, ranges, snap);
    }
    routes_free(&routes);
    kvs__arena_free(&arena);
    kvs__free(reqs);
    kvs__free(req_t);
    kvs__free(req_key);
    return rc;
}

int kvs_client_put_session_write(kvs_client_t *c, size_t n, const char *const keys[],
                                 const kvs_range_t *const ranges[], const size_t nranges[],
                                 int results[])
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || ranges == NULL ||
        nranges == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "put_session_write: a client, 1..%u keys, their "
                         "ranges and a results array are required",
                         KVS_MAX_BATCH);
    size_t nfrag = 0;
    for (size_t i = 0; i < n; i++)
        nfrag += nranges[i];
    kvs_buf_t *frags = kvs__malloc(KVS_MAX(nfrag, 1) * sizeof(*frags));
    const kvs_buf_t **bufs = kvs__malloc(n * sizeof(*bufs));
    psess_place_t *snap = kvs__calloc(n, sizeof(*snap)); /* each key's placement, copied */
    int rc = frags != NULL && bufs != NULL && snap != NULL
                 ? KVS_OK
                 : kvs__fail(KVS_NO_MEMORY, "put_session_write: out of memory");
    for (size_t i = 0, f = 0; rc == KVS_OK && i < n; i++) {
        bufs[i] = &frags[f];
        for (size_t j = 0; j < nranges[i] && ranges[i] != NULL; j++)
            frags[f++] = (kvs_buf_t){ranges[i][j].ptr, ranges[i][j].len};
    }
    call_t k;
    if (rc == KVS_OK)
        rc = call_init(c, "put_session_write", n, keys, bufs, nranges, true, &k);
    if (rc == KVS_OK) {
        k.deadline = kvs__now_ns() + c->transfer_timeout_ms * KVS_NS_PER_MS;
        kvs__client_enter(c);
        rc = psess_write(c, &k, ranges, snap);
        for (size_t i = 0; rc == KVS_OK && i < n; i++)
            results[i] = (int)k.res[i];
        call_free(c, &k);
        kvs__client_leave(c);
    }
    kvs__free(frags);
    kvs__free(bufs);
    kvs__free(snap);
    return rc;
}

/* Ends (end) or revokes the sessions of keys: PUT_END for those whose every byte was written,
 * PUT_REVOKE for the others (and for all of them when `end` is false). */
static int psess_finish(kvs_client_t *c, const char *op, size_t n, const char *const keys[],
                        bool end, int results[])
{
    if (c == NULL || n == 0 || n > KVS_MAX_BATCH || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "%s: a client, 1..%u keys and a results array are "
                         "required",
                         op, KVS_MAX_BATCH);
    kvs__put_session_t **taken = kvs__calloc(n, sizeof(*taken));
    kvs__str_t *ks = kvs__malloc(n * sizeof(*ks));
    kvs__put_token_t *tok = kvs__malloc(n * sizeof(*tok));
    size_t *map = kvs__malloc(n * sizeof(*map));
    if (taken == NULL || ks == NULL || tok == NULL || map == NULL) {
        kvs__free(taken);
        kvs__free(ks);
        kvs__free(tok);
        kvs__free(map);
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory", op);
    }
    kvs__client_enter(c);
    pthread_mutex_lock(&c->psess_lock);
    for (size_t i = 0; i < n; i++) {
        kvs__put_session_t **prev;
        kvs__put_session_t *p = keys[i] ? psess_find(c, keys[i], &prev) : NULL;
        results[i] = p ? KVS_OK : KVS_INVALID_PARAMS;
        if (p != NULL) {
            *prev = p->next;
            taken[i] = p;
        }
    }
    pthread_mutex_unlock(&c->psess_lock);
    int rc = KVS_OK;
    for (int pass = 0; pass < 2; pass++) { /* ends, then revokes */
        uint32_t m = 0;
        for (size_t i = 0; i < n; i++) {
            kvs__put_session_t *p = taken[i];
            if (p == NULL)
                continue;
            bool whole =
                p->failed == 0 && p->ncov == 1 && p->cov[0].lo == 0 && p->cov[0].hi == p->pl.size;
            if ((pass == 0) != (end && whole))
                continue;
            if (pass == 1 && end)
                results[i] =
                    p->failed ? p->failed
                              : kvs__fail(KVS_INVALID_WRITE,
                                          "%s '%s': bytes were never written; revoked", op, p->key);
            ks[m] = kvs__str_c(p->key);
            tok[m] = (kvs__put_token_t){p->pl.token};
            map[m++] = i;
        }
        if (m == 0)
            continue;
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        kvs__status_list_rsp_t sl;
        int crc = kvs__client_keys_call(c, pass == 0 ? KVS_MSG_PUT_END : KVS_MSG_PUT_REVOKE, 0, m,
                                        ks, tok, &arena, &sl, NULL, kvs__client_rpc_deadline(c));
        for (uint32_t j = 0; j < m; j++) {
            int st = crc != KVS_OK ? crc : sl.results[j];
            if (pass == 0 || !end) /* a revoke the master no longer knows is done */
                results[map[j]] = st == KVS_OBJECT_NOT_FOUND && pass == 1 ? KVS_OK : st;
        }
        kvs__arena_free(&arena);
    }
    for (size_t i = 0; i < n; i++) {
        if (taken[i] != NULL)
            psess_free(taken[i]);
    }
    kvs__free(taken);
    kvs__free(ks);
    kvs__free(tok);
    kvs__free(map);
    kvs__client_leave(c);
    return rc;
}

int kvs_client_put_session_end(kvs_client_t *c, size_t n, const char *const keys[], int results[])
{
    return psess_finish(c, "put_session_end", n, keys, true, results);
}

int kvs_client_put_session_revoke(kvs_client_t *c, size_t n, const char *const keys[],
                                  int results[])
{
    return psess_finish(c, "put_session_revoke", n, keys, false, results);
}

void kvs__put_sessions_close(kvs_client_t *c)
{
    /* Sessions left open are revoked, a batch at a time. */
    for (;;) {
        const char *keys[256];
        int res[256];
        size_t n = 0;
        pthread_mutex_lock(&c->psess_lock);
        for (kvs__put_session_t *p = c->psess; p != NULL && n < 256; p = p->next)
            keys[n++] = p->key;
        pthread_mutex_unlock(&c->psess_lock);
        if (n == 0)
            return;
        /* Keys point into the sessions, which only this thread removes now (close). */
        if (psess_finish(c, "close", n, keys, false, res) != KVS_OK)
            return;
    }
}
