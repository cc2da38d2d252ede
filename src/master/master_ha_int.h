/* Leader election of master candidates on etcd (docs/ha.md).
 *
 * A thread of its own campaigns: while etcd names no leader it takes a lease and creates the
 * leader key "<prefix>/leader" = "ADVERTISE INCARNATION" under it, in one compare-and-swap (the
 * key must not exist). The key's create revision is the leader's term: it only grows. A leader
 * renews its lease every third of its TTL and leads only until its own lease deadline: the time
 * it sent its last successful renewal plus the TTL, less a margin, which is never later than
 * etcd's expiry of the lease. The event loop asks kvs__ha_leading before every request, so a
 * leader that cannot renew (etcd unreachable, the process stopped) has stopped serving before a
 * standby can win the key. A leader that exits revokes its lease: a standby takes over at once. */
#ifndef KVS_MASTER_HA_INT_H
#define KVS_MASTER_HA_INT_H

#include "../common/common_int.h"

typedef struct {
    const char *etcd;      /* endpoints "HOST:PORT[,...]" */
    const char *prefix;    /* NULL: KVS_ETCD_DEFAULT_PREFIX */
    const char *advertise; /* "HOST:PORT" clients reach this master at */
    uint64_t ttl_s;        /* the lease's TTL (etcd may raise it to its minimum) */
    uint64_t poll_ms;      /* a standby reads the leader key this often */
    int wake_fd;           /* an eventfd written when leadership is won or lost (-1: none) */
} kvs__ha_config_t;

#define KVS_HA_DEFAULT_TTL_S   2u
#define KVS_HA_DEFAULT_POLL_MS 50u

typedef struct kvs__ha kvs__ha_t;

/* Starts campaigning. UNSUPPORTED in a build without etcd. */
int kvs__ha_start(const kvs__ha_config_t *cfg, kvs__ha_t **ha_p);
/* Steps down (revoking the lease, so a standby takes over at once) and stops. NULL: no-op. */
void kvs__ha_stop(kvs__ha_t *ha);

typedef struct {
    uint64_t generation;  /* counts the times this candidate won: a new one means fresh state */
    uint64_t term;        /* the leader key's create revision */
    uint64_t incarnation; /* the one the leader key carries */
    uint64_t deadline_ns; /* CLOCK_BOOTTIME: lead only before this */
} kvs__ha_lead_t;

/* Whether this candidate leads now (its lease deadline, on CLOCK_BOOTTIME, not passed), and
 * under which term. */
bool kvs__ha_leading(kvs__ha_t *ha, kvs__ha_lead_t *lead_p);
/* The leader's address as etcd last named it ("" when unknown or this candidate), for
 * NOT_LEADER replies. */
void kvs__ha_leader(kvs__ha_t *ha, char *buf, size_t len);

#endif
