/* A fake libcuda.so.1 for the shim's tests: no GPU, every call recorded.
 *
 * Each call appends one line "name key=value ..." to the file named by FAKE_CUDA_LOG, with a
 * single write, so the test can read the order of calls across threads. Device pointers of
 * cuMemAlloc, cuMemAllocManaged, cuMemAllocPitch and the stream-ordered allocations are
 * addresses handed out from a counter, with no bytes behind them: tests may "allocate" far more
 * than the machine has, and copies to and from them are only recorded. They are counted all the
 * same (see "The card's memory" below). FAKE_CUDA_TOTAL sets the GPU's memory (default 16 GiB);
 * FAKE_CUDA_LAUNCH_SECONDS makes each kernel launch take that long, like a synchronous call
 * that waits for the GPU; FAKE_CUDA_CAPTURING_STREAM names a stream under graph capture;
 * FAKE_CUDA_MANAGED_ERROR makes cuMemAllocManaged fail with that error code;
 * FAKE_CUDA_STREAM_SYNC_GATE names a file: cuStreamSynchronize (after recording itself) waits
 * until it exists, after prefetches to the host, so a test can hold an eviction in the middle
 * and look around; FAKE_CUDA_LINK_GBPS makes copies take time on a modelled link
 * (fake_streams.c). Other FAKE_CUDA_* variables are described where they act.
 *
 * The checkpoint API (cuCheckpointProcess*) acts on another process, as the real one does:
 * with FAKE_CUDA_CHECKPOINT_DIR set, each process that loads the fake maps a small shared page
 * there, named by its pid, holding its state (running, locked, checkpointed, failed) and the
 * count of its CUDA calls in progress. A daemon loading the same fake locks a process by
 * writing its state and waiting (up to the lock's timeout) for those calls to end; from then
 * on the process's calls really block until it is unlocked. A process that allocated managed
 * memory (UVM), or was started with FAKE_CUDA_CHECKPOINT_FAIL=1, fails its checkpoint and is
 * left FAILED, as the r570 driver does. FAKE_CUDA_NO_CHECKPOINT=1 makes cuGetProcAddress deny
 * the API, as a driver before r570 does.
 *
 * The card's memory. The fake counts the bytes on the card: every allocation above until it is
 * freed (managed memory too, even after a prefetch to the host: the real driver keeps its
 * chunks, docs in ../shared/design/gpu-memory-swap.md, section 2), freed stream-ordered memory
 * until its pool is trimmed (by cuMemPoolTrimTo, or at a synchronize: release threshold 0), and
 * the physical handles of the virtual memory management API. cuMemGetInfo reports what is left
 * (less FAKE_CUDA_OTHERS_USED). With FAKE_CUDA_DEVICE naming a file, the count is the card's,
 * shared by every process that loads the fake with the same file, with one row per process, as
 * NVML has (device_memory below; tests read it with fake_device.py); a process's bytes leave the
 * card when it exits, or when it dies and another process looks. Without it the count is this
 * process's alone. A checkpoint (above) moves the process's bytes off a shared card and the
 * restore brings them back, failing with CUDA_ERROR_OUT_OF_MEMORY when they no longer fit.
 * fake_cuda_physical_used() and fake_cuda_process_used() say the same to a caller in-process.
 *
 * The virtual memory management API (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
 * ...) is modelled with real bytes: each physical handle is backed by anonymous memory
 * (committed only where written), counted on the card from cuMemCreate until it is released AND
 * unmapped everywhere, and refused with CUDA_ERROR_OUT_OF_MEMORY past the card's capacity. The
 * fake refuses what the driver refuses: sizes, offsets and addresses that are not multiples of
 * the granularity (FAKE_CUDA_VMM_GRANULARITY, default 2 MiB), a map outside one reservation or
 * over another map, an unmap or a cuMemSetAccess that cuts a mapping (it must cover whole
 * mappings: no sub-range), freeing a reservation that still has mappings, a released handle.
 * Copies (cuMemcpy*, the memsets) to and from reserved addresses move real bytes: a byte that is
 * not mapped fails the call with CUDA_ERROR_INVALID_VALUE, one mapped without the access it
 * needs (cuMemSetAccess; a new mapping has none) with CUDA_ERROR_ILLEGAL_ADDRESS. So do the
 * fake's two kernels, launched with cuLaunchKernel: FAKE_KERNEL_FILL (0xF111; parameters: the
 * device pointer, the size_t byte count, the unsigned char value) and FAKE_KERNEL_COPY (0xF222;
 * destination, source, byte count). Any other launch only records itself.
 * cuDeviceGetAttribute says the device supports the API; FAKE_CUDA_NO_VMM=1 makes it say not,
 * and the API's calls fail with CUDA_ERROR_NOT_SUPPORTED, as on a device without it. Host
 * memory from cuMemAllocHost is real (and anonymous, committed where written); cuMemHostRegister
 * refuses an overlap, cuMemHostUnregister what was not registered. Streams, events and the link
 * between host and card are fake_streams.c's: work queued on a stream is done later, by a
 * worker thread of the stream, and copies may take the time a link of FAKE_CUDA_LINK_GBPS
 * would. The stream that FAKE_CUDA_PENDING_STREAM names (e.g. 0x77) does no work until the file
 * that FAKE_CUDA_PENDING_UNTIL names exists: until then an event recorded on it is not ready
 * (cuEventQuery says CUDA_ERROR_NOT_READY), and cuEventSynchronize, cuStreamSynchronize of it
 * and cuCtxSynchronize wait for the file. FAKE_CUDA_DEVICES=N makes N devices (default 1): a
 * context handle 0xC0DE00 + d (made current with cuCtxSetCurrent) is device d's, any other is
 * device 0's, and cuMemSetAccess accepts every device (device 0's access is the one modelled;
 * cuCtxEnablePeerAccess only records itself). The pointer queries (cuPointerGetAttribute(s),
 * cuPointerSetAttribute, cuMemGetAddressRange) answer from this model, and fail on addresses
 * that are reserved but not mapped as the driver does: see "what the driver says of an
 * address" below. FAKE_CUDA_NO_GPU_DIRECT_RDMA=1 makes a device without GPUDirect RDMA.
 * A handle created with the POSIX file descriptor type is backed by a memfd: exported
 * (cuMemExportToShareableHandle) and imported in another process, it shows the same bytes there
 * (FAKE_CUDA_NO_POSIX_FD_HANDLES=1 refuses the type). Legacy IPC (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle) works on cuMemAlloc memory only, between two processes, and refuses a
 * handle the fake did not make.
 *
 * cuGetProcAddress answers like the real driver: by base name, CUDA version and default-stream
 * flavour, with its own functions (the library is linked -Bsymbolic, so the shim's exports of
 * the same names do not stand in for them), except "cuMemGetInfo", for which it hands out an
 * internal entry point that dlsym cannot see (the shim must then hook it by name). It answers
 * for every entry point that the real CUDA 12 and 13 runtimes ask for and the shim must catch,
 * so that tests loading a real libcudart see each of those requests answered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

#define EXPORT __attribute__((visibility("default")))

#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_NOT_SUPPORTED 801
#define PRIMARY_CONTEXT ((CUcontext)0xC0FFEE)

static atomic_ullong next_address = 0x7f0000000000ull;
static atomic_ullong next_stream = 0x5000;
/* CU_POINTER_ATTRIBUTE_BUFFER_ID: one per allocation (and per VMM mapping), never reused. */
static atomic_ullong next_buffer_id = 1;
static __thread CUcontext current;

static void record(const char *fmt, ...)
{
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path)
        return;
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, args);
    va_end(args);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t ignored = write(fd, line, (size_t)n);
        (void)ignored;
        close(fd);
    }
}

static unsigned long long total_memory(void)
{
    const char *text = getenv("FAKE_CUDA_TOTAL");
    return text ? strtoull(text, NULL, 10) : 16ull << 30;
}

static unsigned long long others_used(void)
{
    const char *others = getenv("FAKE_CUDA_OTHERS_USED"); /* may change while a test runs */
    return others ? strtoull(others, NULL, 10) : 0;
}

/* ---- the card's memory: bytes in use, per card and per process ----------------------------
 *
 * The layout is read by the tests (fake_device.py): 8 bytes of bytes in use on the card, then
 * DEVICE_PROCESSES rows of (pid, bytes on the card, bytes a checkpoint moved off), 8 bytes
 * each, native byte order. A row's pid is 0 when free and -1 while a process reaps it. */

#define DEVICE_PROCESSES 64

struct device_process {
    _Atomic long long pid;
    atomic_ullong bytes;
    atomic_ullong checkpointed;
};

struct device_memory {
    atomic_ullong used;
    struct device_process process[DEVICE_PROCESSES];
    /* When each copy engine (to the device, to the host) is free again: ns on CLOCK_MONOTONIC,
     * the same clock in every process (fake_streams.c). */
    atomic_llong engine_free_at[2];
};

static struct device_memory private_card;
static struct device_memory *card = &private_card;
static struct device_process *_Atomic own_row;
static long long own_pid;
static atomic_bool left_card; /* set at exit: nothing more is counted */

static struct device_memory *map_card(void)
{
    const char *path = getenv("FAKE_CUDA_DEVICE");
    if (!path)
        return &private_card;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return &private_card;
    struct stat status;
    /* Several processes may create it at once: each makes it at least this long (zeros). */
    bool sized = fstat(fd, &status) == 0 &&
                 (status.st_size >= (off_t)sizeof(struct device_memory) ||
                  ftruncate(fd, sizeof(struct device_memory)) == 0);
    void *page = sized ? mmap(NULL, sizeof(struct device_memory), PROT_READ | PROT_WRITE,
                              MAP_SHARED, fd, 0)
                       : MAP_FAILED;
    close(fd);
    return page == MAP_FAILED ? &private_card : page;
}

/* Takes bytes off a count, never below zero: a thread still freeing while the process exits
 * must not wrap the card's count for the other processes. */
static void count_down(atomic_ullong *count, unsigned long long bytes)
{
    unsigned long long now = atomic_load(count);
    while (!atomic_compare_exchange_weak(count, &now, now > bytes ? now - bytes : 0))
        ;
}

/* A process that died without giving its bytes back (killed): its row is taken back and its
 * bytes leave the card, as the driver frees a dead process's memory. */
