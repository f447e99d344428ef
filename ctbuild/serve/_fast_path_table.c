/* Table: one kernel's entries by exact layout; HotEntry: one exact layout of an entry.
 *
 * `Table(args, tensors, scalars)` holds one kernel's entries (`HotEntry`: a LayoutCheck, the
 * grid, served kernel, constant tail and device of a runtime entry), open-addressed by a hash
 * of exactly what a LayoutCheck compares. A call is read once (one DLPack read per tensor),
 * whatever entry served the call before: the entry found last is asked first, then the hash
 * is looked up, so calls whose sizes change cost what a repeated size costs.
 */
#include "_fast_path_layout.h"

/* Each tensor of a call read into `reads` under the table's plan; 0 where the call does not
 * fit the plan (number, kind or type of an argument, a tensor DLPack cannot describe): not an
 * error, just no entry of this table. */
static int read_call(const Table *t, PyObject *const *args, Py_ssize_t n, DLTensor *reads) {
    if (n != t->plan->n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t->apis[i] != NULL && !fp_read(t->types[i], t->apis[i], args[i], &reads[i]))
            return 0;
    }
    return 1;
}

static int matches(const HotEntry *e, PyObject *const *args, const DLTensor *reads,
                   Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!fp_matches(&e->check->slots[i], args[i], &reads[i]))
            return 0;
    }
    return 1;
}

/* The entry found last is asked first (a loop calling one layout skips the hash). */
HotEntry *fp_find(Table *t, PyObject *const *args, Py_ssize_t n) {
    DLTensor reads[MAX_ARGS];
    uint64_t h;
    if (t->count == 0 || !read_call(t, args, n, reads))
        return NULL;
    if (t->last != NULL && matches(t->last, args, reads, n))
        return t->last;
    if (!fp_hash(t->apis, n, args, reads, &h))
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

/* A LayoutCheck of `call_args` under the positions `tensors` and `scalars`. */
static LayoutCheck *layout_check(PyObject *call_args, PyObject *tensors, PyObject *scalars) {
    return (LayoutCheck *)PyObject_CallFunctionObjArgs((PyObject *)&LayoutCheckType, call_args,
                                                       tensors, scalars, NULL);
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *call_args, *tensors, *scalars;
    static char *names[] = {"args", "tensors", "scalars", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!:Table", names, &PyTuple_Type,
                                     &call_args, &PyTuple_Type, &tensors, &PyTuple_Type,
                                     &scalars))
        return NULL;
    /* The plan checked (and each tensor's exchange table found) as a LayoutCheck does. */
    LayoutCheck *plan = layout_check(call_args, tensors, scalars);
    if (plan == NULL)
        return NULL;
    if (plan->n > MAX_ARGS) {
        Py_DECREF(plan);
        PyErr_SetString(PyExc_ValueError, "too many arguments for a layout table");
        return NULL;
    }
    Table *self = (Table *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(plan);
        return NULL;
    }
    self->plan = plan;
    self->tensors = Py_NewRef(tensors);
    self->scalars = Py_NewRef(scalars);
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        self->types[i] = plan->slots[i].type;
        self->apis[i] = plan->slots[i].api;
        if (self->streams == NULL)
            self->streams = self->apis[i];
    }
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
    if (!read_call(self, items, n, reads) || !fp_hash(self->apis, n, items, reads, &h)) {
        PyErr_SetString(PyExc_ValueError, "the arguments do not fit the table's plan");
        return NULL;
    }
    HotEntry *found = fp_find(self, items, n);
    if (found != NULL)
        return Py_NewRef(found);
    LayoutCheck *check = layout_check(call_args, self->tensors, self->scalars);
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
    HotEntry *e = fp_find(self, args, n);
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
    Py_XDECREF(self->plan);
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

PyTypeObject TableType = {
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

PyTypeObject HotEntryType = {
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
