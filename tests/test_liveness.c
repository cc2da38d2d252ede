/* Liveness with real processes: a master that was stopped, a master restarted (with another
 * heartbeat time-out), and an owner restarted under its name. Masters run --master-only and
 * owners --owner-only, so each can be stopped, killed and restarted on its own. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "common/common_int.h"
#include "proto/net_int.h"

#include <kvstash/kvstash.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* What one STAT says about a segment name and a counter; false when the master did not
 * answer (it is being restarted). */
typedef struct {
    uint64_t segment_id; /* 0: the name is not mounted */
    uint64_t mounted, expired, replaced;
} master_view_t;

static bool master_view(uint16_t port, const char *seg, master_view_t *v)
{
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = port, .timeout_ms = 1000};
    kvs__rpc_t *rpc = NULL;
    int rc = kvs__rpc_open(&cfg, &rpc);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    if (rc == KVS_OK) {
        kvs__rpc_begin(rpc, &req, KVS_MSG_STAT);
        rc = kvs__frame_end(&req);
    }
    if (rc == KVS_OK)
        rc = kvs__rpc_call(rpc, &req, &rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__stat_rsp_t st;
    if (rc == KVS_OK)
        rc = kvs__stat_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &st);
    if (rc == KVS_OK) {
        memset(v, 0, sizeof(*v));
        for (uint32_t i = 0; i < st.ncounters; i++) {
            if (kvs__str_eq(st.counters[i].name, kvs__str_c("segments_mounted")))
                v->mounted = st.counters[i].value;
            if (kvs__str_eq(st.counters[i].name, kvs__str_c("segments_expired")))
                v->expired = st.counters[i].value;
            if (kvs__str_eq(st.counters[i].name, kvs__str_c("segments_replaced")))
                v->replaced = st.counters[i].value;
        }
        for (uint32_t i = 0; i < st.nsegs; i++) {
            if (kvs__str_eq(st.segs[i].name, kvs__str_c(seg)))
                v->segment_id = st.segs[i].id;
        }
    }
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(rpc);
    return rc == KVS_OK;
}

/* Waits (polling every 10 ms, for at most `limit_ms`) until `seg` is mounted; returns the
 * milliseconds it took, or -1. */
static int64_t wait_mounted(uint16_t port, const char *seg, uint64_t limit_ms, master_view_t *v)
{
    uint64_t t0 = kvs__now_ns();
    while (kvs__now_ns() - t0 < limit_ms * KVS_NS_PER_MS) {
        if (master_view(port, seg, v) && v->segment_id != 0)
            return (int64_t)((kvs__now_ns() - t0) / KVS_NS_PER_MS);
        usleep(10000);
    }
    return -1;
}

static void master_start(server_t *m, const char *port, const char *hb_ms)
{
    const char *args[] = {"--master-only", "--port", port, "--heartbeat-timeout-ms", hb_ms, NULL};
    if (hb_ms == NULL)
        args[3] = NULL;
    server_start(m, args);
}

/* An owner of a 4 MiB segment named `name` on data port `data_port` ("0": any). */
static void owner_start(server_t *o, uint16_t master_port, const char *name, const char *data_port)
{
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)master_port);
    const char *args[] = {"--owner-only",   "--master", master,        "--segment-size", "4MiB",
                          "--segment-name", name,       "--data-port", data_port,        NULL};
    server_start(o, args);
}

static kvs_client_t *client_open(uint16_t master_port)
{
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)master_port);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.protocol = "tcp";
    cfg.rpc_timeout_ms = 3000;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    return c;
}

static void put_bytes(kvs_client_t *c, const char *key, uint8_t fill, size_t n)
{
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    memset(buf, fill, n);
    CHECK_STATUS(kvs_client_put(c, key, buf, n, NULL), KVS_OK);
    free(buf);
}

static void check_bytes(kvs_client_t *c, const char *key, uint8_t fill, size_t n)
{
    void *p = NULL;
    size_t got = 0;
    CHECK_STATUS(kvs_client_get(c, key, &p, &got), KVS_OK);
    CHECK_EQ_U64(got, n);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(((uint8_t *)p)[i], fill);
    kvs_free(p);
}