static void reap_dead_processes(void)
{
    for (int i = 0; i < DEVICE_PROCESSES; i++) {
        struct device_process *row = &card->process[i];
        long long pid = atomic_load(&row->pid);
        if (pid <= 0 || pid == own_pid || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        if (!atomic_compare_exchange_strong(&row->pid, &pid, -1))
            continue; /* another process reaps it */
        count_down(&card->used, atomic_exchange(&row->bytes, 0));
        atomic_store(&row->checkpointed, 0);
        atomic_store(&row->pid, 0);
    }
}

static void take_row(void)
{
    own_pid = getpid();
    atomic_store(&own_row, NULL);
    for (int round = 0; round < 2 && !atomic_load(&own_row); round++) {
        for (int i = 0; i < DEVICE_PROCESSES && !atomic_load(&own_row); i++) {
            struct device_process *row = &card->process[i];
            long long free_row = 0;
            if (atomic_compare_exchange_strong(&row->pid, &free_row, own_pid)) {
                atomic_store(&row->bytes, 0);
                atomic_store(&row->checkpointed, 0);
                atomic_store(&own_row, row);
            }
        }
        if (!atomic_load(&own_row))
            reap_dead_processes();
    }
}

/* At exit the process's memory leaves the card. (A forked child has a row of its own.) */
static void give_row_back(void)
{
    struct device_process *row = atomic_load(&own_row);
    if (!row || atomic_load(&row->pid) != (long long)getpid())
        return;
    atomic_store(&left_card, true);
    count_down(&card->used, atomic_exchange(&row->bytes, 0));
    atomic_store(&row->pid, 0);
}

/* Puts bytes on the card for this process. refuse_when_full: fail when they do not fit (the
 * physical handles of cuMemCreate); the other allocations never fail for want of room, since
 * the tests' workloads "allocate" far more than a card has. */
static bool card_take(unsigned long long bytes, bool refuse_when_full)
{
    if (atomic_load(&left_card))
        return true; /* the process exits: nothing more is on the card for it */
    bool reaped = false;
    for (;;) {
        unsigned long long used = atomic_load(&card->used);
        unsigned long long capacity = total_memory(), others = others_used();
        bool fits = others <= capacity && bytes <= capacity - others &&
                    used <= capacity - others - bytes;
        if (refuse_when_full && !fits) {
            if (reaped)
                return false;
            reap_dead_processes();
            reaped = true;
            continue;
        }
        if (atomic_compare_exchange_weak(&card->used, &used, used + bytes))
            break;
    }
    struct device_process *row = atomic_load(&own_row);
    if (row)
        atomic_fetch_add(&row->bytes, bytes);
    return true;
}

static void card_give(unsigned long long bytes)
{
    if (atomic_load(&left_card))
        return; /* the process exits: its bytes left the card with its row */
    struct device_process *row = atomic_load(&own_row);
    count_down(&card->used, bytes);
    if (row)
        count_down(&row->bytes, bytes);
}

static struct device_process *row_of(int pid)
{
    for (int i = 0; i < DEVICE_PROCESSES; i++)
        if (atomic_load(&card->process[i].pid) == pid)
            return &card->process[i];
    return NULL;
}

/* A checkpoint releases all of the process's GPU memory. (The process is locked: its own
 * calls, which change its row, wait.) */
static void card_checkpoint(int pid)
{
    struct device_process *row = row_of(pid);
    if (!row)
        return;
    unsigned long long bytes = atomic_exchange(&row->bytes, 0);
    atomic_fetch_add(&row->checkpointed, bytes);
    count_down(&card->used, bytes);
}

/* The restore brings it back, where it fits. */
static bool card_restore(int pid)
{
    struct device_process *row = row_of(pid);
    if (!row)
        return true;
    unsigned long long bytes = atomic_load(&row->checkpointed);
    for (;;) {
        unsigned long long used = atomic_load(&card->used);
        unsigned long long capacity = total_memory(), others = others_used();
        if (others > capacity || bytes > capacity - others || used > capacity - others - bytes)
            return false;
        if (atomic_compare_exchange_weak(&card->used, &used, used + bytes))
            break;
    }
    atomic_store(&row->checkpointed, 0);
    atomic_fetch_add(&row->bytes, bytes);
    return true;
}

/* NVML's used memory of the card, and this process's row, for a caller in-process. */
EXPORT unsigned long long fake_cuda_physical_used(void)
{
    return atomic_load(&card->used) + others_used();
}

EXPORT unsigned long long fake_cuda_process_used(void)
{
    struct device_process *row = atomic_load(&own_row);
    return row ? atomic_load(&row->bytes) : 0;
}

/* ---- sorted tables ------------------------------------------------------------------------
 *
 * Each row starts with its key, an unsigned 64-bit address or id; rows are kept in key order.
 * All of the memory model's tables are guarded by memory_lock: written under its write lock,
 * read (copies included) under its read lock, so copies on several streams run at once. */

static pthread_rwlock_t memory_lock = PTHREAD_RWLOCK_INITIALIZER;

struct table {
    unsigned char *rows;
    size_t count, room, row_size;
};

static unsigned long long key_at(const struct table *t, size_t i)
{
    unsigned long long key;
    memcpy(&key, t->rows + i * t->row_size, sizeof key);
    return key;
}

static void *row_at(const struct table *t, size_t i)
{
    return t->rows + i * t->row_size;
}

/* How many rows have a key <= key: the row before that index is the last one at or below. */
static size_t rows_up_to(const struct table *t, unsigned long long key)
{
    size_t low = 0, high = t->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (key_at(t, middle) <= key)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* The row whose key is exactly key, or NULL. */
static void *row_with_key(const struct table *t, unsigned long long key, size_t *index)
{
    size_t at = rows_up_to(t, key);
    if (at == 0 || key_at(t, at - 1) != key)
        return NULL;
    if (index)
        *index = at - 1;
    return row_at(t, at - 1);
}

static bool table_insert(struct table *t, const void *row)
{
    if (t->count == t->room) {
        size_t room = t->room ? t->room * 2 : 64;
        unsigned char *rows = realloc(t->rows, room * t->row_size);
        if (!rows)
            return false;
        t->rows = rows;
        t->room = room;
    }
    unsigned long long key;
    memcpy(&key, row, sizeof key);
    size_t at = rows_up_to(t, key);
    memmove(t->rows + (at + 1) * t->row_size, t->rows + at * t->row_size,
            (t->count - at) * t->row_size);
    memcpy(t->rows + at * t->row_size, row, t->row_size);
    t->count++;
    return true;
}

static void table_remove(struct table *t, size_t at)
{
    memmove(t->rows + at * t->row_size, t->rows + (at + 1) * t->row_size,
            (t->count - at - 1) * t->row_size);
    t->count--;
}

/* ---- allocations with no bytes behind them: cuMemAlloc, managed, pitch, stream-ordered ---- */

enum allocation_kind { DEVICE_MEMORY, MANAGED_MEMORY, POOL_MEMORY };

struct allocation {
    CUdeviceptr address;
    unsigned long long size;
    int kind;
    void *pool;
    CUcontext ctx; /* NULL for stream-ordered memory, which belongs to no context */
    int device;
    unsigned long long buffer_id;
    bool sync_memops; /* cuPointerSetAttribute's CU_POINTER_ATTRIBUTE_SYNC_MEMOPS */
};

static struct table allocations = {.row_size = sizeof(struct allocation)};

/* Stream-ordered memory freed to a pool stays on the card until the pool is trimmed. */
#define MAX_POOLS 64
#define DEFAULT_POOL ((void *)0xDEF)
struct pool {
    void *id;
    unsigned long long idle;
};
static struct pool pools[MAX_POOLS];
static size_t pool_count;

/* Under the write lock. */
static struct pool *pool_of(void *id)
{
    for (size_t i = 0; i < pool_count; i++)
        if (pools[i].id == id)
            return &pools[i];
    if (pool_count == MAX_POOLS)
        return NULL;
    pools[pool_count] = (struct pool){id, 0};
    return &pools[pool_count++];
}

/* Under the write lock. */
static void trim_pool(struct pool *pool, unsigned long long keep)
{
    if (pool->idle > keep) {
        card_give(pool->idle - keep);
        pool->idle = keep;
    }
}

/* Every synchronization releases what pools hold idle (release threshold 0, the default). */
static void trim_pools(void)
{
    pthread_rwlock_wrlock(&memory_lock);
    for (size_t i = 0; i < pool_count; i++)
        trim_pool(&pools[i], 0);
    pthread_rwlock_unlock(&memory_lock);
}

static CUcontext current_context(void);
static int device_of(CUcontext ctx);

static CUdeviceptr take_addresses(size_t size, int kind, void *pool)
{
    unsigned long long rounded = (size + 0xFFFFF) & ~0xFFFFFull;
    CUdeviceptr address = atomic_fetch_add(&next_address, rounded ? rounded : 0x100000);
    CUcontext ctx = current_context();
    struct allocation row = {address, size, kind, pool, kind == POOL_MEMORY ? NULL : ctx,
                             device_of(ctx), atomic_fetch_add(&next_buffer_id, 1), false};
    pthread_rwlock_wrlock(&memory_lock);
    struct pool *from = kind == POOL_MEMORY ? pool_of(pool) : NULL;
    if (from && from->idle >= size)
        from->idle -= size; /* the pool's idle memory, handed out again */
    else
        card_take(size, false);
    if (!table_insert(&allocations, &row))
        card_give(size); /* out of host memory: uncounted, as if never made */
    pthread_rwlock_unlock(&memory_lock);
    return address;
}

/* Frees an allocation made above; false when address is none of them. stream_ordered: a
 * cuMemFreeAsync, whose pool keeps the bytes until it is trimmed. */
static bool give_addresses(CUdeviceptr address, bool stream_ordered)
{
    pthread_rwlock_wrlock(&memory_lock);
    size_t at;
    struct allocation *row = row_with_key(&allocations, address, &at);
    if (row) {
        struct pool *pool = row->kind == POOL_MEMORY && stream_ordered ? pool_of(row->pool) : NULL;
        if (pool)
            pool->idle += row->size;
        else
            card_give(row->size);
        table_remove(&allocations, at);
    }
    pthread_rwlock_unlock(&memory_lock);
    return row != NULL;
}

/* Under a lock: the allocation holding address, or NULL. */
static struct allocation *allocation_holding(CUdeviceptr address)
{
    size_t at = rows_up_to(&allocations, address);
    if (at == 0)
        return NULL;
    struct allocation *row = row_at(&allocations, at - 1);
    return address - row->address < (row->size ? row->size : 1) ? row : NULL;
}

/* Under a lock: is address inside one of those allocations? */
static bool inside_allocation(CUdeviceptr address)
{
    return allocation_holding(address) != NULL;
}

/* ---- the checkpoint API's state, shared between processes ------------------------------ */

enum { RUNNING, LOCKED, CHECKPOINTED, FAILED };

struct shared_state {
    atomic_int state;
    atomic_int in_progress; /* CUDA calls of this process under way */
    atomic_int uses_uvm;    /* it allocated managed memory: its checkpoint fails */
};

static struct shared_state *own_state;

static struct shared_state *map_state(int pid, bool create)
{
    const char *dir = getenv("FAKE_CUDA_CHECKPOINT_DIR");
    if (!dir)
        return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, pid);
    int fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDWR | O_CLOEXEC,
                  0600);
    if (fd < 0)
        return NULL;
    if (create && ftruncate(fd, sizeof(struct shared_state)) != 0) {
        close(fd);
        return NULL;
    }
    void *page = mmap(NULL, sizeof(struct shared_state), PROT_READ | PROT_WRITE, MAP_SHARED,
                      fd, 0);
    close(fd);
    return page == MAP_FAILED ? NULL : page;
}

/* Every call of the process passes here: once the process is locked, it waits. The same
 * handshake as the shim's gate: count the call in, then look at the state. */
static void call_begins(void)
{
    if (!own_state)
        return;
    for (;;) {
        atomic_fetch_add(&own_state->in_progress, 1);
        if (atomic_load(&own_state->state) == RUNNING)
            return;
        atomic_fetch_sub(&own_state->in_progress, 1);
        usleep(1000);
    }
}

static void call_ends(void)
{
    if (own_state)
        atomic_fetch_sub(&own_state->in_progress, 1);
}

/* The other process's state, when it is alive and runs over this fake. */
static struct shared_state *target(int pid)
{
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return NULL;
    return map_state(pid, false);
}

static void done_with(struct shared_state *s)
{
    munmap(s, sizeof *s);
}

struct lock_args { unsigned timeout_ms; unsigned reserved0; unsigned long long reserved1[7]; };

EXPORT CUresult cuCheckpointProcessLock(int pid, struct lock_args *args)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    int expected = RUNNING;
    CUresult result = 0;
    if (!atomic_compare_exchange_strong(&s->state, &expected, LOCKED)) {
        result = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        /* Wait for the calls under way, as the driver waits for submitted work. */
        unsigned timeout = args ? args->timeout_ms : 0, waited = 0;
        while (atomic_load(&s->in_progress) > 0 && (!timeout || waited < timeout)) {
            usleep(1000);
            waited++;
        }
        if (atomic_load(&s->in_progress) > 0) {
            atomic_store(&s->state, RUNNING);
            result = CUDA_ERROR_NOT_READY;
        }
    }
    done_with(s);
    record("cuCheckpointProcessLock pid=%d result=%d", pid, result);
    return result;
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, void *args)
{
    (void)args;
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = 0;
    if (atomic_load(&s->state) != LOCKED) {
        result = CUDA_ERROR_ILLEGAL_STATE;
    } else if (atomic_load(&s->uses_uvm)) {
        atomic_store(&s->state, FAILED);
        result = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        const char *delay = getenv("FAKE_CUDA_CHECKPOINT_SECONDS");
        if (delay)
            usleep((useconds_t)(atof(delay) * 1e6));
        card_checkpoint(pid);
        atomic_store(&s->state, CHECKPOINTED);
    }
    done_with(s);
    record("cuCheckpointProcessCheckpoint pid=%d result=%d", pid, result);
    return result;
}

static CUresult transition(const char *name, int pid, int from, int to)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = atomic_compare_exchange_strong(&s->state, &from, to)
        ? 0 : CUDA_ERROR_ILLEGAL_STATE;
    done_with(s);
    record("%s pid=%d result=%d", name, pid, result);
    return result;
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, void *args)
{
    (void)args;
    struct shared_state *s = target(pid);
    bool checkpointed = s && atomic_load(&s->state) == CHECKPOINTED;
    if (s)
        done_with(s);
    if (checkpointed && !card_restore(pid)) { /* its memory no longer fits on the card */
        record("cuCheckpointProcessRestore pid=%d result=%d", pid, CUDA_ERROR_OUT_OF_MEMORY);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return transition("cuCheckpointProcessRestore", pid, CHECKPOINTED, LOCKED);
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, void *args)
{
    (void)args;
    return transition("cuCheckpointProcessUnlock", pid, LOCKED, RUNNING);
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, int *state)
{
    struct shared_state *s = target(pid);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *state = atomic_load(&s->state);
    done_with(s);
    return 0;
}

EXPORT CUresult cuInit(unsigned flags) { record("cuInit flags=%u", flags); return 0; }
EXPORT CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
static int device_count(void)
{
    const char *text = getenv("FAKE_CUDA_DEVICES");
    int count = text ? atoi(text) : 1;
    return count > 0 && count <= 64 ? count : 1;
}
EXPORT CUresult cuDeviceGetCount(int *count) { *count = device_count(); return 0; }
EXPORT CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
/* The UUID is the bytes 00 01 02 ... 0f: GPU-00010203-0405-0607-0809-0a0b0c0d0e0f. */
EXPORT CUresult cuDeviceGetUuid_v2(char *uuid, int device)
{
    (void)device;
    for (int i = 0; i < 16; i++)
        uuid[i] = (char)i;
    return 0;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, int device)
{
    (void)device;
    *bytes = total_memory();
    return 0;
}
static CUcontext current_context(void)
{
    return current ? current : PRIMARY_CONTEXT;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current_context(); return 0; }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return 0; }
/* A context 0xC0DE00 + d is device d's (FAKE_CUDA_DEVICES); any other is device 0's. */
#define DEVICE_CONTEXT(d) ((CUcontext)(uintptr_t)(0xC0DE00 + (d)))
static int device_of(CUcontext context)
{
    uintptr_t ctx = (uintptr_t)context;
    return ctx >= 0xC0DE00 && ctx < 0xC0DE00 + (uintptr_t)device_count() ? (int)(ctx - 0xC0DE00)
                                                                          : 0;
}
EXPORT CUresult cuCtxGetDevice(int *device)
{
    *device = device_of(current);
    return 0;
}
EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    record("cuCtxEnablePeerAccess peer=%p flags=%u", peer, flags);
    return 0;
}

/* Contexts: any handle may be made current; the primary context is counted by reference. */
static atomic_int primary_references;

static CUresult destroy_context(const char *name, CUcontext ctx)
{
    if (current == ctx)
        current = NULL;
    record("%s ctx=%p", name, ctx);
    return 0;
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return destroy_context("cuCtxDestroy", ctx); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return destroy_context("cuCtxDestroy_v2", ctx); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int device)
{
    *ctx = PRIMARY_CONTEXT;
    record("cuDevicePrimaryCtxRetain device=%d references=%d", device,
           atomic_fetch_add(&primary_references, 1) + 1);
    return 0;
}
static CUresult release_primary(const char *name, int device)
{
    record("%s device=%d references=%d", name, device,
           atomic_fetch_sub(&primary_references, 1) - 1);
    return 0;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(int device)
{
    return release_primary("cuDevicePrimaryCtxRelease", device);
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int device)
{
    return release_primary("cuDevicePrimaryCtxRelease_v2", device);
}
static CUresult reset_primary(const char *name, int device)
{
    atomic_store(&primary_references, 0);
    record("%s device=%d", name, device);
    return 0;
}
EXPORT CUresult cuDevicePrimaryCtxReset(int device)
{
    return reset_primary("cuDevicePrimaryCtxReset", device);
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(int device)
{
    return reset_primary("cuDevicePrimaryCtxReset_v2", device);
}
EXPORT CUresult cuDevicePrimaryCtxGetState(int device, unsigned *flags, int *active)
{
    (void)device;
    *flags = 0;
    *active = atomic_load(&primary_references) > 0;
    return 0;
}
static bool invalidate_captures(void);

/* FAKE_CUDA_PENDING_STREAM's work completes once FAKE_CUDA_PENDING_UNTIL exists. */
static bool is_pending_stream(CUstream stream)
{
    const char *text = getenv("FAKE_CUDA_PENDING_STREAM");
    return text && (uintptr_t)stream == (uintptr_t)strtoull(text, NULL, 0);
}

static bool pending_work_done(void)
{
    const char *until = getenv("FAKE_CUDA_PENDING_UNTIL");
    return !until || access(until, F_OK) == 0;
}

static void wait_for_pending_work(void)
{
    while (getenv("FAKE_CUDA_PENDING_STREAM") && !pending_work_done())
        usleep(1000);
}

/* FAKE_CUDA_SYNC_ERROR: the error every cuCtxSynchronize returns (a sticky error on a real
 * GPU, such as 700, an illegal address). */
static void drain_context(void);
static void drain_stream(CUstream handle, bool per_thread);
static void make_stream(CUstream handle);
static CUresult sticky(void);

static CUresult cuCtxSynchronize_body(void)
{
    const char *error = getenv("FAKE_CUDA_SYNC_ERROR");
    bool invalidating = invalidate_captures();
    if (!invalidating)
        drain_context();
    if (!invalidating)
        trim_pools();
    record("cuCtxSynchronize ctx=%p%s", current ? current : PRIMARY_CONTEXT,
           invalidating ? " invalidated-capture" : "");
    if (invalidating)
        return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
    return error ? atoi(error) : sticky();
}
EXPORT CUresult cuCtxSynchronize(void)
{
    call_begins();
    CUresult result = cuCtxSynchronize_body();
    call_ends();
    return result;
}
EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags)
{
    *stream = (CUstream)(uintptr_t)atomic_fetch_add(&next_stream, 1);
    make_stream(*stream); /* the current context's */
    record("cuStreamCreate stream=%p flags=%u", *stream, flags);
    return 0;
}
/* Where the last prefetch went: FAKE_CUDA_STREAM_SYNC_GATE holds evictions (prefetches to the
 * host) only, not the restores around them. */
static atomic_int last_prefetch_device = 0;

static CUresult cuStreamSynchronize_body(CUstream stream)
{
    drain_stream(stream, false);
    record("cuStreamSynchronize stream=%p", stream);
    trim_pools();
    const char *gate = getenv("FAKE_CUDA_STREAM_SYNC_GATE");
    while (gate && atomic_load(&last_prefetch_device) == -1 && access(gate, F_OK) != 0)
        usleep(1000);
    return sticky();
}
EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    call_begins();
    CUresult result = cuStreamSynchronize_body(stream);
    call_ends();
    return result;
}

