/* What each line from the daemon does to the hold: grants open the gate (after restoring the
 * working set), drops leave the GPU to be given back, pauses close the gate while another
 * holder has its turn and resumes open it again; the rest is counted and kept for the stats.
 * kiwi_dispatch_line decides; kiwi_comm_handle_line, the comm thread's, then carries out what
 * a drop leaves to do (the release sequence, release.c), or an `evict` (the way out, then
 * `evicted`: the memory feature, residency.c). The conformance entry points
 * (tests/protocol/conformance.c) call kiwi_dispatch_line alone.
 */
#define _GNU_SOURCE
#include <string.h>

#include "client.h"

#define RETRY_FIRST 0.5
#define RETRY_MOST 8.0

/* The restore could not be made (no room on the card: another process took it) and was rolled
 * back: the grant goes back to the daemon, and the calls at the gate ask again after a while,
 * longer each time it fails. */
static void give_grant_back(const char *why)
{
    pthread_mutex_lock(&kiwi_lock);
    kiwi_comm.stats.restore_failures++;
    double backoff = kiwi_comm.retry_backoff > 0 ? kiwi_comm.retry_backoff : RETRY_FIRST;
    kiwi_comm.retry_after = kiwi_now() + backoff;
    kiwi_comm.retry_backoff = backoff * 2 < RETRY_MOST ? backoff * 2 : RETRY_MOST;
    if (kiwi_hold_move(KIWI_HOLD_IDLE))
        kiwi_comm.stats.queue_position = 0;
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_warn("giving the GPU back (%s); asking again in %.1f s", why, backoff);
    kiwi_room_restore_failed();
    kiwi_residency_evicted(NULL, why); /* with the memory feature: the daemon hears why */
    kiwi_release_seq = kiwi_session_request(KIWI_OP_RELEASE, "");
}

/* An `evict` read, for kiwi_comm_handle_line to carry out. */
static bool evict_asked;

/* The daemon asks an idle process to move its memory to host memory now (the memory feature):
 * it evicts, reports as it goes, and answers `evicted` (carried out after the line is read). A
 * holder never gets this (it gets a drop); should one come, it says it cannot. */
static void on_evict(void)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = kiwi_comm.stats.hold;
    bool holding = hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING ||
                   hold == KIWI_HOLD_RELEASING;
    pthread_mutex_unlock(&kiwi_lock);
    if (holding)
        kiwi_residency_evicted(NULL, "holding the GPU: a drop moves its memory");
    else if (kiwi_pager_evictor()->moved_from_outside)
        kiwi_residency_evicted(NULL, "the checkpoint evictor: the daemon moves this process");
    else
        evict_asked = true;
}

/* A grant that answers what we asked (in DROPPING, it withdraws the drop: mode off), not one
 * that crossed our release or cancel. */
static bool grant_expected(void)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = kiwi_comm.stats.hold;
    pthread_mutex_unlock(&kiwi_lock);
    return hold == KIWI_HOLD_ASKING || hold == KIWI_HOLD_WAITING || hold == KIWI_HOLD_DROPPING;
}

