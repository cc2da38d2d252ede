/* Client setup, buffer registration, metadata calls and statistics. The data paths (puts and
 * reads) are in client_io.c. */
#define _GNU_SOURCE
#include "client_int.h"
#include "../ha/etcd_int.h"
#include "../gpu/gpu_copy.h"
#include "../transport/tcp/tcp_int.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DEFAULT_MASTER "127.0.0.1:50051"
#define DAY_MS         86400000ull

int kvs_client_config_init(kvs_client_config_t *cfg)
{
    if (cfg == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "kvs_client_config_init: cfg is NULL");
    *cfg = (kvs_client_config_t){
        .master = getenv("KVS_MASTER"),
        .protocol = getenv("KVS_PROTOCOL"),
        .auth_token_file = getenv("KVS_AUTH_TOKEN_FILE"),
        .tenant = getenv("KVS_TENANT"),
        .rpc_timeout_ms = 5000,
        .transfer_timeout_ms = 5000,
    };
    int rc = KVS_OK;
    uint64_t v = cfg->rpc_timeout_ms;
    if (kvs__env_u64("KVS_RPC_TIMEOUT_MS", DAY_MS, &v) == KVS_OK && v > 0)
        cfg->rpc_timeout_ms = v;
    else
        rc = kvs__fail(KVS_INVALID_PARAMS, "KVS_RPC_TIMEOUT_MS must be 1..%llu",
                       (unsigned long long)DAY_MS);
    if (kvs__env_bool("KVS_TLS", &cfg->tls) != KVS_OK)
        rc = kvs__fail(KVS_INVALID_PARAMS, "KVS_TLS must be 0 or 1");
    v = cfg->transfer_timeout_ms;
    if (kvs__env_u64("KVS_TRANSFER_TIMEOUT_MS", DAY_MS, &v) == KVS_OK && v > 0)
        cfg->transfer_timeout_ms = v;
    else
        rc = kvs__fail(KVS_INVALID_PARAMS, "KVS_TRANSFER_TIMEOUT_MS must be 1..%llu",
                       (unsigned long long)DAY_MS);
    return rc;
}

/* ---- open and close -------------------------------------------------------------------------- */

/* Which transports a protocol name asks for. */
static int check_protocol(const char *p, bool *tcp_p, bool *shm_p)
{
    *tcp_p = *shm_p = true;
    if (p == NULL || strcmp(p, "auto") == 0)
        return KVS_OK;
    if (strcmp(p, "tcp") == 0) {
        *shm_p = false;
        return KVS_OK;
    }
    if (strcmp(p, "shm") == 0) {
        *tcp_p = false;
        return KVS_OK;
    }
    if (strcmp(p, "rdma") == 0) {
        /* Mooncake's default: accepted so that its callers work unchanged. */
        kvs_warn("protocol 'rdma' is not available in kvstash; using 'auto'");
        return KVS_OK;
    }
    return kvs__fail(KVS_INVALID_PARAMS, "protocol '%s' is not one of tcp, shm, auto (or rdma)", p);
}

/* KVS_CLIENT_METRICS_PORT: serve this client's metrics there. A failure is a warning: the
 * client works without its endpoint. */
static void metrics_from_env(kvs_client_t *c)
{
    const char *v = getenv("KVS_CLIENT_METRICS_PORT");
    uint64_t port;
    if (v == NULL || *v == '\0')
        return;
    if (kvs__parse_u64(v, 65535, &port) != KVS_OK) {
        kvs_warn("KVS_CLIENT_METRICS_PORT=%s is not a port (0..65535): no metrics endpoint", v);
        return;
    }
    if (kvs_client_serve_metrics(c, NULL, (uint16_t)port) != KVS_OK)
        kvs_warn("no client metrics endpoint: %s", kvs_last_error());
}

