/* Integration: the kvstash command line against a real kvstash-server on loopback, where its
 * input and output are hostile or broken: closed standard descriptors, a full disk, endless
 * input, keys with control characters, empty master addresses. */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "server_fixture.h"
#include "common/common_int.h"
#include "proto/net_int.h"

#include <kvstash/kvstash.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The store's one segment, hence the largest object it can hold. */
#define SEGMENT      "1MiB"
#define SEGMENT_SIZE (1u << 20)
/* A command that has not exited by then is stuck (reading without end, waiting on a socket). */
#define CLI_DEADLINE_MS 10000

typedef struct {
    server_t srv;
    char master[64];
} store_t;

static void store_start(store_t *st)
{
    const char *args[] = {"--segment-size", SEGMENT, NULL};
    server_start(&st->srv, args);
    snprintf(st->master, sizeof(st->master), "127.0.0.1:%u", (unsigned)st->srv.port);
}

static kvs_client_t *client_open(const store_t *st)
{
    kvs_client_config_t cfg;
    CHECK_STATUS(kvs_client_config_init(&cfg), KVS_OK);
    cfg.master = st->master;
    kvs_client_t *c = NULL;
    CHECK_STATUS(kvs_client_open(&cfg, &c), KVS_OK);
    return c;
}

/* How the command's standard descriptors are set up. */
typedef struct {
    const char *in;  /* file to read standard input from; NULL: /dev/null */
    const char *out; /* file for standard output; NULL: captured into `out` of the result */
    bool close_in, close_out, close_err;
    const char *env_master; /* KVS_MASTER for the command; NULL: unset */
} io_t;

typedef struct {
    int status; /* exit status; 128 + signal if killed; -1 if it ran past CLI_DEADLINE_MS */
    char out[16384];
    size_t out_len;
    char err[4096];
} result_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n;
}

/* Waits for `pid` at most CLI_DEADLINE_MS; kills it past that. */
static int wait_exit(pid_t pid)
{
    uint64_t end = now_ms() + CLI_DEADLINE_MS;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        CHECK(w >= 0);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(5000);
    }
}

static void child_fd(int fd, const char *path, int flags)
{
    int f = open(path, flags, 0600);
    if (f < 0 || dup2(f, fd) < 0)
        _exit(126);
    if (f != fd)
        close(f);
}

/* Runs `kvstash args...` (NULL-terminated) with its descriptors set up as `io` says. */
static void run(const io_t *io, const char *const *args, result_t *r)
{
    char outp[64], errp[64];
    snprintf(outp, sizeof(outp), "/tmp/kvs-cli-out-%d", (int)getpid());
    snprintf(errp, sizeof(errp), "/tmp/kvs-cli-err-%d", (int)getpid());
    const char *argv[24] = {KVS_CLI_PATH};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        child_fd(0, io->in ? io->in : "/dev/null", O_RDONLY);
        child_fd(1, io->out ? io->out : outp, O_WRONLY | O_CREAT | O_TRUNC);
        child_fd(2, errp, O_WRONLY | O_CREAT | O_TRUNC);
        if (io->close_in)
            close(0);
        if (io->close_out)
            close(1);
        if (io->close_err)
            close(2);
        if (io->env_master != NULL)
            setenv("KVS_MASTER", io->env_master, 1);
        else
            unsetenv("KVS_MASTER");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    r->status = wait_exit(pid);
    r->out_len = io->out ? 0 : read_file(outp, r->out, sizeof(r->out));
    if (io->out)
        r->out[0] = '\0';
    read_file(errp, r->err, sizeof(r->err));
    unlink(outp);
    unlink(errp);
}

#define CHECK_HAS(hay, needle)                                                                     \
    do {                                                                                           \
        if (strstr((hay), (needle)) == NULL)                                                       \
            kvs_test_fail(__FILE__, __LINE__, "%s has \"%s\": it is \"%s\"", #hay, (needle),       \
                          (hay));                                                                  \
    } while (0)

