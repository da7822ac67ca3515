/* Copies between the card and pageable shadows (or spill files, on the way in) at the link's
 * speed, through a ring of pinned buffers (issue 39, defect 3).
 *
 * A copy to or from pageable memory is staged by the driver through buffers of its own, and
 * synchronous: 5-15 GB/s, one copy at a time, where the link does 55 GB/s from pinned memory.
 * A chunk has a pageable shadow, or none yet, when the builder is behind (the first eviction
 * after the working set grew) or past its pin budget (vmm_builder.c). Its copies go through the
 * ring instead: the ring (pinned ahead by the builder) is cut into slots; on the way out each
 * slot takes one slice of the chunk by cuMemcpyDtoHAsync on the move's stream, an event follows,
 * and a copier thread waits for the event and copies the slice on to the pageable shadow with
 * the CPU, freeing the slot; on the way in a copier fills a slot from the shadow and the move
 * queues its cuMemcpyHtoDAsync, the slot free again once that copy's event has completed. The
 * copy engines work from pinned memory, and the CPU's copies (kiwi_vmm_copiers threads, half
 * the CPUs, at most 8) run beside them, a slot or more ahead.
 *
 * A restore from disk (kiwi_vmm_stage_from_disk) goes through the same ring, cut for it into
 * cells of one spill block (KIWI_SPILL_BLOCK) instead of slots: a copier reads a block straight
 * into a cell (direct I/O into the pinned ring; spill_io.c stages it where the kernel refuses
 * that memory) and checks it, several blocks in flight (at least READS_IN_FLIGHT copiers,
 * whatever the CPUs), and the move queues the cell's copies to the card as soon as it is
 * filled, in order, while the next blocks are read; the cell is read into again only once the
 * event after those copies has completed. So a restore from disk holds no more host memory
 * than the ring, and the disk and the link work at once.
 *
 * Only the move's thread queues work here (it holds kiwi_vmm_lock throughout), and the copiers
 * never take that lock: they need only the driver's event synchronization and memory.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm.h"

#define MAX_SLOTS 32
/* A disk wants several reads in flight to reach its speed: this many copiers at least. */
#define READS_IN_FLIGHT 4

enum slot_state {
    FREE,
    OUT_QUEUED,  /* its copy from the card is queued; a copier takes it on to the host */
    IN_FILLING,  /* a copier fills it from the host, or from a spill file */
    IN_FILLED,   /* filled: its copy to the card may be queued */
    IN_QUEUED,   /* its copy to the card is queued: free once its event has completed */
};

struct slot {
    unsigned char *buffer;
    enum slot_state state;
    bool taken; /* by a copier, for the state it is in */
    CUevent event;
    CUcontext event_ctx;
    unsigned char *host; /* the pageable side */
    size_t size;
    struct kiwi_spill_file *file; /* filled from block `block` of this file instead; NULL: host */
    size_t block;
    bool unread; /* its block could not be read (why: disk_failure) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;  /* for the copiers */
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* for the move: a slot changed */
static struct slot slots[MAX_SLOTS];
static int slot_count;
static size_t slot_size;       /* the ring's slots; cut_size: what the slots are cut to now */
static size_t cut_size;
static unsigned char *ring_at; /* the ring the slots are cut from */
static size_t ring_bytes;
static int copiers;
static bool failed;
static char disk_failure[512]; /* the first block of a restore from disk that was not read */

/* ---- the copiers --------------------------------------------------------------------------- */

/* Under lock: a slot with work for a copier, or NULL. */
static struct slot *work_for_copier(void)
{
    for (int i = 0; i < slot_count; i++)
        if (!slots[i].taken && (slots[i].state == OUT_QUEUED || slots[i].state == IN_FILLING))
            return &slots[i];
    return NULL;
}

/* Faults in the pages of a pageable shadow a copy is about to fill (a first eviction makes it
 * then, and its pages come from the kernel zeroed, one fault each): done while the copy from
 * the card is on its way, rather than in the copy after it. */
static void prefault(unsigned char *host, size_t size)
{
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)host & ~(page - 1);
    madvise((void *)start, (uintptr_t)host + size - start, MADV_POPULATE_WRITE);
#else
    (void)host;
    (void)size;
#endif
}

