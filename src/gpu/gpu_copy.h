/* Copies between host memory and GPU memory for the transports' GPU destinations and sources:
 * pinning host memory, and per-fragment (or batched) copy-engine copies on a stream with
 * events. Builds without CUDA get stubs that report KVS_UNSUPPORTED. Plain C over the CUDA
 * runtime's C API (gpu_copy.c); the only CUDA C++ file stays scatter.cu. */
#ifndef KVS_GPU_COPY_H
#define KVS_GPU_COPY_H

#include "../common/common_int.h"

#include <sys/uio.h>

/* Whether this build can move bytes to and from GPU memory. */
bool kvs__gpu_built(void);
#ifdef KVS_HAVE_CUDA
#define KVS_GPU_BUILT 1
#else
#define KVS_GPU_BUILT 0
#endif

/* Pins [p, p + len) for the copy engine (cudaHostRegister; read-only memory is registered
 * read-only). */
int kvs__gpu_host_register(void *p, size_t len, bool read_only);
void kvs__gpu_host_unregister(void *p);

/* Pinned host memory (cudaMallocHost). */
int kvs__gpu_alloc_pinned(size_t len, void **p_p);
void kvs__gpu_free_pinned(void *p);

/* A stream of one device with a few events (slots) to wait on. Not thread-safe. */
typedef struct kvs__gpu_stream kvs__gpu_stream_t;
#define KVS_GPU_SLOTS 2
int kvs__gpu_stream_create(int device, kvs__gpu_stream_t **s_p);
void kvs__gpu_stream_destroy(kvs__gpu_stream_t *s);

/* One cudaMemcpyBatchAsync per slice (default) or one cudaMemcpyAsync per fragment piece
 * (KVS_GPU_COPY=each; benchmarks switch with this). */
void kvs__gpu_set_batched(bool batched);

/* Enqueues copies between `host` (len contiguous bytes) and bytes [off, off + len) of the
 * fragments iov[0..cnt), one copy per fragment piece; to_device: host -> fragments. */
int kvs__gpu_copy_slice(kvs__gpu_stream_t *s, bool to_device, void *host, const struct iovec *iov,
                        uint32_t cnt, uint64_t off, uint64_t len);
/* Records slot `slot` after what is enqueued, and waits for a recorded slot. */
int kvs__gpu_record(kvs__gpu_stream_t *s, int slot);
int kvs__gpu_wait_slot(kvs__gpu_stream_t *s, int slot);
/* Waits for everything enqueued. */
int kvs__gpu_sync(kvs__gpu_stream_t *s);

#endif
