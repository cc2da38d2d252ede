/* Internal helpers shared by every module: logging, counted allocation, clocks, sizes,
 * environment configuration and key validation. Never installed. */
#ifndef KVS_COMMON_INT_H
#define KVS_COMMON_INT_H

#include <kvstash/status.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_ARRAY_SIZE(a)  (sizeof(a) / sizeof((a)[0]))
#define KVS_MIN(a, b)      ((a) < (b) ? (a) : (b))
#define KVS_MAX(a, b)      ((a) > (b) ? (a) : (b))
#define KVS_ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define KVS_UNUSED(x)      ((void)(x))

/* Longest key accepted anywhere (bytes, excluding any terminator). */
#define KVS_MAX_KEY_LEN 1024u

/* ---- logging ------------------------------------------------------------------------ */

typedef enum {
    KVS_LOG_ERROR = 0,
    KVS_LOG_WARN = 1,
    KVS_LOG_INFO = 2,
    KVS_LOG_DEBUG = 3,
    KVS_LOG_TRACE = 4,
} kvs_log_level_t;

/* The level comes from KVS_LOG_LEVEL (error|warn|info|debug|trace) on first use; default warn. */
kvs_log_level_t kvs__log_level(void);
void kvs__log_set_level(kvs_log_level_t level);
void kvs__log(kvs_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KVS_LOG_(lvl, ...)                                                                         \
    do {                                                                                           \
        if ((lvl) <= kvs__log_level())                                                             \
            kvs__log((lvl), __FILE__, __LINE__, __VA_ARGS__);                                      \
    } while (0)
#define kvs_error(...) KVS_LOG_(KVS_LOG_ERROR, __VA_ARGS__)
#define kvs_warn(...)  KVS_LOG_(KVS_LOG_WARN, __VA_ARGS__)
#define kvs_info(...)  KVS_LOG_(KVS_LOG_INFO, __VA_ARGS__)
#define kvs_debug(...) KVS_LOG_(KVS_LOG_DEBUG, __VA_ARGS__)
#define kvs_trace(...) KVS_LOG_(KVS_LOG_TRACE, __VA_ARGS__)

/* Records the calling thread's explanation of a failure (read back by kvs_last_error), logs it
 * at debug level and returns `status`, so public functions can `return kvs__fail(...)`. */
int kvs__fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- allocation ----------------------------------------------------------------------- */

/* Every heap allocation of the library goes through these so that tests can count live bytes
 * and inject failures. They behave like their libc namesakes (kvs__free(NULL) is a no-op). */
void *kvs__malloc(size_t size);
void *kvs__calloc(size_t n, size_t size);
void *kvs__realloc(void *ptr, size_t size);
void kvs__free(void *ptr);
char *kvs__strdup(const char *s);
char *kvs__strndup(const char *s, size_t n);

/* Bytes currently allocated through the wrapper, and the number of live allocations. */
size_t kvs__alloc_live_bytes(void);
size_t kvs__alloc_live_count(void);
/* Make the allocation after the next `n` succeed-able ones fail (n = 0: the very next one).
 * A negative value switches injection off. Failures keep coming until switched off when
 * `sticky` is true, otherwise only one allocation fails. */
void kvs__alloc_inject_failure(long n, bool sticky);
/* Whether failures are being injected (memory pools then allocate afresh, so that they fail). */
bool kvs__alloc_injecting(void);

/* ---- clocks ------------------------------------------------------------------------------ */

/* Monotonic time in nanoseconds. */
uint64_t kvs__now_ns(void);
#define KVS_NS_PER_MS 1000000ull
#define KVS_NS_PER_S  1000000000ull

/* Condition variables whose timed waits run on the kvs__now_ns() clock, so that a change of the
 * wall clock neither stops nor hurries them (pthread_cond_t initialised with CLOCK_MONOTONIC). */
void kvs__cond_init(pthread_cond_t *cond);
/* Waits until signalled or until deadline_ns (kvs__now_ns() clock; UINT64_MAX: no bound).
 * Returns false once the deadline has passed. Spurious wake-ups return true: callers loop on
 * their predicate. */
bool kvs__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mutex, uint64_t deadline_ns);

/* Whether something to be done at most once per `period_ns` (a warning that peers can trigger
 * at will) may be done now; *last_ns holds when it last was (0: never). The caller serialises
 * the calls on one *last_ns. */
bool kvs__every(uint64_t *last_ns, uint64_t period_ns);

/* A random, non-zero 64-bit value from the kernel (getrandom): ids and incarnations. */
uint64_t kvs__random_u64(void);

/* ---- sizes and configuration ------------------------------------------------------------ */

/* Parses a human size: a number (decimal, optional fraction) followed by an optional unit:
 * B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB/MB/GB/TB (powers of 1000), any case,
 * optional space between. "4GiB", "512MB", "1.5 GiB", "65536". Rejects percentages, negative
 * numbers, trailing junk and overflow with INVALID_PARAMS. */
int kvs__parse_size(const char *text, uint64_t *bytes_p);

/* Formats `bytes` as "1.50 GiB" into buf (always NUL-terminated). Returns buf. */
char *kvs__format_size(uint64_t bytes, char *buf, size_t len);

/* Parses a non-negative decimal integer that must fit `max`. INVALID_PARAMS otherwise. */
int kvs__parse_u64(const char *text, uint64_t max, uint64_t *value_p);

/* Reads an environment variable as a size, an integer or a boolean. Unset leaves *value_p
 * unchanged and returns OK; a malformed value returns INVALID_PARAMS and logs which one. */
int kvs__env_size(const char *name, uint64_t *value_p);
int kvs__env_u64(const char *name, uint64_t max, uint64_t *value_p);
int kvs__env_bool(const char *name, bool *value_p);

/* Whether `s` (len bytes) is a tenant name: 1..64 bytes of [A-Za-z0-9._-]. */
bool kvs__tenant_ok(const char *s, size_t len);

/* Checks a key: 1..KVS_MAX_KEY_LEN bytes, no NUL bytes. Returns OK or INVALID_PARAMS. */
int kvs__key_check(const char *key, size_t len);

/* 64-bit keyed hash of bytes (SipHash-1-3 under a random key per process), for every table
 * indexed by what peers choose: the values differ from one process to the next. */
uint64_t kvs__hash64(const void *data, size_t len);
/* SipHash-1-3 of bytes under the key (k0, k1): the 16 key bytes read little-endian. */
uint64_t kvs__siphash13(uint64_t k0, uint64_t k1, const void *data, size_t len);

/* Parses "HOST:PORT" or ":PORT" or "PORT" into a host string (caller frees with kvs__free) and
 * port. The host defaults to `default_host` when absent. */
int kvs__parse_host_port(const char *text, const char *default_host, char **host_p,
                         uint16_t *port_p);

#endif