/* PUT_START (one replica of 4 KiB) or PUT_END of `key`; returns the key's status. */
static int writer_call(kvs__rpc_t *rpc, uint16_t type, const char *key)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__arena_t a;
    kvs__arena_init(&a);
    kvs__rpc_begin(rpc, &req, type);
    kvs__put_item_t it = {.key = kvs__str_c(key), .size = 4096};
    kvs__put_start_req_t ps = {.node = kvs__str_c("n"),
                               .replica_num = 1,
                               .preferred_segment = kvs__str_c(""),
                               .nitems = 1,
                               .items = &it};
    kvs__str_t k = kvs__str_c(key);
    kvs__keys_req_t kr = {.nkeys = 1, .keys = &k};
    if (type == KVS_MSG_PUT_START)
        kvs__put_start_req_encode(&req, &ps);
    else
        kvs__keys_req_encode(&req, &kr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    int st;
    if (type == KVS_MSG_PUT_START) {
        kvs__placement_rsp_t pr;
        CHECK_STATUS(kvs__placement_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &pr), KVS_OK);
        st = pr.objs[0].status;
    } else {
        kvs__status_list_rsp_t sr;
        CHECK_STATUS(kvs__status_list_rsp_decode(rsp.data, rsp.len, rsp.version, &a, &sr), KVS_OK);
        st = sr.results[0];
    }
    kvs__arena_free(&a);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return st;
}

/* A master stopped (SIGSTOP) for 2.5 heartbeat time-outs and resumed: it did not hear its
 * owners while it did not run, so none is expired and every object stays readable, and a put
 * pending across the pause is not discarded. (On resuming it used to expire every owner, with
 * all their objects.) */
static void test_master_paused_expires_no_owner(void)
{
    server_t m, a, b;
    const char *margs[] = {
        "--master-only", "--heartbeat-timeout-ms", "1000", "--put-discard-ms", "3000", NULL};
    server_start(&m, margs);
    owner_start(&a, m.port, "pause-a", "0");
    owner_start(&b, m.port, "pause-b", "0");
    master_view_t v0, v;
    CHECK(master_view(m.port, "pause-a", &v0) && v0.segment_id != 0);
    CHECK(master_view(m.port, "pause-b", &v) && v.segment_id != 0);
    uint64_t id_b = v.segment_id;
    kvs_client_t *c = client_open(m.port);
    put_bytes(c, "k1", 0x11, 65536);
    put_bytes(c, "k2", 0x22, 65536);
    kvs__rpc_t *writer = NULL; /* a put started before the pause and ended after it */
    kvs__rpc_config_t wcfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 3000};
    CHECK_STATUS(kvs__rpc_open(&wcfg, &writer), KVS_OK);
    CHECK_STATUS(writer_call(writer, KVS_MSG_PUT_START, "pending"), KVS_OK);

    CHECK_EQ_INT(kill(m.pid, SIGSTOP), 0);
    usleep(2500000);
    CHECK_EQ_INT(kill(m.pid, SIGCONT), 0);
    /* Past another whole time-out after the resume: owners heartbeat again meanwhile. */
    for (int i = 0; i < 15; i++) {
        usleep(100000);
        CHECK(master_view(m.port, "pause-a", &v));
        CHECK_EQ_U64(v.expired, 0);
        CHECK_EQ_U64(v.segment_id, v0.segment_id);
    }
    CHECK(master_view(m.port, "pause-b", &v));
    CHECK_EQ_U64(v.segment_id, id_b);
    CHECK_EQ_U64(v.mounted, 2);
    /* 4 s after its start, but the master ran for less than its 3 s discard time. */
    CHECK_STATUS(writer_call(writer, KVS_MSG_PUT_END, "pending"), KVS_OK);
    kvs__rpc_close(writer);
    check_bytes(c, "k1", 0x11, 65536);
    check_bytes(c, "k2", 0x22, 65536);
    kvs_client_close(c);
    server_stop(&a);
    server_stop(&b);
    server_stop(&m);
}

/* A master restarted on its port with a heartbeat time-out shorter than the owner's old
 * period: the owner adopts the new period at its new HELLO and mounts once, not over and over.
 * (The period was computed once, so the owner was expired and mounted again in a loop.) */
