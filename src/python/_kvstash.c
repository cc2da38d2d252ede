/* `kvstash._kvstash`, the native half of the `kvstash` package: the store's data paths with
 * Mooncake's method names, argument order, defaults and return conventions, over the public C
 * client API, and BufferHandle. kvstash/__init__.py subclasses the store with the conventions
 * that are plain Python (setup's argument rules, descriptor types). Every blocking call releases
 * the GIL; a store may be shared by many Python threads (calls in flight hold the store open,
 * and close waits for them). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <kvstash/kvstash.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common_int.h"
#include "proto/schema.h"

#include <limits.h>

/* Mooncake's default master address and setup sizes. */
#define DEFAULT_MASTER "127.0.0.1:50051"

/* ---- ReplicateConfig ------------------------------------------------------------------------- */

/* kvstash.ReplicateConfig (a Python class, registered by the package at import): its fields are
 * read by name, so subclasses work. */
static PyObject *config_class;

/* A put's placement converted for C: the strings it points to live here (the lists' strings
 * are held in tuples of their own, so a list changed by another thread during the call frees
 * nothing in use). rc_release() after every rc_convert(). */
typedef struct {
    kvs_replicate_config_t rc;
    char seg[KVS_MAX_NAME_LEN + 1];
    const char *pref[KVS_MAX_REPLICAS];
    const char **groups; /* PyMem */
    PyObject *hold_pref, *hold_groups;
} rc_holder_t;

static void rc_release(rc_holder_t *h)
{
    PyMem_Free(h->groups);
    h->groups = NULL;
    Py_CLEAR(h->hold_pref);
    Py_CLEAR(h->hold_groups);
}

/* A list or tuple of str as a tuple of its own whose strings' UTF-8 is made (so that
 * PyUnicode_AsUTF8 cannot fail on them after); NULL with TypeError naming `what` otherwise. */
static PyObject *str_tuple(PyObject *seq, const char *what)
{
    PyObject *t = PyList_Check(seq) || PyTuple_Check(seq) ? PySequence_Tuple(seq) : NULL;
    for (Py_ssize_t i = 0; t != NULL && i < PyTuple_GET_SIZE(t); i++) {
        PyObject *it = PyTuple_GET_ITEM(t, i);
        if (!PyUnicode_Check(it) || PyUnicode_AsUTF8(it) == NULL)
            Py_CLEAR(t);
    }
    if (t == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "ReplicateConfig.%s must be a list of str", what);
    }
    return t;
}

/* Reads one int field; -1 with an exception on a wrong type. */
static int rc_int(PyObject *obj, const char *name, long long lo, long long hi, long long *out)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v == NULL)
        return -1;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "ReplicateConfig.%s must be an int", name);
        Py_DECREF(v);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x < lo || x > hi ? LLONG_MIN : x;
    return 0;
}

/* Converts an optional ReplicateConfig (None: defaults). Returns 0, -1 with an exception set (a
 * wrong type), or RC_REFUSED for a value kvstash refuses (logged; the call answers -600). */
#define RC_REFUSED 1
static int rc_convert_fields(PyObject *obj, rc_holder_t *h);
static int rc_convert(PyObject *obj, rc_holder_t *h)
{
    kvs_replicate_config_t *rc = &h->rc;
    kvs_replicate_config_init(rc);
    h->groups = NULL;
    h->hold_pref = h->hold_groups = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    int r = rc_convert_fields(obj, h);
    if (r != 0)
        rc_release(h);
    return r;
}

static int rc_convert_fields(PyObject *obj, rc_holder_t *h)
{
    kvs_replicate_config_t *rc = &h->rc;
    if (config_class == NULL || PyObject_IsInstance(obj, config_class) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "config must be a kvstash.ReplicateConfig or None");
        return -1;
    }
    long long replicas, nof, dfs;
    if (rc_int(obj, "replica_num", 0, INT_MAX, &replicas) != 0 ||
        rc_int(obj, "nof_replica_num", 0, INT_MAX, &nof) != 0 ||
        rc_int(obj, "dfs_replica_num", 0, INT_MAX, &dfs) != 0)
        return -1;
    if (replicas == LLONG_MIN || nof != 0 || dfs != 0) {
        kvs_warn("ReplicateConfig: replica_num must be 1..%u, nof_replica_num and "
                 "dfs_replica_num 0 (kvstash keeps memory replicas only)",
                 KVS_MAX_REPLICAS);
        return RC_REFUSED;
    }
    rc->replica_num = (uint32_t)replicas;
    PyObject *same = PyObject_GetAttrString(obj, "prefer_alloc_in_same_node");
    if (same == NULL)
        return -1;
    int on = PyObject_IsTrue(same);
    Py_DECREF(same);
    if (on < 0)
        return -1;
    rc->prefer_alloc_in_same_node = on != 0;
    PyObject *pref = PyObject_GetAttrString(obj, "preferred_segment");
    if (pref == NULL)
        return -1;
    if (!PyUnicode_Check(pref)) {
        Py_DECREF(pref);
        PyErr_SetString(PyExc_TypeError, "ReplicateConfig.preferred_segment must be a str");
        return -1;
    }
    Py_ssize_t n;
    const char *t = PyUnicode_AsUTF8AndSize(pref, &n);
    if (t != NULL && n > 0 && (size_t)n < sizeof(h->seg)) {
        memcpy(h->seg, t, (size_t)n);
        h->seg[n] = '\0';
        rc->preferred_segment = h->seg;
    }
    Py_DECREF(pref);
    if (t == NULL)
        return -1;
    if ((size_t)n >= sizeof(h->seg)) {
        kvs_warn("ReplicateConfig: preferred_segment is longer than %u bytes", KVS_MAX_NAME_LEN);
        return RC_REFUSED;
    }
    /* preferred_segments: a segment for each copy, in order (after preferred_segment). */
    PyObject *segs = PyObject_GetAttrString(obj, "preferred_segments");
    if (segs == NULL)
        return -1;
    h->hold_pref = str_tuple(segs, "preferred_segments");
    Py_DECREF(segs);
    if (h->hold_pref == NULL)
        return -1;
    n = PyTuple_GET_SIZE(h->hold_pref);
    if (n > (Py_ssize_t)KVS_MAX_REPLICAS) {
        kvs_warn("ReplicateConfig: at most %u preferred_segments", KVS_MAX_REPLICAS);
        return RC_REFUSED;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        h->pref[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(h->hold_pref, i));
    rc->preferred_segments = h->pref;
    rc->npreferred_segments = (size_t)n;
    long long action;
    if (rc_int(obj, "soft_pin_action", 0, 2, &action) != 0)
        return -1;
    if (action == LLONG_MIN) {
        kvs_warn("ReplicateConfig: soft_pin_action must be a SoftPinAction (0, 1 or 2)");
        return RC_REFUSED;
    }
    rc->soft_pin_action = (kvs_soft_pin_action_t)action;
    PyObject *ttl = PyObject_GetAttrString(obj, "soft_pin_ttl_ms");
    if (ttl == NULL)
        return -1;
    if (ttl != Py_None) {
        unsigned long long ms = PyLong_Check(ttl) ? PyLong_AsUnsignedLongLong(ttl) : 0;
        bool ok = PyLong_Check(ttl) && !PyErr_Occurred();
        PyErr_Clear();
        Py_DECREF(ttl);
        if (!ok) {
            kvs_warn("ReplicateConfig: soft_pin_ttl_ms must be None or an int >= 0");
            return RC_REFUSED;
        }
        rc->soft_pin_ttl_set = true;
        rc->soft_pin_ttl_ms = ms;
    } else {
        Py_DECREF(ttl);
    }
    PyObject *hard = PyObject_GetAttrString(obj, "with_hard_pin");
    if (hard == NULL)
        return -1;
    on = PyObject_IsTrue(hard);
    Py_DECREF(hard);
    if (on < 0)
        return -1;
    rc->with_hard_pin = on != 0;
    /* group_ids: one group for every key of the call, or one per key. */
    PyObject *groups = PyObject_GetAttrString(obj, "group_ids");
    if (groups == NULL)
        return -1;
    if (groups == Py_None) {
        Py_DECREF(groups);
        return 0;
    }
    h->hold_groups = str_tuple(groups, "group_ids");
    Py_DECREF(groups);
    if (h->hold_groups == NULL)
        return -1;
    Py_ssize_t ng = PyTuple_GET_SIZE(h->hold_groups);
    if ((h->groups = PyMem_Calloc((size_t)ng + 1, sizeof(*h->groups))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < ng; i++)
        h->groups[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(h->hold_groups, i));
    rc->group_ids = h->groups;
    rc->ngroup_ids = (size_t)ng;
    return 0;
}

/* Registers the package's ReplicateConfig class. */
static PyObject *mod_register_config(PyObject *m, PyObject *cls)
{
    (void)m;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "_register_config takes a class");
        return NULL;
    }
    Py_XSETREF(config_class, Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* A size string ("16MB", "4GiB") as an int; -1 when it is not one. */
static PyObject *mod_parse_size(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *t = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (t == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_parse_size takes a str");
        return NULL;
    }
    uint64_t v;
    if (kvs__parse_size(t, &v) != KVS_OK || v > (uint64_t)LLONG_MAX)
        return PyLong_FromLong(-1);
    return PyLong_FromUnsignedLongLong(v);
}

/* ---- BufferHandle ---------------------------------------------------------------------------- */

/* An object read into memory of its own (get_buffer): valid until release() or garbage
 * collection, whatever happens to the key meanwhile. Exposes the buffer protocol (1-D bytes,
 * writable, format 'b' as Mooncake's). */
typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t size;
    Py_ssize_t exports; /* buffer views alive: the memory cannot go before them */
} buffer_handle_t;

