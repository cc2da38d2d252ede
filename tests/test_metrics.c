/* Metrics: the tables are well formed, the Prometheus text is what the format wants (each family
 * once, cumulative buckets, escaped labels), the client stats struct keeps its ABI, and the HTTP
 * endpoint answers GET /metrics (or is refused with a reason in a build without it). */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "client/client_int.h"
#include "common/metrics_int.h"
#include "master/master_int.h"
#include "master/master_server_int.h"
#include "owner/owner_int.h"
#include "proto/net_int.h"
#include "transport/shm/shm_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void test_tables_are_well_formed(void)
{
    size_t n;
    CHECK_EQ_INT(kvs__metrics_check_table(kvs__client_metrics, kvs__client_nmetrics), -1);
    const kvs__metric_desc_t *m = kvs__master_metrics_table(&n);
    CHECK_EQ_INT(kvs__metrics_check_table(m, n), -1);
    const kvs__metric_desc_t *o = kvs__data_server_metrics_table(&n);
    CHECK_EQ_INT(kvs__metrics_check_table(o, n), -1);
    /* The check can fail: a family whose members disagree on kind, a repeated label set, an
     * upper-case name, a family without help. */
    const kvs__metric_desc_t bad[] = {
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "a", "fam", "x=\"1\"", "help"},
        {KVS_METRIC_GAUGE, KVS_UNIT_NONE, "b", "fam", "x=\"2\"", ""},
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "c", "fam", "x=\"1\"", ""},
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "D", "dee", "", "help"},
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "e", "eee", "", ""},
    };
    CHECK_EQ_INT(kvs__metrics_check_table(bad, 1), -1);
    CHECK_EQ_INT(kvs__metrics_check_table(bad, 2), 1);
    CHECK_EQ_INT(kvs__metrics_check_table((const kvs__metric_desc_t[]){bad[0], bad[2]}, 2), 1);
    CHECK_EQ_INT(kvs__metrics_check_table(&bad[3], 1), 0);
    CHECK_EQ_INT(kvs__metrics_check_table(&bad[4], 1), 0);
}

/* kvs_client_stats_t is generated from the table: its layout must stay what programs built
 * against the first release read (append-only). */
static void test_client_stats_abi(void)
{
    /* The 0.1.0 struct, field by field: 33 counters, two histograms, one counter. */
    static const char *const v0[] = {"put_calls",
                                     "put_keys",
                                     "put_bytes",
                                     "put_failed_keys",
                                     "get_calls",
                                     "get_keys",
                                     "get_bytes",
                                     "get_failed_keys",
                                     "get_grouped_calls",
                                     "get_submissions",
                                     "get_lease_expired",
                                     "get_timed_out",
                                     "get_transfer_fail",
                                     "remove_calls",
                                     "exists_calls",
                                     "size_calls",
                                     "rpc_failures",
                                     "tcp_transfers",
                                     "shm_transfers",
                                     "plan_ns_total",
                                     "planned_fragments",
                                     "registered_buffers",
                                     "registered_bytes",
                                     "staged_reads",
                                     "staged_keys",
                                     "fills",
                                     "scatter_launches",
                                     "fallback_busy",
                                     "fallback_too_large",
                                     "fallback_overlap",
                                     "fallback_other_domain",
                                     "fallback_other_gpu",
                                     "fallback_alloc_failed",
                                     "put_latency",
                                     "get_latency",
                                     "fallback_not_exact"};
    size_t off = 0;
    for (size_t i = 0; i < KVS_ARRAY_SIZE(v0); i++) {
        CHECK_EQ_STR(kvs__client_metrics[i].name, v0[i]);
        CHECK_EQ_U64(kvs__client_metric_offsets[i], off);
        off += kvs__client_metrics[i].kind == KVS_METRIC_HIST ? sizeof(kvs_histogram_t) : 8;
    }
    CHECK_EQ_U64(off, KVS_CLIENT_STATS_V0_SIZE);
    CHECK_EQ_U64(sizeof(kvs_histogram_t), (3 + KVS_HIST_BUCKETS) * 8);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, put_calls), 0);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, get_grouped_calls), 8 * 8);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, plan_ns_total), 19 * 8);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, fallback_alloc_failed), 32 * 8);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, put_latency), 33 * 8);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, get_latency), 33 * 8 + 280);
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, fallback_not_exact), 33 * 8 + 2 * 280);
    /* Fields after 0.1.0 only ever append: the first release's additions keep their offsets. */
    CHECK_EQ_U64(offsetof(kvs_client_stats_t, staging_held_bytes), 1720);
    CHECK_EQ_U64(kvs__client_metric_offsets[kvs__client_nmetrics - 1],
                 offsetof(kvs_client_stats_t, get_lookup_overlapped_ns));
}

