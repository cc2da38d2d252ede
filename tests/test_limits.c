/* Hostile peers cost bounded resources: real kvstash-server processes (master and owner) are fed
 * huge frames before the handshake, silent and idle connections, more connections than allowed,
 * descriptor exhaustion, and short-lived connections by the hundred, and their memory, CPU time,
 * threads, descriptors and same-host sockets are read from /proc and the shm directory. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "client_fixture.h"
#include "proc_helpers.h"
#include "server_fixture.h"
#include "proto/net_int.h"

#include <kvstash/kvstash.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- processes, as /proc shows them -------------------------------------------------------- */

/* CPU time the process has used (user + system), in clock ticks. */
static uint64_t proc_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Fields after the command name (which may hold spaces) start past its ')': state is the
     * 3rd field, utime the 14th and stime the 15th. */
    char *p = strrchr(buf, ')');
    CHECK(p != NULL);
    unsigned long long ut = 0, st = 0;
    CHECK_EQ_INT(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st),
                 2);
    return ut + st;
}

/* Lowers the process's descriptor limit to `n` (it may hold more already: opens then fail). */
static void set_fd_limit(pid_t pid, unsigned n)
{
    struct rlimit old, lim;
    CHECK_EQ_INT(prlimit(pid, RLIMIT_NOFILE, NULL, &old), 0);
    lim = (struct rlimit){.rlim_cur = n, .rlim_max = old.rlim_max};
    CHECK_EQ_INT(prlimit(pid, RLIMIT_NOFILE, &lim, NULL), 0);
}

/* ---- raw connections ------------------------------------------------------------------------- */

static int dial(uint16_t port)
{
    int fd = kvs__tcp_connect("127.0.0.1", port, kvs__now_ns() + 3 * KVS_NS_PER_S);
    CHECK(fd >= 0);
    return fd;
}

static void send_frame(int fd, uint16_t type, uint32_t len, const void *payload, size_t n)
{
    kvs__frame_hdr_t h = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, type, 1, len};
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_encode(&h, hb);
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    CHECK_STATUS(kvs__send_all(fd, hb, sizeof(hb), dl), KVS_OK);
    if (n > 0)
        CHECK_STATUS(kvs__send_all(fd, payload, n, dl), KVS_OK);
}

/* Reads one frame within `ms`: its type and the status its payload starts with; an ERROR's
 * message goes to msg (may be NULL). */
static uint16_t read_frame(int fd, uint64_t ms, int32_t *status_p, char *msg, size_t cap)
{
    uint8_t hb[KVS_FRAME_HDR_LEN];
    uint64_t dl = kvs__now_ns() + ms * KVS_NS_PER_MS;
    CHECK_STATUS(kvs__recv_all(fd, hb, sizeof(hb), dl), KVS_OK);
    kvs__frame_hdr_t h;
    CHECK_STATUS(kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &h), KVS_OK);
    uint8_t *p = malloc(h.len + 1);
    CHECK_STATUS(kvs__recv_all(fd, p, h.len, dl), KVS_OK);
    CHECK(h.len >= 4);
    kvs__rbuf_t r;
    kvs__rbuf_init(&r, p, h.len);
    *status_p = kvs__rbuf_i32(&r);
    if (msg != NULL) {
        msg[0] = '\0';
        kvs__error_rsp_t e;
        if (h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG) &&
            kvs__error_rsp_decode(p, h.len, h.version, NULL, &e) == KVS_OK)
            snprintf(msg, cap, "%.*s", (int)e.message.len, e.message.ptr);
    }
    free(p);
    return h.type;
}

/* Expects an ERROR frame within `ms` with this status and a message containing `want`. */
static void expect_error(int fd, uint64_t ms, int status, const char *want)
{
    int32_t st;
    char msg[256];
    CHECK_EQ_INT(read_frame(fd, ms, &st, msg, sizeof(msg)), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, status);
    if (strstr(msg, want) == NULL)
        kvs_test_fail(__FILE__, __LINE__, "error message \"%s\" lacks \"%s\"", msg, want);
}

