/* The `kvstash` Python module: MooncakeDistributedStore with Mooncake's method names, argument
 * order, defaults and return conventions, over the public C client API. Every blocking call
 * releases the GIL; a store may be shared by many Python threads (calls in flight hold the
 * store open, and close waits for them). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <kvstash/kvstash.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common_int.h"

/* Mooncake's default master address and setup sizes. */
#define DEFAULT_MASTER "127.0.0.1:50051"

/* ---- ReplicateConfig ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD int replica_num;
    PyObject *preferred_segment; /* str */
    char prefer_alloc_in_same_node;
} replicate_config_t;

static int rc_init(replicate_config_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"replica_num", "preferred_segment", "prefer_alloc_in_same_node", NULL};
    int replica = 1, same = 0;
    PyObject *pref = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iUp", names, &replica, &pref, &same))
        return -1;
    self->replica_num = replica;
    self->prefer_alloc_in_same_node = (char)same;
    Py_XSETREF(self->preferred_segment, pref ? Py_NewRef(pref) : PyUnicode_FromString(""));
    return self->preferred_segment ? 0 : -1;
}

static void rc_dealloc(replicate_config_t *self)
{
    Py_XDECREF(self->preferred_segment);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *rc_repr(replicate_config_t *self)
{
    return PyUnicode_FromFormat(
        "ReplicateConfig(replica_num=%d, preferred_segment=%R, prefer_alloc_in_same_node=%s)",
        self->replica_num, self->preferred_segment,
        self->prefer_alloc_in_same_node ? "True" : "False");
}

static PyMemberDef rc_members[] = {
    {"replica_num", T_INT, offsetof(replicate_config_t, replica_num), 0,
     "copies on distinct segments (default 1)"},
    {"preferred_segment", T_OBJECT_EX, offsetof(replicate_config_t, preferred_segment), 0,
     "segment name for the first copy ('' for none)"},
    {"prefer_alloc_in_same_node", T_BOOL, offsetof(replicate_config_t, prefer_alloc_in_same_node),
     0, "place a batch's objects together on one segment"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject replicate_config_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstash.ReplicateConfig",
    .tp_basicsize = sizeof(replicate_config_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ReplicateConfig(replica_num=1, preferred_segment='', "
              "prefer_alloc_in_same_node=False): placement of a put.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rc_init,
    .tp_dealloc = (destructor)rc_dealloc,
    .tp_repr = (reprfunc)rc_repr,
    .tp_members = rc_members,
};

/* Converts an optional ReplicateConfig (None: defaults). The preferred segment string is
 * copied into `seg` (len bytes). Returns -1 with an exception set on a wrong type. */
static int rc_convert(PyObject *obj, kvs_replicate_config_t *rc, char *seg, size_t len)
{
    kvs_replicate_config_init(rc);
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyObject_TypeCheck(obj, &replicate_config_type)) {
        PyErr_SetString(PyExc_TypeError, "config must be a kvstash.ReplicateConfig or None");
        return -1;
    }
    replicate_config_t *c = (replicate_config_t *)obj;
    rc->replica_num = c->replica_num < 0 ? 0 : (uint32_t)c->replica_num;
    rc->prefer_alloc_in_same_node = c->prefer_alloc_in_same_node != 0;
    if (c->preferred_segment != NULL && PyUnicode_Check(c->preferred_segment)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(c->preferred_segment, &n);
        if (s == NULL)
            return -1;
        if (n > 0) {
            if ((size_t)n >= len) {
                PyErr_SetString(PyExc_ValueError, "preferred_segment is too long");
                return -1;
            }
            memcpy(seg, s, (size_t)n);
            seg[n] = '\0';
            rc->preferred_segment = seg;
        }
    }
    return 0;
}

/* ---- the store ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD kvs_client_t *client;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int inflight;
    bool opening; /* a setup() is connecting (with the GIL released) */
    char hostname[256];
} store_t;

/* Holds the store open for one call; NULL (and a message) when it is not set up. */
static kvs_client_t *store_enter(store_t *s)
{
    pthread_mutex_lock(&s->lock);
    kvs_client_t *c = s->client;
    if (c != NULL)
        s->inflight++;
    pthread_mutex_unlock(&s->lock);
    return c;
}

static void store_leave(store_t *s)
{
    pthread_mutex_lock(&s->lock);
    if (--s->inflight == 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static PyObject *store_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    store_t *s = (store_t *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    return (PyObject *)s;
}

/* Detaches and closes the client after the calls in flight. */
static void store_shutdown(store_t *s)
{
    pthread_mutex_lock(&s->lock);
    kvs_client_t *c = s->client;
    s->client = NULL;
    while (s->inflight > 0)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    kvs_client_close(c);
}

static void store_dealloc(store_t *s)
{
    Py_BEGIN_ALLOW_THREADS store_shutdown(s);
    Py_END_ALLOW_THREADS pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* A size argument: an int, or a string such as "16MB" / "4GiB" (no percentages). */
static int parse_size_obj(PyObject *o, const char *what, uint64_t *out)
{
    if (PyLong_Check(o)) {
        long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            PyErr_Format(PyExc_ValueError, "%s must not be negative", what);
            return -1;
        }
        *out = (uint64_t)v;
        return 0;
    }
    if (PyUnicode_Check(o)) {
        const char *t = PyUnicode_AsUTF8(o);
        if (t == NULL)
            return -1;
        if (kvs__parse_size(t, out) != KVS_OK) {
            PyErr_Format(PyExc_ValueError,
                         "%s '%s' is not a size such as 4096, '16MB' or '4GiB' (no percentages)",
                         what, t);
            return -1;
        }
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s must be an int or a size string", what);
    return -1;
}

static const char *dict_str(PyObject *d, const char *key, const char *dflt)
{
    PyObject *v = PyDict_GetItemString(d, key);
    if (v == NULL || v == Py_None)
        return dflt;
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "setup: '%s' must be a str", key);
        return NULL;
    }
    return PyUnicode_AsUTF8(v);
}

PyDoc_STRVAR(
    setup_doc,
    "setup(local_hostname, metadata_server, global_segment_size=16MB, "
    "local_buffer_size=16MB, protocol='tcp', rdma_devices='', "
    "master_server_addr='127.0.0.1:50051') -> int\n"
    "setup(config: dict) -> int\n\n"
    "Connects to the master. global_segment_size > 0 also mounts a segment of that many "
    "bytes that this process serves (it is an owner too). Sizes are ints or strings "
    "such as '16MB' or '4GiB'. kvstash needs no metadata server or local buffer and no "
    "RDMA devices: those arguments are accepted and ignored. protocol: 'tcp', 'auto', "
    "or 'rdma' (means 'auto', with a warning). Dict keys: local_hostname, "
    "metadata_server, global_segment_size, local_buffer_size, protocol, rdma_devices "
    "(or device_name), master_server_address (or master_server_addr), auth_token_file (the "
    "cluster's secret; default $KVS_AUTH_TOKEN_FILE). Returns 0, or a "
    "negative code; calling it twice is -600.");

static PyObject *store_setup(store_t *self, PyObject *args, PyObject *kw)
{
    const char *host = NULL, *proto = "tcp", *master = DEFAULT_MASTER, *token_file = NULL;
    int tls = -1; /* -1: KVS_TLS */
    uint64_t seg_size = 16u << 20, local_size = 16u << 20;
    PyObject *cfg = NULL;
    if (PyTuple_GET_SIZE(args) == 1 && PyDict_Check(PyTuple_GET_ITEM(args, 0)) &&
        (kw == NULL || PyDict_GET_SIZE(kw) == 0)) {
        cfg = PyTuple_GET_ITEM(args, 0);
        host = dict_str(cfg, "local_hostname", NULL);
        proto = dict_str(cfg, "protocol", "tcp");
        const char *m = dict_str(cfg, "master_server_address", NULL);
        if (m == NULL && !PyErr_Occurred())
            m = dict_str(cfg, "master_server_addr", DEFAULT_MASTER);
        master = m;
        token_file = dict_str(cfg, "auth_token_file", NULL);
        if (PyErr_Occurred())
            return NULL;
        PyObject *t = PyDict_GetItemString(cfg, "tls");
        if (t != NULL && t != Py_None) {
            int on = PyObject_IsTrue(t);
            if (on < 0)
                return NULL;
            tls = on;
        }
        PyObject *v = PyDict_GetItemString(cfg, "global_segment_size");
        if (v != NULL && parse_size_obj(v, "global_segment_size", &seg_size) != 0)
            return NULL;
        v = PyDict_GetItemString(cfg, "local_buffer_size");
        if (v != NULL && parse_size_obj(v, "local_buffer_size", &local_size) != 0)
            return NULL;
    } else {
        static char *names[] = {
            "local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
            "protocol",       "rdma_devices",    "master_server_addr",  NULL};
        const char *meta = NULL, *devices = NULL;
        PyObject *seg_o = NULL, *local_o = NULL;
        if (!PyArg_ParseTupleAndKeywords(args, kw, "zz|OOzzz", names, &host, &meta, &seg_o,
                                         &local_o, &proto, &devices, &master))
            return NULL;
        if (seg_o != NULL && parse_size_obj(seg_o, "global_segment_size", &seg_size) != 0)
            return NULL;
        if (local_o != NULL && parse_size_obj(local_o, "local_buffer_size", &local_size) != 0)
            return NULL;
        if (proto == NULL)
            proto = "tcp";
        if (master == NULL)
            master = DEFAULT_MASTER;
    }
    (void)local_size;
    /* One setup at a time: a second, concurrent or later, gets -600 and opens nothing. */
    pthread_mutex_lock(&self->lock);
    bool already = self->client != NULL || self->opening;
    if (!already)
        self->opening = true;
    pthread_mutex_unlock(&self->lock);
    if (already)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    /* Copies: the GIL is released while they are used, and another thread could change the
     * dict (or its strings) meanwhile. */
    char masterbuf[512], protobuf[32], tokenbuf[4096];
    if (snprintf(masterbuf, sizeof(masterbuf), "%s", master) >= (int)sizeof(masterbuf) ||
        snprintf(protobuf, sizeof(protobuf), "%s", proto) >= (int)sizeof(protobuf) ||
        snprintf(tokenbuf, sizeof(tokenbuf), "%s", token_file ? token_file : "") >=
            (int)sizeof(tokenbuf)) {
        pthread_mutex_lock(&self->lock);
        self->opening = false;
        pthread_mutex_unlock(&self->lock);
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    }
    kvs_client_config_t ccfg;
    kvs_client_config_init(&ccfg);
    ccfg.master = masterbuf;
    ccfg.protocol = protobuf;
    if (token_file != NULL) /* else KVS_AUTH_TOKEN_FILE, read by config_init */
        ccfg.auth_token_file = tokenbuf;
    if (tls >= 0) /* else KVS_TLS */
        ccfg.tls = tls != 0;
    ccfg.local_hostname = host && *host ? host : NULL;
    /* A "host:port" local_hostname names the host only. */
    char hostbuf[256] = "";
    if (host && *host) {
        snprintf(hostbuf, sizeof(hostbuf), "%s", host);
        char *colon = strrchr(hostbuf, ':');
        if (colon != NULL && colon != hostbuf)
            *colon = '\0';
        ccfg.local_hostname = hostbuf;
    }
    kvs_client_t *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvs_client_open(&ccfg, &c);
    if (rc == KVS_OK && seg_size > 0) {
        rc = kvs_client_mount_segment(c, seg_size, NULL, NULL);
        if (rc != KVS_OK) {
            kvs_client_close(c);
            c = NULL;
        }
    }
    Py_END_ALLOW_THREADS pthread_mutex_lock(&self->lock);
    self->client = c;
    self->opening = false;
    pthread_mutex_unlock(&self->lock);
    if (rc != KVS_OK)
        return PyLong_FromLong(rc);
    if (hostbuf[0])
        snprintf(self->hostname, sizeof(self->hostname), "%s", hostbuf);
    else
        gethostname(self->hostname, sizeof(self->hostname) - 1);
    return PyLong_FromLong(0);
}

/* ---- argument helpers ------------------------------------------------------------------------ */

/* Keys of a list as C strings. The strings belong to str objects that *hold_p (a tuple copy
 * of the list, which the caller releases with Py_XDECREF after the call) keeps alive: another
 * thread may change or clear the list itself while the GIL is released. Returns NULL with an
 * exception for a non-list or a non-str element. */
static const char **keys_from(PyObject *list, Py_ssize_t *n_p, PyObject **hold_p)
{
    if (!PyList_Check(list) && !PyTuple_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of str");
        return NULL;
    }
    PyObject *hold = PySequence_Tuple(list);
    if (hold == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(hold);
    const char **keys = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(*keys));
    if (keys == NULL) {
        Py_DECREF(hold);
        return (const char **)PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(hold, i);
        if (!PyUnicode_Check(k) || (keys[i] = PyUnicode_AsUTF8(k)) == NULL) {
            PyMem_Free(keys);
            Py_DECREF(hold);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "keys must be a list of str");
            return NULL;
        }
    }
    *n_p = n;
    *hold_p = hold;
    return keys;
}

/* An int sequence of exactly n entries into out[] (pointers when `ptrs`). */
static int ints_from(PyObject *seq, Py_ssize_t n, const char *what, uint64_t *out)
{
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of int", what);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(seq) != n)
        return 1; /* a length mismatch: the caller answers -600 per key */
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s must be a list of int", what);
            return -1;
        }
        out[i] = PyLong_AsUnsignedLongLong(items[i]);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s holds a negative or too large value", what);
            return -1;
        }
    }
    return 0;
}

