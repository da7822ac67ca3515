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
 * until it exists, after prefetches to the host, so a test can hold an eviction in the middle
 * and look around. Other
 * FAKE_CUDA_* variables are described where they act.
 *
 * The checkpoint API (cuCheckpointProcess*) acts on another process, as the real one does:
 * with FAKE_CUDA_CHECKPOINT_DIR set, each process that loads the fake maps a small shared page
 * there, named by its pid, holding its state (running, locked, checkpointed, failed) and the
 * count of its CUDA calls in progress. A daemon loading the same fake locks a process by
 * writing its state and waiting (up to the lock's timeout) for those calls to end; from then
 * on the process's calls really block until it is unlocked. A process that allocated managed
 * memory (UVM), or was started with FAKE_CUDA_CHECKPOINT_FAIL=1, fails its checkpoint and is
 * left FAILED, as the r570 driver does. FAKE_CUDA_NO_CHECKPOINT=1 makes cuGetProcAddress deny
 * the API, as a driver before r570 does.
 *
 * cuGetProcAddress answers like the real driver: by base name, CUDA version and default-stream
 * flavour, with its own functions (the library is linked -Bsymbolic, so the shim's exports of
 * the same names do not stand in for them), except "cuMemGetInfo", for which it hands out an
 * internal entry point that dlsym cannot see (the shim must then hook it by name). It answers
 * for every entry point that the real CUDA 12 and 13 runtimes ask for and the shim must catch,
 * so that tests loading a real libcudart see each of those requests answered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* ---- the checkpoint API's state, shared between processes ------------------------------ */

enum { RUNNING, LOCKED, CHECKPOINTED, FAILED };
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801

struct shared_state {
    atomic_int state;
    atomic_int in_progress; /* CUDA calls of this process under way */
    atomic_int uses_uvm;    /* it allocated managed memory: its checkpoint fails */
};

static struct shared_state *own_state;

static struct shared_state *map_state(int pid, bool create)
{
    const char *dir = getenv("FAKE_CUDA_CHECKPOINT_DIR");
    if (!dir)
        return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, pid);
    int fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDWR | O_CLOEXEC,
                  0600);
    if (fd < 0)
        return NULL;
    if (create && ftruncate(fd, sizeof(struct shared_state)) != 0) {
        close(fd);
        return NULL;
    }
    void *page = mmap(NULL, sizeof(struct shared_state), PROT_READ | PROT_WRITE, MAP_SHARED,
                      fd, 0);
    close(fd);
    return page == MAP_FAILED ? NULL : page;
}

/* Every call of the process passes here: once the process is locked, it waits. The same
 * handshake as the shim's gate: count the call in, then look at the state. */
static void call_begins(void)
{
    if (!own_state)
        return;
    for (;;) {
        atomic_fetch_add(&own_state->in_progress, 1);
        if (atomic_load(&own_state->state) == RUNNING)
            return;
        atomic_fetch_sub(&own_state->in_progress, 1);
        usleep(1000);
    }
}

static void call_ends(void)
{
    if (own_state)
        atomic_fetch_sub(&own_state->in_progress, 1);
}

/* The other process's state, when it is alive and runs over this fake. */
static struct shared_state *target(int pid)
{
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return NULL;
    return map_state(pid, false);
}

static void done_with(struct shared_state *s)
{
    munmap(s, sizeof *s);
}

struct lock_args { unsigned timeout_ms; unsigned reserved0; unsigned long long reserved1[7]; };

EXPORT CUresult cuCheckpointProcessLock(int pid, struct lock_args *args)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    int expected = RUNNING;
    CUresult result = 0;
    if (!atomic_compare_exchange_strong(&s->state, &expected, LOCKED)) {
        result = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        /* Wait for the calls under way, as the driver waits for submitted work. */
        unsigned timeout = args ? args->timeout_ms : 0, waited = 0;
        while (atomic_load(&s->in_progress) > 0 && (!timeout || waited < timeout)) {
            usleep(1000);
            waited++;
        }
        if (atomic_load(&s->in_progress) > 0) {
            atomic_store(&s->state, RUNNING);
            result = CUDA_ERROR_NOT_READY;
        }
    }
    done_with(s);
    record("cuCheckpointProcessLock pid=%d result=%d", pid, result);
    return result;
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, void *args)
{
    (void)args;
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = 0;
    if (atomic_load(&s->state) != LOCKED) {
        result = CUDA_ERROR_ILLEGAL_STATE;
    } else if (atomic_load(&s->uses_uvm)) {
        atomic_store(&s->state, FAILED);
        result = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        const char *delay = getenv("FAKE_CUDA_CHECKPOINT_SECONDS");
        if (delay)
            usleep((useconds_t)(atof(delay) * 1e6));
        atomic_store(&s->state, CHECKPOINTED);
    }
    done_with(s);
    record("cuCheckpointProcessCheckpoint pid=%d result=%d", pid, result);
    return result;
}

