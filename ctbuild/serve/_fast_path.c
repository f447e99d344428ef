/* The hot path in C: the layout check, a kernel's entries by exact layout, and its call code.
 *
 * `LayoutCheck(args, tensors, scalars)` records, for a call's arguments, each tensor's exact
 * Python type, device, dtype, sizes and strides and each scalar's exact type and value. Called
 * with a later call's arguments it answers True only when every one of them matches. Tensor
 * metadata is read through the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`, a
 * versioned table of C functions that torch exports for exactly this): one C call per tensor
 * that fills a DLTensor on the stack, no Python attribute, no allocation.
 *
 * `Table(args, tensors, scalars)` holds one kernel's entries (`HotEntry`: a LayoutCheck, the
 * grid, served kernel, constant tail and device of a runtime entry), open-addressed by a hash
 * of exactly what a LayoutCheck compares. `HotCall(table, ...)` is the kernel's call code
 * (`kernel(...)`, or `kernel.launch(stream, ...)` with `with_stream`), what hot_path.py's
 * Python form does, in C: keywords go to the runtime; the call's layout is hashed and looked up
 * (one read per tensor, whatever entry served the call before, so calls whose sizes change cost
 * what a repeated size costs); no entry: the runtime's `miss`; an entry without a tail: the
 * runtime launches it; otherwise its launch counter goes up, the stream is read (torch's
 * current stream through the same exchange table, or a getter the runtime gives) and the launch
 * function is called with the entry's grid, kernel and the call's arguments plus the entry's
 * tail; a launch that raises goes to `failed`, uncounted.
 *
 * Only the DLPack ABI (a published, versioned C struct layout) is assumed, never torch's C++
 * classes, so this builds with a C compiler and Python's headers alone and works with any
 * torch that exports the table. Where it cannot be built or the table is missing, the hot
 * path is the plain Python form in hot_path.py.
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

/* Whether the tensor DLPack described as `t` has the slot's layout. */
static int same_read(const Slot *slot, const DLTensor *t) {
    if (t->ndim != slot->ndim || t->device.device_type != slot->device.device_type
        || t->device.device_id != slot->device.device_id || t->dtype.code != slot->dtype.code
        || t->dtype.bits != slot->dtype.bits || t->dtype.lanes != slot->dtype.lanes)
        return 0;
    if (memcmp(t->shape, slot->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
        return 0;
    int64_t buf[MAX_DIMS];
    return memcmp(strides_of(t, buf), slot->strides, sizeof(int64_t) * (size_t)t->ndim) == 0;
}

static int same_tensor(const Slot *slot, PyObject *obj) {
    DLTensor t;
    if (Py_TYPE(obj) != slot->type)
        return 0;
    if (slot->api->dltensor_from_py_object_no_sync(obj, &t) != 0) {
        PyErr_Clear(); /* a tensor DLPack cannot describe: not this entry's */
        return 0;
    }
    return same_read(slot, &t);
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

/* ---- Table: one kernel's entries by exact layout; HotCall: the kernel's call code ---------- */

#define MAX_ARGS 64
#define MIX(h, v) ((h) = ((h) ^ (uint64_t)(v)) * 0x100000001b3ULL)

/* One exact layout of an entry, and what launching it takes (tail None: the runtime launches
 * it, e.g. an entry that zeroes arguments first). */
typedef struct {
    PyObject_HEAD
    uint64_t hash;
    long long calls; /* launches made through this object */
    int32_t device_id;
    LayoutCheck *check;
    PyObject *entry, *grid, *kernel, *tail, *device;
} HotEntry;

/* Argument positions and kinds every entry shares (the plan), and the entries, open-addressed by
 * their layout hash. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *tensors, *scalars;      /* the plan's positions, for LayoutCheck */
    char kinds[MAX_ARGS];             /* 't' or 's' per position */
    PyTypeObject *types[MAX_ARGS];    /* each tensor position's exact type */
    const ExchangeAPI *apis[MAX_ARGS];
    const ExchangeAPI *streams;       /* where torch's current stream is read */
    Py_ssize_t count, cap;            /* entries; slots, a power of two */
    HotEntry **slots;
    HotEntry *last;                   /* the entry found last (borrowed from slots), or NULL */
} Table;

static PyTypeObject HotEntryType, TableType;

/* Each tensor of a call read into `reads` under the table's plan; 0 where the call does not
 * fit the plan (number, kind or type of an argument, a tensor DLPack cannot describe): not an
 * error, just no entry of this table. */
static int read_call(const Table *t, PyObject *const *args, Py_ssize_t n, DLTensor *reads) {
    if (n != t->n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t->kinds[i] == 's')
            continue;
        DLTensor *d = &reads[i];
        if (Py_TYPE(args[i]) != t->types[i])
            return 0;
        if (t->apis[i]->dltensor_from_py_object_no_sync(args[i], d) != 0) {
            PyErr_Clear();
            return 0;
        }
        if (d->ndim < 0 || d->ndim > MAX_DIMS)
            return 0;
    }
    return 1;
}

/* The hash of exactly what `matches` compares; 0 where a scalar cannot be hashed. */
static int layout_hash(const Table *t, PyObject *const *args, const DLTensor *reads,
                       uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        if (t->kinds[i] == 's') {
            Py_hash_t v = PyObject_Hash(args[i]);
            if (v == -1) {
                PyErr_Clear();
                return 0;
            }
            MIX(h, (uintptr_t)Py_TYPE(args[i]));
            MIX(h, v);
            continue;
        }
        const DLTensor *d = &reads[i];
        int64_t buf[MAX_DIMS];
        const int64_t *strides = strides_of(d, buf);
        MIX(h, d->device.device_type);
        MIX(h, d->device.device_id);
        MIX(h, d->dtype.code | ((uint32_t)d->dtype.bits << 8) | ((uint32_t)d->dtype.lanes << 16));
        MIX(h, d->ndim);
        for (int32_t k = 0; k < d->ndim; k++) {
            MIX(h, d->shape[k]);
            MIX(h, strides[k]);
        }
    }
    *out = h;
    return 1;
}

