/* GPU memory: allocations become managed memory, and every one is counted.
 *
 * Managed memory (cuMemAllocManaged) is what lets each process see the whole GPU and still be
 * paged out: its pages can live on the GPU or in host memory, and the pager moves them with
 * prefetches when the GPU changes hands. A device pointer to managed memory works everywhere a
 * device pointer does, so the process cannot tell the difference.
 *
 * The table of allocations is the working set the shim reports to the daemon (so that the
 * daemon knows whether two holders fit side by side) and the list of ranges the pager moves.
 * VMM allocations (cuMemCreate) cannot be converted: they are counted, and reported as not
 * evictable.
 *
 * Under the checkpoint evictor (evict.c) nothing is converted: allocations stay device memory,
 * counted all the same, and each waits at the gate, since it takes room on a GPU that another
 * holder may be using (and a checkpointed process's driver calls would block in the driver,
 * where no grant could reach them).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* MANAGED can be paged out; VMM (cuMemCreate) and DEVICE (plain device memory, where managed
 * memory was refused) cannot. */
enum allocation_kind { MANAGED, VMM, DEVICE };

struct allocation {
    struct allocation *next;
    uint64_t key; /* device pointer, or VMM handle */
    size_t size;
    enum allocation_kind kind;
    bool freeing; /* a free of it is in progress: the pager leaves it alone */
    bool pooled;  /* from a managed memory pool (pool.c): freed in stream order */
    CUcontext ctx;
    CUdevice device;
};

#define BUCKETS 4096

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
/* Frees hold it shared, the pager exclusively while it moves the working set: so no prefetch
 * is ever issued for an address being freed, or freed and handed out again. The table lock
 * itself is not held while prefetching, so allocations and statistics never wait for paging.
 * Writers first, so a stream of frees cannot hold an eviction off. */
static pthread_rwlock_t paging_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static struct allocation *table[BUCKETS];
static uint64_t managed_bytes, vmm_bytes, allocation_count; /* vmm_bytes: VMM and DEVICE */
/* Moves whenever a record is added or removed: what was said of the table's addresses before
 * (the free ranges of free_ranges.c) holds only while it has not moved. */
static uint64_t generation;
/* Frees of managed memory made while their stream was captured into a graph (see FREE_ASYNC). */
#define MAX_DEFERRED 1024
static CUdeviceptr deferred[MAX_DEFERRED];
static size_t deferred_count;
static _Atomic uint64_t device_total; /* cached cuDeviceTotalMem of the first device seen */

static size_t bucket(uint64_t key, enum allocation_kind kind)
{
    uint64_t h = (key ^ (uint64_t)kind) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 52) % BUCKETS;
}

/* ---- limit ---------------------------------------------------------------------------- */

static uint64_t gpu_total(CUdevice device)
{
    if (device_total)
        return device_total;
    typedef CUresult (*total_fn)(size_t *, CUdevice);
    total_fn total = (total_fn)kiwi_driver_sym("cuDeviceTotalMem_v2");
    size_t bytes = 0;
    if (total && device >= 0 && total(&bytes, device) == CUDA_SUCCESS)
        device_total = bytes;
    return device_total;
}

uint64_t kiwi_memory_limit(void)
{
    uint64_t total = device_total;
    uint64_t limit = kiwi_cfg.memory_limit;
    if (limit && (!total || limit < total))
        return limit;
    return total;
}

/* Memory on the GPU that no eviction frees: other processes' contexts and memory the shim could
 * not convert (theirs and this process's), and this process's own context. Learnt from the
 * driver while this process holds the GPU, when every other holder's managed memory is out. */
static _Atomic uint64_t pinned;

void kiwi_memory_learn(uint64_t real_total, uint64_t real_free)
{
    if (!device_total)
        device_total = real_total;
    if (real_free > real_total)
        return;
    struct kiwi_working_set own;
    kiwi_memory_working_set(&own);
    uint64_t in_use = real_total - real_free;
    uint64_t measured = in_use > own.bytes ? in_use - own.bytes : 0;
    /* While another holds the GPU its managed memory is on the card too, so a figure taken
     * then is too high: it may only lower the one learnt while holding (a co-holder that has
     * since left, say). */
    if (kiwi_gate_is_open() || measured < atomic_load(&pinned))
        atomic_store(&pinned, measured);
}

