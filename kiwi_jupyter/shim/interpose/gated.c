/* The driver calls that put work on the GPU: kernel launches, graph launches, copies, memsets
 * and stream memory operations. Each waits at the gate until this process holds its GPU, then
 * calls the driver.
 *
 * Synchronization calls (cuCtxSynchronize, cuStreamSynchronize, events) are not gated: they
 * start no work, and a thread waiting on its own earlier work must not be held up by the gate
 * while the comm thread drains that same work.
 */
#include "interpose.h"

#define GATED(symbol, params, args)                                        \
    KIWI_EXPORT CUresult symbol params;                                    \
    KIWI_EXPORT CUresult symbol params                                     \
    {                                                                      \
        KIWI_REAL(real, symbol);                                           \
        CUresult refused = kiwi_gate_enter();                              \
        if (refused != CUDA_SUCCESS)                                       \
            return refused;                                                \
        CUresult result = real args;                                       \
        kiwi_gate_exit();                                                  \
        return result;                                                     \
    }

/* Both default-stream flavours share one signature; _ptsz/_ptds name the per-thread one. */
#define GATED2(symbol, suffix, params, args) \
    GATED(symbol, params, args)              \
    GATED(symbol##suffix, params, args)

#define LAUNCH_PARAMS                                                               \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
     unsigned bz, unsigned shared, CUstream stream, void **params, void **extra)
#define LAUNCH_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define COOPERATIVE_PARAMS                                                          \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
     unsigned bz, unsigned shared, CUstream stream, void **params)
#define COOPERATIVE_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

GATED2(cuLaunchKernel, _ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)
GATED2(cuLaunchKernelEx, _ptsz,
       (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
       (config, f, params, extra))
GATED2(cuLaunchCooperativeKernel, _ptsz, COOPERATIVE_PARAMS, COOPERATIVE_ARGS)
GATED(cuLaunchCooperativeKernelMultiDevice,
      (CUDA_LAUNCH_PARAMS *list, unsigned int devices, unsigned int flags),
      (list, devices, flags))
/* The launch API before CUDA 4, deprecated but still exported. */
GATED(cuLaunch, (CUfunction f), (f))
GATED(cuLaunchGrid, (CUfunction f, int width, int height), (f, width, height))
GATED(cuLaunchGridAsync, (CUfunction f, int width, int height, CUstream s),
      (f, width, height, s))
GATED2(cuGraphLaunch, _ptsz, (CUgraphExec graph, CUstream stream), (graph, stream))

GATED2(cuMemcpy, _ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))
GATED2(cuMemcpyAsync, _ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
       (dst, src, n, s))
GATED2(cuMemcpyPeer, _ptds,
       (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n),
       (dst, dctx, src, sctx, n))
GATED2(cuMemcpyPeerAsync, _ptsz,
       (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n,
        CUstream s),
       (dst, dctx, src, sctx, n, s))
GATED2(cuMemcpyHtoD_v2, _ptds, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n))
GATED2(cuMemcpyHtoDAsync_v2, _ptsz,
       (CUdeviceptr dst, const void *src, size_t n, CUstream s), (dst, src, n, s))
GATED2(cuMemcpyDtoH_v2, _ptds, (void *dst, CUdeviceptr src, size_t n), (dst, src, n))
GATED2(cuMemcpyDtoHAsync_v2, _ptsz, (void *dst, CUdeviceptr src, size_t n, CUstream s),
       (dst, src, n, s))
GATED2(cuMemcpyDtoD_v2, _ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))
GATED2(cuMemcpyDtoDAsync_v2, _ptsz,
       (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
GATED2(cuMemcpy2D_v2, _ptds, (const CUDA_MEMCPY2D *copy), (copy))
GATED2(cuMemcpy2DUnaligned_v2, _ptds, (const CUDA_MEMCPY2D *copy), (copy))
GATED2(cuMemcpy2DAsync_v2, _ptsz, (const CUDA_MEMCPY2D *copy, CUstream s), (copy, s))
GATED2(cuMemcpy3D_v2, _ptds, (const CUDA_MEMCPY3D *copy), (copy))
GATED2(cuMemcpy3DAsync_v2, _ptsz, (const CUDA_MEMCPY3D *copy, CUstream s), (copy, s))
GATED2(cuMemcpy3DPeer, _ptds, (const CUDA_MEMCPY3D_PEER *copy), (copy))
GATED2(cuMemcpy3DPeerAsync, _ptsz, (const CUDA_MEMCPY3D_PEER *copy, CUstream s), (copy, s))

/* CUDA arrays (textures): the runtime goes through cuMemcpy2D/3D, direct driver users may not. */
GATED2(cuMemcpyDtoA_v2, _ptds, (CUarray dst, size_t offset, CUdeviceptr src, size_t n),
       (dst, offset, src, n))
GATED2(cuMemcpyAtoD_v2, _ptds, (CUdeviceptr dst, CUarray src, size_t offset, size_t n),
       (dst, src, offset, n))
GATED2(cuMemcpyHtoA_v2, _ptds, (CUarray dst, size_t offset, const void *src, size_t n),
       (dst, offset, src, n))
GATED2(cuMemcpyAtoH_v2, _ptds, (void *dst, CUarray src, size_t offset, size_t n),
       (dst, src, offset, n))
GATED2(cuMemcpyAtoA_v2, _ptds,
       (CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t n),
       (dst, dst_offset, src, src_offset, n))
GATED2(cuMemcpyHtoAAsync_v2, _ptsz,
       (CUarray dst, size_t offset, const void *src, size_t n, CUstream s),
       (dst, offset, src, n, s))
GATED2(cuMemcpyAtoHAsync_v2, _ptsz, (void *dst, CUarray src, size_t offset, size_t n, CUstream s),
       (dst, src, offset, n, s))

/* CUDA 12.8 batches; CUDA 13's _v2 drops the failIdx argument. CUDA 13.2 adds single copies
 * with attributes. */
GATED2(cuMemcpyBatchAsync, _ptsz,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
        CUmemcpyAttributes *attrs, size_t *attr_indexes, size_t attr_count, size_t *fail_index,
        CUstream s),
       (dsts, srcs, sizes, count, attrs, attr_indexes, attr_count, fail_index, s))
GATED2(cuMemcpyBatchAsync_v2, _ptsz,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
        CUmemcpyAttributes *attrs, size_t *attr_indexes, size_t attr_count, CUstream s),
       (dsts, srcs, sizes, count, attrs, attr_indexes, attr_count, s))
