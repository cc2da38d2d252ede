/* `kvstash bench transport`: loopback read throughput of the tcp transport from an owner's
 * data server, beside a plain-socket baseline measured the same way (same bytes, same number
 * of connections, one sending and one receiving thread per connection, sending from a buffer
 * as large as the data). Both run in this process. */
#define _GNU_SOURCE
#include "owner/owner_int.h"
#include "tools/cli_int.h"
#include "transport/tcp/tcp_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int fd;
    char *buf;
    size_t len;
    int rc;
} sock_job_t;

static void *send_job(void *p)
{
    sock_job_t *j = p;
    j->rc = kvs__send_all(j->fd, j->buf, j->len, kvs__now_ns() + 60 * KVS_NS_PER_S);
    return NULL;
}

static void *recv_job(void *p)
{
    sock_job_t *j = p;
    j->rc = kvs__recv_all(j->fd, j->buf, j->len, kvs__now_ns() + 60 * KVS_NS_PER_S);
    return NULL;
}

/* One plain-socket round: `conns` connections each move total/conns bytes. Returns GB/s. */
static double baseline_round(uint32_t conns, char *src, char *dst, size_t total)
{
    int lfd = kvs__tcp_listen("127.0.0.1", 0, 64);
    uint16_t port = kvs__sock_port(lfd);
    sock_job_t snd[64], rcv[64];
    pthread_t ts[64], tr[64];
    size_t share = total / conns;
    for (uint32_t i = 0; i < conns; i++) {
        int c = kvs__tcp_connect("127.0.0.1", port, kvs__now_ns() + 5 * KVS_NS_PER_S);
        int a = accept(lfd, NULL, NULL);
        kvs__set_nonblock(a, true);
        snd[i] = (sock_job_t){a, src + i * share, share, 0};
        rcv[i] = (sock_job_t){c, dst + i * share, share, 0};
    }
    uint64_t t0 = kvs__now_ns();
    for (uint32_t i = 0; i < conns; i++) {
        pthread_create(&ts[i], NULL, send_job, &snd[i]);
        pthread_create(&tr[i], NULL, recv_job, &rcv[i]);
    }
    for (uint32_t i = 0; i < conns; i++) {
        pthread_join(ts[i], NULL);
        pthread_join(tr[i], NULL);
    }
    double secs = (double)(kvs__now_ns() - t0) / 1e9;
    for (uint32_t i = 0; i < conns; i++) {
        close(snd[i].fd);
        close(rcv[i].fd);
        if (snd[i].rc != KVS_OK || rcv[i].rc != KVS_OK)
            return -1;
    }
    close(lfd);
    return (double)(share * conns) / secs / 1e9;
}

/* Median time (µs) of a fresh connection's first 4 KiB read: connect, HELLO (and AUTH with a
 * secret), the read. What authentication costs is paid here, once per connection. */
static double first_read_us(const char *ep_name, const kvs__auth_t *auth, bool tls, char *dst)
{
    enum { N = 101 };
    double us[N];
    for (int i = 0; i < N; i++) {
        kvs__tcp_config_t tcfg;
        kvs__tcp_config_init(&tcfg);
        tcfg.conns_per_peer = 1;
        tcfg.auth = *auth;
        tcfg.tls = tls;
        kvs_transport_t *t;
        kvs_endpoint_t *ep;
        if (kvs__tcp_transport_create(&tcfg, &t) != KVS_OK)
            return -1;
        uint64_t t0 = kvs__now_ns();
        if (t->ops->ep_open(t, ep_name, t0 + 5 * KVS_NS_PER_S, &ep) != KVS_OK) {
            t->ops->destroy(t);
            return -1;
        }
        struct iovec v = {dst, 4096};
        kvs_xfer_req_t req = {
            .op = KVS_XFER_READ, .ep = ep, .segment_id = 1, .length = 4096, .iov = &v, .iovcnt = 1};
        kvs_batch_t *b;
        int rc = t->ops->submit(t, &req, 1, UINT64_MAX, &b);
        if (rc == KVS_OK)
            rc = t->ops->wait(t, b, t0 + 5 * KVS_NS_PER_S);
        us[i] = (double)(kvs__now_ns() - t0) / 1e3;
        t->ops->ep_close(t, ep);
        t->ops->destroy(t);
        if (rc != KVS_OK)
            return -1;
    }
    qsort(us, N, sizeof(double), cmp_double);
    return us[N / 2];
}

