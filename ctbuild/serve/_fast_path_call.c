/* HotCall: a kernel's call code over its Table, what hot_path.py's Python form does, in C.
 *
 * `HotCall(table, ...)` is `kernel(...)`, or `kernel.launch(stream, ...)` with `with_stream`:
 * keywords go to the runtime; the call's entry is found by its exact layout (`fp_find`); no
 * entry: the runtime's `miss`; an entry without a tail: the runtime launches it; otherwise its
 * launch counter goes up, the stream is read (torch's current stream through the DLPack
 * exchange table, or a getter the runtime gives) and the launch function is called with the
 * entry's grid, kernel and the call's arguments plus the entry's tail; a launch that raises
 * goes to `failed`, uncounted.
 */
#include "_fast_path.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int with_stream;        /* launch(stream, *args): the first argument is the stream */
    Table *table;
    PyObject *stream_of, *launch, *miss, *keywords, *failed, *launch_entry;
} HotCall;

/* The stream to launch an entry on: the runtime's getter, or torch's current stream. */
static PyObject *current_stream(HotCall *self, HotEntry *e) {
    if (self->stream_of != Py_None)
        return PyObject_CallOneArg(self->stream_of, e->device);
    void *stream = NULL;
    if (self->table->streams->current_work_stream(DL_CUDA, e->device_id, &stream) != 0)
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
static PyObject *keyword_call(HotCall *self, PyObject *stream, PyObject *const *args,
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

/* `fn(a, b, args)` (a NULL: fn(b, args)) with the call's arguments as a new tuple. */
static PyObject *to_runtime(PyObject *fn, PyObject *a, PyObject *b, PyObject *const *args,
                            Py_ssize_t n) {
    PyObject *call_args = tuple_of(args, n, NULL), *result;
    if (call_args == NULL)
        return NULL;
    result = a != NULL ? PyObject_CallFunctionObjArgs(fn, a, b, call_args, NULL)
                       : PyObject_CallFunctionObjArgs(fn, b, call_args, NULL);
    Py_DECREF(call_args);
    return result;
}

/* A launch raised: as the Python form's `except Exception`, the runtime decides. */
static PyObject *launch_failed(HotCall *self, HotEntry *e, PyObject *given,
                               PyObject *const *args, Py_ssize_t n) {
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
    PyObject *call_args = tuple_of(args, n, NULL), *result = NULL;
    if (call_args != NULL)
        result = PyObject_CallFunctionObjArgs(self->failed, exc, e->entry, given, call_args,
                                              NULL);
    Py_DECREF(exc);
    Py_XDECREF(call_args);
    return result;
}

static PyObject *hot_call(PyObject *self_obj, PyObject *const *all, size_t nargsf,
                          PyObject *kwnames) {
    HotCall *self = (HotCall *)self_obj;
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
    HotEntry *e = fp_find(self->table, args, n);
    if (e == NULL)
        return to_runtime(self->miss, NULL, given, args, n);
    Py_INCREF(e); /* the table may drop it while the launch runs Python code */
    PyObject *result = NULL;
    if (e->tail == Py_None) {
        result = to_runtime(self->launch_entry, e->entry, given, args, n);
        Py_DECREF(e);
        return result;
    }
    PyObject *kernel_args = tuple_of(args, n, e->tail);
    if (kernel_args == NULL) {
        Py_DECREF(e);
        return NULL;
    }
    e->calls += 1;
    PyObject *stream = self->with_stream ? Py_NewRef(given) : current_stream(self, e);
    if (stream != NULL) {
        PyObject *launch_args[4] = {stream, e->grid, e->kernel, kernel_args};
        result = PyObject_Vectorcall(self->launch, launch_args, 4, NULL);
        Py_DECREF(stream);
    }
    Py_DECREF(kernel_args);
    if (result != NULL) {
        Py_DECREF(result);
        result = Py_NewRef(Py_None);
    } else {
        e->calls -= 1;
        result = launch_failed(self, e, given, args, n);
    }
    Py_DECREF(e);
    return result;
}

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"table", "stream_of", "launch", "miss", "keywords", "failed",
                            "launch_entry", "with_stream", NULL};
    PyObject *table, *stream_of, *launch, *miss, *keywords, *failed, *launch_entry;
    int with_stream;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOOp:HotCall", names, &TableType,
                                     &table, &stream_of, &launch, &miss, &keywords, &failed,
                                     &launch_entry, &with_stream))
        return NULL;
    if (stream_of == Py_None && (((Table *)table)->streams == NULL
                                 || ((Table *)table)->streams->current_work_stream == NULL)) {
        PyErr_SetString(PyExc_ValueError, "no tensor type to read the current stream through");
        return NULL;
    }
    HotCall *self = (HotCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = hot_call;
    self->with_stream = with_stream;
    self->table = (Table *)Py_NewRef(table);
    self->stream_of = Py_NewRef(stream_of);
    self->launch = Py_NewRef(launch);
    self->miss = Py_NewRef(miss);
    self->keywords = Py_NewRef(keywords);
    self->failed = Py_NewRef(failed);
    self->launch_entry = Py_NewRef(launch_entry);
    return (PyObject *)self;
}

static int hot_traverse(HotCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->table);
    Py_VISIT(self->stream_of);
    Py_VISIT(self->launch);
    Py_VISIT(self->miss);
    Py_VISIT(self->keywords);
    Py_VISIT(self->failed);
    Py_VISIT(self->launch_entry);
    return 0;
}

static int hot_clear(HotCall *self) {
    Py_CLEAR(self->table);
    Py_CLEAR(self->stream_of);
    Py_CLEAR(self->launch);
    Py_CLEAR(self->miss);
    Py_CLEAR(self->keywords);
    Py_CLEAR(self->failed);
    Py_CLEAR(self->launch_entry);
    return 0;
}

static void hot_dealloc(HotCall *self) {
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject HotCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctbuild.serve._fast_path.HotCall",
    .tp_doc = PyDoc_STR("HotCall(table, stream_of, launch, miss, keywords, failed, "
                        "launch_entry, with_stream): a kernel's call code over its Table."),
    .tp_basicsize = sizeof(HotCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_vectorcall_offset = offsetof(HotCall, vectorcall),
    .tp_new = hot_new,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_call = PyVectorcall_Call,
};