static PyObject *int_list(const int64_t *v, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    for (Py_ssize_t i = 0; l && i < n; i++)
        PyList_SET_ITEM(l, i, PyLong_FromLongLong(v[i]));
    return l;
}

static PyObject *same_code_list(Py_ssize_t n, int code)
{
    PyObject *l = PyList_New(n);
    for (Py_ssize_t i = 0; l && i < n; i++)
        PyList_SET_ITEM(l, i, PyLong_FromLong(code));
    return l;
}

#define NOT_SET_UP KVS_INVALID_PARAMS

/* ---- single-key calls ------------------------------------------------------------------------ */

static PyObject *store_put(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"key", "value", "config", NULL};
    const char *key;
    Py_buffer value;
    PyObject *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*|O", names, &key, &value, &cfg))
        return NULL;
    kvs_replicate_config_t rc;
    char seg[KVS_MAX_KEY_LEN + 1];
    if (rc_convert(cfg, &rc, seg, sizeof(seg)) != 0) {
        PyBuffer_Release(&value);
        return NULL;
    }
    kvs_client_t *c = store_enter(self);
    int r = NOT_SET_UP;
    if (c != NULL) {
        Py_BEGIN_ALLOW_THREADS r = kvs_client_put(c, key, value.buf, (size_t)value.len, &rc);
        Py_END_ALLOW_THREADS store_leave(self);
    }
    PyBuffer_Release(&value);
    return PyLong_FromLong(r);
}

