/* kvstash: the command line. put/get/rm go through the public client API; ls and stat ask the
 * master directly; bench runs the benchmarks. Peer-chosen strings (keys, segment names) are
 * printed escaped, and standard descriptors that were closed at start are never reused. */
#define _GNU_SOURCE
#include "cli_int.h"
#include "ha/etcd_int.h"
#include "proto/net_int.h"

#include <kvstash/kvstash.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MASTER "127.0.0.1:50051"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvstash [--master HOST:PORT] [--timeout-ms N] [--auth-token-file PATH] "
               "COMMAND [ARGS]\n"
               "\n"
               "--auth-token-file (default $KVS_AUTH_TOKEN_FILE): the cluster's secret, for a\n"
               "store that requires authentication; KVS_TLS=1 for one started with --tls.\n"
               "\n"
               "Commands:\n"
               "  put KEY FILE|-            store FILE (or standard input) under KEY\n"
               "  get KEY FILE|-            write object KEY to FILE (or standard output)\n"
               "  rm KEY [--force]          remove KEY (--force: even while leased)\n"
               "  ls [PREFIX] [--limit N]   list keys (complete and pending) with sizes\n"
               "  stat                      master counters and mounted segments\n"
               "  top [--interval-ms N] [--count N]\n"
               "                            the master's rates and usage per segment, refreshed\n"
               "                            every second (also: stat --watch)\n"
               "  schema                    print the wire schema (messages, records, fields)\n"
               "  bench allocator [...]     allocator replay benchmark (--help for options)\n"
               "  bench transport [...]     loopback tcp transport vs plain sockets\n"
               "  bench proto [...]         wire-format decoding and encoding rates\n"
               "  bench client [...]        put and multi-buffer get throughput against a store\n"
               "  bench scatter [...]       GPU scatter kernel vs CUDA copy APIs (CUDA builds)\n"
               "  bench gpu [...]           direct reads into device pages vs the copy engine\n"
               "  bench store [...]         the store benchmark: own store and reader processes,\n"
               "                            direct/grouped/staged reads beside measured limits\n"
               "\n"
               "The master defaults to $KVS_MASTER, else 127.0.0.1:50051; empty is an error.\n"
               "ls and stat escape keys and names: \\\\ for a backslash, \\n \\t \\r, and \\xNN\n"
               "for other bytes outside printable ASCII. put refuses input larger than the\n"
               "store's largest segment (an object is stored whole in one segment).\n"
               "put and get of objects of 16 MiB or more show progress when standard error is a\n"
               "terminal (KVS_PROGRESS=0 never, =1 always).\n");
}

/* Which of the standard descriptors were closed at start (main put /dev/null in their place). */
static bool stdin_closed, stdout_closed;

/* A closed descriptor 0, 1 or 2 would be the number the next open() or socket() returns: an
 * object written to "standard output" or a message to "standard error" would then go into a
 * master connection or an output file, and "standard input" would read from one. Each closed one
 * gets /dev/null instead, and is remembered, so that commands that need it refuse to run. */
static bool std_fds_guard(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            continue;
        /* The lowest free number, hence `fd`: the ones below it are open by now. */
        int got = open("/dev/null", O_RDWR);
        if (got != fd) {
            if (got >= 0)
                close(got);
            return false;
        }
        stdin_closed |= fd == 0;
        stdout_closed |= fd == 1;
    }
    return true;
}

/* Commands whose results go to standard output refuse to run without one. */
static bool stdout_open(const char *what)
{
    if (stdout_closed)
        fprintf(stderr, "kvstash %s: standard output is closed; refusing to run\n", what);
    return !stdout_closed;
}

/* Flushes standard output: a write that failed (a full disk, a closed pipe) makes `ret` a
 * failure. */
static int stdout_finish(const char *what, int ret)
{
    int err = fflush(stdout) != 0 ? errno : 0;
    if (err != 0 || ferror(stdout)) {
        fprintf(stderr, "kvstash %s: cannot write standard output: %s\n", what,
                err != 0 ? strerror(err) : "write error");
        return ret != 0 ? ret : 1;
    }
    return ret;
}

/* Writes `len` bytes of a peer-chosen string with the backslash and every byte outside printable
 * ASCII escaped, so that a key can neither fake a line of a listing nor send the terminal an
 * escape sequence. */
static void print_escaped(FILE *f, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\\')
            fputs("\\\\", f);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch == '\r')
            fputs("\\r", f);
        else if (ch < 0x20 || ch > 0x7e)
            fprintf(f, "\\x%02x", ch);
        else
            putc(ch, f);
    }
}

