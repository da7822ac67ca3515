/* The program's allocations the vmm evictor maps: each one a region of its own or units of a
 * slab, with what the driver would say of it (its pool, buffer id, SYNC_MEMOPS). They are kept
 * in the shim's one table of allocations (memory.c), each as the placement of its record; this
 * file finds them there, and says what goes when one does: its units, and with its region's
 * last allocation the region (kept for reuse, vmm_cache.c, or destroyed).
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "vmm.h"

/* The memory of an allocation goes: its units, or its region. */
void kiwi_vmm_release(struct vmm_allocation *a)
{
    struct vmm_region *r = a->region;
    if (r->slab) {
        kiwi_vmm_mark_units(r, a->first_unit, a->unit_count, false);
        r->starts[a->first_unit / 64] &= ~(1ull << (a->first_unit % 64));
    }
    if (--r->allocations == 0)
        kiwi_vmm_let_go(r);
    free(a);
}

/* With kiwi_table_lock held (kiwi_memory_each_placement): a record in the region pinned. */
static void pin_record(struct allocation *record, void *region)
{
    if (record->placement->region == region)
        record->pinned = true;
}

void kiwi_vmm_pin(struct vmm_region *r, const char *why)
{
    if (r->pinned || r->cached)
        return;
    r->pinned = true;
    kiwi_memory_pinned((int64_t)r->size);
    kiwi_memory_each_placement(pin_record, r);
    kiwi_log("%s the memory at 0x%llx: its %zu bytes stay on the card", why,
             (unsigned long long)r->va, r->size);
}

/* The context that ended, and its allocations taken off their records: released once
 * kiwi_table_lock is let go (a region let go takes it again). */
struct context_end {
    CUcontext ctx;
    struct vmm_allocation *gone;
};

static void take_if_in_context(struct allocation *record, void *arg)
{
    struct context_end *end = arg;
    struct vmm_allocation *a = record->placement;
    /* The record's context too (a pending free of another context's, reused): the context's
     * end forgets the record next, and the placement must not outlive it. */
    if (a->region->ctx != end->ctx && record->ctx != end->ctx)
        return;
    record->placement = NULL;
    a->next = end->gone;
    end->gone = a;
}

void kiwi_vmm_allocations_forget(CUcontext ctx)
{
    struct context_end end = {ctx, NULL};
    kiwi_memory_each_placement(take_if_in_context, &end);
    while (end.gone) {
        struct vmm_allocation *a = end.gone;
        end.gone = a->next;
        kiwi_vmm_count_in_pool(a->pool, -(int64_t)a->size, -(int64_t)a->size);
        kiwi_vmm_release(a);
    }
}
