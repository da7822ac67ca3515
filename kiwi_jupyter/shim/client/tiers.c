/* The daemon's word on memory tiers (the hello feature `tiers`, docs/protocol.md): `spill`
 * moves an idle kernel's evicted memory from host memory to spill files; `fetch` brings it a
 * tier closer (tier `host`: from disk to host memory; `gpu`: on to the card, where the daemon
 * says there is room now, without holding the GPU); `pin_budget` changes what the kernel may
 * keep pinned.
 *
 * A spill or a fetch takes seconds for a few GiB, so it runs on a thread of its own, as the way
 * out does (way_out.c), and for the same reasons: the comm thread stays free to read the daemon
 * and to ask for the GPU. Its progress and end are posted here and carried out by the comm
 * thread (kiwi_tiers_act), which sends every line: progress in `working_set`, the end of a move
 * between host and disk in `tier_moved` (with `failed` when it could not be made: the memory
 * stayed where it was), of a fetch to the card in `working_set` with `host` 0. A grant waits
 * for a move under way to end (kiwi_tiers_join); the restore then brings what is left.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static bool thread_started;
static enum kiwi_tier_move wanted, running, finished;
static uint64_t wanted_bytes; /* a spill's: at least this much; 0 all */
static struct kiwi_transfer result;
static struct kiwi_residency progress;
static bool progress_new;

static void on_progress(const struct kiwi_residency *now, void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    progress = *now;
    progress_new = true;
    pthread_mutex_unlock(&lock);
    kiwi_news_wake();
}

/* Under lock: the move under way ended; the comm thread carries it out (kiwi_tiers_act). */
static void post_end(const struct kiwi_transfer *moved)
{
    result = *moved;
    finished = running;
    running = wanted = KIWI_TIER_NONE;
    pthread_cond_broadcast(&changed);
}

static void *worker(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (wanted == KIWI_TIER_NONE)
            pthread_cond_wait(&changed, &lock);
        running = wanted;
        uint64_t bytes = wanted_bytes;
        wanted = KIWI_TIER_NONE;
        pthread_mutex_unlock(&lock);
        struct kiwi_transfer moved = {.progress = on_progress};
        if (running == KIWI_TIER_FETCH_GPU)
            kiwi_pager_move(KIWI_PAGE_IN, &moved);
        else
            kiwi_pager_tier(running == KIWI_TIER_SPILL ? KIWI_PAGE_OUT : KIWI_PAGE_IN, bytes,
                            &moved);
        pthread_mutex_lock(&lock);
        post_end(&moved);
        kiwi_news_wake();
    }
    return NULL;
}

/* Under lock: the worker takes the move wanted; false when there is no thread for it. */
static bool wake_worker(enum kiwi_tier_move move, uint64_t bytes)
{
    (void)move;
    (void)bytes;
    if (!thread_started)
        thread_started = kiwi_thread_start(worker);
    if (thread_started)
        pthread_cond_broadcast(&changed);
    return thread_started;
}

/* The process's: the pager's memory, moved on the worker's thread. */
static const struct kiwi_tier_mover worker_mover = {
    .residency = kiwi_pager_residency,
    .away = kiwi_pager_away,
    .begin = wake_worker,
};

static const struct kiwi_tier_mover *mover(const struct kiwi_client *c)
{
    return c->tier_mover ? c->tier_mover : &worker_mover;
}

static bool busy_locked(void)
{
    return wanted != KIWI_TIER_NONE || running != KIWI_TIER_NONE || finished != KIWI_TIER_NONE;
}

/* Hands a move to the mover; false when one is under way or it cannot begin. */
static bool start(struct kiwi_client *c, enum kiwi_tier_move move, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    bool started = !busy_locked();
    if (started) {
        wanted = move;
        wanted_bytes = bytes;
        progress_new = false;
        started = mover(c)->begin(move, bytes);
        if (!started)
            wanted = KIWI_TIER_NONE;
    }
    pthread_mutex_unlock(&lock);
    return started;
}

static bool busy(void)
{
    pthread_mutex_lock(&lock);
    bool moving = busy_locked();
    pthread_mutex_unlock(&lock);
    return moving;
}

