/* The way out on a thread of its own, once the hold has ended: an `evict` read while idle, or
 * a drop's release sent with `evicting` (the memory feature). The comm thread stays free to
 * read the daemon and to ask for the GPU while the memory leaves the card.
 *
 * A way out takes seconds for a few GiB and minutes for a full card copied to pageable memory.
 * Run on the comm thread, a cell that began meanwhile could not even ask for the GPU; and were
 * the process checkpointed from outside in the middle of it (a daemon that gave up waiting),
 * the move would block inside the driver until the daemon restored the process, which the
 * daemon does before the process's next grant, which only the comm thread can ask for: the
 * kernel hung for good. Here the move may block; the comm thread never waits for it, except
 * on a grant (kiwi_way_out_join), when the daemon has restored the process already.
 *
 * The worker only moves. Its progress (each KIWI_PROGRESS_BYTES the card gets back) and its end
 * are posted here and the comm thread is woken: it sends the reports, counts the move and sends
 * `evicted` (kiwi_way_out_act), so everything that goes on the socket still goes from the comm
 * thread, in order. As it starts, the comm thread reports at once: the daemon hears the way
 * out begin, and its deadline follows the reports from there (docs/policy.md).
 */
#define _GNU_SOURCE
#include "client.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static bool thread_started;
static bool wanted;   /* the comm thread handed a way out over; the worker has not taken it */
static bool running;  /* the worker moves */
static bool finished; /* its end waits for the comm thread */
static struct kiwi_transfer result;
static struct kiwi_residency progress;
static bool progress_new;

/* On the worker, while the move runs (it must not call the pager). */
static void on_progress(const struct kiwi_residency *now, void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    progress = *now;
    progress_new = true;
    pthread_mutex_unlock(&lock);
    kiwi_news_wake();
}

static void *worker(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!wanted)
            pthread_cond_wait(&changed, &lock);
        wanted = false;
        running = true;
        pthread_mutex_unlock(&lock);
        struct kiwi_transfer moved = {.progress = on_progress};
        kiwi_pool_trim(); /* what the pools keep for reuse need not move: it goes back instead */
        kiwi_pager_move(KIWI_PAGE_OUT, &moved);
        pthread_mutex_lock(&lock);
        result = moved;
        running = false;
        finished = true;
        pthread_cond_broadcast(&changed);
        kiwi_news_wake(); /* a byte down a pipe: never waits */
    }
    return NULL;
}

/* Under lock: starts the worker the first time; false when there is no thread for it. */
static bool start_worker(void)
{
    if (!thread_started)
        thread_started = kiwi_thread_start(worker);
    return thread_started;
}

bool kiwi_way_out_busy(void)
{
    pthread_mutex_lock(&lock);
    bool busy = wanted || running || finished;
    pthread_mutex_unlock(&lock);
    return busy;
}

bool kiwi_way_out_start(struct kiwi_client *c)
{
    pthread_mutex_lock(&lock);
    bool started = !(wanted || running || finished) && start_worker();
    if (started) {
        wanted = true;
        progress_new = false;
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    if (!started)
        return false;
    pthread_mutex_lock(&kiwi_lock);
    c->moving_out = true;
    pthread_mutex_unlock(&kiwi_lock);
    struct kiwi_residency now;
    kiwi_pager_residency(&now);
    kiwi_residency_progress(&now, c); /* the way out began: the daemon hears it at once */
    return true;
}

/* The comm thread: what the worker posted, sent and counted. */
static void carry_out(struct kiwi_client *c, bool progressed, const struct kiwi_residency *now,
                      bool ended, const struct kiwi_transfer *moved)
{
    if (progressed && !ended)
        kiwi_residency_progress(now, c);
    if (!ended)
        return;
    pthread_mutex_lock(&kiwi_lock);
    c->moving_out = false;
    c->stats.evicted = true;
    c->stats.evictions++;
    c->stats.bytes_evicted += moved->bytes;
    c->stats.bytes_skipped += moved->skipped;
    c->stats.bytes_discarded += moved->discarded;
    c->stats.seconds_evicting += moved->seconds;
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_residency_evicted(c, moved, NULL);
}

/* Under lock: takes what the worker posted. */
static void take(bool *progressed, struct kiwi_residency *now, bool *ended,
                 struct kiwi_transfer *moved)
{
    *progressed = progress_new;
    *now = progress;
    progress_new = false;
    *ended = finished;
    *moved = result;
    finished = false;
}

void kiwi_way_out_act(struct kiwi_client *c)
{
    bool progressed, ended;
    struct kiwi_residency now;
    struct kiwi_transfer moved;
    pthread_mutex_lock(&lock);
    take(&progressed, &now, &ended, &moved);
    pthread_mutex_unlock(&lock);
    carry_out(c, progressed, &now, ended, &moved);
}

void kiwi_way_out_join(struct kiwi_client *c)
{
    pthread_mutex_lock(&lock);
    while (wanted || running)
        pthread_cond_wait(&changed, &lock);
    bool progressed, ended;
    struct kiwi_residency now;
    struct kiwi_transfer moved;
    take(&progressed, &now, &ended, &moved);
    pthread_mutex_unlock(&lock);
    carry_out(c, progressed, &now, ended, &moved);
}

void kiwi_way_out_after_fork(void)
{
    /* The child has no worker, and none of the parent's memory to move. */
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&changed, NULL);
    thread_started = wanted = running = finished = progress_new = false;
}
