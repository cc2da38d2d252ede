/* The deadline matrix (DESIGN §6 rule 5): every public call returns within its deadline plus
 * 100 ms whatever its peers do — a stopped master, a stopped owner, an owner whose listen
 * backlog is full, a host name that takes long to resolve, and eight threads of one client
 * against a stopped master. Each call's return time is printed beside its deadline; an overrun
 * beyond 100 ms fails the case. Peers are real kvstash-server processes on loopback. */
#define _GNU_SOURCE
#include "client_fixture.h"
#include "kvs_test.h"
#include "proto/net_int.h"
#include "server_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEADLINE_MS 400u
#define SLACK_MS    100u

/* SIGSTOP, and wait until the (child) process is really stopped: the signal is asynchronous,
 * and a peer still running for a moment would answer the first call. */
static void stop_peer(pid_t pid)
{
    CHECK_EQ_INT(kill(pid, SIGSTOP), 0);
    int st = 0;
    CHECK_EQ_INT(waitpid(pid, &st, WUNTRACED), pid);
    CHECK(WIFSTOPPED(st));
}

static uint64_t ms_since(uint64_t t0)
{
    return (kvs__now_ns() - t0) / KVS_NS_PER_MS;
}

/* Records one call: its status and return time against the deadline. */
static void report(const char *what, int64_t rc, uint64_t ms, uint64_t deadline_ms)
{
    printf("  %-44s -> %-22s %5llu ms (deadline %llu ms)\n", what,
           rc >= 0 ? "ok" : kvs_status_name((int)rc), (unsigned long long)ms,
           (unsigned long long)deadline_ms);
    fflush(stdout);
    CHECK_CMP_U64(ms, <=, deadline_ms + SLACK_MS);
}

static kvs_client_t *open_client(const char *master, const char *protocol)
{
    return client_open_timeouts(master, protocol, DEADLINE_MS, DEADLINE_MS);
}

typedef struct {
    kvs_client_t *c;
    uint8_t *buf; /* registered, 2 x 64 KiB */
} calls_t;

#define OBJ 65536u

/* Runs every public call kind once against `c` and checks each return time. `must_fail`: the
 * peers cannot answer, so no call may report success either. */
static void run_all_calls(calls_t *k, bool must_fail)
{
    kvs_client_t *c = k->c;
    static uint8_t src[OBJ];
    const char *key = "warm";
    const char *keys[2] = {"warm", "warm2"};
    uint64_t t0;
    int64_t rc;
#define TIME(label, expr)                                                                          \
    do {                                                                                           \
        t0 = kvs__now_ns();                                                                        \
        rc = (expr);                                                                               \
        report(label, rc, ms_since(t0), DEADLINE_MS);                                              \
        if (must_fail)                                                                             \
            CHECK(rc < 0);                                                                         \
    } while (0)
    TIME("put", kvs_client_put(c, "new-put", src, sizeof(src), NULL));
    TIME("put_from", kvs_client_put_from(c, "new-put-from", k->buf, OBJ, NULL));
    kvs_buf_t bufs[2] = {{k->buf, OBJ / 2}, {k->buf + OBJ / 2, OBJ / 2}};
    int res[2];
    int64_t got[2];
    int r;
    TIME("batch_put_from", (r = kvs_client_batch_put_from(c, 2, (const char *const[]){"n1", "n2"},
                                                          bufs, NULL, res)) == KVS_OK
                               ? res[0]
                               : r);
    TIME("get_into", kvs_client_get_into(c, key, k->buf, OBJ));
    kvs_buf_t whole[2] = {{k->buf, OBJ}, {k->buf + OBJ, OBJ}};
    TIME("batch_get_into",
         (r = kvs_client_batch_get_into(c, 2, keys, whole, got)) == KVS_OK ? got[0] : r);
    const kvs_buf_t *mb[1] = {bufs};
    size_t nb[1] = {2};
    TIME("batch_get_into_multi_buffers",
         (r = kvs_client_batch_get_into_multi_buffers(c, 1, keys, mb, nb, false, got)) == KVS_OK
             ? got[0]
             : r);
    void *data = NULL;
    size_t size = 0;
    TIME("get (copy: size, then read)", kvs_client_get(c, key, &data, &size));
    kvs_free(data);
    TIME("get_size", kvs_client_get_size(c, key));
    TIME("exists", kvs_client_exists(c, key));
    TIME("batch_exists", kvs_client_batch_exists(c, 2, keys, res));
    TIME("remove", kvs_client_remove(c, "warm2", false));
#undef TIME
}

