/* What the entry points share. They are the top of the shim, called by the process and by
 * nothing inside the shim: each takes a driver call, asks the mechanisms below
 * (../mechanisms/, declared in ../shim.h and memory.h) and calls the driver.
 */
#ifndef KIWI_INTERPOSE_H
#define KIWI_INTERPOSE_H

#include "../mechanisms/memory.h"

/* ---- alloc.c ----------------------------------------------------------------------------- */

/* Allocates size bytes of device memory, within the limit, as the evictor pages it: memory the
 * vmm evictor maps, managed memory, or (checkpoint) device memory as asked. pool: the pool a
 * stream-ordered allocation came from (NULL for the others). */
CUresult kiwi_memory_allocate(CUdeviceptr *dptr, size_t size, CUmemoryPool pool);

/* ---- alloc_async.c ----------------------------------------------------------------------- */

/* Is the stream being captured into a CUDA graph? */
bool kiwi_memory_capturing(CUstream stream);

#endif