static void test_master_restarted_with_shorter_timeout_no_flapping(void)
{
    server_t m, o;
    master_start(&m, "0", "3000");
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)m.port);
    owner_start(&o, m.port, "flap", "0");
    server_kill(&m);
    master_start(&m, port, "600");
    master_view_t v;
    int64_t ms = wait_mounted(m.port, "flap", 10000, &v);
    CHECK(ms >= 0);
    uint64_t id = v.segment_id;
    /* Five new time-outs: a period of the old master's (a third of 3 s) would expire it. */
    for (int i = 0; i < 30; i++) {
        usleep(100000);
        CHECK(master_view(m.port, "flap", &v));
        CHECK_EQ_U64(v.expired, 0);
    }
    printf("re-mounts in 3 s after a restart with a shorter time-out: %llu\n",
           (unsigned long long)v.mounted);
    CHECK_EQ_U64(v.mounted, 1);
    CHECK_EQ_U64(v.segment_id, id);
    server_stop(&o);
    server_stop(&m);
}

/* The time from a restarted master listening to the owner mounted there again, with the
 * default heartbeat time-out (10 s), over three restarts. Printed; asserted below 2 s. (It
 * used to take up to two heartbeat periods: 6.6 s.) */
static void test_remount_time_after_master_restart(void)
{
    server_t m, o;
    master_start(&m, "0", NULL);
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)m.port);
    owner_start(&o, m.port, "remount", "0");
    int64_t worst = 0;
    for (int round = 0; round < 3; round++) {
        usleep((useconds_t)(kvs_test_rand() % 500000)); /* anywhere in the owner's period */
        uint64_t t_kill = kvs__now_ns();
        server_kill(&m);
        master_start(&m, port, NULL);
        master_view_t v;
        int64_t ms = wait_mounted(m.port, "remount", 10000, &v);
        CHECK(ms >= 0);
        printf("re-mount after master restart %d: %lld ms after it listened (%llu ms after the "
               "kill; heartbeat time-out 10000 ms)\n",
               round, (long long)ms,
               (unsigned long long)((kvs__now_ns() - t_kill) / KVS_NS_PER_MS));
        worst = KVS_MAX(worst, ms);
    }
    printf("worst re-mount time: %lld ms\n", (long long)worst);
    CHECK_CMP_U64(worst, <, 2000);
    server_stop(&o);
    server_stop(&m);
}

/* Runs kvstash-server with `args` and waits (at most 10 s) for it to exit; returns the exit
 * status (or -1 if it was still running: then it is killed). */
static int run_server_to_exit(const char *const *args)
{
    const char *argv[24] = {KVS_SERVER_PATH, "--port", "0", "--log-level", "error"};
    int n = 5;
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* An owner killed (SIGKILL) and restarted at once under its name mounts at once: its old
 * registration is proven dead (its master connection closed, its data port refuses) and
 * replaced, its objects dropped as by an expiry; the same with a fixed data port, which the
 * new owner then holds itself. A second owner asking for the name of a live one is still
 * refused. (The restarted owner used to exit with "segment already exists" until the old
 * registration timed out.) */
static void test_owner_restarted_under_its_name_mounts_at_once(void)
{
    server_t m, o;
    master_start(&m, "0", NULL); /* 10 s time-out: an expiry cannot explain a quick mount */
    owner_start(&o, m.port, "same", "0");
    master_view_t v0, v;
    CHECK(master_view(m.port, "same", &v0) && v0.segment_id != 0);
    kvs_client_t *c = client_open(m.port);
    put_bytes(c, "on-old", 0x33, 4096);

    for (int round = 0; round < 2; round++) {
        uint64_t t0 = kvs__now_ns();
        server_kill(&o);
        owner_start(&o, m.port, "same", "0");
        uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
        printf("owner restarted under its name (round %d): mounted %llu ms after the kill\n", round,
               (unsigned long long)ms);
        CHECK_CMP_U64(ms, <, 1000);
        CHECK(master_view(m.port, "same", &v));
        CHECK(v.segment_id != 0 && v.segment_id != v0.segment_id);
        CHECK_EQ_U64(v.replaced, (uint64_t)round + 1);
        CHECK_EQ_U64(v.expired, 0);
        CHECK_EQ_INT(kvs_client_exists(c, "on-old"), 0); /* dropped with its registration */
        v0 = v;
    }

    /* A fixed data port, taken again by the restarted owner. */
    char dport[8];
    snprintf(dport, sizeof(dport), "%u", (unsigned)o.port);
    server_kill(&o);
    uint64_t t0 = kvs__now_ns();
    owner_start(&o, m.port, "same", dport);
    CHECK_CMP_U64((kvs__now_ns() - t0) / KVS_NS_PER_MS, <, 1000);
    CHECK(master_view(m.port, "same", &v));
    CHECK(v.segment_id != 0 && v.segment_id != v0.segment_id);
    CHECK_EQ_U64(o.port, (uint64_t)atoi(dport));

    /* A second live owner with the name: refused, and the live one keeps its registration. */
    char master[32];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    const char *dup[] = {"--owner-only", "--master",       master, "--segment-size",
                         "4MiB",         "--segment-name", "same", NULL};
    CHECK_EQ_INT(run_server_to_exit(dup), 1);
    master_view_t after;
    CHECK(master_view(m.port, "same", &after));
    CHECK_EQ_U64(after.segment_id, v.segment_id);
    put_bytes(c, "on-new", 0x44, 4096);
    check_bytes(c, "on-new", 0x44, 4096);

    /* A stopped owner is not proven dead either (its port still accepts): refused too. */
    CHECK_EQ_INT(kill(o.pid, SIGSTOP), 0);
    CHECK_EQ_INT(run_server_to_exit(dup), 1);
    CHECK_EQ_INT(kill(o.pid, SIGCONT), 0);
    CHECK(master_view(m.port, "same", &after));
    CHECK_EQ_U64(after.segment_id, v.segment_id);

    kvs_client_close(c);
    server_stop(&o);
    server_stop(&m);
}

/* MOUNT of `name` (node `node`, data endpoint `endpoint`) on a connection of its own; returns
 * the status. With `keep_p` the connection stays open and is handed back. */
static int raw_mount(uint16_t port, const char *name, const char *node, const char *endpoint,
                     kvs__rpc_t **keep_p)
{
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = port, .timeout_ms = 5000};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_OK);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(rpc, &req, KVS_MSG_MOUNT);
    kvs__mount_req_t m = {kvs__str_c(name), kvs__str_c(node), kvs__str_c(endpoint),
                          1u << 20,         {NULL, 0},        0};
    kvs__mount_req_encode(&req, &m);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__mount_rsp_t mr;
    CHECK_STATUS(kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &mr), KVS_OK);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    if (keep_p != NULL)
        *keep_p = rpc;
    else
        kvs__rpc_close(rpc);
    return mr.status;
}