static PyTypeObject buffer_handle_type;

static PyObject *handle_new(void *data, size_t size)
{
    buffer_handle_t *h = PyObject_New(buffer_handle_t, &buffer_handle_type);
    if (h == NULL) {
        kvs_free(data);
        return NULL;
    }
    h->data = data;
    h->size = (Py_ssize_t)size;
    h->exports = 0;
    return (PyObject *)h;
}

static void handle_dealloc(buffer_handle_t *h)
{
    kvs_free(h->data);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static int handle_getbuffer(buffer_handle_t *h, Py_buffer *view, int flags)
{
    if (h->data == NULL && h->size > 0) {
        PyErr_SetString(PyExc_BufferError, "BufferHandle was released");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)h, h->data, h->size, 0, flags) != 0)
        return -1;
    if ((flags & PyBUF_FORMAT) == PyBUF_FORMAT)
        view->format = "b";
    h->exports++;
    return 0;
}

static void handle_releasebuffer(buffer_handle_t *h, Py_buffer *view)
{
    (void)view;
    h->exports--;
}

static PyObject *handle_ptr(buffer_handle_t *h, PyObject *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(h->data);
}

static PyObject *handle_size(buffer_handle_t *h, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(h->size);
}

static Py_ssize_t handle_len(buffer_handle_t *h)
{
    return h->size;
}

static PyObject *handle_release(buffer_handle_t *h, PyObject *unused)
{
    (void)unused;
    if (h->exports > 0) {
        PyErr_SetString(PyExc_BufferError,
                        "BufferHandle.release: memoryviews of it are still alive");
        return NULL;
    }
    kvs_free(h->data);
    h->data = NULL;
    h->size = 0;
    Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"ptr", (PyCFunction)handle_ptr, METH_NOARGS, "ptr() -> int: the address of the bytes."},
    {"size", (PyCFunction)handle_size, METH_NOARGS, "size() -> int: the object's size."},
    {"release", (PyCFunction)handle_release, METH_NOARGS,
     "release(): frees the memory now (BufferError while memoryviews of it are alive); the "
     "handle is then empty. Garbage collection frees it otherwise."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs handle_as_buffer = {
    .bf_getbuffer = (getbufferproc)handle_getbuffer,
    .bf_releasebuffer = (releasebufferproc)handle_releasebuffer,
};

static PySequenceMethods handle_as_sequence = {.sq_length = (lenfunc)handle_len};

static PyObject *handle_no_new(PyTypeObject *t, PyObject *a, PyObject *k)
{
    (void)t;
    (void)a;
    (void)k;
    PyErr_SetString(PyExc_TypeError, "BufferHandle has no constructor: get_buffer() makes one");
    return NULL;
}

static PyTypeObject buffer_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstash.BufferHandle",
    .tp_basicsize = sizeof(buffer_handle_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An object read into memory of its own by get_buffer()/batch_get_buffer(): "
              "ptr(), size(), len() and the buffer protocol. Valid until release() or garbage "
              "collection, whatever happens to the key.",
    .tp_new = handle_no_new,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
    .tp_as_buffer = &handle_as_buffer,
    .tp_as_sequence = &handle_as_sequence,
};

/* ---- the store ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD kvs_client_t *client;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int inflight;
    bool opening;                        /* a setup() is connecting (with the GIL released) */
    bool dummy;                          /* set up by setup_dummy() */
    char hostname[KVS_MAX_NAME_LEN + 1]; /* get_hostname(): the segment's name */
    /* Fragment lists' working memory, kept between calls (taken and given back with the GIL
     * held; a call that finds it taken allocates its own): fresh megabytes each call cost more
     * in page faults than converting the lists. */
    void *scratch;
    size_t scratch_cap;
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

/* The store's scratch when it holds `bytes` (taken: a concurrent call allocates its own), else
 * a fresh block; with the GIL held. *cap_p: the block's size, for scratch_give. */
static void *scratch_take(store_t *s, size_t bytes, size_t *cap_p)
{
    void *p = s->scratch;
    size_t cap = s->scratch_cap;
    s->scratch = NULL;
    s->scratch_cap = 0;
    if (p == NULL || cap < bytes) {
        PyMem_Free(p);
        cap = bytes;
        p = PyMem_Malloc(cap);
    }
    *cap_p = p != NULL ? cap : 0;
    return p;
}

/* Beyond this a block is not kept (about 1M fragments). */
#define SCRATCH_KEEP_MAX (32u << 20)

static void scratch_give(store_t *s, void *p, size_t cap)
{
    if (p != NULL && s->scratch == NULL && cap <= SCRATCH_KEEP_MAX) {
        s->scratch = p;
        s->scratch_cap = cap;
    } else {
        PyMem_Free(p);
    }
}

static void store_dealloc(store_t *s)
{
    PyMem_Free(s->scratch);
    s->scratch = NULL;
    s->scratch_cap = 0;
    Py_BEGIN_ALLOW_THREADS store_shutdown(s);
    Py_END_ALLOW_THREADS pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

PyDoc_STRVAR(open_doc,
             "_open(master, protocol, node, segment_size, segment_name, tenant, token_file, tls, "
             "dummy) -> int: connects (and mounts a segment when segment_size > 0, named "
             "segment_name or node:data-port). The package's setup() and setup_dummy() check "
             "their arguments and call it. token_file None: $KVS_AUTH_TOKEN_FILE; tls -1: "
             "$KVS_TLS. 0, or a negative code; a second open is -600.");

static PyObject *store_open(store_t *self, PyObject *args)
{
    const char *master, *proto, *node, *name, *tenant, *token_file;
    unsigned long long seg_size;
    int tls, dummy;
    if (!PyArg_ParseTuple(args, "sssKzzzip", &master, &proto, &node, &seg_size, &name, &tenant,
                          &token_file, &tls, &dummy))
        return NULL;
    /* One setup at a time: a second, concurrent or later, gets -600 and opens nothing. */
    pthread_mutex_lock(&self->lock);
    bool already = self->client != NULL || self->opening;
    if (!already)
        self->opening = true;
    pthread_mutex_unlock(&self->lock);
    if (already) {
        kvs_warn("setup: this store is set up already (close() it first)");
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    }
    /* Copies: the GIL is released while they are used. */
    char masterbuf[512], protobuf[32], nodebuf[KVS_MAX_NAME_LEN + 1], namebuf[KVS_MAX_NAME_LEN + 1],
        tenantbuf[128], tokenbuf[4096];
    int rc = KVS_OK;
    if (snprintf(masterbuf, sizeof(masterbuf), "%s", master) >= (int)sizeof(masterbuf) ||
        snprintf(protobuf, sizeof(protobuf), "%s", proto) >= (int)sizeof(protobuf) ||
        snprintf(nodebuf, sizeof(nodebuf), "%s", node) >= (int)sizeof(nodebuf) ||
        snprintf(namebuf, sizeof(namebuf), "%s", name ? name : "") >= (int)sizeof(namebuf) ||
        snprintf(tenantbuf, sizeof(tenantbuf), "%s", tenant ? tenant : "") >=
            (int)sizeof(tenantbuf) ||
        snprintf(tokenbuf, sizeof(tokenbuf), "%s", token_file ? token_file : "") >=
            (int)sizeof(tokenbuf)) {
        kvs_warn("setup: an argument is too long");
        rc = KVS_INVALID_PARAMS;
    }
    kvs_client_config_t ccfg;
    kvs_client_config_init(&ccfg);
    ccfg.master = masterbuf;
    ccfg.protocol = protobuf;
    ccfg.local_hostname = nodebuf[0] ? nodebuf : NULL;
    if (token_file != NULL) /* else KVS_AUTH_TOKEN_FILE, read by config_init */
        ccfg.auth_token_file = tokenbuf;
    if (tls >= 0) /* else KVS_TLS */
        ccfg.tls = tls != 0;
    ccfg.tenant = tenantbuf[0] ? tenantbuf : NULL; /* else KVS_TENANT */
    kvs_client_t *c = NULL;
    Py_BEGIN_ALLOW_THREADS if (rc == KVS_OK) rc = kvs_client_open(&ccfg, &c);
    if (rc == KVS_OK && seg_size > 0) {
        rc = kvs_client_mount_segment(c, seg_size, namebuf[0] ? namebuf : NULL, NULL);
        if (rc != KVS_OK) {
            kvs_client_close(c);
            c = NULL;
        }
    }
    Py_END_ALLOW_THREADS if (rc != KVS_OK) kvs_warn("setup failed: %s", kvs_last_error());
    pthread_mutex_lock(&self->lock);
    self->client = c;
    self->opening = false;
    self->dummy = dummy != 0;
    if (c == NULL)
        self->hostname[0] = '\0';
    else if (dummy)
        self->hostname[0] = '\0'; /* Mooncake's dummy clients have no segment name */
    else if (seg_size > 0 && kvs_client_segment_name(c, 0) != NULL)
        snprintf(self->hostname, sizeof(self->hostname), "%s", kvs_client_segment_name(c, 0));
    else
        snprintf(self->hostname, sizeof(self->hostname), "%s", name ? name : node);
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromLong(rc);
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

/* An int as 64 bits (-1 with an exception when negative or too large). CPython's
 * PyLong_AsUnsignedLongLong takes a byte-by-byte path for every value past 2^30, which
 * addresses always are; PyLong_AsUnsignedLong reads the digits directly. */
static uint64_t as_u64(PyObject *o)
{
#if ULONG_MAX == UINT64_MAX
    return PyLong_AsUnsignedLong(o);
#else
    return PyLong_AsUnsignedLongLong(o);
#endif
}

/* An int sequence of exactly n entries into out[]. */
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
        out[i] = as_u64(items[i]);
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

/* Mooncake's convention: a put of a key that exists is a success that keeps the first value. */
static int put_code(int r)
{
    return r == KVS_OBJECT_ALREADY_EXISTS ? KVS_OK : r;
}

/* put / upsert(key, value, config=None): value is any bytes-like object (copied). */
static PyObject *value_put(store_t *self, PyObject *args, PyObject *kw, bool upsert)
{
    static char *names[] = {"key", "value", "config", NULL};
    const char *key;
    Py_buffer value;
    PyObject *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*|O", names, &key, &value, &cfg))
        return NULL;
    rc_holder_t h = {0};
    int r = rc_convert(cfg, &h);
    if (r < 0) {
        PyBuffer_Release(&value);
        return NULL;
    }
    kvs_client_t *c = r == 0 ? store_enter(self) : NULL;
    if (c != NULL) {
        Py_BEGIN_ALLOW_THREADS r =
            upsert ? kvs_client_upsert(c, key, value.buf, (size_t)value.len, &h.rc)
                   : put_code(kvs_client_put(c, key, value.buf, (size_t)value.len, &h.rc));
        Py_END_ALLOW_THREADS store_leave(self);
    } else {
        r = KVS_INVALID_PARAMS;
    }
    PyBuffer_Release(&value);
    rc_release(&h);
    return PyLong_FromLong(r);
}

static PyObject *store_put(store_t *self, PyObject *args, PyObject *kw)
{
    return value_put(self, args, kw, false);
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
    rc_holder_t h = {0};
    int r = rc_convert(cfg, &h);
    if (r < 0)
        return NULL;
    if (r != 0)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    kvs_client_t *c = size == 0 ? NULL : store_enter(self);
    if (size == 0) {
        r = 0; /* Mooncake: nothing to store is a success */
    } else if (c == NULL) {
        r = NOT_SET_UP;
    } else {
        Py_BEGIN_ALLOW_THREADS r = put_code(
            kvs_client_put_from(c, key, (const void *)(uintptr_t)ptr, (size_t)size, &h.rc));
        Py_END_ALLOW_THREADS store_leave(self);
    }
    rc_release(&h);
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
        res[i] = put_code(ires[i]);
    return int_list(res, n);
}

/* keys + one buffer per key (put: results are statuses, get: sizes). */
enum { OP_GET, OP_PUT, OP_UPSERT };

static PyObject *batch_single(store_t *self, PyObject *keys_o, PyObject *ptrs_o, PyObject *sizes_o,
                              PyObject *cfg, int op)
{
    bool put = op != OP_GET;
    rc_holder_t h = {0};
    int cr = put ? rc_convert(cfg, &h) : 0;
    if (cr < 0)
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL) {
        rc_release(&h);
        return NULL;
    }
    if (cr != 0) {
        PyMem_Free(keys);
        Py_DECREF(hold);
        return same_code_list(n, KVS_INVALID_PARAMS);
    }
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
    Py_BEGIN_ALLOW_THREADS if (op == OP_GET) r =
        kvs_client_batch_get_into(c, (size_t)n, keys, bufs, res);
    else if (op == OP_UPSERT) r =
        kvs_client_batch_upsert_from(c, (size_t)n, keys, bufs, &h.rc, ires);
    else r = kvs_client_batch_put_from(c, (size_t)n, keys, bufs, &h.rc, ires);
    Py_END_ALLOW_THREADS store_leave(self);
    out = batch_results(r, n, res, ires, put);
done:
    rc_release(&h);
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
    return batch_single(self, k, p, s, cfg, OP_PUT);
}

static PyObject *store_batch_upsert_from(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "buffer_ptrs", "sizes", "config", NULL};
    PyObject *k, *p, *s, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O", names, &k, &p, &s, &cfg))
        return NULL;
    return batch_single(self, k, p, s, cfg, OP_UPSERT);
}

static PyObject *store_batch_get_into(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "buffer_ptrs", "sizes", NULL};
    PyObject *k, *p, *s;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", names, &k, &p, &s))
        return NULL;
    return batch_single(self, k, p, s, NULL, OP_GET);
}

