/* The vmm evictor's per-context resources: a second stream for moves (the two copy engines,
 * one each way, want two streams), and spare events, so that a stream-ordered free or a move
 * does not create one each time. A context's go with it.
 */
#define _GNU_SOURCE
#include "vmm.h"

#define MAX_CONTEXTS 16
#define SPARE_EVENTS 64

struct vmm_context {
    CUcontext ctx;
    CUstream stream;
    CUevent spare[SPARE_EVENTS];
    int spare_count;
};
static struct vmm_context contexts[MAX_CONTEXTS];
static int context_count;

static struct vmm_context *context_of(CUcontext ctx, bool make)
{
    for (int i = 0; i < context_count; i++)
        if (contexts[i].ctx == ctx)
            return &contexts[i];
    if (!make || context_count == MAX_CONTEXTS)
        return NULL;
    contexts[context_count] = (struct vmm_context){.ctx = ctx};
    return &contexts[context_count++];
}

CUstream kiwi_vmm_second_stream(CUcontext ctx)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && !c->stream &&
        kiwi_pager_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        c->stream = NULL;
    return c ? c->stream : NULL;
}

CUevent kiwi_vmm_event_take(CUcontext ctx)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && c->spare_count)
        return c->spare[--c->spare_count];
    CUevent event = NULL;
    if (kiwi_vmm_driver.event_create(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return event;
}

void kiwi_vmm_event_give(CUcontext ctx, CUevent event)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && c->spare_count < SPARE_EVENTS)
        c->spare[c->spare_count++] = event;
    else
        kiwi_vmm_driver.event_destroy(event);
}

void kiwi_vmm_contexts_forget(CUcontext ctx)
{
    struct vmm_context *c = context_of(ctx, false);
    if (c)
        *c = contexts[--context_count]; /* its stream and events went with it */
}

void kiwi_vmm_contexts_after_fork(void)
{
    context_count = 0;
}
