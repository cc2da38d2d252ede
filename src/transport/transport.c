/* Helpers shared by every transport. */
#include "transport_int.h"

uint64_t kvs__iov_total(const struct iovec *iov, uint32_t iovcnt)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len > UINT64_MAX - total)
            return UINT64_MAX;
        total += iov[i].iov_len;
    }
    return total;
}
