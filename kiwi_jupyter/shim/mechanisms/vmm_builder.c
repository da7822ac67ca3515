/* The vmm evictor's shadow builder: host shadows pinned ahead of time, within a budget.
 *
 * A copy engine reaches the link's speed only from and to pinned memory, and pinning is slow
 * (vmm_shadows.c), so a thread of the evictor's own pins shadows as chunks appear, oldest region
 * first, and keeps them across evictions, within bounds (unbounded, a pod was OOM-killed by its
 * own builder, and a host's RAM was pinned for every kernel's whole working set, forever):
 *
 * - the pin budget: the daemon's (`pin_budget` in `registered` and its events), within the
 *   kernel's own: KIWI_VMM_PIN_BUDGET, else a quarter of the host's memory;
 * - the process's own cgroup (cgroup.c): a pinning must leave its memory limit MARGIN (a
 *   sixteenth of the limit, at least 64 MiB) of room; when the room falls under half that,
 *   shadows are dropped;
 * - first the staging ring (a few pinned buffers the copies of chunks without a pinned shadow
 *   go through, vmm_staging.c: so an eviction reaches the link even for them), then the chunks'
 *   shadows. Beyond the budget a chunk has no shadow while it is on the card; an eviction makes
 *   a pageable one at once and copies through the ring;
 * - what is dropped when the budget shrinks or the room runs short is only ever a shadow of
 *   memory on the card (its bytes are there): spares first, then the newest chunks', the ring
 *   last. A pageable shadow of a chunk back on the card is pinned in its place where the budget
 *   allows, else dropped (its bytes are on the card again, and it would hold host memory for
 *   nothing).
 *
 * It never pins (or unpins) while a move runs: registration holds the driver's locks for tens
 * of ms per 256 MiB, and the copy engines would idle (defect 4). A move waits for a pinning in
 * progress before it starts (kiwi_vmm_builder_quiet), and the builder waits for the move to end.
 * Nor while a graph capture begun in the global mode is open in another thread: pinning there
 * fails and invalidates the capture (defect 2b; captures.c holds the capture off meanwhile).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "vmm.h"

#define MIB ((uint64_t)1 << 20)
/* Shadows of chunks freed, kept for the next chunk of their size, up to this. */
#define SPARE_BYTES ((uint64_t)1 << 30)
#define MARGIN_FLOOR (64 * MIB)
/* The ring: this many slots per copier thread (vmm_staging.c), of at most RING_SLOT bytes each;
 * a quarter of the budget at most, in whole 2 MiB; none when that is less than 2 MiB a slot. */
#define SLOTS_PER_COPIER 2
#define MIN_SLOTS 4
#define RING_SLOT (16 * MIB)
#define GRANULE (2 * MIB)
/* How often an idle builder looks at its cgroup's room again. */
#define LOOK_AGAIN_SECONDS 1
/* How long the first pinning waits for the daemon's word on the budget (its answer to
 * `register`, which follows the first GPU work): pinning with the shim's own default and
 * dropping it again would defeat a smaller budget at start, when a framework allocates most. */
#define DAEMONS_WORD_SECONDS 2

/* Shadows of chunks freed, kept for the next chunk of their size. */
struct spare {
    struct spare *next;
    struct vmm_shadow shadow;
};
static struct spare *spares;
static uint64_t spare_bytes;

static pthread_cond_t shadow_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t quiet = PTHREAD_COND_INITIALIZER; /* no pinning or unpinning under way */
static bool started, stalled, busy;
static atomic_bool moving;
static double seconds_pinning;
/* Set without kiwi_vmm_lock (kiwi_vmm_pin_budget). */
static _Atomic uint64_t daemon_budget; /* 0 until the daemon says, or when it has no word */
static atomic_bool heard; /* the daemon answered `register`, or it is not worth waiting */
static struct vmm_shadow ring;
static size_t ring_slot;
static const char *said; /* the last reason pinning stopped, said once */

/* ---- the budget ------------------------------------------------------------------------- */

/* The daemon's word within the kernel's own: neither raises the other. */
static uint64_t budget(void)
{
    uint64_t own = kiwi_cfg.pin_budget;
    if (!own) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        own = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : 0;
    }
    uint64_t daemons = atomic_load(&daemon_budget);
    return daemons && daemons < own ? daemons : own;
}

/* On the comm thread, never waiting for kiwi_vmm_lock: a move holds it throughout, and the comm
 * thread sends its progress (waiting, it sent none: the kernel was checkpointed mid-move). */