/* Whether the peer closes the connection within `ms` (what it sends first is dropped). */
static bool closed_within(int fd, uint64_t ms)
{
    uint64_t dl = kvs__now_ns() + ms * KVS_NS_PER_MS;
    for (;;) {
        char b[4096];
        uint64_t now = kvs__now_ns();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, now >= dl ? 0 : (int)((dl - now) / KVS_NS_PER_MS + 1));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return true;
    }
}

/* A master HELLO (the data port answers the same request). Returns the reply's type. */
static uint16_t hello(int fd)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__hello_req_t h = {KVS_PROTO_VERSION_MIN,
                          KVS_PROTO_VERSION_MAX,
                          kvs__str_c("raw"),
                          0,
                          {NULL, 0},
                          {NULL, 0},
                          0};
    kvs__hello_req_encode(&w, &h);
    send_frame(fd, KVS_MSG_HELLO, (uint32_t)w.len, w.data, w.len);
    kvs__wbuf_free(&w);
    int32_t st;
    uint16_t type = read_frame(fd, 3000, &st, NULL, 0);
    if (type == (KVS_MSG_HELLO | KVS_RSP_FLAG))
        CHECK_STATUS(st, KVS_OK);
    return type;
}

static void say_hello(int fd)
{
    CHECK_EQ_INT(hello(fd), KVS_MSG_HELLO | KVS_RSP_FLAG);
}

/* A STAT on a connection past its handshake works. */
static void stat_works(int fd)
{
    send_frame(fd, KVS_MSG_STAT, 0, NULL, 0);
    int32_t st;
    CHECK_EQ_INT(read_frame(fd, 3000, &st, NULL, 0), KVS_MSG_STAT | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_OK);
}

/* Waits until a new connection to `port` gets through its HELLO (the server noticed others
 * closing), within 5 s. */
/* A HELLO whose answer may never come: a server still at its limit sheds the connection (an
 * ERROR, or just a close), which is a reason to try again, not a failure. */
static bool hello_served(int fd)
{
    kvs__wbuf_t w;
    kvs__wbuf_init(&w);
    kvs__hello_req_t h = {.version_min = KVS_PROTO_VERSION_MIN,
                          .version_max = KVS_PROTO_VERSION_MAX,
                          .node = kvs__str_c("raw")};
    kvs__hello_req_encode(&w, &h);
    kvs__frame_hdr_t fh = {KVS_PROTO_MAGIC, KVS_PROTO_VERSION_MAX, KVS_MSG_HELLO, 1,
                           (uint32_t)w.len};
    uint8_t hb[KVS_FRAME_HDR_LEN];
    kvs__frame_hdr_encode(&fh, hb);
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    bool ok = kvs__send_all(fd, hb, sizeof(hb), dl) == KVS_OK &&
              kvs__send_all(fd, w.data, w.len, dl) == KVS_OK &&
              kvs__recv_all(fd, hb, sizeof(hb), dl) == KVS_OK &&
              kvs__frame_hdr_decode(hb, sizeof(hb), KVS_FRAME_MAX_PAYLOAD, &fh) == KVS_OK &&
              fh.type == (KVS_MSG_HELLO | KVS_RSP_FLAG);
    kvs__wbuf_free(&w);
    return ok;
}

static void serves_again(uint16_t port)
{
    uint64_t dl = kvs__now_ns() + 5 * KVS_NS_PER_S;
    for (;;) {
        int fd = dial(port);
        bool served = hello_served(fd);
        close(fd);
        if (served)
            return;
        CHECK(kvs__now_ns() < dl);
        usleep(20000);
    }
}

/* ---- servers ----------------------------------------------------------------------------------
 */

