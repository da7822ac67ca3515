/* What the shim's files share. Each .c file is one concern:
 *
 *   hook.c    interposition: dlsym, cuGetProcAddress(_v2), finding the real driver functions
 *   memory.c  the table of allocations: the working set, and the ranges the pager moves; with
 *             limit.c (the memory limit), alloc.c and alloc_async.c (allocations become managed
 *             memory) and free.c (frees), sharing memory.h
 *   meminfo.c cuMemGetInfo and cuDeviceTotalMem: what the process is told of the GPU's memory
 *   pool.c    a managed memory pool per device, for stream-ordered allocations (CUDA 13)
 *   gated.c   the driver calls that run work on the GPU, each wrapped by the gate
 *   gate.c    the gate itself: work waits there until this process holds its GPU
 *   pager.c   synchronizing, and moving the working set to host memory and back by prefetch;
 *             with transfer.c (one context's prefetches and discards), sharing pager.h
 *   free_ranges.c what the framework's cache holds free: discarded, not copied, on eviction
 *   capture.c graph captures in progress, which a release must wait for
 *   context.c contexts destroyed or reset: the shim forgets what was allocated in them
 *   interrupt.c Ctrl-C ends a wait for the GPU
 *   comm.c    the daemon client, on a thread of its own; the hold's state machine; with
 *             release.c (the release sequence), dispatch.c (the daemon's lines), wishes.c (what
 *             other threads ask of it) and start.c (starting it; fork), sharing comm.h
 *   link.c    the connection: socket, framing, hello and register
 *   registration.c what the register request says of the process: names, labels, GPU
 *   wire.c    protocol lines: writing requests, reading the daemon's flat JSON objects
 *   config.c  environment variables, read once
 *   evict.c   which evictor pages this process out: managed memory, or the driver's checkpoint
 *   api.c     the small C API the kernel hook calls through ctypes
 */
#ifndef KIWI_SHIM_H
#define KIWI_SHIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "hooks.h"

#define KIWI_EXPORT __attribute__((visibility("default")))
#define KIWI_SHIM_VERSION "0.1.0"

/* What stream 0 means: the per-thread default stream to a _ptsz/_ptds entry point. */
static inline CUstream kiwi_stream(CUstream stream, bool per_thread)
{
    return !stream && per_thread ? CU_STREAM_PER_THREAD : stream;
}

/* ---- config.c ---------------------------------------------------------------------------- */

enum kiwi_evict_request { KIWI_EVICT_AUTO, KIWI_EVICT_MANAGED, KIWI_EVICT_CHECKPOINT };

/* How the managed evictor's way out goes: by prefetch (off), or copied out and discarded. */
enum kiwi_evict_copy { KIWI_EVICT_COPY_OFF, KIWI_EVICT_COPY_PINNED, KIWI_EVICT_COPY_PAGEABLE };

struct kiwi_config {
    bool enabled;            /* KIWI_SHIM != 0 */
    uint64_t memory_limit;   /* KIWI_GPU_MEMORY_LIMIT in bytes; 0 = the whole GPU */
    double idle_release;     /* KIWI_IDLE_RELEASE seconds outside cells; 0 = never */
    bool fail_closed;        /* KIWI_FAIL_POLICY=closed */
    double fail_timeout;     /* KIWI_FAIL_TIMEOUT: an outage this long triggers the policy */
    bool log;                /* KIWI_SHIM_LOG=1: say what the shim does on stderr */
    bool restore_by_fault;   /* KIWI_RESTORE=fault: no prefetch back on a grant (benchmarks) */
    int gpu;                 /* KIWI_GPU, else from CUDA/NVIDIA_VISIBLE_DEVICES, else 0 */
    char gpu_uuid[96];       /* GPU-... or MIG-..., from those or the driver; "" while unknown */
    enum kiwi_evict_request evict; /* KIWI_EVICT: auto, managed or checkpoint */
    enum kiwi_evict_copy evict_copy; /* KIWI_EVICT_COPY: off, pinned or pageable (copy_out.c) */
    char socket_path[108];   /* KIWI_SOCKET */
    char name[128];          /* KIWI_CLIENT_NAME, else process name + pid */
    char pool[64];           /* KIWI_POOL */
    char priority[16];       /* KIWI_PRIORITY */
};

extern struct kiwi_config kiwi_cfg;