static CUresult transition(const char *name, int pid, int from, int to)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = atomic_compare_exchange_strong(&s->state, &from, to)
        ? 0 : CUDA_ERROR_ILLEGAL_STATE;
    done_with(s);
    record("%s pid=%d result=%d", name, pid, result);
    return result;
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, void *args)
{
    (void)args;
    return transition("cuCheckpointProcessRestore", pid, CHECKPOINTED, LOCKED);
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, void *args)
{
    (void)args;
    return transition("cuCheckpointProcessUnlock", pid, LOCKED, RUNNING);
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, int *state)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *state = atomic_load(&s->state);
    done_with(s);
    return 0;
}

EXPORT CUresult cuInit(unsigned flags) { record("cuInit flags=%u", flags); return 0; }
EXPORT CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
EXPORT CUresult cuDeviceGetCount(int *count) { *count = 1; return 0; }
EXPORT CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
/* The UUID is the bytes 00 01 02 ... 0f: GPU-00010203-0405-0607-0809-0a0b0c0d0e0f. */
EXPORT CUresult cuDeviceGetUuid_v2(char *uuid, int device)
{
    (void)device;
    for (int i = 0; i < 16; i++)
        uuid[i] = (char)i;
    return 0;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, int device)
{
    (void)device;
    *bytes = total_memory();
    return 0;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current ? current : PRIMARY_CONTEXT; return 0; }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return 0; }
EXPORT CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }

/* Contexts: any handle may be made current; the primary context is counted by reference. */
static atomic_int primary_references;

static CUresult destroy_context(const char *name, CUcontext ctx)
{
    if (current == ctx)
        current = NULL;
    record("%s ctx=%p", name, ctx);
    return 0;
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return destroy_context("cuCtxDestroy", ctx); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return destroy_context("cuCtxDestroy_v2", ctx); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int device)
{
    *ctx = PRIMARY_CONTEXT;
    record("cuDevicePrimaryCtxRetain device=%d references=%d", device,
           atomic_fetch_add(&primary_references, 1) + 1);
    return 0;
}
static CUresult release_primary(const char *name, int device)
{
    record("%s device=%d references=%d", name, device,
           atomic_fetch_sub(&primary_references, 1) - 1);
    return 0;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(int device)
{
    return release_primary("cuDevicePrimaryCtxRelease", device);
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int device)
{
    return release_primary("cuDevicePrimaryCtxRelease_v2", device);
}
static CUresult reset_primary(const char *name, int device)
{
    atomic_store(&primary_references, 0);
    record("%s device=%d", name, device);
    return 0;
}
EXPORT CUresult cuDevicePrimaryCtxReset(int device)
{
    return reset_primary("cuDevicePrimaryCtxReset", device);
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(int device)
{
    return reset_primary("cuDevicePrimaryCtxReset_v2", device);
}
EXPORT CUresult cuDevicePrimaryCtxGetState(int device, unsigned *flags, int *active)
{
    (void)device;
    *flags = 0;
    *active = atomic_load(&primary_references) > 0;
    return 0;
}
static bool invalidate_captures(void);

/* FAKE_CUDA_SYNC_ERROR: the error every cuCtxSynchronize returns (a sticky error on a real
 * GPU, such as 700, an illegal address). */
static CUresult cuCtxSynchronize_body(void)
{
    const char *error = getenv("FAKE_CUDA_SYNC_ERROR");
    bool invalidating = invalidate_captures();
    record("cuCtxSynchronize ctx=%p%s", current ? current : PRIMARY_CONTEXT,
           invalidating ? " invalidated-capture" : "");
    if (invalidating)
        return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
    return error ? atoi(error) : 0;
}
EXPORT CUresult cuCtxSynchronize(void)
{
    call_begins();
    CUresult result = cuCtxSynchronize_body();
    call_ends();
    return result;
}
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags)
{
    *stream = (CUstream)(uintptr_t)atomic_fetch_add(&next_stream, 1);
    record("cuStreamCreate stream=%p flags=%u", *stream, flags);
    return 0;
}
/* Where the last prefetch went: FAKE_CUDA_STREAM_SYNC_GATE holds evictions (prefetches to the
 * host) only, not the restores around them. */
static atomic_int last_prefetch_device = 0;

static CUresult cuStreamSynchronize_body(CUstream stream)
{
    record("cuStreamSynchronize stream=%p", stream);
    const char *gate = getenv("FAKE_CUDA_STREAM_SYNC_GATE");
    while (gate && atomic_load(&last_prefetch_device) == -1 && access(gate, F_OK) != 0)
        usleep(1000);
    return 0;
}
EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    call_begins();
    CUresult result = cuStreamSynchronize_body(stream);
    call_ends();
    return result;
}

/* Graph capture as the driver does it in the global mode: cuCtxSynchronize while a capture
 * is open fails and invalidates it, and its cuStreamEndCapture then fails too (ending it all
 * the same). FAKE_CUDA_CAPTURING_STREAM names a stream (e.g. 0x66) that is being captured
 * without the fake having seen it begin. */
#define MAX_CAPTURES 16
static CUstream captures[MAX_CAPTURES];
static bool invalidated[MAX_CAPTURES];
static pthread_mutex_t captures_lock = PTHREAD_MUTEX_INITIALIZER;