typedef struct {
    uint16_t port;
    int status;
    uint64_t ms;
} mount_job_t;

static void *mount_job(void *arg)
{
    mount_job_t *j = arg;
    uint64_t t0 = kvs__now_ns();
    j->status = raw_mount(j->port, "ghost", "n2", "127.0.0.1:9", NULL);
    j->ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    return NULL;
}

/* Fills the accept queue of `lfd` (listening with a backlog of 0) with three connects, so that
 * a further connect's SYN is dropped and it hangs. */
static void fill_backlog(int lfd, int fill[3])
{
    for (int i = 0; i < 3; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons(kvs__sock_port(lfd)),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        connect(fill[i], (struct sockaddr *)&sa, sizeof(sa));
    }
}

/* A holder whose master connection closed is replaced only when a connect to its data
 * endpoint is refused: not while the endpoint accepts (a live owner that lost its master
 * connection), nor while the connect hangs (its SYN dropped: the probe times out), during
 * which the master serves other requests. (A taken name was always refused.) */
static void test_holder_replaced_only_when_its_port_refuses(void)
{
    server_t m;
    const char *args[] = {"--master-only", "--probe-timeout-ms", "400", NULL};
    server_start(&m, args);
    int lfd = kvs__tcp_listen("127.0.0.1", 0, 0); /* a backlog of 0: easy to fill */
    CHECK(lfd >= 0);
    CHECK_STATUS(kvs__set_nonblock(lfd, true), KVS_OK);
    char endpoint[32];
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%u", (unsigned)kvs__sock_port(lfd));
    CHECK_STATUS(raw_mount(m.port, "ghost", "n1", endpoint, NULL), KVS_OK); /* then it leaves */
    master_view_t v0, v;
    CHECK(master_view(m.port, "ghost", &v0) && v0.segment_id != 0);

    /* Fill the backlog: the probe's SYN is dropped and its connect hangs. */
    int fill[3];
    fill_backlog(lfd, fill);
    usleep(50000);
    mount_job_t job = {.port = m.port};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, mount_job, &job), 0);
    usleep(100000);
    uint64_t t0 = kvs__now_ns();
    CHECK(master_view(m.port, "ghost", &v)); /* answered while the probe is in flight */
    uint64_t stat_ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    pthread_join(th, NULL);
    printf("MOUNT against a hanging probe: %d after %llu ms; a STAT meanwhile: %llu ms\n",
           job.status, (unsigned long long)job.ms, (unsigned long long)stat_ms);
    CHECK_STATUS(job.status, KVS_SEGMENT_ALREADY_EXISTS);
    CHECK_CMP_U64(stat_ms, <, 200);
    CHECK_CMP_U64(job.ms, >=, 300);
    CHECK_CMP_U64(job.ms, <, 2000);
    for (int i = 0; i < 3; i++)
        close(fill[i]);

    /* The endpoint accepts: alive. */
    for (int i = 0; i < 4; i++) { /* empty the accept queue */
        int a = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (a >= 0)
            close(a);
    }
    CHECK_STATUS(raw_mount(m.port, "ghost", "n2", "127.0.0.1:9", NULL), KVS_SEGMENT_ALREADY_EXISTS);
    CHECK(master_view(m.port, "ghost", &v));
    CHECK_EQ_U64(v.segment_id, v0.segment_id);
    CHECK_EQ_U64(v.replaced, 0);

    /* A holder still connected is alive whatever its port says. */
    close(lfd);
    kvs__rpc_t *keep = NULL;
    CHECK_STATUS(raw_mount(m.port, "held", "n1", endpoint, &keep), KVS_OK);
    CHECK_STATUS(raw_mount(m.port, "held", "n2", "127.0.0.1:9", NULL), KVS_SEGMENT_ALREADY_EXISTS);

    /* Refused: dead, replaced. */
    CHECK_STATUS(raw_mount(m.port, "ghost", "n2", "127.0.0.1:9", NULL), KVS_OK);
    CHECK(master_view(m.port, "ghost", &v));
    CHECK(v.segment_id != 0 && v.segment_id != v0.segment_id);
    CHECK_EQ_U64(v.replaced, 1);
    kvs__rpc_close(keep);
    server_stop(&m);
}

