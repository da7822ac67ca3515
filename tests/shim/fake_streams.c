/* Streams, events and the link between host and card, for the fake driver: fake_cuda.c
 * includes this file (one translation unit, so everything that builds the fake builds it as
 * before), after the memory model it moves bytes in.
 *
 * Work queued on a stream is done by a thread of that stream's own (its worker), in the order
 * it was queued, not by the call that queued it: an asynchronous copy, memset or event record
 * returns at once, and what it does happens later. So nothing queued is done before the stream
 * or an event says so (cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize, cuEventQuery,
 * cuStreamWaitEvent), as on a GPU; a program that reads, frees or unmaps memory before its
 * stream is done with it finds out. A copy that finds its memory unmapped when its turn comes
 * is a fault, as a DMA's is on a GPU: the context's sticky error (CUDA_ERROR_ILLEGAL_ADDRESS),
 * returned by every later synchronization, and a "fault" line in the log. Each queued piece of
 * work counts as a call in progress for the checkpoint API's lock (the driver's lock waits for
 * submitted work).
 *
 * What the driver's documentation ("API synchronization behavior") says each copy does is done:
 * an asynchronous copy between device memory and pinned host memory (cuMemAllocHost, or
 * registered with cuMemHostRegister) is queued; one to or from pageable memory is synchronous:
 * the stream is waited for, then the copy is made in the caller, staged, at the pageable rate
 * (a log line says `pageable=1`). A synchronous copy (cuMemcpyHtoD, DtoH, the unified cuMemcpy)
 * waits for its stream (the legacy default stream, or the thread's own with _ptds) and returns
 * once done; a device-to-device one is queued there, with no wait on the host's side. Kernel
 * launches (the fake's two kernels, and any other) wait for what is queued on their stream, then
 * run in the call (FAKE_CUDA_LAUNCH_SECONDS, as before, is how long). Contexts own streams: a
 * stream belongs to the context current where it was made or first used, and cuCtxSynchronize
 * waits for the current context's streams.
 *
 * The link. A copy between host and device memory crosses it on the copy engine of its
 * direction: one to the device, one to the host, shared by every process on a card
 * (FAKE_CUDA_DEVICE; the engines' clocks live in the card's file). FAKE_CUDA_LINK_GBPS sets what
 * each engine moves per second from and to pinned memory (GB/s, 10^9 bytes), so copies take
 * time: each reserves its engine for bytes / rate, after whatever the engine was given before it
 * (copies of one direction queue, the two directions overlap), moves its bytes and returns
 * when that time is over. FAKE_CUDA_PAGEABLE_GBPS is the rate to and from pageable memory
 * (default a fifth of the link's: the driver stages it through buffers of its own, 5-15 GB/s
 * beside a 55 GB/s link on an H200). Without FAKE_CUDA_LINK_GBPS copies take no modelled time
 * (the tests stay fast), but everything above about queues and synchronization holds.
 * FAKE_CUDA_PIN_GBPS makes pinning take time (cuMemHostRegister, cuMemAllocHost: bytes / rate),
 * and pinning holds a driver-wide lock meanwhile, as the driver's does (the issue 39 review:
 * tens of ms per 256 MiB): a copy, an event record, a map or an unmap asked for meanwhile waits
 * for it, so the copy engines idle. With it, pinning also faults every page in, as the driver
 * does: the memory is the process's for real from then on.
 *
 * Graph capture: besides cuCtxSynchronize (which invalidates every open capture, fake_cuda.c),
 * the calls the driver calls "potentially unsafe" during a capture (here: pinning and
 * unpinning host memory, cuMemAllocHost, cuMemFreeHost) fail with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture they conflict with, by the
 * driver's rules: a thread whose capture mode (cuThreadExchangeStreamCaptureMode) is global, the
 * default, may not make them while any other thread has a capture begun in the global mode open;
 * no thread may while a capture of its own is open, unless that capture or the thread is
 * relaxed.
 */

#define MAX_STREAMS 1024
#define LEGACY_STREAM ((uintptr_t)1)     /* CU_STREAM_LEGACY, and stream 0 */
#define PER_THREAD_STREAM ((uintptr_t)2) /* CU_STREAM_PER_THREAD, and stream 0 with _ptsz */