static void put_warm(kvs_client_t *c)
{
    static uint8_t src[OBJ];
    memset(src, 0x5a, sizeof(src));
    const char *keys[] = {"warm", "warm2"};
    for (int i = 0; i < 2; i++) {
        int rc = kvs_client_put(c, keys[i], src, sizeof(src), NULL);
        CHECK(rc == KVS_OK || rc == KVS_OBJECT_ALREADY_EXISTS); /* from the previous pass */
    }
}

static void calls_init(calls_t *k, kvs_client_t *c)
{
    k->c = c;
    k->buf = malloc(2 * OBJ);
    CHECK(k->buf != NULL);
    CHECK_STATUS(kvs_client_register_buffer(c, k->buf, 2 * OBJ), KVS_OK);
}

static void calls_free(calls_t *k)
{
    CHECK_STATUS(kvs_client_unregister_buffer(k->c, k->buf), KVS_OK);
    free(k->buf);
}

/* A master (with its embedded owner) stopped with SIGSTOP: its sockets still accept, nothing
 * answers. */
static void test_stopped_master(void)
{
    server_t s;
    const char *args[] = {"--segment-size", "16MiB", NULL};
    server_start(&s, args);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)s.port);
    for (int p = 0; p < 2; p++) {
        const char *protocol = p ? "shm" : "tcp";
        printf("protocol %s, master stopped:\n", protocol);
        kvs_client_t *c = open_client(master, protocol);
        put_warm(c);
        calls_t k;
        calls_init(&k, c);
        stop_peer(s.pid);
        run_all_calls(&k, true);
        CHECK_EQ_INT(kill(s.pid, SIGCONT), 0);
        calls_free(&k);
        kvs_client_close(c);
    }
    /* Opening a client against a stopped master keeps its deadline too. */
    stop_peer(s.pid);
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = master;
    cfg.rpc_timeout_ms = DEADLINE_MS;
    kvs_client_t *c = NULL;
    uint64_t t0 = kvs__now_ns();
    int rc = kvs_client_open(&cfg, &c);
    report("open", rc, ms_since(t0), DEADLINE_MS);
    CHECK_STATUS(rc, KVS_TIMED_OUT);
    CHECK_EQ_INT(kill(s.pid, SIGCONT), 0);
    server_stop(&s);
}

typedef struct {
    kvs_client_t *c;
    uint64_t ms;
    int rc;
} thread_arg_t;

static void *exists_thread(void *p)
{
    thread_arg_t *a = p;
    uint64_t t0 = kvs__now_ns();
    a->rc = kvs_client_exists(a->c, "warm");
    a->ms = ms_since(t0);
    return NULL;
}

/* Eight threads of one client call the stopped master at once: each returns at its own
 * deadline. (With one master connection they queued: the 8th returned after 8 deadlines.) */
static void test_eight_threads_against_a_stopped_master(void)
{
    server_t s;
    const char *args[] = {"--segment-size", "16MiB", NULL};
    server_start(&s, args);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)s.port);
    kvs_client_t *c = open_client(master, "tcp");
    put_warm(c);
    stop_peer(s.pid);
    pthread_t th[8];
    thread_arg_t a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (thread_arg_t){c, 0, 0};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, exists_thread, &a[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(pthread_join(th[i], NULL), 0);
        char label[32];
        snprintf(label, sizeof(label), "exists, thread %d of 8", i + 1);
        report(label, a[i].rc, a[i].ms, DEADLINE_MS);
        CHECK(a[i].rc < 0);
    }
    CHECK_EQ_INT(kill(s.pid, SIGCONT), 0);
    kvs_client_close(c);
    server_stop(&s);
}

typedef struct {
    server_t master, owner;
    char addr[64];
} split_t;