/* keys + a list of fragments per key. */
/* op: OP_GET, OP_PUT (registered memory), or OP_PUT_ANY / OP_UPSERT_ANY (any memory). */
enum { OP_PUT_ANY = OP_UPSERT + 1, OP_UPSERT_ANY };

static PyObject *batch_multi(store_t *self, PyObject *keys_o, PyObject *ptrs_o, PyObject *sizes_o,
                             PyObject *cfg, int op, bool same_node)
{
    bool put = op != OP_GET;
    rc_holder_t h = {0};
    int cr = put ? rc_convert(cfg, &h) : 0;
    if (cr < 0)
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL) {
        rc_release(&h);
        return NULL;
    }
    if (cr != 0) {
        PyMem_Free(keys);
        Py_DECREF(hold);
        return same_code_list(n, KVS_INVALID_PARAMS);
    }
    PyObject *out = NULL;
    kvs_buf_t *frags = NULL;
    uint64_t *tmp_p = NULL, *tmp_s = NULL;
    size_t scratch_cap = 0;
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
    /* frags, then the pointers and sizes as converted, in one block of working memory. */
    if (total >= PY_SSIZE_T_MAX / (sizeof(*frags) + 2 * sizeof(uint64_t))) {
        PyErr_NoMemory();
        goto done;
    }
    frags = scratch_take(self, (total + 1) * (sizeof(*frags) + 2 * sizeof(uint64_t)), &scratch_cap);
    if (frags == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    tmp_p = (uint64_t *)(frags + total + 1);
    tmp_s = tmp_p + total + 1;
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
    Py_BEGIN_ALLOW_THREADS if (op == OP_PUT) r =
        kvs_client_batch_put_from_multi(c, (size_t)n, keys, bufs, nbufs, &h.rc, ires);
    else if (put) r = kvs_client_batch_put_multi(c, (size_t)n, keys, bufs, nbufs, &h.rc,
                                                 op == OP_UPSERT_ANY, ires);
    else r =
        kvs_client_batch_get_into_multi_buffers(c, (size_t)n, keys, bufs, nbufs, same_node, res);
    Py_END_ALLOW_THREADS store_leave(self);
    out = batch_results(r, n, res, ires, put);
done:
    rc_release(&h);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    PyMem_Free(bufs);
    PyMem_Free(nbufs);
    PyMem_Free(res);
    PyMem_Free(ires);
    scratch_give(self, frags, scratch_cap);
    return out;
}

/* ---- page-table calls -------------------------------------------------------------------------
 */

/* Copies `count` page ids of a buffer's items (format `fmt`, `itemsize` bytes each: 4- or 8-byte
 * integers) into out. 1: a value negative or past 2^32 - 1 (the caller answers -600); -1: an
 * unsupported format (TypeError set). No Python object per element. */
static int ids_from_items(const void *buf, const char *fmt, Py_ssize_t itemsize, size_t count,
                          uint32_t *out)
{
    char f = fmt == NULL ? 'B' : fmt[0];
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (f == '<')
        f = fmt[1]; /* little-endian: native here */
#endif
    if (f == '@' || f == '=')
        f = fmt[1];
    bool sign = f == 'i' || f == 'l' || f == 'q' || f == 'n';
    bool usign = f == 'I' || f == 'L' || f == 'Q' || f == 'N';
    if ((!sign && !usign) || (itemsize != 4 && itemsize != 8)) {
        PyErr_Format(PyExc_TypeError,
                     "page_ids: 4- or 8-byte integers wanted (int32, uint32, int64, uint64), "
                     "not format '%s'",
                     fmt ? fmt : "B");
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        int64_t v;
        uint64_t u;
        if (itemsize == 4) {
            int32_t a;
            uint32_t b;
            memcpy(&a, (const char *)buf + 4 * i, 4);
            memcpy(&b, (const char *)buf + 4 * i, 4);
            v = sign ? a : 0;
            u = sign ? (uint64_t)(a < 0 ? 0 : a) : b;
        } else {
            memcpy(&v, (const char *)buf + 8 * i, 8);
            memcpy(&u, (const char *)buf + 8 * i, 8);
        }
        if ((sign && (v < 0 || v > (int64_t)UINT32_MAX)) || (!sign && u > UINT32_MAX))
            return 1;
        out[i] = (uint32_t)(sign ? (uint64_t)v : u);
    }
    return 0;
}