/* Asks the driver again (from the allocating thread, which has a context current), before an
 * allocation is refused for want of room: what was pinned may have gone since. */
static void learn_again(void)
{
    typedef CUresult (*info_fn)(size_t *, size_t *);
    info_fn info = (info_fn)kiwi_real(HOOK_cuMemGetInfo_v2);
    size_t real_free = 0, real_total = 0;
    if (info && info(&real_free, &real_total) == CUDA_SUCCESS)
        kiwi_memory_learn(real_total, real_free);
}

uint64_t kiwi_memory_room(void)
{
    uint64_t limit = kiwi_memory_limit(), total = device_total, held = atomic_load(&pinned);
    if (!total || !held)
        return limit;
    uint64_t room = held < total ? total - held : 0;
    return limit && limit < room ? limit : room;
}

/* Reserves size bytes against the limit before the driver is asked, so that two threads
 * allocating at once cannot both squeeze under it. */
static bool reserve(size_t size, enum allocation_kind kind, CUdevice device)
{
    gpu_total(device);
    pthread_mutex_lock(&table_lock);
    uint64_t limit = kiwi_memory_room();
    uint64_t used = managed_bytes + vmm_bytes;
    bool fits = !limit || (used <= limit && size <= limit - used);
    if (!fits && limit < kiwi_memory_limit()) {
        pthread_mutex_unlock(&table_lock);
        learn_again();
        pthread_mutex_lock(&table_lock);
        limit = kiwi_memory_room();
        used = managed_bytes + vmm_bytes;
        fits = !limit || (used <= limit && size <= limit - used);
    }
    if (fits) {
        if (kind == MANAGED)
            managed_bytes += size;
        else
            vmm_bytes += size;
    }
    pthread_mutex_unlock(&table_lock);
    if (!fits)
        kiwi_log("allocation of %zu bytes refused: %llu of %llu in use", size,
                 (unsigned long long)used, (unsigned long long)limit);
    return fits;
}

static void unreserve(size_t size, enum allocation_kind kind)
{
    pthread_mutex_lock(&table_lock);
    if (kind == MANAGED)
        managed_bytes -= size;
    else
        vmm_bytes -= size;
    pthread_mutex_unlock(&table_lock);
}

static bool capture_error(CUresult result)
{
    return result >= 900 && result <= 908; /* CUDA_ERROR_STREAM_CAPTURE_* */
}

/* ---- table ---------------------------------------------------------------------------- */

static void track_record(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                         CUdevice device, bool pooled)
{
    struct allocation *a = malloc(sizeof *a);
    if (!a) {
        /* The allocation still works; it is only missing from the pager's list. */
        kiwi_warn("out of host memory tracking an allocation of %zu bytes", size);
        return;
    }
    *a = (struct allocation){.key = key, .size = size, .kind = kind, .ctx = ctx,
                             .device = device, .pooled = pooled};
    pthread_mutex_lock(&table_lock);
    size_t b = bucket(key, kind);
    a->next = table[b];
    table[b] = a;
    allocation_count++;
    generation++;
    pthread_mutex_unlock(&table_lock);
    kiwi_comm_working_set_changed();
}

static void track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                  CUdevice device)
{
    track_record(key, size, kind, ctx, device, false);
}

/* Under table_lock: the record of an allocation not already being freed, or NULL. */
static struct allocation *find(uint64_t key, enum allocation_kind kind)
{
    for (struct allocation *a = table[bucket(key, kind)]; a; a = a->next)
        if (a->key == key && a->kind == kind && !a->freeing)
            return a;
    return NULL;
}

/* Under table_lock: removes this very record (not merely one with its key: once the driver
 * has freed an address, another thread may be handed it again and track it anew). */