static int capture_of(CUstream stream)
{
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i] == stream && stream)
            return i;
    return -1;
}

static CUresult begin_capture(const char *name, CUstream stream, int mode)
{
    pthread_mutex_lock(&captures_lock);
    int free_slot = capture_of(NULL);
    for (int i = 0; i < MAX_CAPTURES && free_slot < 0; i++)
        if (!captures[i])
            free_slot = i;
    bool began = stream && capture_of(stream) < 0 && free_slot >= 0;
    if (began) {
        captures[free_slot] = stream;
        invalidated[free_slot] = false;
    }
    pthread_mutex_unlock(&captures_lock);
    record("%s stream=%p mode=%d", name, stream, mode);
    return began ? 0 : 1; /* CUDA_ERROR_INVALID_VALUE: the legacy stream, or already capturing */
}

static CUresult end_capture(const char *name, CUstream stream, void **graph)
{
    pthread_mutex_lock(&captures_lock);
    int i = capture_of(stream);
    bool was_invalidated = i >= 0 && invalidated[i];
    if (i >= 0)
        captures[i] = NULL;
    pthread_mutex_unlock(&captures_lock);
    if (graph)
        *graph = i >= 0 && !was_invalidated ? (void *)0x6A : NULL;
    record("%s stream=%p invalidated=%d", name, stream, was_invalidated);
    if (i < 0)
        return 906; /* CUDA_ERROR_STREAM_CAPTURE_UNMATCHED */
    return was_invalidated ? 901 : 0; /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
}

/* Invalidates every open capture; true when there was one. */
static bool invalidate_captures(void)
{
    bool any = false;
    pthread_mutex_lock(&captures_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (captures[i]) {
            invalidated[i] = true;
            any = true;
        }
    }
    pthread_mutex_unlock(&captures_lock);
    return any;
}

EXPORT CUresult cuStreamBeginCapture(CUstream stream)
{
    return begin_capture("cuStreamBeginCapture", stream, 0);
}
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    return begin_capture("cuStreamBeginCapture_ptsz", stream ? stream : (CUstream)2, 0);
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    return begin_capture("cuStreamBeginCapture_v2", stream, mode);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode)
{
    return begin_capture("cuStreamBeginCapture_v2_ptsz", stream ? stream : (CUstream)2, mode);
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, void *graph, const void *deps,
                                            const void *edges, size_t n, int mode)
{
    (void)graph; (void)deps; (void)edges; (void)n;
    return begin_capture("cuStreamBeginCaptureToGraph", stream, mode);
}
EXPORT CUresult cuStreamEndCapture(CUstream stream, void **graph)
{
    return end_capture("cuStreamEndCapture", stream, graph);
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, void **graph)
{
    return end_capture("cuStreamEndCapture_ptsz", stream ? stream : (CUstream)2, graph);
}

EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    const char *text = getenv("FAKE_CUDA_CAPTURING_STREAM");
    pthread_mutex_lock(&captures_lock);
    int i = capture_of(stream);
    *status = i < 0 ? 0 : invalidated[i] ? 2 : 1;
    pthread_mutex_unlock(&captures_lock);
    if (text && (uintptr_t)stream == (uintptr_t)strtoull(text, NULL, 0))
        *status = 1;
    return 0;
}

static CUresult cuMemAlloc_v2_body(CUdeviceptr *dptr, size_t size)
{
    *dptr = take_addresses(size);
    record("cuMemAlloc_v2 size=%zu ptr=0x%llx", size, *dptr);
    return 0;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    call_begins();
    CUresult result = cuMemAlloc_v2_body(dptr, size);
    call_ends();
    return result;
}
static CUresult alloc_managed_body(CUdeviceptr *dptr, size_t size, unsigned flags);
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    call_begins();
    CUresult result = alloc_managed_body(dptr, size, flags);
    call_ends();
    return result;
}

static CUresult alloc_managed_body(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    if (size > total_memory() * 4)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY: even managed memory has a bound */
    const char *refuse = getenv("FAKE_CUDA_MANAGED_ERROR");
    if (refuse) {
        record("cuMemAllocManaged size=%zu refused=%s", size, refuse);
        return atoi(refuse);
    }
    *dptr = take_addresses(size);
    if (own_state)
        atomic_store(&own_state->uses_uvm, 1);
    record("cuMemAllocManaged size=%zu flags=%u ptr=0x%llx", size, flags, *dptr);
    return 0;
}
static CUresult cuMemAllocPitch_v2_body(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned element)
{
    *pitch = (w + 255) & ~(size_t)255;
    *dptr = take_addresses(*pitch * h);
    record("cuMemAllocPitch_v2 width=%zu height=%zu element=%u", w, h, element);
    return 0;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned element)
{
    call_begins();
    CUresult result = cuMemAllocPitch_v2_body(dptr, pitch, w, h, element);
    call_ends();
    return result;
}
static CUresult cuMemAllocAsync_body(CUdeviceptr *dptr, size_t size, CUstream s)
{
    *dptr = take_addresses(size);
    record("cuMemAllocAsync size=%zu stream=%p", size, s);
    return 0;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    call_begins();
    CUresult result = cuMemAllocAsync_body(dptr, size, s);
    call_ends();
    return result;
}
static CUresult cuMemAllocFromPoolAsync_body(CUdeviceptr *dptr, size_t size, void *pool, CUstream s)
{
    *dptr = take_addresses(size);
    record("cuMemAllocFromPoolAsync size=%zu pool=%p stream=%p", size, pool, s);
    return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, CUstream s)
{
    call_begins();
    CUresult result = cuMemAllocFromPoolAsync_body(dptr, size, pool, s);
    call_ends();
    return result;
}
/* FAKE_CUDA_FREE_ERROR: the error every cuMemFree_v2 returns. */
/* Memory pools. FAKE_CUDA_MANAGED_POOLS=1: a CUDA 13 driver, which makes managed pools;
 * otherwise a CUDA 12 one, which refuses the allocation type. */
