/* The vmm evictor's physical side: the driver's virtual memory management calls, and one chunk
 * at a time mapped onto the card or taken off it.
 *
 * A chunk is one physical handle (cuMemCreate: pinned device memory of the chunk's device, no
 * shareable handle type, so nothing outside the process can keep it alive), mapped at its place
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
#include <string.h>

#include "vmm.h"

#define MAX_DEVICES 64

struct vmm_driver kiwi_vmm_driver;

static pthread_mutex_t peers_lock = PTHREAD_MUTEX_INITIALIZER;
/* peers[owner] has bit a set when device a may reach device owner's memory. */
static uint64_t peers[MAX_DEVICES];
static _Atomic size_t granularities[MAX_DEVICES];

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

static CUmemAllocationProp device_memory(CUdevice device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop); /* no shareable handle, no compression */
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
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
    CUmemAllocationProp prop = device_memory(device);
    CUmemGenericAllocationHandle handle = 0;
    CUresult result = kiwi_vmm_driver.create(&handle, c->size, &prop, 0);
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

void kiwi_vmm_chunks_after_fork(void)
{
    pthread_mutex_init(&peers_lock, NULL);
    memset(peers, 0, sizeof peers); /* the child enables its own peers in its own contexts */
}
