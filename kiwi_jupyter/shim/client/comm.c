/* The daemon client: one thread of the shim's own, speaking docs/protocol.md.
 *
 * It has to be a thread of its own, and must never need Python: the thread that waits at the
 * gate may be a notebook cell's, holding the GIL, and the grant that opens the gate has to
 * arrive anyway. Everything that changes the hold happens here, in order, and only through
 * kiwi_hold_move (hold.c): asking for the GPU when a gated call waits, opening the gate on a
 * grant (after restoring the working set), and the release sequence on a drop, at a cell's end
 * or after an idle spell. Other threads only set wishes under kiwi_lock, or post news
 * (mechanisms/news.c), and wake this one through a pipe.
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

struct kiwi_comm_state kiwi_comm;
int kiwi_wake_pipe[2] = {-1, -1};

/* ---- connecting ---------------------------------------------------------------------- */

/* Opens the socket and lets the session say hello and register (with the working set so
 * far), reading what the daemon answers; an event it sends meanwhile is read as ever. Each
 * answer has 5 seconds to come. */
static bool connect_and_register(void)
{
    if (!kiwi_link_open())
        return false;
    kiwi_session_connect();
    bool welcomed = false;
    double deadline = kiwi_now() + 5.0;
    char line[1024];
    while (kiwi_link_up() && !kiwi_session_ready()) {
        if (kiwi_link_next_line(line, sizeof line)) {
            kiwi_comm_handle_line(line);
            if (!welcomed && kiwi_session_welcomed()) {
                welcomed = true;
                deadline = kiwi_now() + 5.0;
            }
            continue;
        }
        double left = deadline - kiwi_now();
        if (left <= 0) {
            if (welcomed)
                kiwi_warn("the daemon did not register this process: no answer");
            kiwi_link_close(welcomed ? "registration refused" : "no welcome from the daemon");
            return false;
        }
        kiwi_link_fill(left);
    }
    return kiwi_session_ready();
}

/* Under kiwi_lock: since when the GPU has gone unused, for the idle release (a grant counts
 * as a use). */
static double idle_since(void)
{
    double since = kiwi_gate_last_activity();
    return since < kiwi_comm.granted_at ? kiwi_comm.granted_at : since;
}

/* A working set report held back by the rate limit: the seconds until it may go. */
static double report_wait;

/* Sends the working set report the news asks for, unless the rate limit holds it back. */
static void report_news(void)
{
    if (kiwi_link_up() && kiwi_news_take(KIWI_NEWS_WORKING_SET))
        report_wait = kiwi_residency_report();
}

/* Acts on what other threads asked for since the last turn of the loop. */
static void act(void)
{
    kiwi_way_out_act();
    kiwi_release_act_deferred();
    /* Allocations that wait for room: the daemon makes the room a grant needs for the working
     * set it has heard, so the report goes before the ask (room.c asks, or requeues); one the
     * rate limit holds back holds the ask back with it. */
    bool room = kiwi_room_wanted();
    if (room)
        report_news();
    bool ask_now = !room || report_wait <= 0;
    if (room && ask_now)
        kiwi_room_requeue();
    pthread_mutex_lock(&kiwi_lock);
    if (kiwi_comm.release_asked != kiwi_comm.release_done) {
        unsigned asked = kiwi_comm.release_asked;
        bool holding = kiwi_comm.stats.hold == KIWI_HOLD_HOLDING;
        pthread_mutex_unlock(&kiwi_lock);
        if (holding)
            kiwi_release_yield("cell end");
        else
            kiwi_ask_cancel(); /* a request out is taken back (asking.c) */
        pthread_mutex_lock(&kiwi_lock);
        kiwi_comm.release_done = asked;
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (ask_now)
        kiwi_ask_if_wanted();
    pthread_mutex_lock(&kiwi_lock);
    bool want = kiwi_gate_waiters() > 0 || kiwi_room_waiters() > 0 || kiwi_comm.acquire_wanted;
    double since = idle_since();
    bool idle = kiwi_comm.stats.hold == KIWI_HOLD_HOLDING && !kiwi_comm.stats.in_cell &&
                kiwi_cfg.idle_release > 0 && !want && kiwi_gate_in_flight() == 0 &&
                kiwi_capture_open() == 0 && kiwi_now() - since >= kiwi_cfg.idle_release;
    pthread_mutex_unlock(&kiwi_lock);
    if (idle)
        kiwi_release_yield("idle");
    kiwi_room_act();
    report_news();
}

/* Sleeps until woken, the socket has data, or timeout seconds pass. */
static void wait_for_news(double timeout)
{
    struct pollfd p[2] = {{.fd = kiwi_wake_pipe[0], .events = POLLIN},
                          {.fd = kiwi_link_fd(), .events = POLLIN}};
    int ms = timeout > 3600 ? 3600000 : (int)(timeout * 1000) + 1;
    if (poll(p, kiwi_link_up() ? 2 : 1, ms) <= 0)
        return;
    if (p[0].revents) {
        char drained[64];
        while (read(kiwi_wake_pipe[0], drained, sizeof drained) > 0)
            ;
        /* Perhaps an interrupt (interrupt.c): waiters look at the count when woken. */
        pthread_mutex_lock(&kiwi_lock);
        pthread_cond_broadcast(&kiwi_changed);
        pthread_mutex_unlock(&kiwi_lock);
    }
    if (kiwi_link_up() && p[1].revents && kiwi_link_fill(0)) {
        char line[1024];
        while (kiwi_link_up() && kiwi_link_next_line(line, sizeof line))
            kiwi_comm_handle_line(line);
    }
}

static double next_idle_check(void)
{
    if (report_wait > 0) {
        double wait = report_wait;
        report_wait = 0;
        return wait; /* the working set report the rate limit held back */
    }
    pthread_mutex_lock(&kiwi_lock);
    double retry = kiwi_comm.retry_after - kiwi_now();
    pthread_mutex_unlock(&kiwi_lock);
    if (retry > 0 && retry < 1.0)
        return retry + 0.001; /* the acquire a failed restore put off */
    if (kiwi_cfg.idle_release <= 0)
        return 1.0;
    pthread_mutex_lock(&kiwi_lock);
    double since = idle_since();
    bool holding = kiwi_comm.stats.hold == KIWI_HOLD_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    double left = since + kiwi_cfg.idle_release - kiwi_now();
    if (!holding || left > 1.0)
        return 1.0;
    return left > 0.001 ? left : 0.001;
}

void *kiwi_comm_main(void *unused)
{
    (void)unused;
    kiwi_news_client_thread();
    kiwi_session_send_to(kiwi_link_send);
    double backoff = 0.05;
    for (;;) {
        if (!kiwi_link_up()) {
            if (connect_and_register()) {
                backoff = 0.05;
            } else {
                double policy_left = kiwi_outage_act();
                wait_for_news(backoff < policy_left ? backoff : policy_left);
                backoff = backoff * 2 < 2.0 ? backoff * 2 : 2.0;
                continue;
            }
        }
        act();
        if (kiwi_link_up())
            wait_for_news(next_idle_check());
    }
    return NULL;
}
