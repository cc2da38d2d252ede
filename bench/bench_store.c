/* `kvstash bench store`: the store benchmark of DESIGN §5. For each topology (shm, tcp), key
 * layout and reader count it starts a fresh store process (owner + embedded master) and fresh
 * reader processes per round, each reader with its own GPU where there are enough, its own
 * clients, staging buffer and keys; the readers put their keys, then time the four read modes
 * (direct, grouped, staged, grouped staged) in rotating order on the same data, all readers
 * released together by a barrier before every timed call, and every read checked byte for byte
 * (on the GPU for device pages). Before the matrix the same run measures the limits: pinned
 * host-to-device copies with every reader GPU busy at once, and raw loopback TCP with the
 * transport's connection count per reader, sent from a buffer as large as the data set. The
 * report is the median over rounds of per-round medians, beside the limit; a table, a CSV and a
 * plot. A second experiment runs 1, 2, 4 threads of one reader on one staged client, with and
 * without MC_STORE_GPU_STAGING_BUSY_WAIT_US.
 *
 * Processes: the coordinator never touches CUDA (readers are forked from it, so it must not);
 * readers and the raw-socket sender are forked children, the store is kvstash-server. */
#define _GNU_SOURCE
#include "common/common_int.h"
#include "tools/cli_int.h"
#include "transport/tcp/tcp_int.h"

#include <kvstash/kvstash.h>

#ifdef KVS_HAVE_CUDA
#include "bench_check.h"

#include <cuda_runtime_api.h>
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_READERS 16
#define MAX_SAMPLES 64
#define MAX_LIST    8
#define LIMIT_REPS  5
#define NMODES      5

/* Modes from M_STAGED on use the staged client. Page-table staged reads the same pages through
 * kvs_client_batch_get_into_pages (one region, the pool, and page ids): only layouts whose
 * objects are whole pages (size a multiple of --fragment-size) have it. */
enum { M_DIRECT, M_GROUPED, M_STAGED, M_GSTAGED, M_PSTAGED };
static const char *const mode_name[NMODES] = {"direct", "grouped", "staged", "grouped staged",
                                              "page-table staged"};

typedef struct {
    uint64_t keys, size;
} layout_t;

typedef struct {
    const char *topo[2];
    unsigned ntopo;
    layout_t layout[MAX_LIST];
    unsigned nlayout;
    unsigned readers[MAX_LIST], nreaders;
    unsigned threads[MAX_LIST], nthreads;
    uint64_t rounds, samples, direct_samples, frag, busy_wait_us, timeout_s, seed;
    bool host; /* host destinations (no GPU) */
    const char *server, *csv, *table, *plot;
    const char *etcd; /* the store's master is a leader candidate there; readers follow it */
    unsigned conns;   /* tcp connections per reader, the transport's setting */
} opts_t;

/* ---- state shared with the children (one anonymous shared mapping) ------------------------ */

typedef struct {
    double ms[NMODES][MAX_SAMPLES];
    uint32_t n[NMODES];
    uint64_t plan_ns[NMODES], plan_frags[NMODES], calls[NMODES], lookup_ns[NMODES];
    double limit_ms[LIMIT_REPS];
    char err[256];
} reader_out_t;

typedef struct {
    double lat_ms[MAX_READERS * MAX_SAMPLES];
    uint64_t calls, busy, staged;
} threads_out_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned parties, count, gen;
    atomic_int abort;
    int ngpu;
    uint16_t raw_port;
    reader_out_t out[MAX_READERS];
    threads_out_t thr[MAX_LIST][2];
} shared_t;

static shared_t *sh;

static shared_t *shared_create(void)
{
    shared_t *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        return NULL;
    memset(s, 0, sizeof(*s));
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s->mu, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    return s;
}

/* Resets the barrier and the readers' results for a new group of `parties` processes. */
static void shared_reset(unsigned parties)
{
    sh->parties = parties;
    sh->count = 0;
    sh->gen = 0;
    atomic_store(&sh->abort, 0);
    memset(sh->out, 0, sizeof(sh->out));
}

/* Waits until every reader of the group arrives; false when one failed or time ran out. */
static bool barrier(uint64_t timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)timeout_s;
    pthread_mutex_lock(&sh->mu);
    unsigned gen = sh->gen;
    if (++sh->count == sh->parties) {
        sh->count = 0;
        sh->gen++;
        pthread_cond_broadcast(&sh->cv);
    }
    int rc = 0;
    while (gen == sh->gen && !atomic_load(&sh->abort) && rc == 0)
        rc = pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    bool ok = gen != sh->gen;
    pthread_mutex_unlock(&sh->mu);
    return ok;
}

static void set_abort(void)
{
    pthread_mutex_lock(&sh->mu);
    atomic_store(&sh->abort, 1);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

/* A child's failure: its message (for the coordinator to print) and exit status 1. */
static int child_fail(unsigned r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int child_fail(unsigned r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->out[r].err, sizeof(sh->out[r].err), fmt, ap);
    va_end(ap);
    set_abort();
    return 1;
}

/* Runs fn(r, arg) in n forked children and waits for all; false (messages printed) if any
 * failed. A failure aborts the others' barriers. */
static bool run_children(unsigned n, int (*fn)(unsigned, void *), void *arg)
{
    shared_reset(n);
    pid_t pid[MAX_READERS];
    fflush(NULL);
    for (unsigned r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0)
            _exit(fn(r, arg));
        if (pid[r] < 0) {
            fprintf(stderr, "kvstash bench store: fork: %s\n", strerror(errno));
            set_abort();
            n = r;
        }
    }
    bool ok = n > 0;
    for (unsigned r = 0; r < n; r++) {
        int status = 0;
        while (waitpid(pid[r], &status, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            ok = false;
            set_abort();
            fprintf(stderr, "kvstash bench store: process %u failed: %s\n", r,
                    sh->out[r].err[0]     ? sh->out[r].err
                    : WIFSIGNALED(status) ? strsignal(WTERMSIG(status))
                                          : "no message");
        }
    }
    return ok;
}

/* ---- memory of a reader: host, or its GPU ------------------------------------------------- */

typedef struct {
    bool host;
    int gpu;
} mem_t;

static int mem_setup(const mem_t *m)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host)
        return cudaSetDevice(m->gpu) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

static void *mem_alloc(const mem_t *m, uint64_t bytes)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host) {
        void *p = NULL;
        return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
    }
#endif
    (void)m;
    void *p = NULL;
    return posix_memalign(&p, 4096, bytes) == 0 ? p : NULL;
}

static void mem_free(const mem_t *m, void *p)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host) {
        cudaFree(p);
        return;
    }
#endif
    (void)m;
    free(p);
}

static int mem_clear(const mem_t *m, void *p, uint64_t bytes)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host)
        return cudaMemset(p, 0, bytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess
                   ? 0
                   : -1;
#endif
    (void)m;
    memset(p, 0, bytes);
    return 0;
}

/* Pinned host memory for the copy limit on GPUs; plain memory otherwise. */
static void *host_alloc(const mem_t *m, uint64_t bytes)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host) {
        void *p = NULL;
        return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
    }
#endif
    return mem_alloc(m, bytes);
}

static void host_free(const mem_t *m, void *p)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host) {
        cudaFreeHost(p);
        return;
    }
#endif
    mem_free(m, p);
}

