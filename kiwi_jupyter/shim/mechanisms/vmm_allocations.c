/* The program's allocations the vmm evictor maps, by address: each one a region of its own or
 * units of a slab, with what the driver would say of it (its pool, buffer id, SYNC_MEMOPS);
 * and what goes when one does: its units, and with its region's last allocation the region
 * (kept for reuse, vmm_cache.c, or destroyed).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vmm.h"

#define BUCKETS 4096

static struct vmm_allocation *table[BUCKETS];

static size_t bucket(CUdeviceptr ptr)
{
    return (size_t)((ptr * 0x9E3779B97F4A7C15ull) >> 52) % BUCKETS;
}

void kiwi_vmm_table_insert(struct vmm_allocation *a)
{
    size_t b = bucket(a->ptr);
    a->next = table[b];
    table[b] = a;
}

/* The live allocation starting at ptr; NULL when none. */
struct vmm_allocation *kiwi_vmm_table_find(CUdeviceptr ptr)
{
    for (struct vmm_allocation *a = table[bucket(ptr)]; a; a = a->next)
        if (a->ptr == ptr)
            return a;
    return NULL;
}

/* The live allocation at ptr, taken out of the table; NULL when none. */
struct vmm_allocation *kiwi_vmm_table_take(CUdeviceptr ptr)
{
    for (struct vmm_allocation **p = &table[bucket(ptr)]; *p; p = &(*p)->next) {
        if ((*p)->ptr != ptr)
            continue;
        struct vmm_allocation *a = *p;
        *p = a->next;
        a->next = NULL;
        return a;
    }
    return NULL;
}

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

void kiwi_vmm_pin(struct vmm_region *r, const char *why)
{
    if (r->pinned || r->cached)
        return;
    r->pinned = true;
    kiwi_memory_pinned((int64_t)r->size);
    for (size_t b = 0; b < BUCKETS; b++)
        for (struct vmm_allocation *a = table[b]; a; a = a->next)
            if (a->region == r)
                kiwi_memory_pin(a->ptr);
    kiwi_log("%s the memory at 0x%llx: its %zu bytes stay on the card", why,
             (unsigned long long)r->va, r->size);
}

void kiwi_vmm_table_forget(CUcontext ctx)
{
    for (size_t b = 0; b < BUCKETS; b++) {
        struct vmm_allocation **p = &table[b];
        while (*p) {
            if ((*p)->region->ctx != ctx) {
                p = &(*p)->next;
                continue;
            }
            struct vmm_allocation *a = *p;
            *p = a->next;
            kiwi_vmm_count_in_pool(a->pool, -(int64_t)a->size, -(int64_t)a->size);
            kiwi_vmm_release(a);
        }
    }
}

void kiwi_vmm_table_after_fork(void)
{
    memset(table, 0, sizeof table); /* left behind unfreed, as memory.c leaves its records */
}
