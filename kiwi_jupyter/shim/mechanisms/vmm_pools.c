/* The pools' counters: stream-ordered allocations the vmm evictor made, by the pool they were
 * asked of, for cuMemPoolGetAttribute (interpose/pool.c): used and reserved, now and at most;
 * reserved stays up from a free until its memory is reclaimed, as a pool's does.
 */
#define _GNU_SOURCE
#include "vmm.h"

#define MAX_POOLS 16

struct pool_counts {
    CUmemoryPool pool;
    uint64_t used, used_high, reserved, reserved_high;
};
static struct pool_counts pools[MAX_POOLS];
static int pool_count;

static struct pool_counts *counts_of(CUmemoryPool pool, bool make)
{
    if (!pool)
        return NULL;
    for (int i = 0; i < pool_count; i++)
        if (pools[i].pool == pool)
            return &pools[i];
    if (!make || pool_count == MAX_POOLS)
        return NULL;
    pools[pool_count] = (struct pool_counts){.pool = pool};
    return &pools[pool_count++];
}

void kiwi_vmm_count_in_pool(CUmemoryPool pool, int64_t used, int64_t reserved)
{
    struct pool_counts *c = counts_of(pool, used > 0);
    if (!c)
        return;
    c->used += (uint64_t)used;
    c->reserved += (uint64_t)reserved;
    if (c->used > c->used_high)
        c->used_high = c->used;
    if (c->reserved > c->reserved_high)
        c->reserved_high = c->reserved;
}

bool kiwi_vmm_pool_attribute(CUmemoryPool pool, int attribute, uint64_t *value)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct pool_counts *c = counts_of(pool, false);
    bool known = c != NULL;
    if (c) {
        switch (attribute) {
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *value = c->reserved;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            *value = c->reserved_high;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *value = c->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            *value = c->used_high;
            break;
        default:
            known = false; /* the pool's settings are the driver's */
        }
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return known;
}

bool kiwi_vmm_pool_reset(CUmemoryPool pool, int attribute)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct pool_counts *c = counts_of(pool, false);
    bool known = c && (attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
                       attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    if (known && attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        c->reserved_high = c->reserved;
    else if (known)
        c->used_high = c->used;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return known;
}

void kiwi_vmm_pools_after_fork(void)
{
    pool_count = 0;
}