static void test_exposition(void)
{
    static const kvs__metric_desc_t d[] = {
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "reads_a", "reads", "mode=\"a\"", "Reads by mode"},
        {KVS_METRIC_GAUGE, KVS_UNIT_BYTES, "held", "held", "", "Held"},
        {KVS_METRIC_COUNTER, KVS_UNIT_NONE, "reads_b", "reads", "mode=\"b\"", ""},
        {KVS_METRIC_COUNTER, KVS_UNIT_NS, "plan", "plan", "", "Planning"},
        {KVS_METRIC_HIST, KVS_UNIT_NS, "lat", "lat", "", "Latency"},
    };
    kvs__hist_t live;
    memset(&live, 0, sizeof(live));
    kvs__hist_add(&live, 500);     /* < 1 µs: bucket 0 */
    kvs__hist_add(&live, 3000);    /* 3 µs: [2, 4) µs */
    kvs__hist_add(&live, 3000000); /* 3 ms */
    kvs_histogram_t h;
    kvs__hist_copy(&h, &live);
    CHECK_EQ_U64(h.count, 3);
    CHECK_EQ_U64(h.max_ns, 3000000);
    kvs__metric_value_t v[] = {
        {&d[0], NULL, 5, NULL},          {&d[1], "seg=\"x\"", 7, NULL}, {&d[2], NULL, 6, NULL},
        {&d[3], NULL, 1500000000, NULL}, {&d[4], NULL, 0, &h},
    };
    kvs__text_t t = {0};
    kvs__metrics_write(&t, "kvs_", v, KVS_ARRAY_SIZE(v));
    CHECK(!t.failed);
    const char *s = t.p;
    /* Each family once, its samples together, in the order of first appearance. */
    CHECK_EQ_U64(count(s, "# TYPE kvs_reads_total counter\n"), 1);
    CHECK_EQ_U64(count(s, "# HELP kvs_reads_total Reads by mode\n"), 1);
    const char *a = strstr(s, "kvs_reads_total{mode=\"a\"} 5\n"),
               *b = strstr(s, "kvs_reads_total{mode=\"b\"} 6\n"),
               *g = strstr(s, "# TYPE kvs_held_bytes gauge\n");
    CHECK(a != NULL && b != NULL && g != NULL);
    CHECK(a < b && b < g);
    CHECK(strstr(s, "kvs_held_bytes{seg=\"x\"} 7\n") != NULL);
    CHECK(strstr(s, "kvs_plan_seconds_total 1.500000000\n") != NULL);
    /* Histograms: seconds, cumulative, +Inf and _count equal the calls. */
    CHECK(strstr(s, "# TYPE kvs_lat_seconds histogram\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"0.000001\"} 1\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"0.000002\"} 1\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"0.000004\"} 2\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"0.002048\"} 2\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"0.004096\"} 3\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_bucket{le=\"+Inf\"} 3\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_sum 0.003003500\n") != NULL);
    CHECK(strstr(s, "kvs_lat_seconds_count 3\n") != NULL);
    CHECK_EQ_U64(count(s, "kvs_lat_seconds_bucket"), KVS_HIST_BUCKETS);
    CHECK(strstr(s, "le=\"1073.741824\"") != NULL); /* 2^30 µs, exact */
    kvs__text_free(&t);

    /* A label of 1 KiB (a long escaped segment name) is written whole. */
    char big[1100];
    memset(big, 'n', sizeof(big));
    memcpy(big, "seg=\"", 5);
    memcpy(big + sizeof(big) - 2, "\"", 2);
    kvs__metric_value_t lv = {&d[1], big, 3, NULL};
    kvs__text_t t2 = {0};
    kvs__metrics_write(&t2, "kvs_", &lv, 1);
    CHECK(!t2.failed);
    char tail[] = "nnnn\"} 3\n";
    CHECK(t2.len > sizeof(big) && strstr(t2.p, tail) != NULL);
    kvs__text_free(&t2);

    char esc[64];
    kvs__metrics_label_escape("a\"b\\c\nd", esc, sizeof(esc));
    CHECK_EQ_STR(esc, "a\\\"b\\\\c\\nd");
    /* Names come from peers: what is not UTF-8, and control characters, become '?'; valid
     * UTF-8 stays. */
    kvs__metrics_label_escape("x\xff\xc0\xafy\x1b[2J\xc3\xa9\xe2\x82\xac\xed\xa0\x80z", esc,
                              sizeof(esc));
    CHECK_EQ_STR(esc, "x???y?[2J\xc3\xa9\xe2\x82\xac???z");
    kvs__metrics_label_escape("abcdefgh", esc, 5); /* truncated, terminated */
    CHECK_EQ_STR(esc, "abcd");
    kvs__metrics_label_escape("abc\xc3\xa9", esc, 5); /* never half a character */
    CHECK_EQ_STR(esc, "abc");
}