static void remove_record(struct allocation *gone)
{
    for (struct allocation **p = &table[bucket(gone->key, gone->kind)]; *p; p = &(*p)->next) {
        if (*p != gone)
            continue;
        *p = gone->next;
        if (gone->kind == MANAGED)
            managed_bytes -= gone->size;
        else
            vmm_bytes -= gone->size;
        allocation_count--;
        generation++;
        free(gone);
        return;
    }
}

/* The first half of a free: marks the record of key (of the first kind that has one) as being
 * freed and returns it, or NULL when the shim never saw the allocation. */
static struct allocation *begin_free(uint64_t key, enum allocation_kind kind,
                                     enum allocation_kind or_kind)
{
    pthread_mutex_lock(&table_lock);
    struct allocation *a = find(key, kind);
    if (!a)
        a = find(key, or_kind);
    if (a)
        a->freeing = true;
    pthread_mutex_unlock(&table_lock);
    return a;
}

/* The second half: forgets the record once the driver has freed it, keeps it otherwise. */
static void end_free(struct allocation *a, CUresult result)
{
    if (!a)
        return;
    pthread_mutex_lock(&table_lock);
    if (result == CUDA_SUCCESS)
        remove_record(a);
    else
        a->freeing = false;
    pthread_mutex_unlock(&table_lock);
    if (result == CUDA_SUCCESS)
        kiwi_comm_working_set_changed();
}

void kiwi_memory_working_set(struct kiwi_working_set *out)
{
    pthread_mutex_lock(&table_lock);
    out->bytes = managed_bytes + vmm_bytes;
    out->evictable = managed_bytes;
    out->allocations = allocation_count;
    pthread_mutex_unlock(&table_lock);
}

/* Under table_lock: a copy of the managed allocations not being freed (NULL when none, or
 * out of host memory). */
static size_t copy_managed(struct kiwi_range **ranges)
{
    size_t count = 0, capacity = allocation_count;
    struct kiwi_range *copy = capacity ? malloc(capacity * sizeof *copy) : NULL;
    for (size_t b = 0; copy && b < BUCKETS; b++)
        for (struct allocation *a = table[b]; a; a = a->next)
            if (a->kind == MANAGED && !a->freeing && count < capacity)
                copy[count++] = (struct kiwi_range){(CUdeviceptr)a->key, a->size, a->ctx,
                                                    a->device};
    if (capacity && !copy)
        kiwi_warn("out of host memory listing the working set; it moves on demand instead");
    *ranges = copy;
    return copy ? count : 0;
}

size_t kiwi_memory_paging_begin(struct kiwi_range **ranges)
{
    pthread_rwlock_wrlock(&paging_lock);
    pthread_mutex_lock(&table_lock);
    size_t count = copy_managed(ranges);
    pthread_mutex_unlock(&table_lock);
    return count;
}

size_t kiwi_memory_managed(struct kiwi_range **ranges, uint64_t *table_generation)
{
    pthread_mutex_lock(&table_lock);
    size_t count = copy_managed(ranges);
    *table_generation = generation;
    pthread_mutex_unlock(&table_lock);
    return count;
}

uint64_t kiwi_memory_generation(void)
{
    pthread_mutex_lock(&table_lock);
    uint64_t now = generation;
    pthread_mutex_unlock(&table_lock);
    return now;
}

void kiwi_memory_paging_end(struct kiwi_range *ranges)
{
    free(ranges);
    pthread_rwlock_unlock(&paging_lock);
}

void kiwi_memory_free_begin(void)
{
    pthread_rwlock_rdlock(&paging_lock);
}

void kiwi_memory_free_end(void)
{
    pthread_rwlock_unlock(&paging_lock);
}