static void on_grant(const char *line)
{
    double arrived = kiwi_now();
    if (!grant_expected())
        return; /* it crossed our release or cancel: the release ended it */
    /* A way out still under way ends first (the daemon restored a process it checkpointed
     * before this grant, so it does end), and the daemon hears its `evicted` before the
     * restore's report. */
    kiwi_way_out_join();
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
    bool report = kiwi_session_memory() && (kiwi_comm.stats.evicted || kiwi_pager_away());
    pthread_mutex_unlock(&kiwi_lock);
    struct kiwi_transfer moved = {0};
    if (restore)
        kiwi_pager_move(KIWI_PAGE_IN, &moved);
    if (moved.failed) {
        give_grant_back(moved.failed);
        return;
    }
    kiwi_free_ranges_forget(); /* the gate opens: what the cache held free may be used now */
    pthread_mutex_lock(&kiwi_lock);
    kiwi_comm.stats.evicted = false; /* restored, or left to fault back in (KIWI_RESTORE=fault) */
    if (restore) {
        kiwi_comm.stats.restores++;
        kiwi_comm.stats.bytes_restored += moved.bytes;
        kiwi_comm.stats.seconds_restoring += moved.seconds;
    }
    if (report)
        kiwi_news_set(KIWI_NEWS_WORKING_SET); /* where the memory is now: back (residency.c) */
    if (!kiwi_hold_move(KIWI_HOLD_HOLDING)) {
        pthread_mutex_unlock(&kiwi_lock);
        return;
    }
    kiwi_comm.stats.paused = false;
    kiwi_comm.retry_backoff = 0;
    kiwi_room_granted();
    kiwi_comm.stats.grants++;
    kiwi_comm.stats.last_grant_at = arrived;
    kiwi_comm.stats.queue_position = 0;
    kiwi_comm.granted_at = kiwi_now();
    kiwi_comm.acquire_wanted = false;
    kiwi_json_number(line, "quantum", &kiwi_comm.stats.quantum);
    kiwi_gate_open();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

/* A turn of the holders side by side (mode auto, the daemon's interactive.turns). Pausing only
 * closes the gate: calls already inside finish queueing their work, which the GPU runs out
 * while the next holder starts; new ones wait at the gate, and ask for nothing, since the GPU
 * is still this process's. The memory stays where it is. */
static void on_turn(bool pause)
{
    pthread_mutex_lock(&kiwi_lock);
    if (kiwi_comm.stats.hold == KIWI_HOLD_HOLDING && kiwi_comm.stats.paused != pause) {
        kiwi_comm.stats.paused = pause;
        if (pause) {
            kiwi_comm.stats.pauses++;
            kiwi_gate_close();
        } else {
            kiwi_gate_open();
        }
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_dispatch_line(const char *line)
{
    char op[32] = "";
    kiwi_json_string(line, "op", op, sizeof op);
    kiwi_log("<- %s", line);
    double seq = -1;
    kiwi_json_number(line, "seq", &seq);
    enum kiwi_handshake handshake = kiwi_session_handshake(op, seq, line);
    if (handshake == KIWI_HANDSHAKE_REGISTERED)
        kiwi_ask_if_wanted(); /* what was wanted while away is asked now */
    else if (handshake == KIWI_HANDSHAKE_REFUSED)
        kiwi_link_close("registration refused");
    if (handshake != KIWI_HANDSHAKE_NONE)
        return;
    /* A request whose answer this is: the rest of the line is read below, as an event is. */
    bool cancelled = kiwi_ask_cancel_answered(seq);
    bool answers_ask = kiwi_ask_answered(op, seq);
    if (kiwi_yield_seq && seq == (double)kiwi_yield_seq) {
        kiwi_release_on_yield_answer(op, line);
    } else if (strcmp(op, "grant") == 0) {
        on_grant(line);
    } else if (strcmp(op, KIWI_OP_EVICT) == 0) {
        on_evict();
    } else if (strcmp(op, "pause") == 0 || strcmp(op, "resume") == 0) {
        on_turn(op[0] == 'p');
    } else if (strcmp(op, "waiting") == 0) {
        double position = 0;
        kiwi_json_number(line, "position", &position);
        pthread_mutex_lock(&kiwi_lock);
        if (answers_ask && kiwi_comm.stats.hold == KIWI_HOLD_ASKING)
            kiwi_hold_move(KIWI_HOLD_WAITING);
        /* An event may cross a release of the wait: a process not waiting has no place. */
        if (kiwi_comm.stats.hold == KIWI_HOLD_WAITING)
            kiwi_comm.stats.queue_position = (int)position;
        pthread_mutex_unlock(&kiwi_lock);
    } else if (strcmp(op, "drop") == 0) {
        /* Read while not holding, it crossed our release, and changes nothing. */
        pthread_mutex_lock(&kiwi_lock);
        bool dropped = kiwi_comm.stats.hold == KIWI_HOLD_HOLDING &&
                       kiwi_hold_move(KIWI_HOLD_DROPPING);
        if (dropped)
            kiwi_comm.stats.drops++;
        pthread_mutex_unlock(&kiwi_lock);
        if (dropped)
            kiwi_release_dropped(kiwi_json_true(line, "evict"), false);
    } else if (strcmp(op, "revoked") == 0) {
        /* Usually read after our own late release (the drain outlasted the grace period), so
         * the hold may already be idle; it is counted either way, because the next holder
         * may have started while this process still had work running. */
        pthread_mutex_lock(&kiwi_lock);
        kiwi_comm.stats.revokes++;
        enum kiwi_hold_state hold = kiwi_comm.stats.hold;
        if ((hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING) &&
            kiwi_hold_move(KIWI_HOLD_IDLE)) {
            kiwi_comm.stats.paused = false;
            kiwi_gate_close();
        }
        pthread_cond_broadcast(&kiwi_changed);
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_warn("the scheduler took the GPU back: the release came after the grace period");
    } else if (strcmp(op, "released") == 0) {
        pthread_mutex_lock(&kiwi_lock);
        bool evict = seq == (double)kiwi_release_seq && kiwi_json_true(line, "evict") &&
                     !kiwi_comm.stats.evicted && kiwi_comm.stats.hold != KIWI_HOLD_HOLDING &&
                     kiwi_comm.stats.hold != KIWI_HOLD_DROPPING;
        if (evict && kiwi_pager_evictor()->moved_from_outside) {
            kiwi_comm.stats.evicted = true; /* the daemon is checkpointing this process */
            kiwi_comm.stats.evictions++;
            evict = false;
        }
        pthread_mutex_unlock(&kiwi_lock);
        if (evict)
            kiwi_release_evict_now();
    } else if (strcmp(op, "mode") == 0) {
        pthread_mutex_lock(&kiwi_lock);
        kiwi_json_string(line, "mode", kiwi_comm.stats.mode, sizeof kiwi_comm.stats.mode);
        pthread_mutex_unlock(&kiwi_lock);
    } else if (strcmp(op, "error") == 0) {
        char code[32] = "";
        kiwi_json_string(line, "code", code, sizeof code);
        if (strcmp(code, KIWI_E_ROOM) == 0) {
            kiwi_room_on_refused(line); /* the connection is as good as ever: room.c */
        } else {
            kiwi_warn("the scheduler refused a request: %s", line);
            if (strcmp(code, KIWI_E_PERMISSION) != 0 && strcmp(code, KIWI_E_INVALID) != 0 &&
                strcmp(code, KIWI_E_STATE) != 0)
                kiwi_link_close(code);
        }
    }
    if (cancelled)
        kiwi_ask_if_wanted(); /* asked again while the cancel was on its way */
}

void kiwi_comm_handle_line(const char *line)
{
    kiwi_dispatch_line(line);
    kiwi_release_carry_out();
    if (evict_asked) {
        evict_asked = false;
        kiwi_release_evict_now();
    }
}
