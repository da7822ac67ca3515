/* Stream-ordered allocation through a managed memory pool per device.
 *
 * cuMemAllocAsync and cuMemAllocFromPoolAsync (PyTorch's backend:cudaMallocAsync, CuPy's
 * MemoryAsyncPool) allocate and free per tensor, in stream order, from a pool. Turning each into
 * cuMemAllocManaged and each free into a stream synchronization would make every free wait for
 * the GPU. CUDA 13 drivers have managed memory pools (cuMemPoolCreate with allocation type
 * MANAGED): allocations from one are managed memory, pageable like the rest, and stay
 * stream-ordered, frees included. The shim keeps one such pool per device and answers
 * cuDeviceGetMemPool / cuDeviceGetDefaultMemPool with it (interpose/pool.c), so that the pool
 * a framework configures (release threshold) and reads (used and reserved memory) is the one
 * its allocations come from, and its attributes are the truth.
 *
 * On older drivers creating the pool fails; stream-ordered allocations then become plain
 * managed allocations, and a free waits for its stream (interpose/free.c).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>

#include "../shim.h"

#define MAX_DEVICES 64
/* CU_MEM_ALLOCATION_TYPE_MANAGED: CUDA 13's cuda.h names it, CUDA 12's does not. */
#define ALLOCATION_TYPE_MANAGED 2

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmemoryPool pools[MAX_DEVICES];
static atomic_bool unsupported;

static CUmemoryPool create(CUdevice device)
{
    typedef CUresult (*create_fn)(CUmemoryPool *, const CUmemPoolProps *);
    create_fn pool_create = (create_fn)kiwi_driver_sym("cuMemPoolCreate");
    if (!pool_create)
        return NULL;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props); /* handle type none, no maximum size, reserved zero */
    props.allocType = ALLOCATION_TYPE_MANAGED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; /* the preferred location */
    props.location.id = device;
    CUmemoryPool pool = NULL;
    CUresult result = pool_create(&pool, &props);
    if (result != CUDA_SUCCESS) {
        atomic_store(&unsupported, true);
        kiwi_log("no managed memory pools (CUDA error %d): stream-ordered allocations become "
                 "managed allocations, and their frees wait for their streams", result);
        return NULL;
    }
    kiwi_log("managed memory pool %p for device %d", (void *)pool, device);
    return pool;
}

CUmemoryPool kiwi_pool_of(CUdevice device)
{
    if (!kiwi_cfg.enabled || atomic_load(&unsupported) || device < 0 || device >= MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&pools_lock);
    if (!pools[device])
        pools[device] = create(device);
    CUmemoryPool pool = pools[device];
    pthread_mutex_unlock(&pools_lock);
    return pool;
}

bool kiwi_pool_is_ours(CUmemoryPool pool)
{
    bool ours = false;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < MAX_DEVICES && !ours; i++)
        ours = pool && pools[i] == pool;
    pthread_mutex_unlock(&pools_lock);
    return ours;
}

void kiwi_pool_trim(void)
{
    typedef CUresult (*trim_fn)(CUmemoryPool, size_t);
    trim_fn trim = (trim_fn)kiwi_driver_sym("cuMemPoolTrimTo");
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < MAX_DEVICES && trim; i++)
        if (pools[i])
            trim(pools[i], 0);
    pthread_mutex_unlock(&pools_lock);
}

void kiwi_pool_forget_device(CUdevice device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return;
    pthread_mutex_lock(&pools_lock);
    pools[device] = NULL; /* went with the device's primary context; made again when needed */
    pthread_mutex_unlock(&pools_lock);
}

void kiwi_pool_after_fork(void)
{
    pthread_mutex_init(&pools_lock, NULL);
    memset(pools, 0, sizeof pools);
    atomic_store(&unsupported, false);
}
