/* A fake libcuda.so.1 for the shim's tests: no GPU, every call recorded.
 *
 * Each call appends one line "name key=value ..." to the file named by FAKE_CUDA_LOG, with a
 * single write, so the test can read the order of calls across threads. Device pointers are
 * addresses handed out from a counter: nothing is allocated, so tests may "allocate" far more
 * than the machine has. FAKE_CUDA_TOTAL sets the GPU's memory (default 16 GiB);
 * FAKE_CUDA_LAUNCH_SECONDS makes each kernel launch take that long, like a synchronous call
 * that waits for the GPU; FAKE_CUDA_CAPTURING_STREAM names a stream under graph capture;
 * FAKE_CUDA_MANAGED_ERROR makes cuMemAllocManaged fail with that error code;
 * FAKE_CUDA_STREAM_SYNC_GATE names a file: cuStreamSynchronize (after recording itself) waits
 * until it exists, so a test can hold a transfer in the middle and look around.
 *
 * cuGetProcAddress answers like the real driver: by base name, CUDA version and default-stream
 * flavour, with the exported functions, except "cuMemGetInfo", for which it hands out an
 * internal entry point that dlsym cannot see (the shim must then hook it by name).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

#define EXPORT __attribute__((visibility("default")))
#define PRIMARY_CONTEXT ((CUcontext)0xC0FFEE)

static atomic_ullong next_address = 0x7f0000000000ull;
static atomic_ullong allocated;
static atomic_ullong next_stream = 0x5000;
static __thread CUcontext current;

static void record(const char *fmt, ...)
{
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path)
        return;
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, args);
    va_end(args);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t ignored = write(fd, line, (size_t)n);
        (void)ignored;
        close(fd);
    }
}

static unsigned long long total_memory(void)
{
    const char *text = getenv("FAKE_CUDA_TOTAL");
    return text ? strtoull(text, NULL, 10) : 16ull << 30;
}

static CUdeviceptr take_addresses(size_t size)
{
    unsigned long long rounded = (size + 0xFFFFF) & ~0xFFFFFull;
    atomic_fetch_add(&allocated, size);
    return atomic_fetch_add(&next_address, rounded ? rounded : 0x100000);
}

EXPORT CUresult cuInit(unsigned flags) { record("cuInit flags=%u", flags); return 0; }
EXPORT CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, int device)
{
    (void)device;
    *bytes = total_memory();
    return 0;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current ? current : PRIMARY_CONTEXT; return 0; }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return 0; }
EXPORT CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }
EXPORT CUresult cuCtxSynchronize(void)
{
    record("cuCtxSynchronize ctx=%p", current ? current : PRIMARY_CONTEXT);
    return 0;
}
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags)
{
    *stream = (CUstream)(uintptr_t)atomic_fetch_add(&next_stream, 1);
    record("cuStreamCreate stream=%p flags=%u", *stream, flags);
    return 0;
}
EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    record("cuStreamSynchronize stream=%p", stream);
    const char *gate = getenv("FAKE_CUDA_STREAM_SYNC_GATE");
    while (gate && access(gate, F_OK) != 0)
        usleep(1000);
    return 0;
}

/* FAKE_CUDA_CAPTURING_STREAM names a stream (e.g. 0x66) that is being captured into a graph. */
EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    const char *text = getenv("FAKE_CUDA_CAPTURING_STREAM");
    *status = text && (uintptr_t)stream == (uintptr_t)strtoull(text, NULL, 0) ? 1 : 0;
    return 0;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    *dptr = take_addresses(size);
    record("cuMemAlloc_v2 size=%zu ptr=0x%llx", size, *dptr);
    return 0;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    if (size > total_memory() * 4)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY: even managed memory has a bound */
    const char *refuse = getenv("FAKE_CUDA_MANAGED_ERROR");
    if (refuse) {
        record("cuMemAllocManaged size=%zu refused=%s", size, refuse);
        return atoi(refuse);
    }
    *dptr = take_addresses(size);
    record("cuMemAllocManaged size=%zu flags=%u ptr=0x%llx", size, flags, *dptr);
    return 0;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned element)
{
    *pitch = (w + 255) & ~(size_t)255;
    *dptr = take_addresses(*pitch * h);
    record("cuMemAllocPitch_v2 width=%zu height=%zu element=%u", w, h, element);
    return 0;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    *dptr = take_addresses(size);
    record("cuMemAllocAsync size=%zu stream=%p", size, s);
    return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, CUstream s)
{
    *dptr = take_addresses(size);
    record("cuMemAllocFromPoolAsync size=%zu pool=%p stream=%p", size, pool, s);
    return 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    record("cuMemFree_v2 ptr=0x%llx", dptr);
    return 0;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    record("cuMemFreeAsync ptr=0x%llx stream=%p", dptr, s);
    return 0;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    unsigned long long total = total_memory(), used = atomic_load(&allocated);
    *free_bytes = used < total ? total - used : 0;
    *total_bytes = total;
    record("cuMemGetInfo_v2");
    return 0;
}
/* What cuGetProcAddress hands out for "cuMemGetInfo": not exported, unknown to dlsym. */
static CUresult internal_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    return cuMemGetInfo_v2(free_bytes, total_bytes);
}
EXPORT CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop,
                            unsigned long long flags)
{
    (void)prop;
    *handle = take_addresses(size);
    record("cuMemCreate size=%zu flags=%llu", size, flags);
    return 0;
}
EXPORT CUresult cuMemRelease(unsigned long long handle)
{
    record("cuMemRelease handle=0x%llx", handle);
    return 0;
}
EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr dptr, size_t size, int device, CUstream s)
{
    record("cuMemPrefetchAsync ptr=0x%llx size=%zu device=%d stream=%p", dptr, size, device, s);
    return 0;
}