/* One copy of `bytes` from host memory to the reader's memory, waited for. */
static int mem_upload(const mem_t *m, void *dst, const void *src, uint64_t bytes)
{
#ifdef KVS_HAVE_CUDA
    if (!m->host)
        return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    memcpy(dst, src, bytes);
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------------------
 */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, unsigned n)
{
    if (n == 0)
        return 0;
    double t[MAX_SAMPLES * MAX_READERS];
    memcpy(t, v, n * sizeof(*t));
    qsort(t, n, sizeof(*t), cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Distinct bytes per reader, round and position, so a misplaced page cannot pass the check. */
static void fill_pattern(char *p, uint64_t bytes, uint64_t seed)
{
    uint64_t *w = (uint64_t *)p;
    for (uint64_t i = 0; i < bytes / 8; i++)
        w[i] = mix64(seed ^ (i * 0x100000001b3ull));
    for (uint64_t i = bytes / 8 * 8; i < bytes; i++)
        p[i] = (char)mix64(seed + i);
}

static const char *layout_str(const layout_t *l, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB"};
    uint64_t v = l->size;
    unsigned u = 0;
    while (u < 3 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%llux%llu%s", (unsigned long long)l->keys, (unsigned long long)v, unit[u]);
    return buf;
}

/* ---- the store process ------------------------------------------------------------------------
 */

typedef struct {
    pid_t pid;
    char master[320];
    char port_file[64];
    char log[64]; /* the store's output */
} server_t;

static int server_start(const opts_t *o, uint64_t seg_bytes, server_t *s)
{
    snprintf(s->port_file, sizeof(s->port_file), "/tmp/kvstash-bench-store-%d.port", (int)getpid());
    unlink(s->port_file);
    snprintf(s->log, sizeof(s->log), "/tmp/kvstash-bench-store-%d.log", (int)getpid());
    char seg[32];
    snprintf(seg, sizeof(seg), "%llu", (unsigned long long)seg_bytes);
    fflush(NULL);
    s->pid = fork();
    if (s->pid == 0) {
        int lfd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lfd >= 0) {
            dup2(lfd, STDOUT_FILENO);
            dup2(lfd, STDERR_FILENO);
        }
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "/kvstash-bench-%d", (int)getppid());
        if (o->etcd != NULL)
            execl(o->server, o->server, "--segment-size", seg, "--port", "0", "--port-file",
                  s->port_file, "--high-watermark", "1.0", "--log-level", "warn", "--etcd", o->etcd,
                  "--etcd-prefix", prefix, (char *)NULL);
        else
            execl(o->server, o->server, "--segment-size", seg, "--port", "0", "--port-file",
                  s->port_file, "--high-watermark", "1.0", "--log-level", "warn", (char *)NULL);
        fprintf(stderr, "kvstash bench store: cannot run %s: %s\n", o->server, strerror(errno));
        _exit(127);
    }
    if (s->pid < 0)
        return -1;
    uint64_t until = kvs__now_ns() + o->timeout_s * KVS_NS_PER_S;
    while (kvs__now_ns() < until) {
        FILE *f = fopen(s->port_file, "r");
        unsigned port = 0;
        if (f != NULL && fscanf(f, "%u", &port) == 1 && port > 0) {
            fclose(f);
            if (o->etcd != NULL) /* the clients find the master through etcd */
                snprintf(s->master, sizeof(s->master), "etcd://%s/kvstash-bench-%d", o->etcd,
                         (int)getpid());
            else
                snprintf(s->master, sizeof(s->master), "127.0.0.1:%u", port);
            return 0;
        }
        if (f != NULL)
            fclose(f);
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
            break;
        usleep(20000);
    }
    fprintf(stderr, "kvstash bench store: the store process did not start (see %s)\n", s->log);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    return -1;
}

/* Stops the store; its log stays (and is named) only when the round failed. */
static void server_stop(server_t *s, bool ok)
{
    kill(s->pid, SIGTERM);
    waitpid(s->pid, NULL, 0);
    unlink(s->port_file);
    if (ok)
        unlink(s->log);
    else
        fprintf(stderr, "kvstash bench store: the store's log is %s\n", s->log);
}

/* ---- limits: host-to-device copies and raw sockets ------------------------------------------- */

typedef struct {
    const opts_t *o;
    uint64_t bytes; /* per reader */
    unsigned readers;
} limit_job_t;

static mem_t reader_mem(const opts_t *o, unsigned r)
{
    return (mem_t){o->host, o->host ? -1 : (int)(r % (unsigned)sh->ngpu)};
}

/* Every reader copies its data set from pinned host memory to its GPU at the same time. */
static int h2d_child(unsigned r, void *arg)
{
    const limit_job_t *j = arg;
    mem_t m = reader_mem(j->o, r);
    if (mem_setup(&m) != 0)
        return child_fail(r, "cannot use GPU %d", m.gpu);
    char *h = host_alloc(&m, j->bytes), *d = mem_alloc(&m, j->bytes);
    if (h == NULL || d == NULL)
        return child_fail(r, "cannot allocate 2 x %llu bytes", (unsigned long long)j->bytes);
    memset(h, 1, j->bytes);
    for (int rep = -1; rep < LIMIT_REPS; rep++) { /* rep -1 warms up */
        if (!barrier(j->o->timeout_s))
            return child_fail(r, "barrier: another process failed or timed out");
        uint64_t t0 = kvs__now_ns();
        if (mem_upload(&m, d, h, j->bytes) != 0)
            return child_fail(r, "host-to-device copy failed");
        if (rep >= 0)
            sh->out[r].limit_ms[rep] = (double)(kvs__now_ns() - t0) / 1e6;
    }
    host_free(&m, h);
    mem_free(&m, d);
    return 0;
}

static bool io_full(int fd, void *p, uint64_t len, bool rd)
{
    char *c = p;
    while (len > 0) {
        ssize_t n = rd ? recv(fd, c, KVS_MIN(len, 1ull << 30), 0)
                       : send(fd, c, KVS_MIN(len, 1ull << 30), MSG_NOSIGNAL);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return false;
        }
        c += n;
        len -= (uint64_t)n;
    }
    return true;
}

typedef struct {
    int fd;
    const char *buf;
    uint64_t size;
} sender_conn_t;

/* Serves requests {offset, length} from the data set until the peer closes. */
static void *sender_conn(void *arg)
{
    sender_conn_t *c = arg;
    uint64_t req[2];
    while (io_full(c->fd, req, sizeof(req), true) && req[0] <= c->size &&
           req[1] <= c->size - req[0] && io_full(c->fd, (void *)(c->buf + req[0]), req[1], false))
        ;
    close(c->fd);
    return NULL;
}

/* The raw-socket sender: one buffer as large as the data set, a thread per connection. */
static int sender_main(const limit_job_t *j, int lfd)
{
    uint64_t size = j->bytes * j->readers;
    char *buf = malloc(size);
    unsigned nc = j->readers * j->o->conns;
    sender_conn_t *cs = calloc(nc, sizeof(*cs));
    pthread_t *th = calloc(nc, sizeof(*th));
    if (buf == NULL || cs == NULL || th == NULL)
        return 1;
    memset(buf, 7, size);
    for (unsigned i = 0; i < nc; i++) {
        cs[i] = (sender_conn_t){accept(lfd, NULL, NULL), buf, size};
        if (cs[i].fd < 0 || pthread_create(&th[i], NULL, sender_conn, &cs[i]) != 0)
            return 1;
    }
    for (unsigned i = 0; i < nc; i++)
        pthread_join(th[i], NULL);
    return 0;
}