/* A master and a separate owner process. */
static void split_start(split_t *sp)
{
    const char *margs[] = {"--master-only", NULL};
    server_start(&sp->master, margs);
    snprintf(sp->addr, sizeof(sp->addr), "127.0.0.1:%u", (unsigned)sp->master.port);
    const char *oargs[] = {"--owner-only", "--master", sp->addr, "--segment-size", "16MiB", NULL};
    server_start(&sp->owner, oargs);
}

static void split_stop(split_t *sp)
{
    server_stop(&sp->owner);
    server_stop(&sp->master);
}

/* The owner stopped, the master answering: transfers (and, for a client new to the owner, its
 * connect and handshake) keep the call's deadline. */
static void test_stopped_owner(void)
{
    split_t sp;
    split_start(&sp);
    for (int p = 0; p < 2; p++) {
        const char *protocol = p ? "shm" : "tcp";
        kvs_client_t *c = open_client(sp.addr, protocol);
        put_warm(c);
        kvs_client_t *fresh = open_client(sp.addr, protocol); /* no connection to the owner yet */
        calls_t k, kf;
        calls_init(&k, c);
        calls_init(&kf, fresh);
        stop_peer(sp.owner.pid);
        printf("protocol %s, owner stopped, connected client:\n", protocol);
        run_all_calls(&k, false);
        if (p == 0) {
            /* Over tcp the owner must answer: its reads can only time out. */
            uint64_t t0 = kvs__now_ns();
            int64_t rc = kvs_client_get_into(c, "warm", k.buf, OBJ);
            report("get_into (tcp, stopped owner)", rc, ms_since(t0), DEADLINE_MS);
            CHECK_STATUS((int)rc, KVS_TIMED_OUT);
        }
        printf("protocol %s, owner stopped, new client:\n", protocol);
        kvs_test_stderr_begin();
        run_all_calls(&kf, false);
        char *logged = kvs_test_stderr_end();
        /* Its handshakes were cut by the calls' own deadlines: the owner closed nothing, and the
         * log must not send an operator after TLS settings (it did: the cut read as a close). */
        CHECK(strstr(logged, "closed the connection during HELLO") == NULL);
        free(logged);
        CHECK_EQ_INT(kill(sp.owner.pid, SIGCONT), 0);
        calls_free(&k);
        calls_free(&kf);
        kvs_client_close(fresh);
        kvs_client_close(c);
    }
    split_stop(&sp);
}

/* The same over TLS: a fresh client's TLS handshake with the stopped owner is cut by the call's
 * deadline. It is a time-out, and the log must not say the owner lacks TLS (it did). */