/* A MOUNT whose client leaves while it waits for its probe is dropped with the probe: a probe
 * that then finds the holder dead replaces nothing and mounts nothing for the departed client.
 * (A parked connection's close went unnoticed: the probe's verdict replaced the holder and
 * mounted a segment for a client that was gone, whose reconnect was then refused.) */
static void test_mount_dropped_when_its_client_leaves_during_the_probe(void)
{
    server_t m;
    const char *args[] = {"--master-only", "--probe-timeout-ms", "4000", NULL};
    server_start(&m, args);
    int lfd = kvs__tcp_listen("127.0.0.1", 0, 0);
    CHECK(lfd >= 0);
    char endpoint[32];
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%u", (unsigned)kvs__sock_port(lfd));
    CHECK_STATUS(raw_mount(m.port, "ghost", "n1", endpoint, NULL), KVS_OK); /* then it leaves */
    master_view_t v0, v;
    CHECK(master_view(m.port, "ghost", &v0) && v0.segment_id != 0);
    int fill[3];
    fill_backlog(lfd, fill);
    usleep(50000);
    /* A MOUNT of the name that gives up after 300 ms: its connection closes while parked. */
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 300};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_OK);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(rpc, &req, KVS_MSG_MOUNT);
    kvs__mount_req_t mr = {
        kvs__str_c("ghost"), kvs__str_c("n2"), kvs__str_c("127.0.0.1:9"), 1 << 20, {NULL, 0}, 0};
    kvs__mount_req_encode(&req, &mr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_TIMED_OUT);
    kvs__rpc_close(rpc);
    /* Now the holder's port refuses: the probe (had it survived) would say dead. */
    for (int i = 0; i < 3; i++)
        close(fill[i]);
    close(lfd);
    usleep(1500 * 1000); /* past the SYN's first retransmission, which meets the refusal */
    CHECK(master_view(m.port, "ghost", &v));
    CHECK_EQ_U64(v.segment_id, v0.segment_id);
    CHECK_EQ_U64(v.replaced, 0);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    server_stop(&m);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_master_paused_expires_no_owner),
        KVS_TEST_CASE(test_master_restarted_with_shorter_timeout_no_flapping),
        KVS_TEST_CASE(test_remount_time_after_master_restart),
        KVS_TEST_CASE(test_owner_restarted_under_its_name_mounts_at_once),
        KVS_TEST_CASE(test_holder_replaced_only_when_its_port_refuses),
        KVS_TEST_CASE(test_mount_dropped_when_its_client_leaves_during_the_probe),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