typedef struct {
    int fd;
    char *dst;
    uint64_t off, len;
    bool ok;
} recv_conn_t;

static void *recv_conn(void *arg)
{
    recv_conn_t *c = arg;
    uint64_t req[2] = {c->off, c->len};
    c->ok = io_full(c->fd, req, sizeof(req), false) && io_full(c->fd, c->dst, c->len, true);
    return NULL;
}

/* A reader receives its share of the data set over `conns` connections, all readers at once. */
static int tcp_child(unsigned r, void *arg)
{
    const limit_job_t *j = arg;
    unsigned nc = j->o->conns;
    char *dst = malloc(j->bytes);
    recv_conn_t *cs = calloc(nc, sizeof(*cs));
    pthread_t *th = calloc(nc, sizeof(*th));
    if (dst == NULL || cs == NULL || th == NULL)
        return child_fail(r, "out of memory");
    memset(dst, 0, j->bytes);
    uint64_t share = j->bytes / nc;
    for (unsigned i = 0; i < nc; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(sh->raw_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct timeval tv = {.tv_sec = (time_t)j->o->timeout_s};
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
            return child_fail(r, "connect to the raw sender: %s", strerror(errno));
        uint64_t len = i + 1 == nc ? j->bytes - share * i : share;
        cs[i] = (recv_conn_t){fd, dst + share * i, r * j->bytes + share * i, len, false};
    }
    for (int rep = -1; rep < LIMIT_REPS; rep++) {
        if (!barrier(j->o->timeout_s))
            return child_fail(r, "barrier: another process failed or timed out");
        uint64_t t0 = kvs__now_ns();
        for (unsigned i = 0; i < nc; i++)
            pthread_create(&th[i], NULL, recv_conn, &cs[i]);
        bool ok = true;
        for (unsigned i = 0; i < nc; i++) {
            pthread_join(th[i], NULL);
            ok = ok && cs[i].ok;
        }
        if (!ok)
            return child_fail(r, "raw socket receive failed");
        if (rep >= 0)
            sh->out[r].limit_ms[rep] = (double)(kvs__now_ns() - t0) / 1e6;
    }
    for (unsigned i = 0; i < nc; i++)
        close(cs[i].fd);
    free(dst);
    free(cs);
    free(th);
    return 0;
}

/* Per-reader medians of the limit in lim[], or false. */
static bool measure_limit(const opts_t *o, bool tcp, uint64_t bytes, unsigned readers, double *lim)
{
    limit_job_t j = {o, bytes, readers};
    pid_t sender = -1;
    int lfd = -1;
    if (tcp) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof(a);
        lfd = socket(AF_INET, SOCK_STREAM, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 256) != 0 ||
            getsockname(lfd, (struct sockaddr *)&a, &al) != 0) {
            fprintf(stderr, "kvstash bench store: raw socket: %s\n", strerror(errno));
            return false;
        }
        sh->raw_port = ntohs(a.sin_port);
        fflush(NULL);
        sender = fork();
        if (sender == 0)
            _exit(sender_main(&j, lfd));
        close(lfd);
    }
    bool ok = run_children(readers, tcp ? tcp_child : h2d_child, &j);
    if (sender > 0) {
        if (!ok)
            kill(sender, SIGKILL);
        waitpid(sender, NULL, 0);
    }
    for (unsigned r = 0; ok && r < readers; r++)
        lim[r] = median(sh->out[r].limit_ms, LIMIT_REPS);
    return ok;
}

/* ---- a reader's data and reads --------------------------------------------------------------- */

typedef struct {
    const opts_t *o;
    const char *topo;
    layout_t l;
    unsigned readers, round;
    const char *master;
} read_job_t;

typedef struct {
    mem_t m;
    uint64_t keys, size, per, npages, total, pool_bytes;
    char *data, *pool;
    char **names;
    const char **kp;
    kvs_buf_t *frags;
    const kvs_buf_t **bufs;
    size_t *nbufs;
    int64_t *res;
    bool paged;        /* objects are whole pages: the page-table mode runs */
    uint32_t *ids;     /* page ids of every key's pages, key after key */
    size_t *key_pages; /* per key */
    kvs_page_region_t region;
    void *expected;    /* GPU: device copy of data */
    void *check_frags; /* GPU: device descriptors of every fragment */
} reader_t;

static void reader_free(reader_t *rd)
{
    for (uint64_t k = 0; rd->names != NULL && k < rd->keys; k++)
        free(rd->names[k]);
    free(rd->names);
    free(rd->kp);
    free(rd->frags);
    free(rd->bufs);
    free(rd->nbufs);
    free(rd->res);
    free(rd->ids);
    free(rd->key_pages);
    free(rd->data);
    if (rd->pool != NULL)
        mem_free(&rd->m, rd->pool);
    if (rd->expected != NULL)
        mem_free(&rd->m, rd->expected);
    if (rd->check_frags != NULL)
        mem_free(&rd->m, rd->check_frags);
}

/* Data, page pool (randomly chosen pages), keys; GPU: what the check needs. */
static int reader_init(reader_t *rd, const opts_t *o, layout_t l, unsigned r, uint64_t seed,
                       const char *tag)
{
    memset(rd, 0, sizeof(*rd));
    rd->m = reader_mem(o, r);
    rd->keys = l.keys;
    rd->size = l.size;
    rd->per = (l.size + o->frag - 1) / o->frag;
    rd->npages = rd->keys * rd->per;
    rd->total = rd->keys * rd->size;
    rd->pool_bytes = rd->npages * o->frag;
    if (mem_setup(&rd->m) != 0)
        return -1;
    rd->data = NULL;
    if (posix_memalign((void **)&rd->data, 4096, rd->total) != 0)
        rd->data = NULL;
    rd->pool = mem_alloc(&rd->m, rd->pool_bytes);
    rd->names = calloc(rd->keys, sizeof(*rd->names));
    rd->kp = calloc(rd->keys, sizeof(*rd->kp));
    rd->frags = calloc(rd->npages, sizeof(*rd->frags));
    rd->bufs = calloc(rd->keys, sizeof(*rd->bufs));
    rd->nbufs = calloc(rd->keys, sizeof(*rd->nbufs));
    rd->res = calloc(rd->keys, sizeof(*rd->res));
    uint64_t *perm = malloc(rd->npages * sizeof(*perm));
    rd->paged = rd->size % o->frag == 0 && rd->npages <= UINT32_MAX;
    rd->ids = calloc(rd->npages, sizeof(*rd->ids));
    rd->key_pages = calloc(rd->keys, sizeof(*rd->key_pages));
    rd->region = (kvs_page_region_t){rd->pool, o->frag, o->frag, rd->npages};
    if (rd->data == NULL || rd->pool == NULL || rd->names == NULL || rd->kp == NULL ||
        rd->frags == NULL || rd->bufs == NULL || rd->nbufs == NULL || rd->res == NULL ||
        perm == NULL || rd->ids == NULL || rd->key_pages == NULL) {
        free(perm);
        return -1;
    }
    fill_pattern(rd->data, rd->total, seed);
    kvs__bench_shuffle(perm, rd->npages, seed);
    for (uint64_t k = 0; k < rd->keys; k++) {
        rd->names[k] = malloc(64);
        if (rd->names[k] == NULL) {
            free(perm);
            return -1;
        }
        snprintf(rd->names[k], 64, "bench-store-%s-%d-%llu", tag, (int)getpid(),
                 (unsigned long long)k);
        rd->kp[k] = rd->names[k];
        for (uint64_t j = 0; j < rd->per; j++) {
            uint64_t len = KVS_MIN(o->frag, rd->size - j * o->frag);
            rd->frags[k * rd->per + j] =
                (kvs_buf_t){rd->pool + perm[k * rd->per + j] * o->frag, len};
            rd->ids[k * rd->per + j] = (uint32_t)perm[k * rd->per + j];
        }
        rd->key_pages[k] = rd->per;
        rd->bufs[k] = &rd->frags[k * rd->per];
        rd->nbufs[k] = rd->per;
    }
    free(perm);
#ifdef KVS_HAVE_CUDA
    if (!rd->m.host) {
        kvs__bench_frag_t *d = malloc(rd->npages * sizeof(*d));
        rd->expected = mem_alloc(&rd->m, rd->total);
        rd->check_frags = mem_alloc(&rd->m, rd->npages * sizeof(*d));
        if (d == NULL || rd->expected == NULL || rd->check_frags == NULL) {
            free(d);
            return -1;
        }
        for (uint64_t p = 0; p < rd->npages; p++)
            d[p] = (kvs__bench_frag_t){rd->frags[p].ptr,
                                       (p / rd->per) * rd->size + (p % rd->per) * o->frag,
                                       rd->frags[p].len};
        int rc = mem_upload(&rd->m, rd->expected, rd->data, rd->total) |
                 mem_upload(&rd->m, rd->check_frags, d, rd->npages * sizeof(*d));
        free(d);
        if (rc != 0)
            return -1;
    }
#endif
    return 0;
}

