/* kvstash's own test harness: each case runs in a forked process with a time limit, and every
 * check prints both sides when it fails (in the manner of libuv's runner). */
#ifndef KVS_TEST_H
#define KVS_TEST_H

#include <kvstash/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef void (*kvs_test_fn)(void);
typedef struct {
    const char *name;
    kvs_test_fn fn;
} kvs_test_case_t;

#define KVS_TEST_CASE(fn)                                                                          \
    {                                                                                              \
#fn, fn                                                                                    \
    }

/* Runs the cases named on the command line, or all of them. `--list` lists them. The time
 * limit per case is KVS_TEST_TIMEOUT_S (default 300). KVS_TEST_NOFORK=1 runs in-process. */
int kvs_test_main(int argc, char **argv, const kvs_test_case_t *cases, size_t ncases);

/* A case that cannot run here ends with this: it is reported as skipped, never as passed, and a
 * program whose cases were all skipped exits with it (CTest's SKIP_RETURN_CODE). */
#define KVS_TEST_SKIPPED 77
void kvs_test_skip(const char *why) __attribute__((noreturn));
/* Standard error into a temporary file until kvs_test_stderr_end, which restores it, echoes
 * what was written and returns it (malloc'd; the caller frees). A failing CHECK meanwhile
 * restores it and echoes the capture first, so nothing of the case's output is lost. */
void kvs_test_stderr_begin(void);
char *kvs_test_stderr_end(void);

/* A case that needs the servers' test-only fault knobs (KVS_DATA_INJECT_DELAY_US) skips in
 * builds without them (configured without -DKVS_TEST_HOOKS=ON). */
static inline void kvs_test_need_hooks(void)
{
#ifndef KVS_TEST_HOOKS
    kvs_test_skip("needs the fault knobs of a -DKVS_TEST_HOOKS=ON build");
#endif
}

/* Reports a failure and ends the current case. */
void kvs_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            kvs_test_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            kvs_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_);           \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                         \
    do {                                                                                           \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);             \
        if (a_ != b_)                                                                              \
            kvs_test_fail(__FILE__, __LINE__, "%s == %s: %llu != %llu", #a, #b, a_, b_);           \
    } while (0)

#define CHECK_CMP_U64(a, op, b)                                                                    \
    do {                                                                                           \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);             \
        if (!(a_ op b_))                                                                           \
            kvs_test_fail(__FILE__, __LINE__, "%s %s %s: %llu vs %llu", #a, #op, #b, a_, b_);      \
    } while (0)

/* Compares status codes and prints their names. */
#define CHECK_STATUS(a, b)                                                                         \
    do {                                                                                           \
        int a_ = (int)(a), b_ = (int)(b);                                                          \
        if (a_ != b_)                                                                              \
            kvs_test_fail(__FILE__, __LINE__, "%s == %s: %d (%s) != %d (%s)", #a, #b, a_,          \
                          kvs_status_name(a_), b_, kvs_status_name(b_));                           \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                                       \
            kvs_test_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,                \
                          a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                 \
    } while (0)

#define CHECK_EQ_MEM(a, b, n)                                                                      \
    do {                                                                                           \
        size_t n_ = (n);                                                                           \
        const unsigned char *a_ = (const void *)(a), *b_ = (const void *)(b);                      \
        for (size_t i_ = 0; i_ < n_; i_++) {                                                       \
            if (a_[i_] != b_[i_])                                                                  \
                kvs_test_fail(__FILE__, __LINE__,                                                  \
                              "%s == %s: differ at byte %zu of %zu: "                              \
                              "0x%02x != 0x%02x",                                                  \
                              #a, #b, i_, n_, a_[i_], b_[i_]);                                     \
        }                                                                                          \
    } while (0)

/* Deterministic xorshift random numbers for tests (seed from KVS_TEST_SEED or fixed); each
 * thread has its own sequence. */
uint64_t kvs_test_rand(void);
uint64_t kvs_test_seed(void);

#endif
