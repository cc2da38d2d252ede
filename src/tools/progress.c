/* Progress of long command-line work on standard error: one line redrawn in place at most ten
 * times a second, only when standard error is a terminal (KVS_PROGRESS=0 turns it off, =1 on
 * even without one). Off, every call is a no-op, so pipes and logs stay clean. */
#include "cli_int.h"
#include "common/common_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool kvs__progress_wanted(void)
{
    const char *v = getenv("KVS_PROGRESS");
    if (v != NULL && strcmp(v, "0") == 0)
        return false;
    if (v != NULL && strcmp(v, "1") == 0)
        return true;
    return isatty(STDERR_FILENO) == 1;
}

void kvs__progress_start(kvs__progress_t *p, const char *what, uint64_t total, bool bytes)
{
    memset(p, 0, sizeof(*p));
    p->on = kvs__progress_wanted();
    p->what = what;
    p->total = total;
    p->bytes = bytes;
    p->t0 = kvs__now_ns();
}

static void amount(const kvs__progress_t *p, uint64_t v, char *out, size_t len)
{
    if (p->bytes)
        kvs__format_size(v, out, len);
    else
        snprintf(out, len, "%llu", (unsigned long long)v);
}

static void draw(kvs__progress_t *p, uint64_t now)
{
    double secs = (double)(now - p->t0) / 1e9;
    char done[32], total[32], rate[48] = "", eta[32] = "";
    amount(p, p->done, done, sizeof(done));
    amount(p, p->total, total, sizeof(total));
    if (p->bytes && secs > 0.05) {
        char r[32];
        kvs__format_size((uint64_t)((double)p->done / secs), r, sizeof(r));
        snprintf(rate, sizeof(rate), ", %s/s", r);
    }
    if (p->done > 0 && p->done < p->total && secs > 0.5)
        snprintf(eta, sizeof(eta), ", %.0f s left",
                 secs * (double)(p->total - p->done) / (double)p->done);
    unsigned pct = p->total ? (unsigned)(100.0 * (double)p->done / (double)p->total) : 100;
    char line[256];
    int n = snprintf(line, sizeof(line), "%s: %3u%% %s of %s%s, %.1f s%s", p->what, pct, done,
                     total, rate, secs, eta);
    if (n < 0)
        return;
    /* \r and erase to the end of the line: a shorter line leaves nothing of the last one. */
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    p->drawn = true;
    p->drawn_ns = now;
}

void kvs__progress_set(kvs__progress_t *p, uint64_t done)
{
    if (!p->on)
        return;
    p->done = KVS_MIN(done, p->total);
    uint64_t now = kvs__now_ns();
    if (!p->drawn || now - p->drawn_ns >= 100 * KVS_NS_PER_MS)
        draw(p, now);
}

void kvs__progress_log(kvs__progress_t *p, const char *fmt, ...)
{
    if (p->on && p->drawn)
        fputs("\r\033[K", stderr); /* the log line takes the bar's place; the bar comes back */
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (p->on && p->drawn)
        draw(p, kvs__now_ns());
}

void kvs__progress_clear(kvs__progress_t *p)
{
    if (!p->on || !p->drawn)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->drawn = false;
}

void kvs__progress_end(kvs__progress_t *p, bool ok)
{
    if (!p->on)
        return;
    if (ok)
        p->done = p->total;
    draw(p, kvs__now_ns());
    fputs(ok ? ", done\n" : ", failed\n", stderr);
    p->on = false;
}
