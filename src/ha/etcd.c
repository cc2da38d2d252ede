/* etcd v3 through its JSON gateway. See etcd_int.h. */
#define _GNU_SOURCE
#include "etcd_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kvs__is_etcd_addr(const char *addr)
{
    return addr != NULL && strncmp(addr, "etcd://", 7) == 0;
}

int kvs__etcd_addr_parse(const char *addr, char **endpoints_p, char **prefix_p)
{
    *endpoints_p = *prefix_p = NULL;
    if (!kvs__is_etcd_addr(addr))
        return KVS_INVALID_PARAMS;
    const char *eps = addr + 7, *slash = strchr(eps, '/');
    const char *env = getenv("KVS_ETCD_PREFIX");
    const char *pre = slash ? slash : env && *env ? env : KVS_ETCD_DEFAULT_PREFIX;
    size_t n = slash ? (size_t)(slash - eps) : strlen(eps);
    if (n == 0 || pre[0] != '/' || strlen(pre) > KVS_MAX_NAME_LEN)
        return KVS_INVALID_PARAMS;
    *endpoints_p = kvs__strndup(eps, n);
    *prefix_p = kvs__strdup(pre);
    if (*endpoints_p == NULL || *prefix_p == NULL) {
        kvs__free(*endpoints_p);
        kvs__free(*prefix_p);
        *endpoints_p = *prefix_p = NULL;
        return KVS_NO_MEMORY;
    }
    return KVS_OK;
}

void kvs__etcd_leader_key(const char *prefix, char *buf, size_t len)
{
    snprintf(buf, len, "%s/leader", prefix && *prefix ? prefix : KVS_ETCD_DEFAULT_PREFIX);
}

#ifndef KVS_HAVE_ETCD

bool kvs__etcd_supported(void)
{
    return false;
}

int kvs__etcd_open(const char *endpoints, uint64_t timeout_ms, kvs__etcd_t **e_p)
{
    (void)endpoints;
    (void)timeout_ms;
    if (e_p != NULL)
        *e_p = NULL;
    kvs_error("etcd (%s): this build of kvstash has no etcd support: rebuild it with libcurl and "
              "json-c installed (Debian: libcurl4-openssl-dev libjson-c-dev)",
              endpoints ? endpoints : "");
    return KVS_UNSUPPORTED;
}

void kvs__etcd_close(kvs__etcd_t *e)
{
    (void)e;
}

const char *kvs__etcd_endpoints(const kvs__etcd_t *e)
{
    (void)e;
    return "";
}