static PyObject *store_get(store_t *self, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s", &key))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyBytes_FromStringAndSize("", 0);
    void *data = NULL;
    size_t size = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_get(c, key, &data, &size);
    Py_END_ALLOW_THREADS store_leave(self);
    if (r != KVS_OK)
        return PyBytes_FromStringAndSize("", 0); /* Mooncake: empty bytes on failure */
    PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)size);
    kvs_free(data);
    return b;
}

static PyObject *store_put_from(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"key", "buffer_ptr", "size", "config", NULL};
    const char *key;
    unsigned long long ptr, size;
    PyObject *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKK|O", names, &key, &ptr, &size, &cfg))
        return NULL;
    kvs_replicate_config_t rc;
    char seg[KVS_MAX_KEY_LEN + 1];
    if (rc_convert(cfg, &rc, seg, sizeof(seg)) != 0)
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int r;
    Py_BEGIN_ALLOW_THREADS r =
        kvs_client_put_from(c, key, (const void *)(uintptr_t)ptr, (size_t)size, &rc);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLong(r);
}

static PyObject *store_get_into(store_t *self, PyObject *args)
{
    const char *key;
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "sKK", &key, &ptr, &size))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int64_t r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_get_into(c, key, (void *)(uintptr_t)ptr, (size_t)size);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLongLong(r);
}