void kiwi_vmm_pin_budget(uint64_t bytes)
{
    atomic_store(&daemon_budget, bytes);
    atomic_store(&heard, true);
    if (pthread_mutex_trylock(&kiwi_vmm_lock) == 0) {
        kiwi_vmm_shadows_changed();
        pthread_mutex_unlock(&kiwi_vmm_lock);
    }
    if (bytes)
        kiwi_log("the daemon's pin budget: %llu bytes", (unsigned long long)bytes);
}

static size_t ring_slots(void)
{
    size_t slots = (size_t)kiwi_vmm_copiers() * SLOTS_PER_COPIER;
    return slots < MIN_SLOTS ? MIN_SLOTS : slots;
}

/* Under kiwi_vmm_lock: the host memory pinned for evictions now. */
static uint64_t pinned_now(void)
{
    uint64_t bytes = ring.size;
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next)
        for (int i = 0; i < r->chunk_count; i++)
            if (kiwi_vmm_shadow_pinned(&r->chunks[i].shadow))
                bytes += r->chunks[i].shadow.size;
    for (struct spare *s = spares; s; s = s->next)
        if (kiwi_vmm_shadow_pinned(&s->shadow))
            bytes += s->shadow.size;
    return bytes;
}

/* How much more may be pinned now (the budget, and the cgroup's room less the margin); *short:
 * the cgroup's room is under half the margin, so shadows of memory on the card must go. */
static uint64_t pinnable(uint64_t pinned, bool *short_of_room, const char **why)
{
    uint64_t allowed = budget(), more = allowed > pinned ? allowed - pinned : 0;
    *why = "the pin budget is reached";
    *short_of_room = pinned > allowed;
    uint64_t room = 0, limit = 0;
    if (kiwi_cgroup_room(&room, &limit)) {
        uint64_t margin = limit / 16 > MARGIN_FLOOR ? limit / 16 : MARGIN_FLOOR;
        uint64_t left = room > margin ? room - margin : 0;
        if (left < more) {
            more = left;
            *why = "the process's memory limit (its cgroup) leaves no room for more";
        }
        *short_of_room = *short_of_room || room < margin / 2;
    }
    return more;
}

/* ---- spares ------------------------------------------------------------------------------ */

