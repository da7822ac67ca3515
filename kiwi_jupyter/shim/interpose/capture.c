/* Graph capture's entry points: a capture beginning or ending on a stream. What they note
 * (mechanisms/captures.c) holds a release off while any capture is open, since the release's
 * synchronization would invalidate it.
 */
#define _GNU_SOURCE
#include "interpose.h"

/* The first calls (CUDA 10.0) name no mode: taken as global, the strictest. */
#define GLOBAL_MODE 0

#define BEGIN_CAPTURE(symbol, per_thread, params, args, mode_of_it)        \
    KIWI_EXPORT CUresult symbol params;                                    \
    KIWI_EXPORT CUresult symbol params                                     \
    {                                                                      \
        KIWI_REAL(real, symbol);                                           \
        if (!kiwi_cfg.enabled)                                             \
            return real args;                                              \
        kiwi_capture_beginning();                                          \
        CUresult result = real args;                                       \
        kiwi_capture_began(kiwi_stream(stream, per_thread),                \
                           result == CUDA_SUCCESS, mode_of_it);            \
        return result;                                                     \
    }

BEGIN_CAPTURE(cuStreamBeginCapture, false, (CUstream stream), (stream), GLOBAL_MODE)
BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, true, (CUstream stream), (stream), GLOBAL_MODE)
BEGIN_CAPTURE(cuStreamBeginCapture_v2, false, (CUstream stream, CUstreamCaptureMode mode),
              (stream, mode), mode)
BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, true, (CUstream stream, CUstreamCaptureMode mode),
              (stream, mode), mode)
#define TO_GRAPH_PARAMS                                                                   \
    (CUstream stream, CUgraph graph, const CUgraphNode *dependencies,                     \
     const CUgraphEdgeData *edges, size_t count, CUstreamCaptureMode mode)
#define TO_GRAPH_ARGS (stream, graph, dependencies, edges, count, mode)
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, false, TO_GRAPH_PARAMS, TO_GRAPH_ARGS, mode)
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, true, TO_GRAPH_PARAMS, TO_GRAPH_ARGS, mode)

#define END_CAPTURE(symbol, per_thread)                                                 \
    KIWI_EXPORT CUresult symbol(CUstream stream, CUgraph *graph);                       \
    KIWI_EXPORT CUresult symbol(CUstream stream, CUgraph *graph)                        \
    {                                                                                   \
        KIWI_REAL(real, symbol);                                                        \
        CUresult result = real(stream, graph);                                          \
        if (kiwi_cfg.enabled)                                                           \
            kiwi_capture_ended(kiwi_stream(stream, per_thread));                        \
        return result;                                                                  \
    }

END_CAPTURE(cuStreamEndCapture, false)
END_CAPTURE(cuStreamEndCapture_ptsz, true)