static int page_ids_of_items(PyObject *o, Py_ssize_t n, uint32_t **ids_p, size_t *npages);

/* Page ids of n keys: a C-contiguous buffer (numpy array, array.array, memoryview) of shape
 * (n, pages) or (n * pages,), or a sequence of n per-key buffers or lists of int. *ids_p
 * (PyMem) and npages[0..n). 0 ok, 1 a bad value (-600), -1 a Python error. */
static int page_ids_from(PyObject *o, Py_ssize_t n, uint32_t **ids_p, size_t *npages)
{
    *ids_p = NULL;
    if (PyObject_CheckBuffer(o)) {
        Py_buffer v;
        if (PyObject_GetBuffer(o, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
            return -1;
        size_t count = v.itemsize > 0 ? (size_t)(v.len / v.itemsize) : 0;
        int r = 0;
        if (v.ndim == 2 ? v.shape[0] != n : v.ndim != 1 || count % (size_t)n != 0 || count == 0)
            r = 1; /* not n keys' worth (or not 1-D or 2-D): -600 */
        uint32_t *ids = r == 0 ? PyMem_Malloc(count * sizeof(*ids) + 1) : NULL;
        if (r == 0 && ids == NULL) {
            PyErr_NoMemory();
            r = -1;
        }
        if (r == 0)
            r = ids_from_items(v.buf, v.format, v.itemsize, count, ids);
        PyBuffer_Release(&v);
        if (r != 0) {
            PyMem_Free(ids);
            return r;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            npages[i] = count / (size_t)n;
        *ids_p = ids;
        return 0;
    }
    if (!PyList_Check(o) && !PyTuple_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "page_ids must be an integer array (buffer protocol) "
                                         "or a list of per-key arrays or lists of int");
        return -1;
    }
    /* A snapshot: the items' own code (__len__, __iter__, buffers) may change the caller's list
     * while we read it. */
    PyObject *snap = PySequence_Tuple(o);
    if (snap == NULL)
        return -1;
    int rc = page_ids_of_items(snap, n, ids_p, npages);
    Py_DECREF(snap);
    return rc;
}

static int page_ids_of_items(PyObject *o, Py_ssize_t n, uint32_t **ids_p, size_t *npages)
{
    if (PyTuple_GET_SIZE(o) != n)
        return 1;
    PyObject **items = PySequence_Fast_ITEMS(o);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = PyObject_CheckBuffer(items[i]) ? -1 : PySequence_Size(items[i]);
        if (m == -1 && PyObject_CheckBuffer(items[i])) {
            Py_buffer v;
            if (PyObject_GetBuffer(items[i], &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
                return -1;
            m = v.itemsize > 0 ? v.len / v.itemsize : 0;
            PyBuffer_Release(&v);
        } else if (m < 0) {
            return -1;
        }
        npages[i] = (size_t)m;
        total += (size_t)m;
    }
    uint32_t *ids = PyMem_Malloc(total * sizeof(*ids) + 1);
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = 0;
        if (PyObject_CheckBuffer(items[i])) {
            Py_buffer v;
            if (PyObject_GetBuffer(items[i], &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
                PyMem_Free(ids);
                return -1;
            }
            size_t cnt = v.itemsize > 0 ? (size_t)(v.len / v.itemsize) : 0;
            r = cnt == npages[i] ? ids_from_items(v.buf, v.format, v.itemsize, cnt, ids + at) : 1;
            PyBuffer_Release(&v);
        } else {
            uint64_t *tmp = PyMem_Malloc(npages[i] * sizeof(*tmp) + 1);
            PyObject *seq = tmp ? PySequence_Fast(items[i], "page ids") : NULL;
            r = seq == NULL ? -1 : ints_from(seq, (Py_ssize_t)npages[i], "page_ids", tmp);
            for (size_t j = 0; r == 0 && j < npages[i]; j++) {
                if (tmp[j] > UINT32_MAX)
                    r = 1;
                else
                    ids[at + j] = (uint32_t)tmp[j];
            }
            if (r < 0 && PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear(); /* a negative id: a bad value, -600 */
                r = 1;
            }
            Py_XDECREF(seq);
            if (tmp == NULL) {
                PyErr_NoMemory();
                r = -1;
            }
            PyMem_Free(tmp);
        }
        if (r != 0) {
            PyMem_Free(ids);
            return r;
        }
        at += npages[i];
    }
    *ids_p = ids;
    return 0;
}

/* Regions: a sequence of (base, page_bytes, stride, npages) tuples of int. 0 ok, 1 a value out
 * of range (-600), -1 a Python error. */
static int regions_from(PyObject *o, kvs_page_region_t **rg_p, size_t *n_p)
{
    *rg_p = NULL;
    if (!PyList_Check(o) && !PyTuple_Check(o)) {
        PyErr_SetString(PyExc_TypeError,
                        "regions must be a list of (base, page_bytes, stride, npages) tuples");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    kvs_page_region_t *rg = PyMem_Calloc((size_t)n + 1, sizeof(*rg));
    if (rg == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v[4] = {0};
        bool bad = !PyTuple_Check(items[i]) || PyTuple_GET_SIZE(items[i]) != 4;
        for (int j = 0; !bad && j < 4; j++) {
            PyObject *x = PyTuple_GET_ITEM(items[i], j);
            bad = !PyLong_Check(x);
            v[j] = bad ? 0 : as_u64(x);
            if (!bad && PyErr_Occurred()) { /* negative or past 2^64: a bad value, -600 */
                PyErr_Clear();
                PyMem_Free(rg);
                return 1;
            }
        }
        if (bad) {
            PyErr_SetString(PyExc_TypeError,
                            "each region is (base, page_bytes, stride, npages), four ints");
            PyMem_Free(rg);
            return -1;
        }
        rg[i] = (kvs_page_region_t){(void *)(uintptr_t)v[0], (size_t)v[1], (size_t)v[2], v[3]};
    }
    *rg_p = rg;
    *n_p = (size_t)n;
    return 0;
}

/* batch_get_into_pages / batch_put_from_pages (see their docstrings). */
static PyObject *pages_call(store_t *self, PyObject *keys_o, PyObject *regions_o, PyObject *ids_o,
                            const char *order_s, bool put, PyObject *cfg, bool same_node)
{
    rc_holder_t h = {0};
    int cr = put ? rc_convert(cfg, &h) : 0;
    if (cr < 0)
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL, *out = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL) {
        rc_release(&h);
        return NULL;
    }
    kvs_page_region_t *rg = NULL;
    size_t nr = 0;
    uint32_t *ids = NULL;
    size_t *npages = PyMem_Calloc((size_t)n + 1, sizeof(*npages));
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    int *ires = PyMem_Calloc((size_t)n + 1, sizeof(*ires));
    if (npages == NULL || res == NULL || ires == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int order = order_s != NULL && strcmp(order_s, "page") == 0     ? KVS_PAGE_MAJOR
                : order_s != NULL && strcmp(order_s, "region") == 0 ? KVS_REGION_MAJOR
                                                                    : -1;
    if (order < 0) {
        PyErr_SetString(PyExc_ValueError, "order must be 'page' or 'region'");
        goto done;
    }
    int gr = regions_from(regions_o, &rg, &nr);
    if (gr < 0)
        goto done;
    int ir = n > 0 ? page_ids_from(ids_o, n, &ids, npages) : 1;
    if (ir < 0)
        goto done;
    if (ir > 0 || gr > 0 || cr != 0) {
        out = same_code_list(n, KVS_INVALID_PARAMS);
        goto done;
    }
    kvs_client_t *c = store_enter(self);
    if (c == NULL) {
        out = same_code_list(n, NOT_SET_UP);
        goto done;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS if (put) r = kvs_client_batch_put_from_pages(
        c, (size_t)n, keys, rg, nr, (kvs_page_order_t)order, ids, npages, &h.rc, ires);
    else r = kvs_client_batch_get_into_pages(c, (size_t)n, keys, rg, nr, (kvs_page_order_t)order,
                                             ids, npages, same_node, res);
    Py_END_ALLOW_THREADS store_leave(self);
    out = batch_results(r, n, res, ires, put);
done:
    rc_release(&h);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    PyMem_Free(rg);
    PyMem_Free(ids);
    PyMem_Free(npages);
    PyMem_Free(res);
    PyMem_Free(ires);
    return out;
}

static PyObject *store_get_into_pages(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "regions", "page_ids", "order", "prefer_alloc_in_same_node",
                            NULL};
    PyObject *k, *r, *i;
    const char *order = "page";
    int same = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|sp", names, &k, &r, &i, &order, &same))
        return NULL;
    return pages_call(self, k, r, i, order, false, NULL, same != 0);
}

static PyObject *store_put_from_pages(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "regions", "page_ids", "order", "config", NULL};
    PyObject *k, *r, *i, *cfg = NULL;
    const char *order = "page";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|sO", names, &k, &r, &i, &order, &cfg))
        return NULL;
    return pages_call(self, k, r, i, order, true, cfg, false);
}

/* _put_frags(keys, all_buffer_ptrs, all_sizes, config=None, upsert=False) -> [code per key]:
 * object i gathered from its fragments in any memory (the tensor calls' header and payload),
 * with Mooncake's put codes (0 for an existing key unless upserting). */
static PyObject *store_put_frags(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", "config", "upsert", NULL};
    PyObject *k, *p, *s, *cfg = NULL;
    int upsert = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|Op", names, &k, &p, &s, &cfg, &upsert))
        return NULL;
    return batch_multi(self, k, p, s, cfg, upsert ? OP_UPSERT_ANY : OP_PUT_ANY, false);
}

static PyObject *store_batch_put_multi(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", "config", NULL};
    PyObject *k, *p, *s, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|O", names, &k, &p, &s, &cfg))
        return NULL;
    return batch_multi(self, k, p, s, cfg, OP_PUT, false);
}

static PyObject *store_batch_get_multi(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", "prefer_alloc_in_same_node",
                            NULL};
    PyObject *k, *p, *s;
    int same = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|p", names, &k, &p, &s, &same))
        return NULL;
    return batch_multi(self, k, p, s, NULL, OP_GET, same != 0);
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
    Py_END_ALLOW_THREADS pthread_mutex_lock(&self->lock);
    self->hostname[0] = '\0';
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromLong(0);
}

static PyObject *store_get_hostname(store_t *self, PyObject *unused)
{
    (void)unused;
    char name[sizeof(self->hostname)];
    pthread_mutex_lock(&self->lock);
    memcpy(name, self->hostname, sizeof(name));
    pthread_mutex_unlock(&self->lock);
    return PyUnicode_FromString(name);
}

/* Mooncake's health codes. */
#define HC_HEALTHY            0
#define HC_NOT_INITIALIZED    1
#define HC_MASTER_UNREACHABLE 2

static PyObject *store_health_check(store_t *self, PyObject *unused)
{
    (void)unused;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(HC_NOT_INITIALIZED);
    int r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_ping(c);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLong(r == KVS_OK ? HC_HEALTHY : HC_MASTER_UNREACHABLE);
}

/* ---- reads into memory of their own ---------------------------------------------------------- */

/* Reads every key whole into new memory: data[i] (kvs_free) and sizes[i] where res[i] >= 0.
 * Returns the call's status (KVS_OK: per-key results in res). */
static int read_whole(kvs_client_t *c, size_t n, const char *const *keys, void **data,
                      size_t *sizes, int64_t *res)
{
    return kvs_client_batch_get(c, n, keys, data, sizes, res);
}

/* get_batch / batch_get_buffer: one list entry per key, `miss` for a failed key. */
static PyObject *whole_reads(store_t *self, PyObject *keys_o, bool handles)
{
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    PyObject *out = PyList_New(n);
    void **data = PyMem_Calloc((size_t)n + 1, sizeof(*data));
    size_t *sizes = PyMem_Calloc((size_t)n + 1, sizeof(*sizes));
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    if (out == NULL || data == NULL || sizes == NULL || res == NULL) {
        Py_XDECREF(out);
        out = PyErr_NoMemory();
        goto done;
    }
    kvs_client_t *c = n > 0 ? store_enter(self) : NULL;
    int r = KVS_INVALID_PARAMS;
    if (c != NULL) {
        Py_BEGIN_ALLOW_THREADS r = read_whole(c, (size_t)n, keys, data, sizes, res);
        Py_END_ALLOW_THREADS store_leave(self);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v;
        bool ok = r == KVS_OK && res[i] >= 0 && data[i] != NULL && sizes[i] > 0;
        if (handles && ok) {
            v = handle_new(data[i], sizes[i]); /* owns the memory now */
            data[i] = NULL;
        } else if (handles) {
            v = Py_NewRef(Py_None);
        } else {
            v = PyBytes_FromStringAndSize(ok ? data[i] : "", ok ? (Py_ssize_t)sizes[i] : 0);
        }
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
done:
    for (Py_ssize_t i = 0; data != NULL && i < n; i++)
        kvs_free(data[i]);
    PyMem_Free(data);
    PyMem_Free(sizes);
    PyMem_Free(res);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    return out;
}

static PyObject *store_get_batch(store_t *self, PyObject *keys)
{
    return whole_reads(self, keys, false);
}

static PyObject *store_batch_get_buffer(store_t *self, PyObject *keys)
{
    return whole_reads(self, keys, true);
}

static PyObject *store_get_buffer(store_t *self, PyObject *key)
{
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be a str");
        return NULL;
    }
    PyObject *one = PyList_New(1);
    if (one == NULL)
        return NULL;
    PyList_SET_ITEM(one, 0, Py_NewRef(key));
    PyObject *l = whole_reads(self, one, true);
    Py_DECREF(one);
    if (l == NULL)
        return NULL;
    PyObject *h = Py_NewRef(PyList_GET_ITEM(l, 0));
    Py_DECREF(l);
    return h;
}

/* put_from_with_metadata: the object is the metadata bytes, then the data bytes (both in
 * registered memory). */
static PyObject *store_put_with_metadata(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"key",    "buffer_ptr", "metadata_buffer_ptr", "size", "metadata_size",
                            "config", NULL};
    const char *key;
    unsigned long long ptr, mptr, size, msize;
    PyObject *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKKKK|O", names, &key, &ptr, &mptr, &size, &msize,
                                     &cfg))
        return NULL;
    rc_holder_t h = {0};
    int r = rc_convert(cfg, &h);
    if (r < 0)
        return NULL;
    if (r != 0)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    kvs_buf_t frags[2] = {{(void *)(uintptr_t)mptr, (size_t)msize},
                          {(void *)(uintptr_t)ptr, (size_t)size}};
    const kvs_buf_t *one = msize > 0 ? &frags[0] : &frags[1];
    size_t nfrags = msize > 0 ? 2 : 1;
    kvs_client_t *c = size == 0 ? NULL : store_enter(self);
    int res = 0;
    if (size == 0) {
        r = 0; /* Mooncake: no data, nothing stored */
    } else if (c == NULL) {
        r = NOT_SET_UP;
    } else {
        Py_BEGIN_ALLOW_THREADS r =
            kvs_client_batch_put_from_multi(c, 1, &key, &one, &nfrags, &h.rc, &res);
        Py_END_ALLOW_THREADS store_leave(self);
        r = put_code(r == KVS_OK ? res : r);
    }
    rc_release(&h);
    return PyLong_FromLong(r);
}

