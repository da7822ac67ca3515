/* The daemon client: one thread of the shim's own, speaking docs/protocol.md.
 *
 * It has to be a thread of its own, and must never need Python: the thread that waits at the
 * gate may be a notebook cell's, holding the GIL, and the grant that opens the gate has to
 * arrive anyway. Everything that changes the hold happens here, in order: asking for the GPU
 * when a gated call waits, opening the gate on a grant (after restoring the working set),
 * and the release sequence on a drop, at a cell's end or after an idle spell. Other threads
 * only set wishes under kiwi_lock and wake this one through a pipe.
 *
 * The release sequence, whatever asked for it:
 *   1. close the gate (no new work), and wait for the calls already inside to return;
 *   2. synchronize every context the process used;
 *   3. when the daemon said the next holder needs the room, prefetch the working set to host
 *      memory on the pager's streams, and wait for that;
 *   4. send release.
 * A release the process chose itself (cell end, idle) does not know whether the next holder
 * needs the room, so steps 3 and 4 become a question: it sends `release` with `evict_first`.
 * The daemon either answers `released` (no room needed: the GPU has changed hands, nothing
 * moves) or keeps the hold and answers with a `drop` carrying the request's seq; then the
 * working set goes to host memory and a plain `release` follows, and only that one hands the
 * GPU over. The next holder's restore never races this process's eviction. (A daemon that
 * predates evict_first ignores it and answers `released` with `evict: true`: the eviction then
 * runs right after, as the only thing left to do.)
 *
 * Under the checkpoint evictor (evict.c) the sequence is the same with nothing to move: the
 * daemon locks and checkpoints the process from outside after the release, when the room is
 * needed, and restores it before the next grant. The comm thread then makes no CUDA call of
 * its own on the way out (step 2 included): the process may be locked at any moment from then
 * on (a revocation), and a call made after the lock would block until the next grant, which
 * this very thread must ask for. The lock itself waits for the work still queued.
 *
 * When the daemon cannot be reached the client keeps retrying, with backoff, and registers
 * again when it is back (client ids do not survive a restart). After KIWI_FAIL_TIMEOUT of
 * outage the policy decides: open lets GPU work run ungated, closed makes gated calls fail
 * with CUDA_ERROR_SYSTEM_NOT_READY. The process never exits because of the daemon.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

pthread_mutex_t kiwi_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t kiwi_changed = PTHREAD_COND_INITIALIZER;

/* The hold and the wishes of other threads; all under kiwi_lock. */
static struct {
    struct kiwi_stats stats;
    int waiters;             /* gated calls waiting at the closed gate */
    bool acquire_wanted;     /* kiwi_shim_acquire: eager acquisition */
    unsigned release_asked;  /* generations: kiwi_shim_release waits for done to catch up */
    unsigned release_done;
    double outage_since;
    double granted_at;
    bool policy_set;         /* kiwi_shim_set_policy overrides the environment */
    bool policy_closed;
    double policy_timeout;
} S;

static atomic_bool started;
static atomic_bool working_set_dirty;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static int wake_pipe[2] = {-1, -1};

static unsigned release_seq;
/* The seq of a release sent with evict_first whose answer has not come yet; 0 when none. The
 * hold stays KIWI_RELEASING meanwhile: the gate is closed, and no acquire is sent. */
static unsigned yield_seq;

static void wake(void)
{
    if (wake_pipe[1] >= 0) {
        ssize_t ignored = write(wake_pipe[1], "!", 1);
        (void)ignored; /* a full pipe already means "wake up" */
    }
}

/* ---- the connection's news --------------------------------------------------------- */

