/* What each line from the daemon does to the hold: grants open the gate (after restoring the
 * working set), drops leave the GPU to be given back, pauses close the gate while another
 * holder has its turn and resumes open it again; the rest is counted and kept for the stats.
 * kiwi_dispatch_line reads the line once into a struct kiwi_message (decode.c, generated from
 * the protocol's table) and decides by its op; kiwi_comm_handle_line, the comm thread's, then
 * carries out what a drop leaves to do (the release sequence, release.c), or an `evict` (the
 * way out, then `evicted`: the memory feature, residency.c). The conformance entry points
 * (tests/protocol/conformance.c) call kiwi_dispatch_line alone.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "client.h"

#define RETRY_FIRST 0.5
#define RETRY_MOST 8.0

/* The restore could not be made (no room on the card: another process took it) and was rolled
 * back: the grant goes back to the daemon, and the calls at the gate ask again after a while,
 * longer each time it fails. */
static void give_grant_back(struct kiwi_client *c, const char *why)
{
    pthread_mutex_lock(&kiwi_lock);
    c->stats.restore_failures++;
    double backoff = c->retry_backoff > 0 ? c->retry_backoff : RETRY_FIRST;
    c->retry_after = kiwi_now() + backoff;
    c->retry_backoff = backoff * 2 < RETRY_MOST ? backoff * 2 : RETRY_MOST;
    if (kiwi_hold_move(c, KIWI_HOLD_IDLE))
        c->stats.queue_position = 0;
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_warn("giving the GPU back (%s); asking again in %.1f s", why, backoff);
    kiwi_room_restore_failed(c);
    kiwi_residency_evicted(c, NULL, why); /* with the memory feature: the daemon hears why */
    c->seq.release = kiwi_session_request(c, KIWI_OP_RELEASE, "");
}

/* The daemon asks an idle process to move its memory to host memory now (the memory feature):
 * it evicts, reports as it goes, and answers `evicted` (carried out after the line is read). A
 * holder never gets this (it gets a drop); should one come, it says it cannot. */
static void on_evict(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    bool holding = hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING ||
                   hold == KIWI_HOLD_RELEASING;
    pthread_mutex_unlock(&kiwi_lock);
    if (holding)
        kiwi_residency_evicted(c, NULL, "holding the GPU: a drop moves its memory");
    else if (kiwi_pager_evictor()->moved_from_outside)
        kiwi_residency_evicted(c, NULL, "the checkpoint evictor: the daemon moves this process");
    else
        c->evict_asked = true;
}

/* A grant that answers what we asked (in DROPPING, it withdraws the drop: mode off), not one
 * that crossed our release or cancel. */
static bool grant_expected(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    pthread_mutex_unlock(&kiwi_lock);
    return hold == KIWI_HOLD_ASKING || hold == KIWI_HOLD_WAITING || hold == KIWI_HOLD_DROPPING;
}