static int add_u64(PyObject *d, const char *k, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    int r = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return r;
}

/* _serve_metrics(port, bind=None) -> int: the client's Prometheus endpoint (0 or a negative
 * code, with the reason logged); port 0 picks a free one (metrics_port() tells). */
static PyObject *store_serve_metrics(store_t *self, PyObject *args)
{
    int port;
    const char *bind = NULL;
    if (!PyArg_ParseTuple(args, "i|z", &port, &bind))
        return NULL;
    if (port < 0 || port > 65535)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    int rc = kvs_client_serve_metrics(c, bind, (uint16_t)port);
    store_leave(self);
    if (rc != KVS_OK)
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "kvstash: no client metrics endpoint: %s",
                         kvs_last_error());
    return rc == KVS_OK || !PyErr_Occurred() ? PyLong_FromLong(rc) : NULL;
}

static PyObject *store_metrics_port(store_t *self, PyObject *unused)
{
    (void)unused;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(0);
    int port = kvs_client_metrics_port(c);
    store_leave(self);
    return PyLong_FromLong(port);
}

static int add_hist(PyObject *d, const char *name, const kvs_histogram_t *h)
{
    static const struct {
        const char *suffix;
        double q;
    } qs[] = {{"p50_us", 0.5}, {"p90_us", 0.9}, {"p99_us", 0.99}};
    char k[96];
    snprintf(k, sizeof(k), "%s_count", name);
    if (add_u64(d, k, h->count) != 0)
        return -1;
    snprintf(k, sizeof(k), "%s_sum_ns", name);
    if (add_u64(d, k, h->sum_ns) != 0)
        return -1;
    snprintf(k, sizeof(k), "%s_max_us", name);
    if (add_u64(d, k, h->max_ns / 1000) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
        snprintf(k, sizeof(k), "%s_%s", name, qs[i].suffix);
        if (add_u64(d, k, (uint64_t)kvs_histogram_quantile_us(h, qs[i].q)) != 0)
            return -1;
    }
    return 0;
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
        /* Generated from the client's metric table: every counter and gauge by its field name,
         * every histogram as <name>_count, _sum_ns, _max_us and the _p50_us, _p90_us, _p99_us
         * upper bounds. */
#define STAT_COUNTER_(f)                                                                           \
    if (add_u64(d, #f, s.f) != 0)                                                                  \
        goto err;
#define STAT_GAUGE_(f) STAT_COUNTER_(f)
#define STAT_HIST_(f)                                                                              \
    if (add_hist(d, #f, &s.f) != 0)                                                                \
        goto err;
#define STAT_(kind, unit, field, family, labels, help) STAT_##kind##_(field)
    KVS_CLIENT_STATS(STAT_)
#undef STAT_
#undef STAT_HIST_
#undef STAT_GAUGE_
#undef STAT_COUNTER_
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

/* ---- Mooncake's conventions over the newer C calls ------------------------------------------- */

/* upsert(key, value, config=None): replaces the value atomically (readers see the old or the new
 * bytes, never a mix). */
static PyObject *store_upsert(store_t *self, PyObject *args, PyObject *kw)
{
    return value_put(self, args, kw, true);
}

static PyObject *store_upsert_from(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"key", "buffer_ptr", "size", "config", NULL};
    const char *key;
    unsigned long long ptr, size;
    PyObject *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKK|O", names, &key, &ptr, &size, &cfg))
        return NULL;
    rc_holder_t h = {0};
    int r = rc_convert(cfg, &h);
    if (r < 0)
        return NULL;
    if (r != 0)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    kvs_client_t *c = size == 0 ? NULL : store_enter(self);
    if (size == 0) {
        r = 0;
    } else if (c == NULL) {
        r = NOT_SET_UP;
    } else {
        Py_BEGIN_ALLOW_THREADS r =
            kvs_client_upsert_from(c, key, (const void *)(uintptr_t)ptr, (size_t)size, &h.rc);
        Py_END_ALLOW_THREADS store_leave(self);
    }
    rc_release(&h);
    return PyLong_FromLong(r);
}

/* put_batch / upsert_batch(keys, values, config=None) -> int: 0, or the first failing key's
 * code. Values are any bytes-like objects (copied). */
static PyObject *values_batch(store_t *self, PyObject *args, PyObject *kw, bool upsert)
{
    static char *names[] = {"keys", "values", "config", NULL};
    PyObject *keys_o, *vals_o, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", names, &keys_o, &vals_o, &cfg))
        return NULL;
    rc_holder_t h = {0};
    int r = rc_convert(cfg, &h);
    if (r < 0)
        return NULL;
    if (r != 0)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL) {
        rc_release(&h);
        return NULL;
    }
    PyObject *vals = PySequence_Fast(vals_o, "values must be a list of bytes-like objects");
    Py_buffer *views = vals ? PyMem_Calloc((size_t)n + 1, sizeof(*views)) : NULL;
    kvs_buf_t *bufs = PyMem_Calloc((size_t)n + 1, sizeof(*bufs));
    int *ires = PyMem_Calloc((size_t)n + 1, sizeof(*ires));
    Py_ssize_t got = 0;
    PyObject *out = NULL;
    if (vals == NULL || views == NULL || bufs == NULL || ires == NULL) {
        if (vals != NULL)
            PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(vals) != n || n == 0) {
        out = PyLong_FromLong(KVS_INVALID_PARAMS);
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(vals, got), &views[got], PyBUF_CONTIG_RO) !=
            0)
            goto done;
    }
    kvs_client_t *c = store_enter(self);
    if (c == NULL) {
        out = PyLong_FromLong(NOT_SET_UP);
        goto done;
    }
    /* One batch: one PUT_START and one PUT_END for all the keys. */
    int first = KVS_OK;
    for (Py_ssize_t i = 0; i < n; i++)
        bufs[i] = (kvs_buf_t){views[i].buf, (size_t)views[i].len};
    Py_BEGIN_ALLOW_THREADS first =
        upsert ? kvs_client_batch_upsert(c, (size_t)n, keys, bufs, &h.rc, ires)
               : kvs_client_batch_put(c, (size_t)n, keys, bufs, &h.rc, ires);
    Py_END_ALLOW_THREADS store_leave(self);
    for (Py_ssize_t i = 0; first == KVS_OK && i < n; i++) {
        if (put_code(ires[i]) != KVS_OK)
            first = put_code(ires[i]); /* Mooncake: the first failing key's code */
    }
    out = PyLong_FromLong(first);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(bufs);
    PyMem_Free(ires);
    rc_release(&h);
    Py_XDECREF(vals);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    return out;
}

static PyObject *store_put_batch(store_t *self, PyObject *args, PyObject *kw)
{
    return values_batch(self, args, kw, false);
}

static PyObject *store_upsert_batch(store_t *self, PyObject *args, PyObject *kw)
{
    return values_batch(self, args, kw, true);
}

/* remove_all(force=False) / remove_by_regex(regex_pattern, force=False) -> int: the number of
 * objects removed, or a negative code. */
static PyObject *store_remove_all(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"force", NULL};
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, &force))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int64_t r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_remove_all(c, force != 0);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLongLong(r);
}

