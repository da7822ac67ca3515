/* Questions about an address inside memory the vmm evictor maps: whether it is the shim's, what
 * the driver would have said of the allocation holding it (interpose/pointer.c), whether any of
 * it is away; and what makes memory stay where it is (a handle of it handed out) or reachable
 * from another device (peer access).
 */
#define _GNU_SOURCE
#include "vmm.h"

/* Under kiwi_vmm_lock: the region holding ptr, or NULL. */
static struct vmm_region *region_at(CUdeviceptr ptr)
{
    struct vmm_region *r = kiwi_vmm_index_find(ptr);
    return r && !r->cached ? r : NULL;
}

/* Under kiwi_vmm_lock: the live allocation holding ptr, or NULL (freed memory included). */
static struct vmm_allocation *allocation_at(CUdeviceptr ptr)
{
    struct vmm_region *r = region_at(ptr);
    if (!r)
        return NULL;
    if (!r->slab)
        return kiwi_memory_placement(r->va);
    size_t unit = (ptr - r->va) / VMM_UNIT, first = kiwi_vmm_slab_start_before(r, unit);
    struct vmm_allocation *a =
        first < r->unit_count ? kiwi_memory_placement(r->va + first * VMM_UNIT) : NULL;
    return a && unit < a->first_unit + a->unit_count && ptr - a->ptr < a->size ? a : NULL;
}

bool kiwi_vmm_facts(CUdeviceptr ptr, struct kiwi_vmm_facts *out)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = allocation_at(ptr);
    if (a) {
        const struct vmm_region *r = a->region;
        bool away = false;
        for (int i = 0; i < r->chunk_count && !away; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            away = !c->resident && c->offset < a->ptr - r->va + a->size &&
                   a->ptr - r->va < c->offset + c->size;
        }
        *out = (struct kiwi_vmm_facts){
            .base = a->ptr, .size = a->size, .ctx = a->stream_ordered ? NULL : r->ctx,
            .stream_ordered = a->stream_ordered,
            .device = r->device, .pool = a->pool, .buffer_id = a->buffer_id,
            .sync_memops = a->sync_memops, .away = away};
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return a != NULL;
}

bool kiwi_vmm_set_sync_memops(CUdeviceptr ptr, bool on)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = allocation_at(ptr);
    if (a)
        a->sync_memops = on;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return a != NULL;
}

bool kiwi_vmm_owns(CUdeviceptr ptr)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    bool owned = region_at(ptr) != NULL;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return owned;
}

struct vmm_region *kiwi_vmm_allocation_region(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
    struct vmm_allocation *a = allocation_at(ptr);
    if (!a)
        return NULL;
    *base = a->ptr;
    *size = a->size;
    return a->region;
}

void kiwi_vmm_retained(CUdeviceptr ptr, size_t size)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_region *const *regions;
    size_t count = kiwi_vmm_index_overlapping(ptr, size ? size : 1, &regions);
    for (size_t i = 0; i < count; i++)
        kiwi_vmm_pin(regions[i], "a handle was handed out of");
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

bool kiwi_vmm_away_in(CUdeviceptr ptr, size_t size)
{
    bool away = false;
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_region *const *regions;
    size_t count = kiwi_vmm_index_overlapping(ptr, size ? size : 1, &regions);
    for (size_t i = 0; i < count && !away; i++)
        for (int c = 0; c < regions[i]->chunk_count && !away; c++)
            away = !regions[i]->cached && !regions[i]->chunks[c].resident;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return away;
}

void kiwi_vmm_peer_enabled(CUcontext peer)
{
    if (!kiwi_vmm_resolve() || !kiwi_pager_driver.ctx_device)
        return;
    CUdevice accessor = -1, owner = -1;
    CUcontext current = NULL;
    kiwi_pager_driver.ctx_get(&current);
    kiwi_pager_driver.ctx_device(&accessor);
    if (kiwi_pager_driver.ctx_set(peer) == CUDA_SUCCESS)
        kiwi_pager_driver.ctx_device(&owner);
    kiwi_pager_driver.ctx_set(current);
    if (!kiwi_vmm_peer_note(owner, accessor))
        return;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; r->device == owner && i < r->chunk_count; i++)
            if (r->chunks[i].resident)
                kiwi_vmm_set_access(r->va + r->chunks[i].offset, r->chunks[i].size, owner);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_log("device %d may reach device %d's memory: every mapping there says so", accessor,
             owner);
}
