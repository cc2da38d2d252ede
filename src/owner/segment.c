/* memfd-backed segment memory. */
#define _GNU_SOURCE
#include "owner_int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int kvs__segment_mem_create(const char *name, uint64_t size, kvs__segment_mem_t *mem_p)
{
    if (mem_p == NULL || size == 0 || size > (uint64_t)SIZE_MAX)
        return KVS_INVALID_PARAMS;
    int fd = memfd_create(name ? name : "kvstash-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        kvs_error("memfd_create: %s", strerror(errno));
        return KVS_IO_ERROR;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        kvs_error("cannot size the segment to %llu bytes: %s", (unsigned long long)size,
                  strerror(errno));
        close(fd);
        return KVS_NO_MEMORY;
    }
    /* The size is final: a same-host reader that maps the descriptor can rely on it (a segment
     * that shrank under its mapping would fault the reader). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        kvs_warn("cannot seal the segment's size: %s", strerror(errno));
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        kvs_error("cannot map the segment (%llu bytes): %s", (unsigned long long)size,
                  strerror(errno));
        close(fd);
        return KVS_NO_MEMORY;
    }
    mem_p->fd = fd;
    mem_p->base = base;
    mem_p->size = size;
    return KVS_OK;
}

void kvs__segment_mem_destroy(kvs__segment_mem_t *mem)
{
    if (mem == NULL || mem->base == NULL)
        return;
    munmap(mem->base, mem->size);
    close(mem->fd);
    mem->base = NULL;
    mem->fd = -1;
}