/* Checks the master address before anything is connected; an empty one is an error, never the
 * default. `from` names where it came from. Returns 0, or 2 (a usage error) with a message. */
static int master_check(const char *master, const char *from)
{
    char *host;
    uint16_t port;
    if (*master == '\0') {
        fprintf(stderr, "kvstash: %s is empty; it wants HOST:PORT\n", from);
        return 2;
    }
    if (kvs__is_etcd_addr(master))
        return 0; /* endpoints are checked when the client opens */
    if (kvs__parse_host_port(master, "127.0.0.1", &host, &port) != KVS_OK) {
        fprintf(stderr, "kvstash: %s wants HOST:PORT or etcd://HOST:PORT[,...], got '%s'\n", from,
                master);
        return 2;
    }
    kvs__free(host);
    if (port == 0) {
        fprintf(stderr, "kvstash: %s wants a port above 0, got '%s'\n", from, master);
        return 2;
    }
    return 0;
}

typedef struct {
    kvs__rpc_t *rpc;
    kvs__wbuf_t req, rsp;
    kvs__arena_t arena;
} cli_t;

static int cli_call(cli_t *c)
{
    int rc = kvs__frame_end(&c->req);
    if (rc == KVS_OK)
        rc = kvs__rpc_call(c->rpc, &c->req, &c->rsp);
    if (rc != KVS_OK)
        fprintf(stderr, "kvstash: request failed: %s (%d)\n", kvs_status_str(rc), rc);
    return rc;
}

/* Connects to the master at `master` (checked by master_check). Returns 0, or 1 with a message. */
static int cli_open(const char *master, uint64_t timeout_ms, cli_t *c)
{
    char *host = NULL;
    uint16_t port = 0;
    memset(c, 0, sizeof(*c));
    bool etcd = kvs__is_etcd_addr(master);
    char *eps = NULL, *pre = NULL;
    int rc = etcd ? kvs__etcd_addr_parse(master, &eps, &pre)
                  : kvs__parse_host_port(master, "127.0.0.1", &host, &port);
    if (etcd && rc == KVS_OK)
        host = kvs__strdup("");
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash: master address '%s': %s\n", master, kvs_status_str(rc));
        return 1;
    }
    kvs__rpc_config_t rcfg = {
        .host = host, .port = port, .timeout_ms = timeout_ms, .etcd = eps, .etcd_prefix = pre};
    char why[512];
    if (kvs__auth_configure(NULL, &rcfg.auth, why, sizeof(why)) != KVS_OK) {
        fprintf(stderr, "kvstash: %s\n", why);
        kvs__free(host);
        return 1;
    }
    if (kvs__env_bool("KVS_TLS", &rcfg.tls) != KVS_OK) {
        fprintf(stderr, "kvstash: KVS_TLS must be 0 or 1\n");
        kvs__free(host);
        return 1;
    }
    rc = kvs__rpc_open(&rcfg, &c->rpc);
    kvs__free(eps);
    kvs__free(pre);
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash: cannot reach the master at %s: %s\n", master, kvs_status_str(rc));
        kvs__free(host);
        return 1;
    }
    kvs__free(host);
    kvs__wbuf_init(&c->req);
    kvs__wbuf_init(&c->rsp);
    kvs__arena_init(&c->arena);
    return 0;
}

static void cli_close(cli_t *c)
{
    kvs__arena_free(&c->arena);
    kvs__wbuf_free(&c->req);
    kvs__wbuf_free(&c->rsp);
    kvs__rpc_close(c->rpc);
}

static int cmp_entries(const void *a, const void *b)
{
    const kvs__list_entry_t *x = a, *y = b;
    uint32_t n = KVS_MIN(x->key.len, y->key.len);
    int r = memcmp(x->key.ptr, y->key.ptr, n);
    return r ? r : (x->key.len > y->key.len) - (x->key.len < y->key.len);
}

/* `ls [PREFIX] [--limit N]`'s arguments, read before anything is connected. Returns 0, or 2
 * (a usage error) with a message. */
static int ls_args(int argc, char **argv, kvs__list_req_t *req_p)
{
    kvs__list_req_t req = {kvs__str_c(""), 1000, 0};
    bool have_prefix = false;
    for (int i = 0; i < argc; i++) {
        uint64_t v;
        if (strcmp(argv[i], "--limit") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvstash ls: --limit wants a value\n");
                return 2;
            }
            if (kvs__parse_u64(argv[++i], KVS_MAX_BATCH, &v) != KVS_OK || v == 0) {
                fprintf(stderr, "kvstash ls: --limit wants 1..%u\n", KVS_MAX_BATCH);
                return 2;
            }
            req.limit = (uint32_t)v;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "kvstash ls: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (have_prefix) {
            fprintf(stderr, "kvstash ls: takes one PREFIX, got '%s' after it\n", argv[i]);
            return 2;
        } else {
            req.prefix = kvs__str_c(argv[i]);
            have_prefix = true;
        }
    }
    *req_p = req;
    return 0;
}

