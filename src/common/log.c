/* Levelled logging to stderr. One line per call, written with a single write so lines from
 * different threads and processes do not interleave. */
#define _GNU_SOURCE
#include "common_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = -1;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static kvs_log_level_t log_level_from_env(void)
{
    const char *v = getenv("KVS_LOG_LEVEL");
    if (v == NULL || *v == '\0')
        return KVS_LOG_WARN;
    for (int i = 0; i < (int)KVS_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(v, level_names[i]) == 0)
            return (kvs_log_level_t)i;
    }
    fprintf(stderr,
            "kvstash: KVS_LOG_LEVEL=%s is not one of error|warn|info|debug|trace; "
            "using warn\n",
            v);
    return KVS_LOG_WARN;
}

kvs_log_level_t kvs__log_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl < 0) {
        lvl = (int)log_level_from_env();
        atomic_store(&log_level, lvl);
    }
    return (kvs_log_level_t)lvl;
}

void kvs__log_set_level(kvs_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

void kvs__log(kvs_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03ld kvstash[%d] %s %s:%d: ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, (int)getpid(), level_names[level],
                     base, line);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    KVS_UNUSED(w);
}

static _Thread_local char last_error[512];

const char *kvs_last_error(void)
{
    return last_error;
}

int kvs__fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(last_error) - 24)
        snprintf(last_error + n, sizeof(last_error) - (size_t)n, " (%s)", kvs_status_name(status));
    kvs_debug("%s", last_error);
    return status;
}