static void *copy_slots(void *unused)
{
    (void)unused;
    /* A block's way in where the kernel refuses the ring for direct reads (made then; kept, as
     * the thread is: the next restore's reads meet the same ring). */
    unsigned char *bounce = NULL;
    pthread_mutex_lock(&lock);
    for (;;) {
        struct slot *s = work_for_copier();
        if (!s) {
            pthread_cond_wait(&work, &lock);
            continue;
        }
        s->taken = true;
        pthread_mutex_unlock(&lock);
        bool ok = true, unread = false;
        char why[sizeof disk_failure];
        if (s->file) {
            unread = !kiwi_spill_read_block(s->file, s->block, s->buffer, &bounce, why,
                                            sizeof why);
        } else if (s->state == OUT_QUEUED) {
            prefault(s->host, s->size); /* while the copy to the slot is still on its way */
            ok = !s->event || kiwi_vmm_driver.event_synchronize(s->event) == CUDA_SUCCESS;
            if (ok)
                memcpy(s->host, s->buffer, s->size);
        } else {
            memcpy(s->buffer, s->host, s->size);
        }
        pthread_mutex_lock(&lock);
        s->taken = false;
        s->state = s->state == OUT_QUEUED ? FREE : IN_FILLED;
        s->unread = unread;
        if (unread && !disk_failure[0])
            snprintf(disk_failure, sizeof disk_failure, "%s", why);
        failed = failed || !ok;
        pthread_cond_broadcast(&moved);
    }
    return NULL;
}

static void start_copiers(int wanted)
{
    for (; copiers < wanted; copiers++)
        if (!kiwi_thread_start(copy_slots))
            break;
}

/* ---- the move's side ------------------------------------------------------------------------ */

/* In a forked child (found out at its first move: nothing here is used before), which has
 * neither the parent's ring (MADV_DONTFORK) nor its copier threads. */
static void after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&work, NULL);
    pthread_cond_init(&moved, NULL);
    slot_count = 0;
    slot_size = cut_size = ring_bytes = 0;
    ring_at = NULL;
    copiers = 0;
    failed = false;
}

bool kiwi_vmm_staging_begin(void)
{
    static pid_t owner;
    if (owner != getpid()) {
        if (owner)
            after_fork();
        owner = getpid();
    }
    size_t slot = 0;
    struct vmm_shadow ring = kiwi_vmm_ring(&slot);
    if (ring.kind == SHADOW_NONE || !slot)
        return false;
    pthread_mutex_lock(&lock);
    if (ring_at != ring.host) { /* every slot is free between moves */
        ring_at = ring.host;
        ring_bytes = ring.size;
        slot_size = slot;
        cut_size = 0;
        slot_count = 0;
    }
    start_copiers(kiwi_vmm_copiers());
    bool usable = copiers > 0;
    pthread_mutex_unlock(&lock);
    return usable;
}

/* Under lock: every slot free, its copies done (one that failed sets failed), and its event
 * back to its context's spares (a context that ends takes them along). */
static void settle(void)
{
    for (int i = 0; i < slot_count; i++) {
        struct slot *s = &slots[i];
        while (s->state == OUT_QUEUED || s->state == IN_FILLING || s->state == IN_FILLED)
            pthread_cond_wait(&moved, &lock);
        if (s->state == IN_QUEUED) {
            pthread_mutex_unlock(&lock);
            bool ok = !s->event || kiwi_vmm_driver.event_synchronize(s->event) == CUDA_SUCCESS;
            pthread_mutex_lock(&lock);
            failed = failed || !ok;
            s->state = FREE;
        }
        if (s->event) {
            kiwi_vmm_event_give(s->event_ctx, s->event);
            s->event = NULL;
        }
    }
}