int kvs_client_open(const kvs_client_config_t *cfg, kvs_client_t **client_p)
{
    if (cfg == NULL || client_p == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "kvs_client_open: cfg and client_p are required");
    if (cfg->rpc_timeout_ms == 0 || cfg->transfer_timeout_ms == 0 || cfg->rpc_timeout_ms > DAY_MS ||
        cfg->transfer_timeout_ms > DAY_MS)
        return kvs__fail(KVS_INVALID_PARAMS, "timeouts must be 1..%llu ms",
                         (unsigned long long)DAY_MS);
    bool want_tcp, want_shm;
    int rc = check_protocol(cfg->protocol, &want_tcp, &want_shm);
    if (rc != KVS_OK)
        return rc;
    kvs_client_t *c = kvs__calloc(1, sizeof(*c));
    if (c == NULL)
        return kvs__fail(KVS_NO_MEMORY, "kvs_client_open: out of memory");
    const char *master = cfg->master && *cfg->master ? cfg->master : DEFAULT_MASTER;
    if (kvs__is_etcd_addr(master)) {
        /* High availability: the leader is whoever etcd names (docs/ha.md). */
        if (!kvs__etcd_supported()) {
            rc = kvs__fail(KVS_UNSUPPORTED,
                           "master address '%s': this build of kvstash has no etcd support "
                           "(rebuild with libcurl and json-c installed)",
                           master);
            goto err_free;
        }
        if (kvs__etcd_addr_parse(master, &c->etcd, &c->etcd_prefix) != KVS_OK) {
            rc = kvs__fail(KVS_INVALID_PARAMS,
                           "master address '%s' is not etcd://HOST:PORT[,HOST:PORT...][/PREFIX]",
                           master);
            goto err_free;
        }
        c->master_host = kvs__strdup("");
        if (c->master_host == NULL) {
            rc = kvs__fail(KVS_NO_MEMORY, "kvs_client_open: out of memory");
            goto err_free;
        }
    } else {
        rc = kvs__parse_host_port(master, "127.0.0.1", &c->master_host, &c->master_port);
        if (rc != KVS_OK || c->master_port == 0) {
            rc =
                kvs__fail(KVS_INVALID_PARAMS,
                          "master address '%s' is not HOST:PORT or etcd://HOST:PORT[,...]", master);
            goto err_free;
        }
    }
    c->transfer_timeout_ms = cfg->transfer_timeout_ms;
    if (cfg->auth_token_file != NULL && *cfg->auth_token_file != '\0') {
        char why[512];
        if (kvs__auth_load(cfg->auth_token_file, &c->auth, why, sizeof(why)) != KVS_OK) {
            rc = kvs__fail(KVS_INVALID_PARAMS, "%s", why);
            goto err_free;
        }
    }
    c->tls = cfg->tls;
    if (cfg->tls && !c->auth.on) {
        rc = kvs__fail(KVS_INVALID_PARAMS, "TLS needs the cluster's token (auth_token_file or "
                                           "KVS_AUTH_TOKEN_FILE): its key is derived from it");
        goto err_free;
    }
    /* Staging settings are read once, here. */
    kvs__staging_config_t scfg;
    kvs__staging_config_init(&scfg);
    rc = kvs__staging_create(&scfg, &c->staging);
    if (rc == KVS_OK)
        rc = kvs__sessions_create(&c->sessions);
    if (rc != KVS_OK) {
        rc = kvs__fail(rc, "kvs_client_open: out of memory");
        goto err_free;
    }
    c->sweep_ms = 1000;
    if (kvs__env_u64("KVS_SHM_SWEEP_MS", DAY_MS, &c->sweep_ms) != KVS_OK)
        kvs_warn("KVS_SHM_SWEEP_MS is malformed; using 1000");
    kvs__tcp_config_t tcfg;
    kvs__shm_config_t mcfg;
    rc = want_tcp ? kvs__tcp_config_init(&tcfg) : KVS_OK;
    tcfg.auth = c->auth;
    tcfg.tls = cfg->tls;
    if (rc == KVS_OK && want_tcp)
        rc = kvs__tcp_transport_create(&tcfg, &c->tcp);
    if (rc == KVS_OK && want_shm && (rc = kvs__shm_config_init(&mcfg)) == KVS_OK) {
        mcfg.auth = c->auth;
        rc = kvs__shm_transport_create(&mcfg, &c->shm);
    }
    if (rc != KVS_OK) {
        rc = kvs__fail(rc, "transport setup failed (check the KVS_TCP_* and KVS_SHM_* "
                           "variables)");
        goto err_tcp;
    }
    uint64_t conns = KVS_RPC_DEFAULT_CONNS;
    if (kvs__env_u64("KVS_RPC_CONNECTIONS", KVS_RPC_MAX_CONNS, &conns) != KVS_OK || conns == 0) {
        kvs_warn("KVS_RPC_CONNECTIONS must be 1..%u; using %u", KVS_RPC_MAX_CONNS,
                 KVS_RPC_DEFAULT_CONNS);
        conns = KVS_RPC_DEFAULT_CONNS;
    }
    const char *tenant =
        cfg->tenant && *cfg->tenant && strcmp(cfg->tenant, "default") != 0 ? cfg->tenant : NULL;
    if (tenant != NULL && !kvs__tenant_ok(tenant, strlen(tenant))) {
        rc =
            kvs__fail(KVS_INVALID_PARAMS, "tenant '%.80s' must be 1..%u bytes of A-Z a-z 0-9 . _ -",
                      tenant, KVS_MAX_TENANT_LEN);
        goto err_tcp;
    }
    kvs__rpc_config_t rcfg = {.host = c->master_host,
                              .port = c->master_port,
                              .node = cfg->local_hostname,
                              .tenant = tenant,
                              .timeout_ms = cfg->rpc_timeout_ms,
                              .max_conns = (uint32_t)conns,
                              .auth = c->auth,
                              .tls = cfg->tls,
                              .etcd = c->etcd,
                              .etcd_prefix = c->etcd_prefix};
    rc = kvs__rpc_open(&rcfg, &c->rpc);
    if (rc != KVS_OK) {
        rc = kvs__fail(rc, "cannot reach the master at %s: %s", master, kvs_status_str(rc));
        goto err_tcp;
    }
    if (tenant != NULL && kvs__rpc_version(c->rpc) < 4) {
        /* A version 3 master would ignore the tenant: every key would be the default's. */
        rc = kvs__fail(KVS_UNSUPPORTED,
                       "tenant '%s' needs a master of protocol version 4 or "
                       "later (this one speaks %u)",
                       tenant, kvs__rpc_version(c->rpc));
        goto err_rpc;
    }
    atomic_store(&c->incarnation, kvs__rpc_incarnation(c->rpc));
    c->node = kvs__strdup(kvs__rpc_node(c->rpc));
    if (c->node == NULL) {
        rc = kvs__fail(KVS_NO_MEMORY, "kvs_client_open: out of memory");
        goto err_rpc;
    }
    pthread_rwlock_init(&c->reg_lock, NULL);
    pthread_mutex_init(&c->wait_lock, NULL);
    kvs__cond_init(&c->wait_cond);
    pthread_mutex_init(&c->owners_lock, NULL);
    pthread_mutex_init(&c->rel_lock, NULL);
    pthread_mutex_init(&c->eps_lock, NULL);
    pthread_mutex_init(&c->psess_lock, NULL);
    metrics_from_env(c);
    *client_p = c;
    return KVS_OK;

err_rpc:
    kvs__rpc_close(c->rpc);
err_tcp:
    if (c->tcp != NULL)
        c->tcp->ops->destroy(c->tcp);
    if (c->shm != NULL)
        c->shm->ops->destroy(c->shm);
err_free:
    kvs__sessions_destroy(c->sessions);
    kvs__staging_destroy(c->staging);
    kvs__free(c->master_host);
    kvs__free(c->etcd);
    kvs__free(c->etcd_prefix);
    kvs__free(c);
    return rc;
}

static void releases_flush(kvs_client_t *c);
static void releases_free(kvs__lease_release_t *r, uint32_t n);

void kvs__client_enter(kvs_client_t *c)
{
    atomic_fetch_add(&c->calls, 1);
}

void kvs__client_leave(kvs_client_t *c)
{
    /* Under the lock: once close sees no call left, no leaving call touches the client. */
    pthread_mutex_lock(&c->wait_lock);
    if (atomic_fetch_sub(&c->calls, 1) == 1)
        pthread_cond_broadcast(&c->wait_cond);
    pthread_mutex_unlock(&c->wait_lock);
}

void kvs_client_close(kvs_client_t *c)
{
    if (c == NULL)
        return;
    kvs__metrics_http_stop(c->metrics); /* scrapes read the client: they end first */
    /* Calls in progress end by their own deadlines; nothing they write may outlive us. */
    pthread_mutex_lock(&c->wait_lock);
    while (atomic_load(&c->calls) > 0)
        pthread_cond_wait(&c->wait_cond, &c->wait_lock);
    pthread_mutex_unlock(&c->wait_lock);
    kvs__sessions_release_all(c); /* sessions left open end here */
    kvs__put_sessions_close(c);
    releases_flush(c); /* so that the keys this client read can be removed at once */
    releases_free(c->rel, c->nrel);
    pthread_mutex_destroy(&c->rel_lock);
    for (size_t i = 0; i < c->nowners; i++)
        kvs__owner_destroy(c->owners[i]);
    kvs__free(c->owners);
    for (size_t i = 0; i < c->neps; i++) {
        c->eps[i].t->ops->ep_close(c->eps[i].t, c->eps[i].ep);
        kvs__free(c->eps[i].name);
    }
    kvs__free(c->eps);
    pthread_mutex_destroy(&c->eps_lock);
    if (c->tcp != NULL)
        c->tcp->ops->destroy(c->tcp);
    if (c->shm != NULL)
        c->shm->ops->destroy(c->shm);
    kvs__rpc_close(c->rpc);
    kvs__client_bufs_destroy(c);
    kvs__sessions_destroy(c->sessions);
    kvs__staging_destroy(c->staging);
    for (size_t i = 0; i < c->nregs; i++)
        kvs__free(c->regs[i]);
    kvs__free(c->regs);
    pthread_rwlock_destroy(&c->reg_lock);
    pthread_mutex_destroy(&c->wait_lock);
    pthread_cond_destroy(&c->wait_cond);
    pthread_mutex_destroy(&c->owners_lock);
    pthread_mutex_destroy(&c->psess_lock);
    kvs__free(c->node);
    kvs__free(c->master_host);
    kvs__free(c->etcd);
    kvs__free(c->etcd_prefix);
    kvs__auth_wipe(&c->auth);
    kvs__free(c);
}