static PyObject *store_remove_by_regex(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"regex_pattern", "force", NULL};
    const char *pattern;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|p", names, &pattern, &force))
        return NULL;
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(NOT_SET_UP);
    int64_t r;
    Py_BEGIN_ALLOW_THREADS r = kvs_client_remove_by_regex(c, pattern, force != 0);
    Py_END_ALLOW_THREADS store_leave(self);
    return PyLong_FromLongLong(r);
}

/* A call over a key list answering one status per key. */
typedef int (*keys_fn)(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                       int *results);

static PyObject *keys_status_call(store_t *self, PyObject *keys_o, keys_fn fn, const void *arg,
                                  int not_set_up)
{
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
    } else if (n == 0) {
        out = PyList_New(0);
    } else if (c == NULL) {
        out = not_set_up ? same_code_list(n, not_set_up) : PyList_New(0);
    } else {
        int r;
        Py_BEGIN_ALLOW_THREADS r = fn(c, (size_t)n, keys, arg, ires);
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

static int batch_remove_fn(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                           int *results)
{
    return kvs_client_batch_remove(c, n, keys, *(const int *)arg != 0, results);
}

static PyObject *store_batch_remove(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "force", NULL};
    PyObject *keys;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p", names, &keys, &force))
        return NULL;
    return keys_status_call(self, keys, batch_remove_fn, &force, NOT_SET_UP);
}

static int replica_clear_fn(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                            int *results)
{
    return kvs_client_batch_replica_clear(c, n, keys, (const char *)arg, results);
}

/* _buffer_domain(ptr, size) -> -1 (registered host memory), the CUDA device of registered
 * device memory, or -600 (not inside one registered buffer, or not set up). */
static PyObject *store_buffer_domain(store_t *self, PyObject *args)
{
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "KK", &ptr, &size)) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) &&
            !PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear(); /* an address or size no memory has */
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    }
    kvs_client_t *c = store_enter(self);
    if (c == NULL)
        return PyLong_FromLong(KVS_INVALID_PARAMS);
    int r = kvs_client_buffer_domain(c, (const void *)(uintptr_t)ptr, (size_t)size);
    store_leave(self);
    return PyLong_FromLong(r);
}

/* _replica_clear(keys, segment_name) -> [status per key] (the package makes Mooncake's list of
 * cleared keys of it). */
static PyObject *store_replica_clear(store_t *self, PyObject *args)
{
    PyObject *keys;
    const char *segment;
    if (!PyArg_ParseTuple(args, "Os", &keys, &segment))
        return NULL;
    return keys_status_call(self, keys, replica_clear_fn, segment, NOT_SET_UP);
}

/* Per-key lists of (address, size, offset) fragments: all_buffer_ptrs, all_sizes and one of
 * all_src_offsets / all_dst_offsets. A key whose three lists differ in length gets -600 in
 * bad[i] and no fragments. Returns 0, or -1 with an exception (wrong types, no memory). */
typedef struct {
    kvs_range_t *frags;
    const kvs_range_t **per_key;
    size_t *counts;
    int64_t *bad;
} ranges_t;

static void ranges_free(ranges_t *r)
{
    PyMem_Free(r->frags);
    PyMem_Free(r->per_key);
    PyMem_Free(r->counts);
    PyMem_Free(r->bad);
}

static int ranges_from(Py_ssize_t n, PyObject *ptrs_o, PyObject *sizes_o, PyObject *offs_o,
                       ranges_t *r)
{
    memset(r, 0, sizeof(*r));
    PyObject *lists[3] = {ptrs_o, sizes_o, offs_o};
    for (int l = 0; l < 3; l++) {
        if (!PyList_Check(lists[l]) && !PyTuple_Check(lists[l])) {
            PyErr_SetString(PyExc_TypeError, "buffer pointers, sizes and offsets must be lists "
                                             "of lists of int");
            return -1;
        }
        if (PySequence_Fast_GET_SIZE(lists[l]) != n)
            return 1; /* an outer length mismatch: -600 for every key */
    }
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        for (int l = 0; l < 3; l++) {
            PyObject *in = PySequence_Fast_GET_ITEM(lists[l], i);
            if (!PyList_Check(in) && !PyTuple_Check(in)) {
                PyErr_SetString(PyExc_TypeError, "buffer pointers, sizes and offsets must be "
                                                 "lists of lists of int");
                return -1;
            }
        }
        total += (size_t)PySequence_Fast_GET_SIZE(PySequence_Fast_GET_ITEM(ptrs_o, i));
    }
    r->frags = PyMem_Calloc(total + 1, sizeof(*r->frags));
    r->per_key = PyMem_Calloc((size_t)n + 1, sizeof(*r->per_key));
    r->counts = PyMem_Calloc((size_t)n + 1, sizeof(*r->counts));
    r->bad = PyMem_Calloc((size_t)n + 1, sizeof(*r->bad));
    uint64_t *tmp = PyMem_Calloc(3 * (total + 1), sizeof(*tmp));
    if (!r->frags || !r->per_key || !r->counts || !r->bad || !tmp) {
        PyMem_Free(tmp);
        ranges_free(r);
        PyErr_NoMemory();
        return -1;
    }
    size_t f = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = PySequence_Fast_GET_SIZE(PySequence_Fast_GET_ITEM(ptrs_o, i));
        int st = 0;
        for (int l = 0; l < 3 && st == 0; l++)
            st = ints_from(PySequence_Fast_GET_ITEM(lists[l], i), m, "fragment lists",
                           tmp + (size_t)l * (total + 1) + f);
        if (st < 0) {
            PyMem_Free(tmp);
            ranges_free(r);
            return -1;
        }
        r->per_key[i] = &r->frags[f];
        if (st > 0 || m == 0) {
            r->bad[i] = KVS_INVALID_PARAMS;
            continue;
        }
        for (Py_ssize_t j = 0; j < m; j++)
            r->frags[f + (size_t)j] = (kvs_range_t){
                .ptr = (void *)(uintptr_t)tmp[f + (size_t)j],
                .len = (size_t)tmp[(total + 1) + f + (size_t)j],
                .offset = tmp[2 * (total + 1) + f + (size_t)j],
            };
        r->counts[i] = (size_t)m;
        f += (size_t)m;
    }
    PyMem_Free(tmp);
    return 0;
}

