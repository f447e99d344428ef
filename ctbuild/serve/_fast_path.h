/* What the C module's source files share (internal to ctbuild.serve._fast_path).
 *
 * The DLPack 1.x ABI (a published, versioned C struct layout: the only thing of torch this
 * module assumes), the recorded layout of one argument (`Slot`), and the module's types with
 * the functions one file gives another. `_fast_path.c` says what the module does as a whole.
 */
#ifndef CTBUILD_FAST_PATH_H
#define CTBUILD_FAST_PATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Functions one file gives another: never visible outside the module. */
#if defined(__GNUC__) || defined(__clang__)
#define FP_INTERNAL __attribute__((visibility("hidden")))
#else
#define FP_INTERNAL
#endif

/* ---- The DLPack 1.x ABI, as its specification defines the structs ---------------------- */
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
/* Most arguments a Table's calls may have (a call's tensors are read onto the stack). */
#define MAX_ARGS 64

/* ---- One argument's recorded layout (_fast_path_layout.c; read: _fast_path_layout.h) ---- */

/* A tensor's exact type and layout (api != NULL) or a scalar's exact type and value. */
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

/* Record `obj` in an empty `slot`: as a tensor (`is_tensor`; -1 with an exception where its
 * type exports no DLPack exchange or DLPack cannot describe it) or as a scalar. */
FP_INTERNAL int fp_record(Slot *slot, PyObject *obj, int is_tensor);
/* Drop the references `n` recorded slots hold. */
FP_INTERNAL void fp_release(Slot *slots, Py_ssize_t n);

/* ---- The module's types ------------------------------------------------------------------ */

/* A call's recorded layout (_fast_path_check.c). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n;
    Slot *slots;
} LayoutCheck;

/* One exact layout of an entry, and what launching it takes (tail None: the runtime launches
 * it, e.g. an entry that zeroes arguments first) (_fast_path_table.c). */
typedef struct {
    PyObject_HEAD
    uint64_t hash;
    long long calls; /* launches made through this object */
    int32_t device_id;
    LayoutCheck *check;
    PyObject *entry, *grid, *kernel, *tail, *device;
} HotEntry;

/* A kernel's entries, open-addressed by their layout hash, for calls whose argument positions
 * and kinds are those of `plan` (_fast_path_table.c). */
typedef struct {
    PyObject_HEAD
    LayoutCheck *plan;                /* each position's kind and, for a tensor, its type */
    PyObject *tensors, *scalars;      /* the plan's positions, for each entry's LayoutCheck */
    /* What a call's read takes of the plan, per position, side by side (borrowed from it):
     * the exact type of a tensor, and its exchange table (NULL: a scalar). */
    PyTypeObject *types[MAX_ARGS];
    const ExchangeAPI *apis[MAX_ARGS];
    const ExchangeAPI *streams;       /* where torch's current stream is read */
    Py_ssize_t count, cap;            /* entries; slots, a power of two */
    HotEntry **slots;
    HotEntry *last;                   /* the entry found last (borrowed from slots), or NULL */
} Table;

extern FP_INTERNAL PyTypeObject LayoutCheckType, HotEntryType, TableType, HotCallType;

/* The entry of exactly this call's layout (borrowed), or NULL. */
FP_INTERNAL HotEntry *fp_find(Table *t, PyObject *const *args, Py_ssize_t n);

#endif