static void master_start(server_t *s, const char *const *extra)
{
    const char *args[24] = {"--master-only"};
    int n = 1;
    for (int i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    server_start(s, args);
}

/* A master and an owner in separate processes (the owner's port file names its data port). */
typedef struct {
    server_t master, owner;
    char addr[32];
} store_t;

static void store_start(store_t *st, const char *const *owner_extra)
{
    master_start(&st->master, NULL);
    snprintf(st->addr, sizeof(st->addr), "127.0.0.1:%u", (unsigned)st->master.port);
    const char *args[24] = {"--owner-only", "--master", st->addr, "--segment-size", "16MiB"};
    int n = 5;
    for (int i = 0; owner_extra && owner_extra[i] && n < 23; i++)
        args[n++] = owner_extra[i];
    args[n] = NULL;
    server_start(&st->owner, args);
}

static void store_stop(store_t *st)
{
    server_stop(&st->owner);
    server_stop(&st->master);
}

/* ---- master ------------------------------------------------------------------------------------
 */

/* Before HELLO the master reads at most KVS_HANDSHAKE_MAX_PAYLOAD bytes of a frame: a header
 * announcing more is refused at once, and peers streaming such frames do not grow the master.
 * (It allocated whatever a header announced up to 64 MiB: 32 such connections took 2 GiB.) */
static void test_master_huge_frame_before_hello(void)
{
    server_t m;
    master_start(&m, NULL);
    uint64_t rss0 = proc_status_kb(m.pid, "VmRSS");
    const uint32_t big = 32u << 20;

    /* Eight peers each send a 32 MiB frame's header and try to send its payload. */
    uint8_t *junk = calloc(1, big);
    CHECK(junk != NULL);
    int fds[8];
    for (int i = 0; i < 8; i++) {
        fds[i] = dial(m.port);
        send_frame(fds[i], KVS_MSG_LOOKUP, big, NULL, 0);
        kvs__send_all(fds[i], junk, big, kvs__now_ns() + 500 * KVS_NS_PER_MS); /* may fail */
    }
    uint64_t rss1 = proc_status_kb(m.pid, "VmRSS");
    printf("master VmRSS %llu kB before, %llu kB with 8 peers streaming 32 MiB frames\n",
           (unsigned long long)rss0, (unsigned long long)rss1);
    fflush(stdout);
    CHECK_CMP_U64(rss1, <, rss0 + 16 * 1024);
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    free(junk);

    /* Each is told why. */
    int fd = dial(m.port);
    send_frame(fd, KVS_MSG_LOOKUP, big, NULL, 0);
    expect_error(fd, 3000, KVS_PROTOCOL_ERROR, "before the handshake");
    CHECK(closed_within(fd, 3000));
    close(fd);

    /* After HELLO the frame cap is the usual one: a 1 MiB malformed request is read whole,
     * answered, and the connection stays. */
    fd = dial(m.port);
    say_hello(fd);
    uint32_t len = 1u << 20;
    uint8_t *p = calloc(1, len);
    memset(p, 0xff, 16);
    send_frame(fd, KVS_MSG_LOOKUP, len, p, len);
    free(p);
    int32_t st;
    CHECK_EQ_INT(read_frame(fd, 3000, &st, NULL, 0), KVS_MSG_ERROR | KVS_RSP_FLAG);
    CHECK_STATUS(st, KVS_INVALID_PARAMS);
    stat_works(fd);
    close(fd);
    server_stop(&m);
}

/* A connection that does not say HELLO within the handshake time-out is told so and closed;
 * one that did is not. */
static void test_master_handshake_timeout(void)
{
    server_t m;
    const char *args[] = {"--handshake-timeout-ms", "300", "--idle-timeout-ms", "0", NULL};
    master_start(&m, args);
    int ok = dial(m.port);
    say_hello(ok);
    int fd = dial(m.port);
    uint64_t t0 = kvs__now_ns();
    CHECK(!closed_within(fd, 150)); /* not before its time */
    expect_error(fd, 3000, KVS_TIMED_OUT, "no handshake within 300 ms");
    CHECK(closed_within(fd, 3000));
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    printf("silent connection closed after %llu ms (time-out 300 ms)\n", (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 250);
    CHECK_CMP_U64(ms, <, 2000);
    close(fd);
    stat_works(ok); /* past its handshake: untouched */
    close(ok);
    server_stop(&m);
}

/* A connection with no request for the idle time-out is closed; a client's next call opens a
 * new one and succeeds. */
static void test_master_idle_timeout(void)
{
    server_t m;
    const char *args[] = {"--idle-timeout-ms", "500", NULL};
    master_start(&m, args);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)m.port);
    kvs_client_t *c = client_open_protocol(addr, "tcp");
    CHECK_EQ_INT(kvs_client_exists(c, "nothing"), 0);
    int fd = dial(m.port);
    say_hello(fd);
    unsigned fds0 = proc_count(m.pid, "fd");
    /* Requests keep a connection: three over 750 ms, each before the time-out. */
    for (int i = 0; i < 3; i++) {
        usleep(250000);
        stat_works(fd);
    }
    uint64_t t0 = kvs__now_ns();
    CHECK(closed_within(fd, 3000));
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    printf("idle connection closed %llu ms after its last request (time-out 500 ms)\n",
           (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 400);
    close(fd);
    /* The client's connection went too (its request came earlier). */
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    while (proc_count(m.pid, "fd") > fds0 - 2) {
        CHECK(kvs__now_ns() < dl);
        usleep(10000);
    }
    CHECK_EQ_INT(kvs_client_exists(c, "nothing"), 0);
    kvs_client_close(c);
    server_stop(&m);
}

/* Fills the accept queue of `lfd` (a backlog of 0) so that a further connect hangs. */
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

static int mount(kvs__rpc_t *rpc, const char *name, const char *endpoint)
{
    kvs__wbuf_t req, rsp;
    kvs__wbuf_init(&req);
    kvs__wbuf_init(&rsp);
    kvs__rpc_begin(rpc, &req, KVS_MSG_MOUNT);
    kvs__mount_req_t m = {kvs__str_c(name), kvs__str_c("n"), kvs__str_c(endpoint),
                          1u << 20,         {NULL, 0},       0};
    kvs__mount_req_encode(&req, &m);
    CHECK_STATUS(kvs__frame_end(&req), KVS_OK);
    CHECK_STATUS(kvs__rpc_call(rpc, &req, &rsp), KVS_OK);
    kvs__mount_rsp_t mr;
    CHECK_STATUS(kvs__mount_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &mr), KVS_OK);
    kvs__wbuf_free(&req);
    kvs__wbuf_free(&rsp);
    return mr.status;
}

