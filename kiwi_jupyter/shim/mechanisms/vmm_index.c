/* The vmm evictor's regions by address: which region holds an address, in a binary search.
 *
 * Every question about an address (cuPointerGetAttribute, which Triton's launcher asks for each
 * tensor argument of each launch; cuMemGetAddressRange; a free) starts by finding the region
 * that holds it, so the lookup must not walk the list of regions. The index is an array of the
 * regions in address order: regions are reserved far more rarely than they are asked about
 * (allocations reuse slabs, regions kept for reuse, and stream-ordered frees), so an insertion
 * that moves part of the array costs less than a tree's upkeep on every lookup. Reservations
 * never overlap, so the region holding an address is the last one starting at or below it.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "vmm.h"

static struct vmm_region **by_address;
static size_t count, room;

/* How many regions start at or below ptr. */
static size_t starting_up_to(CUdeviceptr ptr)
{
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (by_address[middle]->va <= ptr)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

bool kiwi_vmm_index_add(struct vmm_region *r)
{
    if (count == room) {
        size_t larger = room ? room * 2 : 256;
        struct vmm_region **grown = realloc(by_address, larger * sizeof *grown);
        if (!grown)
            return false;
        by_address = grown;
        room = larger;
    }
    size_t at = starting_up_to(r->va);
    memmove(by_address + at + 1, by_address + at, (count - at) * sizeof *by_address);
    by_address[at] = r;
    count++;
    return true;
}

void kiwi_vmm_index_remove(struct vmm_region *r)
{
    size_t at = starting_up_to(r->va);
    if (at == 0 || by_address[at - 1] != r)
        return; /* never indexed (its reservation failed half way) */
    memmove(by_address + at - 1, by_address + at, (count - at) * sizeof *by_address);
    count--;
}

struct vmm_region *kiwi_vmm_index_find(CUdeviceptr ptr)
{
    size_t at = starting_up_to(ptr);
    if (at == 0)
        return NULL;
    struct vmm_region *r = by_address[at - 1];
    return ptr - r->va < r->size ? r : NULL;
}

size_t kiwi_vmm_index_overlapping(CUdeviceptr ptr, size_t size,
                                  struct vmm_region *const **first)
{
    size_t at = starting_up_to(ptr);
    if (at > 0 && ptr - by_address[at - 1]->va < by_address[at - 1]->size)
        at--; /* the region holding ptr itself */
    size_t end = at;
    while (end < count && by_address[end]->va - ptr < size)
        end++;
    *first = by_address + at;
    return end - at;
}

void kiwi_vmm_index_after_fork(void)
{
    /* The parent's regions are not the child's (vmm_regions.c forgets them too); the array is
     * kept. */
    count = 0;
}