static int cmd_ls(cli_t *c, kvs__list_req_t req)
{
    /* Page after page (each reply fits a frame) until the limit or the end. */
    kvs__list_entry_t *all = NULL;
    uint32_t n = 0, want = req.limit;
    bool more = false;
    int rc = 0;
    do {
        req.limit = want - n;
        kvs__rpc_begin(c->rpc, &c->req, KVS_MSG_LIST);
        kvs__list_req_encode(&c->req, &req);
        if (cli_call(c) != KVS_OK) {
            rc = 1;
            break;
        }
        /* Decoded keys point into the payload: each page's stays, in the arena. */
        uint8_t *payload = kvs__arena_alloc(&c->arena, c->rsp.len);
        if (payload != NULL && c->rsp.len > 0)
            memcpy(payload, c->rsp.data, c->rsp.len);
        kvs__list_rsp_t rsp;
        if (payload == NULL ||
            kvs__list_rsp_decode(payload, c->rsp.len, c->rsp.version, &c->arena, &rsp) != KVS_OK ||
            rsp.nentries > req.limit) {
            fprintf(stderr, "kvstash ls: malformed answer from the master\n");
            rc = 1;
            break;
        }
        kvs__list_entry_t *grown = kvs__realloc(all, ((size_t)n + rsp.nentries + 1) * sizeof(*all));
        if (grown == NULL) {
            fprintf(stderr, "kvstash ls: out of memory\n");
            rc = 1;
            break;
        }
        all = grown;
        memcpy(all + n, rsp.entries, (size_t)rsp.nentries * sizeof(*all));
        n += rsp.nentries;
        more = rsp.truncated != 0;
        req.cursor = rsp.next_cursor;
    } while (rc == 0 && more && n < want && req.cursor != 0);
    if (rc == 0) {
        qsort(all, n, sizeof(*all), cmp_entries);
        char sz[32];
        for (uint32_t i = 0; i < n; i++) {
            const kvs__list_entry_t *e = &all[i];
            printf("%-12s %-8s %u  ", kvs__format_size(e->size, sz, sizeof(sz)),
                   e->state == 1 ? "complete" : "pending", e->nrep);
            print_escaped(stdout, e->key.ptr, e->key.len);
            putchar('\n');
        }
        if (more)
            fprintf(stderr, "(listing stopped at %u keys; use --limit or a prefix)\n", n);
    }
    kvs__free(all);
    return rc;
}

/* One STAT; the reply lives in c->arena until the next. Returns 0, or 1 with a message. */
static int stat_fetch(cli_t *c, kvs__stat_rsp_t *rsp)
{
    kvs__arena_free(&c->arena);
    kvs__arena_init(&c->arena);
    kvs__rpc_begin(c->rpc, &c->req, KVS_MSG_STAT);
    if (cli_call(c) != KVS_OK)
        return 1;
    if (kvs__stat_rsp_decode(c->rsp.data, c->rsp.len, c->rsp.version, &c->arena, rsp) != KVS_OK) {
        fprintf(stderr, "kvstash stat: malformed answer from the master\n");
        return 1;
    }
    return 0;
}

static int cmd_stat(cli_t *c)
{
    kvs__stat_rsp_t rsp;
    if (stat_fetch(c, &rsp) != 0)
        return 1;
    char a[32], b[32];
    for (uint32_t i = 0; i < rsp.ncounters; i++) {
        const kvs__counter_t *k = &rsp.counters[i];
        print_escaped(stdout, k->name.ptr, k->name.len);
        printf("%*s %llu\n", k->name.len < 20 ? (int)(20 - k->name.len) : 0, "",
               (unsigned long long)k->value);
    }
    printf("\n%u segment(s)\n", rsp.nsegs);
    /* Names, nodes and endpoints are chosen by owners. */
    for (uint32_t i = 0; i < rsp.nsegs; i++) {
        const kvs__seg_info_t *s = &rsp.segs[i];
        printf("  #%llu ", (unsigned long long)s->id);
        print_escaped(stdout, s->name.ptr, s->name.len);
        fputs(" on ", stdout);
        print_escaped(stdout, s->node.ptr, s->node.len);
        fputs(" at ", stdout);
        print_escaped(stdout, s->endpoint.ptr, s->endpoint.len);
        printf(": %s used of %s\n", kvs__format_size(s->used, a, sizeof(a)),
               kvs__format_size(s->size, b, sizeof(b)));
    }
    return 0;
}