/* A connection parked while its MOUNT waits for a probe (longer than the idle time-out) is
 * not closed meanwhile: its MOUNT is answered when the probe ends. */
static void test_master_idle_spares_parked(void)
{
    server_t m;
    const char *args[] = {"--idle-timeout-ms", "300", "--probe-timeout-ms", "1200", NULL};
    master_start(&m, args);
    int lfd = kvs__tcp_listen("127.0.0.1", 0, 0);
    CHECK(lfd >= 0);
    char endpoint[32];
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%u", (unsigned)kvs__sock_port(lfd));
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 5000};
    kvs__rpc_t *holder = NULL, *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &holder), KVS_OK);
    CHECK_STATUS(mount(holder, "ghost", endpoint), KVS_OK);
    kvs__rpc_close(holder); /* the holder's connection is gone: a new MOUNT probes */
    int fill[3];
    fill_backlog(lfd, fill); /* the probe's connect hangs until its time-out */
    usleep(50000);
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_OK);
    uint64_t t0 = kvs__now_ns();
    CHECK_STATUS(mount(rpc, "ghost", "127.0.0.1:9"), KVS_SEGMENT_ALREADY_EXISTS);
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    printf("parked MOUNT answered after %llu ms (probe 1200 ms, idle 300 ms)\n",
           (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 1000);
    kvs__rpc_close(rpc);
    for (int i = 0; i < 3; i++)
        close(fill[i]);
    close(lfd);
    server_stop(&m);
}

/* Beyond max_conns a connection gets an ERROR that says so, and is closed; once one closes, a
 * new one is served. A client is told why. */
