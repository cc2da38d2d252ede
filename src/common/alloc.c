/* Counting allocation wrapper with failure injection (in the manner of Redis' zmalloc and
 * SQLite's fault injection). Each block carries a 16-byte header holding its size so frees can
 * be counted; the header keeps the user pointer 16-byte aligned. */
#define _GNU_SOURCE
#include "common_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KVS_ALLOC_HDR 16u

static atomic_size_t live_bytes;
static atomic_size_t live_count;
/* Allocations left before an injected failure; negative means injection is off. */
static atomic_long fail_countdown = -1;
static atomic_bool fail_sticky;

static bool should_fail(void)
{
    long c = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (c < 0)
        return false;
    for (;;) {
        if (c < 0)
            return false;
        if (c == 0) {
            if (!atomic_load(&fail_sticky))
                atomic_store(&fail_countdown, -1);
            return true;
        }
        if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1))
            return false;
    }
}

bool kvs__alloc_injecting(void)
{
    return atomic_load_explicit(&fail_countdown, memory_order_relaxed) >= 0;
}

void kvs__alloc_inject_failure(long n, bool sticky)
{
    atomic_store(&fail_sticky, sticky);
    atomic_store(&fail_countdown, n < 0 ? -1 : n);
}

static void *account(void *raw, size_t size)
{
    if (raw == NULL)
        return NULL;
    memcpy(raw, &size, sizeof(size));
    atomic_fetch_add_explicit(&live_bytes, size, memory_order_relaxed);
    atomic_fetch_add_explicit(&live_count, 1, memory_order_relaxed);
    return (char *)raw + KVS_ALLOC_HDR;
}

void *kvs__malloc(size_t size)
{
    if (size > SIZE_MAX - KVS_ALLOC_HDR || should_fail())
        return NULL;
    return account(malloc(size + KVS_ALLOC_HDR), size);
}

void *kvs__calloc(size_t n, size_t size)
{
    if (size != 0 && n > (SIZE_MAX - KVS_ALLOC_HDR) / size)
        return NULL;
    void *p = kvs__malloc(n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void kvs__free(void *ptr)
{
    if (ptr == NULL)
        return;
    char *raw = (char *)ptr - KVS_ALLOC_HDR;
    size_t size;
    memcpy(&size, raw, sizeof(size));
    atomic_fetch_sub_explicit(&live_bytes, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&live_count, 1, memory_order_relaxed);
    free(raw);
}

void *kvs__realloc(void *ptr, size_t size)
{
    if (ptr == NULL)
        return kvs__malloc(size);
    if (size > SIZE_MAX - KVS_ALLOC_HDR || should_fail())
        return NULL;
    char *raw = (char *)ptr - KVS_ALLOC_HDR;
    size_t old;
    memcpy(&old, raw, sizeof(old));
    char *nraw = realloc(raw, size + KVS_ALLOC_HDR);
    if (nraw == NULL)
        return NULL;
    memcpy(nraw, &size, sizeof(size));
    if (size >= old)
        atomic_fetch_add_explicit(&live_bytes, size - old, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&live_bytes, old - size, memory_order_relaxed);
    return nraw + KVS_ALLOC_HDR;
}

char *kvs__strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = kvs__malloc(len + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *kvs__strdup(const char *s)
{
    return kvs__strndup(s, SIZE_MAX);
}

size_t kvs__alloc_live_bytes(void)
{
    return atomic_load(&live_bytes);
}

size_t kvs__alloc_live_count(void)
{
    return atomic_load(&live_count);
}
