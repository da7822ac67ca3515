/* Where the vmm evictor's memory is: on the card, in host memory, in shadows (and how much of
 * those is pinned), for the stats and the daemon; whether any of it could leave the card, or
 * is away.
 */
#define _GNU_SOURCE
#include "vmm.h"

/* The figures last counted under kiwi_vmm_lock. A move (an eviction or a restore) holds that
 * lock for as long as it moves memory (seconds for tens of GiB): a reader then gets these, as
 * fresh as the move's last count, instead of waiting (the stats, %kiwi status). Any other holder
 * of the lock (an allocation, the shadow builder) is brief: a reader waits for it, so the figures
 * after a move (what `evicted` and the restore's report tell the daemon) are never older than
 * it. */
static pthread_mutex_t last_counted_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kiwi_residency last_counted;

static void count_residency(struct kiwi_residency *out)
{
    *out = (struct kiwi_residency){0};
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; i < r->chunk_count; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            if (c->resident)
                out->resident += c->size;
            uint64_t *where = c->spilled ? &out->disk : &out->host;
            for (size_t p = 0; !c->resident && p < c->piece_count; p++)
                *where += c->pieces[p].size;
            out->shadow += c->shadow.size;
            if (kiwi_vmm_shadow_pinned(&c->shadow))
                out->shadow_pinned += c->shadow.size;
        }
    }
    kiwi_vmm_builder_count(out);
}

void kiwi_vmm_residency(struct kiwi_residency *out)
{
    if (pthread_mutex_trylock(&kiwi_vmm_lock) != 0) {
        if (kiwi_vmm_move_running()) {
            pthread_mutex_lock(&last_counted_lock);
            *out = last_counted;
            pthread_mutex_unlock(&last_counted_lock);
            return;
        }
        pthread_mutex_lock(&kiwi_vmm_lock);
    }
    kiwi_vmm_residency_locked(out);
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_residency_locked(struct kiwi_residency *out)
{
    count_residency(out);
    pthread_mutex_lock(&last_counted_lock);
    last_counted = *out;
    pthread_mutex_unlock(&last_counted_lock);
}

bool kiwi_vmm_movable(void)
{
    bool movable = false;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (struct vmm_region *r = kiwi_vmm_first_region; r && !movable; r = r->next)
        for (int i = 0; !r->pinned && i < r->chunk_count && !movable; i++)
            movable = r->chunks[i].resident;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return movable;
}

bool kiwi_vmm_away(void)
{
    return !atomic_load(&kiwi_vmm_all_backed);
}