static void test_master_max_conns(void)
{
    server_t m;
    const char *args[] = {"--max-conns", "3", NULL};
    master_start(&m, args);
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = dial(m.port);
        say_hello(fds[i]);
    }
    int fd = dial(m.port);
    expect_error(fd, 3000, KVS_NO_RESOURCE, "too many connections (3 open, limit 3)");
    CHECK(closed_within(fd, 3000));
    close(fd);
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 3000};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_NO_RESOURCE);
    stat_works(fds[0]);
    close(fds[0]);
    serves_again(m.port);
    for (int i = 1; i < 3; i++)
        close(fds[i]);
    server_stop(&m);
}

/* Opens `n` connections to `port`; the server may not accept them. */
static void dial_many(uint16_t port, int *fds, int n)
{
    for (int i = 0; i < n; i++)
        fds[i] = dial(port);
}

/* How many of the connections the server closed within `ms` (it may serve `kept`). */
static int count_closed(int *fds, int n, int kept, uint64_t ms)
{
    bool seen[64] = {false};
    int closed = 0;
    uint64_t dl = kvs__now_ns() + ms * KVS_NS_PER_MS;
    while (closed < n - kept && kvs__now_ns() < dl) {
        for (int i = 0; i < n; i++) {
            if (!seen[i] && closed_within(fds[i], 0)) {
                seen[i] = true;
                closed++;
            }
        }
        usleep(10000);
    }
    return closed;
}

/* Out of descriptors, the server must neither spin (a fifth of a CPU at most over a second)
 * nor leave connections hanging: each pending one is accepted into the spare descriptor's slot
 * and closed at once. Once descriptors are free it serves again. */
static void exhaust_descriptors(server_t *s, uint16_t port, const char *what)
{
    unsigned have = proc_count(s->pid, "fd");
    set_fd_limit(s->pid, have + 4);
    int fds[24];
    dial_many(port, fds, 24);
    usleep(200000);
    uint64_t c0 = proc_cpu_ticks(s->pid), t0 = kvs__now_ns();
    usleep(1000000);
    uint64_t ticks = proc_cpu_ticks(s->pid) - c0, wall = kvs__now_ns() - t0;
    int closed = count_closed(fds, 24, 8, 2000);
    printf("%s out of descriptors: %llu ticks of CPU in %llu ms (%ld ticks/s); %d of 24 new "
           "connections closed at once\n",
           what, (unsigned long long)ticks, (unsigned long long)(wall / KVS_NS_PER_MS),
           sysconf(_SC_CLK_TCK), closed);
    fflush(stdout);
    CHECK_CMP_U64(ticks, <, (uint64_t)sysconf(_SC_CLK_TCK) / 5);
    CHECK_CMP_U64(closed, >=, 12);
    for (int i = 0; i < 24; i++)
        close(fds[i]);
    serves_again(port);
    server_check_alive(s);
}

/* EMFILE at the master: today's level-triggered epoll spun at 82% of a CPU on the pending
 * connection; now a spare descriptor sheds it. */
static void test_master_out_of_descriptors(void)
{
    server_t m;
    master_start(&m, NULL);
    exhaust_descriptors(&m, m.port, "master");
    server_stop(&m);
}

/* ---- owner data server --------------------------------------------------------------------- */

/* EMFILE at the owner: pending connections hung in the backlog (the accept thread slept and
 * retried); now they are shed. */
static void test_data_out_of_descriptors(void)
{
    store_t st;
    store_start(&st, NULL);
    exhaust_descriptors(&st.owner, st.owner.port, "owner");
    store_stop(&st);
}

/* A finished connection's thread and descriptor go at once, not at the next accept. (Threads
 * and descriptors piled up: 9 to 107 after 100 clients.) */