int kvs_client_mount_segment(kvs_client_t *c, uint64_t size, const char *name,
                             const char *advertise_host)
{
    if (c == NULL || size == 0)
        return kvs__fail(KVS_INVALID_PARAMS, "kvs_client_mount_segment: client and size > 0 "
                                             "are required");
    if (name != NULL && (*name == '\0' || strlen(name) > KVS_MAX_NAME_LEN))
        return kvs__fail(KVS_INVALID_PARAMS, "segment name must be 1..%u bytes", KVS_MAX_NAME_LEN);
    kvs__owner_config_t oc = {
        .master_host = c->master_host,
        .master_port = c->master_port,
        .etcd = c->etcd,
        .etcd_prefix = c->etcd_prefix,
        .segment_name = name,
        .segment_size = size,
        .advertise_host = advertise_host,
        /* The client's own name for its host, so that same-node placement and the segment's
         * default name agree with the client's local_hostname. */
        .node = c->node,
        .rpc_timeout_ms = 5000,
    };
    kvs__data_server_config_init(&oc.data);
    oc.data.auth = c->auth; /* peers of our segment prove the secret we were given */
    oc.data.tls = c->tls;
    kvs__client_enter(c);
    /* Created outside owners_lock (it mounts with the master, seconds at worst), so scrapes and
     * segment-name lookups never wait for it; listed under it. */
    kvs__owner_t *o = NULL;
    int rc = kvs__owner_create(&oc, &o);
    if (rc == KVS_OK) {
        pthread_mutex_lock(&c->owners_lock);
        kvs__owner_t **grown = kvs__realloc(c->owners, (c->nowners + 1) * sizeof(*grown));
        if (grown != NULL) {
            c->owners = grown;
            c->owners[c->nowners++] = o;
            o = NULL;
        } else {
            rc = KVS_NO_MEMORY;
        }
        pthread_mutex_unlock(&c->owners_lock);
        kvs__owner_destroy(o); /* not listed: unmounted again */
    }
    kvs__client_leave(c);
    if (rc != KVS_OK)
        return kvs__fail(rc, "mounting a %llu-byte segment failed: %s", (unsigned long long)size,
                         kvs_status_str(rc));
    return KVS_OK;
}

/* ---- registration ---------------------------------------------------------------------------- */

/* Memory type through the CUDA driver, if the process has loaded it. A device pointer can only
 * exist once libcuda is in the process, so it is never loaded here (RTLD_NOLOAD). */
int kvs__classify_memory(const void *addr, int *domain_p)
{
    *domain_p = KVS_DOMAIN_HOST;
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL)
        return KVS_OK;
    /* cuPointerGetAttributes (plural), unlike cuPointerGetAttribute, answers plain host memory
     * with success and zero values instead of an error. */
    typedef int (*get_attrs_fn)(unsigned, const int *, void **, unsigned long long);
    get_attrs_fn get_attrs = (get_attrs_fn)(uintptr_t)dlsym(lib, "cuPointerGetAttributes");
    unsigned int type = 0;
    int ordinal = -1;
    /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2 (CU_MEMORYTYPE_DEVICE = 2), ..._DEVICE_ORDINAL = 9 */
    const int attrs[2] = {2, 9};
    void *out[2] = {&type, &ordinal};
    if (get_attrs != NULL && get_attrs(2, attrs, out, (unsigned long long)(uintptr_t)addr) == 0 &&
        type == 2 && ordinal >= 0)
        *domain_p = ordinal;
    dlclose(lib);
    return KVS_OK;
}

/* Index of the first buffer whose start is above `addr`. */
static size_t reg_upper_locked(const kvs_client_t *c, uintptr_t addr)
{
    size_t lo = 0, hi = c->nregs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->regs[mid]->start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int kvs_client_register_buffer(kvs_client_t *c, void *addr, size_t len)
{
    if (c == NULL || addr == NULL || len == 0 || (uintptr_t)addr > UINTPTR_MAX - len)
        return kvs__fail(KVS_INVALID_PARAMS, "register_buffer: client, address and length > 0 "
                                             "are required");
    int domain;
    kvs__classify_memory(addr, &domain);
    if (domain != KVS_DOMAIN_HOST && !kvs__gpu_built())
        return kvs__fail(KVS_INVALID_PARAMS,
                         "register_buffer: %p is memory of GPU %d; GPU memory needs a CUDA "
                         "build of kvstash with a GPU data path",
                         addr, domain);
    kvs__reg_t *r = kvs__calloc(1, sizeof(*r));
    if (r == NULL)
        return kvs__fail(KVS_NO_MEMORY, "register_buffer: out of memory");
    r->start = (uintptr_t)addr;
    r->end = r->start + len;
    r->domain = domain;
    pthread_rwlock_wrlock(&c->reg_lock);
    size_t i = reg_upper_locked(c, r->start);
    int rc = KVS_OK;
    if ((i > 0 && c->regs[i - 1]->end > r->start) || (i < c->nregs && c->regs[i]->start < r->end))
        rc = kvs__fail(KVS_INVALID_PARAMS,
                       "register_buffer: [%p, +%zu) overlaps a registered "
                       "buffer",
                       addr, len);
    if (rc == KVS_OK && c->nregs == c->regs_cap) {
        size_t cap = c->regs_cap ? c->regs_cap * 2 : 16;
        kvs__reg_t **grown = kvs__realloc(c->regs, cap * sizeof(*grown));
        if (grown == NULL) {
            rc = kvs__fail(KVS_NO_MEMORY, "register_buffer: out of memory");
        } else {
            c->regs = grown;
            c->regs_cap = cap;
        }
    }
    if (rc == KVS_OK) {
        memmove(&c->regs[i + 1], &c->regs[i], (c->nregs - i) * sizeof(*c->regs));
        c->regs[i] = r;
        c->nregs++;
        c->reg_bytes += len;
    }
    pthread_rwlock_unlock(&c->reg_lock);
    if (rc != KVS_OK)
        kvs__free(r);
    return rc;
}

int kvs_client_unregister_buffer(kvs_client_t *c, void *addr)
{
    if (c == NULL || addr == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "unregister_buffer: client and address required");
    pthread_rwlock_wrlock(&c->reg_lock);
    size_t i = reg_upper_locked(c, (uintptr_t)addr);
    kvs__reg_t *r = i > 0 && c->regs[i - 1]->start == (uintptr_t)addr ? c->regs[i - 1] : NULL;
    if (r != NULL) {
        memmove(&c->regs[i - 1], &c->regs[i], (c->nregs - i) * sizeof(*c->regs));
        c->nregs--;
        c->reg_bytes -= r->end - r->start;
        atomic_store(&r->dead, true);
    }
    pthread_rwlock_unlock(&c->reg_lock);
    if (r == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "unregister_buffer: no buffer registered at %p", addr);
    /* Calls that pinned it finish (or fail) within their transfer deadline. */
    pthread_mutex_lock(&c->wait_lock);
    while (atomic_load(&r->pins) > 0)
        pthread_cond_wait(&c->wait_cond, &c->wait_lock);
    pthread_mutex_unlock(&c->wait_lock);
    kvs__free(r);
    return KVS_OK;
}

int kvs_client_buffer_domain(kvs_client_t *c, const void *ptr, size_t len)
{
    uintptr_t p = (uintptr_t)ptr;
    if (c == NULL || ptr == NULL || len == 0 || p > UINTPTR_MAX - len)
        return kvs__fail(KVS_INVALID_PARAMS, "buffer_domain: a client and a non-empty range "
                                             "are required");
    pthread_rwlock_rdlock(&c->reg_lock);
    size_t i = reg_upper_locked(c, p);
    int rc = i == 0 || c->regs[i - 1]->end < p + len     ? KVS_INVALID_PARAMS
             : c->regs[i - 1]->domain == KVS_DOMAIN_HOST ? -1
                                                         : c->regs[i - 1]->domain;
    pthread_rwlock_unlock(&c->reg_lock);
    return rc;
}

bool kvs__reg_pin_locked(kvs_client_t *c, const void *ptr, size_t len, kvs__pinset_t *ps,
                         int *domain_p)
{
    uintptr_t p = (uintptr_t)ptr;
    if (ptr == NULL || len == 0 || p > UINTPTR_MAX - len)
        return false;
    size_t i = reg_upper_locked(c, p);
    if (i == 0 || c->regs[i - 1]->end < p + len)
        return false;
    kvs__reg_t *r = c->regs[i - 1];
    *domain_p = r->domain;
    /* Fragments of one call mostly share a buffer: pin it once. */
    if (ps->n > 0 && ps->regs[ps->n - 1] == r)
        return true;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        kvs__reg_t **grown = kvs__realloc(ps->regs, cap * sizeof(*grown));
        if (grown == NULL)
            return false;
        ps->regs = grown;
        ps->cap = cap;
    }
    atomic_fetch_add(&r->pins, 1);
    ps->regs[ps->n++] = r;
    return true;
}

