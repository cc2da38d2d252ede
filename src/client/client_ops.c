/* Bulk removal (Mooncake's remove_all, remove_by_regex, batch_remove): the master's listing,
 * matched here, then REMOVE in batches, so each object goes through the same rules as a
 * single remove (leases, pending puts, tombstones and fences). */
#define _GNU_SOURCE
#include "client_int.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

/* Longest pattern remove_by_regex takes. */
#define KVS_MAX_PATTERN_LEN 1024u

int kvs_client_batch_remove(kvs_client_t *c, size_t n, const char *const keys[], bool force,
                            int results[])
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "batch_remove: client is NULL");
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.remove_calls, 1);
    int rc = kvs__client_status_list_call(c, KVS_MSG_REMOVE, force ? KVS_KEYS_FLAG_FORCE : 0, n,
                                          keys, results);
    if (rc == KVS_OK)
        kvs__sessions_forget(c, n, keys, results);
    kvs__client_leave(c);
    return rc;
}

int kvs_client_batch_replica_clear(kvs_client_t *c, size_t n, const char *const keys[],
                                   const char *segment, int results[])
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "batch_replica_clear: client is NULL");
    if (segment == NULL)
        segment = "";
    if (strlen(segment) > KVS_MAX_NAME_LEN)
        return kvs__fail(KVS_INVALID_PARAMS,
                         "batch_replica_clear: segment names are at most %u bytes",
                         KVS_MAX_NAME_LEN);
    if (kvs__rpc_version(c->rpc) < 4)
        return kvs__fail(KVS_UNSUPPORTED,
                         "batch_replica_clear: the master speaks protocol version %u "
                         "(4 or later is needed)",
                         kvs__rpc_version(c->rpc));
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.remove_calls, 1);
    int rc =
        kvs__client_status_list_call_seg(c, KVS_MSG_REPLICA_CLEAR, 0, segment, n, keys, results);
    if (rc == KVS_OK)
        kvs__sessions_forget(c, n, keys, results);
    kvs__client_leave(c);
    return rc;
}

typedef struct {
    char **keys;
    size_t n, cap;
} keylist_t;

static void keylist_free(keylist_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        kvs__free(l->keys[i]);
    kvs__free(l->keys);
    *l = (keylist_t){0};
}

static int keylist_add(keylist_t *l, kvs__str_t key)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        char **k = kvs__realloc(l->keys, cap * sizeof(*k));
        if (k == NULL)
            return KVS_NO_MEMORY;
        l->keys = k;
        l->cap = cap;
    }
    if ((l->keys[l->n] = kvs__strndup(key.ptr, key.len)) == NULL)
        return KVS_NO_MEMORY;
    l->n++;
    return KVS_OK;
}

/* The complete objects the master lists (pending puts are never removed in bulk), matched by
 * `re` when given. The whole listing is taken before anything is removed: removing while
 * paging would move the master's cursor. */
static int list_matching(kvs_client_t *c, const regex_t *re, uint64_t deadline, keylist_t *out)
{
    kvs__list_req_t req = {.prefix = {NULL, 0}, .limit = KVS_MAX_BATCH, .cursor = 0};
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    int rc = KVS_OK;
    for (;;) {
        kvs__rpc_begin(c->rpc, &w, KVS_MSG_LIST);
        kvs__list_req_encode(&w, &req);
        rc = kvs__client_call(c, &w, &rsp, deadline);
        if (rc != KVS_OK)
            break;
        kvs__arena_t arena;
        kvs__arena_init(&arena);
        kvs__list_rsp_t lr;
        rc = kvs__list_rsp_decode(rsp.data, rsp.len, rsp.version, &arena, &lr);
        if (rc == KVS_OK && lr.status != KVS_OK)
            rc = lr.status;
        for (uint32_t i = 0; rc == KVS_OK && i < lr.nentries; i++) {
            const kvs__list_entry_t *e = &lr.entries[i];
            if (e->state != 1 /* complete */)
                continue;
            if (re != NULL) {
                /* Keys hold no NUL bytes (kvs__key_check), so a C string is the whole key. */
                char *k = kvs__strndup(e->key.ptr, e->key.len);
                if (k == NULL) {
                    rc = KVS_NO_MEMORY;
                    break;
                }
                bool hit = regexec(re, k, 0, NULL, 0) == 0;
                kvs__free(k);
                if (!hit)
                    continue;
            }
            rc = keylist_add(out, e->key);
        }
        bool more = rc == KVS_OK && lr.truncated && lr.next_cursor != 0;
        req.cursor = rc == KVS_OK ? lr.next_cursor : 0;
        kvs__arena_free(&arena);
        if (!more)
            break;
    }
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    return rc;
}

/* Removes the listed keys in batches; returns how many went, or the first call failure when
 * none did. */
static int64_t remove_listed(kvs_client_t *c, const keylist_t *l, bool force)
{
    int64_t removed = 0;
    int *res = kvs__malloc(KVS_MAX(KVS_MIN(l->n, (size_t)KVS_MAX_BATCH), 1) * sizeof(*res));
    if (res == NULL)
        return kvs__fail(KVS_NO_MEMORY, "remove: out of memory");
    int first_rc = KVS_OK;
    for (size_t at = 0; at < l->n; at += KVS_MAX_BATCH) {
        size_t n = KVS_MIN(l->n - at, (size_t)KVS_MAX_BATCH);
        int rc = kvs__client_status_list_call(c, KVS_MSG_REMOVE, force ? KVS_KEYS_FLAG_FORCE : 0, n,
                                              (const char *const *)&l->keys[at], res);
        if (rc != KVS_OK) {
            first_rc = first_rc ? first_rc : rc;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            removed += res[i] == KVS_OK;
        kvs__sessions_forget(c, n, (const char *const *)&l->keys[at], res);
    }
    kvs__free(res);
    return removed == 0 && first_rc != KVS_OK ? first_rc : removed;
}

static int64_t remove_matching(kvs_client_t *c, const char *op, const regex_t *re, bool force)
{
    kvs__client_enter(c);
    atomic_fetch_add(&c->st.remove_calls, 1);
    keylist_t l = {0};
    /* The listing gets a metadata call's time per page, as every master call does. */
    int rc = list_matching(c, re, kvs__client_rpc_deadline(c), &l);
    int64_t r = rc == KVS_OK ? remove_listed(c, &l, force)
                             : kvs__fail(rc, "%s: listing failed: %s", op, kvs_status_str(rc));
    keylist_free(&l);
    kvs__client_leave(c);
    return r;
}

int64_t kvs_client_remove_all(kvs_client_t *c, bool force)
{
    if (c == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "remove_all: client is NULL");
    return remove_matching(c, "remove_all", NULL, force);
}

int64_t kvs_client_remove_by_regex(kvs_client_t *c, const char *pattern, bool force)
{
    if (c == NULL || pattern == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "remove_by_regex: client and pattern are required");
    if (strlen(pattern) > KVS_MAX_PATTERN_LEN)
        return kvs__fail(KVS_INVALID_PARAMS, "remove_by_regex: the pattern is longer than %u bytes",
                         KVS_MAX_PATTERN_LEN);
    regex_t re;
    int e = regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB);
    if (e != 0) {
        char why[256];
        regerror(e, &re, why, sizeof(why));
        return kvs__fail(KVS_INVALID_PARAMS, "remove_by_regex: bad pattern '%s': %s", pattern, why);
    }
    int64_t r = remove_matching(c, "remove_by_regex", &re, force);
    regfree(&re);
    return r;
}