typedef int (*ranges_fn)(kvs_client_t *c, size_t n, const char *const *keys,
                         const kvs_range_t *const *ranges, const size_t *counts, int64_t *res);

static int get_ranges_fn(kvs_client_t *c, size_t n, const char *const *keys,
                         const kvs_range_t *const *ranges, const size_t *counts, int64_t *res)
{
    return kvs_client_batch_get_ranges(c, n, keys, ranges, counts, res);
}

static int put_ranges_fn(kvs_client_t *c, size_t n, const char *const *keys,
                         const kvs_range_t *const *ranges, const size_t *counts, int64_t *res)
{
    int *ires = kvs__malloc(n * sizeof(*ires));
    if (ires == NULL)
        return KVS_NO_MEMORY;
    int r = kvs_client_put_session_write(c, n, keys, ranges, counts, ires);
    for (size_t i = 0; r == KVS_OK && i < n; i++) {
        uint64_t bytes = 0;
        for (size_t j = 0; j < counts[i]; j++)
            bytes += ranges[i][j].len;
        res[i] = ires[i] == KVS_OK ? (int64_t)bytes : ires[i];
    }
    kvs__free(ires);
    return r;
}

/* keys + per-key fragment lists with offsets: bytes per key or a negative code. */
static PyObject *ranges_call(store_t *self, PyObject *args, PyObject *kw, const char *off_name,
                             ranges_fn fn)
{
    char *names[] = {"keys", "all_buffer_ptrs", "all_sizes", (char *)off_name, NULL};
    PyObject *keys_o, *p, *s, *o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO", names, &keys_o, &p, &s, &o))
        return NULL;
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    ranges_t r;
    PyObject *out = NULL;
    int st = ranges_from(n, p, s, o, &r);
    if (st != 0) {
        out = st > 0 ? same_code_list(n, KVS_INVALID_PARAMS) : NULL;
        PyMem_Free(keys);
        Py_XDECREF(hold);
        return out;
    }
    int64_t *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    kvs_client_t *c = res && n > 0 ? store_enter(self) : NULL;
    if (res == NULL) {
        out = PyErr_NoMemory();
    } else if (n == 0 || c == NULL) {
        out = PyList_New(0); /* Mooncake: [] before setup */
    } else {
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = fn(c, (size_t)n, keys, r.per_key, r.counts, res);
        Py_END_ALLOW_THREADS store_leave(self);
        for (Py_ssize_t i = 0; i < n; i++)
            res[i] = r.bad[i] ? r.bad[i] : rc == KVS_OK ? res[i] : rc;
        out = int_list(res, n);
    }
    PyMem_Free(res);
    ranges_free(&r);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    return out;
}

static PyObject *store_get_ranges(store_t *self, PyObject *args, PyObject *kw)
{
    return ranges_call(self, args, kw, "all_src_offsets", get_ranges_fn);
}

static PyObject *store_put_ranges(store_t *self, PyObject *args, PyObject *kw)
{
    return ranges_call(self, args, kw, "all_dst_offsets", put_ranges_fn);
}

static int session_start_fn(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                            int *results)
{
    (void)arg;
    int r = kvs_client_read_session_start(c, n, keys, results);
    for (size_t i = 0; r == KVS_OK && i < n; i++)
        results[i] = results[i] >= 0 ? 0 : results[i]; /* Mooncake: 0, not the size */
    return r;
}

static PyObject *store_get_session_start(store_t *self, PyObject *keys)
{
    return keys_status_call(self, keys, session_start_fn, NULL, 0);
}

static PyObject *store_get_session_end(store_t *self, PyObject *keys_o)
{
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    kvs_client_t *c = store_enter(self);
    int r = -1; /* Mooncake: -1 before setup */
    if (c != NULL) {
        r = 0;
        if (n > 0) {
            Py_BEGIN_ALLOW_THREADS kvs_client_read_session_end(c, (size_t)n, keys);
            Py_END_ALLOW_THREADS
        }
        store_leave(self);
    }
    PyMem_Free(keys);
    Py_XDECREF(hold);
    return PyLong_FromLong(r);
}

typedef struct {
    const uint64_t *sizes;
    const kvs_replicate_config_t *rc;
} put_start_arg_t;

static int put_session_start_fn(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                                int *results)
{
    const put_start_arg_t *a = arg;
    return kvs_client_put_session_start(c, n, keys, a->sizes, a->rc, results);
}

static PyObject *store_put_session_start(store_t *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"keys", "sizes", "config", NULL};
    PyObject *keys, *sizes_o, *cfg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", names, &keys, &sizes_o, &cfg))
        return NULL;
    rc_holder_t h = {0};
    int cr = rc_convert(cfg, &h);
    if (cr < 0)
        return NULL;
    Py_ssize_t n = PySequence_Size(keys);
    uint64_t *sizes = n < 0 ? NULL : PyMem_Calloc((size_t)n + 1, sizeof(*sizes));
    if (sizes == NULL) {
        rc_release(&h);
        return n < 0 ? NULL : PyErr_NoMemory();
    }
    int st = ints_from(sizes_o, n, "sizes", sizes);
    PyObject *out;
    if (st < 0)
        out = NULL;
    else if (st > 0 || cr != 0)
        out = same_code_list(n, KVS_INVALID_PARAMS);
    else {
        put_start_arg_t a = {sizes, &h.rc};
        out = keys_status_call(self, keys, put_session_start_fn, &a, 0);
    }
    PyMem_Free(sizes);
    rc_release(&h);
    return out;
}

static int put_session_end_fn(kvs_client_t *c, size_t n, const char *const *keys, const void *arg,
                              int *results)
{
    (void)arg;
    return kvs_client_put_session_end(c, n, keys, results);
}

static int put_session_revoke_fn(kvs_client_t *c, size_t n, const char *const *keys,
                                 const void *arg, int *results)
{
    (void)arg;
    return kvs_client_put_session_revoke(c, n, keys, results);
}

static PyObject *store_put_session_end(store_t *self, PyObject *keys)
{
    return keys_status_call(self, keys, put_session_end_fn, NULL, 0);
}

static PyObject *store_put_session_revoke(store_t *self, PyObject *keys)
{
    return keys_status_call(self, keys, put_session_revoke_fn, NULL, 0);
}

/* _replica_desc(keys) -> list of (list of (segment_name, endpoint, node, offset, size)), empty
 * for a key not found complete. */
static PyObject *store_replica_desc(store_t *self, PyObject *keys_o)
{
    Py_ssize_t n;
    PyObject *hold = NULL;
    const char **keys = keys_from(keys_o, &n, &hold);
    if (keys == NULL)
        return NULL;
    kvs_replica_desc_t *d = PyMem_Calloc((size_t)n * KVS_MAX_REPLICA_DESCS + 1, sizeof(*d));
    uint32_t *nreps = PyMem_Calloc((size_t)n + 1, sizeof(*nreps));
    int *res = PyMem_Calloc((size_t)n + 1, sizeof(*res));
    PyObject *out = NULL;
    if (d == NULL || nreps == NULL || res == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    kvs_client_t *c = n > 0 ? store_enter(self) : NULL;
    int r = KVS_INVALID_PARAMS;
    if (c != NULL) {
        Py_BEGIN_ALLOW_THREADS r =
            kvs_client_batch_get_replica_desc(c, (size_t)n, keys, d, nreps, res);
        Py_END_ALLOW_THREADS store_leave(self);
    }
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        uint32_t m = r == KVS_OK && res[i] == KVS_OK ? nreps[i] : 0;
        PyObject *l = PyList_New(m);
        for (uint32_t q = 0; l != NULL && q < m; q++) {
            const kvs_replica_desc_t *x = &d[(size_t)i * KVS_MAX_REPLICA_DESCS + q];
            PyObject *t = Py_BuildValue("(sssKK)", x->segment_name, x->endpoint, x->node,
                                        (unsigned long long)x->offset, (unsigned long long)x->size);
            if (t == NULL)
                Py_CLEAR(l);
            else
                PyList_SET_ITEM(l, q, t);
        }
        if (l == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, l);
    }
done:
    PyMem_Free(d);
    PyMem_Free(nreps);
    PyMem_Free(res);
    PyMem_Free(keys);
    Py_XDECREF(hold);
    return out;
}

