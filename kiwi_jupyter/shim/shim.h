/* What the shim's tiers share. The C files live in three tiers, and calls only go down:
 *
 *     interpose/    the driver's entry points, and nothing else    \   both call down into the
 *     client/       the daemon client: its thread, the hold, api.c /   mechanisms, never each other
 *     mechanisms/   the gate, the memory table, the pager, and what every tier stands on
 *
 * The mechanisms never call up. What the client must hear from them (a call waits at the
 * closed gate, the allocations changed, a graph capture ended, an interrupt) they post as news:
 * an atomic flag and a byte down the comm thread's pipe (news.c). tests/shim/test_tiers.py
 * holds the sources to this, and to "no file calls back into a file that calls it".
 *
 *   interpose/  hook.c        dlsym, cuGetProcAddress(_v2): each caller lands on a replacement
 *               gated.c       the driver calls that run work on the GPU, each behind the gate
 *               alloc.c       allocations, as the evictor chosen makes them
 *               alloc_async.c stream-ordered allocations
 *               pool.c        a framework's pool: the shim's managed one, or its vmm counts
 *               free.c        frees, and stream-ordered frees
 *               handles.c     legacy IPC handles (the vmm evictor's through its own), and VMM
 *                             handles handed out (pinned in place)
 *               pointer.c     questions about an address, answered per allocation under vmm
 *               meminfo.c     cuMemGetInfo and cuDeviceTotalMem: what the process is told
 *               context.c     contexts destroyed or reset: what was allocated in them goes;
 *                             peer access, which the vmm evictor's mappings get
 *               capture.c     graph captures beginning and ending
 *               (interpose.h: what they share)
 *   client/     comm.c        the daemon client, on a thread of its own: connecting, its loop
 *               hold.c        the hold's one writer, kiwi_hold_move, against protocol.h's table
 *               session.c     hello, register and numbered requests, apart from the socket
 *               asking.c      acquire, cancel, requeue, and their answers
 *               dispatch.c    what each line from the daemon does to the hold
 *               release.c     the release sequence, whatever asked for it
 *               outage.c      while the daemon is away: the lost connection, the fail policy
 *               room.c        a wait the daemon refuses for want of room: backoff, timeout
 *               wishes.c      what other threads ask of the comm thread (api.c's calls)
 *               start.c       starting the thread, and starting afresh in a forked child
 *               link.c        the connection: socket and framing
 *               registration.c what register says of the process: names, labels, GPU
 *               wire.c        protocol lines: writing requests, reading flat JSON objects
 *               evict.c       the evictor register proposes, and the daemon's answer
 *               api.c         the small C API the kernel hook calls through ctypes
 *               (client.h: what they share)
 *   mechanisms/ config.c      environment variables, read once; logging; the clock
 *               driver.c      finding the driver's own functions
 *               news.c        what the mechanisms tell the client, without calling it
 *               gate.c        the gate: work waits there until this process holds its GPU
 *               room_wait.c   an allocation the full card cannot back waits for room
 *               interrupt.c   Ctrl-C ends a wait for the GPU
 *               captures.c    graph captures in progress, which a release must wait for
 *               memory.c      the table of allocations, and frees deferred past a capture;
 *               limit.c       with the memory limit (memory.h)
 *               pools.c       a managed memory pool per device (CUDA 13)
 *               pager.c       the pager's one entry, kiwi_pager_move, and which evictor runs:
 *                             each one table of operations (struct kiwi_evictor), kept in
 *               managed.c     the managed evictor: managed memory, moved by prefetch,
 *               checkpoint.c  the checkpoint evictor: plain device memory, moved by the daemon,
 *               vmm_evictor.c the vmm evictor: memory the shim maps, moved by copy (vmm.h: the
 *                             files behind it: regions, slabs, cache, frees, shadows, moves),
 *               contexts.c    the contexts the pager synchronizes and moves memory in,
 *               transfer.c    one context's prefetches and discards,
 *               copy_out.c    KIWI_EVICT_COPY's host buffers,
 *               free_ranges.c and what the framework's cache holds free (pager.h)
 *               cgroup.c      the process's own memory limit, which pinning never passes
 *
 * This header declares what the tiers above call in the mechanisms, and the pieces every file
 * needs (driver.h's types, hooks.h's table of entry points).
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

enum kiwi_evict_request {
    KIWI_EVICT_AUTO,
    KIWI_EVICT_MANAGED,
    KIWI_EVICT_CHECKPOINT,
    KIWI_EVICT_VMM,
};

/* Where the vmm evictor's host shadows come from (KIWI_VMM_SHADOW; mechanisms/vmm_shadows.c):
 * anonymous huge pages registered with the driver, falling back to the driver's own pinned
 * memory; the driver's pinned memory only; or pageable memory, never pinned. */
