/* A memory-backed stand-in for the few libcuda.so.1 calls benchmarks/shim/evict_driver.py makes,
 * so that evict_variants runs end to end without a GPU: "device" and managed memory are host
 * memory, copies are memcpy, and the managed allocation's 2 MiB blocks remember where they
 * live, so that cuMemGetInfo's free memory moves with prefetches and discards as on a card.
 * A discard scribbles over the bytes (their contents become indeterminate), so a benchmark
 * that forgot to copy them back would read garbage. FAKE_UVM_NO_DISCARD=1: a driver without
 * CUDA 13's discards. FAKE_UVM_NO_PINNING=1: cuMemAllocHost fails. FAKE_UVM_LOG names a file that gets one line per call.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef struct {
    int type; /* 1 device, 2 host */
    int id;
} CUmemLocation;

#define EXPORT __attribute__((visibility("default")))
#define TOTAL (8ULL << 30)
#define BLOCK (2ULL << 20)
#define CPU (-1)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long device_used; /* cuMemAlloc's, and managed blocks on the GPU */
static char *managed;                  /* one managed allocation is all the benchmark makes */
static size_t managed_size;
static unsigned char *on_gpu; /* per 2 MiB block */
static char *device_memory;   /* the one cuMemAlloc (the floor's buffer), and its size */
static size_t device_size;

static void record(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void record(const char *format, ...)
{
    const char *path = getenv("FAKE_UVM_LOG");
    if (!path)
        return;
    FILE *log = fopen(path, "a");
    if (!log)
        return;
    va_list args;
    va_start(args, format);
    vfprintf(log, format, args);
    va_end(args);
    fputc('\n', log);
    fclose(log);
}

/* Where [ptr, ptr + size) of the managed allocation now lives; returns 1 when it is managed. */
static int place(CUdeviceptr ptr, size_t size, int gpu)
{
    char *start = (char *)(uintptr_t)ptr;
    if (!managed || start < managed || start + size > managed + managed_size)
        return 0;
    pthread_mutex_lock(&lock);
    for (size_t b = (size_t)(start - managed) / BLOCK;
         b * BLOCK < (size_t)(start - managed) + size; b++) {
        if (on_gpu[b] != gpu)
            device_used += gpu ? BLOCK : -BLOCK;
        on_gpu[b] = (unsigned char)gpu;
    }
    pthread_mutex_unlock(&lock);
    return 1;
}

static int device_of(CUmemLocation where) { return where.type == 2 ? CPU : where.id; }

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return 0; }
EXPORT CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
EXPORT CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int device)
{
    (void)device;
    *ctx = (void *)0x1;
    return 0;
}
EXPORT CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags)
{
    static int next = 0x100;
    (void)flags;
    pthread_mutex_lock(&lock);
    *stream = (CUstream)(uintptr_t)next++;
    pthread_mutex_unlock(&lock);
    return 0;
}
EXPORT CUresult cuStreamSynchronize(CUstream stream) { (void)stream; return 0; }

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    pthread_mutex_lock(&lock);
    *free_bytes = TOTAL - device_used;
    pthread_mutex_unlock(&lock);
    *total_bytes = TOTAL;
    return 0;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size)
{
    if (device_memory || !(device_memory = malloc(size)))
        return 2;
    device_size = size;
    device_used += size;
    *ptr = (CUdeviceptr)(uintptr_t)device_memory;
    return 0;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t size, unsigned flags)
{
    (void)flags;
    managed = malloc(size);
    on_gpu = calloc(size / BLOCK + 1, 1);
    if (!managed || !on_gpu)
        return 2;
    managed_size = size;
    *ptr = (CUdeviceptr)(uintptr_t)managed;
    record("cuMemAllocManaged size=%zu", size);
    return 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    char *memory = (char *)(uintptr_t)ptr;
    if (memory == managed) {
        place(ptr, managed_size, 0);
        managed = NULL;
        free(on_gpu);
    }
    if (memory == device_memory) {
        device_used -= device_size;
        device_memory = NULL;
    }
    free(memory);
    return 0;
}
EXPORT CUresult cuMemAllocHost_v2(void **host, size_t size)
{
    if (getenv("FAKE_UVM_NO_PINNING"))
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *host = malloc(size);
    return *host ? 0 : 2;
}
EXPORT CUresult cuMemFreeHost(void *host)
{
    free(host);
    return 0;
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr ptr, unsigned value, size_t count, CUstream s)
{
    (void)s;
    unsigned *words = (unsigned *)(uintptr_t)ptr;
    for (size_t i = 0; i < count; i++)
        words[i] = value;
    place(ptr, count * 4, 1); /* a write from the GPU populates there */
    return 0;
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    record("cuMemcpyDtoHAsync_v2 n=%zu stream=%p", n, s);
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    record("cuMemcpyHtoDAsync_v2 n=%zu stream=%p", n, s);
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t size, CUmemLocation where,
                                      unsigned flags, CUstream s)
{
    record("cuMemPrefetchAsync_v2 size=%zu device=%d flags=%u stream=%p", size,
           device_of(where), flags, s);
    return place(ptr, size, device_of(where) != CPU) ? 0 : 1;
}
EXPORT CUresult cuMemAdvise_v2(CUdeviceptr ptr, size_t size, int advice, CUmemLocation where)
{
    (void)ptr;
    record("cuMemAdvise_v2 size=%zu advice=%d device=%d", size, advice, device_of(where));
    return 0;
}

static CUresult drop(CUdeviceptr *ptrs, size_t *sizes, size_t count, int gpu)
{
    for (size_t i = 0; i < count; i++) {
        memset((void *)(uintptr_t)ptrs[i], 0xA5, sizes[i]); /* indeterminate from now on */
        if (!place(ptrs[i], sizes[i], gpu))
            return 1;
    }
    return 0;
}
EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                       unsigned long long flags, CUstream s)
{
    if (getenv("FAKE_UVM_NO_DISCARD"))
        return 801;
    record("cuMemDiscardBatchAsync count=%zu flags=%llu stream=%p", count, flags, s);
    return drop(ptrs, sizes, count, 0);
}
EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                                  CUmemLocation *locations, size_t *indexes,
                                                  size_t nlocations, unsigned long long flags,
                                                  CUstream s)
{
    if (getenv("FAKE_UVM_NO_DISCARD"))
        return 801;
    (void)indexes;
    record("cuMemDiscardAndPrefetchBatchAsync count=%zu device=%d locations=%zu stream=%p",
           count, device_of(locations[0]), nlocations, s);
    (void)flags;
    return drop(ptrs, sizes, count, device_of(locations[0]) != CPU);
}
