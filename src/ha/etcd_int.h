/* A small client of etcd's v3 API through its JSON gateway (libcurl for HTTP, json-c for JSON,
 * libcrypto for base64): what leader election and leader discovery need, nothing more. Built
 * only when both libraries are found (KVS_HAVE_ETCD); without them every call answers
 * UNSUPPORTED and kvs__etcd_open says why. */
#ifndef KVS_ETCD_INT_H
#define KVS_ETCD_INT_H

#include "../common/common_int.h"
#include "../proto/schema.h"

typedef struct kvs__etcd kvs__etcd_t;

/* The longest value kvs__etcd_get returns (longer values are PROTOCOL_ERROR). */
#define KVS_ETCD_MAX_VALUE 512u
/* The key prefix kvstash uses in etcd when none is given (one cluster per prefix). */
#define KVS_ETCD_DEFAULT_PREFIX "/kvstash"

/* Whether this build can talk to etcd. */
bool kvs__etcd_supported(void);

/* `endpoints`: "HOST:PORT[,HOST:PORT...]" (an "etcd://" in front is accepted). Each call tries
 * the endpoint that answered last, then the others, each within `timeout_ms`. Nothing is sent
 * yet. INVALID_PARAMS for a malformed list, UNSUPPORTED in a build without etcd. */
int kvs__etcd_open(const char *endpoints, uint64_t timeout_ms, kvs__etcd_t **e_p);
void kvs__etcd_close(kvs__etcd_t *e);
/* The endpoint list as given, without "etcd://" (for messages). */
const char *kvs__etcd_endpoints(const kvs__etcd_t *e);

typedef struct {
    char value[KVS_ETCD_MAX_VALUE + 1]; /* NUL-terminated */
    size_t len;
    int64_t create_rev, mod_rev, lease;
} kvs__etcd_kv_t;

/* Every call returns OK, RPC_FAIL (no endpoint answered), PROTOCOL_ERROR (an answer that is not
 * etcd's), or as stated. Calls on one handle are serialised. */

/* The key's value and revisions; OBJECT_NOT_FOUND when absent. */
int kvs__etcd_get(kvs__etcd_t *e, const char *key, kvs__etcd_kv_t *kv);
/* A lease of `ttl_s` seconds; *ttl_p gets the TTL etcd granted (it may raise it to its
 * minimum). */
int kvs__etcd_lease_grant(kvs__etcd_t *e, int64_t ttl_s, int64_t *id_p, int64_t *ttl_p);
/* Renews a lease: *ttl_p gets its new TTL, or OBJECT_NOT_FOUND when it has expired. */
int kvs__etcd_lease_keepalive(kvs__etcd_t *e, int64_t id, int64_t *ttl_p);
int kvs__etcd_lease_revoke(kvs__etcd_t *e, int64_t id);
/* Creates `key` = `value` attached to `lease` only if the key does not exist (a transaction
 * comparing its create revision with 0): OK with *rev_p the key's create revision, or
 * OBJECT_ALREADY_EXISTS. */
int kvs__etcd_create(kvs__etcd_t *e, const char *key, const char *value, int64_t lease,
                     int64_t *rev_p);
/* Deletes `key` only while its create revision is `rev`. */
int kvs__etcd_delete_if(kvs__etcd_t *e, const char *key, int64_t rev);

/* The leader record a master keeps at "<prefix>/leader": "HOST:PORT INCARNATION" (hex). */
typedef struct {
    char host[KVS_MAX_NAME_LEN + 1];
    uint16_t port;
    uint64_t incarnation;
    uint64_t term; /* the key's create revision: grows with every new leader */
} kvs__etcd_leader_t;

/* Reads and parses the leader record: NO_LEADER when there is none, PROTOCOL_ERROR when it is
 * not one. */
int kvs__etcd_leader(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l);
/* The same, with every etcd call cut short at `deadline_ns` (kvs__now_ns clock; 0: none):
 * TIMED_OUT then. */
int kvs__etcd_leader_until(kvs__etcd_t *e, const char *prefix, kvs__etcd_leader_t *l,
                           uint64_t deadline_ns);
/* "<prefix>/leader" into buf. */
void kvs__etcd_leader_key(const char *prefix, char *buf, size_t len);

/* Whether `addr` names etcd ("etcd://HOST:PORT[,...][/PREFIX]"). */
bool kvs__is_etcd_addr(const char *addr);
/* Splits an etcd:// address into its endpoints and its key prefix (caller frees both with
 * kvs__free): the prefix is the path after the endpoints ("etcd://h:2379/prod" -> "/prod"),
 * else KVS_ETCD_PREFIX from the environment, else KVS_ETCD_DEFAULT_PREFIX. INVALID_PARAMS for
 * an address that is not one. */
int kvs__etcd_addr_parse(const char *addr, char **endpoints_p, char **prefix_p);

#endif