/* ---- batches --------------------------------------------------------------------------------- */

/* The Python list of a batch's per-key results: the call's status for every key when the call
 * itself failed, else the put statuses (ires) or the read sizes (res). */
static PyObject *batch_results(int r, Py_ssize_t n, int64_t *res, const int *ires, bool put)
{
    if (r != KVS_OK)
        return same_code_list(n, r);
    for (Py_ssize_t i = 0; put && i < n; i++)
        res[i] = ires[i];
    return int_list(res, n);
}

/* keys + one buffer per key (put: results are statuses, get: sizes). */
static PyObject *batch_single(store_t *self, PyObject *keys_o, PyObject *ptrs_o, PyObject *sizes_o,
                              PyObject *cfg, bool put)
{
    kvs_replicate_config_t rc;
    char seg[KVS_MAX_KEY_LEN + 1];
    if (put && rc_convert(cfg, &rc, seg, sizeof(seg)) != 0)
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    uint64_t *ptrs = PyMem_Calloc((size_t)n + 1, sizeof(*ptrs));
    uint64_t *sizes = PyMem_Calloc((size_t)n + 1, sizeof(*sizes));
    kvs_buf_t *bufs = PyMem_Calloc((size_t)n + 1, sizeof(*bufs));
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    int *ires = PyMem_Calloc((size_t)n + 1, sizeof(*ires));
    PyObject *out = NULL;
    if (!ptrs || !sizes || !bufs || !res || !ires) {
        PyErr_NoMemory();
        goto done;
    }
    int a = ints_from(ptrs_o, n, "buffer_ptrs", ptrs);
    int b = a < 0 ? -1 : ints_from(sizes_o, n, "sizes", sizes);
    if (a < 0 || b < 0)
        goto done;
    if (a > 0 || b > 0 || n == 0) {
        out = same_code_list(n, KVS_INVALID_PARAMS); /* mismatched lengths */
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        bufs[i] = (kvs_buf_t){(void *)(uintptr_t)ptrs[i], (size_t)sizes[i]};
    kvs_client_t *c = store_enter(self);
    if (c == NULL) {
        out = same_code_list(n, NOT_SET_UP);
        goto done;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS if (put) r =
        kvs_client_batch_put_from(c, (size_t)n, keys, bufs, &rc, ires);
    else r = kvs_client_batch_get_into(c, (size_t)n, keys, bufs, res);
    Py_END_ALLOW_THREADS store_leave(self);
    out = batch_results(r, n, res, ires, put);
done:
    PyMem_Free(keys);
    Py_XDECREF(hold);
    PyMem_Free(ptrs);
    PyMem_Free(sizes);
    PyMem_Free(bufs);
    PyMem_Free(res);
    PyMem_Free(ires);
    return out;
}

static PyObject *store_batch_put_from(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "buffer_ptrs", "sizes", "config", NULL};
    PyObject *k, *p, *s, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O", names, &k, &p, &s, &cfg))
        return NULL;
    return batch_single(self, k, p, s, cfg, true);
}

static PyObject *store_batch_get_into(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "buffer_ptrs", "sizes", NULL};
    PyObject *k, *p, *s;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", names, &k, &p, &s))
        return NULL;
    return batch_single(self, k, p, s, NULL, false);
}