/* Whether keys [a, b) hold exactly what was put. */
static bool reader_check(const reader_t *rd, uint64_t a, uint64_t b)
{
#ifdef KVS_HAVE_CUDA
    if (!rd->m.host) {
        uint64_t bad = 1;
        const kvs__bench_frag_t *d = rd->check_frags;
        return kvs__bench_check_frags(d + a * rd->per, (b - a) * rd->per, rd->expected, &bad) ==
                   0 &&
               bad == 0;
    }
#endif
    for (uint64_t k = a; k < b; k++) {
        const char *src = rd->data + k * rd->size;
        for (uint64_t j = 0; j < rd->per; j++) {
            const kvs_buf_t *f = &rd->bufs[k][j];
            if (memcmp(f->ptr, src, f->len) != 0)
                return false;
            src += f->len;
        }
    }
    return true;
}

/* Opens a client for the topology; staged: with GPU read staging (host backend for host
 * destinations), busy_wait_us > 0 adds the busy wait. */
static kvs_client_t *open_client(const char *master, const char *topo, bool staged, bool host,
                                 uint64_t busy_wait_us, uint64_t timeout_s)
{
    char wait[32];
    snprintf(wait, sizeof(wait), "%llu", (unsigned long long)busy_wait_us);
    setenv("KVS_PROTOCOL", topo, 1);
    if (staged) {
        setenv("MC_STORE_GPU_STAGING", "1", 1);
        setenv("MC_STORE_GPU_STAGING_BUSY_WAIT_US", wait, 1);
        if (host)
            setenv("MC_STORE_GPU_STAGING_BACKEND", "host", 1);
    }
    kvs_client_config_t cfg;
    kvs_client_config_init(&cfg);
    cfg.master = master;
    cfg.transfer_timeout_ms = timeout_s * 1000; /* first puts fault in the whole segment */
    kvs_client_t *c = NULL;
    if (kvs_client_open(&cfg, &c) != KVS_OK)
        c = NULL;
    unsetenv("MC_STORE_GPU_STAGING");
    unsetenv("MC_STORE_GPU_STAGING_BUSY_WAIT_US");
    unsetenv("MC_STORE_GPU_STAGING_BACKEND");
    return c;
}

static int put_all(kvs_client_t *c, reader_t *rd)
{
    kvs_buf_t *src = calloc(rd->keys, sizeof(*src));
    int *pres = calloc(rd->keys, sizeof(*pres));
    int rc = src == NULL || pres == NULL ? KVS_NO_MEMORY : KVS_OK;
    for (uint64_t k = 0; rc == KVS_OK && k < rd->keys; k++)
        src[k] = (kvs_buf_t){rd->data + k * rd->size, rd->size};
    if (rc == KVS_OK)
        rc = kvs_client_batch_put_from(c, rd->keys, rd->kp, src, NULL, pres);
    for (uint64_t k = 0; rc == KVS_OK && k < rd->keys; k++)
        rc = pres[k];
    free(src);
    free(pres);
    return rc;
}

/* One read of every key in `mode`, checked; *ms_p its time, plan_p[0] its planning and
 * plan_p[1] its master lookup outside the transfers. */
static int read_once(reader_t *rd, kvs_client_t *c, int mode, bool sync, uint64_t timeout_s,
                     double *ms_p, uint64_t *plan_p, char *why, size_t wl)
{
    if (mem_clear(&rd->m, rd->pool, rd->pool_bytes) != 0) {
        snprintf(why, wl, "clearing the page pool failed");
        return -1;
    }
    kvs_client_stats_t a, b;
    kvs_client_get_stats(c, &a);
    if (sync && !barrier(timeout_s)) {
        snprintf(why, wl, "barrier: another process failed or timed out");
        return -1;
    }
    bool grouped = mode == M_GROUPED || mode == M_GSTAGED;
    uint64_t t0 = kvs__now_ns();
    int rc = mode == M_PSTAGED ? kvs_client_batch_get_into_pages(c, rd->keys, rd->kp, &rd->region,
                                                                 1, KVS_PAGE_MAJOR, rd->ids,
                                                                 rd->key_pages, false, rd->res)
                               : kvs_client_batch_get_into_multi_buffers(
                                     c, rd->keys, rd->kp, rd->bufs, rd->nbufs, grouped, rd->res);
    uint64_t t1 = kvs__now_ns();
    kvs_client_get_stats(c, &b);
    for (uint64_t k = 0; rc == KVS_OK && k < rd->keys; k++)
        rc = rd->res[k] == (int64_t)rd->size ? KVS_OK : (int)rd->res[k];
    if (rc != KVS_OK) {
        snprintf(why, wl, "%s read failed: %s (%s)", mode_name[mode], kvs_status_str(rc),
                 kvs_last_error());
        return -1;
    }
    if (mode >= M_STAGED && b.staged_reads != a.staged_reads + 1) {
        snprintf(why, wl,
                 "a %s read fell back to direct reads (busy %llu, too_large %llu, overlap %llu, "
                 "other_domain %llu, other_gpu %llu, alloc_failed %llu)",
                 mode_name[mode], (unsigned long long)b.fallback_busy,
                 (unsigned long long)b.fallback_too_large, (unsigned long long)b.fallback_overlap,
                 (unsigned long long)b.fallback_other_domain,
                 (unsigned long long)b.fallback_other_gpu,
                 (unsigned long long)b.fallback_alloc_failed);
        return -1;
    }
    if (!reader_check(rd, 0, rd->keys)) {
        snprintf(why, wl, "a %s read left wrong bytes in the pages", mode_name[mode]);
        return -1;
    }
    *ms_p = (double)(t1 - t0) / 1e6;
    plan_p[0] = b.plan_ns_total - a.plan_ns_total;
    /* The serial part: a pipelined staged read looks up all but its first fill's keys while
     * that fill runs (get_lookup_overlapped_ns). */
    plan_p[1] = (b.get_lookup_ns - a.get_lookup_ns) -
                (b.get_lookup_overlapped_ns - a.get_lookup_overlapped_ns);
    return 0;
}

