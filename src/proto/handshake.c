/* HELLO and AUTH: version negotiation and mutual authentication, both sides. */
#define _GNU_SOURCE
#include "net_int.h"

#include <string.h>

/* Handshake frames are small: a reply longer than this is not one. */
#define HANDSHAKE_MAX_PAYLOAD 4096u

/* ---- server side --------------------------------------------------------------------------- */

int kvs__auth_server_hello(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint, const char *name,
                           const kvs__hello_req_t *req, kvs__auth_pending_t *st,
                           kvs__hello_rsp_t *rsp)
{
    memset(st, 0, sizeof(*st));
    rsp->auth = KVS_HELLO_AUTH_NONE;
    rsp->auth_nonce = (kvs__blob_t){NULL, 0};
    rsp->auth_proof = (kvs__blob_t){NULL, 0};
    if (auth == NULL || !auth->on)
        return KVS_OK;
    if (req->auth_nonce.len != KVS_AUTH_NONCE_LEN)
        return KVS_AUTH_FAILED;
    st->required = true;
    memcpy(st->client_nonce, req->auth_nonce.ptr, KVS_AUTH_NONCE_LEN);
    kvs__auth_nonce(st->server_nonce);
    kvs__auth_proof(auth, endpoint, name, KVS_AUTH_BY_SERVER, st->client_nonce, st->server_nonce,
                    st->server_proof);
    rsp->auth = KVS_HELLO_AUTH_HMAC;
    rsp->auth_nonce = (kvs__blob_t){st->server_nonce, KVS_AUTH_NONCE_LEN};
    rsp->auth_proof = (kvs__blob_t){st->server_proof, KVS_AUTH_PROOF_LEN};
    return KVS_OK;
}

bool kvs__auth_server_verify(const kvs__auth_t *auth, kvs__auth_endpoint_t endpoint,
                             const char *name, const kvs__auth_pending_t *st,
                             const kvs__auth_req_t *req)
{
    return st->required &&
           kvs__auth_check(auth, endpoint, name, KVS_AUTH_BY_CLIENT, st->client_nonce,
                           st->server_nonce, req->proof.ptr, req->proof.len);
}

/* ---- client side --------------------------------------------------------------------------- */

/* Sends the frame in `w`, then receives the answer to it (its type, or ERROR) into `rsp`. An
 * ERROR becomes its status, explained in `why`. */
static int exchange(const kvs__io_t *io, kvs__wbuf_t *w, kvs__wbuf_t *rsp, uint64_t deadline,
                    char *why, size_t whylen)
{
    kvs__frame_hdr_t sent, h;
    uint8_t hb[KVS_FRAME_HDR_LEN];
    int rc = kvs__frame_end(w);
    if (rc == KVS_OK)
        rc = kvs__frame_hdr_decode(w->data, w->len, KVS_FRAME_MAX_PAYLOAD, &sent);
    if (rc != KVS_OK)
        return KVS_INTERNAL_ERROR;
    if ((rc = kvs__io_send_all(io, w->data, w->len, deadline)) != KVS_OK ||
        (rc = kvs__io_recv_all(io, hb, sizeof(hb), deadline)) != KVS_OK)
        return rc;
    if (kvs__frame_hdr_decode(hb, sizeof(hb), HANDSHAKE_MAX_PAYLOAD, &h) != KVS_OK ||
        (h.type != (sent.type | KVS_RSP_FLAG) && h.type != (KVS_MSG_ERROR | KVS_RSP_FLAG))) {
        snprintf(why, whylen, "an answer that is not a %s reply", kvs__msg_name(sent.type));
        return KVS_PROTOCOL_ERROR;
    }
    kvs__wbuf_reset(rsp);
    uint8_t *p = kvs__wbuf_grow(rsp, h.len);
    if (p == NULL && h.len > 0)
        return KVS_NO_MEMORY;
    if (h.len > 0 && (rc = kvs__io_recv_all(io, p, h.len, deadline)) != KVS_OK)
        return rc;
    rsp->version = h.version;
    if (h.type == (KVS_MSG_ERROR | KVS_RSP_FLAG)) {
        kvs__error_rsp_t e;
        if (kvs__error_rsp_decode(rsp->data, rsp->len, h.version, NULL, &e) != KVS_OK)
            return KVS_PROTOCOL_ERROR;
        snprintf(why, whylen, "%.*s", (int)e.message.len, e.message.ptr);
        return e.status < 0 ? e.status : KVS_PROTOCOL_ERROR;
    }
    return KVS_OK;
}

/* The AUTH step, after a HELLO reply that asked for it: checks the server's proof, then gives
 * ours. *client_id_p gets the id the server bound. */