/* keys + a list of fragments per key. */
static PyObject *batch_multi(store_t *self, PyObject *keys_o, PyObject *ptrs_o, PyObject *sizes_o,
                             PyObject *cfg, bool put, bool same_node)
{
    kvs_replicate_config_t rc;
    char seg[KVS_MAX_KEY_LEN + 1];
    if (put && rc_convert(cfg, &rc, seg, sizeof(seg)) != 0)
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    PyObject *out = NULL;
    kvs_buf_t *frags = NULL;
    uint64_t *tmp_p = NULL, *tmp_s = NULL;
    const kvs_buf_t **bufs = PyMem_Calloc((size_t)n + 1, sizeof(*bufs));
    size_t *nbufs = PyMem_Calloc((size_t)n + 1, sizeof(*nbufs));
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    int *ires = PyMem_Calloc((size_t)n + 1, sizeof(*ires));
    if (!bufs || !nbufs || !res || !ires) {
        PyErr_NoMemory();
        goto done;
    }
    if ((!PyList_Check(ptrs_o) && !PyTuple_Check(ptrs_o)) ||
        (!PyList_Check(sizes_o) && !PyTuple_Check(sizes_o))) {
        PyErr_SetString(PyExc_TypeError,
                        "all_buffer_ptrs and all_sizes must be lists of lists of int");
        goto done;
    }
    if (n == 0 || PySequence_Fast_GET_SIZE(ptrs_o) != n || PySequence_Fast_GET_SIZE(sizes_o) != n) {
        out = same_code_list(n, KVS_INVALID_PARAMS);
        goto done;
    }
    size_t total = 0;
    PyObject **pl = PySequence_Fast_ITEMS(ptrs_o), **sl = PySequence_Fast_ITEMS(sizes_o);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((!PyList_Check(pl[i]) && !PyTuple_Check(pl[i])) ||
            (!PyList_Check(sl[i]) && !PyTuple_Check(sl[i]))) {
            PyErr_SetString(PyExc_TypeError,
                            "all_buffer_ptrs and all_sizes must be lists of lists of int");
            goto done;
        }
        total += (size_t)PySequence_Fast_GET_SIZE(pl[i]);
    }
    frags = PyMem_Calloc(total + 1, sizeof(*frags));
    tmp_p = PyMem_Calloc(total + 1, sizeof(*tmp_p));
    tmp_s = PyMem_Calloc(total + 1, sizeof(*tmp_s));
    if (!frags || !tmp_p || !tmp_s) {
        PyErr_NoMemory();
        goto done;
    }
    size_t f = 0;
    bool mismatch = false;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = PySequence_Fast_GET_SIZE(pl[i]);
        int a = ints_from(pl[i], m, "all_buffer_ptrs", tmp_p + f);
        int b = a < 0 ? -1 : ints_from(sl[i], m, "all_sizes", tmp_s + f);
        if (a < 0 || b < 0)
            goto done;
        /* A key whose two lists differ in length has no valid fragments: -600 for it. */
        nbufs[i] = b > 0 ? 0 : (size_t)m;
        mismatch |= b > 0;
        for (Py_ssize_t j = 0; j < m && b == 0; j++)
            frags[f + (size_t)j] =
                (kvs_buf_t){(void *)(uintptr_t)tmp_p[f + (size_t)j], (size_t)tmp_s[f + (size_t)j]};
        bufs[i] = &frags[f];
        f += (size_t)m;
    }
    (void)mismatch;
    kvs_client_t *c = store_enter(self);
    if (c == NULL) {
        out = same_code_list(n, NOT_SET_UP);
        goto done;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS if (put) r =
        kvs_client_batch_put_from_multi(c, (size_t)n, keys, bufs, nbufs, &rc, ires);
    else r =
        kvs_client_batch_get_into_multi_buffers(c, (size_t)n, keys, bufs, nbufs, same_node, res);
    Py_END_ALLOW_THREADS store_leave(self);
    out = batch_results(r, n, res, ires, put);
done:
    PyMem_Free(keys);
    Py_XDECREF(hold);
    PyMem_Free(bufs);
    PyMem_Free(nbufs);
    PyMem_Free(res);
    PyMem_Free(ires);
    PyMem_Free(frags);
    PyMem_Free(tmp_p);
    PyMem_Free(tmp_s);
    return out;
}

