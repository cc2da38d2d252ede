/* Test runner: forks per case, enforces a time limit, prints a summary line that CI reads. */
#define _GNU_SOURCE
#include "kvs_test.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *current_case = "?";
/* Per thread, so threads of a test draw independent, reproducible sequences. */
static _Thread_local uint64_t rng_state;
static _Atomic uint64_t rng_threads;

uint64_t kvs_test_seed(void)
{
    const char *s = getenv("KVS_TEST_SEED");
    return s && *s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull;
}

uint64_t kvs_test_rand(void)
{
    if (rng_state == 0)
        rng_state = (kvs_test_seed() + 0x9e3779b97f4a7c15ull * rng_threads++) | 1;
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static int capture_fd = -1, capture_saved = -1;

void kvs_test_stderr_begin(void)
{
    char path[] = "/tmp/kvs-test-stderr-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        kvs_test_fail(__FILE__, __LINE__, "mkstemp: cannot capture standard error");
    unlink(path);
    fflush(stderr);
    capture_saved = dup(2);
    if (capture_saved < 0 || dup2(fd, 2) != 2) {
        close(fd);
        kvs_test_fail(__FILE__, __LINE__, "dup: cannot capture standard error");
    }
    capture_fd = fd;
}

char *kvs_test_stderr_end(void)
{
    if (capture_fd < 0)
        return NULL;
    fflush(stderr);
    dup2(capture_saved, 2);
    close(capture_saved);
    int fd = capture_fd;
    capture_fd = capture_saved = -1;
    off_t n = lseek(fd, 0, SEEK_END);
    char *text = calloc(n > 0 ? (size_t)n + 1 : 1, 1);
    if (text == NULL || (n > 0 && pread(fd, text, (size_t)n, 0) != n)) {
        close(fd);
        kvs_test_fail(__FILE__, __LINE__, "cannot read the captured standard error");
    }
    close(fd);
    fputs(text, stderr);
    fflush(stderr);
    return text;
}

void kvs_test_fail(const char *file, int line, const char *fmt, ...)
{
    free(kvs_test_stderr_end()); /* a capture in progress: shown, and stderr back */
    va_list ap;
    fprintf(stderr, "FAIL %s at %s:%d: ", current_case, file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(1);
}

void kvs_test_skip(const char *why)
{
    printf("  skipped: %s\n", why);
    fflush(stdout);
    fflush(stderr);
    _exit(KVS_TEST_SKIPPED);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int run_case(const kvs_test_case_t *c, unsigned timeout_s, bool nofork)
{
    current_case = c->name;
    rng_state = 0;
    if (nofork) {
        c->fn();
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        /* Its own process group, so a timed-out case takes its helper processes with it. */
        setpgid(0, 0);
        alarm(timeout_s);
        c->fn();
        fflush(stdout);
        _exit(0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        ;
    kill(-pid, SIGKILL); /* leftovers of the case */
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "FAIL %s: %s%s\n", c->name, strsignal(WTERMSIG(status)),
                WTERMSIG(status) == SIGALRM ? " (time limit; KVS_TEST_TIMEOUT_S)" : "");
    }
    return 1;
}

int kvs_test_main(int argc, char **argv, const kvs_test_case_t *cases, size_t ncases)
{
    const char *t = getenv("KVS_TEST_TIMEOUT_S");
    unsigned timeout_s = t && *t ? (unsigned)strtoul(t, NULL, 10) : 300;
    const char *nf = getenv("KVS_TEST_NOFORK");
    bool nofork = nf && *nf == '1';
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < ncases; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    unsigned passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < ncases; i++) {
        bool selected = argc <= 1;
        for (int a = 1; a < argc && !selected; a++)
            selected = strcmp(argv[a], cases[i].name) == 0;
        if (!selected)
            continue;
        double t0 = now_ms();
        int rc = run_case(&cases[i], timeout_s, nofork);
        printf("[%s] %s (%.0f ms)\n",
               rc == 0                  ? " OK "
               : rc == KVS_TEST_SKIPPED ? "SKIP"
                                        : "FAIL",
               cases[i].name, now_ms() - t0);
        fflush(stdout);
        if (rc == 0)
            passed++;
        else if (rc == KVS_TEST_SKIPPED)
            skipped++;
        else
            failed++;
    }
    if (passed + failed + skipped == 0) {
        fprintf(stderr, "no test case matched\n");
        return 2;
    }
    printf("%u passed, %u failed, %u skipped\n", passed, failed, skipped);
    /* Nothing that ran failed; if nothing ran at all, the program says so to CTest. */
    return failed ? 1 : passed == 0 ? KVS_TEST_SKIPPED : 0;
}
