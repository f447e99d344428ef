/* LayoutCheck: one call's recorded layout, and whether a later call has exactly it.
 *
 * `LayoutCheck(args, tensors, scalars)` records, for a call's arguments, each tensor's exact
 * Python type, device, dtype, sizes and strides and each scalar's exact type and value
 * (_fast_path_layout.c). Called with a later call's arguments it answers True only when every
 * one of them matches. A Table keeps one per entry, and one more as its plan.
 */
#include "_fast_path_layout.h"

/* Whether the n arguments `args` have exactly the recorded layout. */
static int same_layout(const LayoutCheck *self, PyObject *const *args, Py_ssize_t n) {
    if (n != self->n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Slot *slot = &self->slots[i];
        DLTensor read;
        if (slot->api != NULL && !fp_read(slot->type, slot->api, args[i], &read))
            return 0;
        if (!fp_matches(slot, args[i], &read))
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
        fp_release(self->slots, self->n);
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
        if (fp_record(&self->slots[i], PyTuple_GET_ITEM(call_args, i), kinds[i] == 't') < 0)
            goto fail;
    }
    PyMem_Free(kinds);
    return (PyObject *)self;
fail:
    PyMem_Free(kinds);
    Py_XDECREF(self);
    return NULL;
}

PyTypeObject LayoutCheckType = {
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