static int matches(const HotEntry *e, PyObject *const *args, const DLTensor *reads,
                   Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const Slot *slot = &e->check->slots[i];
        if (!(slot->api != NULL ? same_read(slot, &reads[i]) : same_scalar(slot, args[i])))
            return 0;
    }
    return 1;
}

/* The entry of exactly this call's layout (borrowed), or NULL: the entry found last is asked
 * first (a loop calling one layout skips the hash), then the hash is looked up. */
static HotEntry *find(Table *t, PyObject *const *args, Py_ssize_t n) {
    DLTensor reads[MAX_ARGS];
    uint64_t h;
    if (t->count == 0 || !read_call(t, args, n, reads))
        return NULL;
    if (t->last != NULL && matches(t->last, args, reads, n))
        return t->last;
    if (!layout_hash(t, args, reads, &h))
        return NULL;
    size_t mask = (size_t)t->cap - 1;
    for (size_t i = (size_t)(h ^ (h >> 29)) & mask; t->slots[i] != NULL; i = (i + 1) & mask) {
        HotEntry *e = t->slots[i];
        if (e->hash == h && matches(e, args, reads, n)) {
            t->last = e;
            return e;
        }
    }
    return NULL;
}

static void place(HotEntry **slots, Py_ssize_t cap, HotEntry *e) {
    size_t mask = (size_t)cap - 1, i = (size_t)(e->hash ^ (e->hash >> 29)) & mask;
    while (slots[i] != NULL)
        i = (i + 1) & mask;
    slots[i] = e;
}

