/* The few CUDA driver types and constants the shim touches.
 *
 * Declared here rather than taken from cuda.h so that the shim builds on any machine with a C
 * compiler: notebook images and CI runners do not carry the CUDA toolkit. Every type is either
 * an integer of the driver's documented width or a pointer to a struct named by cuda.h's own
 * tag, so these declarations are ABI-identical to cuda.h's for CUDA 11.3 through 13.
 *
 * The tests hold the shim to that: they compile it again with KIWI_CHECK_CUDA_H against the
 * cuda.h of the CUDA 12 and CUDA 13 runtime wheels, where the compiler compares each
 * replacement's prototype with the driver's own declaration.
 */
#ifndef KIWI_SHIM_DRIVER_H
#define KIWI_SHIM_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#ifdef KIWI_CHECK_CUDA_H
/* Declare every versioned entry point too (cuMemAlloc_v2, cuLaunchKernel_ptsz, ...). */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#else

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* 64-bit on every platform CUDA 12 supports */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUarray_st *CUarray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef int CUstreamCaptureMode;   /* an enum in cuda.h: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2 */
typedef int CUstreamCaptureStatus; /* NONE 0, ACTIVE 1, INVALIDATED 2 */
typedef int CUdriverProcAddressQueryResult;

/* Passed by value (cuMemPrefetchAsync_v2), so complete; type is an enum of int width. */
typedef struct CUmemLocation_st {
    int type;
    int id;
} CUmemLocation;

/* Filled in by the shim (mechanisms/pools.c); CUDA 13 names the reserved bytes' first one
 * gpuDirectRDMACapable. allocType and handleTypes are enums of int width. */
typedef struct CUmemPoolProps_st {
    int allocType;
    int handleTypes;
    struct CUmemLocation_st location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* The virtual memory management API's properties (the vmm evictor fills them in: mechanisms/
 * vmm_chunks.c), laid out and named as cuda.h does; type, requestedHandleTypes and flags are
 * enums of int width. */
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    struct CUmemLocation_st location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    struct CUmemLocation_st location;
    int flags;
} CUmemAccessDesc;

typedef int CUmemAllocationGranularity_flags; /* MINIMUM 0, RECOMMENDED 1 */
typedef int CUpointer_attribute;
typedef int CUmemRangeHandleType;
typedef int CUdevice_attribute;
typedef int CUmemPool_attribute;

/* A legacy IPC handle: 64 opaque bytes, passed by value (cuIpcOpenMemHandle). */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

/* Passed through by pointer only; the shim never looks inside. */
typedef struct CUlaunchConfig_st CUlaunchConfig;
typedef struct CUDA_MEMCPY2D_st CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_PEER_st CUDA_MEMCPY3D_PEER;
typedef struct CUmemcpyAttributes_st CUmemcpyAttributes;
typedef struct CUDA_MEMCPY3D_BATCH_OP_st CUDA_MEMCPY3D_BATCH_OP;
typedef struct CUDA_LAUNCH_PARAMS_st CUDA_LAUNCH_PARAMS;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef union CUstreamBatchMemOpParams_union CUstreamBatchMemOpParams;

/* cuDeviceGetUuid's answer: the 16 bytes NVML prints as GPU-xxxxxxxx-xxxx-... */
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* cuPointerGetAttribute's questions the shim answers itself for the memory it maps
 * (interpose/pointer.c); the others it passes on. */
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_P2P_TOKENS = 5,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
    CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
    CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
    CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,
    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID = 20,
    CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE = 21,
    CU_POINTER_ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL = 22,
};
#define CU_MEMORYTYPE_DEVICE 0x2

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_UNKNOWN = 999,
};

#define CU_MEM_ATTACH_GLOBAL 0x1u
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_MEMHOSTREGISTER_PORTABLE 0x01u
/* cuMemPoolGetAttribute's counters: what a framework reads of a pool's memory. */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 0x5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 0x6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 0x7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 0x8
#define CU_DEVICE_CPU ((CUdevice)-1)
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_LOCATION_TYPE_HOST 0x2
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
/* cuGetProcAddress flags: which default-stream flavour of an entry point the caller wants. */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2u
/* The per-thread default stream's handle: what stream 0 means to a _ptsz entry point. */
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
/* The legacy default stream, named: what stream 0 means to the others. */
#define CU_STREAM_LEGACY ((CUstream)0x1)

#endif /* KIWI_CHECK_CUDA_H */
#endif
