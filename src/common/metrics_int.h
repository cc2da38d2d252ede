/* Metrics shared by every component: atomic latency histograms, a growable text buffer and the
 * Prometheus text exposition (format 0.0.4) written from a component's metric table. Each
 * component declares its metrics once in an X-macro table (the client's is public, in
 * kvstash/client.h); its stats call, Python's get_stats(), the master's STAT reply and the
 * exposition here are all produced from that table. Never installed. */
#ifndef KVS_METRICS_INT_H
#define KVS_METRICS_INT_H

#include "common_int.h"

#include <kvstash/client.h>

#include <stdatomic.h>

/* ---- histograms --------------------------------------------------------------------------- */

/* The concurrent form of kvs_histogram_t (same buckets), updated with relaxed atomics. */
typedef struct {
    atomic_uint_fast64_t count, sum_ns, max_ns;
    atomic_uint_fast64_t buckets[KVS_HIST_BUCKETS];
} kvs__hist_t;

void kvs__hist_add(kvs__hist_t *h, uint64_t ns);
/* A snapshot of `h` (each field read once; concurrent adds may land in some fields only). */
void kvs__hist_copy(kvs_histogram_t *out, kvs__hist_t *h);

/* ---- text buffer ---------------------------------------------------------------------------- */

/* A growable string. On allocation failure `failed` is set and later writes do nothing. */
typedef struct {
    char *p;
    size_t len, cap;
    bool failed;
} kvs__text_t;

void kvs__text_printf(kvs__text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvs__text_free(kvs__text_t *t);

/* ---- metric descriptions and the exposition ------------------------------------------------ */

typedef enum {
    KVS_METRIC_COUNTER, /* only ever grows: exposed as <name>_total */
    KVS_METRIC_GAUGE,   /* a value now */
    KVS_METRIC_HIST,    /* a kvs_histogram_t: exposed in seconds, le = 2^i µs */
} kvs__metric_kind_t;

/* Units: the value's unit, and the suffix the exposition's name gets. Nanosecond values are
 * exposed in seconds, Prometheus's base unit. */
typedef enum {
    KVS_UNIT_NONE,
    KVS_UNIT_BYTES,
    KVS_UNIT_NS,
} kvs__metric_unit_t;

/* One metric of a table. Metrics sharing a family are one Prometheus metric told apart by their
 * labels ("mode=\"staged\"", "" for none); the family's help is its first member's. */
typedef struct {
    kvs__metric_kind_t kind;
    kvs__metric_unit_t unit;
    const char *name;   /* the stats field (and STAT counter, get_stats key) */
    const char *family; /* the exposition's name, without prefix or suffixes */
    const char *labels; /* constant labels, Prometheus syntax without braces */
    const char *help;
} kvs__metric_desc_t;

/* A metric's value at one scrape. `labels` (may be NULL) is appended to the descriptor's
 * constant labels: a per-segment gauge, say, carries segment="…". */
typedef struct {
    const kvs__metric_desc_t *d;
    const char *labels;
    uint64_t value;              /* COUNTER and GAUGE */
    const kvs_histogram_t *hist; /* HIST */
} kvs__metric_value_t;

/* Writes `n` values as Prometheus text: each family once (HELP and TYPE, then every sample of
 * it, wherever its values stand in the array), names prefixed with `prefix` ("kvstash_master_").
 * The exposition's name is prefix + family + unit suffix (_bytes, _seconds) + _total for
 * counters. */
void kvs__metrics_write(kvs__text_t *t, const char *prefix, const kvs__metric_value_t *v, size_t n);

/* Escapes a label value (backslash, quote, newline) into `out` (NUL-terminated, truncated to
 * `len`). */
void kvs__metrics_label_escape(const char *in, char *out, size_t len);

/* Checks a table: valid Prometheus names, and members of a family agree on kind and unit.
 * Returns the index of the first bad entry, or -1. (Tests.) */
long kvs__metrics_check_table(const kvs__metric_desc_t *d, size_t n);

/* ---- the HTTP endpoint ---------------------------------------------------------------------- */

/* Mooncake's ports: its master's metrics, and its clients' HTTP server. */
#define KVS_DEFAULT_METRICS_PORT        9003
#define KVS_DEFAULT_CLIENT_METRICS_PORT 9300

/* Renders a scrape into `t` (called on the HTTP server's thread). Returns KVS_OK or an error,
 * which is answered 503. */
typedef int (*kvs__metrics_render_cb)(void *arg, kvs__text_t *t);

typedef struct kvs__metrics_http kvs__metrics_http_t;

/* Serves GET /metrics on `bind_host`:`port` (NULL: all addresses; port 0: any free port), each
 * scrape the concatenation of every source's rendering. Built without libmicrohttpd this is
 * KVS_UNSUPPORTED with a message saying so. */
int kvs__metrics_http_start(const char *bind_host, uint16_t port, kvs__metrics_http_t **srv_p);
/* Adds a source (before or after start). `arg` is borrowed until stop. */
int kvs__metrics_http_add(kvs__metrics_http_t *srv, kvs__metrics_render_cb cb, void *arg);
uint16_t kvs__metrics_http_port(const kvs__metrics_http_t *srv);
/* Stops serving (in-flight scrapes finish first) and frees. NULL is a no-op. */
void kvs__metrics_http_stop(kvs__metrics_http_t *srv);
/* Whether this build can serve metrics (libmicrohttpd was found). */
bool kvs__metrics_http_available(void);

#endif