static atomic_ullong next_pool = 0x9000;

EXPORT CUresult cuMemPoolCreate(void **pool, const int *props)
{
    int type = props[0], location_type = props[2], location_id = props[3];
    if (type == 2 && !getenv("FAKE_CUDA_MANAGED_POOLS")) {
        record("cuMemPoolCreate type=%d refused", type);
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
    *pool = (void *)(uintptr_t)atomic_fetch_add(&next_pool, 1);
    record("cuMemPoolCreate type=%d location=%d:%d pool=%p", type, location_type, location_id,
           *pool);
    return 0;
}
EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep)
{
    record("cuMemPoolTrimTo pool=%p keep=%zu", pool, keep);
    return 0;
}
static CUresult device_pool(const char *name, void **pool, int device)
{
    *pool = (void *)0xDEF;
    record("%s device=%d", name, device);
    return 0;
}
EXPORT CUresult cuDeviceGetMemPool(void **pool, int device)
{
    return device_pool("cuDeviceGetMemPool", pool, device);
}
EXPORT CUresult cuDeviceGetDefaultMemPool(void **pool, int device)
{
    return device_pool("cuDeviceGetDefaultMemPool", pool, device);
}

static CUresult cuMemFree_v2_body(CUdeviceptr dptr)
{
    const char *error = getenv("FAKE_CUDA_FREE_ERROR");
    record("cuMemFree_v2 ptr=0x%llx%s", dptr, error ? " refused" : "");
    return error ? atoi(error) : 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    call_begins();
    CUresult result = cuMemFree_v2_body(dptr);
    call_ends();
    return result;
}
static CUresult cuMemFreeAsync_body(CUdeviceptr dptr, CUstream s)
{
    record("cuMemFreeAsync ptr=0x%llx stream=%p", dptr, s);
    return 0;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    call_begins();
    CUresult result = cuMemFreeAsync_body(dptr, s);
    call_ends();
    return result;
}
/* FAKE_CUDA_OTHERS_USED: bytes other processes hold on the GPU and cannot give up. */
static CUresult cuMemGetInfo_v2_body(size_t *free_bytes, size_t *total_bytes)
{
    const char *others = getenv("FAKE_CUDA_OTHERS_USED");
    unsigned long long total = total_memory(), used = atomic_load(&allocated);
    used += others ? strtoull(others, NULL, 10) : 0;
    *free_bytes = used < total ? total - used : 0;
    *total_bytes = total;
    record("cuMemGetInfo_v2");
    return 0;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    call_begins();
    CUresult result = cuMemGetInfo_v2_body(free_bytes, total_bytes);
    call_ends();
    return result;
}
/* What cuGetProcAddress hands out for "cuMemGetInfo": not exported, unknown to dlsym. */
static CUresult internal_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    return cuMemGetInfo_v2(free_bytes, total_bytes);
}
static CUresult cuMemCreate_body(unsigned long long *handle, size_t size, const void *prop,
                            unsigned long long flags)
{
    (void)prop;
    *handle = take_addresses(size);
    record("cuMemCreate size=%zu flags=%llu", size, flags);
    return 0;
}
EXPORT CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop,
                            unsigned long long flags)
{
    call_begins();
    CUresult result = cuMemCreate_body(handle, size, prop, flags);
    call_ends();
    return result;
}
EXPORT CUresult cuMemRelease(unsigned long long handle)
{
    record("cuMemRelease handle=0x%llx", handle);
    return 0;
}
static CUresult cuMemPrefetchAsync_body(CUdeviceptr dptr, size_t size, int device, CUstream s)
{
    atomic_store(&last_prefetch_device, device);
    record("cuMemPrefetchAsync ptr=0x%llx size=%zu device=%d stream=%p", dptr, size, device, s);
    return 0;
}
EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr dptr, size_t size, int device, CUstream s)
{
    call_begins();
    CUresult result = cuMemPrefetchAsync_body(dptr, size, device, s);
    call_ends();
    return result;
}