enum kiwi_shadow_request { KIWI_SHADOW_REGISTER, KIWI_SHADOW_ALLOC_HOST, KIWI_SHADOW_PAGEABLE };

/* How the managed evictor's way out goes: by prefetch (off), or copied out and discarded. */
enum kiwi_evict_copy { KIWI_EVICT_COPY_OFF, KIWI_EVICT_COPY_PINNED, KIWI_EVICT_COPY_PAGEABLE };

struct kiwi_config {
    bool enabled;            /* KIWI_SHIM != 0 */
    uint64_t memory_limit;   /* KIWI_GPU_MEMORY_LIMIT in bytes; 0 = the whole GPU */
    double idle_release;     /* KIWI_IDLE_RELEASE seconds outside cells; 0 = never */
    bool fail_closed;        /* KIWI_FAIL_POLICY=closed */
    double fail_timeout;     /* KIWI_FAIL_TIMEOUT: an outage this long triggers the policy */
    double room_timeout;     /* KIWI_ROOM_TIMEOUT: refused room this long, waits give up; 0 never */
    bool log;                /* KIWI_SHIM_LOG=1: say what the shim does on stderr */
    bool restore_by_fault;   /* KIWI_RESTORE=fault: no prefetch back on a grant (benchmarks) */
    int gpu;                 /* KIWI_GPU, else from CUDA/NVIDIA_VISIBLE_DEVICES, else 0 */
    char gpu_uuid[96];       /* GPU-... or MIG-..., from those or the driver; "" while unknown */
    enum kiwi_evict_request evict; /* KIWI_EVICT: auto, vmm, managed or checkpoint */
    enum kiwi_shadow_request shadow; /* KIWI_VMM_SHADOW: register, allochost or pageable */
    enum kiwi_evict_copy evict_copy; /* KIWI_EVICT_COPY: off, pinned or pageable (copy_out.c) */
    uint64_t pin_budget;     /* KIWI_VMM_PIN_BUDGET: host memory the vmm evictor may keep pinned
                                until the daemon says; 0 = a quarter of the host's memory */
    char spill_dir[256];     /* KIWI_SPILL_DIR: the disk tier's files (spill_files.c) */
    char cgroup_dir[256];    /* KIWI_CGROUP_DIR: the cgroup directory whose memory limit applies
                                (tests); "" = the process's own (cgroup.c) */
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
/* A detached thread of the shim's own running main, every signal blocked (they are the main
 * thread's); false when none could be made. */
bool kiwi_thread_start(void *(*main)(void *));

/* ---- driver.c ---------------------------------------------------------------------------- */

/* The driver's own function for a hooked symbol, or NULL when no driver is loaded. */
void *kiwi_real(enum kiwi_hook_id id);
/* The driver's function for any other symbol the shim calls itself (cuCtxSynchronize, ...). */
void *kiwi_driver_sym(const char *symbol);
/* dlsym and what it calls first run inside a sanitizer's own start-up, when a sanitized build of
 * the shim is tested: AddressSanitizer and ThreadSanitizer resolve their interceptors with dlsym
 * before their shadow memory exists. Such functions are left uninstrumented. */
#define KIWI_SANITIZER_SAFE __attribute__((no_sanitize_address, no_sanitize_thread))

typedef void *(*kiwi_dlsym_fn)(void *, const char *);
/* The dynamic linker's own dlsym (hook.c replaces dlsym); sanitizer-safe. */
kiwi_dlsym_fn kiwi_driver_dlsym(void);
/* hook.c found the driver's function for a hooked symbol (by dlsym on handle, or through
 * cuGetProcAddress with a NULL handle): the first one found stands. */
void kiwi_driver_found(enum kiwi_hook_id id, void *address, void *handle);

/* The start of every hook, inside the replacement for symbol: reads the environment, and
 * declares var, the driver's own symbol with the replacement's own type; with no driver loaded
 * the hook returns CUDA_ERROR_NOT_INITIALIZED. */
#define KIWI_REAL(var, symbol)                                                 \
    kiwi_init();                                                               \
    __typeof__(&symbol) var = (__typeof__(&symbol))kiwi_real(HOOK_##symbol);   \
    if (!var)                                                                  \
        return CUDA_ERROR_NOT_INITIALIZED

/* ---- news.c ------------------------------------------------------------------------------ */

/* News the comm thread takes when it wakes (kiwi_news_take). */
enum { KIWI_NEWS_WORKING_SET = 1u << 0 }; /* the allocation totals changed: report them */

/* The client, as the library loads: the function that starts it (its thread). */
void kiwi_news_subscribe(void (*start)(void));
/* The client's thread runs: fd is the write end of its wake-up pipe. */
void kiwi_news_listen(int fd);
/* Something needs the client (GPU work, an allocation): starts it, the first time. */
void kiwi_news_need_client(void);
/* The client's thread says it is the one; whether the calling thread is it. */
void kiwi_news_client_thread(void);
bool kiwi_news_on_client_thread(void);
/* Wakes the client's thread, if it runs; async-signal-safe. */
void kiwi_news_wake(void);
/* Starts the client if need be, notes the news, and wakes it (once, until it takes them). */
void kiwi_news_post(unsigned news);
/* For the comm thread itself: notes news without waking anyone. */
void kiwi_news_set(unsigned news);
/* For the comm thread: which of news were posted since it last took them (and clears them). */
unsigned kiwi_news_take(unsigned news);
void kiwi_news_after_fork(void);

/* ---- gate.c ------------------------------------------------------------------------------ */

/* The one lock around the gate's waiters and the hold's state (client/); kiwi_changed is
 * broadcast whenever either changes. */
extern pthread_mutex_t kiwi_lock;
extern pthread_cond_t kiwi_changed;

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
/* Under kiwi_lock: the calls waiting at the closed gate now (each wakes the client as it
 * starts waiting), and the seconds all calls have waited there. */
int kiwi_gate_waiters(void);
double kiwi_gate_seconds_waiting(void);
/* Under kiwi_lock: whether calls at the closed gate fail instead of waiting (the fail-closed
 * policy, while the daemon is away). */
void kiwi_gate_refuse(bool refuse);
bool kiwi_gate_refusing(void);
/* Under kiwi_lock: the calls waiting at the closed gate now give up, for want of room: each
 * returns CUDA_ERROR_OUT_OF_MEMORY (the client's, when the daemon refused room past
 * KIWI_ROOM_TIMEOUT). kiwi_gate_give_ups counts it, for other waits that end alike. */
void kiwi_gate_give_up(void);
unsigned kiwi_gate_give_ups(void);
/* From now on kiwi_gate_used_since_mark says whether any call has left the gate (free_ranges.c). */
void kiwi_gate_mark(void);
bool kiwi_gate_used_since_mark(void);
/* A forked child: kiwi_lock afresh, the gate closed, nobody waiting. */
void kiwi_gate_after_fork(void);

/* ---- room_wait.c ------------------------------------------------------------------------- */

/* Whether an allocation of size bytes the card cannot back now may wait for the daemon to make
 * room: not on the client's own thread, not while a graph capture is open (said, when not). */
bool kiwi_room_may_wait(size_t size);
/* An allocation of size bytes has its addresses and waits until the daemon has made room and
 * the restore on its grant has mapped it: CUDA_SUCCESS; or CUDA_ERROR_OUT_OF_MEMORY when the
 * room cannot be had (said on stderr, with why), CUDA_ERROR_SYSTEM_NOT_READY when interrupted. */
CUresult kiwi_room_wait(size_t size);
/* Under kiwi_lock: the allocations waiting for room now, their memory not mapped yet (the
 * client asks for the GPU for them, or, holding it, gives it back and asks again). */
int kiwi_room_waiters(void);
/* Under kiwi_lock: for the client: the room cannot be had (why); the waits now end. */
void kiwi_room_fail(const char *why);
void kiwi_room_after_fork(void);

/* ---- interrupt.c ------------------------------------------------------------------------- */

/* How many interrupts there have been: a wait that sees the count move gives up. */
unsigned kiwi_interrupts(void);
/* Counts an interrupt and wakes the waiters; async-signal-safe. */
void kiwi_interrupt(void);
/* Puts the shim's SIGINT handler in front of the one installed now; 0 on success. */
int kiwi_interrupt_catch(void);

/* ---- captures.c -------------------------------------------------------------------------- */

/* Around the driver's call that begins a capture on stream: no synchronization can start
 * meanwhile; began says whether it did. */
void kiwi_capture_beginning(void);
void kiwi_capture_began(CUstream stream, bool began, CUstreamCaptureMode mode);
/* After the driver's call that ends a capture on stream (whether or not it succeeded). */
void kiwi_capture_ended(CUstream stream);
/* How many streams are being captured into graphs now. */
int kiwi_capture_open(void);
/* For the comm thread: true when no capture is open, and then none can begin until
 * kiwi_capture_unhold (the synchronization in between would invalidate it). */
bool kiwi_capture_hold(void);
void kiwi_capture_unhold(void);
/* For a thread that pins host memory (a "potentially unsafe" call while a capture begun in the
 * global mode is open in another thread: it fails and invalidates that capture): waits until
 * no such capture is open, and returns with none able to begin until kiwi_capture_unhold. */
void kiwi_capture_hold_for_pinning(void);
/* Whether a capture begun in the global mode is open now. */
bool kiwi_capture_global_open(void);
void kiwi_capture_after_fork(void);

/* ---- cgroup.c ---------------------------------------------------------------------------- */

/* The room the process's cgroup leaves it (its memory limit less what it uses, the least up
 * the tree) and that limit; false when no limit applies (or none can be read). */
bool kiwi_cgroup_room(uint64_t *room, uint64_t *limit);

/* ---- memory.c, limit.c (memory.h: the table's entries, for the allocating entry points) --- */

struct kiwi_working_set {
    uint64_t bytes;      /* everything this process allocated on the GPU through the driver */
    uint64_t evictable;  /* what the pager can move to host memory: the managed part, and the
                            vmm evictor's mapped memory less what was pinned in place */
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

/* Which allocations a copy of the table holds: the managed ones (the managed evictor's), the
 * ones the vmm evictor maps (not those pinned in place), or both: what can be evicted. */
enum kiwi_ranges { KIWI_RANGES_MANAGED, KIWI_RANGES_MAPPED, KIWI_RANGES_EVICTABLE };

/* For the pager: a copy of those allocations, taken once, and no free can run until
 * kiwi_memory_paging_end (which frees the copy). */
size_t kiwi_memory_paging_begin(enum kiwi_ranges which, struct kiwi_range **ranges);
/* A copy of those allocations, and the table's generation, which moves whenever an allocation
 * is added or removed (free_ranges.c). */
size_t kiwi_memory_ranges(enum kiwi_ranges which, struct kiwi_range **ranges,
                          uint64_t *generation);
uint64_t kiwi_memory_generation(void);
void kiwi_memory_paging_end(struct kiwi_range *ranges);
void kiwi_memory_after_fork(void);
/* Around a driver call that frees memory: the pager does not move the working set meanwhile. */
void kiwi_memory_free_begin(void);
void kiwi_memory_free_end(void);
/* A context ended: forgets every allocation made in it; returns their bytes. */
uint64_t kiwi_memory_forget_context(CUcontext ctx);
/* Frees the managed memory graph capture kept from being freed (kiwi_pager_free_deferred). */
void kiwi_memory_free_deferred(void);

/* ---- pools.c ----------------------------------------------------------------------------- */

/* The device's managed memory pool, made on first use; NULL where the driver has none. */
CUmemoryPool kiwi_pool_of(CUdevice device);
bool kiwi_pool_is_ours(CUmemoryPool pool);
/* Gives the memory the pools keep for reuse back to the driver (before an eviction). */
void kiwi_pool_trim(void);
void kiwi_pool_forget_device(CUdevice device);
void kiwi_pool_after_fork(void);

/* ---- the pager: pager.c, contexts.c, free_ranges.c (pager.h: the files behind them) ------- */

enum kiwi_page_direction { KIWI_PAGE_OUT, KIWI_PAGE_IN };

/* Where this process's memory is now: on its GPU (what the shim allocated and mapped there)
 * and in host memory (moved there by an eviction); and the host memory the vmm evictor holds
 * for its shadows, and how much of that is pinned. */
struct kiwi_residency {
    uint64_t resident;
    uint64_t host;
    uint64_t shadow;
    uint64_t shadow_pinned;
    uint64_t staging;       /* the vmm evictor's pinned staging ring, for chunks without one */
    uint64_t pin_budget;    /* what it may keep pinned (the daemon's word, or its own) */
    uint64_t disk;          /* evicted, and in spill files on disk rather than host memory */
    double seconds_pinning; /* spent making shadows, off the switch path */
};

struct kiwi_transfer {
    uint64_t bytes;
    double seconds;
    uint64_t skipped;   /* free in the framework's cache: left where they were */
    uint64_t discarded; /* of those, dropped by the driver (cuMemDiscardBatchAsync), or under
                           vmm released without a copy */
    /* A move that could not be made and was rolled back (a restore without room on the card):
     * why, for the scheduler and the log; NULL when the move went through. */
    const char *failed;
    /* Called on the mover's thread each time the way out has released another
     * KIWI_PROGRESS_BYTES from the card, with where the memory is then (the client reports
     * it, so the next holder's way in may start); NULL for none. It must not call the pager. */
    void (*progress)(const struct kiwi_residency *now, void *arg);
    void *progress_arg;
};

#define KIWI_PROGRESS_BYTES (256ull << 20)

struct kiwi_stream_order; /* memory.h */

/* An evictor: how this process's memory leaves its GPU and comes back, as one table of
 * operations (SQLite's sqlite3_io_methods is the model), one instance per evictor, chosen once
 * by the pager (pager.c); nothing outside the pager asks which evictor runs, only what the
 * chosen one does. A NULL operation, or a false flag, is not that evictor's business.
 *
 *   managed     (managed.c) the shim converts allocations to managed memory and moves them
 *               itself, by prefetch; the driver keeps their chunks on the card
 *   vmm         (vmm_evictor.c) the shim backs allocations with physical memory it maps
 *               itself, and moves them by copy, unmapping and releasing what it copied, so the
 *               card is free for real (vmm.c, vmm_move.c)
 *   checkpoint  (checkpoint.c) allocations stay device memory, and the daemon suspends the
 *               process from outside with the driver's checkpoint API: the shim moves nothing
 */
struct kiwi_evictor {
    const char *name; /* as register proposes it and the stats say it */
    /* What register says instead to a daemon that predates this evictor and refused its name
     * (one that pages itself understands "managed" the same); NULL when every daemon knows it. */
    const char *name_for_old_daemons;
    /* A device allocation (cuMemAlloc and what is built on it) of size bytes in ctx on device,
     * within the limit; order: a stream-ordered allocation's pool and stream, NULL for others. */
    CUresult (*allocate)(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                         const struct kiwi_stream_order *order);
    /* cuMemAllocManaged's allocation. */
    CUresult (*allocate_managed)(CUdeviceptr *dptr, size_t size, unsigned int flags,
                                 CUcontext ctx, CUdevice device);
    /* A stream-ordered allocation on stream (cuMemAllocAsync; from_pool: cuMemAllocFromPoolAsync
     * of pool) as this evictor makes one; false (or NULL) when it makes it as a plain one. */
    bool (*allocate_ordered)(CUdeviceptr *dptr, size_t size, CUstream stream, CUmemoryPool pool,
                             bool from_pool, CUresult *result);
    /* Moves the working set to host memory or back and waits (kiwi_pager_move); NULL: the shim
     * moves nothing, the daemon does from outside. */
    void (*move)(enum kiwi_page_direction direction, struct kiwi_transfer *moved);
    /* The disk tier's moves (kiwi_pager_tier); NULL: it has none. */
    void (*tier)(enum kiwi_page_direction direction, uint64_t bytes, struct kiwi_transfer *moved);
    void (*residency)(struct kiwi_residency *out); /* where the memory is now */
    /* Whether an eviction would free more than the table's evictable memory (memory kept
     * mapped for reuse); whether memory is away, a restore due before any work. */
    bool (*movable)(void);
    bool (*away)(void);
    /* After every context was synchronized: the frees that waited for it. */
    void (*free_deferred)(void);
    /* These three go to every evictor, chosen or not (memory of another kind may be there: the
     * program's own managed memory under vmm): a context ended (under the contexts' lock); the
     * daemon's word on the host memory that may stay pinned; a fork's child starts afresh. */
    void (*forget_context)(CUcontext ctx);
    void (*pin_budget)(uint64_t bytes);
    void (*after_fork)(void);
    /* It pages the process itself: cuMemGetInfo tells the room there is once others are out. */
    bool pages_itself;
    /* The daemon moves the whole process from outside: a release makes no CUDA call of the
     * shim's, and an eviction is the daemon's (its driver calls block meanwhile). */
    bool moved_from_outside;
    /* A cell of a process whose memory was evicted asks for the GPU at once, at its begin (its
     * restore is due before any work, and waits that do not pass the gate may block). */
    bool cell_asks_when_evicted;
    /* cuDeviceGetMemPool answers the driver's pool (else the shim's managed pool, pools.c). */
    bool keeps_driver_pools;
};

/* The evictor this side can offer the daemon (the one chosen, once chosen): vmm where
 * KIWI_EVICT allows it and the device supports the virtual memory management API, else
 * checkpoint where KIWI_EVICT allows it and the driver has the API, else managed. */
const struct kiwi_evictor *kiwi_pager_offer(void);
/* The daemon's answer in `registered` (the evictor it carries out; "" from a daemon that knows
 * none): the choice follows it, where none was made yet. */
void kiwi_pager_answered(const char *evictor);
/* The choice so far, never waiting: before one, an evictor named "undecided" that moves what
 * managed memory there is. */
const struct kiwi_evictor *kiwi_pager_evictor(void);
/* For an allocation, which cannot change kind later: the choice, waiting (bounded) for the
 * daemon's word when the offer is checkpoint. */
const struct kiwi_evictor *kiwi_pager_allocator(void);

/* The one entry: moves the working set to host memory (out) or back to its GPU (in), by the
 * chosen evictor, and waits for it. What the framework's cache holds free (free_ranges.c) is
 * not moved either way, and discarded on the way out where it can be. The checkpoint evictor
 * moves nothing here: the daemon does, from outside. */
void kiwi_pager_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved);
/* The disk tier: evicted memory from host memory to spill files (out: bytes at least, 0 all) or
 * back (in), and waits; moved->failed says why not (the memory stayed where it was). */
void kiwi_pager_tier(enum kiwi_page_direction direction, uint64_t bytes,
                     struct kiwi_transfer *moved);
/* Where the memory is now (kiwi_residency). */
void kiwi_pager_residency(struct kiwi_residency *out);
/* Whether an eviction would free anything on the card: evictable memory, or under vmm memory
 * kept mapped for reuse. */
bool kiwi_pager_movable(void);
/* Whether memory an eviction moved out is still away (a restore must come before any work). */
bool kiwi_pager_away(void);
/* Frees what graph capture kept from being freed; the comm thread calls it after it has
 * synchronized every context. */
void kiwi_pager_free_deferred(void);
/* Remembers the calling thread's current context, so that the comm thread can synchronize it
 * and move memory in it; returns it (NULL when none is current). */
CUcontext kiwi_pager_note_context(CUdevice *device);
/* Waits for all work this process queued on the GPU; false when a context's synchronization
 * failed, so that work may still be running. */
bool kiwi_pager_synchronize(void);
/* The device's primary context was retained (that is how the runtime gets it); and, once it
 * has ended, which it was (NULL when unknown): its allocations and pool go with it. */
void kiwi_pager_note_primary(CUdevice device, CUcontext ctx);
CUcontext kiwi_pager_primary_ended(CUdevice device);
/* A context ended: the pager no longer synchronizes it or moves memory in it. */
void kiwi_pager_forget_context(CUcontext ctx);
/* The daemon's word on the host memory the vmm evictor may keep pinned for its shadows. */
void kiwi_pager_pin_budget(uint64_t bytes);
void kiwi_pager_after_fork(void);

/* free_ranges.c: before the kernel reads its framework's free blocks: marks the gate, notes
 * the table. */
void kiwi_free_ranges_begin(void);
/* The free blocks read since begin; returns the bytes believed (whole 2 MiB blocks inside
 * managed allocations), or -1 without a begin or with bad arguments. */
long long kiwi_free_ranges_set(const unsigned long long *ptrs, const unsigned long long *sizes,
                               size_t count);
/* What is believed now: 0 once any GPU call has run, or the table changed, since begin. */
uint64_t kiwi_free_ranges_bytes(void);
/* A grant: the hints end (the gate opens). */
void kiwi_free_ranges_forget(void);

#endif