static int render_fixed(void *arg, kvs__text_t *t)
{
    atomic_int *calls = arg; /* the HTTP server's thread counts, the test's reads */
    int n = atomic_fetch_add(calls, 1) + 1;
    kvs__text_printf(t, "# TYPE x gauge\nx %d\n", n);
    return KVS_OK;
}

static int render_fail(void *arg, kvs__text_t *t)
{
    KVS_UNUSED(arg);
    KVS_UNUSED(t);
    return KVS_TIMED_OUT;
}

/* One HTTP/1.0 request; returns the whole response. */
static char *http(uint16_t port, const char *request)
{
    int fd = kvs__tcp_connect("127.0.0.1", port, kvs__now_ns() + 5 * KVS_NS_PER_S);
    CHECK(fd >= 0);
    kvs__set_nonblock(fd, false);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    CHECK(write(fd, request, strlen(request)) == (ssize_t)strlen(request));
    static char buf[65536];
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
    close(fd);
    return buf;
}

static void test_http_endpoint(void)
{
    kvs__metrics_http_t *h = NULL;
    if (!kvs__metrics_http_available()) {
        CHECK_STATUS(kvs__metrics_http_start(NULL, 0, &h), KVS_UNSUPPORTED);
        CHECK(strstr(kvs_last_error(), "libmicrohttpd") != NULL);
        CHECK(h == NULL);
        return;
    }
    CHECK_STATUS(kvs__metrics_http_start("not-an-address", 0, &h), KVS_INVALID_PARAMS);
    /* IPv6 where the host has it (a container may have no ::1): served there, or skipped. */
    int p6 = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have6 = p6 >= 0 && bind(p6, (struct sockaddr *)&a6, sizeof(a6)) == 0;
    if (p6 >= 0)
        close(p6);
    if (have6) {
        atomic_int calls6 = 0;
        CHECK_STATUS(kvs__metrics_http_start("::1", 0, &h), KVS_OK);
        CHECK_STATUS(kvs__metrics_http_add(h, render_fixed, &calls6), KVS_OK);
        a6.sin6_port = htons(kvs__metrics_http_port(h));
        int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a6, sizeof(a6)) == 0);
        const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
        CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
        char r6[4096];
        size_t n6 = 0;
        ssize_t got;
        while (n6 + 1 < sizeof(r6) && (got = read(fd, r6 + n6, sizeof(r6) - 1 - n6)) > 0)
            n6 += (size_t)got;
        r6[n6] = '\0';
        close(fd);
        CHECK(strstr(r6, " 200 ") != NULL && strstr(r6, "x 1\n") != NULL);
        kvs__metrics_http_stop(h);
        h = NULL;
    } else {
        printf("  (no IPv6 loopback here: the ::1 case is skipped)\n");
    }
    CHECK_STATUS(kvs__metrics_http_start("127.0.0.1", 0, &h), KVS_OK);
    uint16_t port = kvs__metrics_http_port(h);
    CHECK(port != 0);
    /* The port taken: a clear refusal. */
    kvs__metrics_http_t *h2 = NULL;
    CHECK_STATUS(kvs__metrics_http_start("127.0.0.1", port, &h2), KVS_IO_ERROR);
    CHECK(strstr(kvs_last_error(), "cannot listen") != NULL);
    atomic_int calls = 0;
    CHECK_STATUS(kvs__metrics_http_add(h, render_fixed, &calls), KVS_OK);
    char *r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    CHECK(strncmp(r, "HTTP/1.0 200", 12) == 0 || strncmp(r, "HTTP/1.1 200", 12) == 0);
    CHECK(strstr(r, "text/plain; version=0.0.4") != NULL);
    CHECK(strstr(r, "\r\n\r\n# TYPE x gauge\nx 1\n") != NULL);
    r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, "x 2\n") != NULL);
    r = http(port, "GET /other HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, " 404 ") != NULL);
    r = http(port, "DELETE /metrics HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, " 405 ") != NULL);
    CHECK_EQ_INT(atomic_load(&calls), 2);
    /* A source that cannot render: 503 with the reason, not a partial scrape. */
    CHECK_STATUS(kvs__metrics_http_add(h, render_fail, NULL), KVS_OK);
    r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, " 503 ") != NULL);
    CHECK(strstr(r, "x 3") == NULL);
    CHECK(strstr(r, "timed out") != NULL);
    kvs__metrics_http_stop(h);
    kvs__metrics_http_stop(NULL);
}

