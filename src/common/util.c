/* Small parsers and helpers: human sizes, integers, environment variables, keys, hashing,
 * host:port and the monotonic clock. */
#define _GNU_SOURCE
#include "common_int.h"

#include <ctype.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

/* Random values come from the kernel's generator in pools of RANDOM_POOL per getrandom call, one
 * pool per thread: a master grants a lease id per key looked up, and one system call per id took
 * a third of a 1536-key lookup. A forked child must neither reuse nor hold its parent's pool (the
 * values would repeat in both processes, or the child would know the parent's next ids): fork
 * empties the pool in the child, on the one thread that survives it. */
#define RANDOM_POOL 256

static pthread_once_t random_once = PTHREAD_ONCE_INIT;
static _Thread_local struct {
    uint64_t v[RANDOM_POOL];
    unsigned left;
} random_pool;

static void random_forked(void)
{
    memset(&random_pool, 0, sizeof(random_pool));
}

static void random_init(void)
{
    pthread_atfork(NULL, NULL, random_forked);
}

/* Without a kernel entropy interface (pre-3.17 kernels): the clock and the address of a stack
 * variable, which still differ between processes. */
static uint64_t random_fallback(void)
{
    uint64_t v = 0;
    uint64_t x = kvs__now_ns() ^ (uint64_t)(uintptr_t)&v;
    x ^= x >> 33; /* (not kvs__hash64: its key comes from here) */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x | 1;
}

uint64_t kvs__random_u64(void)
{
    pthread_once(&random_once, random_init);
    for (;;) {
        if (random_pool.left == 0) {
            ssize_t n = getrandom(random_pool.v, sizeof(random_pool.v), 0);
            if (n < 0 && errno != EINTR && errno != EAGAIN)
                return random_fallback();
            if (n < (ssize_t)sizeof(uint64_t))
                continue; /* interrupted: again */
            random_pool.left = (unsigned)((size_t)n / sizeof(uint64_t));
        }
        uint64_t v = random_pool.v[--random_pool.left];
        random_pool.v[random_pool.left] = 0; /* a value handed out is not kept */
        if (v != 0)
            return v;
    }
}

uint64_t kvs__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * KVS_NS_PER_S + (uint64_t)ts.tv_nsec;
}

void kvs__cond_init(pthread_cond_t *cond)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &a);
    pthread_condattr_destroy(&a);
}

bool kvs__every(uint64_t *last_ns, uint64_t period_ns)
{
    uint64_t now = kvs__now_ns();
    if (*last_ns != 0 && now - *last_ns < period_ns)
        return false;
    *last_ns = now;
    return true;
}

bool kvs__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mutex, uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        pthread_cond_wait(cond, mutex);
        return true;
    }
    if (kvs__now_ns() >= deadline_ns)
        return false;
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / KVS_NS_PER_S),
                          .tv_nsec = (long)(deadline_ns % KVS_NS_PER_S)};
    pthread_cond_timedwait(cond, mutex, &ts);
    return true;
}

int kvs__parse_u64(const char *text, uint64_t max, uint64_t *value_p)
{
    if (text == NULL || value_p == NULL || !isdigit((unsigned char)text[0]))
        return KVS_INVALID_PARAMS;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return KVS_INVALID_PARAMS;
    *value_p = v;
    return KVS_OK;
}

static const struct {
    const char *name;
    uint64_t mult;
} size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"kib", 1ull << 10},
    {"kb", 1000ull},
    {"m", 1ull << 20},
    {"mib", 1ull << 20},
    {"mb", 1000000ull},
    {"g", 1ull << 30},
    {"gib", 1ull << 30},
    {"gb", 1000000000ull},
    {"t", 1ull << 40},
    {"tib", 1ull << 40},
    {"tb", 1000000000000ull},
};

int kvs__parse_size(const char *text, uint64_t *bytes_p)
{
    if (text == NULL || bytes_p == NULL)
        return KVS_INVALID_PARAMS;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return KVS_INVALID_PARAMS;
    uint64_t whole = 0;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return KVS_INVALID_PARAMS;
        whole = whole * 10 + d;
        p++;
    }
    /* Up to 9 fractional digits, kept as an exact integer numerator over 10^digits. */
    uint64_t frac = 0, frac_den = 1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return KVS_INVALID_PARAMS;
        while (isdigit((unsigned char)*p)) {
            if (frac_den < 1000000000ull) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
            p++;
        }
    }
    while (*p == ' ')
        p++;
    const char *unit = p;
    size_t ulen = strlen(unit);
    while (ulen > 0 && isspace((unsigned char)unit[ulen - 1]))
        ulen--;
    for (size_t i = 0; i < KVS_ARRAY_SIZE(size_units); i++) {
        if (strlen(size_units[i].name) == ulen &&
            strncasecmp(unit, size_units[i].name, ulen) == 0) {
            uint64_t mult = size_units[i].mult;
            if (whole != 0 && mult > UINT64_MAX / whole)
                return KVS_INVALID_PARAMS;
            uint64_t v = whole * mult;
            /* frac * mult / frac_den without overflow: mult <= 2^40, frac < 10^9 < 2^30. */
            unsigned __int128 f = (unsigned __int128)frac * mult / frac_den;
            if (v > UINT64_MAX - (uint64_t)f)
                return KVS_INVALID_PARAMS;
            *bytes_p = v + (uint64_t)f;
            return KVS_OK;
        }
    }
    return KVS_INVALID_PARAMS;
}

