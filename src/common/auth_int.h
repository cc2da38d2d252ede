/* Shared-secret authentication of peers, and write capabilities, over HMAC-SHA256 from
 * OpenSSL's libcrypto (no cryptography is written here).
 *
 * A handshake proves to each side that the other knows the secret: the client sends a fresh
 * nonce in HELLO; the server answers with its own fresh nonce and a proof over both; the
 * client checks it and sends its proof over both in AUTH. Proofs name the endpoint and the
 * side that made them, so a proof taken from one connection is worthless on another (its
 * nonces differ) and a server's proof is never a client's. */
#ifndef KVS_AUTH_INT_H
#define KVS_AUTH_INT_H

#include "common_int.h"

#define KVS_AUTH_NONCE_LEN 32u
#define KVS_AUTH_PROOF_LEN 32u
/* The secret file: at least this many bytes (after trailing white space is dropped), at most
 * KVS_AUTH_TOKEN_MAX. */
#define KVS_AUTH_TOKEN_MIN 16u
#define KVS_AUTH_TOKEN_MAX 4096u

/* The secret, as the key its HMACs use (SHA-256 of the token file's contents). Plain data:
 * copied into every configuration that needs it. */
typedef struct {
    bool on;         /* false: no secret configured (peers are not authenticated) */
    uint8_t key[32]; /* SHA-256 of the token */
} kvs__auth_t;

/* Where a proof is used: a proof for one endpoint never passes on another. */
typedef enum {
    KVS_AUTH_MASTER = 1, /* master RPC */
    KVS_AUTH_DATA = 2,   /* an owner's tcp data port */
    KVS_AUTH_SHM = 3,    /* an owner's shm socket */
} kvs__auth_endpoint_t;

typedef enum { KVS_AUTH_BY_CLIENT = 1, KVS_AUTH_BY_SERVER = 2 } kvs__auth_side_t;

/* Loads the secret from `path`: a regular file of this user (or root) that no one else may
 * read or write (mode 0600 or 0400), holding KVS_AUTH_TOKEN_MIN..KVS_AUTH_TOKEN_MAX bytes.
 * INVALID_PARAMS with a message in err (always NUL-terminated) otherwise; *auth_p is written
 * only on success. */
int kvs__auth_load(const char *path, kvs__auth_t *auth_p, char *err, size_t errlen);

/* The secret a process is configured with: `path` when not NULL, else $KVS_AUTH_TOKEN_FILE;
 * neither (or an empty one) gives auth_p->on = false and OK. Errors as kvs__auth_load. */
int kvs__auth_configure(const char *path, kvs__auth_t *auth_p, char *err, size_t errlen);

/* Wipes a secret from memory (a copy going away). NULL is a no-op. */
void kvs__auth_wipe(kvs__auth_t *auth);
/* The same for any key bytes. */
void kvs__secret_wipe(void *p, size_t len);

/* Fills a fresh nonce (the kernel's CSPRNG). */
void kvs__auth_nonce(uint8_t nonce[KVS_AUTH_NONCE_LEN]);

/* Frees the calling thread's libcrypto state (TLS sessions and MACs leave some). A detached
 * thread calls it before it reports itself done, so that a process exiting once every such
 * thread is done finds nothing of theirs left. */
void kvs__crypto_thread_end(void);

/* The proof `side` gives on `endpoint` for the client's and the server's nonces, naming the
 * server by `name` (the endpoint its clients dial, "host:port"; NULL or "" for none), so that a
 * relay listening elsewhere cannot pass a server's proof off as its own. */
void kvs__auth_proof(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                     kvs__auth_side_t side, const uint8_t client_nonce[KVS_AUTH_NONCE_LEN],
                     const uint8_t server_nonce[KVS_AUTH_NONCE_LEN],
                     uint8_t proof[KVS_AUTH_PROOF_LEN]);

/* Whether `proof` (of `len` bytes, as received) is the one expected; constant time. */
bool kvs__auth_check(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                     kvs__auth_side_t side, const uint8_t client_nonce[KVS_AUTH_NONCE_LEN],
                     const uint8_t server_nonce[KVS_AUTH_NONCE_LEN], const void *proof, size_t len);

/* ---- write capabilities ------------------------------------------------------------------
 * Each segment has a random write key, made by its owner at mount and told only to the master.
 * For every replica of a put the master gives the writer a capability: a MAC (SipHash-2-4 from
 * libcrypto: a 64-bit PRF made for short inputs, 0.14 us against 0.5 us for HMAC-SHA256) of
 * the segment, the allocated range and the put's token under that key. The owner accepts a
 * write only inside the range its capability names, so a writer can write only where the
 * master placed its own open puts. */
#define KVS_WRITE_KEY_LEN 16u

void kvs__write_key_new(uint8_t key[KVS_WRITE_KEY_LEN]);

/* A keyed MAC context for capabilities: one thread at a time. */
typedef struct kvs__cap_ctx kvs__cap_ctx_t;
/* NO_MEMORY (or INTERNAL_ERROR without SipHash in libcrypto); *ctx_p only on success. */
int kvs__cap_ctx_new(const uint8_t key[KVS_WRITE_KEY_LEN], kvs__cap_ctx_t **ctx_p);
int kvs__cap_ctx_rekey(kvs__cap_ctx_t *ctx, const uint8_t key[KVS_WRITE_KEY_LEN]);
void kvs__cap_ctx_free(kvs__cap_ctx_t *ctx);
/* The capability (never 0) for [offset, offset + size) of segment `segment_id`, `token`, made
 * in capability epoch `epoch`; 0 when libcrypto fails (never a valid capability). */
uint64_t kvs__cap_ctx_compute(kvs__cap_ctx_t *ctx, uint64_t segment_id, uint64_t offset,
                              uint64_t size, uint64_t token, uint64_t epoch);
/* The same in one call (a context made and freed): tests and one-off uses. */
uint64_t kvs__write_cap(const uint8_t key[KVS_WRITE_KEY_LEN], uint64_t segment_id, uint64_t offset,
                        uint64_t size, uint64_t token, uint64_t epoch);

/* HMAC-SHA256 of known answers (RFC 4231 case 2), for tests: OK when libcrypto computes it. */
int kvs__auth_selftest(void);

#endif