static PyObject *store_batch_put_multi(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", "config", NULL};
    PyObject *k, *p, *s, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O", names, &k, &p, &s, &cfg))
        return NULL;
    return batch_multi(self, k, p, s, cfg, true, false);
}

static PyObject *store_batch_get_multi(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", "prefer_alloc_in_same_node",
                            NULL};
    PyObject *k, *p, *s;
    int same = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|p", names, &k, &p, &s, &same))
        return NULL;
    return batch_multi(self, k, p, s, NULL, false, same != 0);
}

/* ---- registration and metadata --------------------------------------------------------------- */

static PyObject *store_register(store_t *self, PyObject *args)
{
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "KK", &ptr, &size))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_register_buffer(c, (void *)(uintptr_t)ptr, (size_t)size);
    Py_END_ALLOW_THREADS store_leave(self);
    if (r != KVS_OK)
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "kvstash: %s", kvs_last_error());
    return PyLong_FromLong(r);
}

static PyObject *store_unregister(store_t *self, PyObject *args)
{
    unsigned long long ptr;
    if (!PyArg_ParseTuple(args, "K", &ptr))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_unregister_buffer(c, (void *)(uintptr_t)ptr);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLong(r);
}

static PyObject *store_remove(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"key", "force", NULL};
    const char *key;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|p", names, &key, &force))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_remove(c, key, force != 0);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLong(r);
}

/* A call on one key that answers an integer, with the GIL released. */
typedef int64_t (*key_fn)(kvs_client_t *c, const char *key);

static PyObject *key_call(store_t *self, PyObject *args, key_fn fn)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s", &key))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int64_t r;
    Py_BEGIN_ALLOW_THREADS r = fn(c, key);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLongLong(r);
}

static int64_t exists_fn(kvs_client_t *c, const char *key)
{
    return kvs_client_exists(c, key);
}

static PyObject *store_is_exist(store_t *self, PyObject *args)
{
    return key_call(self, args, exists_fn);
}