/* Graph capture as the driver does it in the global mode: cuCtxSynchronize while a capture
 * is open fails and invalidates it, and its cuStreamEndCapture then fails too (ending it all
 * the same). FAKE_CUDA_CAPTURING_STREAM names a stream (e.g. 0x66) that is being captured
 * without the fake having seen it begin. */
#define MAX_CAPTURES 16
static CUstream captures[MAX_CAPTURES];
static bool invalidated[MAX_CAPTURES];
static int capture_mode[MAX_CAPTURES];          /* CUstreamCaptureMode; v1 calls: global */
static pthread_t capture_thread[MAX_CAPTURES];  /* who began it */
static pthread_mutex_t captures_lock = PTHREAD_MUTEX_INITIALIZER;

static int capture_of(CUstream stream)
{
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i] == stream && stream)
            return i;
    return -1;
}

static CUresult begin_capture(const char *name, CUstream stream, int mode)
{
    pthread_mutex_lock(&captures_lock);
    int free_slot = capture_of(NULL);
    for (int i = 0; i < MAX_CAPTURES && free_slot < 0; i++)
        if (!captures[i])
            free_slot = i;
    bool began = stream && capture_of(stream) < 0 && free_slot >= 0;
    if (began) {
        captures[free_slot] = stream;
        invalidated[free_slot] = false;
        capture_mode[free_slot] = mode;
        capture_thread[free_slot] = pthread_self();
    }
    pthread_mutex_unlock(&captures_lock);
    record("%s stream=%p mode=%d", name, stream, mode);
    return began ? 0 : 1; /* CUDA_ERROR_INVALID_VALUE: the legacy stream, or already capturing */
}

static CUresult end_capture(const char *name, CUstream stream, void **graph)
{
    pthread_mutex_lock(&captures_lock);
    int i = capture_of(stream);
    bool was_invalidated = i >= 0 && invalidated[i];
    if (i >= 0)
        captures[i] = NULL;
    pthread_mutex_unlock(&captures_lock);
    if (graph)
        *graph = i >= 0 && !was_invalidated ? (void *)0x6A : NULL;
    record("%s stream=%p invalidated=%d", name, stream, was_invalidated);
    if (i < 0)
        return 906; /* CUDA_ERROR_STREAM_CAPTURE_UNMATCHED */
    return was_invalidated ? 901 : 0; /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
}

/* Invalidates every open capture; true when there was one. */
static bool invalidate_captures(void)
{
    bool any = false;
    pthread_mutex_lock(&captures_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (captures[i]) {
            invalidated[i] = true;
            any = true;
        }
    }
    pthread_mutex_unlock(&captures_lock);
    return any;
}

EXPORT CUresult cuStreamBeginCapture(CUstream stream)
{
    return begin_capture("cuStreamBeginCapture", stream, 0);
}
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    return begin_capture("cuStreamBeginCapture_ptsz", stream ? stream : (CUstream)2, 0);
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    return begin_capture("cuStreamBeginCapture_v2", stream, mode);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode)
{
    return begin_capture("cuStreamBeginCapture_v2_ptsz", stream ? stream : (CUstream)2, mode);
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, void *graph, const void *deps,
                                            const void *edges, size_t n, int mode)
{
    (void)graph; (void)deps; (void)edges; (void)n;
    return begin_capture("cuStreamBeginCaptureToGraph", stream, mode);
}
EXPORT CUresult cuStreamEndCapture(CUstream stream, void **graph)
{
    return end_capture("cuStreamEndCapture", stream, graph);
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, void **graph)
{
    return end_capture("cuStreamEndCapture_ptsz", stream ? stream : (CUstream)2, graph);
}

EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    const char *text = getenv("FAKE_CUDA_CAPTURING_STREAM");
    pthread_mutex_lock(&captures_lock);
    int i = capture_of(stream);
    *status = i < 0 ? 0 : invalidated[i] ? 2 : 1;
    pthread_mutex_unlock(&captures_lock);
    if (text && (uintptr_t)stream == (uintptr_t)strtoull(text, NULL, 0))
        *status = 1;
    return 0;
}

/* ---- the virtual memory management API: reservations, physical handles, mappings --------- */

#define MIB (1ull << 20)
#define VA_BASE 0x600000000000ull /* reservations: far from the counter's addresses above */
#define VA_END 0x700000000000ull
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_NONE 0
#define CU_MEM_ACCESS_FLAGS_PROT_READ 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CUDA_ERROR_NOT_PERMITTED 800
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116

/* CUmemLocation, CUmemAllocationProp and CUmemAccessDesc as cuda.h lays them out (checked
 * against NVIDIA's headers by test_fake_vmm.py). */
struct mem_location {
    int type;
    int id;
};
struct allocation_prop {
    int type;
    int requested_handle_types;
    struct mem_location location;
    void *win32_metadata;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
};
struct access_desc {
    struct mem_location location;
    int flags;
};

struct reservation {
    CUdeviceptr start;
    unsigned long long size;
};

/* A physical handle: on the card from cuMemCreate until it has no reference (cuMemRelease
 * drops the creator's, cuMemRetainAllocationHandle adds one) and no mapping. */
struct handle {
    unsigned long long id;
    unsigned long long size;
    unsigned char *backing;
    int references;
    int mappings;
    struct allocation_prop prop;
    int fd;        /* the backing's memfd, for a handle that may be exported; -1 otherwise */
    bool imported; /* from another process's export: on the card as that process's */
};

struct mapping {
    CUdeviceptr start;
    unsigned long long size;
    unsigned long long offset; /* into the handle */
    unsigned long long handle;
    unsigned char *backing;    /* the handle's, which outlives the mapping */
    int access;                /* device 0's; CU_MEM_ACCESS_FLAGS_PROT_NONE until set */
    unsigned long long buffer_id; /* new at each cuMemMap */
};

static struct table reservations = {.row_size = sizeof(struct reservation)};
static struct table handles = {.row_size = sizeof(struct handle)};
static struct table mappings = {.row_size = sizeof(struct mapping)};
static unsigned long long next_reservation = VA_BASE;
static unsigned long long next_handle = 1ull << 32; /* not an address the fake hands out */

static bool vmm_supported(void)
{
    return !getenv("FAKE_CUDA_NO_VMM");
}

/* FAKE_CUDA_NO_POSIX_FD_HANDLES=1: a device (or container) where cuMemCreate cannot make memory
 * exportable as a file descriptor, and refuses to. */
static bool posix_fd_handles(void)
{
    return !getenv("FAKE_CUDA_NO_POSIX_FD_HANDLES");
}

/* FAKE_CUDA_NO_GPU_DIRECT_RDMA=1: a device without GPUDirect RDMA, which refuses the flag in
 * cuMemCreate's properties. */
static bool gpu_direct_rdma(void)
{
    return !getenv("FAKE_CUDA_NO_GPU_DIRECT_RDMA");
}

static unsigned long long granularity(void)
{
    const char *text = getenv("FAKE_CUDA_VMM_GRANULARITY");
    unsigned long long bytes = text ? strtoull(text, NULL, 0) : 2 * MIB;
    return bytes ? bytes : 2 * MIB;
}

static bool whole_granules(unsigned long long value)
{
    return value % granularity() == 0;
}

/* Under a lock: the reservation holding all of [start, start + size), or NULL. */
static const struct reservation *reservation_holding(CUdeviceptr start, unsigned long long size)
{
    size_t at = rows_up_to(&reservations, start);
    if (at == 0)
        return NULL;
    const struct reservation *r = row_at(&reservations, at - 1);
    bool inside = start - r->start < r->size && size <= r->size - (start - r->start);
    return inside ? r : NULL;
}

/* Under a lock: does [start, start + size) overlap a row of t ((start, size) rows)? */
static bool overlaps(const struct table *t, CUdeviceptr start, unsigned long long size)
{
    size_t at = rows_up_to(t, start + size - 1);
    if (at == 0)
        return false;
    const struct reservation *before = row_at(t, at - 1); /* both row types begin so */
    return before->start + before->size > start;
}

/* Under a lock: the mapping holding address, or NULL. */
static struct mapping *mapping_at(CUdeviceptr address)
{
    size_t at = rows_up_to(&mappings, address);
    if (at == 0)
        return NULL;
    struct mapping *m = row_at(&mappings, at - 1);
    return address - m->start < m->size ? m : NULL;
}

/* Under a lock: the index of the first of the mappings that together are exactly
 * [start, start + size), one after the other, or -1 when a byte is not mapped or a mapping
 * sticks out at either end (a sub-range). *count: how many. */
static long whole_mappings(CUdeviceptr start, unsigned long long size, size_t *count)
{
    size_t first;
    if (!size || !row_with_key(&mappings, start, &first))
        return -1;
    unsigned long long covered = 0;
    size_t i = first;
    while (covered < size && i < mappings.count) {
        const struct mapping *m = row_at(&mappings, i);
        if (m->start != start + covered)
            return -1;
        covered += m->size;
        i++;
    }
    if (covered != size)
        return -1;
    *count = i - first;
    return (long)first;
}

static CUresult check_prop(const struct allocation_prop *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_NOT_SUPPORTED; /* host VMM memory is not modelled */
    if (prop->gpu_direct_rdma_capable && !gpu_direct_rdma())
        return CUDA_ERROR_NOT_SUPPORTED; /* a flag the device does not support */
    if (prop->requested_handle_types & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* Win32 and fabric handles are not modelled */
    if (prop->requested_handle_types && !posix_fd_handles())
        return CUDA_ERROR_NOT_SUPPORTED;
    return prop->location.id == 0 ? 0 : CUDA_ERROR_INVALID_DEVICE;
}

/* The host memory behind physical handles. Committed only where written: a test may create far
 * more than the host has. FAKE_CUDA_BACKING_CACHE keeps that many bytes of released handles'
 * memory for the next handles of their size (the benchmarks on the modelled link: a GPU's
 * memory needs no page faults on its first write, nor an munmap, which the fake's would cost
 * inside the link's time). */
struct backing {
    struct backing *next;
    size_t size;
};
static struct backing *backings; /* under memory_lock */
static unsigned long long backing_kept;

static void *backing_take(size_t size)
{
    pthread_rwlock_wrlock(&memory_lock);
    struct backing **b = &backings;
    while (*b && (*b)->size != size)
        b = &(*b)->next;
    struct backing *found = *b;
    if (found) {
        *b = found->next;
        backing_kept -= size;
    }
    pthread_rwlock_unlock(&memory_lock);
    if (found)
        return found;
    return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                -1, 0);
}

/* Under the write lock. */
static void backing_give(unsigned char *memory, size_t size)
{
    const char *text = getenv("FAKE_CUDA_BACKING_CACHE");
    unsigned long long cap = text ? strtoull(text, NULL, 0) : 0;
    if (backing_kept + size > cap || size < sizeof(struct backing)) {
        munmap(memory, size);
        return;
    }
    struct backing *b = (struct backing *)(void *)memory;
    *b = (struct backing){backings, size};
    backings = b;
    backing_kept += size;
}

/* Under the write lock: a handle with no reference and no mapping leaves the card. */
static void drop_if_unused(size_t at)
{
    struct handle *h = row_at(&handles, at);
    if (h->references > 0 || h->mappings > 0)
        return;
    if (h->fd >= 0) { /* a memfd's mapping, shared with another process: never kept */
        munmap(h->backing, h->size);
        close(h->fd);
    } else {
        backing_give(h->backing, h->size);
    }
    if (!h->imported)
        card_give(h->size);
    table_remove(&handles, at);
}

static CUresult memory_get_granularity_body(size_t *bytes, const struct allocation_prop *prop,
                                            int option)
{
    CUresult result = check_prop(prop);
    if (!vmm_supported())
        result = CUDA_ERROR_NOT_SUPPORTED;
    else if (!bytes || (option != 0 && option != 1))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == 0)
        *bytes = granularity();
    record("cuMemGetAllocationGranularity option=%d result=%d", option, result);
    return result;
}