GATED2(cuMemcpy3DBatchAsync, _ptsz,
       (size_t count, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail_index, unsigned long long flags,
        CUstream s),
       (count, ops, fail_index, flags, s))
GATED2(cuMemcpy3DBatchAsync_v2, _ptsz,
       (size_t count, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags, CUstream s),
       (count, ops, flags, s))

GATED2(cuMemcpyWithAttributesAsync, _ptsz,
       (CUdeviceptr dst, CUdeviceptr src, size_t n, CUmemcpyAttributes *attrs, CUstream s),
       (dst, src, n, attrs, s))
GATED2(cuMemcpy3DWithAttributesAsync, _ptsz,
       (CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags, CUstream s), (op, flags, s))

GATED2(cuMemPrefetchAsync, _ptsz, (CUdeviceptr d, size_t n, CUdevice device, CUstream s),
       (d, n, device, s))
GATED2(cuMemPrefetchAsync_v2, _ptsz,
       (CUdeviceptr d, size_t n, CUmemLocation where, unsigned int flags, CUstream s),
       (d, n, where, flags, s))
#define PREFETCH_BATCH_PARAMS                                                            \
    (CUdeviceptr * ptrs, size_t * sizes, size_t count, CUmemLocation * locations,       \
     size_t * location_indexes, size_t location_count, unsigned long long flags, CUstream s)
#define PREFETCH_BATCH_ARGS \
    (ptrs, sizes, count, locations, location_indexes, location_count, flags, s)
GATED2(cuMemPrefetchBatchAsync, _ptsz, PREFETCH_BATCH_PARAMS, PREFETCH_BATCH_ARGS)
GATED2(cuMemDiscardAndPrefetchBatchAsync, _ptsz, PREFETCH_BATCH_PARAMS, PREFETCH_BATCH_ARGS)

GATED2(cuMemsetD8_v2, _ptds, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
GATED2(cuMemsetD16_v2, _ptds, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n))
GATED2(cuMemsetD32_v2, _ptds, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))
GATED2(cuMemsetD2D8_v2, _ptds,
       (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h), (d, pitch, v, w, h))
GATED2(cuMemsetD2D16_v2, _ptds,
       (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h), (d, pitch, v, w, h))
GATED2(cuMemsetD2D32_v2, _ptds,
       (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h), (d, pitch, v, w, h))
GATED2(cuMemsetD8Async, _ptsz, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),
       (d, v, n, s))
GATED2(cuMemsetD16Async, _ptsz, (CUdeviceptr d, unsigned short v, size_t n, CUstream s),
       (d, v, n, s))
GATED2(cuMemsetD32Async, _ptsz, (CUdeviceptr d, unsigned int v, size_t n, CUstream s),
       (d, v, n, s))
GATED2(cuMemsetD2D8Async, _ptsz,
       (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s),
       (d, pitch, v, w, h, s))
GATED2(cuMemsetD2D16Async, _ptsz,
       (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s),
       (d, pitch, v, w, h, s))
GATED2(cuMemsetD2D32Async, _ptsz,
       (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s),
       (d, pitch, v, w, h, s))

/* Stream memory operations write to (or wait on) device memory from a stream: work on the GPU
 * like a memset, and a wait parks a stream until another process's kernel could write, so each
 * is gated. CUDA 11.7's _v2 of each has the same prototype. */
#define STREAM_VALUE32_PARAMS \
    (CUstream s, CUdeviceptr address, cuuint32_t value, unsigned int flags)
#define STREAM_VALUE64_PARAMS \
    (CUstream s, CUdeviceptr address, cuuint64_t value, unsigned int flags)
#define STREAM_VALUE_ARGS (s, address, value, flags)
#define BATCH_MEM_OP_PARAMS \
    (CUstream s, unsigned int count, CUstreamBatchMemOpParams *ops, unsigned int flags)
#define BATCH_MEM_OP_ARGS (s, count, ops, flags)
GATED2(cuStreamWriteValue32, _ptsz, STREAM_VALUE32_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWriteValue32_v2, _ptsz, STREAM_VALUE32_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWriteValue64, _ptsz, STREAM_VALUE64_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWriteValue64_v2, _ptsz, STREAM_VALUE64_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWaitValue32, _ptsz, STREAM_VALUE32_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWaitValue32_v2, _ptsz, STREAM_VALUE32_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWaitValue64, _ptsz, STREAM_VALUE64_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamWaitValue64_v2, _ptsz, STREAM_VALUE64_PARAMS, STREAM_VALUE_ARGS)
GATED2(cuStreamBatchMemOp, _ptsz, BATCH_MEM_OP_PARAMS, BATCH_MEM_OP_ARGS)
GATED2(cuStreamBatchMemOp_v2, _ptsz, BATCH_MEM_OP_PARAMS, BATCH_MEM_OP_ARGS)