static int grow(Table *t) {
    Py_ssize_t cap = t->cap ? t->cap * 2 : 16;
    HotEntry **slots = PyMem_Calloc((size_t)cap, sizeof(HotEntry *));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->cap; i++)
        if (t->slots[i] != NULL)
            place(slots, cap, t->slots[i]);
    PyMem_Free(t->slots);
    t->cap = cap;
    t->slots = slots;
    return 0;
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *call_args, *tensors, *scalars;
    static char *names[] = {"args", "tensors", "scalars", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!:Table", names, &PyTuple_Type,
                                     &call_args, &PyTuple_Type, &tensors, &PyTuple_Type,
                                     &scalars))
        return NULL;
    /* The plan checked (and each tensor's exchange table found) as a LayoutCheck does. */
    LayoutCheck *probe = (LayoutCheck *)PyObject_CallFunctionObjArgs(
        (PyObject *)&LayoutCheckType, call_args, tensors, scalars, NULL);
    if (probe == NULL)
        return NULL;
    if (probe->n > MAX_ARGS) {
        Py_DECREF(probe);
        PyErr_SetString(PyExc_ValueError, "too many arguments for a layout table");
        return NULL;
    }
    Table *self = (Table *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(probe);
        return NULL;
    }
    self->n = probe->n;
    self->tensors = Py_NewRef(tensors);
    self->scalars = Py_NewRef(scalars);
    for (Py_ssize_t i = 0; i < probe->n; i++) {
        const Slot *slot = &probe->slots[i];
        self->kinds[i] = slot->api != NULL ? 't' : 's';
        self->types[i] = slot->api != NULL ? (PyTypeObject *)Py_NewRef(slot->type) : NULL;
        self->apis[i] = slot->api;
        if (self->streams == NULL && slot->api != NULL)
            self->streams = slot->api;
    }
    Py_DECREF(probe);
    return (PyObject *)self;
}

/* table.add(args, entry, grid, kernel, tail, device) -> HotEntry: serve calls of exactly this
 * layout with these; the one already there when another thread added it first. */
static PyObject *table_add(Table *self, PyObject *args) {
    PyObject *call_args, *entry, *grid, *kernel, *tail, *device;
    if (!PyArg_ParseTuple(args, "O!OOOOO:add", &PyTuple_Type, &call_args, &entry, &grid,
                          &kernel, &tail, &device))
        return NULL;
    if (tail != Py_None && !PyTuple_Check(tail)) {
        PyErr_SetString(PyExc_TypeError, "tail must be a tuple or None");
        return NULL;
    }
    long device_id = PyLong_AsLong(device);
    if (device_id == -1 && PyErr_Occurred())
        return NULL;
    PyObject *const *items = &PyTuple_GET_ITEM(call_args, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(call_args);
    DLTensor reads[MAX_ARGS];
    uint64_t h;
    if (!read_call(self, items, n, reads) || !layout_hash(self, items, reads, &h)) {
        PyErr_SetString(PyExc_ValueError, "the arguments do not fit the table's plan");
        return NULL;
    }
    HotEntry *found = find(self, items, n);
    if (found != NULL)
        return Py_NewRef(found);
    LayoutCheck *check = (LayoutCheck *)PyObject_CallFunctionObjArgs(
        (PyObject *)&LayoutCheckType, call_args, self->tensors, self->scalars, NULL);
    if (check == NULL)
        return NULL;
    if ((self->count + 1) * 2 > self->cap && grow(self) < 0) {
        Py_DECREF(check);
        return NULL;
    }
    HotEntry *e = PyObject_GC_New(HotEntry, &HotEntryType);
    if (e == NULL) {
        Py_DECREF(check);
        return NULL;
    }
    e->hash = h;
    e->calls = 0;
    e->device_id = (int32_t)device_id;
    e->check = check;
    e->entry = Py_NewRef(entry);
    e->grid = Py_NewRef(grid);
    e->kernel = Py_NewRef(kernel);
    e->tail = Py_NewRef(tail);
    e->device = Py_NewRef(device);
    PyObject_GC_Track(e);
    place(self->slots, self->cap, (HotEntry *)Py_NewRef(e));
    self->count += 1;
    return (PyObject *)e;
}

static PyObject *table_find(Table *self, PyObject *const *args, Py_ssize_t n) {
    HotEntry *e = find(self, args, n);
    return e != NULL ? Py_NewRef(e) : Py_NewRef(Py_None);
}

static int table_clear(Table *self) {
    HotEntry **slots = self->slots;
    Py_ssize_t cap = self->cap;
    self->slots = NULL;
    self->last = NULL;
    self->cap = self->count = 0;
    for (Py_ssize_t i = 0; i < cap; i++)
        Py_XDECREF(slots[i]);
    PyMem_Free(slots);
    return 0;
}

static PyObject *table_clear_method(Table *self, PyObject *unused) {
    (void)unused;
    table_clear(self);
    Py_RETURN_NONE;
}

static Py_ssize_t table_len(Table *self) {
    return self->count;
}

static int table_traverse(Table *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < self->cap; i++)
        Py_VISIT(self->slots[i]);
    return 0;
}

