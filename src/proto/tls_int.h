/* Optional TLS for master RPC and tcp data (OpenSSL): TLS 1.3 with an external pre-shared key
 * derived from the cluster's token, so no certificates are needed and both sides prove the
 * token again inside the encrypted channel. The key exchange is (EC)DHE with the PSK
 * (psk_dhe_ke), so recorded traffic stays secret even if the token leaks later.
 *
 * Sockets are used through kvs__io_t, which is a plain socket when `ssl` is NULL: every
 * reader and writer of a connection goes through the same calls either way. */
#ifndef KVS_TLS_INT_H
#define KVS_TLS_INT_H

#include "../common/auth_int.h"

#include <poll.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct kvs__tls kvs__tls_t;

/* A TLS context of one side (server: accepts, client: connects) keyed by the token in `auth`
 * (which must be on). INVALID_PARAMS (no token: TLS needs one) or INTERNAL_ERROR with a
 * message in err. */
int kvs__tls_create(const kvs__auth_t *auth, bool server, kvs__tls_t **tls_p, char *err,
                    size_t errlen);
void kvs__tls_destroy(kvs__tls_t *tls);

/* A connection: its socket and, with TLS, its session (an SSL *). */
typedef struct {
    int fd;
    void *ssl;
} kvs__io_t;

/* Starts TLS on a connected socket and completes the handshake before the deadline (the
 * socket must be non-blocking; it stays so). OK with io_p->ssl set; AUTH_FAILED when the peer
 * has another token, RPC_FAIL when it speaks no TLS or closed, TIMED_OUT. */
int kvs__tls_handshake(kvs__tls_t *tls, int fd, uint64_t deadline_ns, kvs__io_t *io_p);
/* Frees the session (not the socket). A no-op on a plain connection. */
void kvs__io_free(kvs__io_t *io);

/* One send or receive step, like send(MSG_NOSIGNAL) and recv(): bytes moved (> 0), 0 when the
 * peer closed (recv), or -1 with errno set; EAGAIN (EWOULDBLOCK) then also gives in *want_p
 * the poll events to wait for (TLS may need to read to write, or the reverse). */
ssize_t kvs__io_send(const kvs__io_t *io, const void *buf, size_t len, short *want_p);
ssize_t kvs__io_recv(const kvs__io_t *io, void *buf, size_t len, short *want_p);
/* Scatter/gather forms: one sendmsg/recvmsg on a plain socket; with TLS, one step per
 * fragment until one moves less than asked. */
ssize_t kvs__io_sendv(const kvs__io_t *io, const struct iovec *iov, int cnt, short *want_p);
ssize_t kvs__io_recvv(const kvs__io_t *io, const struct iovec *iov, int cnt, short *want_p);
/* Whether received bytes wait inside TLS already (a poll on the socket would not see them). */
bool kvs__io_pending(const kvs__io_t *io);

/* Sends or receives exactly `len` bytes before the deadline on a non-blocking connection:
 * IO_ERROR when the peer closed or failed, TIMED_OUT at the deadline. */
int kvs__io_send_all(const kvs__io_t *io, const void *buf, size_t len, uint64_t deadline_ns);
int kvs__io_recv_all(const kvs__io_t *io, void *buf, size_t len, uint64_t deadline_ns);

#endif
