/* Every driver entry point the shim replaces, in one list.
 *
 * X(symbol, base, version, per_thread):
 *   symbol      the name libcuda exports, and the name of the shim's replacement;
 *   base        the name a caller passes to cuGetProcAddress, which picks the variant by version;
 *   version     the first CUDA version (1000 * major + 10 * minor) for which base means symbol;
 *   per_thread  1 for the _ptsz/_ptds variant, handed out when the caller asks for the
 *               per-thread default stream (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM).
 *
 * base/version/per_thread are only a fallback: cuGetProcAddress answers are matched first by
 * address against what dlsym finds for each symbol (see interpose/hook.c).
 */
#ifndef KIWI_SHIM_HOOKS_H
#define KIWI_SHIM_HOOKS_H

#define KIWI_PROC_HOOKS(X)                                                \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                     \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)

#define KIWI_MEMORY_HOOKS(X)                                              \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                               \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                     \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                    \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                       \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                  \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)       \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)  \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                 \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                         \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                    \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                           \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                               \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                             \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                   \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                 \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)   \
    X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, 0)           \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0)           \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0) \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0)                   \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0)                 \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0)             \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0)

/* Questions about an address (interpose/pointer.c): under vmm, asked of the shim's own memory,
 * they wait at the gate for the restore while it is away and answer for the allocation the
 * program made, never for a chunk or a slab. */
#define KIWI_ADDRESS_HOOKS(X)                                             \
    X(cuPointerGetAttribute, "cuPointerGetAttribute", 4000, 0)            \
    X(cuPointerGetAttributes, "cuPointerGetAttributes", 7000, 0)          \
    X(cuPointerSetAttribute, "cuPointerSetAttribute", 6000, 0)            \
    X(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 3020, 0)           \
    X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 11070, 0)

/* Graph capture (interpose/capture.c): a release must not synchronize while a capture is open,
 * since cuCtxSynchronize would invalidate it. */
#define KIWI_CAPTURE_HOOKS(X)                                             \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0)             \
    X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 1)        \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0)          \
    X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1)     \
    X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0) \
    X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1) \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0)                 \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1)

/* Contexts (interpose/context.c): destroying one frees what was allocated in it, so the shim
 * forgets those records and the pager's stream there; peer access enabled between two reaches
 * the vmm evictor's mappings too. */
#define KIWI_CONTEXT_HOOKS(X)                                             \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                              \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                           \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)      \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)    \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0) \
    X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0)        \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)    \
    X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, 0)

/* Work that runs on the GPU or moves memory onto it: it waits at the gate until this process
 * holds its GPU. A user's own prefetch is gated too, so an idle kernel cannot pull its pages
 * back while another holds the room. */
