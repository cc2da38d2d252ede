/* Test fixture: an owner data server in a child process, serving a memfd segment that the
 * test process maps too, so tests can check the segment's bytes directly. */
#ifndef KVS_OWNER_FIXTURE_H
#define KVS_OWNER_FIXTURE_H

#include "kvs_test.h"
#include "owner/owner_int.h"

#include <signal.h>
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

static inline void owner_fixture_start(owner_fixture_t *f, uint64_t size, uint64_t delay_us)
{
    CHECK_STATUS(kvs__segment_mem_create("test-segment", size, &f->mem), KVS_OK);
    int p[2];
    CHECK_EQ_INT(pipe(p), 0);
    fflush(stdout);
    f->pid = fork();
    CHECK(f->pid >= 0);
    if (f->pid == 0) {
        close(p[0]);
        kvs__data_server_config_t cfg;
        kvs__data_server_config_init(&cfg);
        cfg.inject_delay_us = delay_us;
        cfg.io_timeout_ms = 2000;
        kvs__data_server_t *srv;
        if (kvs__data_server_create(&cfg, &srv) != KVS_OK ||
            kvs__data_server_add(srv, FIX_SEGMENT_ID, f->mem.base, f->mem.size) != KVS_OK)
            _exit(3);
        uint16_t port = kvs__data_server_port(srv);
        if (write(p[1], &port, sizeof(port)) != sizeof(port))
            _exit(4);
        for (;;)
            pause();
    }
    close(p[1]);
    CHECK_EQ_INT(read(p[0], &f->port, sizeof(f->port)), (int)sizeof(f->port));
    close(p[0]);
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