/* The master's scrape is rendered on its loop thread; a loop that does not answer in time is
 * KVS_TIMED_OUT, never a scrape written later into a buffer the caller dropped. */
static void test_master_scrape(void)
{
    kvs__master_server_config_t cfg;
    CHECK_STATUS(kvs__master_server_config_init(&cfg), KVS_OK);
    cfg.port = 0;
    cfg.metrics_timeout_ms = 200;
    kvs__master_server_t *s = NULL;
    CHECK_STATUS(kvs__master_server_create(&cfg, &s), KVS_OK);
    CHECK_STATUS(kvs__master_server_start(s), KVS_OK);
    for (int i = 0; i < 3; i++) {
        kvs__text_t t = {0};
        CHECK_STATUS(kvs__master_server_metrics_render(s, &t), KVS_OK);
        CHECK(strstr(t.p, "# TYPE kvstash_master_objects gauge\nkvstash_master_objects 0\n"));
        CHECK(strstr(t.p, "kvstash_master_puts_started_total 0\n") != NULL);
        CHECK(strstr(t.p, "kvstash_master_leader 1\n") != NULL);
        CHECK(strstr(t.p, "kvstash_master_segment_used_bytes") == NULL); /* no segment yet */
        kvs__text_free(&t);
    }
    /* The stats call writes no more than the caller's struct holds: the 0.1.0 symbol its
     * prefix, the sized call `size` bytes; below the 0.1.0 size it refuses. */
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)kvs__master_server_port(s));
    kvs_client_config_t ccfg;
    CHECK_STATUS(kvs_client_config_init(&ccfg), KVS_OK);
    ccfg.master = addr;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&ccfg, &c), KVS_OK);
    CHECK_EQ_INT(kvs_client_exists(c, "nothing"), 0);
    static _Alignas(8) unsigned char buf[sizeof(kvs_client_stats_t) + 64];
    memset(buf, 0xa5, sizeof(buf));
    CHECK_STATUS((kvs_client_get_stats)(c, (kvs_client_stats_t *)(void *)buf), KVS_OK);
    for (size_t i = KVS_CLIENT_STATS_V0_SIZE; i < sizeof(buf); i++)
        CHECK_EQ_INT(buf[i], 0xa5);
    CHECK_EQ_U64(((kvs_client_stats_t *)(void *)buf)->exists_calls, 1);
    memset(buf, 0xa5, sizeof(buf));
    CHECK_STATUS(kvs_client_get_stats_sized(c, (kvs_client_stats_t *)(void *)buf,
                                            KVS_CLIENT_STATS_V0_SIZE + 8),
                 KVS_OK);
    CHECK_EQ_INT(buf[KVS_CLIENT_STATS_V0_SIZE + 8], 0xa5);
    for (size_t i = KVS_CLIENT_STATS_V0_SIZE; i < KVS_CLIENT_STATS_V0_SIZE + 8; i++)
        CHECK_EQ_INT(buf[i], 0); /* get_direct_calls: written, and 0 (no read yet) */
    /* A newer caller's longer struct: the fields this library lacks are 0, not left as they
     * were. */
    memset(buf, 0xa5, sizeof(buf));
    CHECK_STATUS(kvs_client_get_stats_sized(c, (kvs_client_stats_t *)(void *)buf, sizeof(buf)),
                 KVS_OK);
    for (size_t i = sizeof(kvs_client_stats_t); i < sizeof(buf); i++)
        CHECK_EQ_INT(buf[i], 0);
    CHECK_STATUS(kvs_client_get_stats_sized(c, (kvs_client_stats_t *)(void *)buf, 100),
                 KVS_INVALID_PARAMS);
    kvs_client_stats_t full;
    CHECK_STATUS(kvs_client_get_stats(c, &full), KVS_OK);
    CHECK_EQ_U64(full.exists_calls, 1);
    kvs_client_close(c);
    kvs__master_server_stop(s); /* the loop ends: nobody answers scrapes now */
    usleep(50000);
    kvs__text_t t = {0};
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(kvs__master_server_metrics_render(s, &t), KVS_TIMED_OUT);
    CHECK_CMP_U64(kvs__now_ns() - t0, >=, 150 * KVS_NS_PER_MS);
    CHECK(t.len == 0);
    kvs__text_free(&t);
    kvs__master_server_destroy(s);
}

