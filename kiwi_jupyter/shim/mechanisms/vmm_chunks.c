/* The vmm evictor's physical side: the driver's virtual memory management calls, and one chunk
 * at a time mapped onto the card or taken off it.
 *
 * A chunk is one physical handle (cuMemCreate: pinned device memory of the chunk's device;
 * exportable as a POSIX file descriptor where the device allows it, as PyTorch's expandable
 * segments make theirs, so that legacy IPC can share it on demand (vmm_ipc.c): until it is
 * exported nothing outside the process holds it; capable of GPUDirect RDMA where the device
 * allows the flag, as cuMemAlloc memory is, so that a NIC can register it), mapped at its place
 * in its region's reserved addresses (cuMemMap) and made accessible (cuMemSetAccess: a new
 * mapping has no access at all). Taking it off is cuMemUnmap then cuMemRelease: with no mapping
 * and no reference left, the driver frees the memory, and the card has it back at once, in
 * NVML and in every process's cuMemGetInfo. Access is per mapping, not per context: the
 * devices a program enabled peer access from (cuCtxEnablePeerAccess, which does not apply to
 * VMM memory) are given access here, to every mapping of the device they may reach, now and
 * at each restore.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vmm.h"

#define MAX_DEVICES 64

struct vmm_driver kiwi_vmm_driver;

#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110
#define CUDA_ERROR_NOT_PERMITTED 800

static pthread_mutex_t peers_lock = PTHREAD_MUTEX_INITIALIZER;
/* peers[owner] has bit a set when device a may reach device owner's memory. */
static uint64_t peers[MAX_DEVICES];
static _Atomic size_t granularities[MAX_DEVICES];
/* Per device, what cuMemCreate may be asked for: 0 not known yet, 1 it may, -1 it may not. */
static atomic_int rdma_flag[MAX_DEVICES];       /* GPUDirect RDMA */
static atomic_int exportable_flag[MAX_DEVICES]; /* a POSIX file descriptor handle type */

bool kiwi_vmm_resolve(void)
{
    static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
    static atomic_bool resolved;
    if (atomic_load(&resolved))
        return true;
    if (!kiwi_pager_resolve())
        return false;
    pthread_mutex_lock(&resolve_lock);
    struct vmm_driver *d = &kiwi_vmm_driver;
    if (!d->reserve) {
        d->address_free = (address_free_fn)kiwi_driver_sym("cuMemAddressFree");
        d->create = (create_fn)kiwi_real(HOOK_cuMemCreate);
        d->release = (release_fn)kiwi_real(HOOK_cuMemRelease);
        d->map = (map_fn)kiwi_driver_sym("cuMemMap");
        d->unmap = (unmap_fn)kiwi_driver_sym("cuMemUnmap");
        d->set_access = (set_access_fn)kiwi_driver_sym("cuMemSetAccess");
        d->granularity = (granularity_fn)kiwi_driver_sym("cuMemGetAllocationGranularity");
        d->event_create = (event_create_fn)kiwi_driver_sym("cuEventCreate");
        d->event_record = (event_record_fn)kiwi_driver_sym("cuEventRecord");
        d->event_query = (event_fn)kiwi_driver_sym("cuEventQuery");
        d->event_synchronize = (event_fn)kiwi_driver_sym("cuEventSynchronize");
        d->event_destroy = (event_fn)kiwi_driver_sym("cuEventDestroy_v2");
        d->host_register = (host_register_fn)kiwi_driver_sym("cuMemHostRegister_v2");
        d->host_unregister = (host_unregister_fn)kiwi_driver_sym("cuMemHostUnregister");
        d->graph_trim = (graph_trim_fn)kiwi_driver_sym("cuDeviceGraphMemTrim");
        d->export_fd = (export_fn)kiwi_driver_sym("cuMemExportToShareableHandle");
        d->import_fd = (import_fn)kiwi_driver_sym("cuMemImportFromShareableHandle");
        d->mem_info = (mem_info_fn)kiwi_real(HOOK_cuMemGetInfo_v2);
        d->reserve = (reserve_fn)kiwi_driver_sym("cuMemAddressReserve");
    }
    bool found = d->reserve && d->address_free && d->create && d->release && d->map &&
                 d->unmap && d->set_access && d->granularity && d->event_create &&
                 d->event_record && d->event_query && d->event_synchronize &&
                 d->event_destroy && kiwi_pager_driver.copy_to_host &&
                 kiwi_pager_driver.copy_to_device && kiwi_pager_driver.ctx_set &&
                 kiwi_pager_driver.ctx_sync && kiwi_pager_driver.stream_create &&
                 kiwi_pager_driver.stream_sync;
    atomic_store(&resolved, found);
    pthread_mutex_unlock(&resolve_lock);
    return found;
}

