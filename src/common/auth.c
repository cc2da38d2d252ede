/* Shared-secret authentication and write capabilities: HMAC-SHA256 from libcrypto. */
#define _GNU_SOURCE
#include "auth_int.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((format(printf, 3, 4))) static void err_set(char *err, size_t errlen, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err != NULL && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The file's bytes (at most KVS_AUTH_TOKEN_MAX + 1 read, to see an oversized one). */
static int read_token(int fd, uint8_t *buf, size_t cap, size_t *len_p)
{
    size_t len = 0;
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return KVS_IO_ERROR;
        }
        len += (size_t)n;
    }
    *len_p = len;
    return KVS_OK;
}

int kvs__auth_load(const char *path, kvs__auth_t *auth_p, char *err, size_t errlen)
{
    if (path == NULL || *path == '\0' || auth_p == NULL) {
        err_set(err, errlen, "%s%s", "", "no token file given");
        return KVS_INVALID_PARAMS;
    }
    /* Non-blocking: a FIFO (or a device) must not hang the caller before it is refused. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        err_set(err, errlen, "cannot open the token file %s: %s", path, strerror(errno));
        return KVS_INVALID_PARAMS;
    }
    struct stat st;
    int rc = KVS_INVALID_PARAMS;
    uint8_t buf[KVS_AUTH_TOKEN_MAX + 1];
    size_t len = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err_set(err, errlen, "the token file %s %s", path, "is not a regular file");
    } else if (st.st_uid != geteuid() && st.st_uid != 0) {
        err_set(err, errlen, "the token file %s %s", path, "belongs to another user");
    } else if (st.st_size > (off_t)KVS_AUTH_TOKEN_MAX + 64) {
        err_set(err, errlen, "the token file %s %s", path, "is longer than 4096 bytes");
    } else if ((st.st_mode & 077) != 0) {
        err_set(err, errlen, "the token file %s %s", path,
                "may be read or written by others (chmod 600 it)");
    } else if (read_token(fd, buf, sizeof(buf), &len) != KVS_OK) {
        err_set(err, errlen, "cannot read the token file %s: %s", path, strerror(errno));
    } else {
        /* A trailing newline (echo, an editor) is not part of the secret. */
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                           buf[len - 1] == '\t'))
            len--;
        if (len > KVS_AUTH_TOKEN_MAX)
            err_set(err, errlen, "the token file %s %s", path, "is longer than 4096 bytes");
        else if (len < KVS_AUTH_TOKEN_MIN)
            err_set(err, errlen, "the token file %s %s", path,
                    "holds fewer than 16 bytes (use e.g. `openssl rand -hex 32`)");
        else
            rc = KVS_OK;
    }
    close(fd);
    if (rc == KVS_OK) {
        auth_p->on = true;
        SHA256(buf, len, auth_p->key);
    }
    OPENSSL_cleanse(buf, sizeof(buf));
    return rc;
}

int kvs__auth_configure(const char *path, kvs__auth_t *auth_p, char *err, size_t errlen)
{
    if (auth_p == NULL)
        return KVS_INVALID_PARAMS;
    if (path == NULL)
        path = getenv("KVS_AUTH_TOKEN_FILE");
    if (path == NULL || *path == '\0') {
        *auth_p = (kvs__auth_t){.on = false};
        return KVS_OK;
    }
    return kvs__auth_load(path, auth_p, err, errlen);
}

/* Nonces and keys come from the kernel's CSPRNG (getrandom, which blocks only until it is
 * seeded at boot). Not OpenSSL's RAND_bytes: that keeps a generator per thread, freed when the
 * thread ends, and a detached handshake thread still ending while the process exits left it
 * behind (LeakSanitizer caught it in test_lifetimes). It failing is fatal: a predictable nonce or
 * key would be a silent hole. */
static void random_bytes(void *buf, size_t len)
{
    int fd = -1; /* /dev/urandom where getrandom is not allowed (a seccomp filter, an old kernel) */
    for (size_t got = 0; got < len;) {
        ssize_t n = fd < 0 ? getrandom((char *)buf + got, len - got, 0)
                           : read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && fd < 0 && (errno == ENOSYS || errno == EPERM) &&
            (fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)) >= 0)
            continue;
        if (n <= 0) {
            kvs_error("no random bytes from the kernel (%s): refusing to go on without them",
                      n < 0 ? strerror(errno) : "end of file");
            abort();
        }
        got += (size_t)n;
    }
    if (fd >= 0)
        close(fd);
}

void kvs__crypto_thread_end(void)
{
    OPENSSL_thread_stop();
}

void kvs__secret_wipe(void *p, size_t len)
{
    if (p != NULL)
        OPENSSL_cleanse(p, len);
}

void kvs__auth_wipe(kvs__auth_t *auth)
{
    if (auth != NULL)
        OPENSSL_cleanse(auth, sizeof(*auth));
}

void kvs__auth_nonce(uint8_t nonce[KVS_AUTH_NONCE_LEN])
{
    random_bytes(nonce, KVS_AUTH_NONCE_LEN);
}

void kvs__write_key_new(uint8_t key[KVS_WRITE_KEY_LEN])
{
    random_bytes(key, KVS_WRITE_KEY_LEN);
}

