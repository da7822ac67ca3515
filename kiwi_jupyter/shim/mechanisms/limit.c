/* The memory limit: what this process may allocate on its GPU, and the room there is, reserved
 * against before the driver is asked for an allocation.
 */
#define _GNU_SOURCE
#include "memory.h"

static _Atomic uint64_t device_total; /* cached cuDeviceTotalMem of the first device seen */

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

/* Under kiwi_table_lock: does size fit in the room now? Says the room and what is in use. */
static bool fits_now(size_t size, uint64_t *limit, uint64_t *used)
{
    *limit = kiwi_memory_room();
    *used = kiwi_managed_bytes + kiwi_vmm_bytes + kiwi_mapped_bytes;
    return !*limit || (*used <= *limit && size <= *limit - *used);
}

/* An allocation refused for good: this process's working set would be larger than what it
 * may have of the GPU, whatever any other process moves. Said on stderr, at most once every
 * few seconds (a framework that frees its cache and tries again fails twice). */
static void say_refused(size_t size, uint64_t used, uint64_t limit)
{
    static _Atomic double said_at;
    double now = kiwi_now(), last = atomic_load(&said_at);
    bool say = now - last >= 5.0 && atomic_compare_exchange_strong(&said_at, &last, now);
    const char *what = kiwi_cfg.memory_limit && limit == kiwi_cfg.memory_limit
                           ? "KIWI_GPU_MEMORY_LIMIT"
                           : "the GPU's memory, less what other processes keep there for good";
    if (say)
        kiwi_warn("an allocation of %zu bytes fails: this process would have %llu bytes on the "
                  "GPU, more than the %llu it may have (%s); no eviction makes that room", size,
                  (unsigned long long)(used + size), (unsigned long long)limit, what);
    else
        kiwi_log("allocation of %zu bytes refused: %llu of %llu in use", size,
                 (unsigned long long)used, (unsigned long long)limit);
}

/* Reserves size bytes against the limit before the driver is asked, so that two threads
 * allocating at once cannot both squeeze under it. */
bool kiwi_memory_reserve(size_t size, enum allocation_kind kind, CUdevice device)
{
    gpu_total(device);
    pthread_mutex_lock(&kiwi_table_lock);
    uint64_t limit, used;
    bool fits = fits_now(size, &limit, &used);
    if (!fits && limit < kiwi_memory_limit()) {
        pthread_mutex_unlock(&kiwi_table_lock);
        learn_again();
        pthread_mutex_lock(&kiwi_table_lock);
        fits = fits_now(size, &limit, &used);
    }
    if (fits)
        *kiwi_bytes_of(kind) += size;
    pthread_mutex_unlock(&kiwi_table_lock);
    if (!fits)
        say_refused(size, used, limit);
    return fits;
}

void kiwi_memory_unreserve(size_t size, enum allocation_kind kind)
{
    pthread_mutex_lock(&kiwi_table_lock);
    *kiwi_bytes_of(kind) -= size;
    pthread_mutex_unlock(&kiwi_table_lock);
    if (kind == MAPPED) /* a region let go, maybe long after its free (stream-ordered) */
        kiwi_news_post(KIWI_NEWS_WORKING_SET);
}
