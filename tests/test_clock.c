/* Timed waits run on the monotonic clock: a wall clock that jumps does not stop heartbeats.
 * An owner runs with a shim (tests/shims/clock_ahead.c) that reads CLOCK_REALTIME an hour ahead,
 * which is what a backward jump of the wall clock does to a deadline computed just before it.
 * Its heartbeats must keep its segment mounted for several heartbeat time-outs. (The owner's
 * heartbeat thread used to wait on a CLOCK_REALTIME deadline: it slept an hour and the master
 * dropped the segment and every object in it.) */
#define _GNU_SOURCE
#include "kvs_test.h"
#include "proto/net_int.h"
#include "rpc_helpers.h"
#include "server_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void test_wall_clock_jump_does_not_stop_heartbeats(void)
{
    server_t m, o;
    const char *margs[] = {"--master-only", "--heartbeat-timeout-ms", "1000", NULL};
    server_start(&m, margs);
    char master[64];
    snprintf(master, sizeof(master), "127.0.0.1:%u", (unsigned)m.port);
    setenv("LD_PRELOAD", KVS_CLOCK_AHEAD_PATH, 1);
    /* The sanitizer runtimes want to come first; the shim only replaces one libc function. */
    setenv("ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=1:abort_on_error=1", 1);
    const char *oargs[] = {"--owner-only", "--master",       master,    "--segment-size",
                           "1MiB",         "--segment-name", "clocked", NULL};
    server_start(&o, oargs);
    unsetenv("LD_PRELOAD");
    kvs__rpc_config_t cfg = {.host = "127.0.0.1", .port = m.port, .timeout_ms = 3000};
    kvs__rpc_t *rpc = NULL;
    CHECK_STATUS(kvs__rpc_open(&cfg, &rpc), KVS_OK);
    uint64_t id = rpc_stat_segment_id(rpc, "clocked");
    /* Four heartbeat time-outs: the same segment (same id: never dropped and re-mounted). */
    for (int i = 0; i < 40; i++) {
        usleep(100000);
        CHECK_EQ_U64(rpc_stat_segment_id(rpc, "clocked"), id);
    }
    CHECK_EQ_U64(rpc_stat_counter(rpc, "segments_expired"), 0);
    server_check_alive(&o);
    kvs__rpc_close(rpc);
    server_stop(&o);
    server_stop(&m);
}

int main(int argc, char **argv)
{
    static const kvs_test_case_t cases[] = {
        KVS_TEST_CASE(test_wall_clock_jump_does_not_stop_heartbeats),
    };
    return kvs_test_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