int kvs__etcd_get(kvs__etcd_t *e, const char *key, kvs__etcd_kv_t *kv)
{
    (void)e, (void)key, (void)kv;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_lease_grant(kvs__etcd_t *e, int64_t ttl_s, int64_t *id_p, int64_t *ttl_p)
{
    (void)e, (void)ttl_s, (void)id_p, (void)ttl_p;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_lease_keepalive(kvs__etcd_t *e, int64_t id, int64_t *ttl_p)
{
    (void)e, (void)id, (void)ttl_p;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_lease_revoke(kvs__etcd_t *e, int64_t id)
{
    (void)e, (void)id;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_create(kvs__etcd_t *e, const char *key, const char *value, int64_t lease,
                     int64_t *rev_p)
{
    (void)e, (void)key, (void)value, (void)lease, (void)rev_p;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_delete_if(kvs__etcd_t *e, const char *key, int64_t rev)
{
    (void)e, (void)key, (void)rev;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_leader(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l)
{
    (void)e, (void)prefix, (void)l;
    return KVS_UNSUPPORTED;
}

int kvs__etcd_leader_until(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l,
                           uint64_t deadline_ns)
{
    (void)e, (void)prefix, (void)l, (void)deadline_ns;
    return KVS_UNSUPPORTED;
}

#else

#include <curl/curl.h>
#include <json-c/json.h>
#include <openssl/evp.h>

#define MAX_ENDPOINTS 16
#define MAX_REPLY     (1u << 20) /* an answer longer than this is not one of ours */

struct kvs__etcd {
    pthread_mutex_t lock;
    CURL *curl;
    char *list; /* as given, without "etcd://" */
    char *eps[MAX_ENDPOINTS];
    unsigned neps, cur; /* cur: the endpoint that answered last */
    uint64_t timeout_ms;
    char *reply;
    size_t reply_len;
    bool reply_overflow;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static bool curl_ok;

static void curl_init_once(void)
{
    curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

bool kvs__etcd_supported(void)
{
    return true;
}

const char *kvs__etcd_endpoints(const kvs__etcd_t *e)
{
    return e ? e->list : "";
}

int kvs__etcd_open(const char *endpoints, uint64_t timeout_ms, kvs__etcd_t **e_p)
{
    if (endpoints == NULL || e_p == NULL || timeout_ms == 0)
        return KVS_INVALID_PARAMS;
    if (kvs__is_etcd_addr(endpoints))
        endpoints += 7;
    pthread_once(&curl_once, curl_init_once);
    if (!curl_ok)
        return KVS_INTERNAL_ERROR;
    kvs__etcd_t *e = kvs__calloc(1, sizeof(*e));
    if (e == NULL)
        return KVS_NO_MEMORY;
    pthread_mutex_init(&e->lock, NULL);
    e->timeout_ms = timeout_ms;
    e->list = kvs__strdup(endpoints);
    char *copy = kvs__strdup(endpoints);
    int rc = e->list && copy ? KVS_OK : KVS_NO_MEMORY;
    char *save = NULL;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; rc == KVS_OK && t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        char *host = NULL;
        uint16_t port = 0;
        if (e->neps == MAX_ENDPOINTS || kvs__parse_host_port(t, NULL, &host, &port) != KVS_OK ||
            host == NULL || port == 0 || strpbrk(host, "/?#@ ") != NULL) {
            kvs_error("etcd: '%s' is not an endpoint list HOST:PORT[,HOST:PORT...] (at most %u)",
                      endpoints, MAX_ENDPOINTS);
            rc = KVS_INVALID_PARAMS;
        } else if (asprintf(&e->eps[e->neps], "http://%s:%u", host, (unsigned)port) < 0) {
            e->eps[e->neps] = NULL;
            rc = KVS_NO_MEMORY;
        } else {
            e->neps++;
        }
        kvs__free(host);
    }
    kvs__free(copy);
    if (rc == KVS_OK && e->neps == 0) {
        kvs_error("etcd: no endpoint in '%s'", endpoints);
        rc = KVS_INVALID_PARAMS;
    }
    if (rc == KVS_OK && (e->curl = curl_easy_init()) == NULL)
        rc = KVS_NO_MEMORY;
    if (rc != KVS_OK) {
        kvs__etcd_close(e);
        return rc;
    }
    *e_p = e;
    return KVS_OK;
}

void kvs__etcd_close(kvs__etcd_t *e)
{
    if (e == NULL)
        return;
    if (e->curl != NULL)
        curl_easy_cleanup(e->curl);
    for (unsigned i = 0; i < e->neps; i++)
        free(e->eps[i]); /* asprintf's */
    kvs__free(e->list);
    kvs__free(e->reply);
    pthread_mutex_destroy(&e->lock);
    kvs__free(e);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    kvs__etcd_t *e = arg;
    size_t n = size * nmemb;
    if (e->reply_len + n > MAX_REPLY) {
        e->reply_overflow = true;
        return 0; /* aborts the transfer */
    }
    char *r = kvs__realloc(e->reply, e->reply_len + n + 1);
    if (r == NULL)
        return 0;
    memcpy(r + e->reply_len, ptr, n);
    e->reply = r;
    e->reply_len += n;
    r[e->reply_len] = '\0';
    return n;
}

/* POSTs `body` to `path` on one endpoint after another until one answers 200; *out_p gets the
 * parsed answer (json_object_put it). Caller holds e->lock. */
static int post(kvs__etcd_t *e, const char *path, json_object *body, json_object **out_p,
                uint64_t deadline_ns)
{
    const char *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    int rc = KVS_RPC_FAIL;
    for (unsigned k = 0; k < e->neps && rc == KVS_RPC_FAIL; k++) {
        unsigned i = (e->cur + k) % e->neps;
        /* Each endpoint gets the handle's time-out, never past the caller's deadline. */
        long ms = (long)e->timeout_ms;
        if (deadline_ns != 0) {
            uint64_t now = kvs__now_ns();
            if (now + KVS_NS_PER_MS >= deadline_ns) {
                rc = KVS_TIMED_OUT;
                break;
            }
            ms = (long)KVS_MIN(e->timeout_ms, (deadline_ns - now) / KVS_NS_PER_MS);
        }
        char url[512];
        snprintf(url, sizeof(url), "%s%s", e->eps[i], path);
        e->reply_len = 0;
        e->reply_overflow = false;
        curl_easy_reset(e->curl);
        curl_easy_setopt(e->curl, CURLOPT_URL, url);
        curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, ms);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, ms);
        curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http");
        CURLcode cc = curl_easy_perform(e->curl);
        long status = 0;
        curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
        if (cc != CURLE_OK || e->reply_len == 0) {
            kvs_debug("etcd %s%s: %s", e->eps[i], path,
                      e->reply_overflow ? "answer too long" : curl_easy_strerror(cc));
            continue;
        }
        json_object *out = json_tokener_parse(e->reply);
        if (out == NULL || !json_object_is_type(out, json_type_object)) {
            json_object_put(out);
            kvs_warn("etcd %s%s: HTTP %ld, an answer that is not etcd's", e->eps[i], path, status);
            continue; /* another member may answer */
        }
        if (status != 200) {
            json_object *msg = NULL;
            json_object_object_get_ex(out, "error", &msg);
            if (msg == NULL)
                json_object_object_get_ex(out, "message", &msg);
            const char *m = msg ? json_object_get_string(msg) : "";
            /* A lease that is gone is an answer, not a failure of etcd. */
            bool gone = m != NULL && strstr(m, "lease not found") != NULL;
            if (!gone) /* e.g. a member cut off from its quorum: the others may answer */
                kvs_warn("etcd %s%s: HTTP %ld: %s", e->eps[i], path, status, m ? m : "");
            json_object_put(out);
            if (gone) {
                e->cur = i;
                rc = KVS_OBJECT_NOT_FOUND;
            }
            continue;
        }
        e->cur = i;
        *out_p = out;
        rc = KVS_OK;
    }
    curl_slist_free_all(hdrs);
    return rc;
}

static int call_until(kvs__etcd_t *e, const char *path, json_object *body, json_object **out_p,
                      uint64_t deadline_ns)
{
    if (body == NULL) {
        return KVS_NO_MEMORY;
    }
    pthread_mutex_lock(&e->lock);
    int rc = post(e, path, body, out_p, deadline_ns);
    pthread_mutex_unlock(&e->lock);
    json_object_put(body);
    return rc;
}

static int call(kvs__etcd_t *e, const char *path, json_object *body, json_object **out_p)
{
    return call_until(e, path, body, out_p, 0);
}

static json_object *b64(const char *s)
{
    size_t n = strlen(s);
    char *buf = kvs__malloc(4 * ((n + 2) / 3) + 1);
    if (buf == NULL)
        return NULL;
    EVP_EncodeBlock((unsigned char *)buf, (const unsigned char *)s, (int)n);
    json_object *j = json_object_new_string(buf);
    kvs__free(buf);
    return j;
}

/* Decodes base64 `in` into out (cap bytes, NUL-terminated): false when it is not base64 or
 * does not fit. */
static bool unb64(const char *in, char *out, size_t cap, size_t *len_p)
{
    size_t n = strlen(in);
    if (n % 4 != 0 || n / 4 * 3 > cap + 2)
        return false;
    unsigned char *buf = kvs__malloc(n / 4 * 3 + 1);
    if (buf == NULL)
        return false;
    int got = EVP_DecodeBlock(buf, (const unsigned char *)in, (int)n);
    bool ok = got >= 0;
    size_t len = ok ? (size_t)got : 0;
    /* EVP_DecodeBlock counts the padding's bytes too. */
    for (size_t p = n; ok && p > 0 && in[p - 1] == '=' && len > 0; p--)
        len--;
    ok = ok && len <= cap;
    if (ok) {
        memcpy(out, buf, len);
        out[len] = '\0';
        *len_p = len;
    }
    kvs__free(buf);
    return ok;
}

/* An int64 of the answer (the gateway writes them as strings); absent: 0. */
static int64_t jint(json_object *o, const char *name)
{
    json_object *v = NULL;
    if (o == NULL || !json_object_object_get_ex(o, name, &v))
        return 0;
    return json_object_get_int64(v);
}

static json_object *jget(json_object *o, const char *name)
{
    json_object *v = NULL;
    return o != NULL && json_object_object_get_ex(o, name, &v) ? v : NULL;
}

static json_object *body_new(void)
{
    return json_object_new_object();
}

static void jset(json_object *o, const char *name, json_object *v)
{
    if (o != NULL && v != NULL)
        json_object_object_add(o, name, v);
}

static int etcd_get_until(kvs__etcd_t *e, const char *key, kvs__etcd_kv_t *kv, uint64_t deadline_ns)
{
    if (e == NULL || key == NULL || kv == NULL)
        return KVS_INVALID_PARAMS;
    json_object *body = body_new(), *out = NULL;
    jset(body, "key", b64(key));
    int rc = call_until(e, "/v3/kv/range", body, &out, deadline_ns);
    if (rc != KVS_OK)
        return rc;
    json_object *kvs = jget(out, "kvs");
    if (kvs != NULL && !json_object_is_type(kvs, json_type_array)) {
        rc = KVS_PROTOCOL_ERROR;
    } else if (kvs == NULL || json_object_array_length(kvs) == 0) {
        rc = KVS_OBJECT_NOT_FOUND;
    } else {
        json_object *k = json_object_array_get_idx(kvs, 0);
        json_object *v = jget(k, "value");
        memset(kv, 0, sizeof(*kv));
        if (v != NULL &&
            (!json_object_is_type(v, json_type_string) ||
             !unb64(json_object_get_string(v), kv->value, KVS_ETCD_MAX_VALUE, &kv->len)))
            rc = KVS_PROTOCOL_ERROR;
        kv->create_rev = jint(k, "create_revision");
        kv->mod_rev = jint(k, "mod_revision");
        kv->lease = jint(k, "lease");
    }
    json_object_put(out);
    return rc;
}

int kvs__etcd_get(kvs__etcd_t *e, const char *key, kvs__etcd_kv_t *kv)
{
    return etcd_get_until(e, key, kv, 0);
}

int kvs__etcd_lease_grant(kvs__etcd_t *e, int64_t ttl_s, int64_t *id_p, int64_t *ttl_p)
{
    if (e == NULL || ttl_s <= 0 || id_p == NULL || ttl_p == NULL)
        return KVS_INVALID_PARAMS;
    json_object *body = body_new(), *out = NULL;
    jset(body, "TTL", json_object_new_int64(ttl_s));
    int rc = call(e, "/v3/lease/grant", body, &out);
    if (rc != KVS_OK)
        return rc;
    *id_p = jint(out, "ID");
    *ttl_p = jint(out, "TTL");
    if (*id_p == 0 || *ttl_p <= 0)
        rc = KVS_PROTOCOL_ERROR;
    json_object_put(out);
    return rc;
}

int kvs__etcd_lease_keepalive(kvs__etcd_t *e, int64_t id, int64_t *ttl_p)
{
    if (e == NULL || id == 0 || ttl_p == NULL)
        return KVS_INVALID_PARAMS;
    json_object *body = body_new(), *out = NULL;
    jset(body, "ID", json_object_new_int64(id));
    int rc = call(e, "/v3/lease/keepalive", body, &out);
    if (rc != KVS_OK)
        return rc;
    /* A stream of one answer: {"result": {"ID": .., "TTL": ..}}; TTL absent or 0: expired. */
    json_object *r = jget(out, "result");
    if (r == NULL) {
        rc = KVS_PROTOCOL_ERROR;
    } else {
        *ttl_p = jint(r, "TTL");
        rc = *ttl_p > 0 ? KVS_OK : KVS_OBJECT_NOT_FOUND;
    }
    json_object_put(out);
    return rc;
}

int kvs__etcd_lease_revoke(kvs__etcd_t *e, int64_t id)
{
    if (e == NULL || id == 0)
        return KVS_INVALID_PARAMS;
    json_object *body = body_new(), *out = NULL;
    jset(body, "ID", json_object_new_int64(id));
    int rc = call(e, "/v3/lease/revoke", body, &out);
    json_object_put(out);
    return rc;
}

/* A txn comparing the key's create revision with `rev`, then `op` (a RequestOp) on success. */
static int txn_if_create_rev(kvs__etcd_t *e, const char *key, int64_t rev, json_object *op,
                             json_object **out_p)
{
    json_object *cmp = body_new(), *body = body_new();
    jset(cmp, "key", b64(key));
    jset(cmp, "target", json_object_new_string("CREATE"));
    jset(cmp, "result", json_object_new_string("EQUAL"));
    jset(cmp, "create_revision", json_object_new_int64(rev));
    json_object *cmps = json_object_new_array(), *ops = json_object_new_array();
    if (cmps != NULL && cmp != NULL)
        json_object_array_add(cmps, cmp);
    if (ops != NULL && op != NULL)
        json_object_array_add(ops, op);
    jset(body, "compare", cmps);
    jset(body, "success", ops);
    return call(e, "/v3/kv/txn", body, out_p);
}

int kvs__etcd_create(kvs__etcd_t *e, const char *key, const char *value, int64_t lease,
                     int64_t *rev_p)
{
    if (e == NULL || key == NULL || value == NULL || rev_p == NULL)
        return KVS_INVALID_PARAMS;
    json_object *put = body_new(), *op = body_new(), *out = NULL;
    jset(put, "key", b64(key));
    jset(put, "value", b64(value));
    if (lease != 0)
        jset(put, "lease", json_object_new_int64(lease));
    jset(op, "request_put", put);
    int rc = txn_if_create_rev(e, key, 0, op, &out);
    if (rc != KVS_OK)
        return rc;
    json_object *ok = jget(out, "succeeded");
    if (ok != NULL && json_object_get_boolean(ok)) {
        /* The put is the txn's only write: its revision is the header's. */
        *rev_p = jint(jget(out, "header"), "revision");
        rc = *rev_p > 0 ? KVS_OK : KVS_PROTOCOL_ERROR;
    } else {
        rc = KVS_OBJECT_ALREADY_EXISTS;
    }
    json_object_put(out);
    return rc;
}

int kvs__etcd_delete_if(kvs__etcd_t *e, const char *key, int64_t rev)
{
    if (e == NULL || key == NULL || rev <= 0)
        return KVS_INVALID_PARAMS;
    json_object *del = body_new(), *op = body_new(), *out = NULL;
    jset(del, "key", b64(key));
    jset(op, "request_delete_range", del);
    int rc = txn_if_create_rev(e, key, rev, op, &out);
    json_object_put(out);
    return rc;
}

int kvs__etcd_leader(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l)
{
    return kvs__etcd_leader_until(e, prefix, l, 0);
}

int kvs__etcd_leader_until(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l,
                           uint64_t deadline_ns)
{
    char key[KVS_MAX_NAME_LEN + 32];
    kvs__etcd_leader_key(prefix, key, sizeof(key));
    kvs__etcd_kv_t kv;
    int rc = etcd_get_until(e, key, &kv, deadline_ns);
    if (rc == KVS_OBJECT_NOT_FOUND)
        return KVS_NO_LEADER;
    if (rc != KVS_OK)
        return rc;
    char *sp = strchr(kv.value, ' ');
    char *host = NULL;
    memset(l, 0, sizeof(*l));
    if (sp == NULL)
        return KVS_PROTOCOL_ERROR;
    *sp = '\0';
    char *end = NULL;
    l->incarnation = strtoull(sp + 1, &end, 16);
    if (end == sp + 1 || *end != '\0' ||
        kvs__parse_host_port(kv.value, NULL, &host, &l->port) != KVS_OK || host == NULL ||
        l->port == 0 || strlen(host) > KVS_MAX_NAME_LEN) {
        kvs__free(host);
        return KVS_PROTOCOL_ERROR;
    }
    snprintf(l->host, sizeof(l->host), "%s", host);
    kvs__free(host);
    l->term = (uint64_t)kv.create_rev;
    return KVS_OK;
}

#endif
