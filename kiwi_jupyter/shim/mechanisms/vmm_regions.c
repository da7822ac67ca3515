/* The vmm evictor's regions: each one reservation of address space (cuMemAddressReserve, whole
 * granules) for one allocation of 1 MiB or more, or a slab of small ones (vmm_slabs.c), laid
 * out in chunks of physical memory (vmm_chunks.c); every region in the order they were made,
 * for the move and the shadow builder; made, backed, and destroyed with everything they hold.
 * And the lock every vmm file works under.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "vmm.h"

pthread_mutex_t kiwi_vmm_lock = PTHREAD_MUTEX_INITIALIZER;
bool kiwi_vmm_evicted;
/* Written under kiwi_vmm_lock, read without it (a move holds the lock for seconds). */
atomic_bool kiwi_vmm_all_backed = true;

struct vmm_region *kiwi_vmm_first_region;
static struct vmm_region *last_region;
static uint64_t next_serial = 1;

static void link_region(struct vmm_region *r)
{
    if (r->slab)
        kiwi_vmm_slabs_add(r);
    r->serial = next_serial++;
    r->prev = last_region;
    r->next = NULL;
    if (last_region)
        last_region->next = r;
    else
        kiwi_vmm_first_region = r;
    last_region = r;
}

static void unlink_region(struct vmm_region *r)
{
    kiwi_vmm_index_remove(r);
    if (r->slab && !r->cached) /* a cached one left the cache first (vmm_cache.c) */
        kiwi_vmm_slabs_remove(r);
    if (r->prev)
        r->prev->next = r->next;
    else
        kiwi_vmm_first_region = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        last_region = r->prev;
}

/* How size bytes (whole granules) are cut into chunks: one up to VMM_CHUNK_MAX, else n equal
 * ones of whole granules and a last one with the rest. Returns the count; *each: their size. */
static int chunk_layout(size_t size, size_t granule, size_t *each)
{
    if (size <= VMM_CHUNK_MAX) {
        *each = size;
        return 1;
    }
    size_t n = (size + VMM_CHUNK_MAX - 1) / VMM_CHUNK_MAX;
    *each = kiwi_vmm_round_up((size + n - 1) / n, granule);
    return (int)((size + *each - 1) / *each);
}

/* A region of size bytes at va (reserved), its chunks laid out, none resident yet. */
static struct vmm_region *region_new(CUdeviceptr va, size_t size, size_t granule, CUcontext ctx,
                                     CUdevice device, bool slab)
{
    struct vmm_region *r = calloc(1, sizeof *r);
    size_t each;
    int count = chunk_layout(size, granule, &each);
    if (r)
        r->chunks = calloc((size_t)count, sizeof *r->chunks);
    if (r && slab) {
        r->unit_count = size / VMM_UNIT;
        r->units = calloc((r->unit_count + 63) / 64, sizeof *r->units);
        r->starts = calloc((r->unit_count + 63) / 64, sizeof *r->starts);
    }
    if (!r || !r->chunks || (slab && (!r->units || !r->starts))) {
        if (r) {
            free(r->chunks);
            free(r->units);
            free(r->starts);
        }
        free(r);
        return NULL;
    }
    r->va = va;
    r->size = size;
    r->ctx = ctx;
    r->device = device;
    r->slab = slab;
    r->chunk_count = count;
    for (int i = 0; i < count; i++) {
        r->chunks[i].offset = (size_t)i * each;
        r->chunks[i].size = i + 1 < count ? each : size - (size_t)i * each;
    }
    return r;
}

/* Maps every chunk of r that is not resident; on a failure unmaps what it mapped. */
static CUresult back_region(struct vmm_region *r)
{
    for (int i = 0; i < r->chunk_count; i++) {
        if (r->chunks[i].resident)
            continue;
        CUresult result = kiwi_vmm_map_chunk(r->va, &r->chunks[i], r->device);
        if (result != CUDA_SUCCESS) {
            while (i-- > 0)
                kiwi_vmm_unmap_chunk(r->va, &r->chunks[i]);
            return result;
        }
    }
    return CUDA_SUCCESS;
}