static void test_data_connections_reclaimed(void)
{
    store_t st;
    store_start(&st, NULL);
    pid_t pid = st.owner.pid;
    usleep(100000); /* start-up threads settle */
    unsigned tasks0 = proc_count(pid, "task"), fds0 = proc_count(pid, "fd");
    int fds[100];
    for (int i = 0; i < 100; i++) {
        fds[i] = dial(st.owner.port);
        say_hello(fds[i]);
    }
    unsigned tasks1 = proc_count(pid, "task"), fds1 = proc_count(pid, "fd");
    CHECK_CMP_U64(tasks1, >=, tasks0 + 100); /* a thread each while open */
    CHECK_CMP_U64(fds1, >=, fds0 + 100);
    for (int i = 0; i < 100; i++)
        close(fds[i]);
    uint64_t t0 = kvs__now_ns(), dl = t0 + 5 * KVS_NS_PER_S;
    unsigned tasks, nfds;
    while ((tasks = proc_count(pid, "task")) > tasks0 || (nfds = proc_count(pid, "fd")) > fds0) {
        if (kvs__now_ns() >= dl)
            kvs_test_fail(__FILE__, __LINE__, "threads %u -> %u -> %u, fds %u -> %u -> %u", tasks0,
                          tasks1, tasks, fds0, fds1, proc_count(pid, "fd"));
        usleep(5000);
    }
    printf("owner threads %u -> %u -> %u, fds %u -> %u -> %u within %llu ms\n", tasks0, tasks1,
           tasks, fds0, fds1, nfds, (unsigned long long)((kvs__now_ns() - t0) / KVS_NS_PER_MS));
    store_stop(&st);
}

/* A data connection must say HELLO, in a small frame, within the handshake time-out. */
static void test_data_handshake_timeout(void)
{
    store_t st;
    const char *args[] = {"--data-handshake-timeout-ms", "300", NULL};
    store_start(&st, args);
    int ok = dial(st.owner.port);
    say_hello(ok);
    int fd = dial(st.owner.port);
    uint64_t t0 = kvs__now_ns();
    CHECK(!closed_within(fd, 150));
    expect_error(fd, 3000, KVS_TIMED_OUT, "no handshake within 300 ms");
    CHECK(closed_within(fd, 3000));
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    printf("silent data connection closed after %llu ms (time-out 300 ms)\n",
           (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 250);
    CHECK_CMP_U64(ms, <, 2000);
    close(fd);
    /* Before HELLO a frame is at most KVS_HANDSHAKE_MAX_PAYLOAD bytes, as at the master. */
    fd = dial(st.owner.port);
    send_frame(fd, KVS_MSG_HELLO, 1u << 20, NULL, 0);
    expect_error(fd, 3000, KVS_PROTOCOL_ERROR, "before the handshake (at most 4096");
    CHECK(closed_within(fd, 3000));
    close(fd);
    /* Slow bytes do not stretch the handshake: half a header, then nothing. */
    fd = dial(st.owner.port);
    send(fd, "KVST", 4, MSG_NOSIGNAL);
    CHECK(closed_within(fd, 2000));
    close(fd);
    CHECK(!closed_within(ok, 100)); /* past its handshake: untouched */
    close(ok);
    store_stop(&st);
}

/* An idle data connection is closed; the client's tcp transport replaces it before its next
 * transfer, which succeeds. */
static void test_data_idle_timeout(void)
{
    store_t st;
    const char *args[] = {"--data-idle-timeout-ms", "500", NULL};
    store_start(&st, args);
    kvs_client_t *c = client_open_protocol(st.addr, "tcp");
    const size_t size = 300000;
    uint8_t *data = malloc(size), *buf = malloc(size);
    for (size_t i = 0; i < size; i++)
        data[i] = (uint8_t)(i * 7);
    CHECK_STATUS(kvs_client_put(c, "k", data, size, NULL), KVS_OK);
    CHECK_STATUS(kvs_client_register_buffer(c, buf, size), KVS_OK);
    CHECK_EQ_INT(kvs_client_get_into(c, "k", buf, size), size);
    unsigned fds0 = proc_count(st.owner.pid, "fd");
    int fd = dial(st.owner.port);
    say_hello(fd);
    uint64_t t0 = kvs__now_ns();
    CHECK(closed_within(fd, 3000));
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    printf("idle data connection closed after %llu ms (time-out 500 ms)\n", (unsigned long long)ms);
    CHECK_CMP_U64(ms, >=, 400);
    close(fd);
    /* The client's connections went too. */
    uint64_t dl = kvs__now_ns() + 3 * KVS_NS_PER_S;
    while (proc_count(st.owner.pid, "fd") >= fds0) {
        CHECK(kvs__now_ns() < dl);
        usleep(10000);
    }
    memset(buf, 0, size);
    CHECK_EQ_INT(kvs_client_get_into(c, "k", buf, size), size);
    CHECK(memcmp(buf, data, size) == 0);
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(c, &s), KVS_OK);
    CHECK_EQ_U64(s.tcp_transfers, 3); /* the put, and both reads over tcp */
    kvs_client_close(c);
    free(data);
    free(buf);
    store_stop(&st);
}