/* Object bytes that no request to the master contains by chance. */
#define MARK "OBJECT-BYTES-NOT-FOR-THE-MASTER"

static void put_marked(kvs_client_t *c, const char *key, size_t len)
{
    char *b = malloc(len);
    CHECK(b != NULL);
    for (size_t i = 0; i < len; i++)
        b[i] = MARK[i % (sizeof(MARK) - 1)];
    CHECK_STATUS(kvs_client_put(c, key, b, len, NULL), KVS_OK);
    free(b);
}

static void put_bytes(kvs_client_t *c, const char *key, size_t len, uint8_t seed)
{
    uint8_t *b = malloc(len);
    CHECK(b != NULL);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)(seed + i * 7);
    CHECK_STATUS(kvs_client_put(c, key, b, len, NULL), KVS_OK);
    free(b);
}

/* A loopback relay in front of the master that keeps what clients send it: whatever a command
 * writes into its master connection by mistake (an object, an error message) shows up there. */
#define RELAY_PAIRS 16
typedef struct {
    int lfd;
    uint16_t port, target;
    pthread_t th;
    atomic_bool stop;
    pthread_mutex_t mu;
    char seen[1 << 20]; /* client to master, the first MiB */
    size_t nseen;
} relay_t;

static bool write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    int cfd[RELAY_PAIRS], sfd[RELAY_PAIRS], n = 0;
    static char buf[65536];
    while (!atomic_load(&r->stop)) {
        struct pollfd p[1 + 2 * RELAY_PAIRS];
        p[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
        for (int i = 0; i < n; i++) {
            p[1 + 2 * i] = (struct pollfd){.fd = cfd[i], .events = POLLIN};
            p[2 + 2 * i] = (struct pollfd){.fd = sfd[i], .events = POLLIN};
        }
        int polled = n;
        if (poll(p, (nfds_t)(1 + 2 * n), 20) <= 0)
            continue;
        for (int i = 0; i < polled; i++) {
            for (int d = 0; d < 2 && cfd[i] >= 0; d++) {
                if ((p[1 + 2 * i + d].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
                    continue;
                ssize_t got = read(d == 0 ? cfd[i] : sfd[i], buf, sizeof(buf));
                if (got > 0 && d == 0) {
                    pthread_mutex_lock(&r->mu);
                    size_t keep = KVS_MIN((size_t)got, sizeof(r->seen) - r->nseen);
                    memcpy(r->seen + r->nseen, buf, keep);
                    r->nseen += keep;
                    pthread_mutex_unlock(&r->mu);
                }
                if (got <= 0 || !write_all(d == 0 ? sfd[i] : cfd[i], buf, (size_t)got)) {
                    close(cfd[i]);
                    close(sfd[i]);
                    cfd[i] = sfd[i] = -1;
                }
            }
        }
        int w = 0;
        for (int i = 0; i < n; i++) {
            if (cfd[i] >= 0) {
                cfd[w] = cfd[i];
                sfd[w++] = sfd[i];
            }
        }
        n = w;
        if ((p[0].revents & POLLIN) != 0 && n < RELAY_PAIRS) {
            int c = accept(r->lfd, NULL, NULL);
            int s =
                c < 0 ? -1 : kvs__tcp_connect("127.0.0.1", r->target, kvs__now_ns() + 1000000000);
            if (s >= 0 && kvs__set_nonblock(s, false) == KVS_OK) {
                cfd[n] = c;
                sfd[n++] = s;
            } else {
                if (c >= 0)
                    close(c);
                if (s >= 0)
                    close(s);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        close(cfd[i]);
        close(sfd[i]);
    }
    return NULL;
}

static relay_t *relay_start(const store_t *st, char *addr, size_t len)
{
    relay_t *r = calloc(1, sizeof(*r));
    CHECK(r != NULL);
    r->lfd = kvs__tcp_listen("127.0.0.1", 0, 16);
    CHECK(r->lfd >= 0);
    r->port = kvs__sock_port(r->lfd);
    r->target = st->srv.port;
    pthread_mutex_init(&r->mu, NULL);
    CHECK_EQ_INT(pthread_create(&r->th, NULL, relay_main, r), 0);
    snprintf(addr, len, "127.0.0.1:%u", (unsigned)r->port);
    return r;
}

/* Stops the relay; true if clients sent it the string `needle`. `nseen_p` gets how many bytes
 * they sent. */
static bool relay_stop_saw(relay_t *r, const char *needle, size_t *nseen_p)
{
    atomic_store(&r->stop, true);
    CHECK_EQ_INT(pthread_join(r->th, NULL), 0);
    close(r->lfd);
    bool saw = memmem(r->seen, r->nseen, needle, strlen(needle)) != NULL;
    *nseen_p = r->nseen;
    pthread_mutex_destroy(&r->mu);
    free(r);
    return saw;
}

/* ---- standard descriptors -------------------------------------------------------------------- */

/* `get KEY -` with standard output closed used to exit 0 having written the object into what
 * the program opened next as descriptor 1: its connection to the master. It must refuse, and
 * writing to a named file must still work. */
static void test_get_refuses_closed_stdout(void)
{
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    put_marked(c, "k", 100000);
    char via[64];
    relay_t *relay = relay_start(&st, via, sizeof(via));
    const char *get_out[] = {"--master", via, "get", "k", "-", NULL};
    io_t io = {.close_out = true};
    result_t r;
    run(&io, get_out, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "standard output is closed");
    size_t nseen;
    CHECK(!relay_stop_saw(relay, MARK, &nseen));
    /* The store is unharmed, and a file is still a fine destination without a stdout. */
    char path[64];
    snprintf(path, sizeof(path), "/tmp/kvs-cli-get-%d", (int)getpid());
    const char *get_file[] = {"--master", st.master, "get", "k", path, NULL};
    run(&io, get_file, &r);
    CHECK_EQ_INT(r.status, 0);
    static char got[200000], want[100000];
    CHECK_EQ_U64(read_file(path, got, sizeof(got)), sizeof(want));
    for (size_t i = 0; i < sizeof(want); i++)
        want[i] = MARK[i % (sizeof(MARK) - 1)];
    CHECK_EQ_MEM(got, want, sizeof(want));
    unlink(path);
    /* ls and stat write only to standard output: without one they refuse too. */
    const char *ls[] = {"--master", st.master, "ls", NULL};
    run(&io, ls, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "standard output is closed");
    server_check_alive(&st.srv);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* `put KEY -` with standard input closed must not read the object from a descriptor it opened
 * itself; with standard error closed, its messages used to go into its master connection. */
static void test_closed_stdin_and_stderr(void)
{
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    const char *put[] = {"--master", st.master, "put", "k", "-", NULL};
    io_t io = {.close_in = true};
    result_t r;
    run(&io, put, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "standard input is closed");
    CHECK_EQ_INT(kvs_client_exists(c, "k"), 0);
    /* A failing get with no stderr: still exit 1, and its message reaches no socket. */
    char via[64];
    relay_t *relay = relay_start(&st, via, sizeof(via));
    const char *get[] = {"--master", via, "get", "missing", "-", NULL};
    io_t quiet = {.close_err = true};
    run(&quiet, get, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_EQ_U64(r.out_len, 0);
    size_t nseen;
    CHECK(!relay_stop_saw(relay, "kvstash get:", &nseen));
    CHECK(nseen > 0); /* it did ask the master, through the relay */
    put_bytes(c, "k", 10, 1);
    CHECK_EQ_INT(kvs_client_get_size(c, "k"), 10);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* A full standard output is an error with a message, for objects and for listings. */
static void test_full_stdout_fails(void)
{
    struct stat sb;
    if (stat("/dev/full", &sb) != 0 || !S_ISCHR(sb.st_mode))
        kvs_test_skip("no /dev/full here");
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    put_bytes(c, "k", 5000, 9);
    io_t io = {.out = "/dev/full"};
    result_t r;
    const char *get[] = {"--master", st.master, "get", "k", "-", NULL};
    run(&io, get, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "cannot write");
    const char *ls[] = {"--master", st.master, "ls", NULL};
    run(&io, ls, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "cannot write standard output");
    const char *stat_[] = {"--master", st.master, "stat", NULL};
    run(&io, stat_, &r);
    CHECK_EQ_INT(r.status, 1);
    const char *schema[] = {"schema", NULL};
    run(&io, schema, &r);
    CHECK_EQ_INT(r.status, 1);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- input size ------------------------------------------------------------------------------ */

/* Endless standard input (`yes | kvstash put K -`) is refused once it passes the largest object
 * the store can hold, having read little more than that: it used to be read whole first. */
static void test_put_endless_stdin_stops_at_the_limit(void)
{
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    int p[2];
    CHECK_EQ_INT(pipe(p), 0);
    char errp[64];
    snprintf(errp, sizeof(errp), "/tmp/kvs-cli-err-%d", (int)getpid());
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[1]);
        if (dup2(p[0], 0) < 0)
            _exit(126);
        child_fd(2, errp, O_WRONLY | O_CREAT | O_TRUNC);
        execl(KVS_CLI_PATH, KVS_CLI_PATH, "--master", st.master, "put", "big", "-", (char *)NULL);
        _exit(127);
    }
    close(p[0]);
    CHECK_EQ_INT(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
    /* Feed up to 64 MiB; a reader that stops early leaves a broken pipe. */
    static char chunk[65536];
    memset(chunk, 'y', sizeof(chunk));
    uint64_t sent = 0, end = now_ms() + CLI_DEADLINE_MS;
    while (sent < (64u << 20) && now_ms() < end) {
        ssize_t n = write(p[1], chunk, sizeof(chunk));
        if (n > 0) {
            sent += (uint64_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = p[1], .events = POLLOUT};
            poll(&pf, 1, 50);
        } else {
            CHECK_EQ_INT(errno, EPIPE);
            break;
        }
    }
    close(p[1]);
    CHECK_EQ_INT(wait_exit(pid), 1);
    char err[4096];
    read_file(errp, err, sizeof(err));
    unlink(errp);
    CHECK_HAS(err, "larger than the largest object the store can hold");
    /* What it read: the limit and a byte, plus what sat in the pipe and in stdio's buffer. */
    CHECK_CMP_U64(sent, >, SEGMENT_SIZE);
    CHECK_CMP_U64(sent, <, 4u * SEGMENT_SIZE);
    CHECK_EQ_INT(kvs_client_exists(c, "big"), 0);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* A regular file over the limit is refused by its size, before it is read; one of exactly the
 * limit is stored. */
static void test_put_file_over_the_limit(void)
{
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/kvs-cli-big-%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    /* Sparse: reading it whole would take 8 GiB of memory. */
    CHECK_EQ_INT(ftruncate(fd, (off_t)8 << 30), 0);
    close(fd);
    const char *put[] = {"--master", st.master, "put", "big", path, NULL};
    io_t io = {0};
    result_t r;
    uint64_t t0 = now_ms();
    run(&io, put, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "larger than the largest object the store can hold");
    CHECK_CMP_U64(now_ms() - t0, <, 3000);
    CHECK_EQ_INT(kvs_client_exists(c, "big"), 0);
    /* One byte over, then exactly the limit. */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    CHECK_EQ_INT(ftruncate(fd, (off_t)SEGMENT_SIZE + 1), 0);
    close(fd);
    run(&io, put, &r);
    CHECK_EQ_INT(r.status, 1);
    CHECK_HAS(r.err, "larger than the largest object the store can hold");
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    CHECK_EQ_INT(ftruncate(fd, (off_t)SEGMENT_SIZE), 0);
    close(fd);
    run(&io, put, &r);
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_INT(kvs_client_get_size(c, "big"), SEGMENT_SIZE);
    unlink(path);
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- what ls prints -------------------------------------------------------------------------- */

/* Keys are peer-chosen bytes: ls prints them escaped, one line each, so that none can fake a
 * line or send the terminal an escape sequence. */
static void test_ls_escapes_keys(void)
{
    store_t st;
    store_start(&st);
    kvs_client_t *c = client_open(&st);
    const char *keys[] = {"a\n1 B          complete 1  fake", "b\x1b[31mred", "c\\d", "d\te\r",
                          "e\x7f\x01\xff\xc3\xa9"};
    for (size_t i = 0; i < KVS_ARRAY_SIZE(keys); i++)
        put_bytes(c, keys[i], 1, 0);
    const char *ls[] = {"--master", st.master, "ls", NULL};
    io_t io = {0};
    result_t r;
    run(&io, ls, &r);
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_STR(r.out, "1 B          complete 1  a\\n1 B          complete 1  fake\n"
                        "1 B          complete 1  b\\x1b[31mred\n"
                        "1 B          complete 1  c\\\\d\n"
                        "1 B          complete 1  d\\te\\r\n"
                        "1 B          complete 1  e\\x7f\\x01\\xff\\xc3\\xa9\n");
    /* A prefix is matched against the key's bytes, not its escaped form. */
    const char *ls_b[] = {"--master", st.master, "ls", "b\x1b", NULL};
    run(&io, ls_b, &r);
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_STR(r.out, "1 B          complete 1  b\\x1b[31mred\n");
    kvs_client_close(c);
    server_stop(&st.srv);
}

/* ---- arguments ------------------------------------------------------------------------------- */

/* An empty master address is an error, not the default; so are options without their value. */
static void test_bad_arguments(void)
{
    io_t io = {0};
    result_t r;
    const char *empty_put[] = {"--master", "", "put", "k", "-", NULL};
    run(&io, empty_put, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "--master is empty");
    const char *empty_ls[] = {"--master", "", "ls", NULL};
    run(&io, empty_ls, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "--master is empty");
    io_t env_empty = {.env_master = ""};
    const char *get[] = {"get", "k", "-", NULL}, *stat_[] = {"stat", NULL};
    run(&env_empty, get, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "KVS_MASTER is empty");
    run(&env_empty, stat_, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "KVS_MASTER is empty");
    io_t env_bad = {.env_master = "nonsense"};
    run(&env_bad, get, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "KVS_MASTER wants HOST:PORT");
    const char *no_value[] = {"--master", NULL}, *no_timeout[] = {"--timeout-ms", NULL},
               *bad_timeout[] = {"--timeout-ms", "5x", "ls", NULL},
               *no_limit[] = {"--master", "127.0.0.1:1", "ls", "--limit", NULL},
               *two_prefixes[] = {"--master", "127.0.0.1:1", "ls", "a", "b", NULL};
    run(&io, no_value, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "--master wants a value");
    run(&io, no_timeout, &r);
    CHECK_EQ_INT(r.status, 2);
    run(&io, bad_timeout, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "--timeout-ms wants");
    run(&io, no_limit, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "--limit wants a value");
    run(&io, two_prefixes, &r);
    CHECK_EQ_INT(r.status, 2);
    CHECK_HAS(r.err, "one PREFIX");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_get_refuses_closed_stdout),
        KVS_TEST_CASE(test_closed_stdin_and_stderr),
        KVS_TEST_CASE(test_full_stdout_fails),
        KVS_TEST_CASE(test_put_endless_stdin_stops_at_the_limit),
        KVS_TEST_CASE(test_put_file_over_the_limit),
        KVS_TEST_CASE(test_ls_escapes_keys),
        KVS_TEST_CASE(test_bad_arguments),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