static void on_grant(struct kiwi_client *c, const struct kiwi_message *grant)
{
    double arrived = kiwi_now();
    if (!grant_expected(c))
        return; /* it crossed our release or cancel: the release ended it */
    /* A way out still under way ends first (the daemon restored a process it checkpointed
     * before this grant, so it does end), and the daemon hears its `evicted` before the
     * restore's report. */
    kiwi_way_out_join(c);
    kiwi_tiers_join(c); /* a spill or fetch under way ends first; the restore brings the rest */
    /* Restored on every grant, not only after an eviction of ours: while other processes held
     * the GPU the driver may have pushed pages out on its own, to make room for theirs. */
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    pthread_mutex_lock(&kiwi_lock);
    /* A checkpointed process was restored by the daemon before this grant was sent. Memory the
     * vmm evictor moved out is not even mapped: it comes back whatever KIWI_RESTORE says. */
    bool restore = !kiwi_pager_evictor()->moved_from_outside &&
                   (kiwi_pager_away() || (ws.evictable && !kiwi_cfg.restore_by_fault));
    /* To a daemon that hears where memory is, a report after the restore ends it. */
    bool report = kiwi_session_memory(c) && (c->stats.evicted || kiwi_pager_away());
    pthread_mutex_unlock(&kiwi_lock);
    struct kiwi_transfer moved = {0};
    if (restore)
        kiwi_pager_move(KIWI_PAGE_IN, &moved);
    if (moved.failed) {
        give_grant_back(c, moved.failed);
        return;
    }
    kiwi_free_ranges_forget(); /* the gate opens: what the cache held free may be used now */
    pthread_mutex_lock(&kiwi_lock);
    c->stats.evicted = false; /* restored, or left to fault back in (KIWI_RESTORE=fault) */
    if (restore) {
        c->stats.restores++;
        c->stats.bytes_restored += moved.bytes;
        c->stats.seconds_restoring += moved.seconds;
    }
    if (report)
        kiwi_news_set(KIWI_NEWS_WORKING_SET); /* where the memory is now: back (residency.c) */
    if (!kiwi_hold_move(c, KIWI_HOLD_HOLDING)) {
        pthread_mutex_unlock(&kiwi_lock);
        return;
    }
    c->stats.paused = false;
    c->retry_backoff = 0;
    kiwi_room_granted(c);
    c->stats.grants++;
    c->stats.last_grant_at = arrived;
    c->stats.queue_position = 0;
    c->granted_at = kiwi_now();
    c->acquire_wanted = false;
    if (grant->has & KIWI_HAS_QUANTUM)
        c->stats.quantum = grant->grant.quantum;
    kiwi_gate_open();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

/* A turn of the holders side by side (mode auto, the daemon's interactive.turns). Pausing only
 * closes the gate: calls already inside finish queueing their work, which the GPU runs out
 * while the next holder starts; new ones wait at the gate, and ask for nothing, since the GPU
 * is still this process's. The memory stays where it is. */
static void on_turn(struct kiwi_client *c, bool pause)
{
    pthread_mutex_lock(&kiwi_lock);
    if (c->stats.hold == KIWI_HOLD_HOLDING && c->stats.paused != pause) {
        c->stats.paused = pause;
        if (pause) {
            c->stats.pauses++;
            kiwi_gate_close();
        } else {
            kiwi_gate_open();
        }
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
}

/* A queue position as the stats keep it: 0 when none. */
static int position_of(const struct kiwi_message *waiting)
{
    int64_t position = waiting->has & KIWI_HAS_POSITION ? waiting->waiting.position : 0;
    return position < 0 ? 0 : position > INT_MAX ? INT_MAX : (int)position;
}

static void dispatch(struct kiwi_client *c, const struct kiwi_message *msg)
{
    enum kiwi_handshake handshake = kiwi_session_handshake(c, msg);
    if (handshake == KIWI_HANDSHAKE_REGISTERED)
        kiwi_ask_if_wanted(c); /* what was wanted while away is asked now */
    else if (handshake == KIWI_HANDSHAKE_REFUSED)
        kiwi_link_close(c, "registration refused");
    if (handshake != KIWI_HANDSHAKE_NONE)
        return;
    /* A request whose answer this is: the rest of the message is read below, as an event is. */
    int64_t seq = msg->seq;
    bool cancelled = kiwi_ask_cancel_answered(c, seq);
    bool answers_ask = kiwi_ask_answered(c, msg->op, seq);
    if (c->seq.yield && seq == (int64_t)c->seq.yield) {
        kiwi_release_on_yield_answer(c, msg);
    } else if (msg->op == KIWI_DAEMON_GRANT) {
        on_grant(c, msg);
    } else if (msg->op == KIWI_DAEMON_EVICT) {
        on_evict(c);
    } else if (msg->op == KIWI_DAEMON_SPILL || msg->op == KIWI_DAEMON_FETCH ||
               msg->op == KIWI_DAEMON_PIN_BUDGET) {
        kiwi_tiers_on_event(c, msg);
    } else if (msg->op == KIWI_DAEMON_PAUSE || msg->op == KIWI_DAEMON_RESUME) {
        on_turn(c, msg->op == KIWI_DAEMON_PAUSE);
    } else if (msg->op == KIWI_DAEMON_WAITING) {
        pthread_mutex_lock(&kiwi_lock);
        if (answers_ask && c->stats.hold == KIWI_HOLD_ASKING)
            kiwi_hold_move(c, KIWI_HOLD_WAITING);
        /* An event may cross a release of the wait: a process not waiting has no place. */
        if (c->stats.hold == KIWI_HOLD_WAITING)
            c->stats.queue_position = position_of(msg);
        pthread_mutex_unlock(&kiwi_lock);
    } else if (msg->op == KIWI_DAEMON_DROP) {
        /* Read while not holding, it crossed our release, and changes nothing. */
        pthread_mutex_lock(&kiwi_lock);
        bool dropped = c->stats.hold == KIWI_HOLD_HOLDING &&
                       kiwi_hold_move(c, KIWI_HOLD_DROPPING);
        if (dropped)
            c->stats.drops++;
        pthread_mutex_unlock(&kiwi_lock);
        if (dropped)
            kiwi_release_dropped(c, msg->drop.evict, false);
    } else if (msg->op == KIWI_DAEMON_REVOKED) {
        /* Usually read after our own late release (the drain outlasted the grace period), so
         * the hold may already be idle; it is counted either way, because the next holder
         * may have started while this process still had work running. */
        pthread_mutex_lock(&kiwi_lock);
        c->stats.revokes++;
        enum kiwi_hold_state hold = c->stats.hold;
        if ((hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING) &&
            kiwi_hold_move(c, KIWI_HOLD_IDLE)) {
            c->stats.paused = false;
            kiwi_gate_close();
        }
        pthread_cond_broadcast(&kiwi_changed);
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_warn("the scheduler took the GPU back: the release came after the grace period");
    } else if (msg->op == KIWI_DAEMON_RELEASED) {
        pthread_mutex_lock(&kiwi_lock);
        bool evict = seq == (int64_t)c->seq.release && msg->released.evict &&
                     !c->stats.evicted && c->stats.hold != KIWI_HOLD_HOLDING &&
                     c->stats.hold != KIWI_HOLD_DROPPING;
        if (evict && kiwi_pager_evictor()->moved_from_outside) {
            c->stats.evicted = true; /* the daemon is checkpointing this process */
            c->stats.evictions++;
            evict = false;
        }
        pthread_mutex_unlock(&kiwi_lock);
        if (evict)
            kiwi_release_evict_now(c);
    } else if (msg->op == KIWI_DAEMON_MODE) {
        pthread_mutex_lock(&kiwi_lock);
        if (msg->has & KIWI_HAS_MODE)
            snprintf(c->stats.mode, sizeof c->stats.mode, "%s", msg->mode.mode);
        pthread_mutex_unlock(&kiwi_lock);
    } else if (msg->op == KIWI_DAEMON_ERROR) {
        const char *code = msg->error.code;
        if (strcmp(code, KIWI_E_ROOM) == 0) {
            kiwi_room_on_refused(c, msg); /* the connection is as good as ever: room.c */
        } else {
            kiwi_warn("the scheduler refused a request: %s (%s)", msg->error.message, code);
            if (strcmp(code, KIWI_E_PERMISSION) != 0 && strcmp(code, KIWI_E_INVALID) != 0 &&
                strcmp(code, KIWI_E_STATE) != 0)
                kiwi_link_close(c, code[0] ? code : "an error without a code");
        }
    }
    if (cancelled)
        kiwi_ask_if_wanted(c); /* asked again while the cancel was on its way */
}

void kiwi_dispatch_line(struct kiwi_client *c, const char *line)
{
    kiwi_log("<- %s", line);
    struct kiwi_message msg;
    enum kiwi_decoded decoded = kiwi_message_decode(line, &msg);
    if (decoded == KIWI_DECODE_MALFORMED) {
        /* Nothing is lost by leaving it: the daemon never writes one, so it is no answer to
         * anything of ours the way it reads. */
        kiwi_warn("ignoring a line from the scheduler that breaks the protocol: %.200s", line);
        return;
    }
    if (decoded == KIWI_DECODE_UNKNOWN_OP) {
        kiwi_log("ignoring %s, which this version does not know", msg.op_name);
        return;
    }
    dispatch(c, &msg);
}

void kiwi_comm_handle_line(struct kiwi_client *c, const char *line)
{
    kiwi_dispatch_line(c, line);
    kiwi_release_carry_out(c);
    if (c->evict_asked) {
        c->evict_asked = false;
        kiwi_release_evict_now(c);
    }
}