static void test_data_max_conns(void)
{
    store_t st;
    const char *args[] = {"--data-max-conns", "3", NULL};
    store_start(&st, args);
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = dial(st.owner.port);
        say_hello(fds[i]);
    }
    int fd = dial(st.owner.port);
    expect_error(fd, 3000, KVS_NO_RESOURCE, "too many connections (3 open, limit 3)");
    CHECK(closed_within(fd, 3000));
    close(fd);
    close(fds[0]);
    serves_again(st.owner.port);
    for (int i = 1; i < 3; i++)
        close(fds[i]);
    store_stop(&st);
}

/* ---- same-host sockets --------------------------------------------------------------------- */

/* A private shm directory for one case, set as KVS_SHM_DIR for the servers it starts. */
static void shm_dir_make(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/kvs-limits-%d-XXXXXX", (int)getpid());
    CHECK(mkdtemp(dir) != NULL);
    CHECK_EQ_INT(chmod(dir, 0700), 0);
    setenv("KVS_SHM_DIR", dir, 1);
}

static void shm_dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.')
            unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d != NULL)
        closedir(d);
    rmdir(dir);
    unsetenv("KVS_SHM_DIR");
}

static bool exists(const char *dir, const char *name)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

/* A unix socket at dir/name: listening (the fd returned), or left behind (closed: -1). */
static int unix_socket_at(const char *dir, const char *name, bool listening)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, name);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ_INT(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    if (listening) {
        CHECK_EQ_INT(listen(fd, 4), 0);
        return fd;
    }
    close(fd);
    return -1;
}

