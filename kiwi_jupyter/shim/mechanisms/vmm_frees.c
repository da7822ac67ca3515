/* Frees of the memory the vmm evictor maps. A free waits for the GPU first: work queued before
 * it may still use the memory, and an unmap under a running kernel is an illegal address
 * (cudaFree synchronizes for the same reason). A stream-ordered free records an event on its
 * stream instead, and its memory is pending: reclaimed once the event has completed, at later
 * allocations, frees and evictions (or taken back by its stream's next allocation,
 * vmm_reuse.c). While a graph capture is open nothing can be waited for (a synchronization would
 * invalidate the capture), and the memory is pending until the next release, which
 * synchronizes everything.
 */
#define _GNU_SOURCE
#include "vmm.h"

/* A free asks whether the pending frees are done once this much more has been freed since it
 * last asked (an allocation that finds no memory asks every time). */
#define PENDING_ASK_BYTES ((uint64_t)256 << 20)

static struct vmm_allocation *pending_first, *pending_last;
/* Bytes freed and pending; and what they were when their events were last asked about. */
static uint64_t pending_bytes, pending_when_asked;

/* The list of pending frees, in the order they were made (doubly linked: stream-ordered reuse
 * takes one out of the middle). */
static void pend(struct vmm_allocation *a)
{
    a->next = NULL;
    a->prev = pending_last;
    if (pending_last)
        pending_last->next = a;
    else
        pending_first = a;
    pending_last = a;
    pending_bytes += a->size;
}

void kiwi_vmm_unpend(struct vmm_allocation *a)
{
    if (a->prev)
        a->prev->next = a->next;
    else
        pending_first = a->next;
    if (a->next)
        a->next->prev = a->prev;
    else
        pending_last = a->prev;
    a->next = a->prev = NULL;
    kiwi_vmm_reuse_unfile(a);
    pending_bytes -= a->size;
}

void kiwi_vmm_reclaim(bool synchronized)
{
    bool in_order = true; /* events complete in order: stop at the first that has not */
    pending_when_asked = pending_bytes;
    for (struct vmm_allocation *a = pending_first, *next; a; a = next) {
        next = a->next;
        bool done;
        if (a->event)
            done = synchronized ||
                   (in_order && kiwi_vmm_driver.event_query(a->event) == CUDA_SUCCESS);
        else
            done = synchronized;
        if (!done) {
            in_order = in_order && !a->event;
            continue;
        }
        kiwi_vmm_unpend(a);
        if (a->event)
            kiwi_vmm_event_give(a->event_ctx, a->event);
        kiwi_vmm_count_in_pool(a->pool, 0, -(int64_t)a->size);
        kiwi_vmm_release(a);
    }
    pending_when_asked = pending_bytes;
}

bool kiwi_vmm_pending(void)
{
    return pending_first != NULL;
}

void kiwi_vmm_pending_finish(void)
{
    for (struct vmm_allocation *a = pending_first; a; a = a->next)
        if (a->event)
            kiwi_vmm_driver.event_synchronize(a->event);
    kiwi_vmm_reclaim(false);
}

/* The placement of the allocation being freed, taken off its record; or NULL. */
static struct vmm_allocation *take_locked(struct allocation *record)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = kiwi_memory_unplace(record);
    if (!a)
        pthread_mutex_unlock(&kiwi_vmm_lock);
    return a; /* locked when found */
}

/* Waits for the work queued in ctx (made current meanwhile, when it is not). */
static CUresult synchronize(CUcontext ctx)
{
    CUcontext current = NULL;
    kiwi_pager_driver.ctx_get(&current);
    if (ctx && current != ctx && kiwi_pager_driver.ctx_set(ctx) != CUDA_SUCCESS)
        return kiwi_pager_driver.ctx_sync(); /* gone: what runs is in the current one */
    CUresult result = kiwi_pager_driver.ctx_sync();
    if (ctx && current != ctx)
        kiwi_pager_driver.ctx_set(current);
    return result;
}