/* Whether the device says yes to attribute, asked once (flags: the answers kept per device). */
static bool device_allows(CUdevice device, CUdevice_attribute attribute, atomic_int *flags)
{
    if (device < 0 || device >= MAX_DEVICES)
        return false;
    int known = atomic_load(&flags[device]);
    if (known)
        return known > 0;
    typedef CUresult (*attribute_fn)(int *, CUdevice_attribute, CUdevice);
    attribute_fn ask = (attribute_fn)kiwi_driver_sym("cuDeviceGetAttribute");
    int value = 0;
    if (!ask || ask(&value, attribute, device) != CUDA_SUCCESS)
        value = 0;
    atomic_store(&flags[device], value ? 1 : -1);
    return value != 0;
}

/* Whether cuMemCreate may be asked for memory GPUDirect RDMA can register, on device (the
 * driver refuses the flag, or ignores it, where the device has no such support). */
static bool rdma_capable(CUdevice device)
{
    return device_allows(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                         rdma_flag);
}

static bool exportable(CUdevice device)
{
    return device_allows(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                         exportable_flag);
}

static CUmemAllocationProp device_memory(CUdevice device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop); /* no shareable handle, no compression */
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.gpuDirectRDMACapable = rdma_capable(device);
    if (exportable(device))
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

/* A physical handle of size bytes on device. Where the driver refuses the exportable type
 * although the device says it has it (a container without the device nodes it needs, as
 * PyTorch's expandable segments met), the chunk is made without it, and so from then on. */
static CUresult create_handle(CUmemGenericAllocationHandle *handle, size_t size, CUdevice device)
{
    CUmemAllocationProp prop = device_memory(device);
    CUresult result = kiwi_vmm_driver.create(handle, size, &prop, 0);
    bool refused = result == CUDA_ERROR_NOT_SUPPORTED || result == CUDA_ERROR_NOT_PERMITTED ||
                   result == CUDA_ERROR_INVALID_VALUE;
    if (!refused || !prop.requestedHandleTypes)
        return result;
    atomic_store(&exportable_flag[device], -1);
    kiwi_log("cuMemCreate refused an exportable handle (CUDA error %d): legacy IPC of this "
             "memory cannot be offered", result);
    prop.requestedHandleTypes = 0;
    return kiwi_vmm_driver.create(handle, size, &prop, 0);
}

