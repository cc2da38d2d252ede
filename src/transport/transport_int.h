/* Transport interface: how bytes move between local memory and owners' segments.
 *
 * Every transport fills a kvs_transport_ops_t with designated initializers and embeds
 * kvs_transport_t as the first member of its own struct (UCX uct, Redis ConnectionType). A
 * batch of requests is submitted at once and completed with one wait that has a deadline; a
 * wait that reaches its deadline cancels what is left and returns only after nothing can
 * write into the batch's local memory any more. Capabilities are reported, not guessed. */
#ifndef KVS_TRANSPORT_INT_H
#define KVS_TRANSPORT_INT_H

#include "../proto/proto_int.h"

#include <sys/uio.h>

typedef enum {
    KVS_XFER_READ = 0,  /* remote segment -> local fragments */
    KVS_XFER_WRITE = 1, /* local fragments -> remote segment */
} kvs_xfer_op_t;

/* Memory domain of registered memory: host, or a device ordinal (>= 0); MIXED for a set of
 * fragments that spans more than one. */
#define KVS_DOMAIN_HOST  (-1)
#define KVS_DOMAIN_MIXED (-2)

/* Capability bits. */
#define KVS_TRANSPORT_CAP_SAME_HOST 0x1u /* only reaches owners on this host */
#define KVS_TRANSPORT_CAP_GPU_DEST  0x2u /* local fragments may be device memory */
#define KVS_TRANSPORT_CAP_ZERO_COPY                                                                \
    0x4u /* bytes go straight between socket/segment and                                           \
          * local memory, no intermediate buffer */
/* Submissions cost no ramp-up or drain (a copy per request, no connections to fill): staging may
 * split a call into more, smaller fills to overlap receives with scatters. */
#define KVS_TRANSPORT_CAP_CHEAP_SUBMIT 0x8u

typedef struct kvs_transport kvs_transport_t;
typedef struct kvs_endpoint kvs_endpoint_t;

/* One request of a batch. `iov` (borrowed, valid until the wait returns) lists the local
 * fragments in order; their lengths add up to `length`. */
typedef struct {
    kvs_xfer_op_t op;
    kvs_endpoint_t *ep;
    uint64_t segment_id;
    uint64_t offset; /* in the remote segment */
    uint64_t length;
    const struct iovec *iov;
    uint32_t iovcnt;
    int status;         /* out: OK, TIMED_OUT, TRANSFER_FAIL, or the owner's refusal */
    uint32_t gpu;       /* 0: the fragments are host memory; d + 1: memory of CUDA device d */
    uint64_t token;     /* writes: the put's token (owners refuse fenced ones and 0); reads: 0 */
    uint64_t cap;       /* writes: the replica's capability for [offset, offset + length) */
    uint64_t cap_epoch; /* writes: the epoch the capability was made in */
    /* Writes of part of a replica: the range the master allocated, which `cap` names (both 0:
     * [offset, offset + length)). */
    uint64_t alloc_offset, alloc_size;
} kvs_xfer_req_t;

typedef struct kvs_batch kvs_batch_t;

typedef struct {
    const char *name;
    uint32_t caps;
    /* Opens (or reuses) the endpoint for an owner at "host:port", resolving its name before the
     * deadline. The caller gets a reference: it stays valid (and may be submitted to) until
     * the caller gives it back with ep_close. */
    int (*ep_open)(kvs_transport_t *t, const char *endpoint, uint64_t deadline_ns,
                   kvs_endpoint_t **ep_p);
    /* Another reference to an endpoint the caller holds one of. */
    void (*ep_hold)(kvs_transport_t *t, kvs_endpoint_t *ep);
    /* Gives a reference back. With the last one the endpoint goes: its threads, sockets,
     * mappings and pinned memory are released (at once when no batch uses it, else when the
     * last batch using it has been waited for). */
    void (*ep_close)(kvs_transport_t *t, kvs_endpoint_t *ep);
    /* Registers local memory once; transports that need no registration accept anything. */
    int (*mem_reg)(kvs_transport_t *t, void *addr, size_t len);
    int (*mem_dereg)(kvs_transport_t *t, void *addr, size_t len);
    /* Starts every request of the batch; the requests array is borrowed until the wait. Any
     * setup it needs (a same-host handshake) ends by the deadline. */
    int (*submit)(kvs_transport_t *t, kvs_xfer_req_t *reqs, uint32_t n, uint64_t deadline_ns,
                  kvs_batch_t **batch_p);
    /* Waits for every request or the deadline (kvs__now_ns clock). At the deadline the rest
     * are cancelled and get TIMED_OUT; when it returns, no transfer of the batch can still
     * touch local memory. Frees the batch. Returns OK if all requests succeeded, else the
     * first failure. (shm: a copy to or from GPU memory cannot be cancelled once issued, at
     * submit or in the wait; the wait then lasts until it ends, and the request succeeds.) */
    int (*wait)(kvs_transport_t *t, kvs_batch_t *batch, uint64_t deadline_ns);
    void (*destroy)(kvs_transport_t *t);
} kvs_transport_ops_t;

struct kvs_transport {
    const kvs_transport_ops_t *ops;
};

/* Sum of iov lengths, or UINT64_MAX on overflow. */
uint64_t kvs__iov_total(const struct iovec *iov, uint32_t iovcnt);

/* One batch per transport for requests that go over several: the requests grouped (stably)
 * by transport, submitted together, waited for together. The caller provides the working
 * arrays (sub and back of n entries, tk of n bytes). */
#define KVS_XFER_MAX_TRANSPORTS 8u
typedef struct {
    kvs_xfer_req_t *sub; /* the requests, grouped: sub[start[k] .. start[k + 1]) on t[k] */
    uint32_t *back;      /* sub[q] is request back[q] */
    uint8_t *tk;         /* request r's transport index */
    uint32_t nt;
    kvs_transport_t *t[KVS_XFER_MAX_TRANSPORTS];
    kvs_batch_t *batch[KVS_XFER_MAX_TRANSPORTS];
    uint32_t start[KVS_XFER_MAX_TRANSPORTS + 1];
} kvs__xfer_group_t;

/* Groups reqs[0..n) (request r on ts[r]) and submits one batch per transport. UNSUPPORTED, with
 * nothing submitted, past KVS_XFER_MAX_TRANSPORTS transports; a submission that fails marks its
 * requests NO_MEMORY. */
int kvs__xfer_group_submit(kvs__xfer_group_t *g, const kvs_xfer_req_t *reqs,
                           kvs_transport_t *const *ts, uint32_t n, uint64_t deadline_ns);
/* Waits for every batch (each cancels at the deadline) and copies the statuses back into
 * reqs[]. */
void kvs__xfer_group_wait(kvs__xfer_group_t *g, kvs_xfer_req_t *reqs, uint64_t deadline_ns);

#endif