static int remove_all(kvs_client_t *c, const reader_t *rd)
{
    int rc = KVS_OK;
    for (uint64_t k = 0; k < rd->keys; k++) {
        int r = kvs_client_remove(c, rd->kp[k], true);
        rc = rc == KVS_OK ? r : rc;
    }
    return rc;
}

/* One reader of one round: put, warm every mode, timed samples in rotating order, remove. */
static int reader_child(unsigned r, void *arg)
{
    const read_job_t *j = arg;
    const opts_t *o = j->o;
    reader_t rd;
    char why[200] = "";
    uint64_t seed = mix64(o->seed ^ (j->round * 1000003ull + r * 7919ull + j->l.size));
    char tag[16];
    snprintf(tag, sizeof(tag), "r%u", r);
    if (reader_init(&rd, o, j->l, r, seed, tag) != 0) {
        reader_free(&rd);
        return child_fail(r, "cannot set up %llu bytes of data and pages",
                          (unsigned long long)j->l.keys * j->l.size);
    }
    kvs_client_t *c = open_client(j->master, j->topo, false, o->host, 0, o->timeout_s);
    kvs_client_t *sc = open_client(j->master, j->topo, true, o->host, 0, o->timeout_s);
    uint64_t pool_bytes = rd.pool_bytes;
    int ret = 0;
    if (c == NULL || sc == NULL || kvs_client_register_buffer(c, rd.data, rd.total) != KVS_OK ||
        kvs_client_register_buffer(c, rd.pool, pool_bytes) != KVS_OK ||
        kvs_client_register_buffer(sc, rd.pool, pool_bytes) != KVS_OK) {
        ret = child_fail(r, "client setup: %s", kvs_last_error());
        goto out;
    }
    int prc = put_all(c, &rd);
    if (prc != KVS_OK) {
        ret = child_fail(r, "put: %s (%s)", kvs_status_str(prc), kvs_last_error());
        goto out;
    }
    reader_out_t *out = &sh->out[r];
    double ms = 0;
    uint64_t plan[2] = {0, 0};
    for (int m = 0; m < NMODES; m++) { /* warm-up: registrations, mappings, staging buffer */
        if (m == M_PSTAGED && !rd.paged)
            continue;
        if (read_once(&rd, m >= M_STAGED ? sc : c, m, true, o->timeout_s, &ms, plan, why,
                      sizeof(why)) != 0) {
            ret = child_fail(r, "warm-up: %s", why);
            goto out;
        }
    }
    for (uint64_t s = 0; s < o->samples; s++) {
        for (int q = 0; q < NMODES; q++) {
            int m = (int)((q + s) % NMODES);
            if ((m < M_STAGED && s >= o->direct_samples) || (m == M_PSTAGED && !rd.paged))
                continue;
            if (read_once(&rd, m >= M_STAGED ? sc : c, m, true, o->timeout_s, &ms, plan, why,
                          sizeof(why)) != 0) {
                ret = child_fail(r, "%s", why);
                goto out;
            }
            out->ms[m][out->n[m]++] = ms;
            out->plan_ns[m] += plan[0];
            out->lookup_ns[m] += plan[1];
            out->plan_frags[m] += rd.npages;
            out->calls[m]++;
        }
    }
    if (remove_all(c, &rd) != KVS_OK)
        ret = child_fail(r, "remove: %s", kvs_last_error());
out:
    kvs_client_close(sc);
    kvs_client_close(c);
    reader_free(&rd);
    return ret;
}

/* ---- threads of one reader on one staged client ---------------------------------------------- */

typedef struct {
    reader_t *rd;
    kvs_client_t *c;
    unsigned t, nt;
    uint64_t calls;
    pthread_barrier_t *start;
    double *lat;
    bool ok;
} thr_arg_t;

static void *thr_main(void *arg)
{
    thr_arg_t *a = arg;
    reader_t *rd = a->rd;
    uint64_t k0 = rd->keys * a->t / a->nt, k1 = rd->keys * (a->t + 1) / a->nt;
    int64_t *res = calloc(k1 - k0, sizeof(*res));
    a->ok = res != NULL;
    pthread_barrier_wait(a->start);
    for (uint64_t i = 0; a->ok && i < a->calls; i++) {
        uint64_t t0 = kvs__now_ns();
        int rc = kvs_client_batch_get_into_multi_buffers(a->c, k1 - k0, rd->kp + k0, rd->bufs + k0,
                                                         rd->nbufs + k0, false, res);
        a->lat[i] = (double)(kvs__now_ns() - t0) / 1e6;
        for (uint64_t k = 0; rc == KVS_OK && k < k1 - k0; k++)
            rc = res[k] == (int64_t)rd->size ? KVS_OK : KVS_TRANSFER_FAIL;
        a->ok = rc == KVS_OK;
    }
    free(res);
    return NULL;
}

typedef struct {
    const opts_t *o;
    const char *topo;
    layout_t l;
    const char *master;
} thr_job_t;

static int threads_child(unsigned r, void *arg)
{
    const thr_job_t *j = arg;
    const opts_t *o = j->o;
    reader_t rd;
    if (reader_init(&rd, o, j->l, 0, mix64(o->seed + 99), "thr") != 0) {
        reader_free(&rd);
        return child_fail(r, "cannot set up the data and pages");
    }
    kvs_client_t *c = open_client(j->master, j->topo, false, o->host, 0, o->timeout_s);
    kvs_client_t *sc[2] = {
        open_client(j->master, j->topo, true, o->host, 0, o->timeout_s),
        open_client(j->master, j->topo, true, o->host, o->busy_wait_us, o->timeout_s)};
    uint64_t pool_bytes = rd.pool_bytes;
    int ret = 0;
    if (c == NULL || sc[0] == NULL || sc[1] == NULL ||
        kvs_client_register_buffer(c, rd.data, rd.total) != KVS_OK ||
        kvs_client_register_buffer(sc[0], rd.pool, pool_bytes) != KVS_OK ||
        kvs_client_register_buffer(sc[1], rd.pool, pool_bytes) != KVS_OK ||
        put_all(c, &rd) != KVS_OK) {
        ret = child_fail(r, "setup: %s", kvs_last_error());
        goto out;
    }
    for (unsigned ti = 0; ti < o->nthreads; ti++) {
        unsigned nt = o->threads[ti];
        for (int w = 0; w < 2; w++) {
            char why[200];
            double ms;
            uint64_t plan[2];
            /* Warm-up (one thread), then nt threads at once on a cleared pool. */
            if (read_once(&rd, sc[w], M_STAGED, false, o->timeout_s, &ms, plan, why, sizeof(why)) !=
                    0 ||
                mem_clear(&rd.m, rd.pool, pool_bytes) != 0) {
                ret = child_fail(r, "threads warm-up: %s", why);
                goto out;
            }
            kvs_client_stats_t a, b;
            kvs_client_get_stats(sc[w], &a);
            pthread_barrier_t start;
            pthread_barrier_init(&start, NULL, nt);
            pthread_t th[MAX_READERS];
            thr_arg_t ta[MAX_READERS];
            threads_out_t *to = &sh->thr[ti][w];
            for (unsigned t = 0; t < nt; t++) {
                ta[t] = (thr_arg_t){
                    &rd, sc[w], t, nt, o->samples, &start, &to->lat_ms[t * o->samples], false};
                pthread_create(&th[t], NULL, thr_main, &ta[t]);
            }
            bool ok = true;
            for (unsigned t = 0; t < nt; t++) {
                pthread_join(th[t], NULL);
                ok = ok && ta[t].ok;
            }
            pthread_barrier_destroy(&start);
            kvs_client_get_stats(sc[w], &b);
            if (!ok || !reader_check(&rd, 0, rd.keys)) {
                ret = child_fail(r, "%u threads: a read failed or left wrong bytes", nt);
                goto out;
            }
            to->calls = (uint64_t)nt * o->samples;
            to->busy = b.fallback_busy - a.fallback_busy;
            to->staged = b.staged_reads - a.staged_reads;
        }
    }
    if (remove_all(c, &rd) != KVS_OK)
        ret = child_fail(r, "remove: %s", kvs_last_error());
out:
    kvs_client_close(sc[1]);
    kvs_client_close(sc[0]);
    kvs_client_close(c);
    reader_free(&rd);
    return ret;
}

