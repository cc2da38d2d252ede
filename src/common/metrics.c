/* Histograms, the text buffer and the Prometheus text exposition (metrics_int.h). */
#include "metrics_int.h"

#include <stdio.h>
#include <string.h>

void kvs__hist_add(kvs__hist_t *h, uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (us > 0 && b + 1 < KVS_HIST_BUCKETS) {
        us >>= 1;
        b++;
    }
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->buckets[b], 1, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (ns > m && !atomic_compare_exchange_weak_explicit(
                         &h->max_ns, &m, ns, memory_order_relaxed, memory_order_relaxed)) {
    }
}

void kvs__hist_copy(kvs_histogram_t *out, kvs__hist_t *h)
{
    out->count = atomic_load_explicit(&h->count, memory_order_relaxed);
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
    out->max_ns = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    for (unsigned i = 0; i < KVS_HIST_BUCKETS; i++)
        out->buckets[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
}

double kvs_histogram_quantile_us(const kvs_histogram_t *h, double q)
{
    if (h == NULL || !(q > 0.0) || q > 1.0)
        return 0.0;
    uint64_t total = 0;
    for (unsigned i = 0; i < KVS_HIST_BUCKETS; i++)
        total += h->buckets[i];
    if (total == 0)
        return 0.0;
    uint64_t want = (uint64_t)(q * (double)total + 0.999999), seen = 0;
    for (unsigned i = 0; i < KVS_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= want)
            return i + 1 < KVS_HIST_BUCKETS ? (double)(1ull << i) : (double)h->max_ns / 1000.0;
    }
    return (double)h->max_ns / 1000.0;
}

