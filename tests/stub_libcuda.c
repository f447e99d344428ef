/*
 * A stub libcuda.so.1 for CPU-only machines.
 *
 * cuTile's extension reaches the driver only through cuGetProcAddress_v2 (see
 * cuda/tile/_load_libcuda.py). This stub answers that lookup with fake entry points that return
 * CUDA_SUCCESS and plausible values (one sm_90 device, a current context, device memory for every
 * pointer), so that the real C++ dispatcher can derive kernel signatures -- and even walk the
 * launch path up to `kernel._compile` -- with no GPU. Nothing here touches memory behind a
 * "device" pointer; launches are no-ops.
 *
 * Build: gcc -shared -fPIC -o libcuda.so.1 stub_libcuda.c
 * Set STUB_LIBCUDA_LOG=1 to log every lookup (and unknown names) to stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_FOUND 500

static char fake_ctx_storage[64];
static char fake_handle_storage[64];
#define FAKE_CTX ((CUcontext)fake_ctx_storage)
#define FAKE_HANDLE ((void *)fake_handle_storage)

static int log_enabled(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *v = getenv("STUB_LIBCUDA_LOG");
        cached = v && *v && *v != '0';
    }
    return cached;
}

#define TRACE(name) do { if (log_enabled()) fprintf(stderr, "[stub-libcuda] call %s\n", name); } while (0)

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

CUresult cuInit(unsigned int flags) { (void)flags; TRACE("cuInit"); return CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int *v) {
    TRACE("cuDriverGetVersion");
    *v = env_int("STUB_LIBCUDA_DRIVER_VERSION", 13000);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) { TRACE("cuDeviceGetCount"); *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { TRACE("cuDeviceGet"); *d = ordinal; return CUDA_SUCCESS; }

CUresult cuDeviceGetAttribute(int *out, int attrib, CUdevice dev) {
    (void)dev;
    TRACE("cuDeviceGetAttribute");
    switch (attrib) {
    case 75: *out = env_int("STUB_LIBCUDA_CC_MAJOR", 9); break;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *out = env_int("STUB_LIBCUDA_CC_MINOR", 0); break;   /* COMPUTE_CAPABILITY_MINOR */
    case 5: *out = 2147483647; break;                              /* MAX_GRID_DIM_X */
    case 6: case 7: *out = 65535; break;                           /* MAX_GRID_DIM_Y/Z */
    case 16: *out = 132; break;                                    /* MULTIPROCESSOR_COUNT */
    case 1: *out = 1024; break;                                    /* MAX_THREADS_PER_BLOCK */
    case 10: *out = 32; break;                                     /* WARP_SIZE */
    default: *out = 1; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    (void)dev; TRACE("cuDevicePrimaryCtxRetain"); *ctx = FAKE_CTX; return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext *ctx) { TRACE("cuCtxGetCurrent"); *ctx = FAKE_CTX; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext ctx) { (void)ctx; TRACE("cuCtxSetCurrent"); return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext ctx) { (void)ctx; TRACE("cuCtxPushCurrent"); return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext *ctx) { TRACE("cuCtxPopCurrent"); if (ctx) *ctx = FAKE_CTX; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) { TRACE("cuCtxGetDevice"); *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) { (void)ctx; TRACE("cuCtxGetId"); *id = 1; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { TRACE("cuCtxSynchronize"); return CUDA_SUCCESS; }

/* Pointer attributes: every pointer is device memory of device 0 in the fake context. */
static void pointer_attribute(void *data, int attr, CUdeviceptr ptr) {
    switch (attr) {
    case 1: *(CUcontext *)data = FAKE_CTX; break;             /* CONTEXT */
    case 2: *(unsigned int *)data = 2; break;                 /* MEMORY_TYPE = DEVICE */
    case 3: *(CUdeviceptr *)data = ptr; break;                /* DEVICE_POINTER */
    case 4: *(void **)data = NULL; break;                     /* HOST_POINTER */
    case 6: *(int *)data = 0; break;                          /* SYNC_MEMOPS */
    case 7: *(unsigned long long *)data = 1; break;           /* BUFFER_ID */
    case 8: *(unsigned int *)data = 0; break;                 /* IS_MANAGED */
    case 9: *(int *)data = 0; break;                          /* DEVICE_ORDINAL */
    case 10: *(CUdeviceptr *)data = ptr; break;               /* RANGE_START_ADDR */
    case 11: *(size_t *)data = (size_t)1 << 40; break;        /* RANGE_SIZE */
    case 12: *(int *)data = 1; break;                         /* MAPPED */
    default: *(int *)data = 0; break;
    }
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
    TRACE("cuPointerGetAttribute");
    if (log_enabled()) fprintf(stderr, "[stub-libcuda]   attr=%d ptr=0x%llx\n", attr, ptr);
    pointer_attribute(data, attr, ptr);
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr ptr) {
    TRACE("cuPointerGetAttributes");
    for (unsigned int i = 0; i < n; i++) pointer_attribute(data[i], attrs[i], ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
    TRACE("cuMemGetAddressRange");
    if (base) *base = ptr;
    if (size) *size = (size_t)1 << 40;
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(void *stream, CUcontext *ctx) { (void)stream; TRACE("cuStreamGetCtx"); *ctx = FAKE_CTX; return CUDA_SUCCESS; }
CUresult cuStreamGetId(void *stream, unsigned long long *id) { (void)stream; TRACE("cuStreamGetId"); *id = 1; return CUDA_SUCCESS; }
CUresult cuStreamIsCapturing(void *stream, int *status) { (void)stream; TRACE("cuStreamIsCapturing"); *status = 0; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(void *stream) { (void)stream; TRACE("cuStreamSynchronize"); return CUDA_SUCCESS; }
CUresult cuStreamCreate(void **stream, unsigned int flags) { (void)flags; TRACE("cuStreamCreate"); *stream = FAKE_HANDLE; return CUDA_SUCCESS; }
CUresult cuStreamDestroy(void *stream) { (void)stream; TRACE("cuStreamDestroy"); return CUDA_SUCCESS; }

CUresult cuLibraryLoadData(void **lib, const void *code, void *jo, void *jov, unsigned int njo,
                           void *lo, void *lov, unsigned int nlo) {
    (void)code; (void)jo; (void)jov; (void)njo; (void)lo; (void)lov; (void)nlo;
    TRACE("cuLibraryLoadData"); *lib = FAKE_HANDLE; return CUDA_SUCCESS;
}
CUresult cuLibraryUnload(void *lib) { (void)lib; TRACE("cuLibraryUnload"); return CUDA_SUCCESS; }
CUresult cuLibraryGetKernel(void **k, void *lib, const char *name) {
    (void)lib; TRACE("cuLibraryGetKernel");
    if (log_enabled()) fprintf(stderr, "[stub-libcuda]   kernel=%s\n", name);
    *k = FAKE_HANDLE; return CUDA_SUCCESS;
}
CUresult cuKernelGetFunction(void **f, void *k) { (void)k; TRACE("cuKernelGetFunction"); *f = FAKE_HANDLE; return CUDA_SUCCESS; }
CUresult cuKernelGetAttribute(int *v, int attr, void *k, CUdevice d) { (void)attr; (void)k; (void)d; TRACE("cuKernelGetAttribute"); *v = 0; return CUDA_SUCCESS; }
CUresult cuKernelSetAttribute(int attr, int v, void *k, CUdevice d) { (void)attr; (void)v; (void)k; (void)d; TRACE("cuKernelSetAttribute"); return CUDA_SUCCESS; }
/* Launches are no-ops: the stub never runs a kernel. */
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void *stream, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)stream;
    (void)params; (void)extra;
    TRACE("cuLaunchKernel"); return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra; TRACE("cuLaunchKernelEx"); return CUDA_SUCCESS;
}

/* Handle-creating calls hand out a fake handle; the rest just succeed. None is used to derive
 * signatures; they exist because the extension resolves them all at start-up. */
CUresult cuEventCreate(void **ev, unsigned int flags) { (void)flags; TRACE("cuEventCreate"); *ev = FAKE_HANDLE; return CUDA_SUCCESS; }
CUresult cuEventDestroy(void *ev) { (void)ev; TRACE("cuEventDestroy"); return CUDA_SUCCESS; }
CUresult cuEventRecord(void *ev, void *stream) { (void)ev; (void)stream; TRACE("cuEventRecord"); return CUDA_SUCCESS; }
CUresult cuEventQuery(void *ev) { (void)ev; TRACE("cuEventQuery"); return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; TRACE("cuEventElapsedTime"); *ms = 1.0f; return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(void *s, void *ev, unsigned int f) { (void)s; (void)ev; (void)f; TRACE("cuStreamWaitEvent"); return CUDA_SUCCESS; }

/* Anything else the extension resolves (graphs, IPC, allocation, tensor maps) resolves to this:
 * lookup succeeds, a call fails loudly with CUDA_ERROR_NOT_SUPPORTED. */
static CUresult stub_unsupported(void) {
    if (log_enabled()) fprintf(stderr, "[stub-libcuda] call of an unsupported entry point\n");
    return 801;
}

CUresult cuGetErrorString(CUresult err, const char **str) {
    (void)err; *str = "stub libcuda error"; return CUDA_SUCCESS;
}

struct entry { const char *name; void *fn; };
static const struct entry entries[] = {
#define E(f) {#f, (void *)f}
    E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetAttribute),
    E(cuDevicePrimaryCtxRetain), E(cuCtxGetCurrent), E(cuCtxSetCurrent), E(cuCtxPushCurrent),
    E(cuCtxPopCurrent), E(cuCtxGetDevice), E(cuCtxGetId), E(cuCtxSynchronize),
    E(cuPointerGetAttribute), E(cuPointerGetAttributes), E(cuMemGetAddressRange),
    E(cuStreamGetCtx), E(cuStreamGetId), E(cuStreamIsCapturing), E(cuStreamSynchronize),
    E(cuStreamCreate), E(cuStreamDestroy), E(cuLibraryLoadData), E(cuLibraryUnload),
    E(cuLibraryGetKernel), E(cuKernelGetFunction), E(cuKernelGetAttribute),
    E(cuKernelSetAttribute), E(cuLaunchKernel), E(cuLaunchKernelEx), E(cuGetErrorString),
    E(cuEventCreate), E(cuEventDestroy), E(cuEventRecord), E(cuEventQuery), E(cuEventElapsedTime),
    E(cuStreamWaitEvent),
#undef E
    {NULL, NULL},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             unsigned long long flags, int *symbolStatus) {
    (void)cudaVersion; (void)flags;
    for (const struct entry *e = entries; e->name; e++) {
        if (strcmp(e->name, symbol) == 0) {
            if (log_enabled()) fprintf(stderr, "[stub-libcuda] lookup %s\n", symbol);
            *pfn = e->fn;
            if (symbolStatus) *symbolStatus = 0;  /* CU_GET_PROC_ADDRESS_SUCCESS */
            return CUDA_SUCCESS;
        }
    }
    if (strncmp(symbol, "cu", 2) != 0) {
        *pfn = NULL;
        if (symbolStatus) *symbolStatus = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        return CUDA_ERROR_NOT_FOUND;
    }
    if (log_enabled()) fprintf(stderr, "[stub-libcuda] lookup %s: unsupported stub\n", symbol);
    *pfn = (void *)stub_unsupported;
    if (symbolStatus) *symbolStatus = 0;
    return CUDA_SUCCESS;
}
