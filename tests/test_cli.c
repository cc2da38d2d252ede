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

static void put_bytes(kvs_client_t *c, const char *key, size_t len, uint8_t seed)
{
    uint8_t *b = malloc(len);
    CHECK(b != NULL);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)(seed + i * 7);
    CHECK_STATUS(kvs_client_put(c, key, b, len, NULL), KVS_OK);
    free(b);
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

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_ls_escapes_keys),
    };
    return kvs_test_main(argc, argv, cases, KVS_ARRAY_SIZE(cases));
}