void kvs__pinset_release(kvs_client_t *c, kvs__pinset_t *ps)
{
    /* Under the lock: unregister frees a buffer once it sees no pin, so a buffer may not be
     * read after its last pin goes except while the lock is held. */
    if (ps->n > 0) {
        bool wake = false;
        pthread_mutex_lock(&c->wait_lock);
        for (size_t i = 0; i < ps->n; i++) {
            kvs__reg_t *r = ps->regs[i];
            if (atomic_fetch_sub(&r->pins, 1) == 1 && atomic_load(&r->dead))
                wake = true;
        }
        if (wake)
            pthread_cond_broadcast(&c->wait_cond);
        pthread_mutex_unlock(&c->wait_lock);
    }
    kvs__free(ps->regs);
    *ps = (kvs__pinset_t){0};
}

/* ---- master calls ---------------------------------------------------------------------------- */

/* A master with another incarnation than the one last seen has restarted: nothing the client
 * cached from its predecessor (shm mappings, keyed by segment ids the new master never hands
 * out again) is of use; the mappings are dropped once no transfer uses them. */
static void check_incarnation(kvs_client_t *c)
{
    uint64_t now = kvs__rpc_incarnation(c->rpc);
    uint64_t seen = atomic_exchange(&c->incarnation, now);
    if (seen == now || seen == 0)
        return;
    kvs_info("the master restarted (incarnation %016llx, was %016llx); dropping cached "
             "segments",
             (unsigned long long)now, (unsigned long long)seen);
    if (c->shm != NULL)
        kvs__shm_retain(c->shm, NULL, 0);
}

uint64_t kvs__client_rpc_deadline(const kvs_client_t *c)
{
    return kvs__rpc_deadline(c->rpc);
}

int kvs__client_call(kvs_client_t *c, kvs__wbuf_t *req, kvs__wbuf_t *rsp, uint64_t deadline_ns)
{
    int rc = kvs__frame_end(req);
    if (rc == KVS_OK)
        rc = kvs__rpc_call_until(c->rpc, req, rsp, deadline_ns);
    if (rc == KVS_OK)
        check_incarnation(c);
    if (rc != KVS_OK) {
        atomic_fetch_add(&c->st.rpc_failures, 1);
        /* The transport's own codes become Mooncake's RPC_FAIL for callers; NOT_LEADER (a
         * standby named by host:port) and NO_LEADER (etcd names none) say what to do. */
        if (rc != KVS_TIMED_OUT && rc != KVS_NO_MEMORY && rc != KVS_INVALID_PARAMS &&
            rc != KVS_NOT_LEADER && rc != KVS_NO_LEADER)
            rc = KVS_RPC_FAIL;
    }
    return rc;
}

/* ---- batched master calls ------------------------------------------------------------------
 * A legal call (up to KVS_MAX_BATCH keys of up to KVS_MAX_KEY_LEN bytes) can outgrow one frame
 * (65,536 keys of 1 KiB are 67 MB), so requests are split into frames that fit and the answers
 * joined. Replies always fit: test_proto checks the schema's bounds against the frame limit. */

/* The request of one batch call: either keys (LOOKUP, EXISTS, ...) or PUT_START items. Keys
 * requests also carry the leases to release, as many per frame as fit. */
typedef struct {
    uint16_t type;
    const kvs__keys_req_t *keys;
    const kvs__put_start_req_t *put;
} batch_req_t;

/* Bytes of the releases [first, first + count) in a keys request. */
static uint64_t releases_bytes(const kvs__keys_req_t *kr, uint32_t first, uint32_t count)
{
    uint64_t b = 0;
    for (uint32_t i = first; i < first + count; i++)
        b += KVS__MIN_BYTES_lease_release + kr->released[i].key.len;
    return b;
}

static uint32_t batch_len(const batch_req_t *b)
{
    return b->keys ? b->keys->nkeys : b->put->nitems;
}

/* The fields since version 4, which the minimum encodings (of version 3) leave out: a frame
 * of the longest keys must still fit with them. put_start_req: soft_pin_action,
 * soft_pin_ttl_ms and the count of preferred_segments; keys_req: segment's length; put_item:
 * group's length. */
#define PUT_START_V4_BYTES (4u + 8u + 4u)
#define KEYS_V4_BYTES      4u
#define PUT_ITEM_V4_BYTES  4u

static uint64_t put_start_fixed_bytes(const kvs__put_start_req_t *ps)
{
    uint64_t b = KVS__MIN_BYTES_put_start_req + PUT_START_V4_BYTES + ps->node.len +
                 ps->preferred_segment.len;
    for (uint32_t i = 0; i < ps->npreferred_segments; i++)
        b += 4u + ps->preferred_segments[i].len;
    return b;
}

/* The first `count` elements from `first` fit one frame's payload. */
static uint32_t batch_fit(const batch_req_t *b, uint32_t first)
{
    uint64_t bytes = b->keys ? KVS__MIN_BYTES_keys_req + KEYS_V4_BYTES + b->keys->segment.len
                             : put_start_fixed_bytes(b->put);
    if (b->keys && first == 0)
        bytes += releases_bytes(b->keys, 0, b->keys->nreleased);
    uint32_t n = batch_len(b), i = first;
    for (; i < n; i++) {
        bytes +=
            b->keys ? 4u + b->keys->keys[i].len + (b->keys->ntokens ? KVS__MIN_BYTES_put_token : 0u)
                    : KVS__MIN_BYTES_put_item + PUT_ITEM_V4_BYTES + b->put->items[i].key.len +
                          b->put->items[i].group.len;
        if (bytes > KVS_FRAME_MAX_PAYLOAD)
            break;
    }
    return i - first;
}

static void batch_encode(const batch_req_t *b, uint32_t first, uint32_t count, kvs__wbuf_t *w)
{
    if (b->keys) {
        kvs__keys_req_t part = *b->keys;
        part.nkeys = count;
        part.keys += first;
        if (part.ntokens) {
            part.ntokens = count;
            part.tokens += first;
        }
        if (first > 0)
            part.nreleased = 0; /* the first frame carries them */
        kvs__keys_req_encode(w, &part);
    } else {
        kvs__put_start_req_t part = *b->put;
        part.nitems = count;
        part.items += first;
        kvs__put_start_req_encode(w, &part);
    }
}

