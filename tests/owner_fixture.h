/* Test fixture: an owner data server in a child process, serving a memfd segment that the
 * test process maps too, so tests can check the segment's bytes directly. */
#ifndef KVS_OWNER_FIXTURE_H
#define KVS_OWNER_FIXTURE_H

#include "kvs_test.h"
#include "owner/owner_int.h"

#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIX_SEGMENT_ID 7u

typedef struct {
    kvs__segment_mem_t mem;
    pid_t pid;
    uint16_t port;
    char endpoint[64];
} owner_fixture_t;

/* Starts the helper serving a segment of `size` bytes; with `delay_us` it stalls that long
 * before each request (a fault knob: the case skips in builds without them). */
static inline void owner_fixture_start(owner_fixture_t *f, uint64_t size, uint64_t delay_us)
{
    if (delay_us != 0)
        kvs_test_need_hooks();
    CHECK_STATUS(kvs__segment_mem_create("test-segment", size, &f->mem), KVS_OK);
    int p[2];
    CHECK_EQ_INT(pipe(p), 0);
    fflush(stdout);
    f->pid = fork();
    CHECK(f->pid >= 0);
    if (f->pid == 0) {
        /* Hand the memfd to the helper (it is close-on-exec) and its stdout to the pipe. */
        int fd = dup(f->mem.fd);
        char fds[16], sizes[32], delays[32];
        snprintf(fds, sizeof(fds), "%d", fd);
        snprintf(sizes, sizeof(sizes), "%llu", (unsigned long long)size);
        snprintf(delays, sizeof(delays), "%llu", (unsigned long long)delay_us);
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        execl(KVS_OWNER_HELPER_PATH, KVS_OWNER_HELPER_PATH, fds, sizes, delays, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char buf[16] = {0};
    ssize_t n = 0;
    while (n < (ssize_t)sizeof(buf) - 1) {
        ssize_t r = read(p[0], buf + n, 1);
        if (r <= 0 || buf[n] == '\n')
            break;
        n++;
    }
    close(p[0]);
    f->port = (uint16_t)atoi(buf);
    CHECK(f->port != 0);
    snprintf(f->endpoint, sizeof(f->endpoint), "127.0.0.1:%u", (unsigned)f->port);
}

static inline void owner_fixture_kill(owner_fixture_t *f)
{
    if (f->pid > 0) {
        kill(f->pid, SIGKILL);
        waitpid(f->pid, NULL, 0);
        f->pid = 0;
    }
}

static inline void owner_fixture_stop(owner_fixture_t *f)
{
    owner_fixture_kill(f);
    kvs__segment_mem_destroy(&f->mem);
}

#endif