struct vmm_shadow kiwi_vmm_spare_take(size_t size)
{
    for (struct spare **s = &spares; *s; s = &(*s)->next) {
        if ((*s)->shadow.size != size)
            continue;
        struct spare *found = *s;
        *s = found->next;
        struct vmm_shadow shadow = found->shadow;
        spare_bytes -= shadow.size;
        free(found);
        return shadow;
    }
    return (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

void kiwi_vmm_spare_put(struct vmm_shadow *shadow)
{
    if (shadow->kind == SHADOW_NONE)
        return;
    struct spare *s = shadow->kind != SHADOW_PAGEABLE && spare_bytes + shadow->size <= SPARE_BYTES
                          ? malloc(sizeof *s)
                          : NULL;
    if (!s) {
        kiwi_vmm_shadow_free(shadow);
        return;
    }
    s->shadow = *shadow;
    s->next = spares;
    spares = s;
    spare_bytes += shadow->size;
    *shadow = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

/* ---- what to do next -------------------------------------------------------------------- */

enum step { NOTHING, PIN_RING, PIN_CHUNK, DROP };

struct plan {
    enum step step;
    uint64_t serial; /* the chunk's region, found again by it after the lock was let go */
    int index;
    size_t size;
    CUcontext ctx;
    struct vmm_shadow dropped; /* taken off its chunk, the spares or the ring: to free */
};

/* Under kiwi_vmm_lock: takes a shadow of memory on the card (spares first, then the newest
 * chunks', the ring last) to drop; false when none is left. */
static bool take_for_dropping(struct plan *p)
{
    if (spares) {
        struct spare *s = spares;
        spares = s->next;
        spare_bytes -= s->shadow.size;
        p->dropped = s->shadow;
        free(s);
        return true;
    }
    struct vmm_region *last = kiwi_vmm_first_region;
    while (last && last->next)
        last = last->next;
    for (struct vmm_region *r = last; r; r = r->prev) {
        for (int i = r->chunk_count - 1; i >= 0; i--) {
            struct vmm_chunk *c = &r->chunks[i];
            if (c->resident && c->shadow.kind != SHADOW_NONE) {
                p->dropped = c->shadow;
                c->shadow = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
                return true;
            }
        }
    }
    if (ring.kind == SHADOW_NONE)
        return false;
    p->dropped = ring;
    ring = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
    ring_slot = 0;
    return true;
}

/* Under kiwi_vmm_lock: the ring's size for this budget (0: none, too small a budget). */
static size_t ring_size(void)
{
    size_t slots = ring_slots();
    uint64_t slot = budget() / 4 / slots / GRANULE * GRANULE;
    slot = slot > RING_SLOT ? RING_SLOT : slot;
    return (size_t)(slot * slots);
}

static void stop(const char *why)
{
    if (why != said)
        kiwi_warn("host shadows: pinning stops here, %s (%llu bytes pinned); an eviction copies "
                  "the rest through the staging ring", why, (unsigned long long)pinned_now());
    said = why;
    stalled = true;
}

/* Under kiwi_vmm_lock: the next step. */
static struct plan next_step(void)
{
    struct plan p = {.step = NOTHING};
    bool pin = kiwi_cfg.shadow != KIWI_SHADOW_PAGEABLE, short_of_room;
    const char *why;
    uint64_t pinned = pinned_now(), more = pinnable(pinned, &short_of_room, &why);
    /* A pageable shadow of memory back on the card: its bytes are not needed; pinned in its
     * place below where there is room, else let go now. */
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; i < r->chunk_count; i++) {
            struct vmm_chunk *c = &r->chunks[i];
            if (c->resident && c->shadow.kind == SHADOW_PAGEABLE &&
                (!pin || short_of_room || c->size > more)) {
                p.step = DROP;
                p.dropped = c->shadow;
                c->shadow = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
                return p;
            }
        }
    }
    if (short_of_room) {
        if (take_for_dropping(&p))
            p.step = DROP;
        return p;
    }
    if (!pin || stalled || !kiwi_vmm_first_region)
        return p;
    size_t wanted = ring.kind == SHADOW_NONE ? ring_size() : 0;
    if (wanted) {
        if (wanted > more) {
            stop(why);
            return p;
        }
        return (struct plan){.step = PIN_RING, .size = wanted, .ctx = kiwi_vmm_first_region->ctx};
    }
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        if (r->pinned || r->cached)
            continue;
        for (int i = 0; i < r->chunk_count; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            bool wants = (c->shadow.kind == SHADOW_NONE && !c->spilled) ||
                         (c->shadow.kind == SHADOW_PAGEABLE && c->resident);
            if (!wants)
                continue;
            if (c->size > more) {
                stop(why);
                return p;
            }
            return (struct plan){.step = PIN_CHUNK, .serial = r->serial, .index = i,
                                 .size = c->size, .ctx = r->ctx};
        }
    }
    return p;
}

/* ---- the thread ----------------------------------------------------------------------------- */

static struct vmm_region *region_with_serial(uint64_t serial)
{
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next)
        if (r->serial == serial)
            return r;
    return NULL;
}

/* Under kiwi_vmm_lock, let go meanwhile: does what the driver must do outside it (pin, unpin),
 * with no move running and no capture in the global mode open; false when a move began
 * meanwhile and nothing was done. */
static bool outside(struct plan *p, struct vmm_shadow *made)
{
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (kiwi_capture_global_open())
        kiwi_log("host shadows: a graph capture in the global mode is open; waiting for it to "
                 "end before pinning");
    kiwi_capture_hold_for_pinning();
    pthread_mutex_lock(&kiwi_vmm_lock);
    if (atomic_load(&moving)) {
        kiwi_capture_unhold();
        return false;
    }
    busy = true;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    double began = kiwi_now();
    if (p->step == DROP) {
        kiwi_vmm_shadow_free(&p->dropped);
    } else {
        kiwi_pager_driver.ctx_set(p->ctx); /* pinned memory is registered in a context */
        *made = kiwi_vmm_shadow_make(p->size);
    }
    double took = kiwi_now() - began;
    kiwi_capture_unhold();
    pthread_mutex_lock(&kiwi_vmm_lock);
    busy = false;
    pthread_cond_broadcast(&quiet);
    if (p->step != DROP)
        seconds_pinning += took;
    return true;
}