/* Reads the environment once; every entry point calls it first. Cheap after the first call. */
void kiwi_init(void);
/* Parses "8GiB", "512MiB", "80GB" or a byte count; returns false when it is none of those. */
bool kiwi_parse_size(const char *text, uint64_t *bytes);
double kiwi_now(void); /* CLOCK_MONOTONIC seconds */
void kiwi_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kiwi_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- evict.c ----------------------------------------------------------------------------- */

/* Do allocations become managed memory? Decided once, before the first allocation; may wait
 * (bounded) for the daemon's answer to register. */
bool kiwi_evict_converts(void);
/* Is the daemon checkpointing this process (decided, and decided so)? Never waits. */
bool kiwi_evict_checkpointing(void);
/* What register proposes ("managed" or "checkpoint"); the daemon's answer, "" when it gave none. */
const char *kiwi_evict_proposal(void);
void kiwi_evict_answered(const char *evictor);
const char *kiwi_evict_name(void); /* "managed", "checkpoint" or "undecided" */

/* ---- hook.c ------------------------------------------------------------------------------ */

/* The driver's own function for a hooked symbol, or NULL when no driver is loaded. */
void *kiwi_real(enum kiwi_hook_id id);
/* The driver's function for any other symbol the shim calls itself (cuCtxSynchronize, ...). */
void *kiwi_driver_sym(const char *symbol);

/* The start of every hook, inside the replacement for symbol: reads the environment, and
 * declares var, the driver's own symbol with the replacement's own type; with no driver loaded
 * the hook returns CUDA_ERROR_NOT_INITIALIZED. */