/* FAKE_CUDA_PREFETCH_BATCH=1: batches as a CUDA 13 driver does. Otherwise it refuses them
 * (CUDA_ERROR_NOT_SUPPORTED) without a record, so that a test's call sequence reads as on a
 * driver without batches. Called with nothing to do (the tests' bare calls), it does nothing. */
EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                        const int *locations, size_t *indexes, size_t nlocations,
                                        unsigned long long flags, CUstream s)
{
    (void)indexes;
    if (!count || !ptrs || !sizes || !locations) {
        record("cuMemPrefetchBatchAsync");
        return 0;
    }
    if (!getenv("FAKE_CUDA_PREFETCH_BATCH"))
        return 801;
    unsigned long long bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += sizes[i];
    int device = locations[0] == 2 ? -1 : locations[1];
    atomic_store(&last_prefetch_device, device);
    record("cuMemPrefetchBatchAsync count=%zu bytes=%llu locations=%zu device=%d flags=%llu "
           "stream=%p", count, bytes, nlocations, device, flags, s);
    return 0;
}

/* FAKE_CUDA_DISCARD=1: discards as a CUDA 13 driver on a GPU with concurrent managed access
 * does. Otherwise it refuses them (CUDA_ERROR_NOT_SUPPORTED) without a record, as such a driver
 * does on a GPU without it, so that a test's call sequence reads as on a driver that cannot. */
EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                       unsigned long long flags, CUstream s)
{
    if (!getenv("FAKE_CUDA_DISCARD"))
        return 801;
    if (!count || !ptrs || !sizes) {
        record("cuMemDiscardBatchAsync");
        return 0;
    }
    unsigned long long bytes = 0;
    char ranges[320] = "";
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        bytes += sizes[i];
        if (used < sizeof ranges)
            used += (size_t)snprintf(ranges + used, sizeof ranges - used, "%s0x%llx+%zu",
                                     i ? "," : "", ptrs[i], sizes[i]);
    }
    record("cuMemDiscardBatchAsync count=%zu bytes=%llu flags=%llu stream=%p ranges=%s", count,
           bytes, flags, s, ranges);
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