/* ---- the GPU count, from a child (the coordinator stays free of CUDA) --------------------------
 */

static int probe_child(unsigned r, void *arg)
{
    (void)r;
    (void)arg;
    sh->ngpu = 0;
#ifdef KVS_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess)
        sh->ngpu = n;
#endif
    return 0;
}

/* ---- report ------------------------------------------------------------------------------------
 */

typedef struct {
    const char *topo;
    unsigned li, readers;
    double round_ms[MAX_READERS][NMODES][MAX_SAMPLES]; /* per reader, per round medians */
    uint64_t plan_ns[NMODES], plan_frags[NMODES], calls[NMODES], lookup_ns[NMODES];
    unsigned rounds, samples[NMODES];
    double limit_ms[MAX_READERS];
} config_t;

typedef struct {
    double ms, gbps, agg_gbps, limit_ms, ratio, plan_us, plan_ns_frag, lookup_us;
} row_t;

static row_t config_row(const config_t *cf, const opts_t *o, int m)
{
    row_t w = {0};
    uint64_t bytes = o->layout[cf->li].keys * o->layout[cf->li].size;
    for (unsigned r = 0; r < cf->readers; r++) {
        double ms = median(cf->round_ms[r][m], cf->rounds);
        double ratio = ms / cf->limit_ms[r];
        if (ratio > w.ratio) {
            w.ratio = ratio;
            w.limit_ms = cf->limit_ms[r];
        }
        w.ms = KVS_MAX(w.ms, ms);
        w.agg_gbps += (double)bytes / ms / 1e6;
    }
    w.gbps = (double)bytes / w.ms / 1e6;
    w.plan_us = (double)cf->plan_ns[m] / (double)KVS_MAX(cf->calls[m], 1) / 1e3;
    w.plan_ns_frag = (double)cf->plan_ns[m] / (double)KVS_MAX(cf->plan_frags[m], 1);
    w.lookup_us = (double)cf->lookup_ns[m] / (double)KVS_MAX(cf->calls[m], 1) / 1e3;
    return w;
}

static void report(const opts_t *o, const config_t *cfs, unsigned ncf, FILE *md, FILE *csv)
{
    char lb[48];
    fprintf(md,
            "| topology | layout | readers | mode | samples x rounds | median ms | GB/s per reader "
            "| GB/s all readers | limit ms | ratio to limit | planning us/call | ns/fragment | "
            "serial lookup us/call | staged speed-up | vs 1 reader |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (csv != NULL)
        fprintf(csv, "topology,layout,readers,gpus,mode,samples,rounds,median_ms,gbps_per_reader,"
                     "gbps_all,limit_ms,ratio_to_limit,plan_us,plan_ns_per_fragment,lookup_us\n");
    for (unsigned i = 0; i < ncf; i++) {
        const config_t *cf = &cfs[i];
        layout_str(&o->layout[cf->li], lb, sizeof(lb));
        row_t rows[NMODES];
        for (int m = 0; m < NMODES; m++)
            rows[m] = config_row(cf, o, m);
        double best_direct = KVS_MIN(rows[M_DIRECT].ms, rows[M_GROUPED].ms);
        const config_t *one = NULL; /* the same topology and layout with 1 reader */
        for (unsigned q = 0; q < ncf; q++)
            if (cfs[q].readers == 1 && cfs[q].li == cf->li && strcmp(cfs[q].topo, cf->topo) == 0)
                one = &cfs[q];
        unsigned gpus = o->host ? 0 : KVS_MIN(cf->readers, (unsigned)sh->ngpu);
        for (int m = 0; m < NMODES; m++) {
            const row_t *w = &rows[m];
            char speed[32] = "", vs1[32] = "", rd[32];
            if (cf->samples[m] == 0)
                continue; /* a mode this layout has not (page-table: objects not whole pages) */
            if (m >= M_STAGED)
                snprintf(speed, sizeof(speed), "%.2fx", best_direct / w->ms);
            if (one != NULL && cf->readers > 1)
                snprintf(vs1, sizeof(vs1), "%.2fx", w->ms / config_row(one, o, m).ms);
            if (o->host || gpus == cf->readers)
                snprintf(rd, sizeof(rd), "%u", cf->readers);
            else
                snprintf(rd, sizeof(rd), "%u on %u GPUs", cf->readers, gpus);
            fprintf(md,
                    "| %s | %s | %s | %s%s | %u x %u | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | "
                    "%.1f | %.0f | %s | %s |\n",
                    cf->topo, lb, rd, mode_name[m], o->host && m >= M_STAGED ? " (host)" : "",
                    cf->samples[m], cf->rounds, w->ms, w->gbps, w->agg_gbps, w->limit_ms, w->ratio,
                    w->plan_us, w->plan_ns_frag, w->lookup_us, speed, vs1);
            if (csv != NULL)
                fprintf(csv, "%s,%s,%u,%u,%s,%u,%u,%.3f,%.3f,%.3f,%.3f,%.4f,%.1f,%.2f,%.1f\n",
                        cf->topo, lb, cf->readers, gpus, mode_name[m], cf->samples[m], cf->rounds,
                        w->ms, w->gbps, w->agg_gbps, w->limit_ms, w->ratio, w->plan_us,
                        w->plan_ns_frag, w->lookup_us);
        }
    }
}

static void report_threads(const opts_t *o, const char *topo, FILE *md)
{
    char lb[48];
    fprintf(md,
            "\nThreads of one reader process on one staged client (%s, %s, %llu calls per "
            "thread, each thread its share of the keys); busy wait = "
            "MC_STORE_GPU_STAGING_BUSY_WAIT_US:\n\n"
            "| threads | busy wait us | calls | median ms | p90 ms | max ms | staged | busy "
            "fallbacks |\n|---|---|---|---|---|---|---|---|\n",
            topo, layout_str(&o->layout[0], lb, sizeof(lb)), (unsigned long long)o->samples);
    for (unsigned ti = 0; ti < o->nthreads; ti++) {
        for (int w = 0; w < 2; w++) {
            const threads_out_t *t = &sh->thr[ti][w];
            unsigned n = (unsigned)t->calls;
            double v[MAX_READERS * MAX_SAMPLES];
            memcpy(v, t->lat_ms, n * sizeof(*v));
            qsort(v, n, sizeof(*v), cmp_double);
            fprintf(md, "| %u | %llu | %u | %.2f | %.2f | %.2f | %llu | %llu (%.0f%%) |\n",
                    o->threads[ti], w ? (unsigned long long)o->busy_wait_us : 0ull, n, median(v, n),
                    v[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1], v[n - 1],
                    (unsigned long long)t->staged, (unsigned long long)t->busy,
                    100.0 * (double)t->busy / (double)KVS_MAX(n, 1));
        }
    }
}

/* ---- options and the matrix -------------------------------------------------------------------
 */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvstash bench store [options]\n"
            "  --topology LIST       shm,tcp (default both)\n"
            "  --layout LIST         KEYSxSIZE list (default 96x12MiB,1536x384KiB)\n"
            "  --readers LIST        reader processes (default 1,2,4 up to the GPUs present)\n"
            "  --rounds N            fresh-process rounds (default 3)\n"
            "  --samples N           timed samples per mode and round (default 8, at most %d)\n"
            "  --direct-samples N    fewer for the slow direct modes (default 3)\n"
            "  --fragment-size SIZE  destination page size (default 8KiB)\n"
            "  --memory gpu|host     destination memory (default gpu when one is present)\n"
            "  --threads LIST        threads experiment, 0 to skip (default 1,2,4)\n"
            "  --busy-wait-us N      its MC_STORE_GPU_STAGING_BUSY_WAIT_US (default 200000)\n"
            "  --timeout-s N         barrier and start-up time-out (default 600)\n"
            "  --server PATH         kvstash-server (default: beside this program)\n"
            "  --etcd HOST:PORT      the store's master leads through etcd there; readers follow\n"
            "                        it (etcd://): HA's cost (docs/ha.md)\n"
            "  --csv FILE  --table FILE  --plot FILE.png   results (the plot needs python3 with\n"
            "                        matplotlib)\n",
            MAX_SAMPLES);
}

