/* The few CUDA driver types and constants the shim touches.
 *
 * Declared here rather than taken from cuda.h so that the shim builds on any machine with a C
 * compiler: notebook images and CI runners do not carry the CUDA toolkit. Every type is either
 * an integer of the driver's documented width or an opaque pointer, so these declarations are
 * ABI-identical to cuda.h's for CUDA 11.3 through 13.
 */
#ifndef KIWI_SHIM_DRIVER_H
#define KIWI_SHIM_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* 64-bit on every platform CUDA 12 supports */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef int CUdriverProcAddressQueryResult;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
};

#define CU_MEM_ATTACH_GLOBAL 0x1u
#define CU_DEVICE_CPU ((CUdevice)-1)
#define CU_STREAM_NON_BLOCKING 0x1u
/* cuGetProcAddress flags: which default-stream flavour of an entry point the caller wants. */
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2u

#endif
