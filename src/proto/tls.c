/* TLS 1.3 over OpenSSL with a pre-shared key from the cluster's token, and the connection
 * calls (kvs__io_*) that read and write plain and TLS sockets alike. */
#define _GNU_SOURCE
#include "tls_int.h"
#include "net_int.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* The one suite both sides offer: its hash (SHA-256) is the PSK's. */
#define TLS_SUITE       "TLS_AES_128_GCM_SHA256"
#define TLS_PSK_ID      "kvstash-psk-1"
#define TLS_PSK_LABEL   "kvstash-tls-psk-1"
#define TLS_SUITE_ID_HI 0x13
#define TLS_SUITE_ID_LO 0x01

struct kvs__tls {
    SSL_CTX *ctx;
    bool server;
    uint8_t psk[32]; /* HMAC-SHA256(token key, label): never the token key itself */
};

/* ---- a socket BIO that never raises SIGPIPE ------------------------------------------------
 * OpenSSL's own socket BIO writes with write(), which raises SIGPIPE when the peer has gone;
 * a library must not kill its host process for that, so writes go through send(MSG_NOSIGNAL). */

static int bio_write(BIO *b, const char *buf, size_t len, size_t *written)
{
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t n;
    do /* a signal is no reason to give up (a retry would look like a time-out) */
        n = send(fd, buf, len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n >= 0) {
        *written = (size_t)n;
        return 1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_write(b);
    return 0;
}

static int bio_read(BIO *b, char *buf, size_t len, size_t *got)
{
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t n;
    do
        n = recv(fd, buf, len, 0);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        *got = (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        BIO_set_retry_read(b);
    return 0;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void bio_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kvstash socket");
    if (m != NULL && BIO_meth_set_write_ex(m, bio_write) == 1 &&
        BIO_meth_set_read_ex(m, bio_read) == 1 && BIO_meth_set_ctrl(m, bio_ctrl) == 1)
        bio_method = m;
    else
        BIO_meth_free(m);
}

/* ---- the pre-shared key ------------------------------------------------------------------- */

static SSL_SESSION *psk_session(SSL *ssl)
{
    const kvs__tls_t *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    static const unsigned char suite[2] = {TLS_SUITE_ID_HI, TLS_SUITE_ID_LO};
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, suite);
    SSL_SESSION *sess = cipher != NULL ? SSL_SESSION_new() : NULL;
    if (sess == NULL || SSL_SESSION_set1_master_key(sess, t->psk, sizeof(t->psk)) != 1 ||
        SSL_SESSION_set_cipher(sess, cipher) != 1 ||
        SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION) != 1) {
        SSL_SESSION_free(sess);
        return NULL;
    }
    return sess;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                   SSL_SESSION **sess)
{
    (void)md; /* the one suite offered is SHA-256's */
    *sess = psk_session(ssl);
    *id = (const unsigned char *)TLS_PSK_ID;
    *idlen = sizeof(TLS_PSK_ID) - 1;
    return *sess != NULL;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess)
{
    *sess = NULL;
    if (idlen == sizeof(TLS_PSK_ID) - 1 && memcmp(id, TLS_PSK_ID, idlen) == 0)
        *sess = psk_session(ssl);
    return 1; /* an unknown identity: no PSK, and with no certificate the handshake fails */
}