static bool parse_list(const char *s, unsigned *v, unsigned *n, unsigned max)
{
    *n = 0;
    char *dup = strdup(s), *save = NULL;
    bool ok = dup != NULL;
    for (char *t = strtok_r(dup, ",", &save); ok && t != NULL; t = strtok_r(NULL, ",", &save)) {
        uint64_t x;
        ok = *n < MAX_LIST && kvs__parse_u64(t, max, &x) == KVS_OK;
        if (ok)
            v[(*n)++] = (unsigned)x;
    }
    free(dup);
    return ok && *n > 0;
}

static bool parse_layouts(const char *s, opts_t *o)
{
    o->nlayout = 0;
    char *dup = strdup(s), *save = NULL;
    bool ok = dup != NULL;
    for (char *t = strtok_r(dup, ",", &save); ok && t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *x = strchr(t, 'x');
        layout_t l = {0};
        ok = x != NULL && o->nlayout < MAX_LIST;
        if (ok) {
            *x = '\0';
            ok = kvs__parse_u64(t, 65536, &l.keys) == KVS_OK && l.keys > 0 &&
                 kvs__parse_size(x + 1, &l.size) == KVS_OK && l.size > 0;
        }
        if (ok)
            o->layout[o->nlayout++] = l;
    }
    free(dup);
    return ok && o->nlayout > 0;
}

static int parse_opts(int argc, char **argv, opts_t *o, const char **memory)
{
    *o = (opts_t){.rounds = 3,
                  .samples = 8,
                  .direct_samples = 3,
                  .frag = 8192,
                  .busy_wait_us = 200000,
                  .timeout_s = 600,
                  .seed = 1};
    parse_layouts("96x12MiB,1536x384KiB", o);
    o->threads[0] = 1, o->threads[1] = 2, o->threads[2] = 4, o->nthreads = 3;
    o->topo[0] = "shm", o->topo[1] = "tcp", o->ntopo = 2;
    *memory = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 1;
        }
        if (!ok) {
        } else if (strcmp(a, "--topology") == 0) {
            o->ntopo = 0;
            if (strstr(v, "shm") != NULL)
                o->topo[o->ntopo++] = "shm";
            if (strstr(v, "tcp") != NULL)
                o->topo[o->ntopo++] = "tcp";
            ok = o->ntopo > 0 && strspn(v, "shmtcp,") == strlen(v);
        } else if (strcmp(a, "--layout") == 0) {
            ok = parse_layouts(v, o);
        } else if (strcmp(a, "--readers") == 0) {
            ok = parse_list(v, o->readers, &o->nreaders, MAX_READERS);
            for (unsigned r = 0; ok && r < o->nreaders; r++)
                ok = o->readers[r] > 0;
        } else if (strcmp(a, "--threads") == 0) {
            ok = parse_list(v, o->threads, &o->nthreads, MAX_READERS);
            if (ok && o->nthreads == 1 && o->threads[0] == 0)
                o->nthreads = 0;
            for (unsigned t = 0; ok && t < o->nthreads; t++)
                ok = o->threads[t] > 0;
        } else if (strcmp(a, "--rounds") == 0) {
            ok = kvs__parse_u64(v, MAX_SAMPLES, &o->rounds) == KVS_OK && o->rounds > 0;
        } else if (strcmp(a, "--samples") == 0) {
            ok = kvs__parse_u64(v, MAX_SAMPLES, &o->samples) == KVS_OK && o->samples > 0;
        } else if (strcmp(a, "--direct-samples") == 0) {
            ok = kvs__parse_u64(v, MAX_SAMPLES, &o->direct_samples) == KVS_OK &&
                 o->direct_samples > 0;
        } else if (strcmp(a, "--fragment-size") == 0) {
            ok = kvs__parse_size(v, &o->frag) == KVS_OK && o->frag > 0;
        } else if (strcmp(a, "--busy-wait-us") == 0) {
            ok = kvs__parse_u64(v, 60000000, &o->busy_wait_us) == KVS_OK;
        } else if (strcmp(a, "--timeout-s") == 0) {
            ok = kvs__parse_u64(v, 86400, &o->timeout_s) == KVS_OK && o->timeout_s > 0;
        } else if (strcmp(a, "--memory") == 0) {
            *memory = v;
            ok = strcmp(v, "gpu") == 0 || strcmp(v, "host") == 0;
        } else if (strcmp(a, "--server") == 0) {
            o->server = v;
        } else if (strcmp(a, "--etcd") == 0) {
            o->etcd = v;
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = v;
        } else if (strcmp(a, "--table") == 0) {
            o->table = v;
        } else if (strcmp(a, "--plot") == 0) {
            o->plot = v;
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "kvstash bench store: bad option '%s'%s%s\n", a, v ? " " : "",
                    v ? v : " (it takes a value)");
            usage(stderr);
            return 2;
        }
    }
    o->direct_samples = KVS_MIN(o->direct_samples, o->samples);
    for (unsigned t = 0; t < o->nthreads; t++) {
        if (o->threads[t] > o->layout[0].keys) {
            fprintf(stderr, "kvstash bench store: %u threads need at least as many keys\n",
                    o->threads[t]);
            return 2;
        }
    }
    return 0;
}