void kvs__text_printf(kvs__text_t *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->len;
        int n = vsnprintf(t->p ? t->p + t->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = KVS_MAX(t->cap * 2, t->len + (size_t)n + 1);
        cap = KVS_MAX(cap, (size_t)4096);
        char *p = kvs__realloc(t->p, cap);
        if (p == NULL) {
            t->failed = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

void kvs__text_free(kvs__text_t *t)
{
    kvs__free(t->p);
    memset(t, 0, sizeof(*t));
}

/* The length of the valid UTF-8 sequence at `p` (at most `n` bytes), 0 when invalid. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len = p[0] < 0x80             ? 1
                 : (p[0] & 0xe0) == 0xc0 ? 2
                 : (p[0] & 0xf0) == 0xe0 ? 3
                 : (p[0] & 0xf8) == 0xf0 ? 4
                                         : 0;
    if (len == 0 || len > n || (len == 2 && p[0] < 0xc2) || (len == 4 && p[0] > 0xf4))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((len == 3 && p[0] == 0xe0 && p[1] < 0xa0) || (len == 3 && p[0] == 0xed && p[1] >= 0xa0) ||
        (len == 4 && p[0] == 0xf0 && p[1] < 0x90) || (len == 4 && p[0] == 0xf4 && p[1] >= 0x90))
        return 0; /* overlong, surrogates, beyond U+10FFFF */
    return len;
}

void kvs__metrics_label_escape(const char *in, char *out, size_t len)
{
    size_t o = 0, n = in != NULL ? strlen(in) : 0;
    const unsigned char *p = (const unsigned char *)in;
    /* Prometheus refuses a whole scrape for one label value that is not UTF-8: names come from
     * peers, so anything else (and control characters) becomes '?'. */
    for (size_t i = 0; i < n;) {
        size_t u = utf8_len(p + i, n - i);
        char piece[4];
        size_t plen = 0;
        if (u == 0 || (u == 1 && (p[i] < 0x20 || p[i] == 0x7f) && p[i] != '\n')) {
            piece[plen++] = '?';
            u = u == 0 ? 1 : u;
        } else if (p[i] == '\\' || p[i] == '"' || p[i] == '\n') {
            piece[plen++] = '\\';
            piece[plen++] = p[i] == '\n' ? 'n' : (char)p[i];
        } else {
            memcpy(piece, p + i, u);
            plen = u;
        }
        if (o + plen + 1 > len) /* whole characters only, and the terminator */
            break;
        memcpy(out + o, piece, plen);
        o += plen;
        i += u;
    }
    if (len > 0)
        out[KVS_MIN(o, len - 1)] = '\0';
}

static const char *unit_suffix(kvs__metric_unit_t u)
{
    return u == KVS_UNIT_BYTES ? "_bytes" : u == KVS_UNIT_NS ? "_seconds" : "";
}

/* Writes "{a,b,extra}" of the label sets present (nothing when none is): straight into the
 * growable text, so a long label value is never cut short. */
static void write_labels(kvs__text_t *t, const char *a, const char *b, const char *extra)
{
    const char *parts[3] = {a, b, extra};
    bool first = true;
    for (int i = 0; i < 3; i++) {
        if (parts[i] == NULL || parts[i][0] == '\0')
            continue;
        kvs__text_printf(t, "%s%s", first ? "{" : ",", parts[i]);
        first = false;
    }
    if (!first)
        kvs__text_printf(t, "}");
}

static void write_sample(kvs__text_t *t, const char *name, const kvs__metric_value_t *v)
{
    const kvs__metric_desc_t *d = v->d;
    if (d->kind != KVS_METRIC_HIST) {
        kvs__text_printf(t, "%s", name);
        write_labels(t, d->labels, v->labels, NULL);
        if (d->unit == KVS_UNIT_NS)
            kvs__text_printf(t, " %.9f\n", (double)v->value / 1e9);
        else
            kvs__text_printf(t, " %llu\n", (unsigned long long)v->value);
        return;
    }
    const kvs_histogram_t *h = v->hist;
    /* The total of the buckets, not `count`: a snapshot taken during adds may differ by a few,
     * and the exposition must stay monotonic up to +Inf. */
    uint64_t seen = 0, count = 0;
    for (unsigned i = 0; h != NULL && i < KVS_HIST_BUCKETS; i++)
        count += h->buckets[i];
    /* Bucket i holds [2^(i-1), 2^i) µs; the last one also everything longer, so it is +Inf.
     * Bounds are whole microseconds: exact in six decimals of a second. */
    for (unsigned i = 0; i + 1 < KVS_HIST_BUCKETS; i++) {
        unsigned long long us = 1ull << i;
        char le[48];
        snprintf(le, sizeof(le), "le=\"%llu.%06llu\"", us / 1000000, us % 1000000);
        seen += h ? h->buckets[i] : 0;
        kvs__text_printf(t, "%s_bucket", name);
        write_labels(t, d->labels, v->labels, le);
        kvs__text_printf(t, " %llu\n", (unsigned long long)seen);
    }
    kvs__text_printf(t, "%s_bucket", name);
    write_labels(t, d->labels, v->labels, "le=\"+Inf\"");
    kvs__text_printf(t, " %llu\n%s_sum", (unsigned long long)count, name);
    write_labels(t, d->labels, v->labels, NULL);
    kvs__text_printf(t, " %.9f\n%s_count", h ? (double)h->sum_ns / 1e9 : 0.0, name);
    write_labels(t, d->labels, v->labels, NULL);
    kvs__text_printf(t, " %llu\n", (unsigned long long)count);
}

void kvs__metrics_write(kvs__text_t *t, const char *prefix, const kvs__metric_value_t *v, size_t n)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    for (size_t i = 0; i < n; i++) {
        bool seen = false; /* an earlier value of this family wrote it already */
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(v[j].d->family, v[i].d->family) == 0;
        if (seen)
            continue;
        const kvs__metric_desc_t *d = v[i].d;
        char name[160];
        snprintf(name, sizeof(name), "%s%s%s%s", prefix, d->family, unit_suffix(d->unit),
                 d->kind == KVS_METRIC_COUNTER ? "_total" : "");
        kvs__text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, d->help, name, types[d->kind]);
        for (size_t j = i; j < n; j++)
            if (strcmp(v[j].d->family, d->family) == 0)
                write_sample(t, name, &v[j]);
    }
}

static bool name_ok(const char *s)
{
    if (s == NULL || *s == '\0' || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

long kvs__metrics_check_table(const kvs__metric_desc_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!name_ok(d[i].name) || !name_ok(d[i].family) || d[i].help == NULL ||
            d[i].labels == NULL || strchr(d[i].help, '\n') != NULL)
            return (long)i;
        bool first = true; /* of its family: its help is the family's */
        for (size_t j = 0; j < i; j++) {
            first = first && strcmp(d[j].family, d[i].family) != 0;
            if (strcmp(d[j].name, d[i].name) == 0)
                return (long)i;
            if (strcmp(d[j].family, d[i].family) == 0 &&
                (d[j].kind != d[i].kind || d[j].unit != d[i].unit ||
                 strcmp(d[j].labels, d[i].labels) == 0))
                return (long)i;
        }
        if (first && d[i].help[0] == '\0')
            return (long)i;
    }
    return -1;
}