int kvs__placement_join(kvs__placement_rsp_t *all, const kvs__placement_rsp_t *part, uint32_t first,
                        kvs__arena_t *arena)
{
    memcpy(all->objs + first, part->objs, (size_t)part->nobjs * sizeof(*part->objs));
    kvs__seg_info_t *segs =
        kvs__arena_alloc(arena, ((size_t)all->nsegs + part->nsegs) * sizeof(*segs));
    if (segs == NULL)
        return KVS_NO_MEMORY;
    memcpy(segs, all->segs, (size_t)all->nsegs * sizeof(*segs));
    uint32_t ns = all->nsegs;
    for (uint32_t i = 0; i < part->nsegs; i++) {
        uint32_t j = 0;
        while (j < ns && segs[j].id != part->segs[i].id)
            j++;
        if (j == ns)
            segs[ns++] = part->segs[i];
    }
    all->segs = segs;
    all->nsegs = ns;
    return KVS_OK;
}

/* Keys [first, first + count) of a batch whose part failed with `rc`. */
static void fail_part(kvs__status_list_rsp_t *sl, kvs__placement_rsp_t *pr, uint32_t first,
                      uint32_t count, int rc)
{
    for (uint32_t i = first; i < first + count; i++) {
        if (sl != NULL)
            sl->results[i] = rc;
        else
            pr->objs[i] = (kvs__obj_desc_t){.status = rc};
    }
}

/* A batch call's request and reply buffers. One set is kept per client between calls: a
 * 1536-key lookup's buffers (about 150 KiB) went back to the C library each time, which gave
 * them to the system, and the next call took a page fault per page. Concurrent calls take
 * fresh ones; at most BUFS_KEEP_MAX bytes are kept. */
struct kvs__call_bufs {
    kvs__wbuf_t req, rsp;
};

#define BUFS_KEEP_MAX ((size_t)8 << 20)

static struct kvs__call_bufs *bufs_take(kvs_client_t *c)
{
    struct kvs__call_bufs *bf = atomic_exchange(&c->spare_bufs, NULL);
    if (bf == NULL && (bf = kvs__malloc(sizeof(*bf))) != NULL) {
        kvs__wbuf_init(&bf->req);
        kvs__wbuf_init(&bf->rsp);
    }
    return bf;
}

static void bufs_free(struct kvs__call_bufs *bf)
{
    if (bf == NULL)
        return;
    kvs__wbuf_free(&bf->req);
    kvs__wbuf_free(&bf->rsp);
    kvs__free(bf);
}

static void bufs_give(kvs_client_t *c, struct kvs__call_bufs *bf)
{
    struct kvs__call_bufs *none = NULL;
    if (bf->req.cap + bf->rsp.cap <= BUFS_KEEP_MAX) {
        kvs__wbuf_reset(&bf->req);
        kvs__wbuf_reset(&bf->rsp);
        if (atomic_compare_exchange_strong(&c->spare_bufs, &none, bf))
            return;
    }
    bufs_free(bf);
}

void kvs__client_bufs_destroy(kvs_client_t *c)
{
    bufs_free(atomic_exchange(&c->spare_bufs, NULL));
}

/* One batch call: answers in `sl` (status lists) or `pr` (placements), one entry per element,
 * everything owned by `arena`. A part the master refused or that failed in transport gives
 * its keys that status; the call fails (with the first such status) only if every part did. */
static int batch_call(kvs_client_t *c, const batch_req_t *b, kvs__arena_t *arena,
                      kvs__status_list_rsp_t *sl, kvs__placement_rsp_t *pr, uint64_t deadline_ns)
{
    uint32_t n = batch_len(b);
    if (sl != NULL) {
        *sl = (kvs__status_list_rsp_t){.nresults = n};
        sl->results = kvs__arena_alloc(arena, (size_t)n * sizeof(*sl->results));
    } else {
        *pr = (kvs__placement_rsp_t){.nobjs = n};
        pr->objs = kvs__arena_alloc(arena, (size_t)n * sizeof(*pr->objs));
        pr->segs = kvs__arena_alloc(arena, 0);
    }
    struct kvs__call_bufs *bf =
        (sl != NULL ? sl->results == NULL : pr->objs == NULL || pr->segs == NULL) ? NULL
                                                                                  : bufs_take(c);
    if (bf == NULL)
        return KVS_NO_MEMORY;
    kvs__wbuf_t *req = &bf->req, *rsp = &bf->rsp;
    int rc = KVS_OK, first_err = KVS_OK;
    uint32_t parts_ok = 0;
    /* At least one frame: a RELEASE has no keys, only releases. A part that fails fails its
     * own keys; what the other parts did stands and is reported per key, so a caller can
     * finish (end, revoke, release) exactly what happened. */
    for (uint32_t first = 0; first < n || (first == 0 && n == 0);) {
        uint32_t count = batch_fit(b, first);
        if (count == 0 && n > 0) {
            rc = KVS_INVALID_PARAMS; /* one element larger than a frame: validation missed it */
            first_err = first_err ? first_err : rc;
            count = n - first;
            fail_part(sl, pr, first, count, rc);
            break;
        }
        kvs__rpc_begin(c->rpc, req, b->type);
        batch_encode(b, first, count, req);
        rc = kvs__client_call(c, req, rsp, deadline_ns);
        /* The answer is kept in the arena: its strings are borrowed by the decoded parts. */
        uint8_t *payload = rc == KVS_OK ? kvs__arena_alloc(arena, rsp->len) : NULL;
        if (rc == KVS_OK && payload == NULL)
            rc = KVS_NO_MEMORY;
        if (rc == KVS_OK && rsp->len > 0)
            memcpy(payload, rsp->data, rsp->len);
        if (rc == KVS_OK && sl != NULL) {
            kvs__status_list_rsp_t part;
            if (kvs__status_list_rsp_decode(payload, rsp->len, rsp->version, arena, &part) !=
                    KVS_OK ||
                (part.status == KVS_OK && part.nresults != count))
                rc = KVS_PROTOCOL_ERROR;
            else if ((rc = part.status) == KVS_OK)
                memcpy(sl->results + first, part.results, (size_t)count * sizeof(*part.results));
        } else if (rc == KVS_OK) {
            kvs__placement_rsp_t part;
            if (kvs__placement_rsp_decode(payload, rsp->len, rsp->version, arena, &part) !=
                    KVS_OK ||
                (part.status == KVS_OK && part.nobjs != count))
                rc = KVS_PROTOCOL_ERROR;
            else if ((rc = part.status) == KVS_OK)
                rc = kvs__placement_join(pr, &part, first, arena);
        }
        if (rc == KVS_OK) {
            parts_ok++;
        } else {
            first_err = first_err ? first_err : rc;
            fail_part(sl, pr, first, count, rc);
        }
        first += count;
        if (n == 0)
            break;
    }
    /* The call fails as a whole only when no part got through. */
    rc = parts_ok > 0 ? KVS_OK : first_err;
    bufs_give(c, bf);
    return rc;
}

/* ---- lease releases ------------------------------------------------------------------------ */

/* Beyond this many pending releases, more are dropped: those leases end by expiry. */
#define REL_PENDING_CAP (1u << 20)