static PyMethodDef store_methods[] = {
    {"_open", (PyCFunction)store_open, METH_VARARGS, open_doc},
    {"put", (PyCFunction)(void (*)(void))store_put, METH_VARARGS | METH_KEYWORDS,
     "put(key, value, config=None) -> int: stores a copy of value (any bytes-like object). 0, "
     "also when the key exists (the first value stays: upsert() replaces), or a negative code."},
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
     "get_hostname() -> str: this client's segment name (use it as preferred_segment to place "
     "on this process's segment); local_hostname when it mounts none, '' after close() and on "
     "setup_dummy() stores."},
    {"health_check", (PyCFunction)store_health_check, METH_NOARGS,
     "health_check() -> int: 0 healthy, 1 not set up (or closed), 2 master unreachable."},
    {"get_batch", (PyCFunction)store_get_batch, METH_O,
     "get_batch(keys) -> list[bytes]: each object, b'' for a key that failed."},
    {"get_buffer", (PyCFunction)store_get_buffer, METH_O,
     "get_buffer(key) -> BufferHandle | None: the object in memory of its own (None when "
     "absent, empty or failed)."},
    {"batch_get_buffer", (PyCFunction)store_batch_get_buffer, METH_O,
     "batch_get_buffer(keys) -> list[BufferHandle | None]"},
    {"put_from_with_metadata", (PyCFunction)(void (*)(void))store_put_with_metadata,
     METH_VARARGS | METH_KEYWORDS,
     "put_from_with_metadata(key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, "
     "config=None) -> int: stores metadata_size bytes at metadata_buffer_ptr followed by size "
     "bytes at buffer_ptr (registered memory) as one object. 0 (also for size 0: nothing "
     "stored) or a negative code."},
    {"batch_get_into_pages", (PyCFunction)(void (*)(void))store_get_into_pages,
     METH_VARARGS | METH_KEYWORDS,
     "batch_get_into_pages(keys, regions, page_ids, order='page', "
     "prefer_alloc_in_same_node=False) -> list[int]: reads key i into its pages of every region "
     "(regions: (base, page_bytes, stride, npages) tuples in registered memory; page_ids: an "
     "integer array of shape (n, pages) or per-key arrays or lists; order 'page' takes each page "
     "of every region in turn, 'region' every page of one region, then the next). Sizes or "
     "negative codes, as batch_get_into_multi_buffers."},
    {"batch_put_from_pages", (PyCFunction)(void (*)(void))store_put_from_pages,
     METH_VARARGS | METH_KEYWORDS,
     "batch_put_from_pages(keys, regions, page_ids, order='page', config=None) -> list[int]: "
     "stores key i gathered from its pages, as batch_get_into_pages names them."},
    {"_serve_metrics", (PyCFunction)store_serve_metrics, METH_VARARGS,
     "_serve_metrics(port, bind=None) -> int: serves the client's metrics (Prometheus text) at "
     "http://bind:port/metrics; 0 or a negative code."},
    {"metrics_port", (PyCFunction)store_metrics_port, METH_NOARGS,
     "metrics_port() -> int: the port the client's metrics are served on (0: none)."},
    {"get_stats", (PyCFunction)store_get_stats, METH_NOARGS,
     "get_stats() -> dict: the client's counters (and latency quantiles in us)."},
    {"upsert", (PyCFunction)(void (*)(void))store_upsert, METH_VARARGS | METH_KEYWORDS,
     "upsert(key, value, config=None) -> int: stores value, replacing an existing one "
     "atomically: readers see the old or the new bytes, never a mix (readers inside their lease "
     "keep the old bytes). 0 or a negative code."},
    {"upsert_from", (PyCFunction)(void (*)(void))store_upsert_from, METH_VARARGS | METH_KEYWORDS,
     "upsert_from(key, buffer_ptr, size, config=None) -> int: upsert from registered memory."},
    {"batch_upsert_from", (PyCFunction)(void (*)(void))store_batch_upsert_from,
     METH_VARARGS | METH_KEYWORDS,
     "batch_upsert_from(keys, buffer_ptrs, sizes, config=None) -> list[int]"},
    {"put_batch", (PyCFunction)(void (*)(void))store_put_batch, METH_VARARGS | METH_KEYWORDS,
     "put_batch(keys, values, config=None) -> int: 0 (existing keys too), or the first failing "
     "key's code."},
    {"upsert_batch", (PyCFunction)(void (*)(void))store_upsert_batch, METH_VARARGS | METH_KEYWORDS,
     "upsert_batch(keys, values, config=None) -> int: 0, or the first failing key's code."},
    {"remove_all", (PyCFunction)(void (*)(void))store_remove_all, METH_VARARGS | METH_KEYWORDS,
     "remove_all(force=False) -> int: objects removed (this tenant's); leased objects are "
     "skipped unless force, pending puts always."},
    {"remove_by_regex", (PyCFunction)(void (*)(void))store_remove_by_regex,
     METH_VARARGS | METH_KEYWORDS,
     "remove_by_regex(regex_pattern, force=False) -> int: objects whose key matches the POSIX "
     "extended regular expression (anywhere in the key unless anchored) removed, or -600 for "
     "a bad pattern."},
    {"_put_frags", (PyCFunction)(void (*)(void))store_put_frags, METH_VARARGS | METH_KEYWORDS,
     "_put_frags(keys, all_buffer_ptrs, all_sizes, config=None, upsert=False) -> [code]"},
    {"_buffer_domain", (PyCFunction)store_buffer_domain, METH_VARARGS,
     "_buffer_domain(ptr, size) -> -1 host, >= 0 CUDA device, -600 not registered"},
    {"_replica_clear", (PyCFunction)store_replica_clear, METH_VARARGS,
     "_replica_clear(keys, segment_name) -> [status per key]"},
    {"batch_remove", (PyCFunction)(void (*)(void))store_batch_remove, METH_VARARGS | METH_KEYWORDS,
     "batch_remove(keys, force=False) -> list[int]: 0 or a negative code per key."},
    {"batch_get_session_start", (PyCFunction)store_get_session_start, METH_O,
     "batch_get_session_start(keys) -> list[int]: one lookup and read lease for the keys; "
     "ranged reads of them then need no lookup until the session ends. 0 or a negative code."},
    {"batch_get_into_multi_buffer_ranges", (PyCFunction)(void (*)(void))store_get_ranges,
     METH_VARARGS | METH_KEYWORDS,
     "batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets) -> "
     "list[int]: fragment j of key i gets all_sizes[i][j] bytes of the object from "
     "all_src_offsets[i][j] (registered memory). Bytes per key, or a negative code."},
    {"batch_get_session_end", (PyCFunction)store_get_session_end, METH_O,
     "batch_get_session_end(keys) -> int: 0; the session's leases end."},
    {"batch_put_session_start", (PyCFunction)(void (*)(void))store_put_session_start,
     METH_VARARGS | METH_KEYWORDS,
     "batch_put_session_start(keys, sizes, config=None) -> list[int]: places the objects; "
     "their bytes follow in batch_put_from_multi_buffer_ranges calls. 0 or a negative code."},
    {"batch_put_from_multi_buffer_ranges", (PyCFunction)(void (*)(void))store_put_ranges,
     METH_VARARGS | METH_KEYWORDS,
     "batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets) "
     "-> list[int]: bytes written per key, or a negative code."},
    {"batch_put_session_end", (PyCFunction)store_put_session_end, METH_O,
     "batch_put_session_end(keys) -> list[int]: makes each object readable once every byte "
     "was written (else -700, and the put is revoked)."},
    {"batch_put_session_revoke", (PyCFunction)store_put_session_revoke, METH_O,
     "batch_put_session_revoke(keys) -> list[int]"},
    {"_replica_desc", (PyCFunction)store_replica_desc, METH_O,
     "_replica_desc(keys) -> per key, a list of (segment, endpoint, node, offset, size)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject store_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstash._kvstash.MooncakeDistributedStore",
    .tp_basicsize = sizeof(store_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "MooncakeDistributedStore(): a kvstash store client with Mooncake's API. Call "
              "setup() first. Integer results: >= 0 success, negative codes with Mooncake's "
              "numbers (-600 invalid parameters, -704 object not found, -707 lease expired, "
              "-800 transfer failed, -900 RPC failed).",
    .tp_new = store_new,
    .tp_dealloc = (destructor)store_dealloc,
    .tp_methods = store_methods,
};

static PyMethodDef module_methods[] = {
    {"_register_config", mod_register_config, METH_O,
     "_register_config(cls): the ReplicateConfig class puts accept (the package's)."},
    {"_parse_size", mod_parse_size, METH_O,
     "_parse_size(text) -> int: '16MB', '4GiB', '4096' as bytes; -1 if not a size."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvstash._kvstash",
    .m_doc = "kvstash: a distributed object store for LLM KV cache. MooncakeDistributedStore "
             "follows Mooncake's store API, so code written for it switches by its import.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__kvstash(void);

PyMODINIT_FUNC PyInit__kvstash(void)
{
    if (PyType_Ready(&store_type) < 0 || PyType_Ready(&buffer_handle_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "MooncakeDistributedStore", (PyObject *)&store_type) < 0 ||
        PyModule_AddObjectRef(m, "BufferHandle", (PyObject *)&buffer_handle_type) < 0 ||
        PyModule_AddStringConstant(m, "__version__", KVS_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
