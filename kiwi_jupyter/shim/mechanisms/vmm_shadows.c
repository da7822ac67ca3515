/* Host shadows: the host memory a chunk's bytes go to when an eviction takes it off the card.
 *
 * A copy engine reaches the link's speed only from and to pinned memory, and pinning is slow:
 * cuMemAllocHost of 16 GiB took 6.5 s on an H200 (the driver takes pages one at a time,
 * zeroes and maps each; ../shared/design/gpu-memory-swap.md, section 4), far longer than the
 * copy itself. So shadows are made ahead of time, by a thread of the vmm evictor's own
 * (vmm_builder.c), as the working set grows, and kept from one eviction to the next. The way
 * they are made, KIWI_VMM_SHADOW:
 *
 *   register   anonymous memory, aligned to 2 MiB and advised to use huge pages (one fault and
 *              one page-table entry per 2 MiB), then pinned with cuMemHostRegister (portable:
 *              every context may copy to it); where the driver refuses, cuMemAllocHost;
 *   allochost  the driver's pinned memory, cuMemAllocHost;
 *   pageable   anonymous memory, never pinned (copies go through the driver's staging).
 *
 * When host memory cannot be pinned, a shadow stays pageable. An eviction that finds a chunk
 * without a pinned shadow (the builder is behind, or past its budget: vmm_builder.c) takes a
 * pageable one at once, cheap to make, and copies through the staging ring (vmm_staging.c).
 *
 * Every shadow is left out of a forked child (MADV_DONTFORK): the child has no use for them,
 * and Linux copies pinned pages into a child at fork (they cannot be shared copy-on-write while
 * a device may write them), so a DataLoader with k workers would copy k times the working set
 * at each epoch.
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "vmm.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* Anonymous memory of size bytes starting on a 2 MiB boundary, advised to use huge pages
 * (the kernel backs it with them where transparent huge pages are enabled); NULL when none. */
static void *huge_pages(size_t size)
{
    size_t padded = size + HUGE_PAGE;
    unsigned char *mapped =
        mmap(NULL, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED)
        return NULL;
    uintptr_t start = ((uintptr_t)mapped + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = start - (uintptr_t)mapped, tail = padded - head - size;
    if (head)
        munmap(mapped, head);
    if (tail)
        munmap((unsigned char *)start + size, tail);
#ifdef MADV_HUGEPAGE
    madvise((void *)start, size, MADV_HUGEPAGE);
#endif
    madvise((void *)start, size, MADV_DONTFORK);
    return (void *)start;
}

struct vmm_shadow kiwi_vmm_shadow_pageable(size_t size)
{
    void *host = huge_pages(size);
    return host ? (struct vmm_shadow){host, size, SHADOW_PAGEABLE}
                : (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

static struct vmm_shadow allocated(size_t size)
{
    void *host = NULL;
    if (kiwi_pager_driver.host_alloc && kiwi_pager_driver.host_alloc(&host, size) == CUDA_SUCCESS) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)host & ~(page - 1);
        madvise((void *)start, size + ((uintptr_t)host - start), MADV_DONTFORK);
        return (struct vmm_shadow){host, size, SHADOW_ALLOCATED};
    }
    return kiwi_vmm_shadow_pageable(size);
}

struct vmm_shadow kiwi_vmm_shadow_make(size_t size)
{
    switch (kiwi_cfg.shadow) {
    case KIWI_SHADOW_PAGEABLE:
        return kiwi_vmm_shadow_pageable(size);
    case KIWI_SHADOW_ALLOC_HOST:
        return allocated(size);
    default:
        break;
    }
    void *host = huge_pages(size);
    if (!host)
        return allocated(size);
    CUresult result = kiwi_vmm_driver.host_register
                          ? kiwi_vmm_driver.host_register(host, size, CU_MEMHOSTREGISTER_PORTABLE)
                          : CUDA_ERROR_NOT_FOUND;
    if (result == CUDA_SUCCESS)
        return (struct vmm_shadow){host, size, SHADOW_REGISTERED};
    kiwi_log("cuMemHostRegister of %zu bytes failed (CUDA error %d); cuMemAllocHost instead",
             size, result);
    munmap(host, size);
    return allocated(size);
}

void kiwi_vmm_shadow_free(struct vmm_shadow *shadow)
{
    switch (shadow->kind) {
    case SHADOW_REGISTERED:
        if (kiwi_vmm_driver.host_unregister)
            kiwi_vmm_driver.host_unregister(shadow->host);
        munmap(shadow->host, shadow->size);
        break;
    case SHADOW_PAGEABLE:
        munmap(shadow->host, shadow->size);
        break;
    case SHADOW_ALLOCATED:
        if (kiwi_pager_driver.host_free)
            kiwi_pager_driver.host_free(shadow->host);
        break;
    default:
        break;
    }
    *shadow = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

bool kiwi_vmm_shadow_pinned(const struct vmm_shadow *shadow)
{
    return shadow->kind == SHADOW_REGISTERED || shadow->kind == SHADOW_ALLOCATED;
}