void kvs__client_release_later(kvs_client_t *c, uint32_t n, const kvs__str_t *keys,
                               const uint64_t *lease_ids)
{
    pthread_mutex_lock(&c->rel_lock);
    for (uint32_t i = 0; i < n && c->nrel < REL_PENDING_CAP; i++) {
        if (lease_ids[i] == 0)
            continue;
        if (c->nrel == c->cap_rel) {
            uint32_t cap = c->cap_rel ? 2 * c->cap_rel : 64;
            kvs__lease_release_t *r = kvs__realloc(c->rel, cap * sizeof(*r));
            if (r == NULL)
                break;
            c->rel = r;
            c->cap_rel = cap;
        }
        char *k = kvs__strndup(keys[i].ptr, keys[i].len);
        if (k == NULL)
            break;
        c->rel[c->nrel++] = (kvs__lease_release_t){{k, keys[i].len}, lease_ids[i]};
    }
    pthread_mutex_unlock(&c->rel_lock);
}

/* Takes up to KVS_MAX_RELEASES pending releases (caller frees them with releases_free). */
static uint32_t releases_take(kvs_client_t *c, kvs__lease_release_t **rel_p)
{
    pthread_mutex_lock(&c->rel_lock);
    uint32_t n = KVS_MIN(c->nrel, KVS_MAX_RELEASES);
    kvs__lease_release_t *r = n ? kvs__malloc(n * sizeof(*r)) : NULL;
    if (r == NULL) {
        n = 0;
    } else {
        /* The newest go first: the oldest are the likeliest to have expired anyway. */
        memcpy(r, c->rel + (c->nrel - n), n * sizeof(*r));
        c->nrel -= n;
    }
    pthread_mutex_unlock(&c->rel_lock);
    *rel_p = r;
    return n;
}

static void releases_free(kvs__lease_release_t *r, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        kvs__free((char *)r[i].key.ptr);
    kvs__free(r);
}

/* Sends what is pending in RELEASE requests (at close). */
static void releases_flush(kvs_client_t *c)
{
    uint64_t deadline = kvs__client_rpc_deadline(c);
    for (;;) {
        kvs__lease_release_t *rel;
        uint32_t n = releases_take(c, &rel);
        if (n == 0)
            return;
        kvs__keys_req_t kr = {.nreleased = n, .released = rel};
        batch_req_t b = {KVS_MSG_RELEASE, &kr, NULL};
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        kvs__status_list_rsp_t sl;
        int rc = batch_call(c, &b, &arena, &sl, NULL, deadline);
        kvs__arena_free(&arena);
        releases_free(rel, n);
        if (rc != KVS_OK)
            return; /* the leases end by expiry */
    }
}

static int keys_call(kvs_client_t *c, uint16_t type, uint32_t flags, kvs__str_t segment, uint32_t n,
                     const kvs__str_t *keys, const kvs__put_token_t *tokens, kvs__arena_t *arena,
                     kvs__status_list_rsp_t *sl, kvs__placement_rsp_t *pr, uint64_t deadline_ns)
{
    kvs__lease_release_t *rel = NULL;
    uint32_t nrel = flags & KVS__CALL_KEEP_RELEASES ? 0 : releases_take(c, &rel);
    flags &= ~KVS__CALL_KEEP_RELEASES;
    kvs__keys_req_t kr = {.flags = flags,
                          .segment = segment,
                          .nkeys = n,
                          .keys = (kvs__str_t *)keys,
                          .nreleased = nrel,
                          .released = rel,
                          .ntokens = tokens ? n : 0,
                          .tokens = (kvs__put_token_t *)tokens};
    batch_req_t b = {type, &kr, NULL};
    int rc = batch_call(c, &b, arena, sl, pr, deadline_ns);
    releases_free(rel, nrel); /* sent, or lost with the call: the leases then expire */
    return rc;
}

int kvs__client_keys_call(kvs_client_t *c, uint16_t type, uint32_t flags, uint32_t n,
                          const kvs__str_t *keys, const kvs__put_token_t *tokens,
                          kvs__arena_t *arena, kvs__status_list_rsp_t *sl, kvs__placement_rsp_t *pr,
                          uint64_t deadline_ns)
{
    return keys_call(c, type, flags, (kvs__str_t){"", 0}, n, keys, tokens, arena, sl, pr,
                     deadline_ns);
}

int kvs__client_put_start(kvs_client_t *c, const kvs__put_start_req_t *ps, kvs__arena_t *arena,
                          kvs__placement_rsp_t *pr, uint64_t deadline_ns)
{
    batch_req_t b = {KVS_MSG_PUT_START, NULL, ps};
    return batch_call(c, &b, arena, NULL, pr, deadline_ns);
}

int kvs__client_status_list_call(kvs_client_t *c, uint16_t type, uint32_t flags, size_t n,
                                 const char *const keys[], int results[])
{
    return kvs__client_status_list_call_seg(c, type, flags, "", n, keys, results);
}

int kvs__client_status_list_call_seg(kvs_client_t *c, uint16_t type, uint32_t flags,
                                     const char *segment, size_t n, const char *const keys[],
                                     int results[])
{
    if (n == 0 || n > KVS_MAX_BATCH || keys == NULL || results == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "%s: 1..%u keys and a results array are required",
                         kvs__msg_name(type), KVS_MAX_BATCH);
    kvs__str_t *ks = kvs__calloc(n, sizeof(*ks));
    if (ks == NULL)
        return kvs__fail(KVS_NO_MEMORY, "%s: out of memory", kvs__msg_name(type));
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == NULL || kvs__key_check(keys[i], strlen(keys[i])) != KVS_OK) {
            kvs__free(ks);
            return kvs__fail(KVS_INVALID_PARAMS, "%s: key %zu is empty, NULL or longer than %u",
                             kvs__msg_name(type), i, KVS_MAX_KEY_LEN);
        }
        ks[i] = kvs__str_c(keys[i]);
    }
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__status_list_rsp_t sl;
    int rc = keys_call(c, type, flags, kvs__str_c(segment), (uint32_t)n, ks, NULL, &arena, &sl,
                       NULL, kvs__client_rpc_deadline(c));
    if (rc == KVS_OK) {
        for (size_t i = 0; i < n; i++)
            results[i] = sl.results[i];
    } else {
        rc = kvs__fail(rc, "%s failed: %s", kvs__msg_name(type), kvs_status_str(rc));
    }
    kvs__arena_free(&arena);
    kvs__free(ks);
    return rc;
}

int kvs_client_remove(kvs_client_t *c, const char *key, bool force)
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "remove: client is NULL");
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.remove_calls, 1);
    int result = 0;
    int rc = kvs__client_status_list_call(c, KVS_MSG_REMOVE, force ? KVS_KEYS_FLAG_FORCE : 0, 1,
                                          &key, &result);
    kvs__client_leave(c);
    if (rc == KVS_OK && result == KVS_OK)
        kvs__sessions_forget(c, 1, &key, NULL);
    if (rc == KVS_OK && result != KVS_OK)
        rc = kvs__fail(result, "remove '%s': %s", key, kvs_status_str(result));
    return rc;
}

int kvs_client_batch_exists(kvs_client_t *c, size_t n, const char *const keys[], int results[])
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "batch_exists: client is NULL");
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.exists_calls, 1);
    int rc = kvs__client_status_list_call(c, KVS_MSG_EXISTS, 0, n, keys, results);
    kvs__client_leave(c);
    return rc;
}