/* Owner refusals are counted by reason and exposed with the owner's name. */
static void test_owner_refusals(void)
{
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
    cfg.port = 0;
    char dir[] = "/tmp/kvs-metrics-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    cfg.shm_dir = dir;
    kvs__data_server_t *d = NULL;
    CHECK_STATUS(kvs__data_server_create(&cfg, &d), KVS_OK);
    /* Garbage where a frame header should be: a protocol refusal, and the connection closed. */
    int fd = kvs__tcp_connect("127.0.0.1", kvs__data_server_port(d), kvs__now_ns() + KVS_NS_PER_S);
    CHECK(fd >= 0);
    kvs__set_nonblock(fd, false);
    char junk[64];
    memset(junk, 'x', sizeof(junk));
    CHECK(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
    char b[256];
    while (read(fd, b, sizeof(b)) > 0) {
    }
    close(fd);
    uint64_t deadline = kvs__now_ns() + 5 * KVS_NS_PER_S;
    while (kvs__data_server_refused(d) < 1 && kvs__now_ns() < deadline)
        usleep(1000);
    CHECK_EQ_U64(kvs__data_server_refused(d), 1);
    /* The shm socket: a peer that connects and leaves without a word is a liveness probe (the
     * clients' sweep of the socket directory), not a refusal; a short request is one. */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    CHECK_STATUS(kvs__shm_socket_path(dir, kvs__data_server_port(d), path, sizeof(path)), KVS_OK);
    for (int round = 0; round < 3; round++) {
        int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un ua = {.sun_family = AF_UNIX};
        memcpy(ua.sun_path, path, strlen(path) + 1);
        CHECK(u >= 0 && connect(u, (struct sockaddr *)&ua, sizeof(ua)) == 0);
        if (round == 2) { /* closed with the greeting unread: the owner sees a reset */
            usleep(20000);
            close(u);
            continue;
        }
        if (round == 1)
            CHECK(write(u, "short", 5) == 5);
        shutdown(u, SHUT_WR);
        while (read(u, b, sizeof(b)) > 0) { /* the greeting, then the owner's close */
        }
        close(u);
    }
    deadline = kvs__now_ns() + 5 * KVS_NS_PER_S;
    while (kvs__data_server_refused(d) < 2 && kvs__now_ns() < deadline)
        usleep(1000);
    usleep(50000); /* a wrong count would have landed by now */
    CHECK_EQ_U64(kvs__data_server_refused(d), 2);
    kvs__text_t t = {0};
    CHECK_STATUS(kvs__data_server_metrics_render(d, &t), KVS_OK);
    char want[160];
    snprintf(want, sizeof(want),
             "kvstash_owner_refusals_total{reason=\"protocol\",owner=\"%s\"} 2\n",
             kvs__data_server_name(d));
    CHECK(strstr(t.p, want) != NULL);
    snprintf(want, sizeof(want), "kvstash_owner_refusals_total{reason=\"auth\",owner=\"%s\"} 0\n",
             kvs__data_server_name(d));
    CHECK(strstr(t.p, want) != NULL);
    CHECK(strstr(t.p, "# TYPE kvstash_owner_request_latency_seconds histogram\n") != NULL);
    CHECK_EQ_U64(count(t.p, "# TYPE kvstash_owner_requests_total counter"), 1);
    kvs__text_free(&t);
    kvs__data_server_destroy(d);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_tables_are_well_formed),
        KVS_TEST_CASE(test_client_stats_abi),
        KVS_TEST_CASE(test_exposition),
        KVS_TEST_CASE(test_http_endpoint),
        KVS_TEST_CASE(test_master_scrape),
        KVS_TEST_CASE(test_owner_refusals),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