/* Takes r off the card and out of the address space: its memory, its shadows (as spares),
 * its addresses, its export (what an importer mapped stays alive on the card until it lets it
 * go). (After its context ended the driver may have taken them already.) */
void kiwi_vmm_destroy_region(struct vmm_region *r)
{
    if (r->export) {
        for (int i = 0; i < r->chunk_count; i++)
            if (r->export->chunk_fds[i] >= 0)
                close(r->export->chunk_fds[i]);
        close(r->export->manifest);
        free(r->export);
    }
    for (int i = 0; i < r->chunk_count; i++) {
        struct vmm_chunk *c = &r->chunks[i];
        if (c->resident && kiwi_vmm_unmap_chunk(r->va, c) != CUDA_SUCCESS)
            kiwi_log("unmapping %zu bytes at 0x%llx failed", c->size,
                     (unsigned long long)(r->va + c->offset));
        kiwi_vmm_spare_put(&c->shadow);
        kiwi_vmm_spill_forget(c);
        free(c->pieces);
    }
    CUresult result = kiwi_vmm_driver.address_free(r->va, r->size);
    if (result != CUDA_SUCCESS)
        kiwi_log("freeing the addresses at 0x%llx failed (CUDA error %d)",
                 (unsigned long long)r->va, result);
    unlink_region(r);
    free(r->chunks);
    free(r->units);
    free(r->starts);
    free(r);
    if (!atomic_load(&kiwi_vmm_all_backed))
        kiwi_vmm_recount_backed(); /* perhaps the last one that waited for room */
}

void kiwi_vmm_recount_backed(void)
{
    bool backed = !kiwi_vmm_evicted;
    for (struct vmm_region *r = kiwi_vmm_first_region; backed && r; r = r->next)
        for (int i = 0; backed && i < r->chunk_count; i++)
            backed = r->chunks[i].resident;
    atomic_store(&kiwi_vmm_all_backed, backed);
}

/* Reserves and (when back, and unless the memory is away) backs a new region; NULL with
 * *result on failure. */
struct vmm_region *kiwi_vmm_make_region(size_t size, size_t granule, CUcontext ctx,
                                      CUdevice device, bool slab, bool back, CUresult *result)
{
    CUdeviceptr va = 0;
    *result = kiwi_vmm_driver.reserve(&va, size, granule, 0, 0);
    if (*result != CUDA_SUCCESS)
        return NULL;
    struct vmm_region *r = region_new(va, size, granule, ctx, device, slab);
    if (!r) {
        kiwi_vmm_driver.address_free(va, size);
        *result = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    *result = kiwi_vmm_evicted || !back ? CUDA_SUCCESS : back_region(r);
    if (*result == CUDA_SUCCESS && !kiwi_vmm_index_add(r)) {
        for (int i = 0; i < r->chunk_count; i++)
            if (r->chunks[i].resident)
                kiwi_vmm_unmap_chunk(r->va, &r->chunks[i]);
        *result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (*result != CUDA_SUCCESS) {
        kiwi_vmm_driver.address_free(va, size);
        free(r->chunks);
        free(r->units);
        free(r->starts);
        free(r);
        return NULL;
    }
    link_region(r);
    return r;
}

void kiwi_vmm_regions_after_fork(void)
{
    /* Except the descriptors of what the parent shared: open here they would keep its memory
     * on the card after the parent freed it, for as long as the child lives. */
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; r->export && i < r->chunk_count; i++)
            if (r->export->chunk_fds[i] >= 0)
                close(r->export->chunk_fds[i]);
        if (r->export)
            close(r->export->manifest);
        /* and the spill files: a DataLoader worker would hold their blocks on disk */
        for (int i = 0; i < r->chunk_count; i++)
            if (r->chunks[i].spilled && r->chunks[i].spilled->fd >= 0) {
                close(r->chunks[i].spilled->fd);
                r->chunks[i].spilled->fd = -1;
            }
    }
    kiwi_vmm_first_region = last_region = NULL;
    kiwi_vmm_evicted = false;
    atomic_store(&kiwi_vmm_all_backed, true);
}