int kvs_client_exists(kvs_client_t *c, const char *key)
{
    int result = 0;
    int rc = kvs_client_batch_exists(c, 1, &key, &result);
    return rc == KVS_OK ? result : rc;
}

int64_t kvs_client_get_size(kvs_client_t *c, const char *key)
{
    return kvs__client_get_size_until(c, key, c != NULL ? kvs__client_rpc_deadline(c) : 0);
}

int64_t kvs__client_get_size_until(kvs_client_t *c, const char *key, uint64_t deadline_ns)
{
    if (c == NULL || key == NULL || kvs__key_check(key, strlen(key)) != KVS_OK)
        return kvs__fail(KVS_INVALID_PARAMS, "get_size: client and a valid key are required");
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.size_calls, 1);
    kvs__str_t k = kvs__str_c(key);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    int64_t result;
    kvs__placement_rsp_t pr;
    int rc =
        kvs__client_keys_call(c, KVS_MSG_LOOKUP, 0, 1, &k, NULL, &arena, NULL, &pr, deadline_ns);
    if (rc == KVS_OK)
        kvs__client_release_later(c, 1, &k, &pr.objs[0].lease_id); /* nothing is read */
    if (rc == KVS_OK)
        rc = pr.objs[0].status;
    if (rc == KVS_OK)
        result = (int64_t)pr.objs[0].size;
    else
        result = kvs__fail(rc, "get_size '%s': %s", key, kvs_status_str(rc));
    kvs__arena_free(&arena);
    kvs__client_leave(c);
    return result;
}

int kvs__client_endpoint(kvs_client_t *c, kvs_transport_t *t, const char *name,
                         uint64_t deadline_ns, kvs_endpoint_t **ep_p)
{
    pthread_mutex_lock(&c->eps_lock);
    for (size_t i = 0; i < c->neps; i++) {
        if (c->eps[i].t == t && strcmp(c->eps[i].name, name) == 0) {
            t->ops->ep_hold(t, c->eps[i].ep);
            *ep_p = c->eps[i].ep;
            pthread_mutex_unlock(&c->eps_lock);
            return KVS_OK;
        }
    }
    pthread_mutex_unlock(&c->eps_lock);
    /* Opened (resolved) without the lock: a slow name stalls only this call. */
    kvs_endpoint_t *ep;
    int rc = t->ops->ep_open(t, name, deadline_ns, &ep);
    if (rc != KVS_OK)
        return rc;
    pthread_mutex_lock(&c->eps_lock);
    bool known = false;
    for (size_t i = 0; i < c->neps && !known; i++)
        known = c->eps[i].t == t && c->eps[i].ep == ep;
    if (!known && c->neps == c->eps_cap) {
        size_t cap = c->eps_cap ? 2 * c->eps_cap : 8;
        kvs__client_ep_t *grown = kvs__realloc(c->eps, cap * sizeof(*grown));
        if (grown != NULL) {
            c->eps = grown;
            c->eps_cap = cap;
        }
    }
    char *copy = known || c->neps == c->eps_cap ? NULL : kvs__strdup(name);
    if (copy != NULL) {
        t->ops->ep_hold(t, ep); /* the client's own */
        c->eps[c->neps++] = (kvs__client_ep_t){t, ep, copy};
    }
    pthread_mutex_unlock(&c->eps_lock);
    *ep_p = ep;
    return KVS_OK;
}

/* Closes the endpoints of owners the master no longer lists: their threads, sockets, mappings
 * and pinned memory go once no call uses them. */
static void endpoints_retain(kvs_client_t *c, const kvs__stat_rsp_t *sr)
{
    /* Closed after the lock is let go: a last close joins threads and unmaps segments. */
    kvs__client_ep_t *gone = NULL;
    size_t ngone = 0;
    pthread_mutex_lock(&c->eps_lock);
    for (size_t i = 0; i < c->neps;) {
        bool live = false;
        for (uint32_t q = 0; q < sr->nsegs && !live; q++)
            live = kvs__str_eq(sr->segs[q].endpoint, kvs__str_c(c->eps[i].name));
        if (live) {
            i++;
            continue;
        }
        if (gone == NULL && (gone = kvs__malloc(c->neps * sizeof(*gone))) == NULL)
            break; /* tried again at the next sweep */
        gone[ngone++] = c->eps[i];
        c->eps[i] = c->eps[--c->neps];
    }
    pthread_mutex_unlock(&c->eps_lock);
    for (size_t i = 0; i < ngone; i++) {
        kvs_debug("%s endpoint %s: its owner left; closed", gone[i].t->ops->name, gone[i].name);
        gone[i].t->ops->ep_close(gone[i].t, gone[i].ep);
        kvs__free(gone[i].name);
    }
    kvs__free(gone);
}

void kvs__client_sweep(kvs_client_t *c, uint64_t deadline_ns)
{
    if (c->sweep_ms == 0)
        return;
    pthread_mutex_lock(&c->eps_lock);
    size_t neps = c->neps;
    pthread_mutex_unlock(&c->eps_lock);
    if (neps == 0 && (c->shm == NULL || kvs__shm_mapped(c->shm) == 0))
        return;
    uint64_t now = kvs__now_ns(), last = atomic_load(&c->last_sweep_ns);
    /* One thread sweeps at a time, at most every sweep_ms. */
    if (now - last < c->sweep_ms * KVS_NS_PER_MS ||
        !atomic_compare_exchange_strong(&c->last_sweep_ns, &last, now))
        return;
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__arena_t arena;
    kvs__arena_init(&arena);
    kvs__rpc_begin(c->rpc, &req, KVS_MSG_STAT);
    kvs__stat_rsp_t sr;
    if (kvs__client_call(c, &req, &rsp, deadline_ns) == KVS_OK &&
        kvs__stat_rsp_decode(rsp.data, rsp.len, rsp.version, &arena, &sr) == KVS_OK &&
        sr.status == KVS_OK) {
        uint64_t *ids = kvs__malloc(KVS_MAX(sr.nsegs, 1) * sizeof(*ids));
        for (uint32_t i = 0; ids != NULL && i < sr.nsegs; i++)
            ids[i] = sr.segs[i].id;
        if (ids != NULL && c->shm != NULL)
            kvs__shm_retain(c->shm, ids, sr.nsegs);
        kvs__free(ids);
        endpoints_retain(c, &sr);
    }
    kvs__arena_free(&arena);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
}

const char *kvs_client_segment_name(kvs_client_t *c, size_t index)
{
    if (c == NULL)
        return NULL;
    pthread_mutex_lock(&c->owners_lock);
    const char *name = index < c->nowners ? kvs__owner_name(c->owners[index]) : NULL;
    pthread_mutex_unlock(&c->owners_lock);
    return name;
}

int kvs_client_ping(kvs_client_t *c)
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "ping: client is NULL");
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__client_enter(c);
    kvs__rpc_begin(c->rpc, &req, KVS_MSG_STAT);
    int rc = kvs__client_call(c, &req, &rsp, kvs__client_rpc_deadline(c));
    kvs__client_leave(c);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return rc == KVS_OK ? KVS_OK
                        : kvs__fail(rc, "ping: the master did not answer: %s", kvs_status_str(rc));
}

kvs__staging_t *kvs__client_staging(kvs_client_t *c)
{
    return c->staging;
}