/* ---- top: the master's rates and usage, refreshed ------------------------------------------- */

/* What one frame of top needs from the last (rates are differences over the interval). */
typedef struct {
    uint64_t at_ns;
    uint64_t puts, lookups, hits, removes, evictions, evicted;
    uint64_t nsegs;
    struct {
        uint64_t id, used;
    } segs[KVS_MAX_SEGMENTS];
} top_prev_t;

static uint64_t stat_value(const kvs__stat_rsp_t *r, const char *name)
{
    for (uint32_t i = 0; i < r->ncounters; i++)
        if (kvs__str_eq(r->counters[i].name, kvs__str_c(name)))
            return r->counters[i].value;
    return 0;
}

static double rate(uint64_t now, uint64_t before, double secs)
{
    return secs > 0 && now >= before ? (double)(now - before) / secs : 0.0;
}

static void top_frame(const kvs__stat_rsp_t *r, top_prev_t *prev, const char *master, bool tty)
{
    uint64_t now = kvs__now_ns();
    double secs = prev->at_ns ? (double)(now - prev->at_ns) / 1e9 : 0.0;
    uint64_t puts = stat_value(r, "puts_ended"), lookups = stat_value(r, "lookups"),
             hits = stat_value(r, "lookup_hits"), removes = stat_value(r, "removes"),
             evictions = stat_value(r, "evictions"), evicted = stat_value(r, "evicted_bytes");
    uint64_t cap = stat_value(r, "capacity_bytes"), used = stat_value(r, "used_bytes");
    char a[32], b[32], c[32];
    if (tty)
        fputs("\033[H\033[2J", stdout); /* home and clear: one screen per frame */
    printf("kvstash top: master %s, %u segment(s), %llu objects (%llu pending)\n", master, r->nsegs,
           (unsigned long long)stat_value(r, "objects"),
           (unsigned long long)stat_value(r, "objects_pending"));
    printf("used %s of %s (%.1f%%)\n", kvs__format_size(used, a, sizeof(a)),
           kvs__format_size(cap, b, sizeof(b)), cap ? 100.0 * (double)used / (double)cap : 0.0);
    printf("puts/s %.1f  lookups/s %.1f  hits/s %.1f  removes/s %.1f  evictions/s %.1f  "
           "evicted %s/s\n\n",
           rate(puts, prev->puts, secs), rate(lookups, prev->lookups, secs),
           rate(hits, prev->hits, secs), rate(removes, prev->removes, secs),
           rate(evictions, prev->evictions, secs),
           kvs__format_size((uint64_t)rate(evicted, prev->evicted, secs), c, sizeof(c)));
    printf("%-32s %-16s %12s %12s %7s %14s\n", "SEGMENT", "NODE", "USED", "SIZE", "USE%",
           "CHANGE/s");
    for (uint32_t i = 0; i < r->nsegs; i++) {
        const kvs__seg_info_t *s = &r->segs[i];
        double change = 0;
        for (uint64_t j = 0; j < prev->nsegs && secs > 0; j++)
            if (prev->segs[j].id == s->id)
                change = ((double)s->used - (double)prev->segs[j].used) / secs;
        char name[40], node[24], d[32], ch[40];
        snprintf(name, sizeof(name), "%.*s", (int)KVS_MIN(s->name.len, 32u), s->name.ptr);
        snprintf(node, sizeof(node), "%.*s", (int)KVS_MIN(s->node.len, 16u), s->node.ptr);
        for (char *q = name; *q; q++) /* owners choose names: nothing that moves the cursor */
            *q = (*q < 0x20 || *q == 0x7f) ? '?' : *q;
        for (char *q = node; *q; q++)
            *q = (*q < 0x20 || *q == 0x7f) ? '?' : *q;
        kvs__format_size((uint64_t)(change < 0 ? -change : change), d, sizeof(d));
        snprintf(ch, sizeof(ch), "%c%s", change < 0 ? '-' : '+', d);
        printf("%-32s %-16s %12s %12s %6.1f%% %14s\n", name, node,
               kvs__format_size(s->used, a, sizeof(a)), kvs__format_size(s->size, b, sizeof(b)),
               s->size ? 100.0 * (double)s->used / (double)s->size : 0.0, ch);
    }
    if (!tty)
        putchar('\n');
    fflush(stdout);
    *prev = (top_prev_t){now, puts, lookups, hits, removes, evictions, evicted, r->nsegs, {{0}}};
    for (uint32_t i = 0; i < r->nsegs; i++) {
        prev->segs[i].id = r->segs[i].id;
        prev->segs[i].used = r->segs[i].used;
    }
}