static void table_dealloc(Table *self) {
    PyObject_GC_UnTrack(self);
    table_clear(self);
    for (Py_ssize_t i = 0; i < self->n; i++)
        Py_XDECREF(self->types[i]);
    Py_XDECREF(self->tensors);
    Py_XDECREF(self->scalars);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef table_methods[] = {
    {"add", (PyCFunction)table_add, METH_VARARGS,
     PyDoc_STR("add(args, entry, grid, kernel, tail, device) -> HotEntry")},
    {"find", (PyCFunction)(void (*)(void))table_find, METH_FASTCALL,
     PyDoc_STR("find(*args) -> the HotEntry of exactly this layout, or None")},
    {"clear", (PyCFunction)table_clear_method, METH_NOARGS, PyDoc_STR("drop every entry")},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods table_sequence = {.sq_length = (lenfunc)table_len};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctbuild.serve._fast_path.Table",
    .tp_doc = PyDoc_STR("Table(args, tensors, scalars): a kernel's entries by exact layout, "
                        "for calls of the kinds of `args`."),
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = table_new,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_traverse = (traverseproc)table_traverse,
    .tp_clear = (inquiry)table_clear,
    .tp_methods = table_methods,
    .tp_as_sequence = &table_sequence,
};

static int entry_traverse(HotEntry *self, visitproc visit, void *arg) {
    Py_VISIT(self->check);
    Py_VISIT(self->entry);
    Py_VISIT(self->grid);
    Py_VISIT(self->kernel);
    Py_VISIT(self->tail);
    Py_VISIT(self->device);
    return 0;
}

static int entry_clear(HotEntry *self) {
    Py_CLEAR(self->check);
    Py_CLEAR(self->entry);
    Py_CLEAR(self->grid);
    Py_CLEAR(self->kernel);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->device);
    return 0;
}

static void entry_dealloc(HotEntry *self) {
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *entry_calls(HotEntry *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(self->calls);
}

static PyObject *entry_entry(HotEntry *self, void *closure) {
    (void)closure;
    return Py_NewRef(self->entry != NULL ? self->entry : Py_None);
}

static PyGetSetDef entry_getset[] = {
    {"calls", (getter)entry_calls, NULL, PyDoc_STR("launches made through this layout"), NULL},
    {"entry", (getter)entry_entry, NULL, PyDoc_STR("the runtime's entry it serves"), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HotEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctbuild.serve._fast_path.HotEntry",
    .tp_doc = PyDoc_STR("One exact layout of an entry in a Table (made by Table.add)."),
    .tp_basicsize = sizeof(HotEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_getset = entry_getset,
};

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
    HotEntry *e = find(self->table, args, n);
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

static PyTypeObject HotCallType = {
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fast_path",
    .m_doc = PyDoc_STR("The hot path in C: a kernel's entries by exact layout and its call code."),
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fast_path(void) {
    if (PyType_Ready(&LayoutCheckType) < 0 || PyType_Ready(&HotEntryType) < 0
        || PyType_Ready(&TableType) < 0 || PyType_Ready(&HotCallType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "LayoutCheck", (PyObject *)&LayoutCheckType) < 0
        || PyModule_AddObjectRef(m, "Table", (PyObject *)&TableType) < 0
        || PyModule_AddObjectRef(m, "HotEntry", (PyObject *)&HotEntryType) < 0
        || PyModule_AddObjectRef(m, "HotCall", (PyObject *)&HotCallType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
