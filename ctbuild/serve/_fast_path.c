/* The hot path in C: the layout guard, and an entry's own call code built on it.
 *
 * `LayoutCheck(args, tensors, scalars)` records, for a call's arguments, each tensor's exact
 * Python type, device, dtype, sizes and strides and each scalar's exact type and value. Called
 * with a later call's arguments it answers True only when every one of them matches. Tensor
 * metadata is read through the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`, a
 * versioned table of C functions that torch exports for exactly this): one C call per tensor
 * that fills a DLTensor on the stack, no Python attribute, no allocation.
 *
 * `ArmedCall(...)` is what `hot_call.HotPath.arm` builds per entry where this module exists:
 * the generated Python function of that entry (see hot_call.py, `_ARMED`) in C, doing the same
 * things in the same order: keywords go to the runtime; a call the guard refuses goes to the
 * key lookup (`refused`); otherwise the launch counter goes up, the stream is read (torch's
 * current stream through the same exchange table, or a getter the runtime gives) and the
 * launch function is called with the entry's grid, kernel and the call's arguments plus the
 * entry's constant tail; a launch that raises goes to `failed`, uncounted. That spares the
 * interpreter's frame, the argument tuple and keyword dict of a Python function, and a Python
 * call per stream lookup: about half of what the Python code costs per call.
 *
 * Only the DLPack ABI (a published, versioned C struct layout) is assumed, never torch's C++
 * classes, so this builds with a C compiler and Python's headers alone and works with any
 * torch that exports the table. Where it cannot be built or the table is missing, the hot
 * path uses torch's tensor guards and generated Python code instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The DLPack 1.x ABI, as its specification defines the structs. */
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct ExchangeHeader {
    DLPackVersion version;
    struct ExchangeHeader *prev_api;
} ExchangeHeader;
typedef struct {
    ExchangeHeader header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out);
} ExchangeAPI;

#define DL_CUDA 2

#define SUPPORTED_MAJOR 1
#define MAX_DIMS 16

/* One argument position: a tensor layout (api != NULL) or a scalar (value != NULL). */
typedef struct {
    PyTypeObject *type;
    const ExchangeAPI *api;
    PyObject *value;
    DLDevice device;
    DLDataType dtype;
    int32_t ndim;
    int64_t shape[MAX_DIMS];
    int64_t strides[MAX_DIMS];
} Slot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n;
    Slot *slots;
} LayoutCheck;

/* The exchange table of `type`, or NULL with an exception set. */
static const ExchangeAPI *exchange_api(PyTypeObject *type) {
    PyObject *capsule = PyObject_GetAttrString((PyObject *)type, "__dlpack_c_exchange_api__");
    if (capsule == NULL)
        return NULL;
    const ExchangeAPI *api = PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    Py_DECREF(capsule);
    if (api == NULL)
        return NULL;
    /* A newer major version may chain back to one this file knows. */
    const ExchangeHeader *h = &api->header;
    while (h != NULL && h->version.major != SUPPORTED_MAJOR)
        h = h->prev_api;
    if (h == NULL || ((const ExchangeAPI *)h)->dltensor_from_py_object_no_sync == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no DLPack 1.x tensor exchange for this type");
        return NULL;
    }
    return (const ExchangeAPI *)h;
}

/* Strides of `t`, filled in for a compact tensor that gives none. */
static const int64_t *strides_of(const DLTensor *t, int64_t *buf) {
    if (t->strides != NULL)
        return t->strides;
    int64_t s = 1;
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        buf[k] = s;
        s *= t->shape[k];
    }
    return buf;
}

static int record_tensor(Slot *slot, PyObject *obj) {
    const ExchangeAPI *api = exchange_api(Py_TYPE(obj));
    if (api == NULL)
        return -1;
    DLTensor t;
    if (api->dltensor_from_py_object_no_sync(obj, &t) != 0)
        return -1;
    if (t.ndim < 0 || t.ndim > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "too many dimensions for a layout check");
        return -1;
    }
    int64_t buf[MAX_DIMS];
    const int64_t *strides = strides_of(&t, buf);
    slot->device = t.device;
    slot->dtype = t.dtype;
    slot->ndim = t.ndim;
    memcpy(slot->shape, t.shape, sizeof(int64_t) * (size_t)t.ndim);
    memcpy(slot->strides, strides, sizeof(int64_t) * (size_t)t.ndim);
    slot->api = api;
    slot->type = (PyTypeObject *)Py_NewRef(Py_TYPE(obj));
    return 0;
}