static PyObject *store_batch_is_exist(store_t *self, PyObject *args)
{
    PyObject *keys_o;
    if (!PyArg_ParseTuple(args, "O", &keys_o))
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    PyObject *out;
    int *ires = PyMem_Calloc((size_t)n + 1, sizeof(*ires));
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    kvs_client_t *c = ires && res && n > 0 ? store_enter(self) : NULL;
    if (ires == NULL || res == NULL) {
        out = PyErr_NoMemory();
    } else if (c == NULL) {
        out = same_code_list(n, KVS_INVALID_PARAMS);
    } else {
        int r;
        Py_BEGIN_ALLOW_THREADS r = kvs_client_batch_exists(c, (size_t)n, keys, ires);
        Py_END_ALLOW_THREADS store_leave(self);
        for (Py_ssize_t i = 0; i < n; i++)
            res[i] = r == KVS_OK ? ires[i] : r;
        out = int_list(res, n);
    }
    PyMem_Free(keys);
    Py_XDECREF(hold);
    PyMem_Free(ires);
    PyMem_Free(res);
    return out;
}

static PyObject *store_get_size(store_t *self, PyObject *args)
{
    return key_call(self, args, kvs_client_get_size);
}

static PyObject *store_close(store_t *self, PyObject *unused)
{
    (void)unused;
    Py_BEGIN_ALLOW_THREADS store_shutdown(self);
    Py_END_ALLOW_THREADS return PyLong_FromLong(0);
}

static PyObject *store_get_hostname(store_t *self, PyObject *unused)
{
    (void)unused;
    if (self->hostname[0] == '\0')
        gethostname(self->hostname, sizeof(self->hostname) - 1);
    return PyUnicode_FromString(self->hostname);
}

static int add_u64(PyObject *d, const char *k, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int r = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return r;
}

