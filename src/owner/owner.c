/* An owner: a segment, its data server, its mount at the master and the heartbeat that keeps
 * it there. */
#define _GNU_SOURCE
#include "owner_int.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(o->rpc, &req, KVS_MSG_MOUNT);
    /* A key per mount, told only to the master: writes then need its capabilities. */
    uint8_t key[KVS_WRITE_KEY_LEN];
    kvs__write_key_new(key);
    kvs__mount_req_t m = {kvs__str_c(o->name),
                          kvs__str_c(kvs__rpc_node(o->rpc)),
                          kvs__str_c(o->endpoint),
                          o->mem.size,
                          {key, sizeof(key)}};
    kvs__mount_req_encode(&req, &m);
    int rc = owner_call(o, &req, &rsp);
    kvs__mount_rsp_t mr;
    if (rc == KVS_OK)
        rc = kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &mr);
    if (rc == KVS_OK)
        rc = mr.status;
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
        }
    }
    kvs__secret_wipe(req.data, req.len); /* the MOUNT carried the write key */
    kvs__secret_wipe(key, sizeof(key));
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
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
static int owner_heartbeat_once(kvs__owner_t *o, bool *applied_p)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(o->rpc, &req, KVS_MSG_HEARTBEAT);
    kvs__fence_ack_t ack = {o->segment_id, o->fence_applied};
    kvs__heartbeat_req_t hb = {o->segment_id != 0 ? 1 : 0, &ack};
    kvs__heartbeat_req_encode(&req, &hb);
    int rc = owner_call(o, &req, &rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__heartbeat_rsp_t hr;
    if (rc == KVS_OK)
        rc = kvs__heartbeat_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &hr);
    if (rc == KVS_OK)
        rc = hr.status;
    if (rc == KVS_OK)
        rc = owner_apply_fences(o, &hr, applied_p);
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return rc;
}

/* A heartbeat; newly applied fences are acknowledged by a second one right away, so the
 * master can reuse their space without waiting a heartbeat period. */
static int owner_heartbeat(kvs__owner_t *o)
{
    bool applied = false;
    int rc = owner_heartbeat_once(o, &applied);
    if (rc == KVS_OK && applied) {
        bool again = false;
        rc = owner_heartbeat_once(o, &again);
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
    pthread_mutex_lock(&o->lock);
    while (!o->stopping) {
        uint64_t wait_ms = backoff_ms ? backoff_ms : period_ms;
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
        int rc = owner_keepalive(o);
        period_ms = owner_period_ms(o);
        if (rc == KVS_OK)
            backoff_ms = 0;
        else
            backoff_ms = KVS_MIN(backoff_ms ? 2 * backoff_ms : o->cfg.retry_min_ms, period_ms);
        pthread_mutex_lock(&o->lock);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

int kvs__owner_create(const kvs__owner_config_t *cfg, kvs__owner_t **owner_p)
{
    if (cfg == NULL || owner_p == NULL || cfg->master_host == NULL || cfg->master_port == 0 ||
        cfg->segment_size < 4096 || cfg->rpc_timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    kvs__owner_t *o = kvs__calloc(1, sizeof(*o));
    if (o == NULL)
        return KVS_NO_MEMORY;
    o->cfg = *cfg;
    if (o->cfg.heartbeat_max_ms == 0)
        o->cfg.heartbeat_max_ms = KVS_OWNER_HEARTBEAT_MAX_MS;
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
                              .tls = cfg->data.tls};
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
    if (o->rpc != NULL && o->segment_id != 0) {
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
    /* The data server goes before the memory it serves. */
    kvs__data_server_destroy(o->data);
    kvs__rpc_close(o->rpc);
    kvs__segment_mem_destroy(&o->mem);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->cond);
    kvs__free(o);
}