static int client_auth(const kvs__io_t *io, const kvs__handshake_t *hs, const kvs__hello_rsp_t *hr,
                       const uint8_t cn[KVS_AUTH_NONCE_LEN], kvs__wbuf_t *w, kvs__wbuf_t *rsp,
                       uint64_t deadline, uint64_t *client_id_p, char *why, size_t whylen)
{
    if (hs->auth == NULL || !hs->auth->on) {
        snprintf(why, whylen,
                 "it requires authentication: give this process the cluster's "
                 "token (--auth-token-file, KVS_AUTH_TOKEN_FILE or auth_token_file)");
        return KVS_AUTH_FAILED;
    }
    if (hr->auth_nonce.len != KVS_AUTH_NONCE_LEN ||
        !kvs__auth_check(hs->auth, hs->endpoint, hs->server_name, KVS_AUTH_BY_SERVER, cn,
                         hr->auth_nonce.ptr, hr->auth_proof.ptr, hr->auth_proof.len)) {
        snprintf(why, whylen, "it could not prove it knows the token (a different token?)");
        return KVS_AUTH_FAILED;
    }
    uint8_t sn[KVS_AUTH_NONCE_LEN], proof[KVS_AUTH_PROOF_LEN];
    memcpy(sn, hr->auth_nonce.ptr, sizeof(sn)); /* hr points into rsp, reused below */
    kvs__auth_proof(hs->auth, hs->endpoint, hs->server_name, KVS_AUTH_BY_CLIENT, cn, sn, proof);
    kvs__frame_begin(w, KVS_MSG_AUTH, 0, hr->version);
    kvs__auth_req_t ar = {{proof, sizeof(proof)}};
    kvs__auth_req_encode(w, &ar);
    int rc = exchange(io, w, rsp, deadline, why, whylen);
    if (rc == KVS_AUTH_FAILED)
        snprintf(why + strlen(why), whylen - strlen(why), " (a different token?)");
    if (rc != KVS_OK)
        return rc;
    kvs__auth_rsp_t a;
    if (kvs__auth_rsp_decode(rsp->data, rsp->len, rsp->version, NULL, &a) != KVS_OK) {
        snprintf(why, whylen, "a malformed AUTH reply");
        return KVS_PROTOCOL_ERROR;
    }
    if (a.status != KVS_OK) {
        snprintf(why, whylen, "it refused our proof: %s", kvs_status_str(a.status));
        return a.status < 0 ? a.status : KVS_PROTOCOL_ERROR;
    }
    *client_id_p = a.client_id;
    return KVS_OK;
}

int kvs__client_handshake(const kvs__io_t *io, const kvs__handshake_t *hs, uint64_t deadline_ns,
                          kvs__hello_rsp_t *rsp_p)
{
    char why[256] = "";
    uint8_t cn[KVS_AUTH_NONCE_LEN];
    kvs__auth_nonce(cn);
    kvs__wbuf_t w, rsp;
    kvs__wbuf_init(&w);
    kvs__wbuf_init(&rsp);
    /* HELLO goes out in our highest version; the server answers in the one both speak. */
    kvs__frame_begin(&w, KVS_MSG_HELLO, 0, KVS_PROTO_VERSION_MAX);
    kvs__hello_req_t hello = {.version_min = KVS_PROTO_VERSION_MIN,
                              .version_max = KVS_PROTO_VERSION_MAX,
                              .node = kvs__str_c(hs->node),
                              .tenant = kvs__str_c(hs->tenant ? hs->tenant : ""),
                              .client_id = hs->client_id,
                              .auth_nonce = {cn, sizeof(cn)},
                              .next_probe = KVS_PROTO_VERSION_MAX};
    kvs__hello_req_encode(&w, &hello);
    int rc = exchange(io, &w, &rsp, deadline_ns, why, sizeof(why));
    kvs__hello_rsp_t h;
    if (rc == KVS_OK && kvs__hello_rsp_decode(rsp.data, rsp.len, rsp.version, NULL, &h) != KVS_OK) {
        snprintf(why, sizeof(why), "a malformed HELLO reply");
        rc = KVS_PROTOCOL_ERROR;
    }
    if (rc == KVS_OK && h.status != KVS_OK) {
        snprintf(why, sizeof(why), "HELLO refused: %s", kvs_status_str(h.status));
        rc = h.status < 0 ? h.status : KVS_PROTOCOL_ERROR;
    }
    if (rc == KVS_OK && (h.version != rsp.version || h.version < KVS_PROTO_VERSION_MIN ||
                         h.version > KVS_PROTO_VERSION_MAX)) {
        snprintf(why, sizeof(why), "it chose protocol version %u (this build speaks %u..%u)",
                 h.version, KVS_PROTO_VERSION_MIN, KVS_PROTO_VERSION_MAX);
        rc = KVS_INVALID_VERSION;
    }
    if (rc == KVS_OK && h.auth == KVS_HELLO_AUTH_HMAC) {
        rc = client_auth(io, hs, &h, cn, &w, &rsp, deadline_ns, &h.client_id, why, sizeof(why));
    } else if (rc == KVS_OK && h.auth != KVS_HELLO_AUTH_NONE) {
        snprintf(why, sizeof(why), "it asks for authentication method %u, unknown here", h.auth);
        rc = KVS_UNSUPPORTED;
    } else if (rc == KVS_OK && hs->auth != NULL && hs->auth->on) {
        /* With a token we trust only servers that prove it: one without could be anyone. */
        snprintf(why, sizeof(why), "it does not authenticate, and this process has a token");
        rc = KVS_AUTH_FAILED;
    }
    if (rc == KVS_IO_ERROR && hs->cut != NULL && hs->cut(hs->cut_arg))
        rc = KVS_TIMED_OUT; /* our own shutdown, not the peer closing: no TLS hint */
    if (rc == KVS_OK) {
        h.auth_nonce = h.auth_proof = (kvs__blob_t){NULL, 0}; /* pointed into rsp */
        *rsp_p = h;
    } else if (rc == KVS_IO_ERROR && io->ssl == NULL) {
        /* A TLS server drops a plain HELLO without a word. */
        kvs_warn("%s closed the connection during HELLO (a server started with --tls needs "
                 "KVS_TLS=1 here)",
                 hs->peer);
    } else if (rc == KVS_TIMED_OUT || rc == KVS_IO_ERROR) {
        kvs_debug("handshake with %s: %s", hs->peer, kvs_status_str(rc));
    } else {
        kvs_error("handshake with %s failed: %s (%s)", hs->peer, why[0] ? why : kvs_status_str(rc),
                  kvs_status_name(rc));
    }
    kvs__wbuf_free(&w);
    kvs__wbuf_free(&rsp);
    return rc;
}