/* Frames every interval_ms until interrupted, or `count` frames (0: no end). */
static int cmd_top(cli_t *c, const char *master, uint64_t interval_ms, uint64_t count)
{
    top_prev_t *prev = kvs__calloc(1, sizeof(*prev));
    if (prev == NULL) {
        fprintf(stderr, "kvstash top: out of memory\n");
        return 1;
    }
    bool tty = isatty(STDOUT_FILENO) == 1;
    int ret = 0;
    for (uint64_t n = 0; count == 0 || n < count; n++) {
        if (n > 0) {
            struct timespec ts = {(time_t)(interval_ms / 1000),
                                  (long)(interval_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        kvs__stat_rsp_t rsp;
        if (stat_fetch(c, &rsp) != 0) {
            ret = 1;
            break;
        }
        top_frame(&rsp, prev, master, tty);
    }
    kvs__free(prev);
    return ret;
}

/* top [--interval-ms N] [--count N], also `stat --watch [...]`. */
static int top_args(int argc, char **argv, uint64_t *interval_p, uint64_t *count_p)
{
    *interval_p = 1000;
    *count_p = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--watch") == 0)
            continue;
        bool iv = strcmp(argv[i], "--interval-ms") == 0, cn = strcmp(argv[i], "--count") == 0;
        if ((iv || cn) && i + 1 < argc) {
            uint64_t v;
            if (kvs__parse_u64(argv[++i], iv ? 3600000 : UINT32_MAX, &v) != KVS_OK ||
                (iv && v < 10)) {
                fprintf(stderr, "kvstash top: %s wants %s, got '%s'\n", argv[i - 1],
                        iv ? "10..3600000" : "a count", argv[i]);
                return 2;
            }
            *(iv ? interval_p : count_p) = v;
            continue;
        }
        fprintf(stderr, "kvstash top: unknown argument '%s' (takes --interval-ms N, --count N)\n",
                argv[i]);
        return 2;
    }
    return 0;
}

/* ---- put / get / rm through the client API ------------------------------------------------ */

/* The largest object the store can hold: objects are placed whole in one segment, so its largest
 * mounted segment (0: none is). Returns 0, or 1 with a message. */
static int store_max_object(const char *master, uint64_t timeout_ms, uint64_t *max_p)
{
    cli_t c;
    if (cli_open(master, timeout_ms, &c) != 0)
        return 1;
    int ret = 1;
    kvs__rpc_begin(c.rpc, &c.req, KVS_MSG_STAT);
    if (cli_call(&c) == KVS_OK) {
        kvs__stat_rsp_t rsp;
        if (kvs__stat_rsp_decode(c.rsp.data, c.rsp.len, c.rsp.version, &c.arena, &rsp) == KVS_OK) {
            uint64_t max = 0;
            for (uint32_t i = 0; i < rsp.nsegs; i++)
                max = KVS_MAX(max, rsp.segs[i].size);
            *max_p = max;
            ret = 0;
        } else {
            fprintf(stderr, "kvstash put: malformed answer from the master\n");
        }
    }
    cli_close(&c);
    return ret;
}

/* How messages name put's input. */
static const char *input_name(const char *path)
{
    return strcmp(path, "-") == 0 ? "standard input" : path;
}

static void too_large(const char *path, uint64_t max)
{
    char sz[32];
    fprintf(stderr,
            "kvstash put: %s is larger than the largest object the store can hold: %s "
            "(%llu bytes, its largest segment)\n",
            input_name(path), kvs__format_size(max, sz, sizeof(sz)), (unsigned long long)max);
}

/* Reads all of `f` into a new buffer (caller frees with kvs__free), but never more than `max`
 * bytes and one: standard input may have no end (`yes |`, /dev/zero), and a regular file is
 * refused by its size before it is read. Returns 0, or 1 with a message. */
static int read_bounded(FILE *f, const char *path, uint64_t max, char **data_p, size_t *size_p)
{
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max) {
        too_large(path, max);
        return 1;
    }
    size_t limit = (size_t)KVS_MIN(max, (uint64_t)SIZE_MAX / 2) + 1;
    size_t cap = 0, len = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            if (len == limit) {
                kvs__free(buf);
                too_large(path, max);
                return 1;
            }
            size_t want = KVS_MIN(cap == 0 ? (size_t)1 << 16 : cap * 2, limit);
            char *grown = kvs__realloc(buf, want);
            if (grown == NULL) {
                kvs__free(buf);
                fprintf(stderr, "kvstash put: out of memory reading %s\n", input_name(path));
                return 1;
            }
            buf = grown;
            cap = want;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        fprintf(stderr, "kvstash put: cannot read %s: %s\n", input_name(path), strerror(errno));
        kvs__free(buf);
        return 1;
    }
    *data_p = buf;
    *size_p = len;
    return 0;
}