enum engine { TO_DEVICE, TO_HOST, NO_ENGINE };

/* A copy as it will be made: its two sides, and what it takes of the link. */
struct transfer {
    CUdeviceptr dst, src;
    enum known dst_known, src_known;
    size_t n;
    enum engine engine;
    bool pageable;  /* its host side is not pinned */
    bool host_only; /* host memory to host memory */
};

enum op_kind { OP_COPY, OP_FILL, OP_EVENT, OP_WAIT };

struct fake_event {
    /* Under streams_lock: the last record asked for, and the last one the GPU reached. */
    unsigned long long recorded, completed;
    long long completed_at; /* ns on CLOCK_MONOTONIC, for cuEventElapsedTime */
    int queued;             /* records and waits still queued that name it */
    struct stream *last;    /* the stream of its last record */
    bool destroyed;         /* freed when the last of those is done */
};

struct op {
    struct op *next;
    enum op_kind kind;
    struct transfer copy;
    CUdeviceptr fill_at;
    unsigned fill_value;
    size_t fill_width, fill_count;
    struct fake_event *event;
    unsigned long long generation;
};

struct stream {
    uintptr_t handle;
    pthread_t owner;   /* the thread whose own default stream it is */
    CUcontext context; /* current where it was made or first used */
    struct op *head, *tail;
    unsigned long long queued, done;
    bool worker;
    pthread_cond_t wake;
};

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* some work was done */
static struct stream *streams[MAX_STREAMS];
static size_t stream_count;
static atomic_int sticky_error;
/* Held while host memory is pinned (FAKE_CUDA_PIN_GBPS): the driver's own lock. */
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;

static double gbps(const char *name)
{
    const char *text = getenv(name);
    double value = text ? atof(text) : 0;
    return value > 0 ? value * 1e9 : 0;
}

static double link_rate(void)
{
    return gbps("FAKE_CUDA_LINK_GBPS");
}

static double pageable_rate(void)
{
    double rate = gbps("FAKE_CUDA_PAGEABLE_GBPS");
    return rate ? rate : link_rate() / 5;
}

static void sleep_until(long long ns)
{
    struct timespec at = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
        ;
}

/* A call the driver serializes with pinning: it waits while host memory is being pinned. */
static void driver_pass(void)
{
    pthread_mutex_lock(&driver_lock);
    pthread_mutex_unlock(&driver_lock);
}

/* ---- the link ------------------------------------------------------------------------------ */

/* Under the memory model's lock: is all of [host, host + n) pinned host memory? */
static bool host_pinned(CUdeviceptr host, size_t n)
{
    size_t at = rows_up_to(&host_ranges, host);
    if (at == 0)
        return false;
    const struct host_range *row = row_at(&host_ranges, at - 1);
    return host - row->start < row->size && n <= row->size - (host - row->start);
}

/* Which engine t takes, and whether its host side is pageable. */
static void classify(struct transfer *t)
{
    pthread_rwlock_rdlock(&memory_lock);
    bool to_host = side_for(t->dst, t->dst_known) == HOST_SIDE;
    bool from_host = side_for(t->src, t->src_known) == HOST_SIDE;
    t->engine = to_host == from_host ? NO_ENGINE : to_host ? TO_HOST : TO_DEVICE;
    t->host_only = to_host && from_host;
    t->pageable = t->engine != NO_ENGINE &&
                  !host_pinned(to_host ? t->dst : t->src, t->n);
    pthread_rwlock_unlock(&memory_lock);
}

/* Reserves the engine for n bytes at rate (bytes/s), after what it was given before, and waits
 * for the reservation to begin; returns when it ends (ns), 0 when nothing is modelled. */