static void test_stopped_owner_tls(void)
{
    char token[64];
    snprintf(token, sizeof(token), "/tmp/kvs-deadlines-token-%d", (int)getpid());
    int fd = open(token, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0);
    const char *secret = "deadlines test token, long enough 0123456789";
    CHECK_EQ_INT((int)write(fd, secret, strlen(secret)), (int)strlen(secret));
    close(fd);
    server_t m, o;
    const char *margs[] = {"--master-only", "--tls", "--auth-token-file", token, NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    const char *oargs[] = {"--owner-only",      "--master", master,
                           "--segment-size",    "8MiB",     "--tls",
                           "--auth-token-file", token,      NULL};
    server_start(&o, oargs);
    kvs_client_t *cl[2];
    for (int i = 0; i < 2; i++) {
        kvs_client_config_t cfg;
        CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
        cfg.master = master;
        cfg.protocol = "tcp";
        cfg.tls = true;
        cfg.auth_token_file = token;
        cfg.rpc_timeout_ms = cfg.transfer_timeout_ms = DEADLINE_MS;
        CHECK_STATUS(kvs_client_open(&cfg, &cl[i]), KVS_OK);
    }
    static uint8_t src[OBJ];
    CHECK_STATUS(kvs_client_put(cl[0], "warm", src, OBJ, NULL), KVS_OK);
    calls_t k;
    calls_init(&k, cl[1]); /* no connection to the owner yet */
    stop_peer(o.pid);
    kvs_test_stderr_begin();
    uint64_t t0 = kvs__now_ns();
    int64_t rc = kvs_client_get_into(cl[1], "warm", k.buf, OBJ);
    uint64_t ms = ms_since(t0);
    char *logged = kvs_test_stderr_end();
    report("get_into (TLS, stopped owner, new client)", rc, ms, DEADLINE_MS);
    CHECK_STATUS((int)rc, KVS_TIMED_OUT);
    CHECK(strstr(logged, "does not speak TLS") == NULL);
    free(logged);
    CHECK_EQ_INT(kill(o.pid, SIGCONT), 0);
    calls_free(&k);
    for (int i = 0; i < 2; i++)
        kvs_client_close(cl[i]);
    server_stop(&o);
    server_stop(&m);
    unlink(token);
}

/* The owner stopped and its listen backlog filled: a new client's connect gets no answer at all
 * (the kernel drops its SYNs). The connect used to run to the tcp I/O time-out (5 s and more). */
static void test_full_listen_backlog(void)
{
    split_t sp;
    split_start(&sp);
    kvs_client_t *c = open_client(sp.addr, "tcp");
    put_warm(c);
    stop_peer(sp.owner.pid);
    /* Fill the accept queue until a connect stays unanswered. */
    int fds[4096];
    int nfd = 0;
    struct addrinfo *ai = NULL;
    CHECK_STATUS(kvs__resolve("127.0.0.1", sp.owner.port, false, UINT64_MAX, &ai), KVS_OK);
    bool full = false;
    while (!full && nfd < (int)KVS_ARRAY_SIZE(fds)) {
        int fd;
        CHECK_STATUS(kvs__connect_start(ai, &fd), KVS_OK);
        fds[nfd++] = fd;
        full = kvs__connect_finish(fd, kvs__now_ns() + 200 * KVS_NS_PER_MS) == KVS_TIMED_OUT;
    }
    freeaddrinfo(ai);
    CHECK(full);
    printf("listen backlog full after %d connections\n", nfd);
    kvs_client_t *fresh = open_client(sp.addr, "tcp");
    calls_t k;
    calls_init(&k, fresh);
    uint64_t t0 = kvs__now_ns();
    int64_t rc = kvs_client_get_into(fresh, "warm", k.buf, OBJ);
    report("get_into (connect unanswered)", rc, ms_since(t0), DEADLINE_MS);
    CHECK(rc < 0);
    static uint8_t src[OBJ];
    t0 = kvs__now_ns();
    rc = kvs_client_put(fresh, "new", src, sizeof(src), NULL);
    report("put (connect unanswered)", rc, ms_since(t0), DEADLINE_MS);
    CHECK(rc < 0);
    calls_free(&k);
    kvs_client_close(fresh);
    for (int i = 0; i < nfd; i++)
        close(fds[i]);
    CHECK_EQ_INT(kill(sp.owner.pid, SIGCONT), 0);
    kvs_client_close(c);
    split_stop(&sp);
}

typedef struct {
    kvs_client_t *c;
    const char *key;
    uint8_t *buf;
    uint64_t ms;
    int64_t rc;
} read_arg_t;

static void *read_thread(void *p)
{
    read_arg_t *a = p;
    uint64_t t0 = kvs__now_ns();
    a->rc = kvs_client_get_into(a->c, a->key, a->buf, OBJ);
    a->ms = ms_since(t0);
    return NULL;
}

/* One client, two same-host owners, one of them stopped: a thread whose read waits for the
 * stopped owner's shm handshake must not hold up another thread reading from the live owner.
 * (The handshake ran under the shm transport's single lock: the second thread waited for it.) */
static void test_stopped_owner_stalls_only_its_own_readers(void)
{
    server_t m, o[2];
    const char *margs[] = {"--master-only", NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "live" : "stopped";
        const char *oargs[] = {"--owner-only", "--master",       master, "--segment-size",
                               "8MiB",         "--segment-name", name,   NULL};
        server_start(&o[i], oargs);
    }
    kvs_client_t *w = open_client(master, "tcp");
    static uint8_t src[OBJ];
    kvs_replicate_config_t rc;
    kvs_replicate_config_init(&rc);
    rc.preferred_segment = "stopped";
    CHECK_STATUS(kvs_client_put(w, "on-stopped", src, OBJ, &rc), KVS_OK);
    rc.preferred_segment = "live";
    CHECK_STATUS(kvs_client_put(w, "on-live", src, OBJ, &rc), KVS_OK);
    kvs_client_t *c = client_open_timeouts(master, "shm", DEADLINE_MS, 2000);
    calls_t k;
    calls_init(&k, c);
    stop_peer(o[0].pid);
    read_arg_t a[2] = {{c, "on-stopped", k.buf, 0, 0}, {c, "on-live", k.buf + OBJ, 0, 0}};
    pthread_t th[2];
    CHECK_EQ_INT(pthread_create(&th[0], NULL, read_thread, &a[0]), 0);
    usleep(100000); /* the first is inside its handshake */
    CHECK_EQ_INT(pthread_create(&th[1], NULL, read_thread, &a[1]), 0);
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pthread_join(th[i], NULL), 0);
    report("get_into from the stopped owner", a[0].rc, a[0].ms, 2000);
    report("get_into from the live owner, meanwhile", a[1].rc, a[1].ms, 2000);
    CHECK(a[0].rc < 0);
    CHECK_EQ_INT(a[1].rc, OBJ);
    CHECK_CMP_U64(a[1].ms, <, 500); /* not behind the other thread's handshake */
    CHECK_EQ_INT(kill(o[0].pid, SIGCONT), 0);
    calls_free(&k);
    kvs_client_close(c);
    kvs_client_close(w);
    server_stop(&o[0]);
    server_stop(&o[1]);
    server_stop(&m);
}

