/* Graph captures in progress: the one time a release must wait for the process.
 *
 * While a stream is being captured into a CUDA graph, the work queued on it is recorded, not
 * run. In the global capture mode (PyTorch's default, and what torch.compile's reduce-overhead
 * mode uses while it warms up) any thread that calls a "potentially unsafe" API such as
 * cuCtxSynchronize invalidates every capture in the process: the capture's cuStreamEndCapture
 * then fails and the framework raises. The release sequence synchronizes from the comm thread,
 * so it must not run while a capture is open. The shim counts open captures here, and the comm
 * thread defers a release until the last one has ended; the daemon's grace period bounds how
 * long it may take.
 *
 * A capture that begins while the comm thread synchronizes would be invalidated too, so
 * beginning one takes capture_lock (kiwi_capture_beginning, from interpose/capture.c, until
 * kiwi_capture_began), which the comm thread holds from its last look at the count until its
 * synchronization is over (kiwi_capture_hold / kiwi_capture_unhold). When the last capture
 * ends, the comm thread is woken (news.c) to do the release it deferred.
 *
 * The vmm evictor's shadow builder pins host memory on a thread of its own: while another
 * thread's capture begun in the global mode (not thread-local or relaxed: the driver's rules,
 * cuThreadExchangeStreamCaptureMode) is open, pinning is a "potentially unsafe" call that fails
 * and invalidates it (PyTorch's DataLoader pin-memory thread does the same to a capture). So
 * the builder waits for the last such capture to end and holds capture_lock while it pins
 * (kiwi_capture_hold_for_pinning): a capture that begins meanwhile waits for the pinning, tens
 * of ms for 256 MiB.
 */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "../shim.h"

#define MAX_CAPTURES 64

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t global_ended = PTHREAD_COND_INITIALIZER;
static CUstream capturing[MAX_CAPTURES];
static bool global[MAX_CAPTURES]; /* begun in the global mode */
static int global_count;          /* under capture_lock */
static atomic_int open_count;

int kiwi_capture_open(void)
{
    return atomic_load(&open_count);
}

bool kiwi_capture_hold(void)
{
    pthread_mutex_lock(&capture_lock);
    if (atomic_load(&open_count) == 0)
        return true;
    pthread_mutex_unlock(&capture_lock);
    return false;
}

void kiwi_capture_unhold(void)
{
    pthread_mutex_unlock(&capture_lock);
}

bool kiwi_capture_global_open(void)
{
    pthread_mutex_lock(&capture_lock);
    bool open = global_count > 0;
    pthread_mutex_unlock(&capture_lock);
    return open;
}

void kiwi_capture_hold_for_pinning(void)
{
    pthread_mutex_lock(&capture_lock);
    while (global_count > 0)
        pthread_cond_wait(&global_ended, &capture_lock);
}

void kiwi_capture_after_fork(void)
{
    pthread_mutex_init(&capture_lock, NULL);
    pthread_cond_init(&global_ended, NULL);
    atomic_store(&open_count, 0);
    global_count = 0;
    for (int i = 0; i < MAX_CAPTURES; i++)
        capturing[i] = NULL;
}

/* Under capture_lock. A stream the shim cannot remember still works; it only means a release
 * could invalidate its capture, which the warning says. */
static void remember(CUstream stream, bool in_global_mode)
{
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (!capturing[i]) {
            capturing[i] = stream;
            global[i] = in_global_mode;
            global_count += in_global_mode;
            atomic_fetch_add(&open_count, 1);
            return;
        }
    }
    kiwi_warn("more than %d graph captures at once; a release may invalidate the others",
              MAX_CAPTURES);
}

static bool still_capturing(CUstream stream)
{
    typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
    is_capturing_fn is_capturing = (is_capturing_fn)kiwi_driver_sym("cuStreamIsCapturing");
    CUstreamCaptureStatus status = 0;
    return is_capturing && is_capturing(stream, &status) == CUDA_SUCCESS && status != 0;
}

/* After cuStreamEndCapture: the capture is over whenever the stream no longer captures, even
 * when the end failed (an invalidated capture still ends); a capture ended on the wrong thread
 * goes on. */
void kiwi_capture_ended(CUstream stream)
{
    bool closed = false;
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (capturing[i] == stream && !still_capturing(stream)) {
            capturing[i] = NULL;
            closed = atomic_fetch_sub(&open_count, 1) == 1;
            if (global[i] && --global_count == 0)
                pthread_cond_broadcast(&global_ended);
            break;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    if (closed)
        kiwi_news_wake();
}

void kiwi_capture_beginning(void)
{
    pthread_mutex_lock(&capture_lock);
}

void kiwi_capture_began(CUstream stream, bool began, CUstreamCaptureMode mode)
{
    if (began)
        remember(stream, mode == 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */);
    pthread_mutex_unlock(&capture_lock);
}