uint64_t kiwi_memory_forget_context(CUcontext ctx)
{
    uint64_t bytes = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t b = 0; b < BUCKETS; b++) {
        struct allocation **p = &table[b];
        while (*p) {
            struct allocation *a = *p;
            if (a->ctx != ctx) {
                p = &a->next;
                continue;
            }
            bytes += a->size;
            remove_record(a); /* unlinks *p, so p now points at the next one */
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (bytes)
        kiwi_comm_working_set_changed();
    return bytes;
}

void kiwi_memory_after_fork(void)
{
    /* A forked child cannot use its parent's CUDA context, so it owns none of these. */
    pthread_mutex_init(&table_lock, NULL);
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    paging_lock = fresh;
    for (size_t b = 0; b < BUCKETS; b++) {
        while (table[b]) {
            struct allocation *a = table[b];
            table[b] = a->next;
            free(a);
        }
    }
    managed_bytes = vmm_bytes = allocation_count = 0;
    generation++;
    deferred_count = 0;
}

/* ---- allocation ----------------------------------------------------------------------- */

typedef CUresult (*alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);

/* Whether device allocations become managed memory: the one switch for how this process's
 * memory is paged. Never with the shim off; not under the checkpoint evictor either, where
 * allocations stay device memory (allocate_device) and the daemon moves them from outside. */
static bool converting(void)
{
    return kiwi_cfg.enabled && kiwi_evict_converts();
}

/* Allocates size bytes of plain device memory, counted (not evictable by the shim). */
static CUresult allocate_device(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device)
{
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    alloc_fn device_alloc = (alloc_fn)kiwi_real(HOOK_cuMemAlloc_v2);
    if (!device_alloc)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!reserve(size, DEVICE, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    bool gated = kiwi_evict_checkpointing();
    CUresult result = gated ? kiwi_gate_enter() : CUDA_SUCCESS;
    if (result == CUDA_SUCCESS) {
        result = device_alloc(dptr, size);
        if (gated)
            kiwi_gate_exit();
    }
    if (result != CUDA_SUCCESS) {
        unreserve(size, DEVICE);
        return result;
    }
    track(*dptr, size, DEVICE, ctx, device);
    return CUDA_SUCCESS;
}

/* Allocates size bytes of managed memory in place of device memory, within the limit; or,
 * under the checkpoint evictor, device memory as asked. */
static CUresult allocate_managed(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    alloc_managed_fn real = (alloc_managed_fn)kiwi_real(HOOK_cuMemAllocManaged);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    if (!kiwi_evict_converts())
        return allocate_device(dptr, size, ctx, device);
    if (!reserve(size, MANAGED, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(dptr, size, flags);
    if (capture_error(result)) {
        /* The driver refuses managed memory while a graph is being captured: give the caller
         * device memory, counted but not evictable, rather than fail its allocation. */
        unreserve(size, MANAGED);
        CUresult fallback = allocate_device(dptr, size, ctx, device);
        if (fallback == CUDA_SUCCESS)
            kiwi_log("device allocation of %zu bytes during graph capture", size);
        return fallback == CUDA_ERROR_OUT_OF_MEMORY ? result : fallback;
    }
    if (result != CUDA_SUCCESS) {
        unreserve(size, MANAGED);
        return result;
    }
    track(*dptr, size, MANAGED, ctx, device);
    kiwi_log("managed allocation of %zu bytes at 0x%llx", size, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

KIWI_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    kiwi_init();
    if (!kiwi_cfg.enabled) {
        KIWI_REAL(real, cuMemAllocManaged);
        return real(dptr, size, flags);
    }
    return allocate_managed(dptr, size, flags);
}

KIWI_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    kiwi_init();
    if (!kiwi_cfg.enabled) {
        KIWI_REAL(real, cuMemAlloc_v2);
        return real(dptr, size);
    }
    return allocate_managed(dptr, size, CU_MEM_ATTACH_GLOBAL);
}

/* The driver pads pitched rows for texture hardware; 512 bytes satisfies every GPU's
 * CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT. */
#define PITCH_ALIGNMENT 512

KIWI_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int element_size)
{
    kiwi_init();
    if (!kiwi_cfg.enabled) {
        KIWI_REAL(real, cuMemAllocPitch_v2);
        return real(dptr, pitch, width, height, element_size);
    }
    if (!dptr || !pitch || !width || !height ||
        (element_size != 4 && element_size != 8 && element_size != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (height > SIZE_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = allocate_managed(dptr, row * height, CU_MEM_ATTACH_GLOBAL);
    if (result == CUDA_SUCCESS)
        *pitch = row;
    return result;
}

/* Stream-ordered allocations: managed memory is usable at once, which is at least as early as
 * the stream would have made it usable, so the stream is not needed to allocate.
 *
 * Except while the stream is being captured into a CUDA graph: then the allocation must become
 * a node of the graph (it happens again at each replay), so it goes to the driver unchanged
 * and stays out of the table. (PyTorch's cudaMallocAsync backend does this under CUDA graphs.)
 */
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static bool capturing(CUstream stream)
{
    typedef CUresult (*is_capturing_fn)(CUstream, int *);
    static _Atomic(is_capturing_fn) is_capturing;
    is_capturing_fn fn = atomic_load(&is_capturing);
    if (!fn) {
        fn = (is_capturing_fn)kiwi_driver_sym("cuStreamIsCapturing");
        atomic_store(&is_capturing, fn);
    }
    int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    return fn && fn(stream, &status) == CUDA_SUCCESS && status != 0;
}

/* A stream-ordered allocation from the device's managed pool (pool.c), where the driver has
 * managed pools: it stays stream-ordered, and so does its free. False when there is none. */
static bool allocate_pooled(CUdeviceptr *dptr, size_t size, CUstream s, CUresult *result)
{
    alloc_pool_fn real = (alloc_pool_fn)kiwi_real(HOOK_cuMemAllocFromPoolAsync);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    CUmemoryPool pool = real ? kiwi_pool_of(device) : NULL;
    if (!pool)
        return false;
    *result = CUDA_ERROR_OUT_OF_MEMORY;
    if (!reserve(size, MANAGED, device))
        return true;
    *result = real(dptr, size, pool, s);
    if (*result != CUDA_SUCCESS) {
        unreserve(size, MANAGED);
        return true;
    }
    track_record(*dptr, size, MANAGED, ctx, device, true);
    return true;
}

#define ALLOC_ASYNC(symbol, per_thread)                                        \
    KIWI_EXPORT CUresult symbol(CUdeviceptr *dptr, size_t size, CUstream s)    \
    {                                                                          \
        kiwi_init();                                                           \
        if (!kiwi_cfg.enabled || capturing(kiwi_stream(s, per_thread))) {      \
            KIWI_REAL(real, symbol);                                           \
            return real(dptr, size, s);                                        \
        }                                                                      \
        CUresult pooled;                                                       \
        if (converting() &&                                                    \
            allocate_pooled(dptr, size, kiwi_stream(s, per_thread), &pooled))  \
            return pooled;                                                     \
        return allocate_managed(dptr, size, CU_MEM_ATTACH_GLOBAL);             \
    }
#define ALLOC_FROM_POOL(symbol, per_thread)                                               \
    KIWI_EXPORT CUresult symbol(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,        \
                                CUstream s)                                               \
    {                                                                                     \
        kiwi_init();                                                                      \
        if (!kiwi_cfg.enabled || capturing(kiwi_stream(s, per_thread))) {                 \
            KIWI_REAL(real, symbol);                                                      \
            return real(dptr, size, pool, s);                                             \
        }                                                                                 \
        /* From the device's managed pool, whichever pool was named: another pool's     \
         * memory could not be paged out. */                                              \
        CUresult pooled;                                                                  \
        if (converting() &&                                                               \
            allocate_pooled(dptr, size, kiwi_stream(s, per_thread), &pooled))             \
            return pooled;                                                                \
        return allocate_managed(dptr, size, CU_MEM_ATTACH_GLOBAL);                        \
    }

ALLOC_ASYNC(cuMemAllocAsync, false)
ALLOC_ASYNC(cuMemAllocAsync_ptsz, true)
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync, false)
ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz, true)

typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

KIWI_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    KIWI_REAL(real, cuMemFree_v2);
    pthread_rwlock_rdlock(&paging_lock);
    struct allocation *a = begin_free(dptr, MANAGED, DEVICE);
    CUresult result = real(dptr);
    end_free(a, result);
    pthread_rwlock_unlock(&paging_lock);
    return result;
}

/* A stream-ordered free of memory the shim made managed: the stream's earlier work may still
 * use it, so wait for the stream, then free at once. (The cost is one stream synchronization
 * per free; PyTorch's and CuPy's caching allocators free rarely.) A stream being captured
 * cannot be waited for; the free then waits for the next release, which synchronizes
 * everything anyway. */
static CUresult free_managed_after(CUdeviceptr dptr, CUstream s, bool *deferred_free)
{
    *deferred_free = false;
    free_fn free_now = (free_fn)kiwi_real(HOOK_cuMemFree_v2);
    if (!free_now)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (capturing(s)) {
        /* Still allocated, so still tracked, until the deferred free (for which it must be
         * found again: see kiwi_memory_free_deferred). */
        pthread_mutex_lock(&table_lock);
        bool kept = deferred_count < MAX_DEFERRED;
        if (kept)
            deferred[deferred_count++] = dptr;
        pthread_mutex_unlock(&table_lock);
        *deferred_free = kept;
        if (kept)
            return CUDA_SUCCESS;
        kiwi_warn("too many frees during graph capture; freeing 0x%llx at once",
                  (unsigned long long)dptr);
        return free_now(dptr);
    }
    typedef CUresult (*sync_fn)(CUstream);
    sync_fn sync = (sync_fn)kiwi_driver_sym("cuStreamSynchronize");
    CUresult result = sync ? sync(s) : CUDA_ERROR_NOT_INITIALIZED;
    return result == CUDA_SUCCESS ? free_now(dptr) : result;
}

void kiwi_memory_free_deferred(void)
{
    free_fn free_now = (free_fn)kiwi_real(HOOK_cuMemFree_v2);
    pthread_mutex_lock(&table_lock);
    size_t count = deferred_count;
    CUdeviceptr pending[MAX_DEFERRED];
    memcpy(pending, deferred, count * sizeof pending[0]);
    deferred_count = 0;
    pthread_mutex_unlock(&table_lock);
    pthread_rwlock_rdlock(&paging_lock);
    for (size_t i = 0; i < count && free_now; i++) {
        struct allocation *a = begin_free(pending[i], MANAGED, MANAGED);
        if (a) /* else its context went, and the address may belong to someone else now */
            end_free(a, free_now(pending[i]));
    }
    pthread_rwlock_unlock(&paging_lock);
}

static CUresult free_async(free_async_fn real, CUdeviceptr dptr, CUstream s, bool per_thread)
{
    pthread_rwlock_rdlock(&paging_lock);
    struct allocation *a = begin_free(dptr, MANAGED, DEVICE);
    CUresult result;
    if (!a || a->pooled) {
        /* the driver's own (graph capture), never seen, or from a managed pool: all freed in
         * stream order by the driver */
        result = real(dptr, s);
        end_free(a, result);
    } else {
        bool deferred_free;
        result = free_managed_after(dptr, kiwi_stream(s, per_thread), &deferred_free);
        /* A deferred free keeps the record until it is done (kiwi_memory_free_deferred). */
        end_free(a, deferred_free ? CUDA_ERROR_NOT_READY : result);
    }
    pthread_rwlock_unlock(&paging_lock);
    return result;
}

#define FREE_ASYNC(symbol, per_thread)                                                   \
    KIWI_EXPORT CUresult symbol(CUdeviceptr dptr, CUstream s)                            \
    {                                                                                    \
        KIWI_REAL(real, symbol);                                                         \
        return free_async(real, dptr, s, per_thread);                                    \
    }

FREE_ASYNC(cuMemFreeAsync, false)
FREE_ASYNC(cuMemFreeAsync_ptsz, true)

KIWI_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    KIWI_REAL(real, cuMemCreate);
    if (!kiwi_cfg.enabled)
        return real(handle, size, prop, flags);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    if (!reserve(size, VMM, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(handle, size, prop, flags);
    if (result != CUDA_SUCCESS) {
        unreserve(size, VMM);
        return result;
    }
    track(*handle, size, VMM, ctx, device);
    return CUDA_SUCCESS;
}

KIWI_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    KIWI_REAL(real, cuMemRelease);
    struct allocation *a = begin_free(handle, VMM, VMM);
    CUresult result = real(handle);
    end_free(a, result);
    return result;
}
