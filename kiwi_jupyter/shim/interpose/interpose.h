/* What the entry points share. They are the top of the shim, called by the process and by
 * nothing inside the shim: each takes a driver call, asks the mechanisms below
 * (../mechanisms/, declared in ../shim.h and memory.h) and calls the driver.
 */
#ifndef KIWI_INTERPOSE_H
#define KIWI_INTERPOSE_H

#include "../mechanisms/memory.h"

/* ---- alloc.c ----------------------------------------------------------------------------- */

/* Allocates size bytes of device memory, within the limit, as the evictor pages it: memory the
 * vmm evictor maps, managed memory, or (checkpoint) device memory as asked; in the calling
 * thread's context. */
CUresult kiwi_memory_allocate(CUdeviceptr *dptr, size_t size);
/* The same in ctx on device (kiwi_pager_note_context's); order: a stream-ordered allocation's
 * pool and stream (NULL for the others). */
CUresult kiwi_memory_allocate_in(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                                 const struct kiwi_stream_order *order);

/* ---- alloc_async.c ----------------------------------------------------------------------- */

/* Is the stream being captured into a CUDA graph? */
bool kiwi_memory_capturing(CUstream stream);

#endif