/* Under lock: the ring cut into slots of size (the staging's own, or a spill block's cells),
 * once the slots it was cut into are free. */
static void cut(size_t size)
{
    if (size == cut_size || !ring_at)
        return;
    settle();
    size_t count = ring_bytes / size;
    slot_count = count > MAX_SLOTS ? MAX_SLOTS : (int)count;
    for (int i = 0; i < slot_count; i++)
        slots[i] = (struct slot){.buffer = ring_at + (size_t)i * size, .state = FREE};
    cut_size = size;
}

/* Under lock: s's event, made in ctx (a slot's last one was perhaps another context's). */
static CUevent event_in(struct slot *s, CUcontext ctx)
{
    if (s->event && s->event_ctx != ctx) {
        kiwi_vmm_event_give(s->event_ctx, s->event);
        s->event = NULL;
    }
    if (!s->event) {
        s->event = kiwi_vmm_event_take(ctx);
        s->event_ctx = ctx;
    }
    return s->event;
}

/* Under lock: a slot free for new work, waiting for one; with may_wait false, NULL rather than
 * wait for a copier (a slot whose copy to the card is queued is waited for all the same: the
 * GPU finishes it). */
static struct slot *free_slot(bool may_wait)
{
    for (;;) {
        for (int i = 0; i < slot_count; i++)
            if (slots[i].state == FREE)
                return &slots[i];
        for (int i = 0; i < slot_count; i++) {
            struct slot *s = &slots[i];
            if (s->state != IN_QUEUED)
                continue;
            pthread_mutex_unlock(&lock);
            bool ok = !s->event || kiwi_vmm_driver.event_synchronize(s->event) == CUDA_SUCCESS;
            pthread_mutex_lock(&lock);
            failed = failed || !ok;
            s->state = FREE;
            return s;
        }
        if (!may_wait)
            return NULL;
        pthread_cond_wait(&moved, &lock);
    }
}

/* Under lock: records s's event after the copy just queued on stream; without one, waits for
 * the stream instead (the copiers then need not wait). */
static void follow(struct slot *s, CUcontext ctx, CUstream stream)
{
    CUevent event = event_in(s, ctx);
    if (event && kiwi_vmm_driver.event_record(event, stream) == CUDA_SUCCESS)
        return;
    if (kiwi_pager_driver.stream_sync(stream) != CUDA_SUCCESS)
        failed = true;
    if (s->event) {
        kiwi_vmm_event_give(s->event_ctx, s->event);
        s->event = NULL;
    }
}