static CUresult cuLaunchKernel_body(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream s,
                               void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    launch_delay();
    record("cuLaunchKernel f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream s,
                               void **params, void **extra)
{
    call_begins();
    CUresult result = cuLaunchKernel_body(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    call_ends();
    return result;
}
static CUresult cuLaunchKernel_ptsz_body(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, CUstream s,
                                    void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    record("cuLaunchKernel_ptsz f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, CUstream s,
                                    void **params, void **extra)
{
    call_begins();
    CUresult result = cuLaunchKernel_ptsz_body(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    call_ends();
    return result;
}
static CUresult cuLaunchKernelEx_body(const void *config, void *f, void **params, void **extra)
{
    (void)config; (void)params; (void)extra;
    record("cuLaunchKernelEx f=%p", f);
    return 0;
}
EXPORT CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra)
{
    call_begins();
    CUresult result = cuLaunchKernelEx_body(config, f, params, extra);
    call_ends();
    return result;
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
static CUresult cuMemcpyHtoD_v2_body(CUdeviceptr dst, const void *src, size_t n)
{
    (void)src;
    record("cuMemcpyHtoD_v2 dst=0x%llx n=%zu", dst, n);
    return 0;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    call_begins();
    CUresult result = cuMemcpyHtoD_v2_body(dst, src, n);
    call_ends();
    return result;
}
static CUresult cuMemcpyDtoH_v2_body(void *dst, CUdeviceptr src, size_t n)
{
    (void)dst;
    record("cuMemcpyDtoH_v2 src=0x%llx n=%zu", src, n);
    return 0;
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    call_begins();
    CUresult result = cuMemcpyDtoH_v2_body(dst, src, n);
    call_ends();
    return result;
}
/* The copies the pager's KIWI_EVICT_COPY makes (and that programs make): recorded with their
 * arguments, nothing copied. (Kept out of RECORDED_WORK, which records names only.) */
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    call_begins();
    record("cuMemcpyDtoHAsync_v2 dst=%p src=0x%llx n=%zu stream=%p", dst, src, n, s);
    call_ends();
    return 0;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    call_begins();
    record("cuMemcpyHtoDAsync_v2 dst=0x%llx src=%p n=%zu stream=%p", dst, src, n, s);
    call_ends();
    return 0;
}
/* Pinned host memory: plain memory here, never touched by the fake's copies.
 * FAKE_CUDA_NO_PINNING=1: it fails, as on a host that cannot pin that much. */
EXPORT CUresult cuMemAllocHost_v2(void **host, size_t size)
{
    if (getenv("FAKE_CUDA_NO_PINNING")) {
        record("cuMemAllocHost_v2 size=%zu refused", size);
        return 2;
    }
    *host = malloc(1); /* the fake never reads or writes it: an address is enough */
    record("cuMemAllocHost_v2 size=%zu host=%p", size, *host);
    return *host ? 0 : 2;
}
EXPORT CUresult cuMemFreeHost(void *host)
{
    record("cuMemFreeHost host=%p", host);
    free(host);
    return 0;
}

static CUresult cuMemsetD8_v2_body(CUdeviceptr dst, unsigned char value, size_t n)
{
    record("cuMemsetD8_v2 dst=0x%llx value=%u n=%zu", dst, value, n);
    return 0;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    call_begins();
    CUresult result = cuMemsetD8_v2_body(dst, value, n);
    call_ends();
    return result;
}

/* The rest of the GPU work the runtimes ask for: each only records its name. Declared without
 * a prototype, as the tests never look at their arguments.
 * X(symbol, base, version, per_thread) as in the shim's hooks.h, and written out rather than
 * taken from there: the fake stands for the driver, and a driver table copied from the shim's
 * would agree with the shim by construction. What the table must hold is checked against
 * NVIDIA's headers and runtimes instead (test_cuda_toolkits.py). */
#define RECORDED_WORK(X)                                                                  \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)               \
    X(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0) \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                                      \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                                  \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)                  \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                                    \
    X(cuMemcpy, "cuMemcpy", 4000, 0)                                                      \
    X(cuMemcpy_ptds, "cuMemcpy", 7000, 1)                                                 \
    X(cuMemcpyAsync, "cuMemcpyAsync", 4000, 0)                                            \
    X(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, 1)                                       \
    X(cuMemcpyPeer, "cuMemcpyPeer", 4000, 0)                                              \
    X(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, 1)                                         \
    X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, 0)                                    \
    X(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, 1)                               \
    X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, 1)                                      \
    X(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, 1)                            \
    X(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, 1)                                      \
    X(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 7000, 1)                            \
    X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, 0)                                           \
    X(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, 1)                                      \
    X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, 0)                                 \
    X(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, 1)                            \
    X(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, 0)                             \
    X(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 7000, 1)                        \
    X(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, 0)                                     \
    X(cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 7000, 1)                                \
    X(cuMemcpy3D_v2, "cuMemcpy3D", 3020, 0)                                               \
    X(cuMemcpy3D_v2_ptds, "cuMemcpy3D", 7000, 1)                                          \
    X(cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020, 0)                                     \
    X(cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 7000, 1)                                \
    X(cuMemcpy3DPeer, "cuMemcpy3DPeer", 4000, 0)                                          \
    X(cuMemcpy3DPeer_ptds, "cuMemcpy3DPeer", 7000, 1)                                     \
    X(cuMemcpy3DPeerAsync, "cuMemcpy3DPeerAsync", 4000, 0)                                \
    X(cuMemcpy3DPeerAsync_ptsz, "cuMemcpy3DPeerAsync", 7000, 1)                           \
    X(cuMemcpyBatchAsync, "cuMemcpyBatchAsync", 12080, 0)                                 \
    X(cuMemcpyBatchAsync_ptsz, "cuMemcpyBatchAsync", 12080, 1)                            \
    X(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync", 13000, 0)                              \
    X(cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000, 1)                         \
    X(cuMemcpy3DBatchAsync, "cuMemcpy3DBatchAsync", 12080, 0)                             \
    X(cuMemcpy3DBatchAsync_ptsz, "cuMemcpy3DBatchAsync", 12080, 1)                        \
    X(cuMemcpy3DBatchAsync_v2, "cuMemcpy3DBatchAsync", 13000, 0)                          \
    X(cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000, 1)                     \
    X(cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", 8000, 1)                             \
    X(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync", 12020, 0)                              \
    X(cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync", 12020, 1)                         \
    X(cuMemPrefetchBatchAsync_ptsz, "cuMemPrefetchBatchAsync", 13000, 1)                  \
    X(cuMemDiscardAndPrefetchBatchAsync, "cuMemDiscardAndPrefetchBatchAsync", 13000, 0)   \
    X(cuMemDiscardAndPrefetchBatchAsync_ptsz, "cuMemDiscardAndPrefetchBatchAsync", 13000, 1) \
    X(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, 1)                                          \
    X(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, 0)                                           \
    X(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, 1)                                      \
    X(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0)                                        \
    X(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, 1)                                   \
    X(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, 0)                                    \
    X(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, 1)                               \
    X(cuLaunch, "cuLaunch", 2000, 0)                                                      \
    X(cuLaunchGrid, "cuLaunchGrid", 2000, 0)                                              \
    X(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0)                                    \
    X(cuMemcpy2D_v2, "cuMemcpy2D", 3020, 0)                                               \
    X(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 7000, 1)                                          \
    X(cuMemcpyDtoA_v2, "cuMemcpyDtoA", 3020, 0)                                           \
    X(cuMemcpyDtoA_v2_ptds, "cuMemcpyDtoA", 7000, 1)                                      \
    X(cuMemcpyAtoD_v2, "cuMemcpyAtoD", 3020, 0)                                           \
    X(cuMemcpyAtoD_v2_ptds, "cuMemcpyAtoD", 7000, 1)                                      \
    X(cuMemcpyHtoA_v2, "cuMemcpyHtoA", 3020, 0)                                           \
    X(cuMemcpyHtoA_v2_ptds, "cuMemcpyHtoA", 7000, 1)                                      \
    X(cuMemcpyAtoH_v2, "cuMemcpyAtoH", 3020, 0)                                           \
    X(cuMemcpyAtoH_v2_ptds, "cuMemcpyAtoH", 7000, 1)                                      \
    X(cuMemcpyAtoA_v2, "cuMemcpyAtoA", 3020, 0)                                           \
    X(cuMemcpyAtoA_v2_ptds, "cuMemcpyAtoA", 7000, 1)                                      \
    X(cuMemcpyHtoAAsync_v2, "cuMemcpyHtoAAsync", 3020, 0)                                 \
    X(cuMemcpyHtoAAsync_v2_ptsz, "cuMemcpyHtoAAsync", 7000, 1)                            \
    X(cuMemcpyAtoHAsync_v2, "cuMemcpyAtoHAsync", 3020, 0)                                 \
    X(cuMemcpyAtoHAsync_v2_ptsz, "cuMemcpyAtoHAsync", 7000, 1)                            \
    X(cuMemcpyWithAttributesAsync, "cuMemcpyWithAttributesAsync", 13020, 0)               \
    X(cuMemcpyWithAttributesAsync_ptsz, "cuMemcpyWithAttributesAsync", 13020, 1)          \
    X(cuMemcpy3DWithAttributesAsync, "cuMemcpy3DWithAttributesAsync", 13020, 0)           \
    X(cuMemcpy3DWithAttributesAsync_ptsz, "cuMemcpy3DWithAttributesAsync", 13020, 1)      \
    X(cuMemsetD16_v2, "cuMemsetD16", 3020, 0)                                             \
    X(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1)                                        \
    X(cuMemsetD32_v2, "cuMemsetD32", 3020, 0)                                             \
    X(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, 1)                                        \
    X(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, 0)                                         \
    X(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, 1)                                    \
    X(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, 0)                                         \
    X(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, 1)                                    \
    X(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0)                                      \
    X(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1)                                 \
    X(cuMemsetD32Async, "cuMemsetD32Async", 3020, 0)                                      \
    X(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, 1)                                 \
    X(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, 0)                                  \
    X(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, 1)                             \
    X(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, 0)                                  \
    X(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, 1)                             \
    X(cuStreamWriteValue32, "cuStreamWriteValue32", 8000, 0)                              \
    X(cuStreamWriteValue32_ptsz, "cuStreamWriteValue32", 8000, 1)                         \
    X(cuStreamWriteValue32_v2, "cuStreamWriteValue32", 11070, 0)                          \
    X(cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", 11070, 1)                     \
    X(cuStreamWriteValue64, "cuStreamWriteValue64", 9000, 0)                              \
    X(cuStreamWriteValue64_ptsz, "cuStreamWriteValue64", 9000, 1)                         \
    X(cuStreamWriteValue64_v2, "cuStreamWriteValue64", 11070, 0)                          \
    X(cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", 11070, 1)                     \
    X(cuStreamWaitValue32, "cuStreamWaitValue32", 8000, 0)                                \
    X(cuStreamWaitValue32_ptsz, "cuStreamWaitValue32", 8000, 1)                           \
    X(cuStreamWaitValue32_v2, "cuStreamWaitValue32", 11070, 0)                            \
    X(cuStreamWaitValue32_v2_ptsz, "cuStreamWaitValue32", 11070, 1)                       \
    X(cuStreamWaitValue64, "cuStreamWaitValue64", 9000, 0)                                \
    X(cuStreamWaitValue64_ptsz, "cuStreamWaitValue64", 9000, 1)                           \
    X(cuStreamWaitValue64_v2, "cuStreamWaitValue64", 11070, 0)                            \
    X(cuStreamWaitValue64_v2_ptsz, "cuStreamWaitValue64", 11070, 1)                       \
    X(cuStreamBatchMemOp, "cuStreamBatchMemOp", 8000, 0)                                  \
    X(cuStreamBatchMemOp_ptsz, "cuStreamBatchMemOp", 8000, 1)                             \
    X(cuStreamBatchMemOp_v2, "cuStreamBatchMemOp", 11070, 0)                              \
    X(cuStreamBatchMemOp_v2_ptsz, "cuStreamBatchMemOp", 11070, 1)