void kiwi_tiers_ended(const struct kiwi_transfer *moved)
{
    pthread_mutex_lock(&lock);
    if (running == KIWI_TIER_NONE)
        running = wanted; /* a mover without a thread of its own never took it */
    if (running != KIWI_TIER_NONE)
        post_end(moved);
    pthread_mutex_unlock(&lock);
}

void kiwi_tiers_set_mover(struct kiwi_client *c, const struct kiwi_tier_mover *to)
{
    pthread_mutex_lock(&lock);
    wanted = running = finished = KIWI_TIER_NONE;
    progress_new = false;
    pthread_mutex_unlock(&lock);
    c->tier_mover = to;
}

/* `tier_moved`: where the evicted memory is now, and what the move did or why it failed. */
static void send_tier_moved(struct kiwi_client *c, const char *tier,
                            const struct kiwi_transfer *moved, const char *failed)
{
    if (!kiwi_session_tiers(c))
        return; /* a daemon without the feature asked for no move, and knows no tier_moved */
    struct kiwi_residency where;
    mover(c)->residency(&where);
    char fields[768];
    snprintf(fields, sizeof fields,
             "\"" KIWI_FIELD_TIER "\":\"%s\",\"" KIWI_FIELD_HOST "\":%llu,\"" KIWI_FIELD_DISK
             "\":%llu,\"" KIWI_FIELD_MOVED "\":%llu,\"" KIWI_FIELD_SECONDS "\":%.6f", tier,
             (unsigned long long)where.host, (unsigned long long)where.disk,
             (unsigned long long)(moved ? moved->bytes : 0), moved ? moved->seconds : 0.0);
    if (failed) {
        size_t n = strlen(fields);
        snprintf(fields + n, sizeof fields - n, ",\"" KIWI_FIELD_FAILED "\":");
        kiwi_json_quote(fields, sizeof fields, failed);
    }
    kiwi_session_request(c, KIWI_OP_TIER_MOVED, fields);
}

/* Why this kernel cannot move its memory between tiers now; NULL when it can. */
static const char *cannot_move(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    bool moving_out = c->moving_out;
    pthread_mutex_unlock(&kiwi_lock);
    if (hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING || hold == KIWI_HOLD_RELEASING)
        return "holding the GPU: its memory is on the card";
    if (moving_out || kiwi_way_out_busy())
        return "its way out is under way";
    if (busy())
        return "a move between tiers is under way";
    return NULL;
}

static void on_spill(struct kiwi_client *c, const struct kiwi_message *msg)
{
    const char *why = cannot_move(c);
    struct kiwi_residency where;
    mover(c)->residency(&where);
    if (!why && !where.host)
        why = "nothing of it is in host memory";
    uint64_t bytes = msg->has & KIWI_HAS_BYTES && msg->spill.bytes > 0 ? (uint64_t)msg->spill.bytes
                                                                        : 0;
    if (!why && !start(c, KIWI_TIER_SPILL, bytes))
        why = "no thread for the spill";
    if (why) {
        send_tier_moved(c, where.disk ? "disk" : "host", NULL, why);
        return;
    }
    /* The spill began: the daemon hears it at the comm thread's next turn, which comes at
     * once (the rate limit of reports aside). */
    kiwi_news_set(KIWI_NEWS_WORKING_SET);
}

/* A hint: where it cannot be taken, the daemon hears why at once (it counts the fetch as under
 * way until a `tier_moved`); the grant's restore brings everything. */
