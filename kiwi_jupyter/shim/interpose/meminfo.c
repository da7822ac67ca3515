/* What the process is told about the GPU's memory: cuMemGetInfo and cuDeviceTotalMem.
 *
 * Both say the same total: KIWI_GPU_MEMORY_LIMIT, or the whole GPU. Free is what this process
 * may still allocate before the card would have to page against itself: the total less what
 * it allocated, and never more than the GPU's memory less what no eviction frees (other
 * processes' contexts and unconverted memory, and this process's context; see
 * kiwi_memory_learn). Other processes' managed memory does not count: it goes to host memory
 * while this one holds the GPU. An allocation past that room fails with
 * CUDA_ERROR_OUT_OF_MEMORY, so frameworks free their caches and retry, or trim their pools,
 * before managed memory would oversubscribe the card and thrash (or, under vmm, before the card
 * runs out while another process's memory is still on its way out). Under the checkpoint
 * evictor nothing is converted: the driver's free memory, within the limit.
 */
#include "interpose.h"

KIWI_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    KIWI_REAL(real, cuMemGetInfo_v2);
    size_t real_free = 0, real_total = 0;
    CUresult result = real(&real_free, &real_total);
    /* Under the checkpoint evictor other processes' memory is really gone while this one
     * holds the GPU, so the driver's figures are the truth (within the limit, if one is set).
     * Under vmm and managed the room is what this process may use once the others are out. */
    bool converts = kiwi_pager_allocator()->pages_itself;
    if (result != CUDA_SUCCESS || !kiwi_cfg.enabled || (!converts && !kiwi_cfg.memory_limit)) {
        if (free_bytes)
            *free_bytes = real_free;
        if (total_bytes)
            *total_bytes = real_total;
        return result;
    }
    kiwi_memory_learn(real_total, real_free);
    struct kiwi_working_set used;
    kiwi_memory_working_set(&used);
    uint64_t room = kiwi_memory_room();
    uint64_t free_now = used.bytes < room ? room - used.bytes : 0;
    if (!converts && free_now > real_free)
        free_now = real_free;
    if (free_bytes)
        *free_bytes = (size_t)free_now;
    if (total_bytes)
        *total_bytes = (size_t)kiwi_memory_limit();
    return CUDA_SUCCESS;
}

KIWI_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device)
{
    KIWI_REAL(real, cuDeviceTotalMem_v2);
    CUresult result = real(bytes, device);
    if (result != CUDA_SUCCESS || !kiwi_cfg.enabled || !bytes)
        return result;
    uint64_t limit = kiwi_cfg.memory_limit;
    if (limit && limit < *bytes)
        *bytes = (size_t)limit;
    return CUDA_SUCCESS;
}