#define DEFINE_RECORDED(symbol, base, version, per_thread) \
    EXPORT CUresult symbol() { record(#symbol); return 0; }
RECORDED_WORK(DEFINE_RECORDED)
#undef DEFINE_RECORDED

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status);

struct entry {
    const char *base;
    int version;
    int per_thread;
    const char *symbol; /* what the address is, for the log */
    void *address;
};
#define ENTRY(base, version, per_thread, function) \
    {base, version, per_thread, #function, (void *)function}

static const struct entry entries[] = {
    ENTRY("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    ENTRY("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
    ENTRY("cuInit", 2000, 0, cuInit),
    ENTRY("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    ENTRY("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    ENTRY("cuDeviceGet", 2000, 0, cuDeviceGet),
    ENTRY("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    ENTRY("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2),
    ENTRY("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    ENTRY("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
    ENTRY("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
    ENTRY("cuCtxDestroy", 2000, 0, cuCtxDestroy),
    ENTRY("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
    ENTRY("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
    ENTRY("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease),
    ENTRY("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
    ENTRY("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset),
    ENTRY("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
    ENTRY("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState),
    ENTRY("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
    ENTRY("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
    ENTRY("cuStreamBeginCapture", 10000, 0, cuStreamBeginCapture),
    ENTRY("cuStreamBeginCapture", 10000, 1, cuStreamBeginCapture_ptsz),
    ENTRY("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2),
    ENTRY("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz),
    ENTRY("cuStreamBeginCaptureToGraph", 12030, 0, cuStreamBeginCaptureToGraph),
    ENTRY("cuStreamEndCapture", 10000, 0, cuStreamEndCapture),
    ENTRY("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz),
    ENTRY("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    ENTRY("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    ENTRY("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    ENTRY("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    ENTRY("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    ENTRY("cuMemFree", 3020, 0, cuMemFree_v2),
    ENTRY("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    ENTRY("cuMemGetInfo", 3020, 0, internal_mem_get_info),
    ENTRY("cuMemCreate", 10020, 0, cuMemCreate),
    ENTRY("cuMemPoolCreate", 11020, 0, cuMemPoolCreate),
    ENTRY("cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo),
    ENTRY("cuDeviceGetMemPool", 11020, 0, cuDeviceGetMemPool),
    ENTRY("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
    ENTRY("cuMemRelease", 10020, 0, cuMemRelease),
    ENTRY("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    ENTRY("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    ENTRY("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    ENTRY("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    ENTRY("cuGraphLaunch", 10000, 0, cuGraphLaunch),
    ENTRY("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2),
    ENTRY("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2),
    ENTRY("cuMemsetD8", 3020, 0, cuMemsetD8_v2),
    ENTRY("cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2),
    ENTRY("cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2),
    ENTRY("cuMemPrefetchAsync", 8000, 0, cuMemPrefetchAsync),
    ENTRY("cuMemPrefetchBatchAsync", 13000, 0, cuMemPrefetchBatchAsync),
    ENTRY("cuCheckpointProcessLock", 12080, 0, cuCheckpointProcessLock),
    ENTRY("cuCheckpointProcessCheckpoint", 12080, 0, cuCheckpointProcessCheckpoint),
    ENTRY("cuCheckpointProcessRestore", 12080, 0, cuCheckpointProcessRestore),
    ENTRY("cuCheckpointProcessUnlock", 12080, 0, cuCheckpointProcessUnlock),
    ENTRY("cuCheckpointProcessGetState", 12080, 0, cuCheckpointProcessGetState),
#define RECORDED_ENTRY(symbol, base, version, per_thread) ENTRY(base, version, per_thread, symbol),
    RECORDED_WORK(RECORDED_ENTRY)
#undef RECORDED_ENTRY
};

/* FAKE_CUDA_HIDDEN_ENTRY_POINTS=1: answer for memory and GPU work with addresses that no
 * exported symbol has, as a driver handing out internal entry points would, so that the shim
 * must hook every one by name. They are never called: only the real runtime's start-up, which
 * fails against this fake before any GPU work, is run so. */
static const char hidden_addresses[sizeof entries / sizeof entries[0]];

static bool hidden(const struct entry *e)
{
    return getenv("FAKE_CUDA_HIDDEN_ENTRY_POINTS") &&
           (strncmp(e->base, "cuMem", 5) == 0 || strncmp(e->base, "cuLaunch", 8) == 0 ||
            strcmp(e->base, "cuGraphLaunch") == 0);
}

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    int per_thread = (flags & 2) != 0;
    const struct entry *best = NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->base, symbol) != 0 || e->version > version)
            continue;
        if (getenv("FAKE_CUDA_NO_CHECKPOINT") && strncmp(symbol, "cuCheckpoint", 12) == 0)
            continue; /* a driver before r570 */
        if (e->per_thread && !per_thread)
            continue;
        /* The newest variant; between equals, the per-thread one for a per-thread caller. */
        if (!best || e->version > best->version ||
            (e->version == best->version && e->per_thread > best->per_thread))
            best = e;
    }
    record("cuGetProcAddress symbol=%s version=%d flags=%llu found=%d answer=%s", symbol, version,
           flags, best != NULL, best ? best->symbol : "-");
    if (!best) {
        *pfn = NULL;
        return 500; /* CUDA_ERROR_NOT_FOUND */
    }
    *pfn = hidden(best) ? (void *)&hidden_addresses[best - entries] : best->address;
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

__attribute__((constructor)) static void fake_cuda_loaded(void)
{
    own_state = map_state((int)getpid(), true);
    if (own_state && getenv("FAKE_CUDA_CHECKPOINT_FAIL"))
        atomic_store(&own_state->uses_uvm, 1);
    record("loaded");
}