static long long engine_reserve(enum engine engine, size_t n, double rate)
{
    if (engine == NO_ENGINE || rate <= 0)
        return 0;
    long long need = (long long)((double)n / rate * 1e9);
    atomic_llong *free_at = &card->engine_free_at[engine];
    long long now = monotonic_ns(), was = atomic_load(free_at), start;
    do {
        start = was > now ? was : now;
    } while (!atomic_compare_exchange_weak(free_at, &was, start + need));
    record("link engine=%s bytes=%zu asked=%lld start=%lld end=%lld",
           engine == TO_HOST ? "to-host" : "to-device", n, now, start, start + need);
    sleep_until(start);
    return start + need;
}

#if defined(__SANITIZE_THREAD__)
/* The fake's own tests, under ThreadSanitizer: what a stream's worker moves stands for a DMA,
 * whose bytes a program may race with as it likes (the tests do, to see when they land); the
 * worker's bookkeeping is still checked. (Built plainly, as under the shim's tests, the copies
 * stay visible to the sanitizer the program runs under: the program must synchronize with them
 * as with a GPU's.) */
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define DMA_BEGINS() __tsan_ignore_thread_begin()
#define DMA_ENDS() __tsan_ignore_thread_end()
#else
#define DMA_BEGINS() ((void)0)
#define DMA_ENDS() ((void)0)
#endif

/* Makes a copy now: its engine's time, and its bytes. unmapped: the error for a byte that is
 * not mapped by then. */
static CUresult run_copy(const struct transfer *t, CUresult unmapped)
{
    double rate = t->pageable ? pageable_rate() : link_rate();
    long long end = engine_reserve(t->engine, t->n, rate);
    bool vmm;
    CUresult result = move_bytes(t->dst, t->dst_known, t->src, t->src_known, t->n, unmapped,
                                 &vmm, true);
    if (end)
        sleep_until(end);
    return result;
}

/* ---- streams and their workers --------------------------------------------------------- */

static void work_begins(void)
{
    if (own_state)
        atomic_fetch_add(&own_state->in_progress, 1);
}

static void work_ends(void)
{
    if (own_state)
        atomic_fetch_sub(&own_state->in_progress, 1);
}

/* Under streams_lock: an event's record or wait is done with it. */
static void event_let_go(struct fake_event *event)
{
    if (--event->queued == 0 && event->destroyed)
        free(event);
}

static void fault(const char *what, CUresult result)
{
    int none = 0;
    atomic_compare_exchange_strong(&sticky_error, &none, CUDA_ERROR_ILLEGAL_ADDRESS);
    record("fault %s result=%d: the memory was gone when the work ran", what, result);
}

static void execute(struct op *op)
{
    switch (op->kind) {
    case OP_COPY: {
        DMA_BEGINS();
        CUresult result = run_copy(&op->copy, CUDA_ERROR_ILLEGAL_ADDRESS);
        DMA_ENDS();
        if (result)
            fault("copy", result);
        break;
    }
    case OP_FILL: {
        bool vmm;
        DMA_BEGINS();
        CUresult result = fill_bytes(op->fill_at, op->fill_value, op->fill_width,
                                     op->fill_count, CUDA_ERROR_ILLEGAL_ADDRESS, &vmm, true);
        DMA_ENDS();
        if (result)
            fault("memset", result);
        break;
    }
    case OP_EVENT:
        pthread_mutex_lock(&streams_lock);
        if (op->generation > op->event->completed) {
            op->event->completed = op->generation;
            op->event->completed_at = monotonic_ns();
        }
        event_let_go(op->event);
        pthread_mutex_unlock(&streams_lock);
        break;
    case OP_WAIT:
        pthread_mutex_lock(&streams_lock);
        while (op->event->completed < op->generation)
            pthread_cond_wait(&progress, &streams_lock);
        event_let_go(op->event);
        pthread_mutex_unlock(&streams_lock);
        break;
    }
}

static bool is_pending_stream(CUstream stream);
static bool pending_work_done(void);
static void wait_for_pending_work(void);

static void *serve(void *arg)
{
    struct stream *s = arg;
    pthread_mutex_lock(&streams_lock);
    for (;;) {
        while (!s->head)
            pthread_cond_wait(&s->wake, &streams_lock);
        struct op *op = s->head; /* stays queued while it runs: a drain waits for it */
        pthread_mutex_unlock(&streams_lock);
        if (is_pending_stream((CUstream)s->handle))
            wait_for_pending_work();
        execute(op);
        pthread_mutex_lock(&streams_lock);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->done++;
        pthread_cond_broadcast(&progress);
        free(op);
        work_ends();
    }
    return NULL;
}

