/* Legacy CUDA IPC of the memory the vmm evictor maps: cuIpcGetMemHandle, cuIpcOpenMemHandle and
 * cuIpcCloseMemHandle, which PyTorch's sharing of CUDA tensors between processes
 * (torch.multiprocessing) and NCCL's legacy registration use.
 *
 * The driver's legacy IPC works on cuMemAlloc memory only; memory mapped with the VMM API is
 * shared another way: each physical handle exported as a POSIX file descriptor, which the other
 * process takes (pidfd_getfd) and imports, as PyTorch's expandable segments share theirs. So the
 * shim exports on demand and writes a handle of its own, of the legacy handle's 64 bytes:
 *
 * - Exporter: the allocation's region (its slab, for a small one) has each chunk exported and a
 *   manifest written (a memfd: the chunks' offsets, sizes and descriptors). From then on the
 *   region stays where it is, pinned and counted as not evictable: the importer's mapping holds
 *   the physical memory, and a restore into new memory would part the two. The shim says so.
 * - Importer running the shim (any process started from a Kiwi kernel, as torch.multiprocessing
 *   starts its workers): cuIpcOpenMemHandle recognizes the handle, takes the manifest and each
 *   chunk's descriptor from the exporter, imports and maps them at addresses of its own (access
 *   for its current device) and answers the allocation's address there; opening the same handle
 *   again answers the same address, and cuIpcCloseMemHandle unmaps it after the last close.
 *   Taking another process's descriptor needs ptrace access to it (same user; Yama's
 *   ptrace_scope 0, or CAP_SYS_PTRACE), as PyTorch's expandable segments need: refused, the
 *   open fails with CUDA_ERROR_INVALID_VALUE and says why.
 * - Importer without the shim: the driver cannot read the shim's handle and refuses it. The
 *   exporter says that too, once: run the importer with the shim, or the exporter with
 *   KIWI_EVICT=checkpoint (whose memory is cuMemAlloc's).
 *
 * The importer's mapping is not its own memory: not counted in its working set, never evicted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmm.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#define MAGIC "KIWIVMM1"
#define MAX_CHUNKS 65536

/* The handle, in the legacy handle's 64 bytes. */
struct shared_handle {
    char magic[8];
    int32_t pid;      /* the exporter */
    int32_t manifest; /* the manifest's descriptor, in the exporter */
    uint64_t token;   /* the manifest's: a handle of a region since freed is refused */
    uint64_t offset;  /* of the allocation, in the region */
    uint64_t size;    /* of the allocation */
    uint64_t region_size;
    char reserved[16];
};
_Static_assert(sizeof(struct shared_handle) == sizeof(CUipcMemHandle), "a legacy handle");

struct manifest_head {
    char magic[8];
    uint64_t token;
    uint64_t region_size;
    uint32_t chunks;
    uint32_t reserved;
};

struct manifest_entry {
    uint64_t offset;
    uint64_t size;
    int32_t fd; /* in the exporter */
    int32_t reserved;
};

/* What this process opened of another's memory. */
struct import {
    struct import *next;
    int32_t pid;
    uint64_t token;
    CUdeviceptr va, ptr;
    uint64_t region_size;
    uint32_t chunk_count;
    struct manifest_entry *chunks; /* where each is mapped, for the unmap */
    int opens;
};

static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct import *imports;

/* ---- the exporter -------------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: r's chunks exported and listed in a manifest; false when the driver
 * cannot export them (made without the exportable type) or host resources ran out. */