static void on_fetch(struct kiwi_client *c, const struct kiwi_message *msg)
{
    bool to_gpu = strcmp(msg->fetch.tier, "gpu") == 0;
    if (!to_gpu && strcmp(msg->fetch.tier, "host") != 0) {
        kiwi_warn("ignoring a fetch to tier \"%s\", which is neither host nor gpu",
                  msg->fetch.tier);
        return;
    }
    struct kiwi_residency where;
    mover(c)->residency(&where);
    const char *why = cannot_move(c);
    if (why) {
        send_tier_moved(c, where.disk ? "disk" : "host", NULL, why);
        return;
    }
    if (!to_gpu && !where.disk) {
        send_tier_moved(c, "host", NULL, NULL); /* nothing on disk: there already */
        return;
    }
    if (to_gpu && !mover(c)->away()) {
        kiwi_news_set(KIWI_NEWS_WORKING_SET);
        return;
    }
    if (!start(c, to_gpu ? KIWI_TIER_FETCH_GPU : KIWI_TIER_FETCH_HOST, 0))
        send_tier_moved(c, where.disk ? "disk" : "host", NULL, "no thread for the fetch");
}

void kiwi_tiers_on_event(struct kiwi_client *c, const struct kiwi_message *msg)
{
    if (msg->op == KIWI_DAEMON_SPILL) {
        on_spill(c, msg);
    } else if (msg->op == KIWI_DAEMON_FETCH) {
        on_fetch(c, msg);
    } else if (msg->op == KIWI_DAEMON_PIN_BUDGET && msg->pin_budget.pin_budget >= 0) {
        /* The builder unpins or drops, over the budget, shadows of memory on the card only
         * (vmm_builder.c); the report says where things are once it has. */
        kiwi_pager_pin_budget((uint64_t)msg->pin_budget.pin_budget);
        kiwi_news_set(KIWI_NEWS_WORKING_SET);
    }
}

/* The comm thread: what the worker posted, sent and counted. */
static void carry_out(struct kiwi_client *c, bool progressed, const struct kiwi_residency *now,
                      enum kiwi_tier_move ended, const struct kiwi_transfer *moved)
{
    if (progressed && ended == KIWI_TIER_NONE)
        kiwi_residency_progress(now, c);
    if (ended == KIWI_TIER_NONE)
        return;
    if (ended == KIWI_TIER_FETCH_GPU) {
        if (!moved->failed) {
            pthread_mutex_lock(&kiwi_lock);
            c->stats.evicted = false;
            c->stats.restores++;
            c->stats.bytes_restored += moved->bytes;
            c->stats.seconds_restoring += moved->seconds;
            pthread_mutex_unlock(&kiwi_lock);
        } else {
            kiwi_warn("the restore the daemon hinted at could not be made (%s); the grant "
                      "restores", moved->failed);
        }
        struct kiwi_residency where;
        mover(c)->residency(&where);
        kiwi_residency_progress(&where, c); /* `host` 0 ends it */
        return;
    }
    /* where the move went, or where it stayed */
    bool on_disk = (ended == KIWI_TIER_SPILL) != (moved->failed != NULL);
    send_tier_moved(c, on_disk ? "disk" : "host", moved, moved->failed);
}

static void take(bool *progressed, struct kiwi_residency *now, enum kiwi_tier_move *ended,
                 struct kiwi_transfer *moved)
{
    *progressed = progress_new;
    *now = progress;
    progress_new = false;
    *ended = finished;
    *moved = result;
    finished = KIWI_TIER_NONE;
}

void kiwi_tiers_act(struct kiwi_client *c)
{
    bool progressed;
    struct kiwi_residency now;
    enum kiwi_tier_move ended;
    struct kiwi_transfer moved;
    pthread_mutex_lock(&lock);
    take(&progressed, &now, &ended, &moved);
    pthread_mutex_unlock(&lock);
    carry_out(c, progressed, &now, ended, &moved);
}

void kiwi_tiers_join(struct kiwi_client *c)
{
    pthread_mutex_lock(&lock);
    while (wanted != KIWI_TIER_NONE || running != KIWI_TIER_NONE)
        pthread_cond_wait(&changed, &lock);
    bool progressed;
    struct kiwi_residency now;
    enum kiwi_tier_move ended;
    struct kiwi_transfer moved;
    take(&progressed, &now, &ended, &moved);
    pthread_mutex_unlock(&lock);
    carry_out(c, progressed, &now, ended, &moved);
}

void kiwi_tiers_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&changed, NULL);
    thread_started = progress_new = false;
    wanted = running = finished = KIWI_TIER_NONE;
}
