/* Test fixture: real kvstash-server processes on loopback. Each writes its port (the master
 * port, or for --owner-only the data port) to a file the fixture waits for. */
#ifndef KVS_SERVER_FIXTURE_H
#define KVS_SERVER_FIXTURE_H

#include "kvs_test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    uint16_t port;
    char port_file[96];
} server_t;

/* Starts the server program at `path` with `args` (NULL-terminated, may be NULL) after
 * "--port 0 --port-file F --log-level error", and waits until it listens. */
static inline void server_start_path(server_t *s, const char *path, const char *const *args)
{
    static unsigned seq;
    snprintf(s->port_file, sizeof(s->port_file), "/tmp/kvs-test-port-%d-%u", (int)getpid(), seq++);
    unlink(s->port_file);
    const char *argv[40] = {path,         "--port",      "0",    "--port-file",
                            s->port_file, "--log-level", "error"};
    int n = 7;
    for (int i = 0; args && args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    s->pid = fork();
    CHECK(s->pid >= 0);
    if (s->pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(s->port_file, "r");
        unsigned port = 0;
        if (f != NULL) {
            int got = fscanf(f, "%u", &port);
            fclose(f);
            if (got == 1 && port > 0) {
                s->port = (uint16_t)port;
                return;
            }
        }
        int st;
        CHECK_EQ_INT(waitpid(s->pid, &st, WNOHANG), 0); /* still starting, not dead */
        usleep(10000);
    }
    kvs_test_fail(__FILE__, __LINE__, "server did not start");
}

/* kvstash-server (this build's). */
static inline void server_start(server_t *s, const char *const *args)
{
    server_start_path(s, KVS_SERVER_PATH, args);
}

static inline void server_check_alive(server_t *s)
{
    int st;
    CHECK_EQ_INT(waitpid(s->pid, &st, WNOHANG), 0);
}

/* SIGTERM, and the server must exit 0 promptly. */
static inline void server_stop(server_t *s)
{
    CHECK_EQ_INT(kill(s->pid, SIGTERM), 0);
    int st = 0;
    for (int i = 0; i < 1000; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            unlink(s->port_file);
            CHECK(WIFEXITED(st));
            CHECK_EQ_INT(WEXITSTATUS(st), 0);
            return;
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    kvs_test_fail(__FILE__, __LINE__, "server ignored SIGTERM");
}

#ifdef KVS_CLI_PATH
/* Runs the command line `kvstash --master M args...` (args NULL-terminated); returns its exit
 * status. */
static inline int run_cli(const char *master, const char *const *args)
{
    const char *argv[16] = {KVS_CLI_PATH, "--master", master};
    int n = 3;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    CHECK_EQ_INT(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
#endif

static inline void server_kill(server_t *s)
{
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    unlink(s->port_file);
}

#endif