static bool export_region(struct vmm_region *r)
{
    if (!kiwi_vmm_driver.export_fd)
        return false;
    struct vmm_export *e = calloc(1, sizeof *e + (size_t)r->chunk_count * sizeof(int));
    if (!e)
        return false;
    e->manifest = memfd_create("kiwi-ipc-manifest", MFD_CLOEXEC);
    bool ok = e->manifest >= 0 && getrandom(&e->token, sizeof e->token, 0) == sizeof e->token;
    struct manifest_head head = {.token = e->token, .region_size = r->size,
                                 .chunks = (uint32_t)r->chunk_count};
    memcpy(head.magic, MAGIC, sizeof head.magic);
    ok = ok && pwrite(e->manifest, &head, sizeof head, 0) == (ssize_t)sizeof head;
    for (int i = 0; i < r->chunk_count; i++) {
        e->chunk_fds[i] = -1;
        const struct vmm_chunk *c = &r->chunks[i];
        ok = ok && kiwi_vmm_driver.export_fd(&e->chunk_fds[i], c->handle,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                       CUDA_SUCCESS;
        struct manifest_entry entry = {c->offset, c->size, e->chunk_fds[i], 0};
        off_t at = (off_t)(sizeof head + (size_t)i * sizeof entry);
        ok = ok && pwrite(e->manifest, &entry, sizeof entry, at) == (ssize_t)sizeof entry;
    }
    if (!ok) {
        for (int i = 0; i < r->chunk_count; i++)
            if (e->chunk_fds[i] >= 0)
                close(e->chunk_fds[i]);
        if (e->manifest >= 0)
            close(e->manifest);
        free(e);
        return false;
    }
    r->export = e;
    return true;
}

CUresult kiwi_vmm_ipc_export(CUdeviceptr ptr, CUipcMemHandle *handle)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&kiwi_vmm_lock);
    CUdeviceptr base = 0;
    size_t size = 0;
    struct vmm_region *r = kiwi_vmm_allocation_region(ptr, &base, &size);
    bool away = false;
    for (int i = 0; r && i < r->chunk_count; i++)
        away = away || !r->chunks[i].resident;
    CUresult result = !r ? CUDA_ERROR_INVALID_VALUE : away ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    if (result == CUDA_SUCCESS && !r->export && !export_region(r))
        result = CUDA_ERROR_NOT_SUPPORTED;
    if (result == CUDA_SUCCESS) {
        kiwi_vmm_pin(r, "legacy IPC shares");
        struct shared_handle made = {.pid = (int32_t)getpid(), .manifest = r->export->manifest,
                                     .token = r->export->token, .offset = base - r->va,
                                     .size = size, .region_size = r->size};
        memcpy(made.magic, MAGIC, sizeof made.magic);
        memcpy(handle, &made, sizeof made);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (result == CUDA_SUCCESS) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            kiwi_warn("cuIpcGetMemHandle: memory the shim maps (KIWI_EVICT=vmm) is shared "
                      "through a handle of the shim's: it stays on the GPU from now on (not "
                      "evictable), and only processes running the Kiwi shim can open it (run "
                      "this process with KIWI_EVICT=checkpoint to share with others)");
    } else if (result == CUDA_ERROR_NOT_SUPPORTED) {
        kiwi_warn("cuIpcGetMemHandle: the driver cannot export the memory at 0x%llx (made "
                  "without an exportable handle type); run this process with "
                  "KIWI_EVICT=checkpoint to share it", (unsigned long long)ptr);
    }
    return result;
}

/* ---- the importer -------------------------------------------------------------------------- */