/* Under kiwi_vmm_lock: a shadow made for p goes where it was wanted, if it still is. */
static void place(const struct plan *p, struct vmm_shadow *made)
{
    if (!kiwi_vmm_shadow_pinned(made)) {
        if (made->kind != SHADOW_NONE)
            kiwi_vmm_shadow_free(made);
        stop("host memory could not be pinned");
        return;
    }
    if (p->step == PIN_RING) {
        ring = *made;
        ring_slot = ring.size / ring_slots();
        said = NULL;
        return;
    }
    struct vmm_region *r = region_with_serial(p->serial);
    struct vmm_chunk *c = r && p->index < r->chunk_count ? &r->chunks[p->index] : NULL;
    bool wanted = c && !r->pinned && c->size == made->size &&
                  ((c->shadow.kind == SHADOW_NONE && !c->spilled) ||
                   (c->shadow.kind == SHADOW_PAGEABLE && c->resident));
    if (!wanted) {
        kiwi_vmm_spare_put(made);
        return;
    }
    if (c->shadow.kind != SHADOW_NONE)
        kiwi_vmm_shadow_free(&c->shadow); /* the pageable one: its bytes are on the card */
    c->shadow = *made;
    said = NULL; /* pinning went on: a stop is worth saying again */
}

static void idle(void)
{
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += LOOK_AGAIN_SECONDS;
    pthread_cond_timedwait(&shadow_work, &kiwi_vmm_lock, &at);
    stalled = false; /* the room may have changed: look again */
}

/* Under kiwi_vmm_lock: waits (bounded) for the daemon's word before the first pinning. */
static void wait_for_the_daemons_word(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += DAEMONS_WORD_SECONDS;
    while (!atomic_load(&heard) &&
           pthread_cond_timedwait(&shadow_work, &kiwi_vmm_lock, &until) == 0)
        ;
    atomic_store(&heard, true);
}

static void *build(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&kiwi_vmm_lock);
    wait_for_the_daemons_word();
    bool dropped = false; /* since the last idle */
    for (;;) {
        if (atomic_load(&moving)) {
            pthread_cond_wait(&shadow_work, &kiwi_vmm_lock);
            continue;
        }
        struct plan p = next_step();
        if (p.step == NOTHING) {
            if (dropped) { /* the daemon hears the pinned bytes go down; lock-free: news.c */
                kiwi_news_set(KIWI_NEWS_WORKING_SET);
                kiwi_news_wake();
            }
            dropped = false;
            idle();
            continue;
        }
        if (p.step == PIN_CHUNK) { /* a spare of its size first: no pinning at all */
            struct vmm_shadow spare = kiwi_vmm_spare_take(p.size);
            if (spare.kind != SHADOW_NONE) {
                place(&p, &spare);
                continue;
            }
        }
        dropped = dropped || p.step == DROP;
        if (p.step == DROP && !kiwi_vmm_shadow_pinned(&p.dropped)) {
            kiwi_vmm_shadow_free(&p.dropped); /* pageable: no driver call */
            continue;
        }
        struct vmm_shadow made = {NULL, 0, SHADOW_NONE};
        if (!outside(&p, &made) && p.step == DROP)
            kiwi_vmm_spare_put(&p.dropped); /* a move began: dropped after it, if still due */
        else if (p.step != DROP)
            place(&p, &made);
    }
    return NULL;
}

void kiwi_vmm_builder_start(void)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    bool start = !started;
    started = true;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (start && !kiwi_thread_start(build))
        kiwi_warn("no thread to build host shadows: evictions copy to memory made then");
}

void kiwi_vmm_shadows_changed(void)
{
    stalled = false;
    pthread_cond_signal(&shadow_work);
}

void kiwi_vmm_moving(bool now)
{
    atomic_store(&moving, now);
    if (!now)
        kiwi_vmm_shadows_changed(); /* the builder goes on */
}

bool kiwi_vmm_move_running(void)
{
    return atomic_load(&moving);
}

void kiwi_vmm_builder_quiet(void)
{
    while (busy)
        pthread_cond_wait(&quiet, &kiwi_vmm_lock);
}

struct vmm_shadow kiwi_vmm_ring(size_t *slot)
{
    *slot = ring_slot;
    return ring;
}

void kiwi_vmm_builder_count(struct kiwi_residency *out)
{
    for (struct spare *s = spares; s; s = s->next) {
        out->shadow += s->shadow.size;
        if (kiwi_vmm_shadow_pinned(&s->shadow))
            out->shadow_pinned += s->shadow.size;
    }
    out->staging = ring.size;
    out->pin_budget = budget();
    out->seconds_pinning = seconds_pinning;
}

void kiwi_vmm_builder_after_fork(void)
{
    /* The child has none of the parent's shadows (MADV_DONTFORK) and no builder thread. */
    pthread_cond_init(&shadow_work, NULL);
    pthread_cond_init(&quiet, NULL);
    spares = NULL;
    spare_bytes = 0;
    started = stalled = busy = false;
    atomic_store(&heard, false);
    atomic_store(&moving, false);
    seconds_pinning = 0;
    ring = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
    ring_slot = 0;
    said = NULL;
}