int kvs__bench_transport_main(int argc, char **argv)
{
    uint64_t size = 256ull << 20, reps = 5;
    char why[512];
    kvs__auth_t auth;
    const char *token_file = NULL;
    bool tls = false;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: kvstash bench transport [--size SIZE] [--reps N] "
                   "[--auth-token-file PATH] [--tls]\n"
                   "defaults: --size 256MiB --reps 5; connections 1, 2, 4, 8; the token file\n"
                   "(default $KVS_AUTH_TOKEN_FILE) makes both sides authenticate; --tls (needs\n"
                   "the token) puts both sides' connections in TLS\n");
            return 0;
        }
        if (v && !strcmp(a, "--auth-token-file")) {
            token_file = v;
            continue;
        }
        if (!strcmp(a, "--tls")) {
            tls = true;
            i--; /* no value */
            continue;
        }
        if (v && !strcmp(a, "--size") && kvs__parse_size(v, &size) == KVS_OK && size >= 1 << 20)
            continue;
        if (v && !strcmp(a, "--reps") && kvs__parse_u64(v, 1000, &reps) == KVS_OK && reps > 0)
            continue;
        fprintf(stderr, "kvstash bench transport: bad option '%s %s'\n", a, v ? v : "");
        return 2;
    }
    if (kvs__auth_configure(token_file, &auth, why, sizeof(why)) != KVS_OK) {
        fprintf(stderr, "kvstash bench transport: %s\n", why);
        return 2;
    }
    kvs__segment_mem_t mem;
    if (kvs__segment_mem_create("bench", size, &mem) != KVS_OK)
        return 1;
    memset(mem.base, 0x5A, size);
    kvs__data_server_config_t dcfg;
    kvs__data_server_config_init(&dcfg);
    dcfg.auth = auth;
    dcfg.tls = tls;
    kvs__data_server_t *srv;
    if (kvs__data_server_create(&dcfg, &srv) != KVS_OK ||
        kvs__data_server_add(srv, 1, mem.base, size, mem.fd, NULL, 0) != KVS_OK)
        return 1;
    char ep_name[64];
    snprintf(ep_name, sizeof(ep_name), "127.0.0.1:%u", (unsigned)kvs__data_server_port(srv));
    char *dst = malloc(size), *src = malloc(size);
    if (!dst || !src)
        return 1;
    memset(dst, 1, size);
    memset(src, 2, size);
    static const uint32_t conn_list[] = {1, 2, 4, 8};
    printf("loopback read of %llu MiB per call, median of %llu calls after one warm-up; "
           "%ld cores; authentication %s, TLS %s\n\n",
           (unsigned long long)(size >> 20), (unsigned long long)reps,
           sysconf(_SC_NPROCESSORS_ONLN), auth.on ? "on" : "off", tls ? "on" : "off");
    printf("a fresh connection's first 4 KiB read (connect, handshake, read): median %.1f us "
           "of 101\n\n",
           first_read_us(ep_name, &auth, tls, dst));
    printf("| connections | kvstash tcp transport GB/s | plain sockets GB/s | ratio |\n");
    printf("|---|---|---|---|\n");
    int ret = 0;
    for (size_t ci = 0; ci < KVS_ARRAY_SIZE(conn_list); ci++) {
        kvs__tcp_config_t tcfg;
        kvs__tcp_config_init(&tcfg);
        tcfg.conns_per_peer = conn_list[ci];
        tcfg.auth = auth;
        tcfg.tls = tls;
        tcfg.tls = tls;
        kvs_transport_t *t;
        kvs_endpoint_t *ep;
        if (kvs__tcp_transport_create(&tcfg, &t) != KVS_OK ||
            t->ops->ep_open(t, ep_name, UINT64_MAX, &ep) != KVS_OK)
            return 1;
        double *gt = calloc(reps, sizeof(double)), *gb = calloc(reps, sizeof(double));
        for (uint64_t r = 0; r <= reps; r++) {
            struct iovec v = {dst, size};
            kvs_xfer_req_t req = {.op = KVS_XFER_READ,
                                  .ep = ep,
                                  .segment_id = 1,
                                  .length = size,
                                  .iov = &v,
                                  .iovcnt = 1};
            kvs_batch_t *b;
            uint64_t t0 = kvs__now_ns();
            int rc = t->ops->submit(t, &req, 1, UINT64_MAX, &b);
            if (rc == KVS_OK)
                rc = t->ops->wait(t, b, t0 + 60 * KVS_NS_PER_S);
            double secs = (double)(kvs__now_ns() - t0) / 1e9;
            if (rc != KVS_OK || memcmp(dst, mem.base, 4096) != 0 ||
                memcmp(dst + size - 4096, (char *)mem.base + size - 4096, 4096) != 0) {
                fprintf(stderr, "transfer failed: %s\n", kvs_status_str(rc));
                ret = 1;
            }
            double base = baseline_round(conn_list[ci], src, dst, size);
            if (r > 0) {
                gt[r - 1] = (double)size / secs / 1e9;
                gb[r - 1] = base;
            }
        }
        qsort(gt, reps, sizeof(double), cmp_double);
        qsort(gb, reps, sizeof(double), cmp_double);
        printf("| %u | %.2f | %.2f | %.2f |\n", conn_list[ci], gt[reps / 2], gb[reps / 2],
               gt[reps / 2] / gb[reps / 2]);
        fflush(stdout);
        free(gt);
        free(gb);
        t->ops->destroy(t);
    }
    kvs__data_server_destroy(srv);
    kvs__segment_mem_destroy(&mem);
    free(dst);
    free(src);
    return ret;
}