/* Another process's descriptor, duplicated into this one; -1 (errno set) when refused. */
static int take_fd(int pidfd, int fd)
{
    return (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
}

static void unmap_import(const struct import *m, uint32_t mapped)
{
    for (uint32_t i = 0; i < mapped; i++)
        kiwi_vmm_driver.unmap(m->va + m->chunks[i].offset, m->chunks[i].size);
    kiwi_vmm_driver.address_free(m->va, m->region_size);
}

/* Maps m's chunks (m->chunks read from the manifest) at new addresses; the CUresult. */
static CUresult map_import(struct import *m, int pidfd, CUdevice device)
{
    size_t granule = kiwi_vmm_granularity(device);
    if (!granule || m->region_size % granule)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = kiwi_vmm_driver.reserve(&m->va, m->region_size, granule, 0, 0);
    if (result != CUDA_SUCCESS)
        return result;
    uint32_t mapped = 0;
    for (; result == CUDA_SUCCESS && mapped < m->chunk_count; mapped++) {
        const struct manifest_entry *c = &m->chunks[mapped];
        int fd = take_fd(pidfd, c->fd);
        CUmemGenericAllocationHandle h = 0;
        result = fd < 0 ? CUDA_ERROR_INVALID_VALUE
                        : kiwi_vmm_driver.import_fd(&h, (void *)(intptr_t)fd,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (fd >= 0)
            close(fd);
        if (result == CUDA_SUCCESS) {
            result = kiwi_vmm_driver.map(m->va + c->offset, c->size, 0, h, 0);
            kiwi_vmm_driver.release(h); /* the mapping holds it now */
        }
        if (result != CUDA_SUCCESS)
            break;
    }
    if (result == CUDA_SUCCESS)
        result = kiwi_vmm_give_access(m->va, m->region_size, device);
    if (result != CUDA_SUCCESS)
        unmap_import(m, mapped);
    return result;
}

/* Reads the manifest the handle names, from the exporter, into m. */
static CUresult read_manifest(struct import *m, int pidfd, const struct shared_handle *h)
{
    int manifest = take_fd(pidfd, h->manifest);
    if (manifest < 0) {
        kiwi_warn("cuIpcOpenMemHandle: cannot take the memory process %d shared (%s): this "
                  "process needs ptrace access to it (the same user, and kernel.yama."
                  "ptrace_scope 0 or CAP_SYS_PTRACE)", h->pid, strerror(errno));
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct manifest_head head;
    bool ok = pread(manifest, &head, sizeof head, 0) == (ssize_t)sizeof head &&
              memcmp(head.magic, MAGIC, sizeof head.magic) == 0 && head.token == h->token &&
              head.region_size == h->region_size && head.chunks && head.chunks <= MAX_CHUNKS &&
              h->offset < h->region_size && h->size <= h->region_size - h->offset;
    m->chunks = ok ? calloc(head.chunks, sizeof *m->chunks) : NULL;
    ssize_t bytes = (ssize_t)(head.chunks * sizeof *m->chunks);
    ok = m->chunks && pread(manifest, m->chunks, (size_t)bytes, sizeof head) == bytes;
    close(manifest);
    for (uint32_t i = 0; ok && i < head.chunks; i++) /* the chunks tile the region */
        ok = m->chunks[i].size && m->chunks[i].offset <= h->region_size &&
             m->chunks[i].size <= h->region_size - m->chunks[i].offset &&
             (i == 0 ? m->chunks[i].offset == 0
                     : m->chunks[i].offset == m->chunks[i - 1].offset + m->chunks[i - 1].size);
    ok = ok && m->chunks[head.chunks - 1].offset + m->chunks[head.chunks - 1].size ==
                   h->region_size;
    if (!ok) {
        free(m->chunks);
        m->chunks = NULL;
        return CUDA_ERROR_INVALID_VALUE; /* freed since, or not a manifest of the shim's */
    }
    m->chunk_count = head.chunks;
    return CUDA_SUCCESS;
}

CUresult kiwi_vmm_ipc_import(const CUipcMemHandle *handle, CUdeviceptr *ptr)
{
    struct shared_handle h;
    memcpy(&h, handle, sizeof h);
    if (memcmp(h.magic, MAGIC, sizeof h.magic) != 0)
        return CUDA_ERROR_NOT_FOUND; /* the driver's own */
    if (!ptr || h.pid == (int32_t)getpid() || !kiwi_vmm_resolve() || !kiwi_vmm_driver.import_fd)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&imports_lock);
    struct import *m = imports;
    while (m && (m->pid != h.pid || m->token != h.token))
        m = m->next;
    CUresult result = CUDA_SUCCESS;
    if (!m) {
        CUdevice device = 0;
        if (kiwi_pager_driver.ctx_device)
            kiwi_pager_driver.ctx_device(&device);
        int pidfd = (int)syscall(SYS_pidfd_open, h.pid, 0);
        m = calloc(1, sizeof *m);
        result = pidfd < 0 || !m ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        if (pidfd < 0)
            kiwi_warn("cuIpcOpenMemHandle: process %d, which shared the memory, is gone (%s)",
                      h.pid, strerror(errno));
        if (result == CUDA_SUCCESS) {
            *m = (struct import){.pid = h.pid, .token = h.token, .region_size = h.region_size};
            result = read_manifest(m, pidfd, &h);
        }
        if (result == CUDA_SUCCESS)
            result = map_import(m, pidfd, device);
        if (pidfd >= 0)
            close(pidfd);
        if (result == CUDA_SUCCESS) {
            m->ptr = m->va + h.offset;
            m->next = imports;
            imports = m;
        } else if (m) {
            free(m->chunks);
            free(m);
            m = NULL;
        }
    }
    if (m) {
        m->opens++;
        *ptr = m->ptr;
    }
    pthread_mutex_unlock(&imports_lock);
    return result;
}

CUresult kiwi_vmm_ipc_close(CUdeviceptr ptr)
{
    pthread_mutex_lock(&imports_lock);
    struct import **p = &imports;
    while (*p && (*p)->ptr != ptr)
        p = &(*p)->next;
    struct import *m = *p;
    bool found = m != NULL;
    if (m && --m->opens == 0) {
        *p = m->next;
        unmap_import(m, m->chunk_count);
        free(m->chunks);
        free(m);
    }
    pthread_mutex_unlock(&imports_lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

void kiwi_vmm_ipc_after_fork(void)
{
    /* A forked child cannot use its parent's mappings; the records are left behind. */
    pthread_mutex_init(&imports_lock, NULL);
    imports = NULL;
}
