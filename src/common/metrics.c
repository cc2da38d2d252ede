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

void kvs__metrics_label_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;
    for (; in != NULL && *in != '\0' && o + 3 < len; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    if (len > 0)
        out[KVS_MIN(o, len - 1)] = '\0';
}

static const char *unit_suffix(kvs__metric_unit_t u)
{
    return u == KVS_UNIT_BYTES ? "_bytes" : u == KVS_UNIT_NS ? "_seconds" : "";
}

/* "{a,b}" of the two label sets, or "" when both are empty; `extra` is put before a `le`. */
static void labels_join(char *out, size_t len, const char *a, const char *b, const char *extra)
{
    const char *parts[3] = {a, b, extra};
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < 3; i++) {
        if (parts[i] == NULL || parts[i][0] == '\0')
            continue;
        int n = snprintf(out + o, len - o, "%s%s", o == 0 ? "{" : ",", parts[i]);
        if (n < 0 || (size_t)n >= len - o)
            return;
        o += (size_t)n;
    }
    if (o > 0 && o + 1 < len) {
        out[o] = '}';
        out[o + 1] = '\0';
    }
}

static void write_sample(kvs__text_t *t, const char *name, const kvs__metric_value_t *v)
{
    char lb[768];
    labels_join(lb, sizeof(lb), v->d->labels, v->labels, NULL);
    if (v->d->kind != KVS_METRIC_HIST) {
        if (v->d->unit == KVS_UNIT_NS)
            kvs__text_printf(t, "%s%s %.9f\n", name, lb, (double)v->value / 1e9);
        else
            kvs__text_printf(t, "%s%s %llu\n", name, lb, (unsigned long long)v->value);
        return;
    }
    const kvs_histogram_t *h = v->hist;
    /* The total of the buckets, not `count`: a snapshot taken during adds may differ by a few,
     * and the exposition must stay monotonic up to +Inf. */
    uint64_t seen = 0, count = 0;
    for (unsigned i = 0; h != NULL && i < KVS_HIST_BUCKETS; i++)
        count += h->buckets[i];
    /* Bucket i holds [2^(i-1), 2^i) µs; the last one also everything longer, so it is +Inf. */
    for (unsigned i = 0; i + 1 < KVS_HIST_BUCKETS; i++) {
        char le[48];
        seen += h ? h->buckets[i] : 0;
        snprintf(le, sizeof(le), "le=\"%g\"", (double)(1ull << i) / 1e6);
        labels_join(lb, sizeof(lb), v->d->labels, v->labels, le);
        kvs__text_printf(t, "%s_bucket%s %llu\n", name, lb, (unsigned long long)seen);
    }
    labels_join(lb, sizeof(lb), v->d->labels, v->labels, "le=\"+Inf\"");
    kvs__text_printf(t, "%s_bucket%s %llu\n", name, lb, (unsigned long long)count);
    labels_join(lb, sizeof(lb), v->d->labels, v->labels, NULL);
    kvs__text_printf(t, "%s_sum%s %.9f\n", name, lb, h ? (double)h->sum_ns / 1e9 : 0.0);
    kvs__text_printf(t, "%s_count%s %llu\n", name, lb, (unsigned long long)count);
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