/* Reads what `put KEY PATH` stores, bounded by what the store at `master` can hold. Returns 0,
 * or 1 with a message. */
static int put_input(const char *master, uint64_t timeout_ms, const char *path, char **data_p,
                     size_t *size_p)
{
    bool in = strcmp(path, "-") == 0;
    if (in && stdin_closed) {
        fprintf(stderr, "kvstash put: standard input is closed\n");
        return 1;
    }
    uint64_t max;
    if (store_max_object(master, timeout_ms, &max) != 0)
        return 1;
    if (max == 0) {
        fprintf(stderr, "kvstash put: the store has no segment mounted\n");
        return 1;
    }
    FILE *f = in ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "kvstash put: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    int r = read_bounded(f, path, max, data_p, size_p);
    if (f != stdin)
        fclose(f);
    if (r == 0 && *size_p == 0) {
        fprintf(stderr, "kvstash put: %s is empty; objects hold at least one byte\n",
                input_name(path));
        kvs__free(*data_p);
        return 1;
    }
    return r;
}

/* Objects from this size on show progress (on a terminal), moved in chunks of PROGRESS_CHUNK. */
#define PROGRESS_MIN   (16u << 20)
#define PROGRESS_CHUNK (8u << 20)

/* A put in chunks through a put session, drawing progress: the object is readable only once
 * every chunk is written (a failure revokes it). Returns 0, or 1 with a message. */
static int put_chunked(kvs_client_t *c, const char *key, const char *data, size_t size)
{
    const char *keys[1] = {key};
    uint64_t sizes[1] = {size};
    int res[1] = {0};
    char what[96];
    snprintf(what, sizeof(what), "put %.64s", key);
    if (kvs_client_register_buffer(c, (void *)data, size) != KVS_OK) {
        fprintf(stderr, "kvstash put: %s\n", kvs_last_error());
        return 1;
    }
    int rc = kvs_client_put_session_start(c, 1, keys, sizes, NULL, res);
    if (rc == KVS_OK)
        rc = res[0];
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash put: %s\n", kvs_last_error());
        kvs_client_unregister_buffer(c, (void *)data);
        return 1;
    }
    kvs__progress_t p;
    kvs__progress_start(&p, what, size, true);
    for (size_t off = 0; rc == KVS_OK && off < size; off += PROGRESS_CHUNK) {
        kvs_range_t r = {(void *)(data + off), KVS_MIN((size_t)PROGRESS_CHUNK, size - off), off};
        const kvs_range_t *rs[1] = {&r};
        size_t nr[1] = {1};
        rc = kvs_client_put_session_write(c, 1, keys, rs, nr, res);
        if (rc == KVS_OK)
            rc = res[0];
        kvs__progress_set(&p, off + r.len);
    }
    if (rc == KVS_OK) {
        rc = kvs_client_put_session_end(c, 1, keys, res);
        if (rc == KVS_OK)
            rc = res[0];
    } else {
        kvs_client_put_session_revoke(c, 1, keys, res);
    }
    kvs__progress_end(&p, rc == KVS_OK);
    if (rc != KVS_OK)
        fprintf(stderr, "kvstash put: %s (%s)\n", kvs_status_str(rc), kvs_last_error());
    kvs_client_unregister_buffer(c, (void *)data);
    return rc == KVS_OK ? 0 : 1;
}

static int cmd_put(kvs_client_t *c, const char *key, const char *data, size_t size)
{
    if (size >= PROGRESS_MIN && kvs__progress_wanted())
        return put_chunked(c, key, data, size);
    if (kvs_client_put(c, key, data, size, NULL) != KVS_OK) {
        fprintf(stderr, "kvstash put: %s\n", kvs_last_error());
        return 1;
    }
    return 0;
}