static int unix_dial(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    CHECK(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ_INT(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Peers that connect to the owner's same-host socket and say nothing delay no one: a real shm
 * read meanwhile is answered at once, and the silent ones are closed at their handshake
 * time-out (shorter than the 1 s each receive of the handshake may wait). (Handshakes were
 * served one at a time with a 1 s time-out each.) */
static void test_shm_handshakes_concurrent(void)
{
    char dir[64];
    shm_dir_make(dir, sizeof(dir));
    store_t st;
    const char *args[] = {"--data-handshake-timeout-ms", "500", NULL};
    store_start(&st, args);
    char sock[128];
    snprintf(sock, sizeof(sock), "%s/data-%u.sock", dir, (unsigned)st.owner.port);
    kvs_client_t *w = client_open_protocol(st.addr, "tcp");
    CHECK_STATUS(kvs_client_put(w, "k", "0123456789", 10, NULL), KVS_OK);
    kvs_client_close(w);
    int silent[4];
    for (int i = 0; i < 4; i++)
        silent[i] = unix_dial(sock);
    uint64_t t_silent = kvs__now_ns();
    usleep(50000);
    kvs_client_t *r = client_open_timeouts(st.addr, "shm", 3000, 3000);
    uint64_t t0 = kvs__now_ns();
    void *data = NULL;
    size_t n = 0;
    CHECK_STATUS(kvs_client_get(r, "k", &data, &n), KVS_OK);
    uint64_t ms = (kvs__now_ns() - t0) / KVS_NS_PER_MS;
    CHECK_EQ_INT(n, 10);
    CHECK(memcmp(data, "0123456789", 10) == 0);
    kvs_free(data);
    kvs_client_stats_t s;
    CHECK_STATUS(kvs_client_get_stats(r, &s), KVS_OK);
    CHECK_EQ_U64(s.shm_transfers, 1);
    printf("shm read beside 4 silent peers: %llu ms\n", (unsigned long long)ms);
    fflush(stdout);
    CHECK_CMP_U64(ms, <, 500);
    for (int i = 0; i < 4; i++) {
        CHECK(closed_within(silent[i], 4000));
        close(silent[i]);
    }
    uint64_t silent_ms = (kvs__now_ns() - t_silent) / KVS_NS_PER_MS;
    printf("silent shm peers closed after %llu ms (time-out 500 ms)\n",
           (unsigned long long)silent_ms);
    CHECK_CMP_U64(silent_ms, >=, 400);
    CHECK_CMP_U64(silent_ms, <, 950);
    kvs_client_close(r);
    store_stop(&st);
    shm_dir_remove(dir);
}

/* Owners remove the same-host sockets of owners that are gone when they start (only sockets of
 * this user that nobody listens on, only "data-*.sock" in the shm directory), and their own
 * when they stop. */
static void test_stale_shm_sockets_removed(void)
{
    char dir[64];
    shm_dir_make(dir, sizeof(dir));
    unix_socket_at(dir, "data-1.sock", false);           /* stale */
    int live = unix_socket_at(dir, "data-2.sock", true); /* someone listens */
    unix_socket_at(dir, "other.sock", false);            /* not an owner's name */
    char path[128];
    snprintf(path, sizeof(path), "%s/data-3.sock", dir);
    FILE *f = fopen(path, "w"); /* not a socket */
    CHECK(f != NULL);
    fclose(f);
    CHECK(exists(dir, "data-1.sock"));

    store_t st;
    store_start(&st, NULL);
    char own[32];
    snprintf(own, sizeof(own), "data-%u.sock", (unsigned)st.owner.port);
    CHECK(exists(dir, own));
    CHECK(!exists(dir, "data-1.sock"));
    CHECK(exists(dir, "data-2.sock"));
    CHECK(exists(dir, "other.sock"));
    CHECK(exists(dir, "data-3.sock"));
    server_stop(&st.owner); /* SIGTERM */
    CHECK(!exists(dir, own));

    /* One killed leaves its socket; the next owner to start removes it. */
    const char *args[] = {"--owner-only", "--master", st.addr, "--segment-size", "16MiB", NULL};
    server_start(&st.owner, args);
    uint16_t killed = st.owner.port;
    snprintf(own, sizeof(own), "data-%u.sock", (unsigned)killed);
    server_kill(&st.owner);
    CHECK(exists(dir, own));
    server_start(&st.owner, args);
    CHECK(st.owner.port != killed); /* else its own socket took the name again */
    CHECK(!exists(dir, own));
    CHECK(exists(dir, "data-2.sock"));
    store_stop(&st);
    close(live);
    shm_dir_remove(dir);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_master_huge_frame_before_hello),
        KVS_TEST_CASE(test_master_handshake_timeout),
        KVS_TEST_CASE(test_master_idle_timeout),
        KVS_TEST_CASE(test_master_idle_spares_parked),
        KVS_TEST_CASE(test_master_max_conns),
        KVS_TEST_CASE(test_master_out_of_descriptors),
        KVS_TEST_CASE(test_data_out_of_descriptors),
        KVS_TEST_CASE(test_data_connections_reclaimed),
        KVS_TEST_CASE(test_data_handshake_timeout),
        KVS_TEST_CASE(test_data_idle_timeout),
        KVS_TEST_CASE(test_data_max_conns),
        KVS_TEST_CASE(test_shm_handshakes_concurrent),
        KVS_TEST_CASE(test_stale_shm_sockets_removed),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