size_t kiwi_vmm_granularity(CUdevice device)
{
    if (device < 0 || device >= MAX_DEVICES || !kiwi_vmm_resolve())
        return 0;
    size_t known = atomic_load(&granularities[device]);
    if (known)
        return known;
    CUmemAllocationProp prop = device_memory(device);
    size_t bytes = 0;
    if (kiwi_vmm_driver.granularity(&bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS || !bytes || (bytes & (bytes - 1)))
        return 0;
    atomic_store(&granularities[device], bytes);
    return bytes;
}

CUresult kiwi_vmm_set_access(CUdeviceptr va, size_t size, CUdevice device)
{
    CUmemAccessDesc access[MAX_DEVICES];
    size_t count = 0;
    access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[count].location.id = device;
    access[count++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    pthread_mutex_lock(&peers_lock);
    uint64_t reach = device >= 0 && device < MAX_DEVICES ? peers[device] : 0;
    pthread_mutex_unlock(&peers_lock);
    for (int peer = 0; peer < MAX_DEVICES; peer++) {
        if (peer == device || !(reach >> peer & 1))
            continue;
        access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[count].location.id = peer;
        access[count++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    return kiwi_vmm_driver.set_access(va, size, access, count);
}

CUresult kiwi_vmm_map_chunk(CUdeviceptr va, struct vmm_chunk *c, CUdevice device)
{
    CUmemGenericAllocationHandle handle = 0;
    CUresult result = create_handle(&handle, c->size, device);
    if (result != CUDA_SUCCESS)
        return result;
    CUdeviceptr at = va + c->offset;
    result = kiwi_vmm_driver.map(at, c->size, 0, handle, 0);
    if (result == CUDA_SUCCESS) {
        result = kiwi_vmm_set_access(at, c->size, device);
        if (result != CUDA_SUCCESS)
            kiwi_vmm_driver.unmap(at, c->size);
    }
    if (result != CUDA_SUCCESS) {
        kiwi_vmm_driver.release(handle);
        return result;
    }
    c->handle = handle;
    c->resident = true;
    return CUDA_SUCCESS;
}

CUresult kiwi_vmm_unmap_chunk(CUdeviceptr va, struct vmm_chunk *c)
{
    CUresult result = kiwi_vmm_driver.unmap(va + c->offset, c->size);
    if (result != CUDA_SUCCESS)
        return result; /* still mapped: still resident */
    result = kiwi_vmm_driver.release(c->handle);
    if (result != CUDA_SUCCESS)
        kiwi_warn("releasing a physical handle of %zu bytes failed (CUDA error %d)", c->size,
                  result);
    c->handle = 0;
    c->resident = false;
    return CUDA_SUCCESS;
}

bool kiwi_vmm_peer_note(CUdevice owner, CUdevice accessor)
{
    if (owner < 0 || owner >= MAX_DEVICES || accessor < 0 || accessor >= MAX_DEVICES ||
        owner == accessor)
        return false;
    pthread_mutex_lock(&peers_lock);
    bool new_peer = !(peers[owner] >> accessor & 1);
    peers[owner] |= (uint64_t)1 << accessor;
    pthread_mutex_unlock(&peers_lock);
    return new_peer;
}

CUresult kiwi_vmm_give_access(CUdeviceptr va, size_t size, CUdevice device)
{
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return kiwi_vmm_driver.set_access(va, size, &access, 1);
}

void kiwi_vmm_chunks_after_fork(void)
{
    pthread_mutex_init(&peers_lock, NULL);
    memset(peers, 0, sizeof peers); /* the child enables its own peers in its own contexts */
}

/* Pieces closer than this are copied as one, the gap with them: a copy costs some
 * microseconds of its own (tens of KiB at the link's speed), and the restore writes a gap's
 * bytes where nothing was live, in memory that holds nothing yet. Less than the 2 MiB a block of
 * the framework's free cache is at least, so those are never copied so. */
#define MERGE_GAP ((size_t)64 << 10)

/* The parts of [start, start + size) that live ranges (sorted, disjoint) cover, as pieces
 * relative to start, those side by side (or less than MERGE_GAP apart) merged into one: a dense
 * slab of small allocations goes as one copy, not one per allocation. Returns how many (0 and
 * NULL when none, or out of host memory). */
size_t kiwi_vmm_live_pieces(const struct kiwi_range *live, size_t count, CUdeviceptr start,
                            size_t size, struct vmm_piece **out)
{
    *out = NULL;
    size_t low = kiwi_ranges_after(live, count, start);
    size_t first = low ? low - 1 : 0, n = 0;
    CUdeviceptr end = start + size;
    for (size_t i = first; i < count && live[i].ptr < end; i++)
        n += live[i].ptr + live[i].size > start;
    struct vmm_piece *pieces = n ? malloc(n * sizeof *pieces) : NULL;
    if (!pieces)
        return 0;
    size_t k = 0;
    for (size_t i = first; i < count && live[i].ptr < end; i++) {
        CUdeviceptr from = live[i].ptr > start ? live[i].ptr : start;
        CUdeviceptr to = live[i].ptr + live[i].size < end ? live[i].ptr + live[i].size : end;
        if (to <= from)
            continue;
        struct vmm_piece *last = k ? &pieces[k - 1] : NULL;
        if (last && from - start - (last->offset + last->size) < MERGE_GAP)
            last->size = to - start - last->offset;
        else
            pieces[k++] = (struct vmm_piece){from - start, to - from};
    }
    *out = pieces;
    return k;
}