char *kvs__format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < KVS_ARRAY_SIZE(names)) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, names[u]);
    return buf;
}

int kvs__env_size(const char *name, uint64_t *value_p)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return KVS_OK;
    if (kvs__parse_size(v, value_p) != KVS_OK) {
        kvs_error("%s=%s is not a size (examples: 4096, 256MiB, 4GiB)", name, v);
        return KVS_INVALID_PARAMS;
    }
    return KVS_OK;
}

int kvs__env_u64(const char *name, uint64_t max, uint64_t *value_p)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return KVS_OK;
    if (kvs__parse_u64(v, max, value_p) != KVS_OK) {
        kvs_error("%s=%s is not an integer in 0..%llu", name, v, (unsigned long long)max);
        return KVS_INVALID_PARAMS;
    }
    return KVS_OK;
}

int kvs__env_bool(const char *name, bool *value_p)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return KVS_OK;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on")) {
        *value_p = true;
        return KVS_OK;
    }
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
        !strcasecmp(v, "off")) {
        *value_p = false;
        return KVS_OK;
    }
    kvs_error("%s=%s is not a boolean (1/0, true/false, yes/no, on/off)", name, v);
    return KVS_INVALID_PARAMS;
}

int kvs__key_check(const char *key, size_t len)
{
    if (key == NULL || len == 0 || len > KVS_MAX_KEY_LEN || memchr(key, '\0', len) != NULL)
        return KVS_INVALID_PARAMS;
    return KVS_OK;
}

/* SipHash-1-3 (Aumasson and Bernstein's keyed hash with one compression and three
 * finalisation rounds, the variant hash tables use) under a random key drawn once per process:
 * a peer that chooses keys cannot predict which collide, so it cannot pile them into one chain
 * of the master's table. Not a MAC: only the tables' bucket choice depends on it. */
static uint64_t sip_key[2];
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static void sip_key_init(void)
{
    sip_key[0] = kvs__random_u64();
    sip_key[1] = kvs__random_u64();
}

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND(v0, v1, v2, v3)                                                                  \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = SIP_ROTL(v1, 13);                                                                     \
        v1 ^= v0;                                                                                  \
        v0 = SIP_ROTL(v0, 32);                                                                     \
        v2 += v3;                                                                                  \
        v3 = SIP_ROTL(v3, 16);                                                                     \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = SIP_ROTL(v3, 21);                                                                     \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = SIP_ROTL(v1, 17);                                                                     \
        v1 ^= v2;                                                                                  \
        v2 = SIP_ROTL(v2, 32);                                                                     \
    } while (0)

uint64_t kvs__hash64(const void *data, size_t len)
{
    pthread_once(&sip_once, sip_key_init);
    return kvs__siphash13(sip_key[0], sip_key[1], data, len);
}

uint64_t kvs__siphash13(uint64_t k0, uint64_t k1, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
    size_t whole = len - len % 8;
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t m = 0;
        for (int b = 7; b >= 0; b--)
            m = (m << 8) | p[i + (size_t)b]; /* little-endian, whatever the host */
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t last = (uint64_t)len << 56;
    for (size_t i = whole; i < len; i++)
        last |= (uint64_t)p[i] << (8 * (i - whole));
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

int kvs__parse_host_port(const char *text, const char *default_host, char **host_p,
                         uint16_t *port_p)
{
    if (text == NULL || *text == '\0' || host_p == NULL || port_p == NULL)
        return KVS_INVALID_PARAMS;
    const char *colon = strrchr(text, ':');
    const char *port_s = colon ? colon + 1 : text;
    uint64_t port;
    if (kvs__parse_u64(port_s, 65535, &port) != KVS_OK) {
        if (colon != NULL)
            return KVS_INVALID_PARAMS;
        /* A bare host name without a port. */
        return KVS_INVALID_PARAMS;
    }
    char *host;
    if (colon == NULL || colon == text)
        host = kvs__strdup(default_host);
    else
        host = kvs__strndup(text, (size_t)(colon - text));
    if (host == NULL)
        return KVS_NO_MEMORY;
    *host_p = host;
    *port_p = (uint16_t)port;
    return KVS_OK;
}

bool kvs__tenant_ok(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > 64)
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return false;
    }
    return true;
}