CUresult kiwi_vmm_free(struct allocation *record)
{
    CUdeviceptr ptr = (CUdeviceptr)record->key;
    bool capturing = kiwi_capture_open() > 0;
    if (!capturing) {
        CUresult result = synchronize(record->ctx);
        if (result != CUDA_SUCCESS) {
            kiwi_memory_end_free(record, result);
            return result;
        }
    }
    struct vmm_allocation *a = take_locked(record);
    if (!a) { /* its record has no placement: its context went meanwhile */
        kiwi_memory_end_free(record, CUDA_SUCCESS);
        return CUDA_SUCCESS;
    }
    kiwi_vmm_count_in_pool(a->pool, -(int64_t)a->size, capturing ? 0 : -(int64_t)a->size);
    if (capturing) {
        pend(a); /* no event: freed after the next release's synchronization */
        kiwi_log("free of 0x%llx during graph capture: done at the next release",
                 (unsigned long long)ptr);
    } else {
        kiwi_vmm_release(a);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_memory_end_free(record, CUDA_SUCCESS);
    return CUDA_SUCCESS;
}

CUresult kiwi_vmm_free_async(struct allocation *record, CUstream stream, bool capturing)
{
    CUcontext ctx = NULL;
    kiwi_pager_driver.ctx_get(&ctx);
    struct vmm_allocation *a = take_locked(record);
    if (!a) {
        kiwi_memory_end_free(record, CUDA_SUCCESS);
        return CUDA_SUCCESS;
    }
    CUevent event = NULL;
    if (!capturing) {
        event = kiwi_vmm_event_take(ctx);
        if (event && kiwi_vmm_driver.event_record(event, stream) != CUDA_SUCCESS) {
            kiwi_vmm_event_give(ctx, event);
            event = NULL;
        }
    }
    kiwi_vmm_count_in_pool(a->pool, -(int64_t)a->size, 0);
    CUresult result = CUDA_SUCCESS;
    if (event || capturing) {
        a->event = event;
        a->event_ctx = ctx;
        a->freed_on = kiwi_vmm_stream(ctx, stream);
        pend(a);
        if (event)
            kiwi_vmm_reuse_file(a); /* its stream's next allocation may have it at once */
        if (pending_bytes > pending_when_asked + PENDING_ASK_BYTES)
            kiwi_vmm_reclaim(false);
    } else {
        /* No event to wait on: wait for the stream itself (with the lock let go). */
        pthread_mutex_unlock(&kiwi_vmm_lock);
        result = kiwi_pager_driver.stream_sync(stream);
        pthread_mutex_lock(&kiwi_vmm_lock);
        if (result == CUDA_SUCCESS) {
            kiwi_vmm_count_in_pool(a->pool, 0, -(int64_t)a->size);
            kiwi_vmm_release(a);
        } else if (kiwi_memory_replace(record, a)) {
            kiwi_vmm_count_in_pool(a->pool, (int64_t)a->size, 0);
        } else { /* its record went with its context meanwhile: so does the memory */
            kiwi_vmm_count_in_pool(a->pool, 0, -(int64_t)a->size);
            kiwi_vmm_release(a);
        }
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_memory_end_free(record, result);
    return result;
}

void kiwi_vmm_free_deferred(void)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    kiwi_vmm_reclaim(true);
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_pending_forget(CUcontext ctx)
{
    for (struct vmm_allocation *a = pending_first, *next; a; a = next) {
        next = a->next;
        if (a->region->ctx != ctx && a->event_ctx != ctx)
            continue;
        kiwi_vmm_unpend(a); /* its event went with the context */
        kiwi_vmm_count_in_pool(a->pool, 0, -(int64_t)a->size);
        kiwi_vmm_release(a);
    }
}

void kiwi_vmm_frees_after_fork(void)
{
    pending_first = pending_last = NULL;
    pending_bytes = pending_when_asked = 0;
}
