/* Test helpers: a server process as /proc shows it (memory, descriptors, threads), to check
 * that what hostile peers cost it is bounded and given back. */
#ifndef KVS_PROC_HELPERS_H
#define KVS_PROC_HELPERS_H

#include "kvs_test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* A "Name:   value kB" line of /proc/PID/status, in kB. */
static inline uint64_t proc_status_kb(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    uint64_t v = UINT64_MAX;
    size_t n = strlen(name);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            v = strtoull(line + n + 1, NULL, 10);
    }
    fclose(f);
    CHECK(v != UINT64_MAX);
    return v;
}

/* Entries of /proc/PID/<dir> ("fd": descriptors, "task": threads). */
static inline unsigned proc_count(pid_t pid, const char *dir)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, dir);
    DIR *d = opendir(path);
    CHECK(d != NULL);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

#endif