static int same_tensor(const Slot *slot, PyObject *obj) {
    DLTensor t;
    if (Py_TYPE(obj) != slot->type)
        return 0;
    if (slot->api->dltensor_from_py_object_no_sync(obj, &t) != 0) {
        PyErr_Clear(); /* a tensor DLPack cannot describe: not this entry's */
        return 0;
    }
    if (t.ndim != slot->ndim || t.device.device_type != slot->device.device_type
        || t.device.device_id != slot->device.device_id || t.dtype.code != slot->dtype.code
        || t.dtype.bits != slot->dtype.bits || t.dtype.lanes != slot->dtype.lanes)
        return 0;
    if (memcmp(t.shape, slot->shape, sizeof(int64_t) * (size_t)t.ndim) != 0)
        return 0;
    int64_t buf[MAX_DIMS];
    return memcmp(strides_of(&t, buf), slot->strides, sizeof(int64_t) * (size_t)t.ndim) == 0;
}

static int same_scalar(const Slot *slot, PyObject *obj) {
    if (Py_TYPE(obj) != slot->type)
        return 0;
    int eq = PyObject_RichCompareBool(obj, slot->value, Py_EQ);
    if (eq < 0) {
        PyErr_Clear();
        return 0;
    }
    return eq;
}

/* Whether the n arguments `args` have exactly the recorded layout. */
static int same_layout(const LayoutCheck *self, PyObject *const *args, Py_ssize_t n) {
    if (n != self->n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Slot *slot = &self->slots[i];
        if (!(slot->api != NULL ? same_tensor(slot, args[i]) : same_scalar(slot, args[i])))
            return 0;
    }
    return 1;
}

static PyObject *check_call(PyObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)
        Py_RETURN_FALSE;
    return PyBool_FromLong(same_layout((LayoutCheck *)self, args, PyVectorcall_NARGS(nargsf)));
}

static void check_dealloc(LayoutCheck *self) {
    if (self->slots != NULL) {
        for (Py_ssize_t i = 0; i < self->n; i++) {
            Py_XDECREF(self->slots[i].type);
            Py_XDECREF(self->slots[i].value);
        }
        PyMem_Free(self->slots);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Positions listed in `positions` (a tuple of ints), each < n, marked in `kinds` as `kind`. */
static int mark_positions(PyObject *positions, char *kinds, Py_ssize_t n, char kind) {
    if (!PyTuple_Check(positions)) {
        PyErr_SetString(PyExc_TypeError, "positions must be a tuple of ints");
        return -1;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(positions); j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, j));
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < 0 || i >= n || kinds[i] != 0) {
            PyErr_SetString(PyExc_ValueError, "positions must be distinct argument indices");
            return -1;
        }
        kinds[i] = kind;
    }
    return 0;
}

static PyObject *check_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *call_args, *tensors, *scalars;
    static char *names[] = {"args", "tensors", "scalars", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO:LayoutCheck", names, &PyTuple_Type,
                                     &call_args, &tensors, &scalars))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(call_args);
    char *kinds = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (kinds == NULL)
        return PyErr_NoMemory();
    LayoutCheck *self = NULL;
    if (mark_positions(tensors, kinds, n, 't') < 0 || mark_positions(scalars, kinds, n, 's') < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kinds[i] == 0) {
            PyErr_SetString(PyExc_ValueError, "every argument must be a tensor or a scalar");
            goto fail;
        }
    }
    self = (LayoutCheck *)type->tp_alloc(type, 0);
    if (self == NULL)
        goto fail;
    self->vectorcall = check_call;
    self->slots = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Slot));
    if (self->slots == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    self->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyTuple_GET_ITEM(call_args, i);
        Slot *slot = &self->slots[i];
        if (kinds[i] == 't') {
            if (record_tensor(slot, obj) < 0)
                goto fail;
        } else {
            slot->type = Py_TYPE(obj);
            Py_INCREF(slot->type);
            slot->value = Py_NewRef(obj);
        }
    }
    PyMem_Free(kinds);
    return (PyObject *)self;
fail:
    PyMem_Free(kinds);
    Py_XDECREF(self);
    return NULL;
}

static PyTypeObject LayoutCheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctbuild.serve._fast_path.LayoutCheck",
    .tp_doc = PyDoc_STR("LayoutCheck(args, tensors, scalars): called with a later call's "
                        "arguments, True when they have exactly the layout of `args`."),
    .tp_basicsize = sizeof(LayoutCheck),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(LayoutCheck, vectorcall),
    .tp_new = check_new,
    .tp_dealloc = (destructor)check_dealloc,
    .tp_call = PyVectorcall_Call,
};