int kvs__tls_create(const kvs__auth_t *auth, bool server, kvs__tls_t **tls_p, char *err,
                    size_t errlen)
{
    if (auth == NULL || !auth->on) {
        snprintf(err, errlen,
                 "TLS needs the cluster's token (--auth-token-file or "
                 "KVS_AUTH_TOKEN_FILE): its key is derived from it");
        return KVS_INVALID_PARAMS;
    }
    pthread_once(&bio_once, bio_method_init);
    kvs__tls_t *t = kvs__calloc(1, sizeof(*t));
    if (t == NULL)
        return KVS_NO_MEMORY;
    t->server = server;
    unsigned int n = sizeof(t->psk);
    SSL_CTX *ctx =
        bio_method != NULL ? SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()) : NULL;
    t->ctx = ctx;
    if (ctx == NULL ||
        HMAC(EVP_sha256(), auth->key, sizeof(auth->key), (const uint8_t *)TLS_PSK_LABEL,
             sizeof(TLS_PSK_LABEL) - 1, t->psk, &n) == NULL ||
        SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_ciphersuites(ctx, TLS_SUITE) != 1) {
        snprintf(err, errlen, "cannot set up TLS: %s", ERR_reason_error_string(ERR_get_error()));
        kvs__tls_destroy(t);
        return KVS_INTERNAL_ERROR;
    }
    SSL_CTX_set_app_data(ctx, t);
    /* No tickets and no cache: every connection proves the PSK afresh, and nothing arrives
     * unasked after the handshake. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (server) {
        SSL_CTX_set_psk_find_session_callback(ctx, psk_find);
    } else {
        SSL_CTX_set_psk_use_session_callback(ctx, psk_use);
        /* Verify a certificate against no trust store: a server that answers with one instead
         * of the PSK (anyone can make one) fails the handshake. */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    *tls_p = t;
    return KVS_OK;
}

void kvs__tls_destroy(kvs__tls_t *tls)
{
    if (tls == NULL)
        return;
    SSL_CTX_free(tls->ctx);
    OPENSSL_cleanse(tls->psk, sizeof(tls->psk));
    kvs__free(tls);
}

/* ---- connections --------------------------------------------------------------------------- */

void kvs__io_free(kvs__io_t *io)
{
    if (io->ssl != NULL)
        SSL_free(io->ssl);
    io->ssl = NULL;
}

/* Maps the outcome of an SSL call that did not succeed to errno (and the events to wait for):
 * -1 with EAGAIN, 0 for a clean close, -1 with ECONNRESET for anything else. */
static ssize_t ssl_failed(SSL *ssl, int ret, short *want_p)
{
    switch (SSL_get_error(ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        *want_p = POLLIN;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        *want_p = POLLOUT;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    default:
        ERR_clear_error();
        errno = ECONNRESET;
        return -1;
    }
}

ssize_t kvs__io_send(const kvs__io_t *io, const void *buf, size_t len, short *want_p)
{
    if (io->ssl == NULL) {
        ssize_t n = send(io->fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            *want_p = POLLOUT;
        return n;
    }
    size_t done = 0;
    ERR_clear_error();
    int ret = SSL_write_ex(io->ssl, buf, len, &done);
    if (ret == 1)
        return (ssize_t)done;
    ssize_t r = ssl_failed(io->ssl, ret, want_p);
    if (r == 0) {
        errno = EPIPE; /* the peer closed: a write cannot go */
        return -1;
    }
    return r;
}

ssize_t kvs__io_recv(const kvs__io_t *io, void *buf, size_t len, short *want_p)
{
    if (io->ssl == NULL) {
        ssize_t n = recv(io->fd, buf, len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            *want_p = POLLIN;
        return n;
    }
    size_t done = 0;
    ERR_clear_error();
    int ret = SSL_read_ex(io->ssl, buf, len, &done);
    if (ret == 1)
        return (ssize_t)done;
    return ssl_failed(io->ssl, ret, want_p);
}

/* One step per fragment with TLS: records are encrypted one by one anyway. */
static ssize_t io_vec(const kvs__io_t *io, const struct iovec *iov, int cnt, bool send_p,
                      short *want_p)
{
    if (io->ssl == NULL) {
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt};
        ssize_t n = send_p ? sendmsg(io->fd, &mh, MSG_NOSIGNAL) : recvmsg(io->fd, &mh, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            *want_p = send_p ? POLLOUT : POLLIN;
        return n;
    }
    ssize_t total = 0;
    for (int i = 0; i < cnt; i++) {
        if (iov[i].iov_len == 0)
            continue;
        ssize_t n = send_p ? kvs__io_send(io, iov[i].iov_base, iov[i].iov_len, want_p)
                           : kvs__io_recv(io, iov[i].iov_base, iov[i].iov_len, want_p);
        if (n <= 0)
            return total > 0 ? total : n;
        total += n;
        if ((size_t)n < iov[i].iov_len)
            break;
    }
    return total;
}

ssize_t kvs__io_sendv(const kvs__io_t *io, const struct iovec *iov, int cnt, short *want_p)
{
    return io_vec(io, iov, cnt, true, want_p);
}

ssize_t kvs__io_recvv(const kvs__io_t *io, const struct iovec *iov, int cnt, short *want_p)
{
    return io_vec(io, iov, cnt, false, want_p);
}

bool kvs__io_pending(const kvs__io_t *io)
{
    return io->ssl != NULL && SSL_pending(io->ssl) > 0;
}

int kvs__io_send_all(const kvs__io_t *io, const void *buf, size_t len, uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        short want = POLLOUT;
        ssize_t n = kvs__io_send(io, p, len, &want);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = kvs__wait_fd(io->fd, want, deadline_ns);
            if (rc != KVS_OK)
                return rc;
        } else if (!(n < 0 && errno == EINTR)) {
            return KVS_IO_ERROR;
        }
    }
    return KVS_OK;
}

int kvs__io_recv_all(const kvs__io_t *io, void *buf, size_t len, uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        short want = POLLIN;
        ssize_t n = kvs__io_recv(io, p, len, &want);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return KVS_IO_ERROR;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = kvs__wait_fd(io->fd, want, deadline_ns);
            if (rc != KVS_OK)
                return rc;
        } else if (errno != EINTR) {
            return KVS_IO_ERROR;
        }
    }
    return KVS_OK;
}

