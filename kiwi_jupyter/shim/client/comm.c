/* The daemon client: one thread of the shim's own, speaking docs/protocol.md.
 *
 * It has to be a thread of its own, and must never need Python: the thread that waits at the
 * gate may be a notebook cell's, holding the GIL, and the grant that opens the gate has to
 * arrive anyway. Everything that changes the hold happens here, in order, and only through
 * kiwi_hold_move (hold.c): asking for the GPU when a gated call waits, opening the gate on a
 * grant (after restoring the working set), and the release sequence on a drop, at a cell's end
 * or after an idle spell. It owns the process's client (struct kiwi_client, client.h) and hands
 * it to every function of the tier; other threads only set wishes in it under kiwi_lock
 * (wishes.c), or post news (mechanisms/news.c), and wake this one through a pipe.
 *
 * When the daemon cannot be reached the client keeps retrying, with backoff, and registers
 * again when it is back (client ids do not survive a restart); outage.c says what happens
 * meanwhile.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* ---- connecting ---------------------------------------------------------------------- */

/* Opens the socket and lets the session say hello and register (with the working set so
 * far), reading what the daemon answers; an event it sends meanwhile is read as ever. Each
 * answer has 5 seconds to come. */
static bool connect_and_register(struct kiwi_client *c)
{
    if (!kiwi_link_open(c))
        return false;
    kiwi_session_connect(c);
    bool welcomed = false;
    double deadline = kiwi_now() + 5.0;
    char line[1024];
    while (kiwi_link_up(c) && !kiwi_session_ready(c)) {
        if (kiwi_link_next_line(c, line, sizeof line)) {
            kiwi_comm_handle_line(c, line);
            if (!welcomed && kiwi_session_welcomed(c)) {
                welcomed = true;
                deadline = kiwi_now() + 5.0;
            }
            continue;
        }
        double left = deadline - kiwi_now();
        if (left <= 0) {
            if (welcomed)
                kiwi_warn("the daemon did not register this process: no answer");
            kiwi_link_close(c, welcomed ? "registration refused" : "no welcome from the daemon");
            return false;
        }
        kiwi_link_fill(c, left);
    }
    return kiwi_session_ready(c);
}

/* Under kiwi_lock: since when the GPU has gone unused, for the idle release (a grant counts
 * as a use). */
static double idle_since(struct kiwi_client *c)
{
    double since = kiwi_gate_last_activity();
    return since < c->granted_at ? c->granted_at : since;
}

/* Sends the working set report the news asks for, unless the rate limit holds it back. */
static void report_news(struct kiwi_client *c)
{
    if (kiwi_link_up(c) && kiwi_news_take(KIWI_NEWS_WORKING_SET))
        c->report_wait = kiwi_residency_report(c);
}

/* Acts on what other threads asked for since the last turn of the loop. */
static void act(struct kiwi_client *c)
{
    kiwi_way_out_act(c);
    kiwi_tiers_act(c);
    kiwi_release_act_deferred(c);
    /* Allocations that wait for room: the daemon makes the room a grant needs for the working
     * set it has heard, so the report goes before the ask (room.c asks, or requeues); one the
     * rate limit holds back holds the ask back with it. */
    bool room = kiwi_room_wanted(c);
    if (room)
        report_news(c);
    bool ask_now = !room || c->report_wait <= 0;
    if (room && ask_now)
        kiwi_room_requeue(c);
    pthread_mutex_lock(&kiwi_lock);
    if (c->release_asked != c->release_done) {
        unsigned asked = c->release_asked;
        bool holding = c->stats.hold == KIWI_HOLD_HOLDING;
        pthread_mutex_unlock(&kiwi_lock);
        if (holding)
            kiwi_release_yield(c, "cell end");
        else
            kiwi_ask_cancel(c); /* a request out is taken back (asking.c) */
        pthread_mutex_lock(&kiwi_lock);
        c->release_done = asked;
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (ask_now)
        kiwi_ask_if_wanted(c);
    pthread_mutex_lock(&kiwi_lock);
    bool want = kiwi_gate_waiters() > 0 || kiwi_room_waiters() > 0 || c->acquire_wanted;
    double since = idle_since(c);
    bool idle = c->stats.hold == KIWI_HOLD_HOLDING && !c->stats.in_cell &&
                kiwi_cfg.idle_release > 0 && !want && kiwi_gate_in_flight() == 0 &&
                kiwi_capture_open() == 0 && kiwi_now() - since >= kiwi_cfg.idle_release;
    pthread_mutex_unlock(&kiwi_lock);
    if (idle)
        kiwi_release_yield(c, "idle");
    kiwi_room_act(c);
    report_news(c);
}

/* Sleeps until woken, the socket has data, or timeout seconds pass. */
static void wait_for_news(struct kiwi_client *c, double timeout)
{
    struct pollfd p[2] = {{.fd = c->wake_pipe[0], .events = POLLIN},
                          {.fd = kiwi_link_fd(c), .events = POLLIN}};
    int ms = timeout > 3600 ? 3600000 : (int)(timeout * 1000) + 1;
    if (poll(p, kiwi_link_up(c) ? 2 : 1, ms) <= 0)
        return;
    if (p[0].revents) {
        char drained[64];
        while (read(c->wake_pipe[0], drained, sizeof drained) > 0)
            ;
        /* Perhaps an interrupt (interrupt.c): waiters look at the count when woken. */
        pthread_mutex_lock(&kiwi_lock);
        pthread_cond_broadcast(&kiwi_changed);
        pthread_mutex_unlock(&kiwi_lock);
    }
    if (kiwi_link_up(c) && p[1].revents && kiwi_link_fill(c, 0)) {
        char line[1024];
        while (kiwi_link_up(c) && kiwi_link_next_line(c, line, sizeof line))
            kiwi_comm_handle_line(c, line);
    }
}

static double next_idle_check(struct kiwi_client *c)
{
    if (c->report_wait > 0) {
        double wait = c->report_wait;
        c->report_wait = 0;
        return wait; /* the working set report the rate limit held back */
    }
    pthread_mutex_lock(&kiwi_lock);
    double retry = c->retry_after - kiwi_now();
    pthread_mutex_unlock(&kiwi_lock);
    if (retry > 0 && retry < 1.0)
        return retry + 0.001; /* the acquire a failed restore put off */
    if (kiwi_cfg.idle_release <= 0)
        return 1.0;
    pthread_mutex_lock(&kiwi_lock);
    double since = idle_since(c);
    bool holding = c->stats.hold == KIWI_HOLD_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    double left = since + kiwi_cfg.idle_release - kiwi_now();
    if (!holding || left > 1.0)
        return 1.0;
    return left > 0.001 ? left : 0.001;
}

void *kiwi_comm_main(void *unused)
{
    (void)unused;
    /* From here on the process's client is this thread's: the others only wish (wishes.c). */
    struct kiwi_client *c = kiwi_client_of_process();
    kiwi_news_client_thread();
    kiwi_session_send_to(c, kiwi_link_send);
    double backoff = 0.05;
    for (;;) {
        if (!kiwi_link_up(c)) {
            if (connect_and_register(c)) {
                backoff = 0.05;
            } else {
                double policy_left = kiwi_outage_act(c);
                wait_for_news(c, backoff < policy_left ? backoff : policy_left);
                backoff = backoff * 2 < 2.0 ? backoff * 2 : 2.0;
                continue;
            }
        }
        act(c);
        if (kiwi_link_up(c))
            wait_for_news(c, next_idle_check(c));
    }
    return NULL;
}