void kvs_free(void *ptr)
{
    kvs__free(ptr);
}

/* ---- statistics ------------------------------------------------------------------------------ */

const kvs__metric_desc_t kvs__client_metrics[] = {
#define DESC_(kind, unit, field, family, labels, help)                                             \
    {KVS_METRIC_##kind, KVS_UNIT_##unit, #field, #family, labels, help},
    KVS_CLIENT_STATS(DESC_)
#undef DESC_
};
const size_t kvs__client_nmetrics = KVS_ARRAY_SIZE(kvs__client_metrics);
const size_t kvs__client_metric_offsets[] = {
#define OFF_(kind, unit, field, family, labels, help) offsetof(kvs_client_stats_t, field),
    KVS_CLIENT_STATS(OFF_)
#undef OFF_
};

/* The whole struct, into *s (ours: full size). */
static void stats_snapshot(kvs_client_t *c, kvs_client_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    kvs__client_stats_t *t = &c->st;
#define LOAD_COUNTER_(f)                               s->f = atomic_load_explicit(&t->f, memory_order_relaxed);
#define LOAD_GAUGE_(f)                                 LOAD_COUNTER_(f)
#define LOAD_HIST_(f)                                  kvs__hist_copy(&s->f, &t->f);
#define LOAD_(kind, unit, field, family, labels, help) LOAD_##kind##_(field)
    KVS_CLIENT_STATS(LOAD_)
#undef LOAD_
#undef LOAD_HIST_
#undef LOAD_GAUGE_
#undef LOAD_COUNTER_
    pthread_rwlock_rdlock(&c->reg_lock);
    s->registered_buffers = c->nregs;
    s->registered_bytes = c->reg_bytes;
    pthread_rwlock_unlock(&c->reg_lock);
    if (c->staging != NULL) {
        const kvs__staging_stats_t *ss = kvs__staging_stats(c->staging);
        s->plan_ns_total += atomic_load(&ss->plan_ns);
        s->staged_reads = atomic_load(&ss->staged_reads);
        s->staged_keys = atomic_load(&ss->staged_keys);
        s->fills = atomic_load(&ss->fills);
        s->scatter_launches = atomic_load(&ss->scatter_launches);
#define FALLBACK_(name) s->fallback_##name = atomic_load(&ss->fallback[KVS_FALLBACK_##name]);
        KVS_STAGING_FALLBACKS(FALLBACK_)
#undef FALLBACK_
        s->staging_held_bytes = atomic_load(&ss->held_bytes);
        s->staging_device = atomic_load(&ss->device);
        s->staging_last_fills = atomic_load(&ss->last_fills);
        s->plan_overlapped_ns = atomic_load(&ss->plan_overlapped_ns);
        s->staging_transfers = atomic_load(&ss->transfers);
        s->auto_direct_calls = atomic_load(&ss->auto_calls[KVS_READ_DIRECT]);
        s->auto_grouped_calls = atomic_load(&ss->auto_calls[KVS_READ_GROUPED]);
        s->auto_staged_calls = atomic_load(&ss->auto_calls[KVS_READ_STAGED]);
        s->auto_not_staged_model = atomic_load(&ss->auto_model_slower);
        s->auto_not_staged_measured = atomic_load(&ss->auto_measured_slower);
        s->auto_explored = atomic_load(&ss->auto_explored);
        s->auto_calibrations = atomic_load(&ss->calibrations);
    }
}

int kvs_client_get_stats_sized(kvs_client_t *c, kvs_client_stats_t *s, size_t size)
{
    if (c == NULL || s == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "get_stats: client and stats are required");
    if (size < KVS_CLIENT_STATS_V0_SIZE)
        return kvs__fail(KVS_INVALID_PARAMS, "get_stats: a stats struct of %zu bytes (at least %u)",
                         size, KVS_CLIENT_STATS_V0_SIZE);
    kvs_client_stats_t all;
    stats_snapshot(c, &all);
    memcpy(s, &all, KVS_MIN(size, sizeof(all)));
    if (size > sizeof(all)) /* a newer caller's fields this library does not know: 0 */
        memset((char *)s + sizeof(all), 0, size - sizeof(all));
    return KVS_OK;
}

/* The symbol programs built against 0.1.0 call: their struct is the 0.1.0 one. */
#undef kvs_client_get_stats
int kvs_client_get_stats(kvs_client_t *c, kvs_client_stats_t *s)
{
    return kvs_client_get_stats_sized(c, s, KVS_CLIENT_STATS_V0_SIZE);
}

int kvs_client_serve_metrics(kvs_client_t *c, const char *bind_host, uint16_t port)
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "serve_metrics: a client is required");
    pthread_mutex_lock(&c->owners_lock);
    int rc = KVS_OK;
    if (c->metrics != NULL) {
        rc = kvs__fail(KVS_INVALID_PARAMS, "serve_metrics: already serving on port %u",
                       (unsigned)kvs__metrics_http_port(c->metrics));
    } else {
        kvs__metrics_http_t *h = NULL;
        rc = kvs__metrics_http_start(bind_host, port, &h);
        if (rc == KVS_OK) {
            kvs__metrics_http_add(h, kvs__client_metrics_render, c);
            c->metrics = h;
            kvs_info("client metrics on http://%s:%u/metrics", bind_host ? bind_host : "0.0.0.0",
                     (unsigned)kvs__metrics_http_port(h));
        }
    }
    pthread_mutex_unlock(&c->owners_lock);
    return rc;
}

int kvs_client_metrics_port(kvs_client_t *c)
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "metrics_port: a client is required");
    pthread_mutex_lock(&c->owners_lock);
    int port = c->metrics != NULL ? (int)kvs__metrics_http_port(c->metrics) : 0;
    pthread_mutex_unlock(&c->owners_lock);
    return port;
}

int kvs__client_metrics_render(void *arg, kvs__text_t *t)
{
    kvs_client_stats_t s;
    stats_snapshot(arg, &s);
    kvs__metric_value_t v[KVS_ARRAY_SIZE(kvs__client_metrics)];
    for (size_t i = 0; i < kvs__client_nmetrics; i++) {
        const char *p = (const char *)&s + kvs__client_metric_offsets[i];
        v[i] = (kvs__metric_value_t){&kvs__client_metrics[i], NULL, 0, NULL};
        if (kvs__client_metrics[i].kind == KVS_METRIC_HIST)
            v[i].hist = (const kvs_histogram_t *)(const void *)p;
        else
            memcpy(&v[i].value, p, sizeof(uint64_t));
    }
    kvs__metrics_write(t, "kvstash_client_", v, kvs__client_nmetrics);
    /* A client with segments of its own is their owner too: their data servers' metrics. */
    kvs_client_t *c = arg;
    pthread_mutex_lock(&c->owners_lock);
    size_t n = c->nowners;
    kvs__data_server_t **ds = n ? kvs__calloc(n, sizeof(*ds)) : NULL;
    for (size_t i = 0; ds != NULL && i < n; i++)
        ds[i] = kvs__owner_data_server(c->owners[i]);
    pthread_mutex_unlock(&c->owners_lock);
    /* Owners live until close, which stops this endpoint first: the pointers stay valid. */
    if (n > 0 && ds == NULL)
        t->failed = true;
    else if (n > 0)
        kvs__data_servers_metrics_write(ds, n, t);
    kvs__free(ds);
    return t->failed ? KVS_NO_MEMORY : KVS_OK;
}
