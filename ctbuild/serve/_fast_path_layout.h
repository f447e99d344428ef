/* An argument's layout read through DLPack, compared and hashed: the read path every call takes
 * (inline, in each file that reads a call; recording a layout is _fast_path_layout.c).
 *
 * Tensor metadata is read through the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`,
 * a versioned table of C functions that torch exports for exactly this): one C call per tensor
 * that fills a DLTensor on the stack, no Python attribute, no allocation. A scalar is its exact
 * type and value.
 */
#ifndef CTBUILD_FAST_PATH_LAYOUT_H
#define CTBUILD_FAST_PATH_LAYOUT_H

#include "_fast_path.h"

#define MIX(h, v) ((h) = ((h) ^ (uint64_t)(v)) * 0x100000001b3ULL)

/* `obj` described by `api` into `out`: 0, or -1 with an exception set (DLPack cannot describe
 * it, or it has more dimensions than a slot holds). Every tensor read goes through here. */
static inline int describe(const ExchangeAPI *api, PyObject *obj, DLTensor *out) {
    if (api->dltensor_from_py_object_no_sync(obj, out) != 0)
        return -1;
    if (out->ndim < 0 || out->ndim > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "too many dimensions for a layout check");
        return -1;
    }
    return 0;
}

/* Strides of `t`, filled in for a compact tensor that gives none. */
static inline const int64_t *strides_of(const DLTensor *t, int64_t *buf) {
    if (t->strides != NULL)
        return t->strides;
    int64_t s = 1;
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        buf[k] = s;
        s *= t->shape[k];
    }
    return buf;
}

/* Read the tensor `obj` as a tensor of exactly the type `type`, through `api`: 1 with `out`
 * filled, 0 where it is not one (another type, or DLPack cannot describe it; no error set). */
static inline int fp_read(PyTypeObject *type, const ExchangeAPI *api, PyObject *obj,
                          DLTensor *out) {
    if (Py_TYPE(obj) != type)
        return 0;
    if (describe(api, obj, out) < 0) {
        PyErr_Clear(); /* a tensor DLPack cannot describe: not one of these */
        return 0;
    }
    return 1;
}

/* Whether the tensor DLPack described as `t` has the slot's layout. */
static inline int same_read(const Slot *slot, const DLTensor *t) {
    if (t->ndim != slot->ndim || t->device.device_type != slot->device.device_type
        || t->device.device_id != slot->device.device_id || t->dtype.code != slot->dtype.code
        || t->dtype.bits != slot->dtype.bits || t->dtype.lanes != slot->dtype.lanes)
        return 0;
    if (memcmp(t->shape, slot->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
        return 0;
    int64_t buf[MAX_DIMS];
    return memcmp(strides_of(t, buf), slot->strides, sizeof(int64_t) * (size_t)t->ndim) == 0;
}

static inline int same_scalar(const Slot *slot, PyObject *obj) {
    if (Py_TYPE(obj) != slot->type)
        return 0;
    int eq = PyObject_RichCompareBool(obj, slot->value, Py_EQ);
    if (eq < 0) {
        PyErr_Clear();
        return 0;
    }
    return eq;
}

/* Whether `obj` (a tensor slot: as `fp_read` read it into `read`) has exactly the slot's
 * layout, type and value. */
static inline int fp_matches(const Slot *slot, PyObject *obj, const DLTensor *read) {
    return slot->api != NULL ? same_read(slot, read) : same_scalar(slot, obj);
}

/* The hash of exactly what `fp_matches` compares over `n` positions (`apis[i]` NULL: a
 * scalar; else `reads[i]` is the tensor read); 0 where a scalar cannot be hashed (no error
 * set). */
static inline int fp_hash(const ExchangeAPI *const *apis, Py_ssize_t n, PyObject *const *args,
                          const DLTensor *reads, uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (apis[i] == NULL) {
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

#endif