/* ---- ArmedCall: one entry's call code ------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int with_stream;        /* launch(stream, *args): the first argument is the stream */
    long long calls;        /* launches counted by this object */
    int32_t device_id;
    const ExchangeAPI *streams; /* torch's current stream from here, where stream_of is None */
    PyObject *entry, *check, *grid, *kernel, *tail, *device, *stream_of, *launch;
    PyObject *refused, *keywords, *failed;
} ArmedCall;

/* The stream to launch a call on: the runtime's getter, or torch's current stream. */
static PyObject *current_stream(ArmedCall *self) {
    if (self->stream_of != Py_None)
        return PyObject_CallOneArg(self->stream_of, self->device);
    void *stream = NULL;
    if (self->streams->current_work_stream(DL_CUDA, self->device_id, &stream) != 0)
        return NULL;
    return PyLong_FromVoidPtr(stream);
}

/* A new tuple of the n objects at `items`, then those of `tail` (NULL: none). */
static PyObject *tuple_of(PyObject *const *items, Py_ssize_t n, PyObject *tail) {
    Py_ssize_t nt = tail != NULL ? PyTuple_GET_SIZE(tail) : 0;
    PyObject *out = PyTuple_New(n + nt);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(items[i]));
    for (Py_ssize_t i = 0; i < nt; i++)
        PyTuple_SET_ITEM(out, n + i, Py_NewRef(PyTuple_GET_ITEM(tail, i)));
    return out;
}

/* A call with keywords, to the runtime (which binds them). `stream` NULL: launch(stream=...,
 * ...), the stream is one of the keywords. */
static PyObject *keyword_call(ArmedCall *self, PyObject *stream, PyObject *const *args,
                              Py_ssize_t n, PyObject *kwnames) {
    Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *positional = tuple_of(args, n, NULL), *kwargs = PyDict_New(), *result = NULL;
    if (positional == NULL || kwargs == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        if (stream == NULL && PyUnicode_CompareWithASCIIString(name, "stream") == 0)
            stream = args[n + k];
        else if (PyDict_SetItem(kwargs, name, args[n + k]) < 0)
            goto done;
    }
    if (stream == NULL) {
        PyErr_SetString(PyExc_TypeError, "launch() missing its first argument: the stream");
        goto done;
    }
    result = PyObject_CallFunctionObjArgs(self->keywords, stream, positional, kwargs, NULL);
done:
    Py_XDECREF(positional);
    Py_XDECREF(kwargs);
    return result;
}

static PyObject *armed_call(PyObject *self_obj, PyObject *const *all, size_t nargsf,
                            PyObject *kwnames) {
    ArmedCall *self = (ArmedCall *)self_obj;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *given = Py_None; /* the stream a launch(stream, ...) was given */
    PyObject *const *args = all;
    if (self->with_stream) {
        if (n < 1)
            return keyword_call(self, NULL, all, 0, kwnames);
        given = all[0];
        args = all + 1;
        n -= 1;
    }
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)
        return keyword_call(self, given, args, n, kwnames);
    if (!same_layout((LayoutCheck *)self->check, args, n)) {
        PyObject *call_args = tuple_of(args, n, NULL), *result;
        if (call_args == NULL)
            return NULL;
        if (self->with_stream)
            result = PyObject_CallFunctionObjArgs(self->refused, given, call_args, self->entry,
                                                  NULL);
        else
            result = PyObject_CallFunctionObjArgs(self->refused, call_args, self->entry, NULL);
        Py_DECREF(call_args);
        return result;
    }
    PyObject *kernel_args = tuple_of(args, n, self->tail);
    if (kernel_args == NULL)
        return NULL;
    self->calls += 1;
    PyObject *stream = self->with_stream ? Py_NewRef(given) : current_stream(self);
    PyObject *result = NULL;
    if (stream != NULL) {
        PyObject *launch_args[4] = {stream, self->grid, self->kernel, kernel_args};
        result = PyObject_Vectorcall(self->launch, launch_args, 4, NULL);
        Py_DECREF(stream);
    }
    if (result != NULL) {
        Py_DECREF(kernel_args);
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    /* As the Python code's `except Exception`: uncount, and let the runtime decide. */
    self->calls -= 1;
    Py_DECREF(kernel_args);
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *call_args = tuple_of(args, n, NULL);
    if (call_args == NULL) {
        Py_DECREF(exc);
        return NULL;
    }
    result = PyObject_CallFunctionObjArgs(self->failed, exc, self->entry, given, call_args,
                                          NULL);
    Py_DECREF(exc);
    Py_DECREF(call_args);
    return result;
}