/* A stand-in resolver: names ending in ".slow" take 5 s to fail; others resolve as usual. */
static int slow_resolver(const char *host, const char *port, const struct addrinfo *hints,
                         struct addrinfo **res)
{
    size_t n = strlen(host);
    if (n > 5 && strcmp(host + n - 5, ".slow") == 0) {
        usleep(5000 * 1000);
        return EAI_AGAIN;
    }
    return getaddrinfo(host, port, hints, res);
}

/* A master, and an owner's advertised endpoint, whose host names take 5 s to resolve. */
static void test_slow_resolver(void)
{
    kvs__resolver_hook = slow_resolver;
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = "master.slow:50051";
    cfg.rpc_timeout_ms = DEADLINE_MS;
    kvs_client_t *c = NULL;
    uint64_t t0 = kvs__now_ns();
    int rc = kvs_client_open(&cfg, &c);
    report("open (master name resolving for 5 s)", rc, ms_since(t0), DEADLINE_MS);
    CHECK(rc < 0);

    /* A segment whose owner advertises a slow name: mounted over RPC by the test itself. */
    server_t m;
    const char *margs[] = {"--master-only", NULL};
    server_start(&m, margs);
    kvs__rpc_config_t rcfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 3000};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&rcfg, &rpc), KVS_OK);
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(rpc, &req, KVS_MSG_MOUNT);
    kvs__mount_req_t mr = {kvs__str_c("slow-seg"),
                           kvs__str_c("elsewhere"),
                           kvs__str_c("owner.slow:7000"),
                           1 << 20,
                           {NULL, 0},
                           0};
    kvs__mount_req_encode(&req, &mr);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__mount_rsp_t mrsp;
    CHECK_STATUS(kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &mrsp), KVS_OK);
    CHECK_STATUS(mrsp.status, KVS_OK);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    c = open_client(master, "tcp");
    static uint8_t src[4096];
    t0 = kvs__now_ns();
    rc = kvs_client_put(c, "k", src, sizeof(src), NULL);
    report("put (owner name resolving for 5 s)", rc, ms_since(t0), DEADLINE_MS);
    CHECK_STATUS(rc, KVS_TIMED_OUT); /* it waited for the name, and said so */
    kvs_client_close(c);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    kvs__rpc_close(rpc);
    server_stop(&m);
    kvs__resolver_hook = NULL;
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_stopped_master),
        KVS_TEST_CASE(test_eight_threads_against_a_stopped_master),
        KVS_TEST_CASE(test_stopped_owner),
        KVS_TEST_CASE(test_stopped_owner_tls),
        KVS_TEST_CASE(test_full_listen_backlog),
        KVS_TEST_CASE(test_slow_resolver),
        KVS_TEST_CASE(test_stopped_owner_stalls_only_its_own_readers),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