static FILE *open_out(const char *path)
{
    FILE *f = path != NULL ? fopen(path, "w") : NULL;
    if (path != NULL && f == NULL)
        fprintf(stderr, "kvstash bench store: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

int kvs__bench_store_main(int argc, char **argv)
{
    opts_t o;
    const char *memory;
    int prc = parse_opts(argc, argv, &o, &memory);
    if (prc != 0)
        return prc == 1 ? 0 : prc;
    static char server[4096];
    if (o.server == NULL) {
        char self[4000];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        snprintf(server, sizeof(server), "%s/kvstash-server", dirname(self));
        o.server = server;
    }
    if (access(o.server, X_OK) != 0) {
        fprintf(stderr, "kvstash bench store: no kvstash-server at %s (use --server)\n", o.server);
        return 2;
    }
    kvs__tcp_config_t tcfg;
    if (kvs__tcp_config_init(&tcfg) != KVS_OK)
        return 2;
    o.conns = tcfg.conns_per_peer;
    sh = shared_create();
    if (sh == NULL || !run_children(1, probe_child, NULL))
        return 1;
    o.host = memory != NULL ? strcmp(memory, "host") == 0 : sh->ngpu == 0;
    if (!o.host && sh->ngpu == 0) {
        fprintf(stderr, "kvstash bench store: --memory gpu, but no GPU is usable here\n");
        return 2;
    }
    if (o.nreaders == 0) {
        o.readers[o.nreaders++] = 1;
        for (unsigned n = 2; n <= 4; n *= 2)
            if (o.host || (unsigned)sh->ngpu >= n)
                o.readers[o.nreaders++] = n;
    }
    uint64_t max_bytes = 0;
    for (unsigned li = 0; li < o.nlayout; li++)
        max_bytes = KVS_MAX(max_bytes, o.layout[li].keys * o.layout[li].size);
    FILE *md = open_out(o.table), *csv = open_out(o.csv);
    if ((o.table != NULL && md == NULL) || (o.csv != NULL && csv == NULL))
        return 1;
    char lb[48];
    printf("kvstash bench store: %s destinations (%d GPU(s) present), %llu-byte fragments, "
           "%llu rounds x %llu samples (direct modes %llu), tcp %u connection(s) per reader\n",
           o.host ? "host" : "GPU", sh->ngpu, (unsigned long long)o.frag,
           (unsigned long long)o.rounds, (unsigned long long)o.samples,
           (unsigned long long)o.direct_samples, o.conns);
    unsigned ncf = o.ntopo * o.nlayout * o.nreaders, done = 0;
    config_t *cfs = calloc(ncf, sizeof(*cfs));
    if (cfs == NULL)
        return 1;
    /* Limits first, in this run: per layout and reader count, per topology. */
    unsigned i = 0;
    for (unsigned t = 0; t < o.ntopo; t++) {
        for (unsigned li = 0; li < o.nlayout; li++) {
            for (unsigned ri = 0; ri < o.nreaders; ri++, i++) {
                config_t *cf = &cfs[i];
                *cf = (config_t){.topo = o.topo[t], .li = li, .readers = o.readers[ri]};
                bool tcp = strcmp(cf->topo, "tcp") == 0;
                uint64_t bytes = o.layout[li].keys * o.layout[li].size;
                fprintf(stderr, "[limit] %s, %u reader(s), %s per reader ...\n",
                        tcp      ? "raw loopback tcp"
                        : o.host ? "memcpy"
                                 : "pinned host-to-device",
                        cf->readers, layout_str(&o.layout[li], lb, sizeof(lb)));
                if (!measure_limit(&o, tcp, bytes, cf->readers, cf->limit_ms))
                    return 1;
                for (unsigned r = 0; r < cf->readers; r++)
                    fprintf(stderr, "[limit]   reader %u: %.2f ms (%.2f GB/s)\n", r,
                            cf->limit_ms[r], (double)bytes / cf->limit_ms[r] / 1e6);
            }
        }
    }
    /* The matrix: fresh store and readers each round. */
    uint64_t t_start = kvs__now_ns();
    kvs__progress_t prog;
    kvs__progress_start(&prog, "bench store: rounds", (uint64_t)ncf * o.rounds, false);
    for (i = 0; i < ncf; i++) {
        config_t *cf = &cfs[i];
        const layout_t *l = &o.layout[cf->li];
        for (unsigned rnd = 0; rnd < o.rounds; rnd++) {
            server_t srv;
            uint64_t seg = l->keys * (l->size + 4096) * cf->readers + (64u << 20);
            if (server_start(&o, seg, &srv) != 0)
                return 1;
            read_job_t j = {&o, cf->topo, *l, cf->readers, rnd, srv.master};
            bool ok = run_children(cf->readers, reader_child, &j);
            server_stop(&srv, ok);
            if (!ok)
                return 1;
            for (unsigned r = 0; r < cf->readers; r++) {
                const reader_out_t *ro = &sh->out[r];
                for (int m = 0; m < NMODES; m++) {
                    cf->round_ms[r][m][rnd] = median(ro->ms[m], ro->n[m]);
                    cf->samples[m] = ro->n[m];
                    cf->plan_ns[m] += ro->plan_ns[m];
                    cf->lookup_ns[m] += ro->lookup_ns[m];
                    cf->plan_frags[m] += ro->plan_frags[m];
                    cf->calls[m] += ro->calls[m];
                }
            }
            cf->rounds = rnd + 1;
            done++;
            kvs__progress_log(
                &prog,
                "[%3u/%u %5.0f s] %s %s %u reader(s) round %u: direct %.1f, grouped %.1f, "
                "staged %.1f, grouped staged %.1f, page-table staged %.1f ms (reader 0)\n",
                done, ncf * (unsigned)o.rounds, (double)(kvs__now_ns() - t_start) / 1e9, cf->topo,
                layout_str(l, lb, sizeof(lb)), cf->readers, rnd + 1, cf->round_ms[0][M_DIRECT][rnd],
                cf->round_ms[0][M_GROUPED][rnd], cf->round_ms[0][M_STAGED][rnd],
                cf->round_ms[0][M_GSTAGED][rnd], cf->round_ms[0][M_PSTAGED][rnd]);
            kvs__progress_set(&prog, done);
        }
    }
    kvs__progress_end(&prog, true);
    printf("\nMedians of per-round medians; with several readers the slowest reader's median and "
           "the largest per-reader ratio (each reader's limit measured with all readers at "
           "once). Limit: %s for shm, raw loopback tcp (%u connections per reader) for tcp.\n\n",
           o.host ? "memcpy of the same bytes" : "pinned host-to-device copy of the same bytes",
           o.conns);
    report(&o, cfs, ncf, stdout, csv);
    if (md != NULL)
        report(&o, cfs, ncf, md, NULL);
    if (o.nthreads > 0) {
        server_t srv;
        const layout_t *l = &o.layout[0];
        if (server_start(&o, l->keys * (l->size + 4096) + (64u << 20), &srv) != 0)
            return 1;
        thr_job_t j = {&o, o.topo[0], *l, srv.master};
        fprintf(stderr, "[threads] %s %s ...\n", o.topo[0], layout_str(l, lb, sizeof(lb)));
        bool ok = run_children(1, threads_child, &j);
        server_stop(&srv, ok);
        if (!ok)
            return 1;
        report_threads(&o, o.topo[0], stdout);
        if (md != NULL)
            report_threads(&o, o.topo[0], md);
    }
    if (md != NULL)
        fclose(md);
    if (csv != NULL)
        fclose(csv);
    if (o.plot != NULL && o.csv != NULL) {
        const char *script = getenv("KVS_BENCH_PLOT_SCRIPT");
        char cmd[8192];
        snprintf(cmd, sizeof(cmd), "python3 '%s' '%s' '%s'",
                 script != NULL ? script : KVS_BENCH_PLOT_SCRIPT, o.csv, o.plot);
        if (system(cmd) != 0)
            fprintf(stderr, "kvstash bench store: the plot was not made (%s)\n", cmd);
    } else if (o.plot != NULL) {
        fprintf(stderr, "kvstash bench store: --plot needs --csv\n");
    }
    free(cfs);
    return 0;
}
