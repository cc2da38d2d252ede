/* The Prometheus endpoint: GET /metrics over libmicrohttpd, whose own thread renders each scrape
 * from the registered sources (metrics_int.h). Without libmicrohttpd every start is refused
 * with a message that says how to get it. */
#include "metrics_int.h"

#include <stdio.h>
#include <string.h>

#define MAX_SOURCES 4

bool kvs__metrics_http_available(void)
{
#ifdef KVS_HAVE_HTTP
    return true;
#else
    return false;
#endif
}

#ifndef KVS_HAVE_HTTP

struct kvs__metrics_http {
    int unused;
};

int kvs__metrics_http_start(const char *bind_host, uint16_t port, kvs__metrics_http_t **srv_p)
{
    KVS_UNUSED(bind_host);
    if (srv_p != NULL)
        *srv_p = NULL;
    return kvs__fail(KVS_UNSUPPORTED,
                     "metrics endpoint (port %u): this build has no HTTP server; rebuild with "
                     "libmicrohttpd (Debian: libmicrohttpd-dev)",
                     (unsigned)port);
}

int kvs__metrics_http_add(kvs__metrics_http_t *srv, kvs__metrics_render_cb cb, void *arg)
{
    KVS_UNUSED(srv);
    KVS_UNUSED(cb);
    KVS_UNUSED(arg);
    return KVS_UNSUPPORTED;
}

uint16_t kvs__metrics_http_port(const kvs__metrics_http_t *srv)
{
    KVS_UNUSED(srv);
    return 0;
}

void kvs__metrics_http_stop(kvs__metrics_http_t *srv)
{
    KVS_UNUSED(srv);
}

#else

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

struct kvs__metrics_http {
    struct MHD_Daemon *d;
    uint16_t port;
    pthread_mutex_t lock; /* the sources */
    kvs__metrics_render_cb cbs[MAX_SOURCES];
    void *args[MAX_SOURCES];
    unsigned n;
};

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned code, kvs__text_t *t,
                              const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(
        t->len, t->p, kvs__free); /* takes the text */
    if (r == NULL) {
        kvs__text_free(t);
        return MHD_NO;
    }
    t->p = NULL;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    KVS_UNUSED(version);
    KVS_UNUSED(upload_data);
    KVS_UNUSED(req_cls);
    kvs__metrics_http_t *s = cls;
    kvs__text_t t = {0};
    const char *plain = "text/plain; charset=utf-8";
    if (*upload_data_size != 0) { /* a body is neither wanted nor read */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        kvs__text_printf(&t, "only GET is served\n");
        return t.failed ? MHD_NO : answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, &t, plain);
    }
    if (strcmp(url, "/metrics") != 0) {
        kvs__text_printf(&t, "kvstash serves its metrics at /metrics\n");
        return t.failed ? MHD_NO : answer(conn, MHD_HTTP_NOT_FOUND, &t, plain);
    }
    int rc = KVS_OK;
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->n && rc == KVS_OK; i++)
        rc = s->cbs[i](s->args[i], &t);
    pthread_mutex_unlock(&s->lock);
    if (rc != KVS_OK || t.failed) {
        kvs__text_free(&t);
        kvs__text_printf(&t, "cannot render the metrics now: %s\n", kvs_status_str(rc));
        return t.failed ? MHD_NO : answer(conn, MHD_HTTP_SERVICE_UNAVAILABLE, &t, plain);
    }
    kvs__text_printf(&t, "%s", ""); /* an empty scrape still needs a buffer */
    return t.failed ? MHD_NO : answer(conn, MHD_HTTP_OK, &t, "text/plain; version=0.0.4");
}

__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    KVS_UNUSED(cls);
    char msg[256];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    kvs_warn("metrics endpoint: %s", msg);
}

int kvs__metrics_http_start(const char *bind_host, uint16_t port, kvs__metrics_http_t **srv_p)
{
    if (srv_p == NULL)
        return kvs__fail(KVS_INVALID_PARAMS, "metrics endpoint: an output is required");
    *srv_p = NULL;
    /* An IPv4 or IPv6 address to listen on; NULL, "", 0.0.0.0: every IPv4 address. */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    bool v6 = false;
    if (bind_host != NULL && *bind_host != '\0' && strcmp(bind_host, "0.0.0.0") != 0) {
        const char *h = strcmp(bind_host, "localhost") == 0 ? "127.0.0.1" : bind_host;
        v6 = inet_pton(AF_INET6, h, &sa6.sin6_addr) == 1;
        if (!v6 && inet_pton(AF_INET, h, &sa.sin_addr) != 1)
            return kvs__fail(KVS_INVALID_PARAMS,
                             "metrics endpoint: '%s' is not an IPv4 or IPv6 address to listen on",
                             bind_host);
    }
    kvs__metrics_http_t *s = kvs__calloc(1, sizeof(*s));
    if (s == NULL)
        return kvs__fail(KVS_NO_MEMORY, "metrics endpoint: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    /* A scrape is tiny: one thread serves them all, and a peer that stalls is cut off. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
                            v6 ? (struct sockaddr *)&sa6 : (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (s->d == NULL) {
        pthread_mutex_destroy(&s->lock);
        kvs__free(s);
        return kvs__fail(KVS_IO_ERROR,
                         "metrics endpoint: cannot listen on %s:%u (in use, or not allowed)",
                         bind_host ? bind_host : "0.0.0.0", (unsigned)port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info != NULL ? info->port : port;
    *srv_p = s;
    return KVS_OK;
}

int kvs__metrics_http_add(kvs__metrics_http_t *s, kvs__metrics_render_cb cb, void *arg)
{
    if (s == NULL || cb == NULL)
        return KVS_INVALID_PARAMS;
    pthread_mutex_lock(&s->lock);
    int rc = s->n < MAX_SOURCES ? KVS_OK : KVS_NO_RESOURCE;
    if (rc == KVS_OK) {
        s->cbs[s->n] = cb;
        s->args[s->n++] = arg;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

uint16_t kvs__metrics_http_port(const kvs__metrics_http_t *s)
{
    return s != NULL ? s->port : 0;
}

void kvs__metrics_http_stop(kvs__metrics_http_t *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->lock);
    kvs__free(s);
}

#endif