int kvs__tls_handshake(kvs__tls_t *tls, int fd, uint64_t deadline_ns, kvs__io_t *io_p)
{
    SSL *ssl = SSL_new(tls->ctx);
    BIO *bio = ssl != NULL ? BIO_new(bio_method) : NULL;
    if (bio == NULL) {
        SSL_free(ssl);
        return KVS_NO_MEMORY;
    }
    BIO_set_data(bio, (void *)(intptr_t)fd);
    BIO_set_init(bio, 1);
    SSL_set_bio(ssl, bio, bio);
    if (tls->server)
        SSL_set_accept_state(ssl);
    else
        SSL_set_connect_state(ssl);
    kvs__io_t io = {fd, ssl};
    if (deadline_ns == 0) { /* started only: the caller's reads and writes complete it */
        *io_p = io;
        return KVS_OK;
    }
    for (;;) {
        ERR_clear_error();
        int ret = SSL_do_handshake(ssl);
        if (ret == 1 && !SSL_session_reused(ssl)) {
            /* Only the PSK proves the peer: a handshake that did not use it proves nothing. */
            kvs_debug("TLS handshake without the pre-shared key: refused");
            SSL_free(ssl);
            return KVS_AUTH_FAILED;
        }
        if (ret == 1) {
            *io_p = io;
            return KVS_OK;
        }
        int e = SSL_get_error(ssl, ret);
        int rc = KVS_RPC_FAIL;
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            rc = kvs__wait_fd(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ns);
            if (rc == KVS_OK)
                continue;
        } else {
            unsigned long why = ERR_peek_last_error();
            /* An alert from a peer that speaks TLS means it refused our key: another token. */
            bool alert = why != 0 && ERR_GET_LIB(why) == ERR_LIB_SSL &&
                         ERR_GET_REASON(why) >= SSL_AD_REASON_OFFSET;
            kvs_debug("TLS handshake failed: %s",
                      why ? ERR_reason_error_string(why) : "the peer closed");
            ERR_clear_error();
            rc = alert ? KVS_AUTH_FAILED : KVS_RPC_FAIL;
        }
        SSL_free(ssl);
        return rc;
    }
}