#define KIWI_REAL(var, symbol)                                                 \
    kiwi_init();                                                               \
    __typeof__(&symbol) var = (__typeof__(&symbol))kiwi_real(HOOK_##symbol);   \
    if (!var)                                                                  \
        return CUDA_ERROR_NOT_INITIALIZED

/* ---- gate.c ------------------------------------------------------------------------------ */

/* Around every gated call. enter returns CUDA_SUCCESS when the call may run, or the error the
 * call must return instead (fail-closed policy while the daemon is unreachable). */
CUresult kiwi_gate_enter(void);
void kiwi_gate_exit(void);
/* For the comm thread: open lets work through; close admits no new work; drain waits until
 * the calls already inside have returned. */
void kiwi_gate_open(void);
void kiwi_gate_close(void);
void kiwi_gate_drain(void);
double kiwi_gate_last_activity(void);
int kiwi_gate_in_flight(void);
bool kiwi_gate_is_open(void);
/* From now on kiwi_gate_used_since_mark says whether any call has left the gate (free_ranges.c). */
void kiwi_gate_mark(void);
bool kiwi_gate_used_since_mark(void);
void kiwi_gate_after_fork(void);

/* ---- capture.c --------------------------------------------------------------------------- */

/* How many streams are being captured into graphs now. */
int kiwi_capture_open(void);
/* For the comm thread: true when no capture is open, and then none can begin until
 * kiwi_capture_unhold (the synchronization in between would invalidate it). */
bool kiwi_capture_hold(void);
void kiwi_capture_unhold(void);
void kiwi_capture_after_fork(void);

/* ---- interrupt.c ------------------------------------------------------------------------- */

/* How many interrupts there have been: a wait that sees the count move gives up. */
unsigned kiwi_interrupts(void);
/* Counts an interrupt and wakes the waiters; async-signal-safe. */
void kiwi_interrupt(void);
/* Puts the shim's SIGINT handler in front of the one installed now; 0 on success. */
int kiwi_interrupt_catch(void);

/* ---- memory.c, limit.c, alloc.c, alloc_async.c, free.c ---------------------------------- */

struct kiwi_working_set {
    uint64_t bytes;      /* everything this process allocated on the GPU through the driver */
    uint64_t evictable;  /* the managed part, which can be paged out to host memory */
    uint64_t allocations;
};

void kiwi_memory_working_set(struct kiwi_working_set *out);
uint64_t kiwi_memory_limit(void); /* what this process may use; 0 while unknown */
/* The limit, and no more than the GPU less what no eviction frees (meminfo.c). */
uint64_t kiwi_memory_room(void);
/* What the driver says of the GPU's memory; learnt from only while this process holds it. */
void kiwi_memory_learn(uint64_t real_total, uint64_t real_free);

struct kiwi_range {
    CUdeviceptr ptr;
    size_t size;
    CUcontext ctx;
    CUdevice device;
};

/* For the pager: a copy of the managed allocations, taken once, and no free can run until
 * kiwi_memory_paging_end (which frees the copy). */
size_t kiwi_memory_paging_begin(struct kiwi_range **ranges);
/* A copy of the managed allocations, and the table's generation, which moves whenever an
 * allocation is added or removed (free_ranges.c). */
size_t kiwi_memory_managed(struct kiwi_range **ranges, uint64_t *generation);
uint64_t kiwi_memory_generation(void);
void kiwi_memory_paging_end(struct kiwi_range *ranges);
void kiwi_memory_after_fork(void);
/* Around a driver call that frees memory the shim did not free itself (a context's end): the
 * pager does not move the working set meanwhile. */
void kiwi_memory_free_begin(void);
void kiwi_memory_free_end(void);
/* A context ended: forgets every allocation made in it; returns their bytes. */
uint64_t kiwi_memory_forget_context(CUcontext ctx);

/* ---- context.c --------------------------------------------------------------------------- */

void kiwi_context_after_fork(void);
/* Frees what graph capture kept from being freed; the comm thread calls it after it has
 * synchronized every context. */
void kiwi_memory_free_deferred(void);

/* ---- pool.c ------------------------------------------------------------------------------ */

/* The device's managed memory pool, made on first use; NULL where the driver has none. */
CUmemoryPool kiwi_pool_of(CUdevice device);
bool kiwi_pool_is_ours(CUmemoryPool pool);
/* Gives the memory the pools keep for reuse back to the driver (before an eviction). */
void kiwi_pool_trim(void);
void kiwi_pool_forget_device(CUdevice device);
void kiwi_pool_after_fork(void);

/* ---- free_ranges.c ----------------------------------------------------------------------- */

/* Before the kernel reads its framework's free blocks: marks the gate, notes the table. */
void kiwi_free_ranges_begin(void);
/* The free blocks read since begin; returns the bytes believed (whole 2 MiB blocks inside
 * managed allocations), or -1 without a begin or with bad arguments. */
long long kiwi_free_ranges_set(const unsigned long long *ptrs, const unsigned long long *sizes,
                               size_t count);
/* What is believed now: 0 once any GPU call has run, or the table changed, since begin. */
uint64_t kiwi_free_ranges_bytes(void);
/* For the pager: ranges cut into pieces, the live ones first (*live of them), then the free
 * ones; returns the number of pieces, or 0 (and no copy) when no free range is believed. */
size_t kiwi_free_ranges_split(const struct kiwi_range *ranges, size_t count,
                              struct kiwi_range **pieces, size_t *live);
/* A grant: the hints end (the gate opens). */
void kiwi_free_ranges_forget(void);
void kiwi_free_ranges_after_fork(void);

/* ---- pager.c ----------------------------------------------------------------------------- */

struct kiwi_transfer {
    uint64_t bytes;
    double seconds;
    uint64_t skipped;   /* free in the framework's cache: left where they were */
    uint64_t discarded; /* of those, dropped by the driver (cuMemDiscardBatchAsync) */
};

/* Remembers the calling thread's current context, so that the comm thread can synchronize it
 * and prefetch in it; returns it (NULL when none is current). */
CUcontext kiwi_pager_note_context(CUdevice *device);
/* Waits for all work this process queued on the GPU; false when a context's synchronization
 * failed, so that work may still be running. */
bool kiwi_pager_synchronize(void);
/* Moves the managed working set to host memory (evict) or back to its GPU (restore) with
 * prefetches on the pager's own streams, and waits for them. What the framework's cache holds
 * free (free_ranges.c) is not moved either way, and discarded on eviction where it can be. */
void kiwi_pager_evict(struct kiwi_transfer *moved);
void kiwi_pager_restore(struct kiwi_transfer *moved);
void kiwi_pager_after_fork(void);
/* A context ended: the pager no longer synchronizes it or prefetches in it. */
void kiwi_pager_forget_context(CUcontext ctx);

/* ---- comm.c, release.c, dispatch.c, wishes.c, start.c ----------------------------------- */

enum kiwi_hold { KIWI_IDLE, KIWI_WAITING, KIWI_HOLDING, KIWI_RELEASING };

struct kiwi_stats {
    bool connected;
    bool failed_open;        /* the daemon is unreachable and the policy lets work through */
    bool failed_closed;      /* the daemon is unreachable and the policy refuses work */
    bool in_cell;
    bool evicted;            /* the working set is in host memory now */
    bool paused;             /* holding, but another holder beside it has its turn */
    enum kiwi_hold hold;
    int queue_position;      /* 0 when not waiting */
    bool position_live;      /* the daemon sends an event whenever queue_position changes */
    char client[32];         /* the daemon's id for this process */
    char mode[8];
    double quantum;
    uint64_t grants, drops, revokes, releases;
    uint64_t pauses;         /* turns taken by holders beside this one (mode auto, turns) */
    uint64_t evictions, bytes_evicted;
    uint64_t bytes_skipped, bytes_discarded; /* free blocks of the framework's cache */
    double seconds_evicting;
    uint64_t restores, bytes_restored;
    double seconds_restoring;
    double seconds_waiting;  /* time gated calls spent waiting for the GPU */
    /* CLOCK_MONOTONIC when the last grant arrived, before its restore: benchmarks time the
     * way back to full speed from here, whichever way the pages come back. 0 before any. */
    double last_grant_at;
};

/* The one lock around the hold's state; kiwi_changed is broadcast whenever it changes. */
extern pthread_mutex_t kiwi_lock;
extern pthread_cond_t kiwi_changed;

/* Starts the daemon client's thread the first time the process does GPU work. */
void kiwi_comm_start(void);
bool kiwi_comm_started(void);
/* Under kiwi_lock: a gated call starts or stops waiting for the GPU. */
void kiwi_comm_waiter(int delta);
/* Under kiwi_lock: is this call refused (fail-closed outage)? */
bool kiwi_comm_refusing(void);
/* The allocation totals changed: report them to the daemon soon. */
void kiwi_comm_working_set_changed(void);
void kiwi_comm_add_waiting_time(double seconds);
/* Wakes the comm thread from a signal handler (async-signal-safe); it wakes the waiters. */
void kiwi_comm_wake_from_signal(void);
/* The last open graph capture ended: a deferred release may go ahead. */
void kiwi_comm_captures_closed(void);

/* For api.c. */
void kiwi_comm_cell_begin(void);
int kiwi_comm_acquire(double timeout);
int kiwi_comm_release(void);
void kiwi_comm_stats(struct kiwi_stats *out);
void kiwi_comm_set_policy(bool fail_closed, double timeout);

/* For link.c: a line the daemon sent on its own while a reply was awaited, and the end of
 * the connection. */
void kiwi_comm_handle_line(const char *line);
void kiwi_comm_link_lost(const char *why);

/* ---- link.c ------------------------------------------------------------------------------ */

/* Connects, says hello and registers (with the working set so far); the registered reply is
 * left in registered. */
bool kiwi_link_connect(uint64_t working_set, char *registered, size_t size);
/* Whether the daemon of the current connection sends "waiting" events as the position moves. */
bool kiwi_link_position_events(void);
bool kiwi_link_up(void);
int kiwi_link_fd(void);
/* Sends a request with the next seq; returns the seq, or 0 when the connection is gone. */
unsigned kiwi_link_request(const char *op, const char *fields);
/* Reads what the socket has, waiting at most timeout seconds; false when nothing came. */
bool kiwi_link_fill(double timeout);
bool kiwi_link_next_line(char *line, size_t size);
/* Closes the connection and tells the comm thread why. */
void kiwi_link_close(const char *why);
void kiwi_link_after_fork(void);

/* ---- registration.c ---------------------------------------------------------------------- */

/* The register request's fields: the client's labels, quoted, its GPU and its working set. */
void kiwi_registration_fields(char *fields, size_t size, uint64_t working_set);
/* The GPU's UUID as far as it is known ("" while not), copied under kiwi_lock. */
void kiwi_gpu_uuid(char *text, size_t size);

/* ---- wire.c ------------------------------------------------------------------------------ */

/* A value of a flat JSON object: points into the line; strings are not unescaped. */
struct kiwi_json_value {
    const char *start;
    size_t length;
    char kind; /* 's' string (without quotes), 'n' number, 't' true, 'f' false, 'z' null,
                  'o' object or array (skipped) */
};

bool kiwi_json_get(const char *line, const char *key, struct kiwi_json_value *out);
bool kiwi_json_string(const char *line, const char *key, char *buf, size_t size);
bool kiwi_json_number(const char *line, const char *key, double *out);
bool kiwi_json_true(const char *line, const char *key);
/* Appends a JSON string literal (quoted, escaped) to buf; returns false when it does not fit. */
bool kiwi_json_quote(char *buf, size_t size, const char *text);

#endif