/* Writes object `key` to `path`, "-" for standard output (checked by the caller to be open). */
static int cmd_get(kvs_client_t *c, const char *key, const char *path)
{
    void *data;
    size_t size;
    /* A large object's transfer is one call (one lease, so its bytes are one version): its
     * progress line says when it starts and ends; writing it out then shows bytes written. */
    kvs__progress_t xfer;
    char what[96];
    snprintf(what, sizeof(what), "get %.64s: reading", key);
    int64_t want = kvs__progress_wanted() ? kvs_client_get_size(c, key) : 0;
    kvs__progress_start(&xfer, what, want > 0 ? (uint64_t)want : 0, true);
    xfer.on = xfer.on && want >= (int64_t)PROGRESS_MIN;
    kvs__progress_set(&xfer, 0);
    int rc = kvs_client_get(c, key, &data, &size);
    if (rc == KVS_OK)
        xfer.total = size;
    kvs__progress_end(&xfer, rc == KVS_OK);
    if (rc != KVS_OK) {
        fprintf(stderr, "kvstash get: %s\n", kvs_last_error());
        return 1;
    }
    bool out = strcmp(path, "-") == 0;
    FILE *f = out ? stdout : fopen(path, "wb");
    int ret = 0;
    if (f == NULL) {
        fprintf(stderr, "kvstash get: cannot open '%s': %s\n", path, strerror(errno));
        ret = 1;
    } else {
        /* A short write is an error: the object is all there or the call fails. */
        kvs__progress_t p;
        snprintf(what, sizeof(what), "get %.64s: writing", key);
        kvs__progress_start(&p, what, size, true);
        p.on = p.on && size >= PROGRESS_MIN;
        bool ok = true;
        for (size_t off = 0; ok && off < size; off += PROGRESS_CHUNK) {
            size_t n = KVS_MIN((size_t)PROGRESS_CHUNK, size - off);
            ok = fwrite((const char *)data + off, 1, n, f) == n;
            kvs__progress_set(&p, off + n);
        }
        int err = ok ? 0 : errno;
        if ((out ? fflush(f) : fclose(f)) != 0 && ok) {
            ok = false;
            err = errno;
        }
        kvs__progress_end(&p, ok);
        if (!ok) {
            fprintf(stderr, "kvstash get: cannot write %s%s%s: %s\n", out ? "" : "'",
                    out ? "standard output" : path, out ? "" : "'", strerror(err));
            ret = 1;
        }
    }
    kvs_free(data);
    return ret;
}

static int cmd_rm(kvs_client_t *c, const char *key, bool force)
{
    if (kvs_client_remove(c, key, force) != KVS_OK) {
        fprintf(stderr, "kvstash rm: %s\n", kvs_last_error());
        return 1;
    }
    return 0;
}

static int client_cmd(const char *master, uint64_t timeout_ms, const char *cmd, int argc,
                      char **argv)
{
    bool force = argc == 2 && strcmp(cmd, "rm") == 0 && strcmp(argv[1], "--force") == 0;
    int want = strcmp(cmd, "rm") == 0 ? 1 : 2;
    if (argc != want && !force) {
        fprintf(stderr, "kvstash %s: wants %s\n", cmd, want == 1 ? "KEY [--force]" : "KEY FILE|-");
        return 2;
    }
    bool put = strcmp(cmd, "put") == 0, get = strcmp(cmd, "get") == 0;
    if (get && strcmp(argv[1], "-") == 0 && !stdout_open("get"))
        return 1;
    /* Input is read, within what the store can hold, before the client connects. */
    char *data = NULL;
    size_t size = 0;
    if (put && put_input(master, timeout_ms, argv[1], &data, &size) != 0)
        return 1;
    kvs_client_config_t cfg;
    if (kvs_client_config_init(&cfg) != KVS_OK)
        fprintf(stderr, "kvstash: %s; using the default\n", kvs_last_error());
    cfg.master = master;
    cfg.rpc_timeout_ms = timeout_ms;
    cfg.transfer_timeout_ms = timeout_ms;
    kvs_client_t *c;
    int ret = 1;
    if (kvs_client_open(&cfg, &c) != KVS_OK) {
        fprintf(stderr, "kvstash: %s\n", kvs_last_error());
    } else {
        ret = put   ? cmd_put(c, argv[0], data, size)
              : get ? cmd_get(c, argv[0], argv[1])
                    : cmd_rm(c, argv[0], force);
        kvs_client_close(c);
    }
    kvs__free(data);
    return ret;
}

/* kvstash bench ...: returns the exit code. `from` names where `master` came from. */
static int bench_cmd(const char *master, const char *from, int argc, char **argv)
{
    const char *which = argc > 0 ? argv[0] : "";
    if (strcmp(which, "allocator") == 0)
        return kvs__bench_allocator_main(argc, argv);
    if (strcmp(which, "transport") == 0)
        return kvs__bench_transport_main(argc, argv);
    if (strcmp(which, "proto") == 0)
        return kvs__bench_proto_main(argc, argv);
    if (strcmp(which, "store") == 0)
        return kvs__bench_store_main(argc, argv);
    bool with_master = strcmp(which, "client") == 0 || strcmp(which, "gpu") == 0;
    if (with_master && master_check(master, from) != 0)
        return 2;
    if (strcmp(which, "client") == 0)
        return kvs__bench_client_main(master, argc, argv);
    if (strcmp(which, "scatter") == 0 || strcmp(which, "gpu") == 0) {
#ifdef KVS_HAVE_CUDA
        if (strcmp(which, "gpu") == 0)
            return kvs__bench_gpu_main(master, argc, argv);
        return kvs__bench_scatter_main(argc, argv);
#else
        fprintf(stderr,
                "kvstash bench %s: this build has no CUDA (nvcc was not found when "
                "it was configured)\n",
                which);
        return 1;
#endif
    }
    fprintf(stderr,
            "kvstash bench: unknown benchmark '%s' (known: allocator, transport, proto, "
            "client, store, scatter, gpu)\n",
            which);
    return 2;
}