void kiwi_comm_link_lost(const char *why)
{
    pthread_mutex_lock(&kiwi_lock);
    bool was_connected = S.stats.connected;
    S.stats.connected = false;
    S.stats.position_live = false;
    S.outage_since = kiwi_now();
    yield_seq = 0;
    if (S.stats.hold != KIWI_IDLE) {
        S.stats.hold = KIWI_IDLE; /* whatever was held went with the connection */
        kiwi_gate_close();
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    if (was_connected)
        kiwi_warn("lost the scheduler at %s (%s); reconnecting", kiwi_cfg.socket_path, why);
}

static bool connect_and_register(void)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    atomic_store(&working_set_dirty, false);
    char line[1024];
    if (!kiwi_link_connect(ws.bytes, line, sizeof line))
        return false;
    if (ws.evictable)
        atomic_store(&working_set_dirty, true); /* register has no field for the evictable part */
    char evictor[16] = "";
    kiwi_json_string(line, "evict", evictor, sizeof evictor);
    kiwi_evict_answered(evictor);
    pthread_mutex_lock(&kiwi_lock);
    kiwi_json_string(line, "client", S.stats.client, sizeof S.stats.client);
    kiwi_json_string(line, "mode", S.stats.mode, sizeof S.stats.mode);
    bool was_failed_open = S.stats.failed_open;
    S.stats.connected = true;
    S.stats.position_live = kiwi_link_position_events();
    S.stats.failed_open = S.stats.failed_closed = false;
    if (was_failed_open)
        kiwi_gate_close(); /* from now on, work waits for a grant again */
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_log("registered as %s with %s", S.stats.client, kiwi_cfg.socket_path);
    return true;
}

/* ---- the hold ------------------------------------------------------------------------- */

static void evict_now(void)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    if (!ws.evictable)
        return;
    kiwi_pool_trim(); /* what the pools keep for reuse need not move: it goes back instead */
    struct kiwi_transfer moved;
    kiwi_pager_evict(&moved);
    pthread_mutex_lock(&kiwi_lock);
    S.stats.evicted = true;
    S.stats.evictions++;
    S.stats.bytes_evicted += moved.bytes;
    S.stats.bytes_skipped += moved.skipped;
    S.stats.bytes_discarded += moved.discarded;
    S.stats.seconds_evicting += moved.seconds;
    pthread_mutex_unlock(&kiwi_lock);
}

/* A release that must wait for graph captures to end (capture.c): a drop, and whether it
 * asked for eviction, or a release of the process's own accord. Done by act() once the last
 * capture has ended. */
static struct {
    bool drop;
    bool evict;
    bool yield;
} deferred;