#define KIWI_GATED_HOOKS(X)                                               \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                          \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                     \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                     \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)    \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1) \
    X(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0) \
    X(cuLaunch, "cuLaunch", 2000, 0)                                      \
    X(cuLaunchGrid, "cuLaunchGrid", 2000, 0)                              \
    X(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0)                    \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                           \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                      \
    X(cuMemcpy, "cuMemcpy", 4000, 0)                                      \
    X(cuMemcpy_ptds, "cuMemcpy", 7000, 1)                                 \
    X(cuMemcpyAsync, "cuMemcpyAsync", 4000, 0)                            \
    X(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, 1)                       \
    X(cuMemcpyPeer, "cuMemcpyPeer", 4000, 0)                              \
    X(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, 1)                         \
    X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, 0)                    \
    X(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, 1)               \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, 0)                           \
    X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, 1)                      \
    X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, 0)                 \
    X(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, 1)            \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, 0)                           \
    X(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, 1)                      \
    X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, 0)                 \
    X(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 7000, 1)            \
    X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, 0)                           \
    X(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, 1)                      \
    X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, 0)                 \
    X(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, 1)            \
    X(cuMemcpy2D_v2, "cuMemcpy2D", 3020, 0)                               \
    X(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 7000, 1)                          \
    X(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, 0)             \
    X(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 7000, 1)        \
    X(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, 0)                     \
    X(cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 7000, 1)                \
    X(cuMemcpy3D_v2, "cuMemcpy3D", 3020, 0)                               \
    X(cuMemcpy3D_v2_ptds, "cuMemcpy3D", 7000, 1)                          \
    X(cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020, 0)                     \
    X(cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 7000, 1)                \
    X(cuMemcpy3DPeer, "cuMemcpy3DPeer", 4000, 0)                          \
    X(cuMemcpy3DPeer_ptds, "cuMemcpy3DPeer", 7000, 1)                     \
    X(cuMemcpy3DPeerAsync, "cuMemcpy3DPeerAsync", 4000, 0)                \
    X(cuMemcpy3DPeerAsync_ptsz, "cuMemcpy3DPeerAsync", 7000, 1)           \
    X(cuMemcpyDtoA_v2, "cuMemcpyDtoA", 3020, 0)                           \
    X(cuMemcpyDtoA_v2_ptds, "cuMemcpyDtoA", 7000, 1)                      \
    X(cuMemcpyAtoD_v2, "cuMemcpyAtoD", 3020, 0)                           \
    X(cuMemcpyAtoD_v2_ptds, "cuMemcpyAtoD", 7000, 1)                      \
    X(cuMemcpyHtoA_v2, "cuMemcpyHtoA", 3020, 0)                           \
    X(cuMemcpyHtoA_v2_ptds, "cuMemcpyHtoA", 7000, 1)                      \
    X(cuMemcpyAtoH_v2, "cuMemcpyAtoH", 3020, 0)                           \
    X(cuMemcpyAtoH_v2_ptds, "cuMemcpyAtoH", 7000, 1)                      \
    X(cuMemcpyAtoA_v2, "cuMemcpyAtoA", 3020, 0)                           \
    X(cuMemcpyAtoA_v2_ptds, "cuMemcpyAtoA", 7000, 1)                      \
    X(cuMemcpyHtoAAsync_v2, "cuMemcpyHtoAAsync", 3020, 0)                 \
    X(cuMemcpyHtoAAsync_v2_ptsz, "cuMemcpyHtoAAsync", 7000, 1)            \
    X(cuMemcpyAtoHAsync_v2, "cuMemcpyAtoHAsync", 3020, 0)                 \
    X(cuMemcpyAtoHAsync_v2_ptsz, "cuMemcpyAtoHAsync", 7000, 1)            \
    X(cuMemcpyBatchAsync, "cuMemcpyBatchAsync", 12080, 0)                 \
    X(cuMemcpyBatchAsync_ptsz, "cuMemcpyBatchAsync", 12080, 1)            \
    X(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync", 13000, 0)              \
    X(cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000, 1)         \
    X(cuMemcpy3DBatchAsync, "cuMemcpy3DBatchAsync", 12080, 0)             \
    X(cuMemcpy3DBatchAsync_ptsz, "cuMemcpy3DBatchAsync", 12080, 1)        \
    X(cuMemcpy3DBatchAsync_v2, "cuMemcpy3DBatchAsync", 13000, 0)          \
    X(cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000, 1)     \
    X(cuMemcpyWithAttributesAsync, "cuMemcpyWithAttributesAsync", 13020, 0) \
    X(cuMemcpyWithAttributesAsync_ptsz, "cuMemcpyWithAttributesAsync", 13020, 1) \
    X(cuMemcpy3DWithAttributesAsync, "cuMemcpy3DWithAttributesAsync", 13020, 0) \
    X(cuMemcpy3DWithAttributesAsync_ptsz, "cuMemcpy3DWithAttributesAsync", 13020, 1) \
    X(cuMemPrefetchAsync, "cuMemPrefetchAsync", 8000, 0)                  \
    X(cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", 8000, 1)             \
    X(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync", 12020, 0)              \
    X(cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync", 12020, 1)         \
    X(cuMemPrefetchBatchAsync, "cuMemPrefetchBatchAsync", 13000, 0)       \
    X(cuMemPrefetchBatchAsync_ptsz, "cuMemPrefetchBatchAsync", 13000, 1)  \
    X(cuMemDiscardAndPrefetchBatchAsync, "cuMemDiscardAndPrefetchBatchAsync", 13000, 0) \
    X(cuMemDiscardAndPrefetchBatchAsync_ptsz, "cuMemDiscardAndPrefetchBatchAsync", 13000, 1) \
    X(cuMemsetD8_v2, "cuMemsetD8", 3020, 0)                               \
    X(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, 1)                          \
    X(cuMemsetD16_v2, "cuMemsetD16", 3020, 0)                             \
    X(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1)                        \
    X(cuMemsetD32_v2, "cuMemsetD32", 3020, 0)                             \
    X(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, 1)                        \
    X(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, 0)                           \
    X(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, 1)                      \
    X(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, 0)                         \
    X(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, 1)                    \
    X(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, 0)                         \
    X(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, 1)                    \
    X(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0)                        \
    X(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, 1)                   \
    X(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0)                      \
    X(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1)                 \
    X(cuMemsetD32Async, "cuMemsetD32Async", 3020, 0)                      \
    X(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, 1)                 \
    X(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, 0)                    \
    X(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, 1)               \
    X(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, 0)                  \
    X(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, 1)             \
    X(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, 0)                  \
    X(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, 1)            \
    X(cuStreamWriteValue32, "cuStreamWriteValue32", 8000, 0)              \
    X(cuStreamWriteValue32_ptsz, "cuStreamWriteValue32", 8000, 1)         \
    X(cuStreamWriteValue32_v2, "cuStreamWriteValue32", 11070, 0)          \
    X(cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", 11070, 1)     \
    X(cuStreamWriteValue64, "cuStreamWriteValue64", 9000, 0)              \
    X(cuStreamWriteValue64_ptsz, "cuStreamWriteValue64", 9000, 1)         \
    X(cuStreamWriteValue64_v2, "cuStreamWriteValue64", 11070, 0)          \
    X(cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", 11070, 1)     \
    X(cuStreamWaitValue32, "cuStreamWaitValue32", 8000, 0)                \
    X(cuStreamWaitValue32_ptsz, "cuStreamWaitValue32", 8000, 1)           \
    X(cuStreamWaitValue32_v2, "cuStreamWaitValue32", 11070, 0)            \
    X(cuStreamWaitValue32_v2_ptsz, "cuStreamWaitValue32", 11070, 1)       \
    X(cuStreamWaitValue64, "cuStreamWaitValue64", 9000, 0)                \
    X(cuStreamWaitValue64_ptsz, "cuStreamWaitValue64", 9000, 1)           \
    X(cuStreamWaitValue64_v2, "cuStreamWaitValue64", 11070, 0)            \
    X(cuStreamWaitValue64_v2_ptsz, "cuStreamWaitValue64", 11070, 1)       \
    X(cuStreamBatchMemOp, "cuStreamBatchMemOp", 8000, 0)                  \
    X(cuStreamBatchMemOp_ptsz, "cuStreamBatchMemOp", 8000, 1)             \
    X(cuStreamBatchMemOp_v2, "cuStreamBatchMemOp", 11070, 0)              \
    X(cuStreamBatchMemOp_v2_ptsz, "cuStreamBatchMemOp", 11070, 1)

#define KIWI_HOOKS(X) \
    KIWI_PROC_HOOKS(X) KIWI_MEMORY_HOOKS(X) KIWI_ADDRESS_HOOKS(X) KIWI_CAPTURE_HOOKS(X) \
    KIWI_CONTEXT_HOOKS(X) KIWI_GATED_HOOKS(X)

#define KIWI_HOOK_ID(symbol, base, version, per_thread) HOOK_##symbol,
enum kiwi_hook_id { KIWI_HOOKS(KIWI_HOOK_ID) KIWI_HOOK_COUNT };
#undef KIWI_HOOK_ID

#endif
