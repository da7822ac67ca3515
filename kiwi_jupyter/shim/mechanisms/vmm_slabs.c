/* Slabs: regions of one granule that small allocations (under VMM_SLAB_LIMIT) share, in units
 * of VMM_UNIT, one bit each for a unit in use and one for a unit where an allocation starts;
 * and the list of the slabs in use, so that a small allocation looks only there.
 */
#define _GNU_SOURCE
#include "vmm.h"

static struct vmm_region *slabs; /* in use: not kept for reuse (vmm_cache.c) */

void kiwi_vmm_slabs_add(struct vmm_region *slab)
{
    kiwi_vmm_side_link(&slabs, slab);
}

void kiwi_vmm_slabs_remove(struct vmm_region *slab)
{
    kiwi_vmm_side_unlink(&slabs, slab);
}

/* In a slab: the first of count free units, or unit_count when there is no such run. */
static size_t free_run(const struct vmm_region *slab, size_t count)
{
    size_t run = 0;
    for (size_t i = 0; i < slab->unit_count; i++) {
        if (!(i & 63) && slab->units[i / 64] == ~0ull && i + 64 <= slab->unit_count) {
            run = 0;
            i += 63; /* a word wholly in use */
            continue;
        }
        run = slab->units[i / 64] >> (i & 63) & 1 ? 0 : run + 1;
        if (run == count)
            return i + 1 - count;
    }
    return slab->unit_count;
}

void kiwi_vmm_mark_units(struct vmm_region *slab, size_t first, size_t count, bool used)
{
    for (size_t i = first, end = first + count; i < end;) {
        size_t bit = i & 63, n = end - i < 64 - bit ? end - i : 64 - bit;
        uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << bit;
        if (used)
            slab->units[i / 64] |= mask;
        else
            slab->units[i / 64] &= ~mask;
        i += n;
    }
    slab->units_used = used ? slab->units_used + count : slab->units_used - count;
}

/* A slab of ctx on device with count free units in a row; first: where. */
struct vmm_region *kiwi_vmm_slab_with_room(size_t count, CUcontext ctx, CUdevice device,
                                         size_t *first)
{
    for (struct vmm_region *r = slabs; r; r = r->side_next) {
        if (r->pinned || r->ctx != ctx || r->device != device ||
            r->unit_count - r->units_used < count)
            continue;
        *first = free_run(r, count);
        if (*first < r->unit_count)
            return r;
    }
    return NULL;
}

/* In a slab: the last unit at or before unit where an allocation starts; unit_count if none. */
size_t kiwi_vmm_slab_start_before(const struct vmm_region *slab, size_t unit)
{
    size_t word = unit / 64;
    uint64_t bits = slab->starts[word] & (~0ull >> (63 - unit % 64));
    while (!bits) {
        if (word == 0)
            return slab->unit_count;
        bits = slab->starts[--word];
    }
    return word * 64 + 63 - (size_t)__builtin_clzll(bits);
}

void kiwi_vmm_slabs_after_fork(void)
{
    slabs = NULL;
}