static PyObject *armed_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"entry", "check", "grid", "kernel", "tail", "device", "stream_of",
                            "launch", "refused", "keywords", "failed", "with_stream", NULL};
    PyObject *entry, *check, *grid, *kernel, *tail, *device, *stream_of, *launch, *refused,
        *keywords, *failed;
    int with_stream;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OOO!OOOOOOp:ArmedCall", names, &entry,
                                     &LayoutCheckType, &check, &grid, &kernel, &PyTuple_Type,
                                     &tail, &device, &stream_of, &launch, &refused, &keywords,
                                     &failed, &with_stream))
        return NULL;
    const ExchangeAPI *streams = NULL;
    long device_id = 0;
    if (stream_of == Py_None) { /* torch's current stream: through a tensor's exchange table */
        LayoutCheck *c = (LayoutCheck *)check;
        for (Py_ssize_t i = 0; i < c->n && streams == NULL; i++)
            streams = c->slots[i].api;
        device_id = PyLong_AsLong(device);
        if (device_id == -1 && PyErr_Occurred())
            return NULL;
        if (streams == NULL || streams->current_work_stream == NULL) {
            PyErr_SetString(PyExc_ValueError, "no tensor to read the current stream through");
            return NULL;
        }
    }
    ArmedCall *self = (ArmedCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = armed_call;
    self->with_stream = with_stream;
    self->device_id = (int32_t)device_id;
    self->streams = streams;
    self->entry = Py_NewRef(entry);
    self->check = Py_NewRef(check);
    self->grid = Py_NewRef(grid);
    self->kernel = Py_NewRef(kernel);
    self->tail = Py_NewRef(tail);
    self->device = Py_NewRef(device);
    self->stream_of = Py_NewRef(stream_of);
    self->launch = Py_NewRef(launch);
    self->refused = Py_NewRef(refused);
    self->keywords = Py_NewRef(keywords);
    self->failed = Py_NewRef(failed);
    return (PyObject *)self;
}

static int armed_traverse(ArmedCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->entry);
    Py_VISIT(self->check);
    Py_VISIT(self->grid);
    Py_VISIT(self->kernel);
    Py_VISIT(self->tail);
    Py_VISIT(self->device);
    Py_VISIT(self->stream_of);
    Py_VISIT(self->launch);
    Py_VISIT(self->refused);
    Py_VISIT(self->keywords);
    Py_VISIT(self->failed);
    return 0;
}

static int armed_clear(ArmedCall *self) {
    Py_CLEAR(self->entry);
    Py_CLEAR(self->check);
    Py_CLEAR(self->grid);
    Py_CLEAR(self->kernel);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->device);
    Py_CLEAR(self->stream_of);
    Py_CLEAR(self->launch);
    Py_CLEAR(self->refused);
    Py_CLEAR(self->keywords);
    Py_CLEAR(self->failed);
    return 0;
}

static void armed_dealloc(ArmedCall *self) {
    PyObject_GC_UnTrack(self);
    armed_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *armed_calls(ArmedCall *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(self->calls);
}

static PyGetSetDef armed_getset[] = {
    {"calls", (getter)armed_calls, NULL, PyDoc_STR("launches this object made"), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ArmedCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctbuild.serve._fast_path.ArmedCall",
    .tp_doc = PyDoc_STR("ArmedCall(entry, check, grid, kernel, tail, device, stream_of, launch, "
                        "refused, keywords, failed, with_stream): one entry's call code."),
    .tp_basicsize = sizeof(ArmedCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_vectorcall_offset = offsetof(ArmedCall, vectorcall),
    .tp_new = armed_new,
    .tp_dealloc = (destructor)armed_dealloc,
    .tp_traverse = (traverseproc)armed_traverse,
    .tp_clear = (inquiry)armed_clear,
    .tp_call = PyVectorcall_Call,
    .tp_getset = armed_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fast_path",
    .m_doc = PyDoc_STR("The hot path in C: the layout guard and an entry's call code."),
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fast_path(void) {
    if (PyType_Ready(&LayoutCheckType) < 0 || PyType_Ready(&ArmedCallType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "LayoutCheck", (PyObject *)&LayoutCheckType) < 0
        || PyModule_AddObjectRef(m, "ArmedCall", (PyObject *)&ArmedCallType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