static void launch_delay(void)
{
    const char *text = getenv("FAKE_CUDA_LAUNCH_SECONDS");
    if (!text)
        return;
    double seconds = atof(text);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream s,
                               void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    launch_delay();
    record("cuLaunchKernel f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, CUstream s,
                                    void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    record("cuLaunchKernel_ptsz f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra)
{
    (void)config; (void)params; (void)extra;
    record("cuLaunchKernelEx f=%p", f);
    return 0;
}
EXPORT CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                          CUstream s, void **params)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params;
    record("cuLaunchCooperativeKernel f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuGraphLaunch(void *graph, CUstream s)
{
    record("cuGraphLaunch graph=%p stream=%p", graph, s);
    return 0;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    (void)src;
    record("cuMemcpyHtoD_v2 dst=0x%llx n=%zu", dst, n);
    return 0;
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    (void)dst;
    record("cuMemcpyDtoH_v2 src=0x%llx n=%zu", src, n);
    return 0;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    record("cuMemsetD8_v2 dst=0x%llx value=%u n=%zu", dst, value, n);
    return 0;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status);

struct entry {
    const char *base;
    int version;
    int per_thread;
    void *address;
};

static const struct entry entries[] = {
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
    {"cuInit", 2000, 0, (void *)cuInit},
    {"cuDeviceGet", 2000, 0, (void *)cuDeviceGet},
    {"cuCtxGetCurrent", 4000, 0, (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", 4000, 0, (void *)cuCtxSetCurrent},
    {"cuCtxSynchronize", 2000, 0, (void *)cuCtxSynchronize},
    {"cuStreamSynchronize", 2000, 0, (void *)cuStreamSynchronize},
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemGetInfo", 3020, 0, (void *)internal_mem_get_info},
    {"cuMemCreate", 10020, 0, (void *)cuMemCreate},
    {"cuMemRelease", 10020, 0, (void *)cuMemRelease},
    {"cuLaunchKernel", 4000, 0, (void *)cuLaunchKernel},
    {"cuLaunchKernel", 7000, 1, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", 11060, 0, (void *)cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", 9000, 0, (void *)cuLaunchCooperativeKernel},
    {"cuGraphLaunch", 10000, 0, (void *)cuGraphLaunch},
    {"cuMemcpyHtoD", 3020, 0, (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", 3020, 0, (void *)cuMemcpyDtoH_v2},
    {"cuMemsetD8", 3020, 0, (void *)cuMemsetD8_v2},
};

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    int per_thread = (flags & 2) != 0;
    const struct entry *best = NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->base, symbol) != 0 || e->version > version)
            continue;
        if (e->per_thread && !per_thread)
            continue;
        if (!best || e->version > best->version)
            best = e;
    }
    record("cuGetProcAddress symbol=%s version=%d flags=%llu found=%d", symbol, version, flags,
           best != NULL);
    if (!best) {
        *pfn = NULL;
        return 500; /* CUDA_ERROR_NOT_FOUND */
    }
    *pfn = best->address;
    return 0;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags)
{
    return lookup(symbol, pfn, version, flags);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status)
{
    CUresult result = lookup(symbol, pfn, version, flags);
    if (status)
        *status = result == 0 ? 0 : 1;
    return result;
}

__attribute__((constructor)) static void fake_cuda_loaded(void) { record("loaded"); }