static PyObject *store_get_stats(store_t *self, PyObject *unused)
{
    (void)unused;
    kvs_client_t *c = store_enter(self);
    if (c == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kvstash: the store is not set up");
        return NULL;
    }
    kvs_client_stats_t s;
    kvs_client_get_stats(c, &s);
    store_leave(self);
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
#define STAT_(f)                                                                                   \
    if (add_u64(d, #f, s.f) != 0)                                                                  \
        goto err;
    STAT_(put_calls)
    STAT_(put_keys)
    STAT_(put_bytes)
    STAT_(put_failed_keys)
    STAT_(get_calls)
    STAT_(get_keys)
    STAT_(get_bytes)
    STAT_(get_failed_keys)
    STAT_(get_grouped_calls)
    STAT_(get_submissions)
    STAT_(get_lease_expired)
    STAT_(get_timed_out)
    STAT_(get_transfer_fail)
    STAT_(remove_calls)
    STAT_(exists_calls)
    STAT_(size_calls)
    STAT_(rpc_failures)
    STAT_(tcp_transfers)
    STAT_(shm_transfers)
    STAT_(plan_ns_total)
    STAT_(planned_fragments)
    STAT_(registered_buffers)
    STAT_(registered_bytes)
    STAT_(staged_reads)
    STAT_(staged_keys)
    STAT_(fills)
    STAT_(scatter_launches)
    STAT_(fallback_busy)
    STAT_(fallback_too_large)
    STAT_(fallback_overlap)
    STAT_(fallback_other_domain)
    STAT_(fallback_other_gpu)
    STAT_(fallback_alloc_failed)
#undef STAT_
    if (add_u64(d, "get_latency_p50_us",
                (uint64_t)kvs_histogram_quantile_us(&s.get_latency, 0.5)) ||
        add_u64(d, "get_latency_p99_us",
                (uint64_t)kvs_histogram_quantile_us(&s.get_latency, 0.99)) ||
        add_u64(d, "put_latency_p50_us", (uint64_t)kvs_histogram_quantile_us(&s.put_latency, 0.5)))
        goto err;
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

static PyMethodDef store_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))store_setup, METH_VARARGS | METH_KEYWORDS, setup_doc},
    {"put", (PyCFunction)(void (*)(void))store_put, METH_VARARGS | METH_KEYWORDS,
     "put(key, value: bytes, config=None) -> int: stores a copy of value. 0 or a negative code "
     "(-705: the key exists; objects are immutable)."},
    {"get", (PyCFunction)store_get, METH_VARARGS,
     "get(key) -> bytes: the object, or b'' on any failure."},
    {"put_from", (PyCFunction)(void (*)(void))store_put_from, METH_VARARGS | METH_KEYWORDS,
     "put_from(key, buffer_ptr, size, config=None) -> int: stores size bytes from registered "
     "memory."},
    {"get_into", (PyCFunction)store_get_into, METH_VARARGS,
     "get_into(key, buffer_ptr, size) -> int: reads the object into registered memory at least "
     "as large; the object size, or a negative code."},
    {"batch_put_from", (PyCFunction)(void (*)(void))store_batch_put_from,
     METH_VARARGS | METH_KEYWORDS,
     "batch_put_from(keys, buffer_ptrs, sizes, config=None) -> list[int]"},
    {"batch_get_into", (PyCFunction)(void (*)(void))store_batch_get_into,
     METH_VARARGS | METH_KEYWORDS,
     "batch_get_into(keys, buffer_ptrs, sizes) -> list[int]: sizes or negative codes."},
    {"batch_put_from_multi_buffers", (PyCFunction)(void (*)(void))store_batch_put_multi,
     METH_VARARGS | METH_KEYWORDS,
     "batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config=None) -> list[int]: "
     "object i is gathered in order from its fragments."},
    {"batch_get_into_multi_buffers", (PyCFunction)(void (*)(void))store_batch_get_multi,
     METH_VARARGS | METH_KEYWORDS,
     "batch_get_into_multi_buffers(keys, all_buffer_ptrs, all_sizes, "
     "prefer_alloc_in_same_node=False) -> list[int]: object i is read into its fragments, which "
     "must add up to its size exactly (else -600 before any I/O); sizes or negative codes. "
     "prefer_alloc_in_same_node selects grouped reads."},
    {"register_buffer", (PyCFunction)store_register, METH_VARARGS,
     "register_buffer(buffer_ptr, size) -> int: makes memory usable by the zero-copy calls."},
    {"unregister_buffer", (PyCFunction)store_unregister, METH_VARARGS,
     "unregister_buffer(buffer_ptr) -> int: waits for calls using it first."},
    {"remove", (PyCFunction)(void (*)(void))store_remove, METH_VARARGS | METH_KEYWORDS,
     "remove(key, force=False) -> int (-706 while a reader holds a lease, unless force)."},
    {"is_exist", (PyCFunction)store_is_exist, METH_VARARGS,
     "is_exist(key) -> int: 1, 0, or a negative code."},
    {"batch_is_exist", (PyCFunction)store_batch_is_exist, METH_VARARGS,
     "batch_is_exist(keys) -> list[int]"},
    {"get_size", (PyCFunction)store_get_size, METH_VARARGS,
     "get_size(key) -> int: the object size or a negative code."},
    {"close", (PyCFunction)store_close, METH_NOARGS,
     "close() -> int: waits for calls in flight, unmounts this process's segment."},
    {"get_hostname", (PyCFunction)store_get_hostname, METH_NOARGS,
     "get_hostname() -> str: the host name this store uses for same-node placement."},
    {"get_stats", (PyCFunction)store_get_stats, METH_NOARGS,
     "get_stats() -> dict: the client's counters (and latency quantiles in us)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject store_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstash.MooncakeDistributedStore",
    .tp_basicsize = sizeof(store_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MooncakeDistributedStore(): a kvstash store client with Mooncake's API. Call "
              "setup() first. Integer results: >= 0 success, negative codes with Mooncake's "
              "numbers (-600 invalid parameters, -704 object not found, -707 lease expired, "
              "-800 transfer failed, -900 RPC failed).",
    .tp_new = store_new,
    .tp_dealloc = (destructor)store_dealloc,
    .tp_methods = store_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvstash",
    .m_doc = "kvstash: a distributed object store for LLM KV cache. MooncakeDistributedStore "
             "follows Mooncake's store API, so code written for it switches by its import.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit_kvstash(void);

PyMODINIT_FUNC PyInit_kvstash(void)
{
    if (PyType_Ready(&store_type) < 0 || PyType_Ready(&replicate_config_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "MooncakeDistributedStore", (PyObject *)&store_type) < 0 ||
        PyModule_AddObjectRef(m, "ReplicateConfig", (PyObject *)&replicate_config_type) < 0 ||
        PyModule_AddStringConstant(m, "__version__", KVS_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