static void le64(uint8_t *p, uint64_t v)
{
    for (unsigned i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void hmac(const uint8_t key[32], const void *msg, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    if (HMAC(EVP_sha256(), key, 32, msg, len, out, &n) == NULL || n != 32)
        memset(out, 0, 32); /* cannot happen with SHA-256; a zero proof never matches */
}

/* What a proof covers: a label, the endpoint, the side, the server's name (u16 length, then
 * its bytes), then both nonces. */
#define PROOF_LABEL    "kvstash-auth-1"
#define PROOF_NAME_MAX 1024u

void kvs__auth_proof(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                     kvs__auth_side_t side, const uint8_t client_nonce[KVS_AUTH_NONCE_LEN],
                     const uint8_t server_nonce[KVS_AUTH_NONCE_LEN],
                     uint8_t proof[KVS_AUTH_PROOF_LEN])
{
    uint8_t in[sizeof(PROOF_LABEL) + 4 + PROOF_NAME_MAX + 2 * KVS_AUTH_NONCE_LEN], *p = in;
    size_t nlen = name != NULL ? strnlen(name, PROOF_NAME_MAX) : 0;
    memcpy(p, PROOF_LABEL, sizeof(PROOF_LABEL)); /* with its NUL */
    p += sizeof(PROOF_LABEL);
    *p++ = (uint8_t)endpoint;
    *p++ = (uint8_t)side;
    *p++ = (uint8_t)nlen;
    *p++ = (uint8_t)(nlen >> 8);
    memcpy(p, name != NULL ? name : "", nlen);
    p += nlen;
    memcpy(p, client_nonce, KVS_AUTH_NONCE_LEN);
    p += KVS_AUTH_NONCE_LEN;
    memcpy(p, server_nonce, KVS_AUTH_NONCE_LEN);
    p += KVS_AUTH_NONCE_LEN;
    hmac(auth->key, in, (size_t)(p - in), proof);
}

bool kvs__auth_check(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                     kvs__auth_side_t side, const uint8_t client_nonce[KVS_AUTH_NONCE_LEN],
                     const uint8_t server_nonce[KVS_AUTH_NONCE_LEN], const void *proof, size_t len)
{
    if (auth == NULL || !auth->on || proof == NULL || len != KVS_AUTH_PROOF_LEN)
        return false;
    uint8_t want[KVS_AUTH_PROOF_LEN];
    kvs__auth_proof(auth, endpoint, name, side, client_nonce, server_nonce, want);
    return CRYPTO_memcmp(want, proof, KVS_AUTH_PROOF_LEN) == 0;
}

struct kvs__cap_ctx {
    EVP_MAC_CTX *mac;
};

int kvs__cap_ctx_rekey(kvs__cap_ctx_t *ctx, const uint8_t key[KVS_WRITE_KEY_LEN])
{
    size_t size = 8;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size),
                           OSSL_PARAM_construct_end()};
    return EVP_MAC_init(ctx->mac, key, KVS_WRITE_KEY_LEN, params) == 1 ? KVS_OK
                                                                       : KVS_INTERNAL_ERROR;
}

int kvs__cap_ctx_new(const uint8_t key[KVS_WRITE_KEY_LEN], kvs__cap_ctx_t **ctx_p)
{
    kvs__cap_ctx_t *c = kvs__calloc(1, sizeof(*c));
    if (c == NULL)
        return KVS_NO_MEMORY;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
    c->mac = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac); /* the context holds its own reference */
    if (c->mac == NULL || kvs__cap_ctx_rekey(c, key) != KVS_OK) {
        kvs__cap_ctx_free(c);
        return KVS_INTERNAL_ERROR;
    }
    *ctx_p = c;
    return KVS_OK;
}

void kvs__cap_ctx_free(kvs__cap_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    EVP_MAC_CTX_free(ctx->mac);
    kvs__free(ctx);
}

uint64_t kvs__cap_ctx_compute(kvs__cap_ctx_t *ctx, uint64_t segment_id, uint64_t offset,
                              uint64_t size, uint64_t token, uint64_t epoch)
{
    static const char label[] = "kvstash-write-1";
    uint8_t in[sizeof(label) + 40], out[8];
    size_t n = 0;
    memcpy(in, label, sizeof(label));
    le64(in + sizeof(label), segment_id);
    le64(in + sizeof(label) + 8, offset);
    le64(in + sizeof(label) + 16, size);
    le64(in + sizeof(label) + 24, token);
    le64(in + sizeof(label) + 32, epoch);
    /* Re-initialising with no key keeps the key and starts a new message. */
    if (EVP_MAC_init(ctx->mac, NULL, 0, NULL) != 1 ||
        EVP_MAC_update(ctx->mac, in, sizeof(in)) != 1 ||
        EVP_MAC_final(ctx->mac, out, &n, sizeof(out)) != 1 || n != sizeof(out))
        return 0;
    uint64_t cap = 0;
    for (unsigned i = 0; i < 8; i++)
        cap |= (uint64_t)out[i] << (8 * i);
    return cap ? cap : 1;
}

uint64_t kvs__write_cap(const uint8_t key[KVS_WRITE_KEY_LEN], uint64_t segment_id, uint64_t offset,
                        uint64_t size, uint64_t token, uint64_t epoch)
{
    kvs__cap_ctx_t *c;
    if (kvs__cap_ctx_new(key, &c) != KVS_OK)
        return 0;
    uint64_t cap = kvs__cap_ctx_compute(c, segment_id, offset, size, token, epoch);
    kvs__cap_ctx_free(c);
    return cap;
}

int kvs__auth_selftest(void)
{
    /* RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?". */
    static const uint8_t want[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e,
                                     0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                                     0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83,
                                     0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    static const char data[] = "what do ya want for nothing?";
    uint8_t out[32];
    unsigned int n = 32;
    if (HMAC(EVP_sha256(), "Jefe", 4, (const uint8_t *)data, sizeof(data) - 1, out, &n) == NULL ||
        n != 32)
        return KVS_INTERNAL_ERROR;
    return memcmp(out, want, 32) == 0 ? KVS_OK : KVS_INTERNAL_ERROR;
}