/* Under streams_lock: the stream a call names. 0 is the legacy default stream, or with a
 * per-thread entry point (_ptsz, _ptds) the calling thread's own; both are per context. */
static struct stream *stream_of(CUstream handle, bool per_thread)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == 0)
        key = per_thread ? PER_THREAD_STREAM : LEGACY_STREAM;
    CUcontext context = current ? current : PRIMARY_CONTEXT;
    bool by_context = key == LEGACY_STREAM || key == PER_THREAD_STREAM;
    pthread_t self = pthread_self();
    for (size_t i = 0; i < stream_count; i++) {
        struct stream *s = streams[i];
        if (s->handle == key && (!by_context || s->context == context) &&
            (key != PER_THREAD_STREAM || pthread_equal(s->owner, self)))
            return s;
    }
    struct stream *s = stream_count < MAX_STREAMS ? calloc(1, sizeof *s) : NULL;
    if (!s)
        return NULL;
    s->handle = key;
    s->owner = self;
    s->context = context;
    pthread_cond_init(&s->wake, NULL);
    streams[stream_count++] = s;
    return s;
}

/* Queues op on the stream (work that cannot queue, for want of memory or a thread, is done at
 * once: late is never early). */
static void enqueue(CUstream handle, bool per_thread, struct op *op)
{
    work_begins();
    pthread_mutex_lock(&streams_lock);
    struct stream *s = stream_of(handle, per_thread);
    if (s && !s->worker) {
        pthread_t thread;
        pthread_attr_t attributes;
        sigset_t all, before;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &before); /* signals are the program's threads' */
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        s->worker = pthread_create(&thread, &attributes, serve, s) == 0;
        pthread_attr_destroy(&attributes);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
    }
    if (!s || !s->worker) {
        pthread_mutex_unlock(&streams_lock);
        execute(op);
        free(op);
        work_ends();
        return;
    }
    if (op->kind == OP_EVENT)
        op->event->last = s;
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->queued++;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&streams_lock);
}

/* Under streams_lock: waits until what s had queued is done. */
static void drain(struct stream *s)
{
    unsigned long long target = s->queued;
    while (s->done < target)
        pthread_cond_wait(&progress, &streams_lock);
}

static void drain_stream(CUstream handle, bool per_thread)
{
    pthread_mutex_lock(&streams_lock);
    struct stream *s = stream_of(handle, per_thread);
    if (s)
        drain(s);
    pthread_mutex_unlock(&streams_lock);
}

/* Waits for every stream of the current context. */
static void drain_context(void)
{
    CUcontext context = current ? current : PRIMARY_CONTEXT;
    pthread_mutex_lock(&streams_lock);
    unsigned long long targets[MAX_STREAMS];
    size_t count = stream_count;
    for (size_t i = 0; i < count; i++)
        targets[i] = streams[i]->queued;
    for (size_t i = 0; i < count; i++)
        while (streams[i]->context == context && streams[i]->done < targets[i])
            pthread_cond_wait(&progress, &streams_lock);
    pthread_mutex_unlock(&streams_lock);
}

static void make_stream(CUstream handle)
{
    pthread_mutex_lock(&streams_lock);
    stream_of(handle, false);
    pthread_mutex_unlock(&streams_lock);
}

/* The sticky error a synchronization returns once queued work faulted; 0 when none did. */
static CUresult sticky(void)
{
    return atomic_load(&sticky_error);
}

/* In a forked child: none of the parent's workers is its own. */
static void streams_after_fork(void)
{
    pthread_mutex_init(&streams_lock, NULL);
    pthread_cond_init(&progress, NULL);
    pthread_mutex_init(&driver_lock, NULL);
    stream_count = 0; /* the parent's queues are left behind */
}

/* ---- copies and memsets ---------------------------------------------------------------- */

/* A copy, as the driver's documentation says each kind behaves (the file's comment). Checked
 * first: a byte not mapped fails the call at once. Returns the call's result; *pageable: it
 * was staged through pageable memory. */
