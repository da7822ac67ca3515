/* Copies between the card and pageable shadows at the link's speed, through a ring of pinned
 * buffers (issue 39, defect 3).
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
 * Only the move's thread queues work here (it holds kiwi_vmm_lock throughout), and the copiers
 * never take that lock: they need only the driver's event synchronization and memory.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm.h"

#define MAX_SLOTS 32

enum slot_state {
    FREE,
    OUT_QUEUED,  /* its copy from the card is queued; a copier takes it on to the host */
    IN_FILLING,  /* a copier fills it from the host */
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
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;  /* for the copiers */
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* for the move: a slot changed */
static struct slot slots[MAX_SLOTS];
static int slot_count;
static size_t slot_size;
static unsigned char *ring_at; /* the ring the slots are cut from */
static int copiers;
static bool failed;

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
    pthread_mutex_lock(&lock);
    for (;;) {
        struct slot *s = work_for_copier();
        if (!s) {
            pthread_cond_wait(&work, &lock);
            continue;
        }
        s->taken = true;
        pthread_mutex_unlock(&lock);
        bool ok = true;
        if (s->state == OUT_QUEUED) {
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
        failed = failed || !ok;
        pthread_cond_broadcast(&moved);
    }
    return NULL;
}

static void start_copiers(void)
{
    for (int wanted = kiwi_vmm_copiers(); copiers < wanted; copiers++)
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
    slot_size = 0;
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
        slot_size = slot;
        slot_count = (int)(ring.size / slot);
        slot_count = slot_count > MAX_SLOTS ? MAX_SLOTS : slot_count;
        for (int i = 0; i < slot_count; i++)
            slots[i] = (struct slot){.buffer = ring_at + (size_t)i * slot, .state = FREE};
    }
    start_copiers();
    bool usable = copiers > 0;
    pthread_mutex_unlock(&lock);
    return usable;
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
    for (size_t done = 0; done < size && result == CUDA_SUCCESS;) {
        size_t n = size - done < slot_size ? size - done : slot_size;
        struct slot *s = free_slot(true);
        result = kiwi_pager_driver.copy_to_host(s->buffer, from + done, n, stream);
        if (result != CUDA_SUCCESS)
            break;
        follow(s, ctx, stream);
        s->host = (unsigned char *)to + done;
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
    while (queued < size && result == CUDA_SUCCESS) {
        while (asked < size && count < slot_count) {
            struct slot *s = free_slot(count == 0);
            if (!s)
                break;
            s->host = (unsigned char *)from + asked;
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

int kiwi_vmm_copiers(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 4 ? 1 : cpus / 2 > 8 ? 8 : (int)(cpus / 2);
}

uint64_t kiwi_vmm_staging_bytes(void)
{
    pthread_mutex_lock(&lock);
    uint64_t bytes = (uint64_t)slot_count * slot_size;
    pthread_mutex_unlock(&lock);
    return bytes;
}

bool kiwi_vmm_staging_end(void)
{
    pthread_mutex_lock(&lock);
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
        if (s->event) { /* back to its context's spares: a context that ends takes them along */
            kiwi_vmm_event_give(s->event_ctx, s->event);
            s->event = NULL;
        }
    }
    bool ok = !failed;
    failed = false;
    pthread_mutex_unlock(&lock);
    return ok;
}

