/* Reading an argument's layout through DLPack: recording it, reading a later call's, comparing
 * and hashing them.
 *
 * Tensor metadata is read through the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`,
 * a versioned table of C functions that torch exports for exactly this): one C call per tensor
 * that fills a DLTensor on the stack, no Python attribute, no allocation. A scalar is its exact
 * type and value.
 */
#include "_fast_path.h"

#define MIX(h, v) ((h) = ((h) ^ (uint64_t)(v)) * 0x100000001b3ULL)

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

/* `obj` described by `api` into `out`: 0, or -1 with an exception set (DLPack cannot describe
 * it, or it has more dimensions than a slot holds). Every tensor read goes through here. */
static int describe(const ExchangeAPI *api, PyObject *obj, DLTensor *out) {
    if (api->dltensor_from_py_object_no_sync(obj, out) != 0)
        return -1;
    if (out->ndim < 0 || out->ndim > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "too many dimensions for a layout check");
        return -1;
    }
    return 0;
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

int fp_read(const Slot *slot, PyObject *obj, DLTensor *out) {
    if (Py_TYPE(obj) != slot->type)
        return 0;
    if (describe(slot->api, obj, out) < 0) {
        PyErr_Clear(); /* a tensor DLPack cannot describe: not this slot's */
        return 0;
    }
    return 1;
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

int fp_matches(const Slot *slot, PyObject *obj, const DLTensor *read) {
    return slot->api != NULL ? same_read(slot, read) : same_scalar(slot, obj);
}

int fp_hash(const Slot *plan, Py_ssize_t n, PyObject *const *args, const DLTensor *reads,
            uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (plan[i].api == NULL) {
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
