/* Recording an argument's layout: a tensor's type, the exchange table it is read through, its
 * device, dtype, sizes and strides; a scalar's type and value. Later calls are read and compared
 * with it by _fast_path_layout.h.
 */
#include "_fast_path_layout.h"

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

int fp_record(Slot *slot, PyObject *obj, int is_tensor) {
    if (!is_tensor) {
        slot->type = (PyTypeObject *)Py_NewRef(Py_TYPE(obj));
        slot->value = Py_NewRef(obj);
        return 0;
    }
    const ExchangeAPI *api = exchange_api(Py_TYPE(obj));
    DLTensor t;
    if (api == NULL || describe(api, obj, &t) < 0)
        return -1;
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

void fp_release(Slot *slots, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(slots[i].type);
        Py_XDECREF(slots[i].value);
    }
}

