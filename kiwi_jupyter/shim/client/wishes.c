/* What the other threads ask of the comm thread through api.c: a cell's begin and end, an
 * eager acquire, the fail policy, the statistics. They only set wishes in the process's client
 * (kiwi_client_of_process) under kiwi_lock, and wake the comm thread through its pipe (news.c);
 * it acts on them in order. This is the only way from other threads into the client. (The
 * gate's waiters and the allocations' working set reach it as news from the mechanisms.)
 */
#define _GNU_SOURCE
#include <time.h>

#include "client.h"

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec = (long)((whole - (double)(time_t)whole) * 1e9);
}

void kiwi_comm_cell_begin(void)
{
    struct kiwi_client *c = kiwi_client_of_process();
    pthread_mutex_lock(&kiwi_lock);
    c->stats.in_cell = true;
    c->ask_refused = false; /* a refused acquire is asked again for a new cell */
    /* A checkpointed process's driver calls block until it is restored, and not all of them
     * pass the gate (queries, module loads): a cell asks for the GPU at once instead. So does
     * a cell of a process whose vmm memory is away or on its way out: its restore starts at
     * once, and the daemon may have checkpointed such a process too (one idle past
     * checkpoint_after, or one that did not begin its way out in time). Read without the vmm
     * evictor's lock, which a way out holds for as long as it runs. */
    bool away = c->stats.evicted &&
                kiwi_pager_evictor()->cell_asks_when_evicted;
    if ((away || c->moving_out) && c->stats.hold == KIWI_HOLD_IDLE) {
        c->acquire_wanted = true;
        kiwi_news_wake();
    }
    pthread_mutex_unlock(&kiwi_lock);
}

int kiwi_comm_acquire(double timeout)
{
    struct kiwi_client *c = kiwi_client_of_process();
    if (!kiwi_cfg.enabled)
        return 0;
    kiwi_comm_start();
    kiwi_pager_note_context(NULL);
    double deadline = timeout > 0 ? kiwi_now() + timeout : 0;
    unsigned interrupts = kiwi_interrupts();
    int result = 0;
    pthread_mutex_lock(&kiwi_lock);
    unsigned gave_up = kiwi_gate_give_ups();
    c->acquire_wanted = true;
    c->ask_refused = false;
    kiwi_news_wake();
    while (c->stats.hold != KIWI_HOLD_HOLDING && !c->stats.failed_open) {
        if (kiwi_gate_refusing()) {
            result = -1;
            break;
        }
        if (kiwi_interrupts() != interrupts) {
            result = 2;
            break;
        }
        if (kiwi_gate_give_ups() != gave_up) {
            result = 3; /* refused room past KIWI_ROOM_TIMEOUT: room.c said why */
            break;
        }
        double left = deadline ? deadline - kiwi_now() : 0.5;
        if (left <= 0) {
            result = 1;
            break;
        }
        struct timespec until;
        deadline_after(&until, left < 0.5 ? left : 0.5);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &until);
    }
    pthread_mutex_unlock(&kiwi_lock);
    return result;
}

int kiwi_comm_release(void)
{
    struct kiwi_client *c = kiwi_client_of_process();
    pthread_mutex_lock(&kiwi_lock);
    c->stats.in_cell = false;
    c->acquire_wanted = false;
    c->ask_refused = false;
    kiwi_room_cell_end(c);
    if (!kiwi_comm_started()) {
        pthread_mutex_unlock(&kiwi_lock);
        return 0;
    }
    unsigned asked = ++c->release_asked;
    kiwi_news_wake();
    while ((int)(c->release_done - asked) < 0) {
        struct timespec until;
        deadline_after(&until, 0.5);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &until);
    }
    pthread_mutex_unlock(&kiwi_lock);
    return 0;
}

void kiwi_comm_stats(struct kiwi_stats *out)
{
    struct kiwi_client *c = kiwi_client_of_process();
    pthread_mutex_lock(&kiwi_lock);
    *out = c->stats;
    out->failed_closed = kiwi_gate_refusing();
    out->seconds_waiting = kiwi_gate_seconds_waiting();
    kiwi_room_stats(c, out);
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_comm_set_policy(bool fail_closed, double timeout)
{
    struct kiwi_client *c = kiwi_client_of_process();
    pthread_mutex_lock(&kiwi_lock);
    c->policy_set = true;
    c->policy_closed = fail_closed;
    c->policy_timeout = timeout > 0 ? timeout : 0;
    /* A policy change during an outage applies at the next turn of the comm thread. */
    if (c->stats.failed_open && fail_closed) {
        c->stats.failed_open = false;
        kiwi_gate_close();
    } else if (kiwi_gate_refusing() && !fail_closed) {
        kiwi_gate_refuse(false);
    }
    kiwi_news_wake();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}
