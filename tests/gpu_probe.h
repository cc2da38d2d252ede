/* GPU test programs: whether a CUDA device exists, asked in a child process so that CUDA is
 * never initialised before the harness forks the cases (a forked CUDA context is unusable). */
#ifndef KVS_GPU_PROBE_H
#define KVS_GPU_PROBE_H

#include <cuda_runtime_api.h>

#include <stdbool.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Exit code that CTest reports as a skip (SKIP_RETURN_CODE). */
#define KVS_TEST_SKIP 77

static inline bool have_gpu(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int count = 0;
        _exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 1);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#endif
