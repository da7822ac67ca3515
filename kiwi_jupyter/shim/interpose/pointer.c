/* Questions about an address: cuPointerGetAttribute(s), cuPointerSetAttribute,
 * cuMemGetAddressRange.
 *
 * Under the vmm evictor the program's cuMemAlloc memory is memory the shim maps itself, and
 * the driver would answer for that: for the chunk or the slab the address is in, with a context
 * of none and a buffer id that changes at each restore, and, while the memory is away (evicted:
 * reserved, not mapped), not at all. Triton's launcher asks cuPointerGetAttribute for every
 * tensor argument and gives up on CUDA_ERROR_INVALID_VALUE ("cannot be accessed from Triton");
 * PyTorch's getDeviceFromPtr (torch.as_tensor of a CuPy array) reads cuPointerGetAttributes's
 * memory type; NCCL, UCX and libfabric register the range cuMemGetAddressRange gives and key
 * their caches by BUFFER_ID; cuPointerSetAttribute(SYNC_MEMOPS), which UCX asks, is refused on
 * VMM memory. So for an address inside an allocation the vmm evictor maps:
 *
 * - while any of the allocation is away, the question waits at the gate (as work does) until
 *   the restore has brought it back: what comes next is work on it, and the driver's own answers
 *   (below) need it mapped;
 * - the shim answers from its own table, as the driver would for the allocation the program
 *   asked for: its start and size (RANGE_*, MAPPING_*, cuMemGetAddressRange), its context (none
 *   for a stream-ordered allocation) and device, device memory, not managed, usable by legacy
 *   IPC (interpose/handles.c exports it) unless stream-ordered, its pool, an id of its own for
 *   its life, no shareable handle types, SYNC_MEMOPS as set;
 * - the rest (access flags, GPUDirect RDMA, the physical block's id, ...) is the driver's answer.
 *
 * Any other address goes to the driver unchanged.
 */
#define _GNU_SOURCE
#include <string.h>

#include "interpose.h"

/* The bytes the driver writes for an attribute (as NVIDIA's cuda-python reads them); 0 for one
 * cuda.h does not have, which goes to the driver. */
static size_t width_of(CUpointer_attribute attribute)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
        return sizeof(bool);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        return sizeof(unsigned);
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return sizeof(uint64_t);
    default:
        return 0; /* the driver's to answer */
    }
}

/* Writes the shim's answer for attribute at data; CUDA_ERROR_NOT_FOUND (never a real answer
 * here) for an attribute the driver answers. */
static CUresult own_answer(void *data, CUpointer_attribute attribute, CUdeviceptr ptr,
                           const struct kiwi_vmm_facts *f)
{
    uint64_t wide = 0;
    unsigned narrow = 0;
    bool flag = false;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        wide = (uint64_t)(uintptr_t)f->ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        narrow = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        wide = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return CUDA_ERROR_INVALID_VALUE; /* device memory: no host address */
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        flag = f->sync_memops;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        wide = f->buffer_id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        narrow = (unsigned)f->device;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        flag = !f->stream_ordered; /* cuMemAlloc memory is; a pool's is not */
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        wide = f->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        wide = f->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        flag = true;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        break; /* none: cuMemAlloc memory has no shareable handle */
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        wide = (uint64_t)(uintptr_t)f->pool;
        break;
    default:
        return CUDA_ERROR_NOT_FOUND;
    }
    size_t width = width_of(attribute);
    if (width == sizeof(bool))
        memcpy(data, &flag, width);
    else if (width == sizeof(unsigned))
        memcpy(data, &narrow, width);
    else
        memcpy(data, &wide, width);
    return CUDA_SUCCESS;
}

/* Whether ptr is inside memory the vmm evictor maps (*f: what the shim says of it). While any
 * of it is away the call waits at the gate until the restore has brought it back, and returns
 * inside the gate (*inside: the caller leaves with kiwi_gate_exit once it has asked the
 * driver); *refused: the gate's answer when it refused the wait (fail-closed policy). */
static bool ours(CUdeviceptr ptr, struct kiwi_vmm_facts *f, bool *inside, CUresult *refused)
{
    *inside = false;
    *refused = CUDA_SUCCESS;
    if (!kiwi_cfg.enabled || !kiwi_vmm_facts(ptr, f))
        return false;
    if (!f->away)
        return true;
    *refused = kiwi_gate_enter();
    if (*refused != CUDA_SUCCESS)
        return true;
    *inside = true;
    if (!kiwi_vmm_facts(ptr, f)) { /* freed meanwhile, by another thread */
        kiwi_gate_exit();
        *inside = false;
        return false;
    }
    return true;
}

KIWI_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                           CUdeviceptr ptr)
{
    KIWI_REAL(real, cuPointerGetAttribute);
    struct kiwi_vmm_facts f;
    bool inside;
    CUresult result;
    if (!data || !ours(ptr, &f, &inside, &result))
        return real(data, attribute, ptr);
    if (result != CUDA_SUCCESS)
        return result;
    result = own_answer(data, attribute, ptr, &f);
    if (result == CUDA_ERROR_NOT_FOUND)
        result = real(data, attribute, ptr);
    if (inside)
        kiwi_gate_exit();
    return result;
}

KIWI_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute *attributes,
                                            void **data, CUdeviceptr ptr)
{
    KIWI_REAL(real, cuPointerGetAttributes);
    struct kiwi_vmm_facts f;
    bool inside;
    CUresult result;
    if (!attributes || !data || !ours(ptr, &f, &inside, &result))
        return real(count, attributes, data, ptr);
    if (result != CUDA_SUCCESS)
        return result;
    result = real(count, attributes, data, ptr); /* the driver's answers, and its checks */
    for (unsigned int i = 0; result == CUDA_SUCCESS && i < count; i++) {
        if (data[i] && own_answer(data[i], attributes[i], ptr, &f) == CUDA_ERROR_INVALID_VALUE)
            memset(data[i], 0, width_of(attributes[i])); /* no such answer: the default */
    }
    if (inside)
        kiwi_gate_exit();
    return result;
}

/* SYNC_MEMOPS is the one attribute there is to set. The driver refuses it on VMM memory; the
 * shim keeps it for the allocation and answers it back. (It does not make synchronous copies on
 * that memory wait any longer than the driver makes them: docs/shim.md, "Limits".) */
KIWI_EXPORT CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                           CUdeviceptr ptr)
{
    KIWI_REAL(real, cuPointerSetAttribute);
    struct kiwi_vmm_facts f;
    bool inside;
    CUresult result;
    if (!value || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
        !ours(ptr, &f, &inside, &result))
        return real(value, attribute, ptr);
    if (result != CUDA_SUCCESS)
        return result;
    unsigned int on;
    memcpy(&on, value, sizeof on);
    result = kiwi_vmm_set_sync_memops(ptr, on != 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (inside)
        kiwi_gate_exit();
    return result;
}

KIWI_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    KIWI_REAL(real, cuMemGetAddressRange_v2);
    struct kiwi_vmm_facts f;
    bool inside;
    CUresult result;
    if (!ours(ptr, &f, &inside, &result))
        return real(base, size, ptr);
    if (result != CUDA_SUCCESS)
        return result;
    if (base)
        *base = f.base;
    if (size)
        *size = f.size;
    if (inside)
        kiwi_gate_exit();
    return CUDA_SUCCESS;
}
