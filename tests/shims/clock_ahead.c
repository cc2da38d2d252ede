/* LD_PRELOAD shim for tests: CLOCK_REALTIME reads one hour ahead of the kernel's wall clock, as
 * if the wall clock had jumped back by an hour right after each reading. A timed wait whose
 * deadline is computed from such a reading (pthread_cond_timedwait on a CLOCK_REALTIME
 * condition variable) then lasts an hour longer than meant; waits on CLOCK_MONOTONIC do not
 * notice. Other clocks pass through unchanged. */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_gettime(clockid_t id, struct timespec *ts)
{
    long rc = syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && id == CLOCK_REALTIME)
        ts->tv_sec += 3600;
    return (int)rc;
}
