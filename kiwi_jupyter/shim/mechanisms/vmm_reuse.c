/* Stream-ordered reuse: memory freed in stream order goes to the next allocation of its size
 * class on the same stream at once, as the driver's pool does.
 *
 * PyTorch's cudaMallocAsync backend and CuPy's async pool allocate and free every tensor through
 * the driver (cuMemAllocAsync, cuMemFreeAsync) and leave reuse to its pool. A training loop runs
 * ahead of the GPU: when a tensor is freed, the work queued before the free has usually not run
 * yet, so the memory cannot be handed to just anyone (vmm_frees.c keeps it pending until the free's
 * event completes). But work queued later on the same stream runs after that work, so an
 * allocation on that stream may have it at once. Without this the shim would reserve, create,
 * map and set access for every tensor (tens of microseconds each on a GPU) while the last
 * step's memory waited, and the working set would grow by a step's worth each step.
 *
 * Each pending free that has an event is filed here under the stream it was freed on (with its
 * context; with its thread for the per-thread default stream, which is another stream in each
 * thread), its device and the bytes it takes (its units of a slab, or its region): a hash table
 * of doubly linked lists, so that filing, finding and taking one out are constant time.
 *
 * Size classes make reuse likely when sizes vary from step to step (dynamic shapes): a
 * stream-ordered allocation takes four classes per doubling of slab units (at most a quarter
 * more than asked), and whole granules up to 32 MiB, then eight classes per doubling (at most an
 * eighth more); the working set counts what is taken, so the daemon plans with it.
 */
#define _GNU_SOURCE
#include <string.h>

#include "vmm.h"

#define BUCKETS 1024

static struct vmm_allocation *filed[BUCKETS];

/* value rounded up to one of `per_doubling` classes between each power of two and the next,
 * exact below 2 * per_doubling. */
static size_t classed(size_t value, size_t per_doubling)
{
    if (value <= 2 * per_doubling)
        return value;
    size_t top = (size_t)63 - (size_t)__builtin_clzll(value); /* value >= 2^top */
    size_t step = (size_t)1 << (top - (size_t)__builtin_ctzll(per_doubling));
    return (value + step - 1) / step * step;
}

size_t kiwi_vmm_class_units(size_t size)
{
    size_t units = (size + VMM_UNIT - 1) / VMM_UNIT;
    return classed(units ? units : 1, 4);
}

size_t kiwi_vmm_class_bytes(size_t size, size_t granule)
{
    size_t granules = (size + granule - 1) / granule;
    return (granules <= 16 ? granules : classed(granules, 8)) * granule;
}

struct vmm_stream kiwi_vmm_stream(CUcontext ctx, CUstream stream)
{
    if (stream == CU_STREAM_LEGACY)
        stream = NULL; /* the same legacy default stream, named either way */
    return (struct vmm_stream){ctx, stream,
                               stream == CU_STREAM_PER_THREAD ? pthread_self() : 0};
}

static bool same_stream(const struct vmm_stream *a, const struct vmm_stream *b)
{
    return a->ctx == b->ctx && a->stream == b->stream && pthread_equal(a->thread, b->thread);
}

/* What an allocation takes on the card: its units of a slab, or its region. */
static size_t taken(const struct vmm_allocation *a)
{
    return a->region->slab ? a->unit_count * VMM_UNIT : a->region->size;
}

static size_t bucket(const struct vmm_stream *s, size_t bytes, CUdevice device)
{
    uint64_t h = (uint64_t)(uintptr_t)s->ctx * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uintptr_t)s->stream * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)s->thread * 0x165667B19E3779F9ull;
    h ^= ((uint64_t)bytes + (uint64_t)device) * 0x27D4EB2F165667C5ull;
    return (size_t)(h >> 40) % BUCKETS;
}

void kiwi_vmm_reuse_file(struct vmm_allocation *a)
{
    size_t b = bucket(&a->freed_on, taken(a), a->region->device);
    a->reuse_prev = NULL;
    a->reuse_next = filed[b];
    if (filed[b])
        filed[b]->reuse_prev = a;
    filed[b] = a;
    a->filed = true;
}

void kiwi_vmm_reuse_unfile(struct vmm_allocation *a)
{
    if (!a->filed)
        return;
    if (a->reuse_prev)
        a->reuse_prev->reuse_next = a->reuse_next;
    else
        filed[bucket(&a->freed_on, taken(a), a->region->device)] = a->reuse_next;
    if (a->reuse_next)
        a->reuse_next->reuse_prev = a->reuse_prev;
    a->reuse_next = a->reuse_prev = NULL;
    a->filed = false;
}

struct vmm_allocation *kiwi_vmm_reuse_find(const struct vmm_stream *stream, size_t bytes,
                                           CUdevice device)
{
    for (struct vmm_allocation *a = filed[bucket(stream, bytes, device)]; a; a = a->reuse_next)
        if (same_stream(&a->freed_on, stream) && taken(a) == bytes &&
            a->region->device == device && a->region->ctx == stream->ctx && !a->region->pinned)
            return a;
    return NULL;
}

void kiwi_vmm_reuse_after_fork(void)
{
    memset(filed, 0, sizeof filed); /* the parent's pending frees are not the child's */
}