static void keep_holding(void)
{
    pthread_mutex_lock(&kiwi_lock);
    S.stats.hold = KIWI_HOLDING;
    kiwi_gate_open();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

enum quiesced { QUIESCED, CAPTURING, NOT_SYNCHRONIZED };

/* Steps 1 and 2 of the release sequence: no new work, none in flight, none queued. When it
 * cannot be done now the process still holds the GPU, gate open: a graph capture is open
 * (synchronizing would invalidate it; the caller defers), or synchronizing failed, so work may
 * still be running and the GPU is not released (the daemon revokes it after its grace). */
static enum quiesced quiesce(const char *why, bool evict)
{
    if (kiwi_capture_open() > 0)
        return CAPTURING;
    kiwi_log("releasing the GPU (%s%s)", why, evict ? ", evicting" : "");
    pthread_mutex_lock(&kiwi_lock);
    S.stats.hold = KIWI_RELEASING;
    kiwi_gate_close();
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_gate_drain();
    if (kiwi_evict_checkpointing())
        return QUIESCED; /* no CUDA call of ours: the daemon's lock waits for queued work */
    if (!kiwi_capture_hold()) {
        keep_holding(); /* a capture began while the gate closed */
        return CAPTURING;
    }
    bool synchronized = kiwi_pager_synchronize();
    kiwi_capture_unhold();
    if (!synchronized) {
        kiwi_warn("not releasing the GPU (%s): work may still be running on it", why);
        keep_holding();
        return NOT_SYNCHRONIZED;
    }
    kiwi_memory_free_deferred();
    return QUIESCED;
}

static void defer(const char *why)
{
    kiwi_log("release (%s) deferred: %d graph capture(s) open", why, kiwi_capture_open());
}

/* Steps 3 and 4, once it is known whether the room is needed. */
static void finish_release(bool evict)
{
    if (evict)
        evict_now();
    /* Idle before the release leaves: once the daemon has it, the next holder may be running,
     * and nothing here may still say this process holds the GPU. */
    pthread_mutex_lock(&kiwi_lock);
    S.stats.hold = KIWI_IDLE;
    S.stats.releases++;
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    release_seq = kiwi_link_request("release", "");
}

/* The daemon asked for the GPU back and said whether the next holder needs the room. */
static void release_sequence(bool evict, const char *why)
{
    enum quiesced quiesced = quiesce(why, evict);
    if (quiesced == QUIESCED) {
        finish_release(evict);
    } else if (quiesced == CAPTURING) {
        deferred.drop = true; /* act_deferred looks again, even if the capture is over now */
        deferred.evict = evict;
        defer(why);
    }
}

/* The process gives the GPU back of its own accord (cell end, idle): ask the daemon whether
 * to evict first. The answer finishes the sequence (on_yield_answer). With nothing evictable
 * there is nothing to wait for, and a plain release saves the daemon's round trip. */
static void yield_sequence(const char *why)
{
    enum quiesced quiesced = quiesce(why, false);
    if (quiesced == CAPTURING) {
        deferred.yield = true; /* act_deferred looks again, even if the capture is over now */
        defer(why);
    }
    if (quiesced != QUIESCED)
        return;
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    if (!ws.evictable) {
        finish_release(false);
        return;
    }
    /* The hold stays KIWI_RELEASING, not holding: if the daemon hands over at once, the next
     * holder may be running before the answer is read. */
    yield_seq = kiwi_link_request("release", "\"evict_first\":true");
}

/* The answer to a release sent with evict_first: `released` (handed over; nothing to move)
 * or a `drop` with our seq (the hold is kept until the working set is out). An error that
 * leaves the connection open still must not leave the hold half released: release plainly. */
static void on_yield_answer(const char *op, const char *line)
{
    yield_seq = 0;
    if (strcmp(op, "drop") == 0) {
        finish_release(kiwi_json_true(line, "evict"));
        return;
    }
    if (strcmp(op, "released") != 0) {
        kiwi_warn("the scheduler refused a release: %s", line);
        finish_release(false);
        return;
    }
    pthread_mutex_lock(&kiwi_lock);
    S.stats.hold = KIWI_IDLE;
    S.stats.releases++;
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    if (kiwi_json_true(line, "evict"))
        evict_now(); /* a daemon that does not know evict_first handed over already */
}

static void on_grant(const char *line)
{
    /* Restored on every grant, not only after an eviction of ours: while other processes held
     * the GPU the driver may have pushed pages out on its own, to make room for theirs. */
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    pthread_mutex_lock(&kiwi_lock);
    bool expected = S.stats.hold == KIWI_WAITING;
    /* A checkpointed process was restored by the daemon before this grant was sent. */
    bool restore = ws.evictable && !kiwi_cfg.restore_by_fault && !kiwi_evict_checkpointing();
    pthread_mutex_unlock(&kiwi_lock);
    if (!expected)
        return; /* a grant that crossed our release on the wire: the release ended it */
    struct kiwi_transfer moved = {0};
    if (restore)
        kiwi_pager_restore(&moved);
    kiwi_free_ranges_forget(); /* the gate opens: what the cache held free may be used now */
    pthread_mutex_lock(&kiwi_lock);
    S.stats.evicted = false; /* restored, or left to fault back in (KIWI_RESTORE=fault) */
    if (restore) {
        S.stats.restores++;
        S.stats.bytes_restored += moved.bytes;
        S.stats.seconds_restoring += moved.seconds;
    }
    S.stats.hold = KIWI_HOLDING;
    S.stats.grants++;
    S.stats.queue_position = 0;
    S.granted_at = kiwi_now();
    S.acquire_wanted = false;
    kiwi_json_number(line, "quantum", &S.stats.quantum);
    kiwi_gate_open();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_comm_handle_line(const char *line)
{
    char op[32] = "";
    kiwi_json_string(line, "op", op, sizeof op);
    kiwi_log("<- %s", line);
    double seq = -1;
    kiwi_json_number(line, "seq", &seq);
    if (yield_seq && seq == (double)yield_seq) {
        on_yield_answer(op, line);
    } else if (strcmp(op, "grant") == 0) {
        on_grant(line);
    } else if (strcmp(op, "waiting") == 0) {
        double position = 0;
        kiwi_json_number(line, "position", &position);
        pthread_mutex_lock(&kiwi_lock);
        /* An event may cross a release of the wait: a process not waiting has no place. */
        if (S.stats.hold == KIWI_WAITING)
            S.stats.queue_position = (int)position;
        pthread_mutex_unlock(&kiwi_lock);
    } else if (strcmp(op, "drop") == 0) {
        pthread_mutex_lock(&kiwi_lock);
        bool holding = S.stats.hold == KIWI_HOLDING;
        if (holding)
            S.stats.drops++;
        pthread_mutex_unlock(&kiwi_lock);
        if (holding)
            release_sequence(kiwi_json_true(line, "evict"), "drop");
    } else if (strcmp(op, "revoked") == 0) {
        /* Usually read after our own late release (the drain outlasted the grace period), so
         * the hold may already be idle; it is counted either way, because the next holder
         * may have started while this process still had work running. */
        pthread_mutex_lock(&kiwi_lock);
        S.stats.revokes++;
        if (S.stats.hold == KIWI_HOLDING) {
            S.stats.hold = KIWI_IDLE;
            kiwi_gate_close();
        }
        pthread_cond_broadcast(&kiwi_changed);
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_warn("the scheduler took the GPU back: the release came after the grace period");
    } else if (strcmp(op, "released") == 0) {
        pthread_mutex_lock(&kiwi_lock);
        bool evict = seq == (double)release_seq && kiwi_json_true(line, "evict") &&
                     !S.stats.evicted && S.stats.hold != KIWI_HOLDING;
        if (evict && kiwi_evict_checkpointing()) {
            S.stats.evicted = true; /* the daemon is checkpointing this process */
            S.stats.evictions++;
            evict = false;
        }
        pthread_mutex_unlock(&kiwi_lock);
        if (evict)
            evict_now();
    } else if (strcmp(op, "mode") == 0) {
        pthread_mutex_lock(&kiwi_lock);
        kiwi_json_string(line, "mode", S.stats.mode, sizeof S.stats.mode);
        pthread_mutex_unlock(&kiwi_lock);
    } else if (strcmp(op, "error") == 0) {
        char code[32] = "";
        kiwi_json_string(line, "code", code, sizeof code);
        kiwi_warn("the scheduler refused a request: %s", line);
        if (strcmp(code, "permission") != 0 && strcmp(code, "invalid") != 0 &&
            strcmp(code, "state") != 0)
            kiwi_link_close(code);
    }
}

/* A release deferred for graph captures, once they are over; a drop wins over a release of
 * the process's own accord, as it carries the daemon's word on eviction. */
static void act_deferred(void)
{
    if ((!deferred.drop && !deferred.yield) || kiwi_capture_open() > 0)
        return;
    pthread_mutex_lock(&kiwi_lock);
    bool holding = S.stats.hold == KIWI_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    bool drop = deferred.drop, evict = deferred.evict;
    deferred.drop = deferred.yield = false;
    if (!holding)
        return; /* revoked meanwhile: nothing left to release */
    if (drop)
        release_sequence(evict, "drop, after graph capture");
    else
        yield_sequence("cell end, after graph capture");
}

/* Acts on what other threads asked for since the last turn of the loop. */
static void act(void)
{
    act_deferred();
    pthread_mutex_lock(&kiwi_lock);
    if (S.release_asked != S.release_done) {
        unsigned asked = S.release_asked;
        enum kiwi_hold hold = S.stats.hold;
        if (hold == KIWI_HOLDING) {
            pthread_mutex_unlock(&kiwi_lock);
            yield_sequence("cell end");
            pthread_mutex_lock(&kiwi_lock);
        } else if (hold == KIWI_WAITING) {
            S.stats.hold = KIWI_IDLE;
            S.stats.queue_position = 0;
            pthread_mutex_unlock(&kiwi_lock);
            release_seq = kiwi_link_request("release", "");
            pthread_mutex_lock(&kiwi_lock);
        }
        S.release_done = asked;
        pthread_cond_broadcast(&kiwi_changed);
    }
    bool want = S.waiters > 0 || S.acquire_wanted;
    if (want && S.stats.hold == KIWI_IDLE && kiwi_link_up()) {
        S.stats.hold = KIWI_WAITING;
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_link_request("acquire", "");
        pthread_mutex_lock(&kiwi_lock);
    }
    double idle_since = kiwi_gate_last_activity();
    if (idle_since < S.granted_at)
        idle_since = S.granted_at;
    bool idle = S.stats.hold == KIWI_HOLDING && !S.stats.in_cell && kiwi_cfg.idle_release > 0 &&
                !want && kiwi_gate_in_flight() == 0 && kiwi_capture_open() == 0 &&
                kiwi_now() - idle_since >= kiwi_cfg.idle_release;
    pthread_mutex_unlock(&kiwi_lock);
    if (idle)
        yield_sequence("idle");
    if (kiwi_link_up() && atomic_exchange(&working_set_dirty, false)) {
        struct kiwi_working_set ws;
        kiwi_memory_working_set(&ws);
        char fields[96];
        snprintf(fields, sizeof fields, "\"bytes\":%llu,\"evictable\":%llu",
                 (unsigned long long)ws.bytes, (unsigned long long)ws.evictable);
        kiwi_link_request("working_set", fields);
    }
}

/* While the daemon is away: releases are trivially done, and after the policy's timeout
 * work is let through (open) or refused (closed). Returns how long to sleep at most. */
static double act_offline(void)
{
    pthread_mutex_lock(&kiwi_lock);
    S.release_done = S.release_asked;
    double outage = kiwi_now() - S.outage_since;
    double left = S.policy_timeout - outage;
    if (left <= 0 && !S.stats.failed_open && !S.stats.failed_closed) {
        if (S.policy_closed) {
            S.stats.failed_closed = true;
            kiwi_warn("no scheduler at %s: GPU work is refused until it is back (fail closed)",
                      kiwi_cfg.socket_path);
        } else {
            S.stats.failed_open = true;
            kiwi_gate_open();
            kiwi_warn("no scheduler at %s: GPU work runs unscheduled until it is back "
                      "(fail open)", kiwi_cfg.socket_path);
        }
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    return left > 0 ? left : 1e9;
}

/* Sleeps until woken, the socket has data, or timeout seconds pass. */
static void wait_for_news(double timeout)
{
    struct pollfd p[2] = {{.fd = wake_pipe[0], .events = POLLIN},
                          {.fd = kiwi_link_fd(), .events = POLLIN}};
    int ms = timeout > 3600 ? 3600000 : (int)(timeout * 1000) + 1;
    if (poll(p, kiwi_link_up() ? 2 : 1, ms) <= 0)
        return;
    if (p[0].revents) {
        char drained[64];
        while (read(wake_pipe[0], drained, sizeof drained) > 0)
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
    if (kiwi_cfg.idle_release <= 0)
        return 1.0;
    double since = kiwi_gate_last_activity();
    pthread_mutex_lock(&kiwi_lock);
    if (since < S.granted_at)
        since = S.granted_at;
    bool holding = S.stats.hold == KIWI_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    double left = since + kiwi_cfg.idle_release - kiwi_now();
    if (!holding || left > 1.0)
        return 1.0;
    return left > 0.001 ? left : 0.001;
}

static void *comm_main(void *unused)
{
    (void)unused;
    double backoff = 0.05;
    for (;;) {
        if (!kiwi_link_up()) {
            if (connect_and_register()) {
                backoff = 0.05;
            } else {
                double policy_left = act_offline();
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

/* ---- fork ------------------------------------------------------------------------------ */

static void before_fork(void)
{
    pthread_mutex_lock(&kiwi_lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&kiwi_lock);
}

/* The child has no comm thread and must not write on its parent's connection: it starts
 * afresh, and its first GPU call registers it as a client of its own. */
static void after_fork_child(void)
{
    pthread_mutex_init(&kiwi_lock, NULL);
    pthread_cond_init(&kiwi_changed, NULL);
    pthread_mutex_init(&start_lock, NULL);
    kiwi_link_after_fork();
    yield_seq = 0;
    deferred.drop = deferred.yield = false;
    for (int i = 0; i < 2; i++) {
        if (wake_pipe[i] >= 0)
            close(wake_pipe[i]);
        wake_pipe[i] = -1;
    }
    bool policy_set = S.policy_set, closed = S.policy_closed;
    double timeout = S.policy_timeout;
    memset(&S, 0, sizeof S);
    S.policy_set = policy_set;
    S.policy_closed = closed;
    S.policy_timeout = timeout;
    atomic_store(&started, false);
    atomic_store(&working_set_dirty, false);
    if (!getenv("KIWI_CLIENT_NAME") || !*getenv("KIWI_CLIENT_NAME"))
        snprintf(kiwi_cfg.name, sizeof kiwi_cfg.name, "%s-%d", program_invocation_short_name,
                 (int)getpid());
    kiwi_gate_after_fork();
    kiwi_memory_after_fork();
    kiwi_pager_after_fork();
    kiwi_capture_after_fork();
    kiwi_context_after_fork();
    kiwi_pool_after_fork();
    kiwi_free_ranges_after_fork();
}

static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- for the other files ------------------------------------------------------------- */

bool kiwi_comm_started(void)
{
    return atomic_load(&started);
}

void kiwi_comm_start(void)
{
    if (!kiwi_cfg.enabled || atomic_load(&started))
        return;
    pthread_once(&fork_once, register_fork_handlers);
    pthread_mutex_lock(&start_lock);
    if (!atomic_load(&started) && pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        pthread_mutex_lock(&kiwi_lock);
        S.outage_since = kiwi_now();
        if (!S.policy_set) {
            S.policy_closed = kiwi_cfg.fail_closed;
            S.policy_timeout = kiwi_cfg.fail_timeout;
        }
        pthread_mutex_unlock(&kiwi_lock);
        /* The thread blocks every signal: a notebook's SIGINT belongs to the main thread. */
        sigset_t all, previous;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &previous);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t thread;
        if (pthread_create(&thread, &attr, comm_main, NULL) == 0)
            atomic_store(&started, true);
        else
            kiwi_warn("could not start the scheduler client thread; GPU work runs unscheduled");
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &previous, NULL);
        if (!atomic_load(&started)) {
            pthread_mutex_lock(&kiwi_lock);
            S.stats.failed_open = true;
            kiwi_gate_open();
            pthread_mutex_unlock(&kiwi_lock);
        }
    }
    pthread_mutex_unlock(&start_lock);
}

void kiwi_comm_waiter(int delta)
{
    S.waiters += delta;
    if (delta > 0)
        wake();
}

bool kiwi_comm_refusing(void)
{
    return S.stats.failed_closed;
}

void kiwi_comm_working_set_changed(void)
{
    kiwi_comm_start();
    if (!atomic_exchange(&working_set_dirty, true))
        wake();
}

void kiwi_comm_add_waiting_time(double seconds)
{
    S.stats.seconds_waiting += seconds;
}

void kiwi_comm_wake_from_signal(void)
{
    wake(); /* one write(2); the comm thread broadcasts once it wakes */
}

void kiwi_comm_captures_closed(void)
{
    if (atomic_load(&started))
        wake();
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec = (long)((whole - (double)(time_t)whole) * 1e9);
}

void kiwi_comm_cell_begin(void)
{
    pthread_mutex_lock(&kiwi_lock);
    S.stats.in_cell = true;
    /* A checkpointed process's driver calls block until it is restored, and not all of them
     * pass the gate (queries, module loads): a cell asks for the GPU at once instead. */
    if (S.stats.evicted && kiwi_evict_checkpointing() && S.stats.hold == KIWI_IDLE) {
        S.acquire_wanted = true;
        wake();
    }
    pthread_mutex_unlock(&kiwi_lock);
}

int kiwi_comm_acquire(double timeout)
{
    if (!kiwi_cfg.enabled)
        return 0;
    kiwi_comm_start();
    kiwi_pager_note_context(NULL);
    double deadline = timeout > 0 ? kiwi_now() + timeout : 0;
    unsigned interrupts = kiwi_interrupts();
    int result = 0;
    pthread_mutex_lock(&kiwi_lock);
    S.acquire_wanted = true;
    wake();
    while (S.stats.hold != KIWI_HOLDING && !S.stats.failed_open) {
        if (S.stats.failed_closed) {
            result = -1;
            break;
        }
        if (kiwi_interrupts() != interrupts) {
            result = 2;
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
    pthread_mutex_lock(&kiwi_lock);
    S.stats.in_cell = false;
    S.acquire_wanted = false;
    if (!atomic_load(&started)) {
        pthread_mutex_unlock(&kiwi_lock);
        return 0;
    }
    unsigned asked = ++S.release_asked;
    wake();
    while ((int)(S.release_done - asked) < 0) {
        struct timespec until;
        deadline_after(&until, 0.5);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &until);
    }
    pthread_mutex_unlock(&kiwi_lock);
    return 0;
}

void kiwi_comm_stats(struct kiwi_stats *out)
{
    pthread_mutex_lock(&kiwi_lock);
    *out = S.stats;
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_comm_set_policy(bool fail_closed, double timeout)
{
    pthread_mutex_lock(&kiwi_lock);
    S.policy_set = true;
    S.policy_closed = fail_closed;
    S.policy_timeout = timeout > 0 ? timeout : 0;
    /* A policy change during an outage applies at the next turn of the comm thread. */
    if (S.stats.failed_open && fail_closed) {
        S.stats.failed_open = false;
        kiwi_gate_close();
    } else if (S.stats.failed_closed && !fail_closed) {
        S.stats.failed_closed = false;
    }
    wake();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}
