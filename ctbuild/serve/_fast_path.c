/* The hot path in C: a kernel's entries by exact layout, and its call code.
 *
 * One extension module, `ctbuild.serve._fast_path`, from these files (setup.py lists them):
 * - _fast_path_layout.c / _fast_path_layout.h: an argument's layout read through DLPack
 *   (recorded; read again, compared, hashed: inline, per call): the one place a tensor is read;
 * - _fast_path_check.c: `LayoutCheck`, a call's recorded layout and whether a later call has it;
 * - _fast_path_table.c: `Table`, a kernel's entries (`HotEntry`) by exact layout;
 * - _fast_path_call.c: `HotCall`, the kernel's call code over its table;
 * - _fast_path.h: the types they share; this file: the module.
 *
 * Only the DLPack ABI (a published, versioned C struct layout) is assumed, never torch's C++
 * classes, so this builds with a C compiler and Python's headers alone and works with any
 * torch that exports the exchange table. Where it cannot be built or the table is missing, the
 * hot path is the plain Python form in hot_path.py.
 */
#include "_fast_path.h"

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