CUresult kiwi_vmm_stage_out(CUcontext ctx, CUstream stream, CUdeviceptr from, void *to,
                            size_t size)
{
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    cut(slot_size);
    for (size_t done = 0; done < size && result == CUDA_SUCCESS;) {
        size_t n = size - done < slot_size ? size - done : slot_size;
        struct slot *s = free_slot(true);
        result = kiwi_pager_driver.copy_to_host(s->buffer, from + done, n, stream);
        if (result != CUDA_SUCCESS)
            break;
        follow(s, ctx, stream);
        s->host = (unsigned char *)to + done;
        s->file = NULL;
        s->size = n;
        s->state = OUT_QUEUED;
        pthread_cond_signal(&work);
        done += n;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

CUresult kiwi_vmm_stage_in(CUcontext ctx, CUstream stream, const void *from, CUdeviceptr to,
                           size_t size)
{
    /* Slices are filled by the copiers ahead, in order, and queued to the card as they fill. */
    struct slot *filling[MAX_SLOTS];
    int first = 0, count = 0;
    size_t asked = 0, queued = 0;
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    cut(slot_size);
    while (queued < size && result == CUDA_SUCCESS) {
        while (asked < size && count < slot_count) {
            struct slot *s = free_slot(count == 0);
            if (!s)
                break;
            s->host = (unsigned char *)from + asked;
            s->file = NULL;
            s->size = size - asked < slot_size ? size - asked : slot_size;
            s->state = IN_FILLING;
            filling[(first + count++) % MAX_SLOTS] = s;
            asked += s->size;
            pthread_cond_signal(&work);
        }
        struct slot *s = filling[first];
        while (s->state != IN_FILLED)
            pthread_cond_wait(&moved, &lock);
        first = (first + 1) % MAX_SLOTS;
        count--;
        result = kiwi_pager_driver.copy_to_device(to + queued, s->buffer, s->size, stream);
        if (result == CUDA_SUCCESS)
            follow(s, ctx, stream);
        s->state = result == CUDA_SUCCESS ? IN_QUEUED : FREE;
        queued += s->size;
    }
    while (count > 0) { /* a copy failed: the slices filled meanwhile are not queued */
        struct slot *s = filling[first];
        while (s->state != IN_FILLED)
            pthread_cond_wait(&moved, &lock);
        s->state = FREE;
        first = (first + 1) % MAX_SLOTS;
        count--;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

bool kiwi_vmm_stage_from_disk(struct kiwi_spill_file *file, const size_t *blocks, size_t count,
                              kiwi_vmm_deliver_fn deliver, void *arg, CUresult *result,
                              char *why, size_t why_size)
{
    struct slot *reading[MAX_SLOTS]; /* in the order of blocks: delivered in that order */
    int first = 0, pending = 0;
    size_t asked = 0, delivered = 0;
    bool unread = false;
    *result = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    cut(KIWI_SPILL_BLOCK);
    start_copiers(READS_IN_FLIGHT);
    disk_failure[0] = '\0';
    while (delivered < count && !unread && *result == CUDA_SUCCESS && slot_count > 0) {
        while (asked < count && pending < slot_count) {
            struct slot *s = free_slot(pending == 0);
            if (!s)
                break;
            *s = (struct slot){.buffer = s->buffer, .event = s->event, .event_ctx = s->event_ctx,
                               .state = IN_FILLING, .file = file, .block = blocks[asked++]};
            reading[(first + pending++) % MAX_SLOTS] = s;
            pthread_cond_signal(&work);
        }
        struct slot *s = reading[first];
        while (s->state != IN_FILLED)
            pthread_cond_wait(&moved, &lock);
        first = (first + 1) % MAX_SLOTS;
        pending--;
        unread = s->unread;
        CUcontext ctx = NULL;
        CUstream stream = NULL;
        if (!unread) { /* the copiers need the lock meanwhile; this cell is the move's alone */
            pthread_mutex_unlock(&lock);
            *result = deliver(arg, s->block, s->buffer, &ctx, &stream);
            pthread_mutex_lock(&lock);
        }
        bool queued = !unread && *result == CUDA_SUCCESS;
        if (queued)
            follow(s, ctx, stream);
        s->state = queued ? IN_QUEUED : FREE;
        s->file = NULL;
        delivered++;
    }
    while (pending > 0) { /* a read or a copy failed: the blocks read meanwhile are dropped */
        struct slot *s = reading[first];
        while (s->state != IN_FILLED)
            pthread_cond_wait(&moved, &lock);
        s->state = FREE;
        s->file = NULL;
        first = (first + 1) % MAX_SLOTS;
        pending--;
    }
    if (unread)
        snprintf(why, why_size, "%s", disk_failure);
    else if (!slot_count)
        snprintf(why, why_size, "the staging ring is smaller than a spill block");
    pthread_mutex_unlock(&lock);
    return !unread && slot_count > 0;
}

uint64_t kiwi_vmm_staging_bytes(void)
{
    pthread_mutex_lock(&lock);
    size_t count = slot_size ? ring_bytes / slot_size : 0; /* the staging's own cut */
    uint64_t bytes = (uint64_t)(count > MAX_SLOTS ? MAX_SLOTS : count) * slot_size;
    pthread_mutex_unlock(&lock);
    return bytes;
}

bool kiwi_vmm_staging_end(void)
{
    pthread_mutex_lock(&lock);
    settle();
    bool ok = !failed;
    failed = false;
    pthread_mutex_unlock(&lock);
    return ok;
}