static CUresult address_reserve_body(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr hint, unsigned long long flags)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!ptr || !size || !whole_granules(size) || flags || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long align = alignment > granularity() ? alignment : granularity();
    CUresult result = CUDA_ERROR_OUT_OF_MEMORY; /* the driver's answer when VA runs out */
    pthread_rwlock_wrlock(&memory_lock);
    CUdeviceptr start = 0;
    bool hint_free = hint && hint % align == 0 && hint >= VA_BASE && size <= VA_END - hint &&
                     !overlaps(&reservations, hint, size);
    if (hint_free) {
        start = hint; /* a hint, taken when it is free */
    } else {
        start = (next_reservation + align - 1) / align * align;
        if (start >= VA_END || size > VA_END - start)
            start = 0;
        else
            next_reservation = start + size;
    }
    struct reservation row = {start, size};
    if (start && table_insert(&reservations, &row)) {
        *ptr = start;
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult address_free_body(CUdeviceptr ptr, size_t size)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    size_t at;
    const struct reservation *r = row_with_key(&reservations, ptr, &at);
    /* The whole reservation, as reserved, and nothing mapped in it any more. */
    if (r && r->size == size && !overlaps(&mappings, ptr, size)) {
        table_remove(&reservations, at);
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult memory_create_body(unsigned long long *id, size_t size,
                                   const struct allocation_prop *prop, unsigned long long flags)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = check_prop(prop);
    if (result)
        return result;
    if (!id || !size || !whole_granules(size) || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!card_take(size, true))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Committed only where written: a test may create far more than the host has. A handle that
     * may be exported as a file descriptor is backed by a memfd, which another process that
     * imports it maps too: the two see the same bytes, as two processes do on a GPU. */
    bool shareable = prop->requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    int fd = shareable ? memfd_create("fake-cuda-handle", MFD_CLOEXEC) : -1;
    void *backing = MAP_FAILED;
    if (!shareable)
        backing = backing_take(size);
    else if (fd >= 0 && ftruncate(fd, (off_t)size) == 0)
        backing = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (backing == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        card_give(size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_rwlock_wrlock(&memory_lock);
    struct handle row = {next_handle, size, backing, 1, 0, *prop, fd, false};
    if (table_insert(&handles, &row)) {
        *id = next_handle++;
    } else {
        munmap(backing, size);
        if (fd >= 0)
            close(fd);
        card_give(size);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* cuMemExportToShareableHandle: a file descriptor of its own for a handle created with the
 * POSIX file descriptor type (refused for the others, as the driver refuses them). */
static CUresult memory_export_body(int *fd, unsigned long long id, int type)
{
    if (!fd || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&memory_lock);
    const struct handle *h = row_with_key(&handles, id, NULL);
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    if (h && h->references > 0 && h->fd >= 0 && !h->imported) {
        *fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
        result = *fd >= 0 ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
    } else if (h && h->references > 0) {
        result = CUDA_ERROR_NOT_PERMITTED; /* not created exportable */
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* cuMemImportFromShareableHandle: a handle of this process for another's exported memory (the
 * descriptor stays the caller's to close). */
static CUresult memory_import_body(unsigned long long *id, int fd, int type)
{
    struct stat status;
    if (!id || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &status) != 0 ||
        status.st_size <= 0 || !whole_granules((unsigned long long)status.st_size))
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = (size_t)status.st_size;
    void *backing = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    int kept = backing == MAP_FAILED ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (kept < 0) {
        if (backing != MAP_FAILED)
            munmap(backing, size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct allocation_prop prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                   .requested_handle_types =
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                   .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUresult result = 0;
    pthread_rwlock_wrlock(&memory_lock);
    struct handle row = {next_handle, size, backing, 1, 0, prop, kept, true};
    if (table_insert(&handles, &row)) {
        *id = next_handle++;
    } else {
        munmap(backing, size);
        close(kept);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult memory_release_body(unsigned long long id)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    size_t at;
    struct handle *h = row_with_key(&handles, id, &at);
    if (h && h->references > 0) {
        h->references--;
        drop_if_unused(at);
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult memory_map_body(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long id,
                                unsigned long long flags)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!size || flags || !whole_granules(ptr) || !whole_granules(size) || !whole_granules(offset))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    struct handle *h = row_with_key(&handles, id, NULL);
    bool fits = h && h->references > 0 && offset <= h->size && size <= h->size - offset;
    if (fits && reservation_holding(ptr, size) && !overlaps(&mappings, ptr, size)) {
        struct mapping row = {ptr, size, offset, id, h->backing, CU_MEM_ACCESS_FLAGS_PROT_NONE,
                              atomic_fetch_add(&next_buffer_id, 1)};
        if (table_insert(&mappings, &row)) {
            h->mappings++;
            result = 0;
        } else {
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* FAKE_CUDA_UNMAP_GATE names a file: cuMemUnmap waits until it exists, so a test can hold an
 * eviction of VMM memory in the middle and look around. */
static CUresult memory_unmap_body(CUdeviceptr ptr, size_t size)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *gate = getenv("FAKE_CUDA_UNMAP_GATE");
    while (gate && access(gate, F_OK) != 0)
        usleep(1000);
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    size_t count = 0;
    long first = whole_mappings(ptr, size, &count);
    for (size_t n = 0; first >= 0 && n < count; n++) {
        const struct mapping *m = row_at(&mappings, (size_t)first);
        size_t at;
        struct handle *h = row_with_key(&handles, m->handle, &at);
        table_remove(&mappings, (size_t)first);
        if (h) {
            h->mappings--;
            drop_if_unused(at);
        }
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult memory_set_access_body(CUdeviceptr ptr, size_t size,
                                       const struct access_desc *desc, size_t count)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!desc || !count)
        return CUDA_ERROR_INVALID_VALUE;
    int flags = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.id < 0 || desc[i].location.id >= device_count())
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.id == 0 || flags < 0)
            flags = desc[i].flags; /* device 0's is the one modelled */
    }
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    size_t n = 0;
    long first = whole_mappings(ptr, size, &n);
    for (size_t i = 0; first >= 0 && i < n; i++) {
        ((struct mapping *)row_at(&mappings, (size_t)first + i))->access = flags;
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult memory_get_access_body(unsigned long long *flags,
                                       const struct mem_location *where, CUdeviceptr ptr)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!flags || !where || where->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (where->id < 0 || where->id >= device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_rwlock_rdlock(&memory_lock);
    const struct mapping *m = mapping_at(ptr);
    if (m)
        *flags = (unsigned long long)m->access;
    pthread_rwlock_unlock(&memory_lock);
    return m ? 0 : CUDA_ERROR_INVALID_VALUE;
}

static CUresult memory_properties_body(struct allocation_prop *prop, unsigned long long id)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&memory_lock);
    const struct handle *h = row_with_key(&handles, id, NULL);
    bool valid = h && h->references > 0;
    if (valid)
        *prop = h->prop;
    pthread_rwlock_unlock(&memory_lock);
    return valid ? 0 : CUDA_ERROR_INVALID_VALUE;
}

static CUresult memory_retain_body(unsigned long long *id, CUdeviceptr address)
{
    if (!vmm_supported())
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    const struct mapping *m = mapping_at(address);
    struct handle *h = m ? row_with_key(&handles, m->handle, NULL) : NULL;
    if (h) {
        h->references++; /* released or not: the mapping keeps the handle */
        *id = h->id;
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* ---- bytes: copies, memsets and the fake's kernels on VMM memory -------------------------- */

/* Under the read lock: may [ptr, ptr + n) be accessed so (need: READ or READWRITE)? */
static CUresult check_mapped(CUdeviceptr ptr, size_t n, int need, CUresult unmapped)
{
    CUdeviceptr address = ptr;
    while (address - ptr < n) {
        const struct mapping *m = mapping_at(address);
        if (!m)
            return unmapped;
        if ((m->access & need) != need)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        address = m->start + m->size;
        if (address == 0) /* the top of the address space */
            break;
    }
    return 0;
}

/* Under the read lock, after check_mapped: the bytes behind address, and how many of them
 * follow in the same mapping (at most n). */
static unsigned char *bytes_at(CUdeviceptr address, size_t n, size_t *run)
{
    const struct mapping *m = mapping_at(address);
    unsigned long long into = address - m->start, left = m->size - into;
    *run = left < n ? (size_t)left : n;
    return m->backing + m->offset + into;
}

/* What an address is to a copy: VMM memory (real bytes), one of the counter's allocations (no
 * bytes), or host memory. Under a lock. */
enum side { VMM_SIDE, COUNTED_SIDE, HOST_SIDE };

static enum side side_of(CUdeviceptr address)
{
    if (reservation_holding(address, 1))
        return VMM_SIDE;
    return inside_allocation(address) ? COUNTED_SIDE : HOST_SIDE;
}

/* What the caller knows of an address it copies to or from: device memory, host memory, or
 * either (cuMemcpy's unified addressing). */
enum known { DEVICE_ADDRESS, HOST_ADDRESS, EITHER_ADDRESS };

static enum side side_for(CUdeviceptr address, enum known known)
{
    if (known == HOST_ADDRESS)
        return HOST_SIDE;
    enum side side = side_of(address);
    /* A device address the fake never made: as before the model, the copy is a record. */
    return known == DEVICE_ADDRESS && side == HOST_SIDE ? COUNTED_SIDE : side;
}

/* Copies n bytes (apply), or only checks that it may (not apply). Where a side is one of the
 * counter's allocations, or neither is VMM memory, nothing is moved (the fake has no bytes
 * there) and the copy is a record only. unmapped: the error for a byte that is not mapped (a
 * copy's, or a kernel's). *vmm: whether VMM memory was involved. */
static CUresult move_bytes(CUdeviceptr dst, enum known dst_known, CUdeviceptr src,
                           enum known src_known, size_t n, CUresult unmapped, bool *vmm,
                           bool apply)
{
    *vmm = false;
    if (!n)
        return 0;
    pthread_rwlock_rdlock(&memory_lock);
    enum side to = side_for(dst, dst_known), from = side_for(src, src_known);
    CUresult result = 0;
    if (to == VMM_SIDE)
        result = check_mapped(dst, n, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, unmapped);
    if (!result && from == VMM_SIDE)
        result = check_mapped(src, n, CU_MEM_ACCESS_FLAGS_PROT_READ, unmapped);
    *vmm = to == VMM_SIDE || from == VMM_SIDE;
    bool real = apply && *vmm && to != COUNTED_SIDE && from != COUNTED_SIDE;
    for (size_t done = 0; !result && real && done < n;) {
        size_t run = n - done, run_in = run;
        unsigned char *out = to == VMM_SIDE ? bytes_at(dst + done, run, &run)
                                            : (unsigned char *)(uintptr_t)(dst + done);
        const unsigned char *in = from == VMM_SIDE ? bytes_at(src + done, run_in, &run_in)
                                                   : (unsigned char *)(uintptr_t)(src + done);
        run = run < run_in ? run : run_in;
        memmove(out, in, run);
        done += run;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* Sets count elements of width bytes (1 or 4) at dst to value (apply), or only checks that it
 * may. */
static CUresult fill_bytes(CUdeviceptr dst, unsigned value, size_t width, size_t count,
                           CUresult unmapped, bool *vmm, bool apply)
{
    *vmm = false;
    size_t n = width * count;
    if (!n)
        return 0;
    pthread_rwlock_rdlock(&memory_lock);
    CUresult result = 0;
    if (side_of(dst) == VMM_SIDE) {
        *vmm = true;
        result = dst % width ? CUDA_ERROR_INVALID_VALUE
                             : check_mapped(dst, n, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, unmapped);
        for (size_t done = 0; !result && apply && done < n;) {
            size_t run;
            unsigned char *out = bytes_at(dst + done, n - done, &run);
            if (width == 1) {
                memset(out, (int)value, run);
            } else {
                uint32_t word = value;
                for (size_t i = 0; i < run; i += sizeof word)
                    memcpy(out + i, &word, sizeof word); /* runs are whole granules */
            }
            done += run;
        }
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* ---- host memory: cuMemAllocHost and cuMemHostRegister --------------------------------- */

struct host_range {
    unsigned long long start;
    unsigned long long size;
    bool allocated; /* by cuMemAllocHost: unmapped at cuMemFreeHost */
    CUcontext ctx;
    unsigned long long buffer_id;
};

static struct table host_ranges = {.row_size = sizeof(struct host_range)};

/* Under a lock: does [start, start + size) overlap a host range? */
static bool host_overlap(unsigned long long start, unsigned long long size)
{
    return size && overlaps(&host_ranges, start, size);
}

static CUresult host_alloc_body(void **host, size_t size)
{
    if (!host)
        return CUDA_ERROR_INVALID_VALUE;
    size_t length = size ? size : 1;
    void *memory = mmap(NULL, length, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct host_range row = {(uintptr_t)memory, length, true, current_context(),
                             atomic_fetch_add(&next_buffer_id, 1)};
    pthread_rwlock_wrlock(&memory_lock);
    bool kept = table_insert(&host_ranges, &row);
    pthread_rwlock_unlock(&memory_lock);
    if (!kept) {
        munmap(memory, length);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *host = memory;
    return 0;
}

static CUresult host_free_body(void *host)
{
    pthread_rwlock_wrlock(&memory_lock);
    size_t at;
    struct host_range *row = row_with_key(&host_ranges, (uintptr_t)host, &at);
    struct host_range gone = row && row->allocated ? *row : (struct host_range){0};
    if (gone.size)
        table_remove(&host_ranges, at);
    pthread_rwlock_unlock(&memory_lock);
    if (!gone.size)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(host, gone.size);
    return 0;
}

/* FAKE_CUDA_NO_HOST_REGISTER=1: cuMemHostRegister fails, as where the host cannot pin memory
 * it did not allocate itself (cuMemAllocHost still works). */
static CUresult host_register_body(void *host, size_t size)
{
    if (!host || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_NO_HOST_REGISTER"))
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult result = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    pthread_rwlock_wrlock(&memory_lock);
    struct host_range row = {(uintptr_t)host, size, false, current_context(),
                             atomic_fetch_add(&next_buffer_id, 1)};
    if (!host_overlap(row.start, size))
        result = table_insert(&host_ranges, &row) ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

static CUresult host_unregister_body(void *host)
{
    CUresult result = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    pthread_rwlock_wrlock(&memory_lock);
    size_t at;
    struct host_range *row = row_with_key(&host_ranges, (uintptr_t)host, &at);
    if (row && !row->allocated) {
        table_remove(&host_ranges, at);
        result = 0;
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* ---- what the driver says of an address: pointer attributes, address ranges -------------
 *
 * cuPointerGetAttribute answers from what the address is (sources: cuda.h's documentation of
 * each attribute; the widths are those NVIDIA's cuda-python reads them with):
 * - one of the counter's allocations: the allocation (its start and size), the context it was
 *   made in (none for stream-ordered memory, which belongs to no context: its pool instead),
 *   its device; legacy IPC works on cuMemAlloc memory only;
 * - VMM memory mapped: RANGE_START_ADDR and RANGE_SIZE are the reservation the address is in
 *   (the "mappable address range"), cuMemGetAddressRange the one mapping it is in (one
 *   physical handle: what UCX and libfabric found), the context none (VMM memory belongs to no
 *   context), the device, handle types and GPUDirect RDMA flag those of the handle, and the
 *   BUFFER_ID that of the mapping: a new one at each cuMemMap;
 * - VMM memory reserved but not mapped (evicted): RANGE_START_ADDR, RANGE_SIZE and MAPPED (0)
 *   answer; every other attribute fails with CUDA_ERROR_INVALID_VALUE, the answer Triton's
 *   launcher reads as "cannot be accessed from Triton"; cuMemGetAddressRange fails with
 *   CUDA_ERROR_NOT_FOUND;
 * - host memory of cuMemAllocHost or cuMemHostRegister: host memory, its range;
 * - anything else: CUDA_ERROR_INVALID_VALUE (cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND).
 * cuPointerGetAttributes never fails for an address it knows nothing of: each attribute that
 * would fail gets its default (zeros; a device ordinal of -2), as the documentation says.
 * P2P_TOKENS, MEMORY_BLOCK_ID, IS_HW_DECOMPRESS_CAPABLE and LOCALITY_DOMAIN_ORDINAL are not
 * modelled: CUDA_ERROR_NOT_SUPPORTED, so that no test can lean on them.
 * cuPointerSetAttribute takes SYNC_MEMOPS for the counter's allocations and refuses it on VMM
 * memory with CUDA_ERROR_NOT_SUPPORTED, as the driver does (UCX found it so). */

#define CUDA_ERROR_NOT_FOUND 500
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2

enum pointer_attribute {
    ATTRIBUTE_CONTEXT = 1,
    ATTRIBUTE_MEMORY_TYPE = 2,
    ATTRIBUTE_DEVICE_POINTER = 3,
    ATTRIBUTE_HOST_POINTER = 4,
    ATTRIBUTE_P2P_TOKENS = 5,
    ATTRIBUTE_SYNC_MEMOPS = 6,
    ATTRIBUTE_BUFFER_ID = 7,
    ATTRIBUTE_IS_MANAGED = 8,
    ATTRIBUTE_DEVICE_ORDINAL = 9,
    ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
    ATTRIBUTE_RANGE_START_ADDR = 11,
    ATTRIBUTE_RANGE_SIZE = 12,
    ATTRIBUTE_MAPPED = 13,
    ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
    ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    ATTRIBUTE_ACCESS_FLAGS = 16,
    ATTRIBUTE_MEMPOOL_HANDLE = 17,
    ATTRIBUTE_MAPPING_SIZE = 18,
    ATTRIBUTE_MAPPING_BASE_ADDR = 19,
    ATTRIBUTE_MEMORY_BLOCK_ID = 20,
    ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE = 21,
    ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL = 22,
};

enum pointer_kind { UNKNOWN_POINTER, RESERVED_POINTER, MAPPED_POINTER, COUNTED_POINTER,
                    HOST_MEMORY_POINTER };

struct pointer_facts {
    enum pointer_kind kind;
    CUcontext ctx;
    unsigned memory_type;
    int device;
    CUdeviceptr range_start; /* RANGE_START_ADDR and RANGE_SIZE */
    unsigned long long range_size;
    CUdeviceptr mapping_start; /* MAPPING_*, and cuMemGetAddressRange */
    unsigned long long mapping_size;
    unsigned long long buffer_id;
    bool managed, legacy_ipc, sync_memops;
    unsigned handle_types, rdma, access;
    void *pool;
};

/* Under a lock: what ptr is. */
static struct pointer_facts facts_of(CUdeviceptr ptr)
{
    struct pointer_facts f = {.kind = UNKNOWN_POINTER, .device = -2};
    const struct reservation *r = reservation_holding(ptr, 1);
    if (r) {
        f.kind = RESERVED_POINTER;
        f.range_start = r->start;
        f.range_size = r->size;
        const struct mapping *m = mapping_at(ptr);
        const struct handle *h = m ? row_with_key(&handles, m->handle, NULL) : NULL;
        if (!m || !h)
            return f;
        f.kind = MAPPED_POINTER;
        f.memory_type = CU_MEMORYTYPE_DEVICE;
        f.device = h->prop.location.id;
        f.mapping_start = m->start;
        f.mapping_size = m->size;
        f.buffer_id = m->buffer_id;
        f.handle_types = (unsigned)h->prop.requested_handle_types;
        f.rdma = h->prop.gpu_direct_rdma_capable != 0;
        f.access = (unsigned)m->access;
        return f;
    }
    const struct allocation *a = allocation_holding(ptr);
    if (a) {
        f.kind = COUNTED_POINTER;
        f.ctx = a->ctx;
        f.memory_type = CU_MEMORYTYPE_DEVICE; /* managed memory too: IS_MANAGED tells it */
        f.device = a->device;
        f.range_start = f.mapping_start = a->address;
        f.range_size = f.mapping_size = a->size;
        f.buffer_id = a->buffer_id;
        f.managed = a->kind == MANAGED_MEMORY;
        f.legacy_ipc = a->kind == DEVICE_MEMORY;
        f.sync_memops = a->sync_memops;
        f.rdma = gpu_direct_rdma() && a->kind != MANAGED_MEMORY;
        f.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        f.pool = a->kind == POOL_MEMORY ? a->pool : NULL;
        return f;
    }
    size_t at = rows_up_to(&host_ranges, ptr);
    const struct host_range *h = at ? row_at(&host_ranges, at - 1) : NULL;
    if (h && ptr - h->start < h->size) {
        f.kind = HOST_MEMORY_POINTER;
        f.ctx = h->ctx;
        f.memory_type = CU_MEMORYTYPE_HOST;
        f.device = device_of(h->ctx);
        f.range_start = f.mapping_start = h->start;
        f.range_size = f.mapping_size = h->size;
        f.buffer_id = h->buffer_id;
        f.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    return f;
}

/* The bytes an attribute's answer takes; 0 for an attribute cuda.h does not have. */
static size_t attribute_width(int attribute)
{
    switch (attribute) {
    case ATTRIBUTE_SYNC_MEMOPS:
    case ATTRIBUTE_IS_MANAGED:
    case ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case ATTRIBUTE_MAPPED:
    case ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        return sizeof(bool);
    case ATTRIBUTE_MEMORY_TYPE:
    case ATTRIBUTE_DEVICE_ORDINAL:
    case ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case ATTRIBUTE_ACCESS_FLAGS:
    case ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL:
        return sizeof(unsigned);
    case ATTRIBUTE_P2P_TOKENS:
        return 16; /* CUDA_POINTER_ATTRIBUTE_P2P_TOKENS */
    case ATTRIBUTE_CONTEXT:
    case ATTRIBUTE_DEVICE_POINTER:
    case ATTRIBUTE_HOST_POINTER:
    case ATTRIBUTE_BUFFER_ID:
    case ATTRIBUTE_RANGE_START_ADDR:
    case ATTRIBUTE_RANGE_SIZE:
    case ATTRIBUTE_MEMPOOL_HANDLE:
    case ATTRIBUTE_MAPPING_SIZE:
    case ATTRIBUTE_MAPPING_BASE_ADDR:
    case ATTRIBUTE_MEMORY_BLOCK_ID:
        return 8;
    default:
        return 0;
    }
}

/* What cuPointerGetAttribute writes at data for one attribute of ptr, or the error. */
static CUresult answer_attribute(void *data, int attribute, const struct pointer_facts *f,
                                 CUdeviceptr ptr)
{
    if (!attribute_width(attribute))
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == ATTRIBUTE_P2P_TOKENS || attribute == ATTRIBUTE_MEMORY_BLOCK_ID ||
        attribute == ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE ||
        attribute == ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL)
        return CUDA_ERROR_NOT_SUPPORTED; /* not modelled */
    bool reserved_answers = attribute == ATTRIBUTE_RANGE_START_ADDR ||
                            attribute == ATTRIBUTE_RANGE_SIZE || attribute == ATTRIBUTE_MAPPED;
    if (f->kind == UNKNOWN_POINTER || (f->kind == RESERVED_POINTER && !reserved_answers))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long wide = 0;
    unsigned narrow = 0;
    bool flag = false;
    switch (attribute) {
    case ATTRIBUTE_CONTEXT:
        wide = (uintptr_t)f->ctx;
        break;
    case ATTRIBUTE_MEMORY_TYPE:
        narrow = f->memory_type;
        break;
    case ATTRIBUTE_DEVICE_POINTER:
        wide = ptr;
        break;
    case ATTRIBUTE_HOST_POINTER:
        if (f->kind != HOST_MEMORY_POINTER)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        wide = ptr;
        break;
    case ATTRIBUTE_SYNC_MEMOPS:
        flag = f->sync_memops;
        break;
    case ATTRIBUTE_BUFFER_ID:
        wide = f->buffer_id;
        break;
    case ATTRIBUTE_IS_MANAGED:
        flag = f->managed;
        break;
    case ATTRIBUTE_DEVICE_ORDINAL:
        narrow = (unsigned)f->device;
        break;
    case ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        flag = f->legacy_ipc;
        break;
    case ATTRIBUTE_RANGE_START_ADDR:
        wide = f->range_start;
        break;
    case ATTRIBUTE_RANGE_SIZE:
        wide = f->range_size;
        break;
    case ATTRIBUTE_MAPPED:
        flag = f->kind != RESERVED_POINTER;
        break;
    case ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        narrow = f->handle_types;
        break;
    case ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        narrow = f->rdma;
        break;
    case ATTRIBUTE_ACCESS_FLAGS:
        narrow = f->access;
        break;
    case ATTRIBUTE_MEMPOOL_HANDLE:
        wide = (uintptr_t)f->pool;
        break;
    case ATTRIBUTE_MAPPING_SIZE:
        wide = f->mapping_size;
        break;
    case ATTRIBUTE_MAPPING_BASE_ADDR:
        wide = f->mapping_start;
        break;
    }
    size_t width = attribute_width(attribute);
    if (width == sizeof(bool))
        memcpy(data, &flag, width);
    else if (width == sizeof(unsigned))
        memcpy(data, &narrow, width);
    else
        memcpy(data, &wide, width);
    return 0;
}

static CUresult pointer_get_attribute_body(void *data, int attribute, CUdeviceptr ptr)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&memory_lock);
    struct pointer_facts f = facts_of(ptr);
    pthread_rwlock_unlock(&memory_lock);
    return answer_attribute(data, attribute, &f, ptr);
}

static CUresult pointer_get_attributes_body(unsigned count, const int *attributes, void **data,
                                            CUdeviceptr ptr)
{
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++)
        if (!data[i] || !attribute_width(attributes[i]))
            return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&memory_lock);
    struct pointer_facts f = facts_of(ptr);
    pthread_rwlock_unlock(&memory_lock);
    for (unsigned i = 0; i < count; i++) {
        CUresult result = answer_attribute(data[i], attributes[i], &f, ptr);
        if (result == CUDA_ERROR_INVALID_VALUE) { /* this pointer has none: the default */
            memset(data[i], 0, attribute_width(attributes[i]));
            if (attributes[i] == ATTRIBUTE_DEVICE_ORDINAL)
                *(int *)data[i] = -2;
        } else if (result) {
            return result;
        }
    }
    return 0;
}

static CUresult pointer_set_attribute_body(const void *value, int attribute, CUdeviceptr ptr)
{
    if (!value || attribute != ATTRIBUTE_SYNC_MEMOPS)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&memory_lock);
    struct pointer_facts f = facts_of(ptr);
    if (f.kind == MAPPED_POINTER) {
        result = CUDA_ERROR_NOT_SUPPORTED;
    } else if (f.kind == COUNTED_POINTER) {
        allocation_holding(ptr)->sync_memops = *(const unsigned *)value != 0;
        result = 0;
    } else if (f.kind == HOST_MEMORY_POINTER) {
        result = CUDA_ERROR_NOT_SUPPORTED; /* not modelled */
    }
    pthread_rwlock_unlock(&memory_lock);
    return result;
}

/* cuMemGetHandleForAddressRange: a dma-buf file descriptor (here an empty memfd, to close as
 * any) for a range of host-page-aligned device memory that is mapped end to end. */
static CUresult dma_buf_body(int *fd, CUdeviceptr ptr, size_t size, int type)
{
    long page = sysconf(_SC_PAGESIZE);
    if (!fd || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */ || !size ||
        ptr % (unsigned long long)page || size % (size_t)page)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&memory_lock);
    struct pointer_facts f = facts_of(ptr);
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    if (f.kind == MAPPED_POINTER)
        result = check_mapped(ptr, size, CU_MEM_ACCESS_FLAGS_PROT_NONE, CUDA_ERROR_INVALID_VALUE);
    else if (f.kind == COUNTED_POINTER && size <= f.range_size - (ptr - f.range_start))
        result = 0;
    pthread_rwlock_unlock(&memory_lock);
    if (result == 0 && (*fd = memfd_create("fake-dma-buf", MFD_CLOEXEC)) < 0)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    return result;
}

static CUresult address_range_body(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    pthread_rwlock_rdlock(&memory_lock);
    struct pointer_facts f = facts_of(ptr);
    pthread_rwlock_unlock(&memory_lock);
    if (f.kind != MAPPED_POINTER && f.kind != COUNTED_POINTER)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = f.mapping_start;
    if (size)
        *size = (size_t)f.mapping_size;
    return 0;
}

static long long monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

#include "fake_streams.c"

/* ---- the entry points ------------------------------------------------------------------- */

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, int device)
{
    bool known = device >= 0 && device < device_count();
    if (!value || !known)
        return !known ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *value = vmm_supported();
        break;
    case 16: /* MULTIPROCESSOR_COUNT, an H100's */
        *value = 132;
        break;
    case 75: /* COMPUTE_CAPABILITY_MAJOR */
        *value = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *value = posix_fd_handles();
        break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
        *value = gpu_direct_rdma();
        break;
    case 41:  /* UNIFIED_ADDRESSING */
    case 83:  /* MANAGED_MEMORY */
    case 89:  /* CONCURRENT_MANAGED_ACCESS */
    case 115: /* MEMORY_POOLS_SUPPORTED */
        *value = 1;
        break;
    default: /* what the fake does not model reads as absent */
        *value = 0;
    }
    record("cuDeviceGetAttribute attribute=%d device=%d value=%d", attribute, device, *value);
    return 0;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *bytes, const struct allocation_prop *prop,
                                              int option)
{
    call_begins();
    CUresult result = memory_get_granularity_body(bytes, prop, option);
    call_ends();
    return result;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr hint, unsigned long long flags)
{
    call_begins();
    CUresult result = address_reserve_body(ptr, size, alignment, hint, flags);
    record("cuMemAddressReserve size=%zu alignment=%zu hint=0x%llx ptr=0x%llx result=%d", size,
           alignment, hint, result ? 0ull : *ptr, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    call_begins();
    CUresult result = address_free_body(ptr, size);
    record("cuMemAddressFree ptr=0x%llx size=%zu result=%d", ptr, size, result);
    call_ends();
    return result;
}

static CUresult cuMemCreate_body(unsigned long long *handle, size_t size,
                                 const struct allocation_prop *prop, unsigned long long flags)
{
    CUresult result = memory_create_body(handle, size, prop, flags);
    record("cuMemCreate size=%zu flags=%llu handle=0x%llx result=%d", size, flags,
           result ? 0ull : *handle, result);
    return result;
}
EXPORT CUresult cuMemCreate(unsigned long long *handle, size_t size,
                            const struct allocation_prop *prop, unsigned long long flags)
{
    call_begins();
    driver_pass();
    CUresult result = cuMemCreate_body(handle, size, prop, flags);
    call_ends();
    return result;
}

EXPORT CUresult cuMemRelease(unsigned long long handle)
{
    call_begins();
    driver_pass();
    CUresult result = memory_release_body(handle);
    record("cuMemRelease handle=0x%llx result=%d", handle, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long handle,
                         unsigned long long flags)
{
    call_begins();
    driver_pass();
    CUresult result = memory_map_body(ptr, size, offset, handle, flags);
    record("cuMemMap ptr=0x%llx size=%zu offset=%zu handle=0x%llx result=%d", ptr, size, offset,
           handle, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    call_begins();
    driver_pass();
    CUresult result = memory_unmap_body(ptr, size);
    record("cuMemUnmap ptr=0x%llx size=%zu result=%d", ptr, size, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const struct access_desc *desc,
                               size_t count)
{
    call_begins();
    driver_pass();
    CUresult result = memory_set_access_body(ptr, size, desc, count);
    record("cuMemSetAccess ptr=0x%llx size=%zu count=%zu flags=%d result=%d", ptr, size, count,
           desc && count ? desc[count - 1].flags : -1, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const struct mem_location *where,
                               CUdeviceptr ptr)
{
    call_begins();
    CUresult result = memory_get_access_body(flags, where, ptr);
    call_ends();
    return result;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(struct allocation_prop *prop,
                                                       unsigned long long handle)
{
    call_begins();
    CUresult result = memory_properties_body(prop, handle);
    call_ends();
    return result;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareable, unsigned long long handle,
                                             int type, unsigned long long flags)
{
    call_begins();
    CUresult result = flags ? CUDA_ERROR_INVALID_VALUE
                            : memory_export_body((int *)shareable, handle, type);
    record("cuMemExportToShareableHandle handle=0x%llx type=%d result=%d", handle, type, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemImportFromShareableHandle(unsigned long long *handle, void *shared, int type)
{
    call_begins();
    CUresult result = memory_import_body(handle, (int)(intptr_t)shared, type);
    record("cuMemImportFromShareableHandle fd=%d handle=0x%llx result=%d", (int)(intptr_t)shared,
           result ? 0ull : *handle, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemRetainAllocationHandle(unsigned long long *handle, void *address)
{
    call_begins();
    CUresult result = memory_retain_body(handle, (CUdeviceptr)(uintptr_t)address);
    record("cuMemRetainAllocationHandle address=%p handle=0x%llx result=%d", address,
           result ? 0ull : *handle, result);
    call_ends();
    return result;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    call_begins();
    CUresult result = pointer_get_attribute_body(data, attribute, ptr);
    record("cuPointerGetAttribute attribute=%d ptr=0x%llx result=%d", attribute, ptr, result);
    call_ends();
    return result;
}

EXPORT CUresult cuPointerGetAttributes(unsigned count, const int *attributes, void **data,
                                       CUdeviceptr ptr)
{
    call_begins();
    CUresult result = pointer_get_attributes_body(count, attributes, data, ptr);
    record("cuPointerGetAttributes count=%u ptr=0x%llx result=%d", count, ptr, result);
    call_ends();
    return result;
}

EXPORT CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr)
{
    call_begins();
    CUresult result = pointer_set_attribute_body(value, attribute, ptr);
    record("cuPointerSetAttribute attribute=%d ptr=0x%llx result=%d", attribute, ptr, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    call_begins();
    CUresult result = address_range_body(base, size, ptr);
    record("cuMemGetAddressRange_v2 ptr=0x%llx result=%d", ptr, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemGetHandleForAddressRange(int *fd, CUdeviceptr ptr, size_t size, int type,
                                              unsigned long long flags)
{
    call_begins();
    CUresult result = flags ? CUDA_ERROR_INVALID_VALUE : dma_buf_body(fd, ptr, size, type);
    record("cuMemGetHandleForAddressRange ptr=0x%llx size=%zu result=%d", ptr, size, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemHostRegister_v2(void *host, size_t size, unsigned flags)
{
    call_begins();
    CUresult result = forbidden_during_capture();
    if (!result) {
        pthread_mutex_lock(&driver_lock);
        result = host_register_body(host, size);
        if (!result)
            pin_pages(host, size);
        pthread_mutex_unlock(&driver_lock);
    }
    record("cuMemHostRegister_v2 host=%p size=%zu flags=%u result=%d", host, size, flags, result);
    call_ends();
    return result;
}

EXPORT CUresult cuMemHostUnregister(void *host)
{
    call_begins();
    CUresult result = forbidden_during_capture();
    if (!result) {
        pthread_mutex_lock(&driver_lock);
        result = host_unregister_body(host);
        pthread_mutex_unlock(&driver_lock);
    }
    record("cuMemHostUnregister host=%p result=%d", host, result);
    call_ends();
    return result;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    record("cuStreamDestroy_v2 stream=%p", stream);
    return 0;
}

/* ---- allocations, frees and copies -------------------------------------------------------- */

static CUresult cuMemAlloc_v2_body(CUdeviceptr *dptr, size_t size)
{
    *dptr = take_addresses(size, DEVICE_MEMORY, NULL);
    record("cuMemAlloc_v2 size=%zu ptr=0x%llx", size, *dptr);
    return 0;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    call_begins();
    CUresult result = cuMemAlloc_v2_body(dptr, size);
    call_ends();
    return result;
}
static CUresult alloc_managed_body(CUdeviceptr *dptr, size_t size, unsigned flags);
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    call_begins();
    CUresult result = alloc_managed_body(dptr, size, flags);
    call_ends();
    return result;
}

static CUresult alloc_managed_body(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    if (size > total_memory() * 4)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY: even managed memory has a bound */
    const char *refuse = getenv("FAKE_CUDA_MANAGED_ERROR");
    if (refuse) {
        record("cuMemAllocManaged size=%zu refused=%s", size, refuse);
        return atoi(refuse);
    }
    *dptr = take_addresses(size, MANAGED_MEMORY, NULL);
    if (own_state)
        atomic_store(&own_state->uses_uvm, 1);
    record("cuMemAllocManaged size=%zu flags=%u ptr=0x%llx", size, flags, *dptr);
    return 0;
}
static CUresult cuMemAllocPitch_v2_body(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned element)
{
    *pitch = (w + 255) & ~(size_t)255;
    *dptr = take_addresses(*pitch * h, DEVICE_MEMORY, NULL);
    record("cuMemAllocPitch_v2 width=%zu height=%zu element=%u", w, h, element);
    return 0;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                   unsigned element)
{
    call_begins();
    CUresult result = cuMemAllocPitch_v2_body(dptr, pitch, w, h, element);
    call_ends();
    return result;
}
static CUresult cuMemAllocAsync_body(CUdeviceptr *dptr, size_t size, CUstream s)
{
    *dptr = take_addresses(size, POOL_MEMORY, DEFAULT_POOL);
    record("cuMemAllocAsync size=%zu stream=%p", size, s);
    return 0;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    call_begins();
    CUresult result = cuMemAllocAsync_body(dptr, size, s);
    call_ends();
    return result;
}
static CUresult cuMemAllocFromPoolAsync_body(CUdeviceptr *dptr, size_t size, void *pool, CUstream s)
{
    *dptr = take_addresses(size, POOL_MEMORY, pool);
    record("cuMemAllocFromPoolAsync size=%zu pool=%p stream=%p", size, pool, s);
    return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, CUstream s)
{
    call_begins();
    CUresult result = cuMemAllocFromPoolAsync_body(dptr, size, pool, s);
    call_ends();
    return result;
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    call_begins();
    *dptr = take_addresses(size, POOL_MEMORY, DEFAULT_POOL);
    record("cuMemAllocAsync_ptsz size=%zu stream=%p", size, s);
    call_ends();
    return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, void *pool,
                                             CUstream s)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    call_begins();
    *dptr = take_addresses(size, POOL_MEMORY, pool);
    record("cuMemAllocFromPoolAsync_ptsz size=%zu pool=%p stream=%p", size, pool, s);
    call_ends();
    return 0;
}
/* FAKE_CUDA_FREE_ERROR: the error every cuMemFree_v2 returns. */
/* Memory pools. FAKE_CUDA_MANAGED_POOLS=1: a CUDA 13 driver, which makes managed pools;
 * otherwise a CUDA 12 one, which refuses the allocation type. */
static atomic_ullong next_pool = 0x9000;

EXPORT CUresult cuMemPoolCreate(void **pool, const int *props)
{
    int type = props[0], location_type = props[2], location_id = props[3];
    if (type == 2 && !getenv("FAKE_CUDA_MANAGED_POOLS")) {
        record("cuMemPoolCreate type=%d refused", type);
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
    *pool = (void *)(uintptr_t)atomic_fetch_add(&next_pool, 1);
    record("cuMemPoolCreate type=%d location=%d:%d pool=%p", type, location_type, location_id,
           *pool);
    return 0;
}
EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep)
{
    pthread_rwlock_wrlock(&memory_lock);
    struct pool *trimmed = pool_of(pool);
    if (trimmed)
        trim_pool(trimmed, keep);
    pthread_rwlock_unlock(&memory_lock);
    record("cuMemPoolTrimTo pool=%p keep=%zu", pool, keep);
    return 0;
}
/* A pool's counters and settings: what the fake's pools hold is not counted by pool, so every
 * counter reads 0, and the settings are only recorded. */
EXPORT CUresult cuMemPoolGetAttribute(void *pool, int attribute, void *value)
{
    record("cuMemPoolGetAttribute pool=%p attribute=%d", pool, attribute);
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute >= 5 && attribute <= 8) /* the counters: cuuint64_t */
        *(unsigned long long *)value = 0;
    else
        *(int *)value = 0;
    return 0;
}
EXPORT CUresult cuMemPoolSetAttribute(void *pool, int attribute, void *value)
{
    record("cuMemPoolSetAttribute pool=%p attribute=%d", pool, attribute);
    return value ? 0 : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuDeviceGraphMemTrim(int device)
{
    record("cuDeviceGraphMemTrim device=%d", device);
    return 0;
}
/* Legacy IPC works on cuMemAlloc memory only: refused for VMM, managed and pool memory, as the
 * driver refuses them. A handle names the exporting process and the allocation; another process
 * opens it as an address of its own (no bytes behind it, as the counter's allocations have
 * none), and the exporter itself cannot. A handle the fake did not make is refused, as the
 * driver refuses bytes it cannot read. */
#define LEGACY_IPC_MAGIC 0x4b4157494650494cull /* "LIPFIWAK": the fake's own */
struct legacy_ipc_handle {
    unsigned long long magic;
    long long pid;
    CUdeviceptr address;
    unsigned long long size;
    char reserved[32];
};

EXPORT CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr dptr)
{
    pthread_rwlock_rdlock(&memory_lock);
    const struct allocation *a = allocation_holding(dptr);
    struct legacy_ipc_handle made = {LEGACY_IPC_MAGIC, (long long)getpid(), a ? a->address : 0,
                                     a ? a->size : 0, {0}};
    bool exportable = a && a->kind == DEVICE_MEMORY;
    pthread_rwlock_unlock(&memory_lock);
    record("cuIpcGetMemHandle ptr=0x%llx%s", dptr, exportable ? "" : " refused");
    if (!exportable || !handle)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(handle, &made, sizeof made);
    return 0;
}

static CUresult ipc_open(const char *name, CUdeviceptr *dptr, struct legacy_ipc_handle handle,
                         unsigned flags)
{
    bool ours = handle.magic == LEGACY_IPC_MAGIC && handle.pid != (long long)getpid() &&
                handle.size;
    record("%s pid=%lld address=0x%llx flags=%u%s", name, handle.pid, handle.address, flags,
           ours ? "" : " refused");
    if (!dptr || !ours)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = take_addresses(handle.size, DEVICE_MEMORY, NULL);
    return 0;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, struct legacy_ipc_handle handle,
                                   unsigned flags)
{
    return ipc_open("cuIpcOpenMemHandle", dptr, handle, flags);
}
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, struct legacy_ipc_handle handle,
                                      unsigned flags)
{
    return ipc_open("cuIpcOpenMemHandle_v2", dptr, handle, flags);
}
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    bool opened = give_addresses(dptr, false);
    record("cuIpcCloseMemHandle ptr=0x%llx%s", dptr, opened ? "" : " refused");
    return opened ? 0 : CUDA_ERROR_INVALID_VALUE;
}
static CUresult device_pool(const char *name, void **pool, int device)
{
    *pool = DEFAULT_POOL;
    record("%s device=%d", name, device);
    return 0;
}
EXPORT CUresult cuDeviceGetMemPool(void **pool, int device)
{
    return device_pool("cuDeviceGetMemPool", pool, device);
}
EXPORT CUresult cuDeviceGetDefaultMemPool(void **pool, int device)
{
    return device_pool("cuDeviceGetDefaultMemPool", pool, device);
}

static CUresult cuMemFree_v2_body(CUdeviceptr dptr)
{
    const char *error = getenv("FAKE_CUDA_FREE_ERROR");
    pthread_rwlock_rdlock(&memory_lock);
    bool vmm = reservation_holding(dptr, 1) != NULL;
    pthread_rwlock_unlock(&memory_lock);
    if (vmm) { /* VMM memory is freed by unmapping and releasing it */
        record("cuMemFree_v2 ptr=0x%llx refused", dptr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!error)
        give_addresses(dptr, false); /* an address it never made: as before, no error */
    record("cuMemFree_v2 ptr=0x%llx%s", dptr, error ? " refused" : "");
    return error ? atoi(error) : 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    call_begins();
    CUresult result = cuMemFree_v2_body(dptr);
    call_ends();
    return result;
}
static CUresult cuMemFreeAsync_body(CUdeviceptr dptr, CUstream s)
{
    give_addresses(dptr, true);
    record("cuMemFreeAsync ptr=0x%llx stream=%p", dptr, s);
    return 0;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    call_begins();
    CUresult result = cuMemFreeAsync_body(dptr, s);
    call_ends();
    return result;
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    call_begins();
    give_addresses(dptr, true);
    record("cuMemFreeAsync_ptsz ptr=0x%llx stream=%p", dptr, s);
    call_ends();
    return 0;
}
/* The card's capacity less what is on it: this process's, and with FAKE_CUDA_DEVICE the other
 * processes' too. FAKE_CUDA_OTHERS_USED: bytes other processes hold on the GPU and cannot give
 * up (the same on every card). */
static CUresult cuMemGetInfo_v2_body(size_t *free_bytes, size_t *total_bytes)
{
    unsigned long long total = total_memory(), used = fake_cuda_physical_used();
    *free_bytes = used < total ? total - used : 0;
    *total_bytes = total;
    record("cuMemGetInfo_v2");
    return 0;
}
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    call_begins();
    CUresult result = cuMemGetInfo_v2_body(free_bytes, total_bytes);
    call_ends();
    return result;
}
/* What cuGetProcAddress hands out for "cuMemGetInfo": not exported, unknown to dlsym. */
static CUresult internal_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    return cuMemGetInfo_v2(free_bytes, total_bytes);
}
static CUresult cuMemPrefetchAsync_body(CUdeviceptr dptr, size_t size, int device, CUstream s)
{
    atomic_store(&last_prefetch_device, device);
    record("cuMemPrefetchAsync ptr=0x%llx size=%zu device=%d stream=%p", dptr, size, device, s);
    return 0;
}
EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr dptr, size_t size, int device, CUstream s)
{
    call_begins();
    CUresult result = cuMemPrefetchAsync_body(dptr, size, device, s);
    call_ends();
    return result;
}

/* FAKE_CUDA_PREFETCH_BATCH=1: batches as a CUDA 13 driver does. Otherwise it refuses them
 * (CUDA_ERROR_NOT_SUPPORTED) without a record, so that a test's call sequence reads as on a
 * driver without batches. Called with nothing to do (the tests' bare calls), it does nothing. */
EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                        const int *locations, size_t *indexes, size_t nlocations,
                                        unsigned long long flags, CUstream s)
{
    (void)indexes;
    if (!count || !ptrs || !sizes || !locations) {
        record("cuMemPrefetchBatchAsync");
        return 0;
    }
    if (!getenv("FAKE_CUDA_PREFETCH_BATCH"))
        return 801;
    unsigned long long bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += sizes[i];
    int device = locations[0] == 2 ? -1 : locations[1];
    atomic_store(&last_prefetch_device, device);
    record("cuMemPrefetchBatchAsync count=%zu bytes=%llu locations=%zu device=%d flags=%llu "
           "stream=%p", count, bytes, nlocations, device, flags, s);
    return 0;
}

/* FAKE_CUDA_DISCARD=1: discards as a CUDA 13 driver on a GPU with concurrent managed access
 * does. Otherwise it refuses them (CUDA_ERROR_NOT_SUPPORTED) without a record, as such a driver
 * does on a GPU without it, so that a test's call sequence reads as on a driver that cannot. */
EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                       unsigned long long flags, CUstream s)
{
    if (!getenv("FAKE_CUDA_DISCARD"))
        return 801;
    if (!count || !ptrs || !sizes) {
        record("cuMemDiscardBatchAsync");
        return 0;
    }
    unsigned long long bytes = 0;
    char ranges[320] = "";
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        bytes += sizes[i];
        if (used < sizeof ranges)
            used += (size_t)snprintf(ranges + used, sizeof ranges - used, "%s0x%llx+%zu",
                                     i ? "," : "", ptrs[i], sizes[i]);
    }
    record("cuMemDiscardBatchAsync count=%zu bytes=%llu flags=%llu stream=%p ranges=%s", count,
           bytes, flags, s, ranges);
    return 0;
}

static void launch_delay(void)
{
    const char *text = getenv("FAKE_CUDA_LAUNCH_SECONDS");
    if (!text)
        return;
    double seconds = atof(text);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The fake's kernels, which touch VMM memory as a real kernel would: FAKE_KERNEL_FILL writes
 * (device pointer, size_t bytes, unsigned char value), FAKE_KERNEL_COPY copies (destination,
 * source, size_t bytes). A byte mapped without the access, or not mapped, is an illegal
 * address, as a kernel's fault is. Returns -1 for any other function (nothing touched). */
#define FAKE_KERNEL_FILL ((void *)0xF111)
#define FAKE_KERNEL_COPY ((void *)0xF222)

static CUresult run_fake_kernel(void *f, void **params)
{
    bool vmm;
    if (f == FAKE_KERNEL_FILL && params)
        return fill_bytes(*(CUdeviceptr *)params[0], *(unsigned char *)params[2], 1,
                          *(size_t *)params[1], CUDA_ERROR_ILLEGAL_ADDRESS, &vmm, true);
    if (f == FAKE_KERNEL_COPY && params)
        return move_bytes(*(CUdeviceptr *)params[0], DEVICE_ADDRESS, *(CUdeviceptr *)params[1],
                          DEVICE_ADDRESS, *(size_t *)params[2], CUDA_ERROR_ILLEGAL_ADDRESS, &vmm,
                          true);
    return -1;
}

/* delayed: FAKE_CUDA_LAUNCH_SECONDS applies (to cuLaunchKernel, as ever). */
static CUresult launch(const char *name, void *f, unsigned gx, unsigned bx, CUstream s,
                       void **params, bool delayed)
{
    call_begins();
    drain_stream(s, strstr(name, "_ptsz") != NULL); /* what its stream queued comes first */
    if (delayed)
        launch_delay();
    CUresult result = run_fake_kernel(f, params);
    if (result == -1)
        record("%s f=%p grid=%u block=%u stream=%p", name, f, gx, bx, s);
    else
        record("%s f=%p grid=%u block=%u stream=%p result=%d", name, f, gx, bx, s, result);
    call_ends();
    return result == -1 ? 0 : result;
}

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream s,
                               void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)extra;
    return launch("cuLaunchKernel", f, gx, bx, s, params, true);
}
EXPORT CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, CUstream s,
                                    void **params, void **extra)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)extra;
    return launch("cuLaunchKernel_ptsz", f, gx, bx, s, params, false);
}
static CUresult cuLaunchKernelEx_body(const void *config, void *f, void **params, void **extra)
{
    (void)config; (void)params; (void)extra;
    record("cuLaunchKernelEx f=%p", f);
    return 0;
}
EXPORT CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra)
{
    call_begins();
    CUresult result = cuLaunchKernelEx_body(config, f, params, extra);
    call_ends();
    return result;
}
EXPORT CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                          CUstream s, void **params)
{
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)params;
    record("cuLaunchCooperativeKernel f=%p grid=%u block=%u stream=%p", f, gx, bx, s);
    return 0;
}
EXPORT CUresult cuGraphLaunch(void *graph, CUstream s)
{
    record("cuGraphLaunch graph=%p stream=%p", graph, s);
    return 0;
}
/* Copies and memsets: real bytes where VMM memory is involved (failing where it is not mapped
 * or not accessible), a record only for the counter's allocations; queued, or made at once, as
 * fake_streams.c says. Every variant records its own name; a copy that touched VMM memory adds
 * its result, one staged through pageable host memory says so. on_stream: an asynchronous
 * variant, which names its stream. */
static CUresult copy(const char *name, CUdeviceptr dst, enum known dst_known, CUdeviceptr src,
                     enum known src_known, size_t n, CUstream s, bool on_stream)
{
    call_begins();
    bool vmm;
    struct transfer t = {.dst = dst, .src = src, .dst_known = dst_known, .src_known = src_known,
                         .n = n};
    CUresult result = submit_copy(&t, s, on_stream, strstr(name, "_pt") != NULL, &vmm);
    char stream[40] = "", outcome[40] = "";
    if (on_stream)
        snprintf(stream, sizeof stream, " stream=%p", s);
    if (vmm)
        snprintf(outcome, sizeof outcome, " result=%d", result);
    if (t.pageable)
        strcat(outcome, " pageable=1");
    if (dst_known == HOST_ADDRESS)
        record("%s dst=%p src=0x%llx n=%zu%s%s", name, (void *)(uintptr_t)dst, src, n, stream,
               outcome);
    else if (src_known == HOST_ADDRESS)
        record("%s dst=0x%llx src=%p n=%zu%s%s", name, dst, (void *)(uintptr_t)src, n, stream,
               outcome);
    else
        record("%s dst=0x%llx src=0x%llx n=%zu%s%s", name, dst, src, n, stream, outcome);
    call_ends();
    return result;
}

#define HOST(pointer) ((CUdeviceptr)(uintptr_t)(pointer))

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return copy("cuMemcpyHtoD_v2", dst, DEVICE_ADDRESS, HOST(src), HOST_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    return copy("cuMemcpyHtoD_v2_ptds", dst, DEVICE_ADDRESS, HOST(src), HOST_ADDRESS, n, NULL,
                false);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpyDtoH_v2", HOST(dst), HOST_ADDRESS, src, DEVICE_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpyDtoH_v2_ptds", HOST(dst), HOST_ADDRESS, src, DEVICE_ADDRESS, n, NULL,
                false);
}
/* The copies the pager's KIWI_EVICT_COPY makes (and that programs make). */
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy("cuMemcpyDtoHAsync_v2", HOST(dst), HOST_ADDRESS, src, DEVICE_ADDRESS, n, s, true);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy("cuMemcpyDtoHAsync_v2_ptsz", HOST(dst), HOST_ADDRESS, src, DEVICE_ADDRESS, n, s,
                true);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return copy("cuMemcpyHtoDAsync_v2", dst, DEVICE_ADDRESS, HOST(src), HOST_ADDRESS, n, s, true);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return copy("cuMemcpyHtoDAsync_v2_ptsz", dst, DEVICE_ADDRESS, HOST(src), HOST_ADDRESS, n, s,
                true);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpyDtoD_v2", dst, DEVICE_ADDRESS, src, DEVICE_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpyDtoD_v2_ptds", dst, DEVICE_ADDRESS, src, DEVICE_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy("cuMemcpyDtoDAsync_v2", dst, DEVICE_ADDRESS, src, DEVICE_ADDRESS, n, s, true);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                          CUstream s)
{
    return copy("cuMemcpyDtoDAsync_v2_ptsz", dst, DEVICE_ADDRESS, src, DEVICE_ADDRESS, n, s,
                true);
}
/* Unified addressing: either side may be host or device memory. */
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpy", dst, EITHER_ADDRESS, src, EITHER_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy("cuMemcpy_ptds", dst, EITHER_ADDRESS, src, EITHER_ADDRESS, n, NULL, false);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy("cuMemcpyAsync", dst, EITHER_ADDRESS, src, EITHER_ADDRESS, n, s, true);
}
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return copy("cuMemcpyAsync_ptsz", dst, EITHER_ADDRESS, src, EITHER_ADDRESS, n, s, true);
}

/* Pinned host memory: real (anonymous, committed where written), so copies from VMM memory
 * can land in it. FAKE_CUDA_NO_PINNING=1: it fails, as on a host that cannot pin that much. */
EXPORT CUresult cuMemAllocHost_v2(void **host, size_t size)
{
    if (getenv("FAKE_CUDA_NO_PINNING")) {
        record("cuMemAllocHost_v2 size=%zu refused", size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = forbidden_during_capture();
    if (result) {
        record("cuMemAllocHost_v2 size=%zu result=%d", size, result);
        return result;
    }
    pthread_mutex_lock(&driver_lock);
    result = host_alloc_body(host, size);
    if (!result)
        pin_pages(*host, size);
    pthread_mutex_unlock(&driver_lock);
    record("cuMemAllocHost_v2 size=%zu host=%p", size, result ? NULL : *host);
    return result;
}
EXPORT CUresult cuMemFreeHost(void *host)
{
    CUresult result = forbidden_during_capture();
    if (!result) {
        pthread_mutex_lock(&driver_lock);
        result = host_free_body(host);
        pthread_mutex_unlock(&driver_lock);
    }
    record("cuMemFreeHost host=%p%s", host, result ? " refused" : "");
    return result;
}

static CUresult memset_device(const char *name, CUdeviceptr dst, unsigned value, size_t width,
                              size_t count, CUstream s, bool on_stream)
{
    call_begins();
    bool vmm;
    CUresult result = submit_fill(dst, value, width, count, s, on_stream,
                                  strstr(name, "_pt") != NULL, &vmm);
    char stream[40] = "", outcome[24] = "";
    if (on_stream)
        snprintf(stream, sizeof stream, " stream=%p", s);
    if (vmm)
        snprintf(outcome, sizeof outcome, " result=%d", result);
    record("%s dst=0x%llx value=%u n=%zu%s%s", name, dst, value, count, stream, outcome);
    call_ends();
    return result;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset_device("cuMemsetD8_v2", dst, value, 1, n, NULL, false);
}
EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n)
{
    return memset_device("cuMemsetD8_v2_ptds", dst, value, 1, n, NULL, false);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)
{
    return memset_device("cuMemsetD8Async", dst, value, 1, n, s, true);
}
EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)
{
    return memset_device("cuMemsetD8Async_ptsz", dst, value, 1, n, s, true);
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, size_t n)
{
    return memset_device("cuMemsetD32_v2", dst, value, 4, n, NULL, false);
}
EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned value, size_t n)
{
    return memset_device("cuMemsetD32_v2_ptds", dst, value, 4, n, NULL, false);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, CUstream s)
{
    return memset_device("cuMemsetD32Async", dst, value, 4, n, s, true);
}
EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned value, size_t n, CUstream s)
{
    return memset_device("cuMemsetD32Async_ptsz", dst, value, 4, n, s, true);
}

/* The rest of the GPU work the runtimes ask for: each only records its name. Declared without
 * a prototype, as the tests never look at their arguments.
 * X(symbol, base, version, per_thread) as in the shim's hooks.h, and written out rather than
 * taken from there: the fake stands for the driver, and a driver table copied from the shim's
 * would agree with the shim by construction. What the table must hold is checked against
 * NVIDIA's headers and runtimes instead (test_cuda_toolkits.py). */
#define RECORDED_WORK(X)                                                                  \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)               \
    X(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0) \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                                      \
    X(cuMemcpyPeer, "cuMemcpyPeer", 4000, 0)                                              \
    X(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, 1)                                         \
    X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, 0)                                    \
    X(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, 1)                               \
    X(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, 0)                             \
    X(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 7000, 1)                        \
    X(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, 0)                                     \
    X(cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 7000, 1)                                \
    X(cuMemcpy3D_v2, "cuMemcpy3D", 3020, 0)                                               \
    X(cuMemcpy3D_v2_ptds, "cuMemcpy3D", 7000, 1)                                          \
    X(cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020, 0)                                     \
    X(cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 7000, 1)                                \
    X(cuMemcpy3DPeer, "cuMemcpy3DPeer", 4000, 0)                                          \
    X(cuMemcpy3DPeer_ptds, "cuMemcpy3DPeer", 7000, 1)                                     \
    X(cuMemcpy3DPeerAsync, "cuMemcpy3DPeerAsync", 4000, 0)                                \
    X(cuMemcpy3DPeerAsync_ptsz, "cuMemcpy3DPeerAsync", 7000, 1)                           \
    X(cuMemcpyBatchAsync, "cuMemcpyBatchAsync", 12080, 0)                                 \
    X(cuMemcpyBatchAsync_ptsz, "cuMemcpyBatchAsync", 12080, 1)                            \
    X(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync", 13000, 0)                              \
    X(cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000, 1)                         \
    X(cuMemcpy3DBatchAsync, "cuMemcpy3DBatchAsync", 12080, 0)                             \
    X(cuMemcpy3DBatchAsync_ptsz, "cuMemcpy3DBatchAsync", 12080, 1)                        \
    X(cuMemcpy3DBatchAsync_v2, "cuMemcpy3DBatchAsync", 13000, 0)                          \
    X(cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000, 1)                     \
    X(cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", 8000, 1)                             \
    X(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync", 12020, 0)                              \
    X(cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync", 12020, 1)                         \
    X(cuMemPrefetchBatchAsync_ptsz, "cuMemPrefetchBatchAsync", 13000, 1)                  \
    X(cuMemDiscardAndPrefetchBatchAsync, "cuMemDiscardAndPrefetchBatchAsync", 13000, 0)   \
    X(cuMemDiscardAndPrefetchBatchAsync_ptsz, "cuMemDiscardAndPrefetchBatchAsync", 13000, 1) \
    X(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, 0)                                           \
    X(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, 1)                                      \
    X(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, 0)                                    \
    X(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, 1)                               \
    X(cuLaunch, "cuLaunch", 2000, 0)                                                      \
    X(cuLaunchGrid, "cuLaunchGrid", 2000, 0)                                              \
    X(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0)                                    \
    X(cuMemcpy2D_v2, "cuMemcpy2D", 3020, 0)                                               \
    X(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 7000, 1)                                          \
    X(cuMemcpyDtoA_v2, "cuMemcpyDtoA", 3020, 0)                                           \
    X(cuMemcpyDtoA_v2_ptds, "cuMemcpyDtoA", 7000, 1)                                      \
    X(cuMemcpyAtoD_v2, "cuMemcpyAtoD", 3020, 0)                                           \
    X(cuMemcpyAtoD_v2_ptds, "cuMemcpyAtoD", 7000, 1)                                      \
    X(cuMemcpyHtoA_v2, "cuMemcpyHtoA", 3020, 0)                                           \
    X(cuMemcpyHtoA_v2_ptds, "cuMemcpyHtoA", 7000, 1)                                      \
    X(cuMemcpyAtoH_v2, "cuMemcpyAtoH", 3020, 0)                                           \
    X(cuMemcpyAtoH_v2_ptds, "cuMemcpyAtoH", 7000, 1)                                      \
    X(cuMemcpyAtoA_v2, "cuMemcpyAtoA", 3020, 0)                                           \
    X(cuMemcpyAtoA_v2_ptds, "cuMemcpyAtoA", 7000, 1)                                      \
    X(cuMemcpyHtoAAsync_v2, "cuMemcpyHtoAAsync", 3020, 0)                                 \
    X(cuMemcpyHtoAAsync_v2_ptsz, "cuMemcpyHtoAAsync", 7000, 1)                            \
    X(cuMemcpyAtoHAsync_v2, "cuMemcpyAtoHAsync", 3020, 0)                                 \
    X(cuMemcpyAtoHAsync_v2_ptsz, "cuMemcpyAtoHAsync", 7000, 1)                            \
    X(cuMemcpyWithAttributesAsync, "cuMemcpyWithAttributesAsync", 13020, 0)               \
    X(cuMemcpyWithAttributesAsync_ptsz, "cuMemcpyWithAttributesAsync", 13020, 1)          \
    X(cuMemcpy3DWithAttributesAsync, "cuMemcpy3DWithAttributesAsync", 13020, 0)           \
    X(cuMemcpy3DWithAttributesAsync_ptsz, "cuMemcpy3DWithAttributesAsync", 13020, 1)      \
    X(cuMemsetD16_v2, "cuMemsetD16", 3020, 0)                                             \
    X(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1)                                        \
    X(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, 0)                                         \
    X(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, 1)                                    \
    X(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, 0)                                         \
    X(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, 1)                                    \
    X(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0)                                      \
    X(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1)                                 \
    X(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, 0)                                  \
    X(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, 1)                             \
    X(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, 0)                                  \
    X(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, 1)                             \
    X(cuStreamWriteValue32, "cuStreamWriteValue32", 8000, 0)                              \
    X(cuStreamWriteValue32_ptsz, "cuStreamWriteValue32", 8000, 1)                         \
    X(cuStreamWriteValue32_v2, "cuStreamWriteValue32", 11070, 0)                          \
    X(cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", 11070, 1)                     \
    X(cuStreamWriteValue64, "cuStreamWriteValue64", 9000, 0)                              \
    X(cuStreamWriteValue64_ptsz, "cuStreamWriteValue64", 9000, 1)                         \
    X(cuStreamWriteValue64_v2, "cuStreamWriteValue64", 11070, 0)                          \
    X(cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", 11070, 1)                     \
    X(cuStreamWaitValue32, "cuStreamWaitValue32", 8000, 0)                                \
    X(cuStreamWaitValue32_ptsz, "cuStreamWaitValue32", 8000, 1)                           \
    X(cuStreamWaitValue32_v2, "cuStreamWaitValue32", 11070, 0)                            \
    X(cuStreamWaitValue32_v2_ptsz, "cuStreamWaitValue32", 11070, 1)                       \
    X(cuStreamWaitValue64, "cuStreamWaitValue64", 9000, 0)                                \
    X(cuStreamWaitValue64_ptsz, "cuStreamWaitValue64", 9000, 1)                           \
    X(cuStreamWaitValue64_v2, "cuStreamWaitValue64", 11070, 0)                            \
    X(cuStreamWaitValue64_v2_ptsz, "cuStreamWaitValue64", 11070, 1)                       \
    X(cuStreamBatchMemOp, "cuStreamBatchMemOp", 8000, 0)                                  \
    X(cuStreamBatchMemOp_ptsz, "cuStreamBatchMemOp", 8000, 1)                             \
    X(cuStreamBatchMemOp_v2, "cuStreamBatchMemOp", 11070, 0)                              \
    X(cuStreamBatchMemOp_v2_ptsz, "cuStreamBatchMemOp", 11070, 1)

#define DEFINE_RECORDED(symbol, base, version, per_thread) \
    EXPORT CUresult symbol() { record(#symbol); return 0; }
RECORDED_WORK(DEFINE_RECORDED)
#undef DEFINE_RECORDED

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status);

struct entry {
    const char *base;
    int version;
    int per_thread;
    const char *symbol; /* what the address is, for the log */
    void *address;
};
#define ENTRY(base, version, per_thread, function) \
    {base, version, per_thread, #function, (void *)function}

static const struct entry entries[] = {
    ENTRY("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    ENTRY("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
    ENTRY("cuInit", 2000, 0, cuInit),
    ENTRY("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    ENTRY("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    ENTRY("cuDeviceGet", 2000, 0, cuDeviceGet),
    ENTRY("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    ENTRY("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2),
    ENTRY("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    ENTRY("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
    ENTRY("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
    ENTRY("cuCtxDestroy", 2000, 0, cuCtxDestroy),
    ENTRY("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
    ENTRY("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
    ENTRY("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease),
    ENTRY("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
    ENTRY("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset),
    ENTRY("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
    ENTRY("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState),
    ENTRY("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
    ENTRY("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
    ENTRY("cuStreamBeginCapture", 10000, 0, cuStreamBeginCapture),
    ENTRY("cuStreamBeginCapture", 10000, 1, cuStreamBeginCapture_ptsz),
    ENTRY("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2),
    ENTRY("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz),
    ENTRY("cuStreamBeginCaptureToGraph", 12030, 0, cuStreamBeginCaptureToGraph),
    ENTRY("cuStreamEndCapture", 10000, 0, cuStreamEndCapture),
    ENTRY("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz),
    ENTRY("cuThreadExchangeStreamCaptureMode", 10010, 0, cuThreadExchangeStreamCaptureMode),
    ENTRY("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    ENTRY("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    ENTRY("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    ENTRY("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    ENTRY("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
    ENTRY("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    ENTRY("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    ENTRY("cuMemFree", 3020, 0, cuMemFree_v2),
    ENTRY("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    ENTRY("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
    ENTRY("cuMemGetInfo", 3020, 0, internal_mem_get_info),
    ENTRY("cuMemCreate", 10020, 0, cuMemCreate),
    ENTRY("cuMemPoolCreate", 11020, 0, cuMemPoolCreate),
    ENTRY("cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo),
    ENTRY("cuDeviceGetMemPool", 11020, 0, cuDeviceGetMemPool),
    ENTRY("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
    ENTRY("cuMemPoolGetAttribute", 11020, 0, cuMemPoolGetAttribute),
    ENTRY("cuMemPoolSetAttribute", 11020, 0, cuMemPoolSetAttribute),
    ENTRY("cuDeviceGraphMemTrim", 11040, 0, cuDeviceGraphMemTrim),
    ENTRY("cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle),
    ENTRY("cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle),
    ENTRY("cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2),
    ENTRY("cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle),
    ENTRY("cuMemExportToShareableHandle", 10020, 0, cuMemExportToShareableHandle),
    ENTRY("cuMemImportFromShareableHandle", 10020, 0, cuMemImportFromShareableHandle),
    ENTRY("cuCtxEnablePeerAccess", 4000, 0, cuCtxEnablePeerAccess),
    ENTRY("cuMemRelease", 10020, 0, cuMemRelease),
    ENTRY("cuMemGetAllocationGranularity", 10020, 0, cuMemGetAllocationGranularity),
    ENTRY("cuMemAddressReserve", 10020, 0, cuMemAddressReserve),
    ENTRY("cuMemAddressFree", 10020, 0, cuMemAddressFree),
    ENTRY("cuMemMap", 10020, 0, cuMemMap),
    ENTRY("cuMemUnmap", 10020, 0, cuMemUnmap),
    ENTRY("cuMemSetAccess", 10020, 0, cuMemSetAccess),
    ENTRY("cuMemGetAccess", 10020, 0, cuMemGetAccess),
    ENTRY("cuMemGetAllocationPropertiesFromHandle", 10020, 0,
          cuMemGetAllocationPropertiesFromHandle),
    ENTRY("cuMemRetainAllocationHandle", 11000, 0, cuMemRetainAllocationHandle),
    ENTRY("cuPointerGetAttribute", 4000, 0, cuPointerGetAttribute),
    ENTRY("cuPointerGetAttributes", 7000, 0, cuPointerGetAttributes),
    ENTRY("cuPointerSetAttribute", 6000, 0, cuPointerSetAttribute),
    ENTRY("cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2),
    ENTRY("cuMemGetHandleForAddressRange", 11070, 0, cuMemGetHandleForAddressRange),
    ENTRY("cuMemAllocHost", 3020, 0, cuMemAllocHost_v2),
    ENTRY("cuMemFreeHost", 2000, 0, cuMemFreeHost),
    ENTRY("cuMemHostRegister", 6050, 0, cuMemHostRegister_v2),
    ENTRY("cuMemHostUnregister", 4000, 0, cuMemHostUnregister),
    ENTRY("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute),
    ENTRY("cuStreamCreate", 2000, 0, cuStreamCreate),
    ENTRY("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
    ENTRY("cuStreamWaitEvent", 3020, 0, cuStreamWaitEvent),
    ENTRY("cuEventCreate", 2000, 0, cuEventCreate),
    ENTRY("cuEventRecord", 2000, 0, cuEventRecord),
    ENTRY("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
    ENTRY("cuEventQuery", 2000, 0, cuEventQuery),
    ENTRY("cuEventSynchronize", 2000, 0, cuEventSynchronize),
    ENTRY("cuEventElapsedTime", 2000, 0, cuEventElapsedTime),
    ENTRY("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
    ENTRY("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    ENTRY("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    ENTRY("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    ENTRY("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    ENTRY("cuGraphLaunch", 10000, 0, cuGraphLaunch),
    ENTRY("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2),
    ENTRY("cuMemcpyHtoD", 7000, 1, cuMemcpyHtoD_v2_ptds),
    ENTRY("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2),
    ENTRY("cuMemcpyDtoH", 7000, 1, cuMemcpyDtoH_v2_ptds),
    ENTRY("cuMemcpyDtoD", 3020, 0, cuMemcpyDtoD_v2),
    ENTRY("cuMemcpyDtoD", 7000, 1, cuMemcpyDtoD_v2_ptds),
    ENTRY("cuMemcpy", 4000, 0, cuMemcpy),
    ENTRY("cuMemcpy", 7000, 1, cuMemcpy_ptds),
    ENTRY("cuMemsetD8", 3020, 0, cuMemsetD8_v2),
    ENTRY("cuMemsetD8", 7000, 1, cuMemsetD8_v2_ptds),
    ENTRY("cuMemsetD8Async", 3020, 0, cuMemsetD8Async),
    ENTRY("cuMemsetD8Async", 7000, 1, cuMemsetD8Async_ptsz),
    ENTRY("cuMemsetD32", 3020, 0, cuMemsetD32_v2),
    ENTRY("cuMemsetD32", 7000, 1, cuMemsetD32_v2_ptds),
    ENTRY("cuMemsetD32Async", 3020, 0, cuMemsetD32Async),
    ENTRY("cuMemsetD32Async", 7000, 1, cuMemsetD32Async_ptsz),
    ENTRY("cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2),
    ENTRY("cuMemcpyHtoDAsync", 7000, 1, cuMemcpyHtoDAsync_v2_ptsz),
    ENTRY("cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2),
    ENTRY("cuMemcpyDtoHAsync", 7000, 1, cuMemcpyDtoHAsync_v2_ptsz),
    ENTRY("cuMemcpyDtoDAsync", 3020, 0, cuMemcpyDtoDAsync_v2),
    ENTRY("cuMemcpyDtoDAsync", 7000, 1, cuMemcpyDtoDAsync_v2_ptsz),
    ENTRY("cuMemcpyAsync", 4000, 0, cuMemcpyAsync),
    ENTRY("cuMemcpyAsync", 7000, 1, cuMemcpyAsync_ptsz),
    ENTRY("cuMemPrefetchAsync", 8000, 0, cuMemPrefetchAsync),
    ENTRY("cuMemPrefetchBatchAsync", 13000, 0, cuMemPrefetchBatchAsync),
    ENTRY("cuCheckpointProcessLock", 12080, 0, cuCheckpointProcessLock),
    ENTRY("cuCheckpointProcessCheckpoint", 12080, 0, cuCheckpointProcessCheckpoint),
    ENTRY("cuCheckpointProcessRestore", 12080, 0, cuCheckpointProcessRestore),
    ENTRY("cuCheckpointProcessUnlock", 12080, 0, cuCheckpointProcessUnlock),
    ENTRY("cuCheckpointProcessGetState", 12080, 0, cuCheckpointProcessGetState),
#define RECORDED_ENTRY(symbol, base, version, per_thread) ENTRY(base, version, per_thread, symbol),
    RECORDED_WORK(RECORDED_ENTRY)
#undef RECORDED_ENTRY
};

/* FAKE_CUDA_HIDDEN_ENTRY_POINTS=1: answer for memory and GPU work with addresses that no
 * exported symbol has, as a driver handing out internal entry points would, so that the shim
 * must hook every one by name. They are never called: only the real runtime's start-up, which
 * fails against this fake before any GPU work, is run so. */
static const char hidden_addresses[sizeof entries / sizeof entries[0]];

static bool hidden(const struct entry *e)
{
    return getenv("FAKE_CUDA_HIDDEN_ENTRY_POINTS") &&
           (strncmp(e->base, "cuMem", 5) == 0 || strncmp(e->base, "cuLaunch", 8) == 0 ||
            strcmp(e->base, "cuGraphLaunch") == 0);
}

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    int per_thread = (flags & 2) != 0;
    const struct entry *best = NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->base, symbol) != 0 || e->version > version)
            continue;
        if (getenv("FAKE_CUDA_NO_CHECKPOINT") && strncmp(symbol, "cuCheckpoint", 12) == 0)
            continue; /* a driver before r570 */
        if (e->per_thread && !per_thread)
            continue;
        /* The newest variant; between equals, the per-thread one for a per-thread caller. */
        if (!best || e->version > best->version ||
            (e->version == best->version && e->per_thread > best->per_thread))
            best = e;
    }
    record("cuGetProcAddress symbol=%s version=%d flags=%llu found=%d answer=%s", symbol, version,
           flags, best != NULL, best ? best->symbol : "-");
    if (!best) {
        *pfn = NULL;
        return 500; /* CUDA_ERROR_NOT_FOUND */
    }
    *pfn = hidden(best) ? (void *)&hidden_addresses[best - entries] : best->address;
    return 0;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags)
{
    return lookup(symbol, pfn, version, flags);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status)
{
    CUresult result = lookup(symbol, pfn, version, flags);
    if (status)
        *status = result == 0 ? 0 : 1;
    return result;
}

__attribute__((constructor)) static void fake_cuda_loaded(void)
{
    card = map_card();
    take_row();
    pthread_atfork(NULL, NULL, take_row); /* a child's memory is its own */
    pthread_atfork(NULL, NULL, streams_after_fork); /* and its streams */
    own_state = map_state((int)getpid(), true);
    if (own_state && getenv("FAKE_CUDA_CHECKPOINT_FAIL"))
        atomic_store(&own_state->uses_uvm, 1);
    record("loaded");
}

__attribute__((destructor)) static void fake_cuda_unloaded(void)
{
    give_row_back();
}
