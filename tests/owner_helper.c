/* A data-server process for tests: serves an inherited memfd as segment 7 and writes its port
 * to standard output. Usage: owner_helper FD SIZE DELAY_US. A separate program (not a fork of
 * the test) so that sanitizers, which do not support threads after fork, see a fresh process. */
#define _GNU_SOURCE
#include "owner/owner_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    int fd = atoi(argv[1]);
    uint64_t size = strtoull(argv[2], NULL, 10), delay = strtoull(argv[3], NULL, 10);
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return 3;
    kvs__data_server_config_t cfg;
    kvs__data_server_config_init(&cfg);
#ifdef KVS_TEST_HOOKS
    cfg.inject_delay_us = delay;
#else
    if (delay != 0)
        return 2; /* no fault knobs in this build */
#endif
    cfg.io_timeout_ms = 10000;
    kvs__data_server_t *srv;
    if (kvs__data_server_create(&cfg, &srv) != KVS_OK ||
        kvs__data_server_add(srv, 7, base, size, fd, NULL, 0) != KVS_OK)
        return 4;
    printf("%u\n", (unsigned)kvs__data_server_port(srv));
    fflush(stdout);
    for (;;)
        pause();
}