/* ls and stat, over a connection of their own to the master. */
static int master_cmd(const char *master, uint64_t timeout_ms, const char *cmd, int argc,
                      char **argv)
{
    bool ls = strcmp(cmd, "ls") == 0;
    bool top = strcmp(cmd, "top") == 0 || (argc > 0 && strcmp(argv[0], "--watch") == 0);
    kvs__list_req_t req;
    uint64_t interval_ms = 0, count = 0;
    if (ls && ls_args(argc, argv, &req) != 0)
        return 2;
    if (top && top_args(argc, argv, &interval_ms, &count) != 0)
        return 2;
    if (!ls && !top && argc > 0) {
        fprintf(stderr, "kvstash stat: takes no arguments but --watch, got '%s'\n", argv[0]);
        return 2;
    }
    if (!stdout_open(cmd))
        return 1;
    cli_t c;
    if (cli_open(master, timeout_ms, &c) != 0)
        return 1;
    int ret = ls ? cmd_ls(&c, req) : top ? cmd_top(&c, master, interval_ms, count) : cmd_stat(&c);
    cli_close(&c);
    return ret;
}

int main(int argc, char **argv)
{
    if (!std_fds_guard())
        return 1; /* no /dev/null: nothing safe to report on */
    const char *master = NULL, *master_from = "--master";
    uint64_t timeout_ms = 5000;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        bool has_value = i + 1 < argc;
        if ((strcmp(argv[i], "--master") == 0 || strcmp(argv[i], "--timeout-ms") == 0 ||
             strcmp(argv[i], "--auth-token-file") == 0) &&
            !has_value) {
            fprintf(stderr, "kvstash: %s wants a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--master") == 0) {
            master = argv[++i];
            if (master_check(master, "--master") != 0)
                return 2;
        } else if (strcmp(argv[i], "--auth-token-file") == 0) {
            /* Through the environment, which the client library and the master calls read. */
            if (argv[++i][0] == '\0' || setenv("KVS_AUTH_TOKEN_FILE", argv[i], 1) != 0) {
                fprintf(stderr, "kvstash: --auth-token-file wants a path\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--timeout-ms") == 0) {
            if (kvs__parse_u64(argv[++i], 3600000, &timeout_ms) != KVS_OK || timeout_ms == 0) {
                fprintf(stderr, "kvstash: --timeout-ms wants 1..3600000, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            if (!stdout_open("--help"))
                return 1;
            usage(stdout);
            return stdout_finish("--help", 0);
        } else if (strcmp(argv[i], "--version") == 0) {
            if (!stdout_open("--version"))
                return 1;
            printf("kvstash %s\n", KVS_VERSION_STRING);
            return stdout_finish("--version", 0);
        } else {
            fprintf(stderr, "kvstash: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    if (master == NULL && (master = getenv("KVS_MASTER")) != NULL)
        master_from = "KVS_MASTER";
    if (master == NULL)
        master = DEFAULT_MASTER;
    const char *cmd = argv[i++];
    if (strcmp(cmd, "bench") == 0)
        return stdout_finish(cmd, bench_cmd(master, master_from, argc - i, argv + i));
    if (strcmp(cmd, "schema") == 0) {
        if (!stdout_open(cmd))
            return 1;
        kvs__schema_write_markdown(stdout);
        return stdout_finish(cmd, 0);
    }
    bool client = strcmp(cmd, "put") == 0 || strcmp(cmd, "get") == 0 || strcmp(cmd, "rm") == 0;
    if (!client && strcmp(cmd, "ls") != 0 && strcmp(cmd, "stat") != 0 && strcmp(cmd, "top") != 0) {
        fprintf(stderr, "kvstash: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (master_check(master, master_from) != 0)
        return 2;
    /* get checks its own writes to standard output; put and rm write none. */
    if (client)
        return client_cmd(master, timeout_ms, cmd, argc - i, argv + i);
    return stdout_finish(cmd, master_cmd(master, timeout_ms, cmd, argc - i, argv + i));
}
