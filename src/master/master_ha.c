/* Leader election on etcd. See master_ha_int.h. */
#define _GNU_SOURCE
#include "master_ha_int.h"
#include "../ha/etcd_int.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The lease is counted on CLOCK_BOOTTIME, which also runs while the machine is suspended: a
 * leader whose host slept through its lease must not believe it still holds it (the monotonic
 * clock stops during a suspend, etcd's does not). */
static uint64_t boot_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct kvs__ha {
    kvs__ha_config_t cfg;
    char prefix[KVS_MAX_NAME_LEN + 1];
    char advertise[KVS_MAX_NAME_LEN + 1];
    char key[KVS_MAX_NAME_LEN + 32];
    kvs__etcd_t *etcd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    /* Under lock: read by the event loop. */
    bool leader;
    kvs__ha_lead_t lead;
    char known[KVS_MAX_NAME_LEN + 8]; /* the leader etcd names, when not us */
    /* The election thread's own. */
    int64_t lease;
    uint64_t ttl_ns;
};

/* The deadline a renewal sent at `sent_ns` gives: etcd counts the TTL from when it got the
 * renewal, later than we sent it, so this is never after etcd's expiry; the margin covers the
 * two clocks' rates and the time the event loop takes to serve one request. */
static uint64_t lease_deadline(const kvs__ha_t *ha, uint64_t sent_ns)
{
    uint64_t margin = KVS_MAX(ha->ttl_ns / 8, 100 * KVS_NS_PER_MS);
    return sent_ns + ha->ttl_ns - KVS_MIN(margin, ha->ttl_ns / 2);
}

static void wake(const kvs__ha_t *ha)
{
    uint64_t one = 1;
    if (ha->cfg.wake_fd >= 0) {
        ssize_t w = write(ha->cfg.wake_fd, &one, sizeof(one));
        KVS_UNUSED(w);
    }
}

/* Waits `ms` or until stopped; false when stopped. Caller holds the lock. */
static bool nap_locked(kvs__ha_t *ha, uint64_t ms)
{
    uint64_t until = kvs__now_ns() + ms * KVS_NS_PER_MS;
    while (!ha->stopping && kvs__cond_wait_until(&ha->cond, &ha->lock, until))
        ;
    return !ha->stopping;
}

static void step_down(kvs__ha_t *ha, const char *why)
{
    pthread_mutex_lock(&ha->lock);
    bool was = ha->leader;
    ha->leader = false;
    ha->lead.deadline_ns = 0;
    pthread_mutex_unlock(&ha->lock);
    if (was) {
        kvs_warn("master stepping down as leader (term %llu): %s",
                 (unsigned long long)ha->lead.term, why);
        wake(ha);
    }
    if (ha->lease != 0)
        kvs__etcd_lease_revoke(ha->etcd, ha->lease);
    ha->lease = 0;
}

/* One round as a standby: who leads, and a campaign when nobody does. */
static void campaign(kvs__ha_t *ha)
{
    kvs__etcd_leader_t l;
    int rc = kvs__etcd_leader(ha->etcd, ha->prefix, &l);
    if (rc == KVS_OK) {
        pthread_mutex_lock(&ha->lock);
        snprintf(ha->known, sizeof(ha->known), "%s:%u", l.host, (unsigned)l.port);
        pthread_mutex_unlock(&ha->lock);
        return;
    }
    if (rc != KVS_NO_LEADER) {
        kvs_debug("etcd at %s: %s", kvs__etcd_endpoints(ha->etcd), kvs_status_str(rc));
        return;
    }
    uint64_t sent = boot_ns();
    int64_t lease = 0, ttl = 0;
    if (kvs__etcd_lease_grant(ha->etcd, (int64_t)ha->cfg.ttl_s, &lease, &ttl) != KVS_OK)
        return;
    uint64_t incarnation = kvs__random_u64() | 1;
    char value[KVS_MAX_NAME_LEN + 32];
    snprintf(value, sizeof(value), "%s %llx", ha->advertise, (unsigned long long)incarnation);
    int64_t rev = 0;
    rc = kvs__etcd_create(ha->etcd, ha->key, value, lease, &rev);
    if (rc != KVS_OK) {
        kvs__etcd_lease_revoke(ha->etcd, lease); /* another candidate won */
        return;
    }
    ha->lease = lease;
    ha->ttl_ns = (uint64_t)ttl * 1000000000ull;
    pthread_mutex_lock(&ha->lock);
    ha->leader = true;
    ha->lead.generation++;
    ha->lead.term = (uint64_t)rev;
    ha->lead.incarnation = incarnation;
    ha->lead.deadline_ns = lease_deadline(ha, sent);
    ha->known[0] = '\0';
    pthread_mutex_unlock(&ha->lock);
    kvs_info("master leads the cluster at etcd://%s as %s (term %lld, lease TTL %lld s)",
             kvs__etcd_endpoints(ha->etcd), ha->advertise, (long long)rev, (long long)ttl);
    wake(ha);
}

/* One renewal of the leader's lease. */
static void renew(kvs__ha_t *ha)
{
    uint64_t sent = boot_ns();
    int64_t ttl = 0;
    int rc = kvs__etcd_lease_keepalive(ha->etcd, ha->lease, &ttl);
    if (rc == KVS_OK) {
        ha->ttl_ns = (uint64_t)ttl * 1000000000ull;
        pthread_mutex_lock(&ha->lock);
        ha->lead.deadline_ns = KVS_MAX(ha->lead.deadline_ns, lease_deadline(ha, sent));
        pthread_mutex_unlock(&ha->lock);
        return;
    }
    if (rc == KVS_OBJECT_NOT_FOUND) {
        step_down(ha, "its etcd lease expired");
        return;
    }
    pthread_mutex_lock(&ha->lock);
    bool over = boot_ns() >= ha->lead.deadline_ns;
    pthread_mutex_unlock(&ha->lock);
    if (over)
        step_down(ha, "etcd could not be reached before the lease deadline");
}

static void *ha_thread(void *arg)
{
    kvs__ha_t *ha = arg;
    pthread_mutex_lock(&ha->lock);
    while (!ha->stopping) {
        bool leader = ha->leader;
        uint64_t nap = leader ? KVS_MAX(ha->ttl_ns / KVS_NS_PER_MS / 4, 1) : ha->cfg.poll_ms;
        pthread_mutex_unlock(&ha->lock);
        if (leader)
            renew(ha);
        else
            campaign(ha);
        pthread_mutex_lock(&ha->lock);
        if (ha->leader != leader)
            continue; /* won: renew on time from now */
        if (!nap_locked(ha, nap))
            break;
    }
    pthread_mutex_unlock(&ha->lock);
    step_down(ha, "it is stopping");
    return NULL;
}

int kvs__ha_start(const kvs__ha_config_t *cfg, kvs__ha_t **ha_p)
{
    if (cfg == NULL || ha_p == NULL || cfg->etcd == NULL || cfg->advertise == NULL ||
        cfg->ttl_s == 0 || cfg->poll_ms == 0 || strlen(cfg->advertise) > KVS_MAX_NAME_LEN ||
        (cfg->prefix != NULL && (strlen(cfg->prefix) > KVS_MAX_NAME_LEN || cfg->prefix[0] != '/')))
        return KVS_INVALID_PARAMS;
    kvs__ha_t *ha = kvs__calloc(1, sizeof(*ha));
    if (ha == NULL)
        return KVS_NO_MEMORY;
    ha->cfg = *cfg;
    snprintf(ha->prefix, sizeof(ha->prefix), "%s",
             cfg->prefix ? cfg->prefix : KVS_ETCD_DEFAULT_PREFIX);
    snprintf(ha->advertise, sizeof(ha->advertise), "%s", cfg->advertise);
    kvs__etcd_leader_key(ha->prefix, ha->key, sizeof(ha->key));
    ha->ttl_ns = cfg->ttl_s * 1000000000ull;
    /* An etcd call may take a third of the lease at most: renewals keep their rhythm. */
    uint64_t call_ms = KVS_MAX(cfg->ttl_s * 1000 / 3, 1);
    int rc = kvs__etcd_open(cfg->etcd, call_ms, &ha->etcd);
    if (rc != KVS_OK) {
        kvs__free(ha);
        return rc;
    }
    pthread_mutex_init(&ha->lock, NULL);
    kvs__cond_init(&ha->cond);
    if (pthread_create(&ha->thread, NULL, ha_thread, ha) != 0) {
        kvs__etcd_close(ha->etcd);
        pthread_mutex_destroy(&ha->lock);
        pthread_cond_destroy(&ha->cond);
        kvs__free(ha);
        return KVS_INTERNAL_ERROR;
    }
    *ha_p = ha;
    return KVS_OK;
}

void kvs__ha_stop(kvs__ha_t *ha)
{
    if (ha == NULL)
        return;
    pthread_mutex_lock(&ha->lock);
    ha->stopping = true;
    pthread_cond_signal(&ha->cond);
    pthread_mutex_unlock(&ha->lock);
    pthread_join(ha->thread, NULL);
    kvs__etcd_close(ha->etcd);
    pthread_mutex_destroy(&ha->lock);
    pthread_cond_destroy(&ha->cond);
    kvs__free(ha);
}

bool kvs__ha_leading(kvs__ha_t *ha, kvs__ha_lead_t *lead_p)
{
    uint64_t now_ns = boot_ns();
    pthread_mutex_lock(&ha->lock);
    bool leading = ha->leader && now_ns < ha->lead.deadline_ns;
    if (lead_p != NULL)
        *lead_p = ha->lead;
    pthread_mutex_unlock(&ha->lock);
    return leading;
}

void kvs__ha_leader(kvs__ha_t *ha, char *buf, size_t len)
{
    pthread_mutex_lock(&ha->lock);
    snprintf(buf, len, "%s", ha->leader ? "" : ha->known);
    pthread_mutex_unlock(&ha->lock);
}