static CUresult submit_copy(struct transfer *t, CUstream handle, bool asynchronous,
                            bool per_thread, bool *vmm)
{
    CUresult result = move_bytes(t->dst, t->dst_known, t->src, t->src_known, t->n,
                                 CUDA_ERROR_INVALID_VALUE, vmm, false);
    if (result)
        return result;
    classify(t);
    /* Device to device: queued, even by the synchronous calls; host to host: done at once. */
    bool queued = t->engine == NO_ENGINE ? !t->host_only : asynchronous && !t->pageable;
    if (queued) {
        struct op *op = calloc(1, sizeof *op);
        if (op) {
            driver_pass();
            *op = (struct op){.kind = OP_COPY, .copy = *t};
            enqueue(handle, per_thread, op);
            return 0;
        }
    }
    drain_stream(handle, per_thread);
    driver_pass();
    return run_copy(t, CUDA_ERROR_INVALID_VALUE);
}

static CUresult submit_fill(CUdeviceptr dst, unsigned value, size_t width, size_t count,
                            CUstream handle, bool asynchronous, bool per_thread, bool *vmm)
{
    CUresult result = fill_bytes(dst, value, width, count, CUDA_ERROR_INVALID_VALUE, vmm, false);
    if (result)
        return result;
    struct op *op = asynchronous ? calloc(1, sizeof *op) : NULL;
    if (op) {
        *op = (struct op){.kind = OP_FILL, .fill_at = dst, .fill_value = value,
                          .fill_width = width, .fill_count = count};
        enqueue(handle, per_thread, op);
        return 0;
    }
    drain_stream(handle, per_thread);
    return fill_bytes(dst, value, width, count, CUDA_ERROR_INVALID_VALUE, vmm, true);
}

/* ---- events ---------------------------------------------------------------------------- */

EXPORT CUresult cuEventCreate(struct fake_event **event, unsigned flags)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    *event = calloc(1, sizeof **event);
    record("cuEventCreate event=%p flags=%u", (void *)*event, flags);
    return *event ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult record_event(const char *name, struct fake_event *event, CUstream stream,
                             bool per_thread)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    call_begins();
    driver_pass();
    struct op *op = calloc(1, sizeof *op);
    pthread_mutex_lock(&streams_lock);
    unsigned long long generation = ++event->recorded;
    event->queued++;
    pthread_mutex_unlock(&streams_lock);
    if (op) {
        *op = (struct op){.kind = OP_EVENT, .event = event, .generation = generation};
        enqueue(stream, per_thread, op);
    } else {
        drain_stream(stream, per_thread);
        struct op now = {.kind = OP_EVENT, .event = event, .generation = generation};
        execute(&now);
    }
    record("%s event=%p stream=%p", name, (void *)event, stream);
    call_ends();
    return 0;
}
EXPORT CUresult cuEventRecord(struct fake_event *event, CUstream stream)
{
    return record_event("cuEventRecord", event, stream, false);
}
EXPORT CUresult cuEventRecord_ptsz(struct fake_event *event, CUstream stream)
{
    return record_event("cuEventRecord_ptsz", event, stream, true);
}

/* Under streams_lock: has the GPU reached the event's last record? (Never recorded: yes.) */
static bool event_done(const struct fake_event *event)
{
    return event->completed >= event->recorded;
}

EXPORT CUresult cuEventQuery(struct fake_event *event)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&streams_lock);
    /* Held only by the pending stream's file, which is there now: its worker is about to go on
     * (a test touches the file, then asks). */
    while (!event_done(event) && event->last && is_pending_stream((CUstream)event->last->handle) &&
           pending_work_done())
        pthread_cond_wait(&progress, &streams_lock);
    bool done = event_done(event);
    pthread_mutex_unlock(&streams_lock);
    return done ? 0 : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(struct fake_event *event)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    call_begins();
    pthread_mutex_lock(&streams_lock);
    unsigned long long target = event->recorded;
    while (event->completed < target)
        pthread_cond_wait(&progress, &streams_lock);
    pthread_mutex_unlock(&streams_lock);
    trim_pools();
    record("cuEventSynchronize event=%p", (void *)event);
    call_ends();
    return sticky();
}

EXPORT CUresult cuEventElapsedTime(float *milliseconds, struct fake_event *start,
                                   struct fake_event *end)
{
    if (!milliseconds || !start || !end)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&streams_lock);
    bool done = start->recorded && end->recorded && event_done(start) && event_done(end);
    long long from = start->completed_at, to = end->completed_at;
    pthread_mutex_unlock(&streams_lock);
    if (!done)
        return CUDA_ERROR_NOT_READY;
    *milliseconds = (float)((double)(to - from) / 1e6);
    return 0;
}

EXPORT CUresult cuEventDestroy_v2(struct fake_event *event)
{
    record("cuEventDestroy_v2 event=%p", (void *)event);
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&streams_lock);
    bool now = event->queued == 0; /* else the last record or wait still queued frees it */
    event->destroyed = true;
    pthread_mutex_unlock(&streams_lock);
    if (now)
        free(event);
    return 0;
}

EXPORT CUresult cuStreamWaitEvent(CUstream stream, struct fake_event *event, unsigned flags)
{
    record("cuStreamWaitEvent stream=%p event=%p flags=%u", stream, (void *)event, flags);
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    struct op *op = calloc(1, sizeof *op);
    pthread_mutex_lock(&streams_lock);
    unsigned long long generation = event->recorded;
    bool wait = !event_done(event);
    if (wait)
        event->queued++;
    pthread_mutex_unlock(&streams_lock);
    if (!wait) {
        free(op);
        return 0;
    }
    struct op now = {.kind = OP_WAIT, .event = event, .generation = generation};
    if (!op) {
        execute(&now); /* no memory to queue it: the caller waits instead */
        return 0;
    }
    *op = now;
    enqueue(stream, false, op);
    return 0;
}

/* ---- pinning, and the calls graph capture forbids ---------------------------------------- */

#define CAPTURE_MODE_GLOBAL 0
#define CAPTURE_MODE_THREAD_LOCAL 1
#define CAPTURE_MODE_RELAXED 2
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900

static __thread int thread_capture_mode = CAPTURE_MODE_GLOBAL;

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (!mode || *mode < CAPTURE_MODE_GLOBAL || *mode > CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int before = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = before;
    return 0;
}

static CUresult forbidden_during_capture(void);

/* Pinning size bytes (FAKE_CUDA_PIN_GBPS): it takes its time, with every page faulted in; the
 * caller holds driver_lock. Without the knob it takes none and faults nothing in (the tests'
 * managed working sets pin buffers of several GiB with no bytes ever written). */
static void pin_pages(void *host, size_t size)
{
    record("pinning host=%p size=%zu", host, size);
    double rate = gbps("FAKE_CUDA_PIN_GBPS");
    if (rate) {
#ifdef MADV_POPULATE_WRITE
        if (madvise(host, size, MADV_POPULATE_WRITE) != 0)
#endif
            for (size_t at = 0; at < size; at += 4096)
                ((volatile unsigned char *)host)[at] = ((volatile unsigned char *)host)[at];
        sleep_until(monotonic_ns() + (long long)((double)size / rate * 1e9));
    }
    record("pinned host=%p size=%zu", host, size);
}

/* A potentially unsafe call is being made by this thread: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * with every capture it conflicts with invalidated, when the driver's rules forbid it (the
 * file's comment); else 0. */
static CUresult forbidden_during_capture(void)
{
    if (thread_capture_mode == CAPTURE_MODE_RELAXED)
        return 0;
    bool conflict = false;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&captures_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (!captures[i])
            continue;
        bool own = pthread_equal(capture_thread[i], self);
        if (own ? capture_mode[i] != CAPTURE_MODE_RELAXED
                : capture_mode[i] == CAPTURE_MODE_GLOBAL &&
                      thread_capture_mode == CAPTURE_MODE_GLOBAL) {
            invalidated[i] = true;
            conflict = true;
        }
    }
    pthread_mutex_unlock(&captures_lock);
    return conflict ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : 0;
}
