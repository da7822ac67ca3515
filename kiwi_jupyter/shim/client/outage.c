/* While the daemon is away: losing the connection, and the fail policy.
 *
 * Whatever the process held went with the connection: the gate closes at once. The comm
 * thread keeps retrying (comm.c); after KIWI_FAIL_TIMEOUT of outage the policy decides: open
 * lets GPU work run ungated, closed makes gated calls fail with CUDA_ERROR_SYSTEM_NOT_READY.
 * The process never exits because of the daemon.
 */
#define _GNU_SOURCE
#include "client.h"

void kiwi_comm_link_lost(struct kiwi_client *c, const char *why)
{
    pthread_mutex_lock(&kiwi_lock);
    bool was_connected = c->stats.connected;
    c->stats.connected = false;
    c->stats.position_live = false;
    c->outage_since = kiwi_now();
    c->seq.yield = 0;
    kiwi_ask_after_lost(c);
    kiwi_session_closed(c);
    /* Whatever was held or asked went with the connection. */
    c->stats.queue_position = 0;
    if (c->stats.hold != KIWI_HOLD_IDLE && kiwi_hold_move(c, KIWI_HOLD_IDLE)) {
        c->stats.paused = false;
        kiwi_gate_close();
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    if (was_connected)
        kiwi_warn("lost the scheduler at %s (%s); reconnecting", kiwi_cfg.socket_path, why);
}

/* Before work runs unscheduled: memory an eviction moved out must be back first (the vmm
 * evictor's is not even mapped). False when the card has no room for it yet. */
static bool restored_for_fail_open(struct kiwi_client *c)
{
    if (kiwi_way_out_busy())
        return false; /* its end first: it may wait for a daemon that restores the process */
    if (!kiwi_pager_away())
        return true;
    struct kiwi_transfer moved = {0};
    kiwi_pager_move(KIWI_PAGE_IN, &moved);
    pthread_mutex_lock(&kiwi_lock);
    if (!moved.failed) {
        c->stats.evicted = false;
        c->stats.restores++;
        c->stats.bytes_restored += moved.bytes;
        c->stats.seconds_restoring += moved.seconds;
    } else {
        c->stats.restore_failures++;
    }
    pthread_mutex_unlock(&kiwi_lock);
    return !moved.failed;
}

/* The comm thread's turn while the daemon is away: releases are trivially done, and after the
 * policy's timeout work is let through (open) or refused (closed). Returns how long to sleep
 * at most before the policy would apply. */
double kiwi_outage_act(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    double due = c->policy_timeout - (kiwi_now() - c->outage_since);
    bool opening = due <= 0 && !c->stats.failed_open && !kiwi_gate_refusing() &&
                   !c->policy_closed;
    pthread_mutex_unlock(&kiwi_lock);
    if (opening && !restored_for_fail_open(c)) {
        /* Nobody makes room meanwhile: allocations waiting for it fail (the restore maps them
         * where the card has room). */
        pthread_mutex_lock(&kiwi_lock);
        kiwi_room_fail("the scheduler is unreachable, and nobody else makes room");
        pthread_mutex_unlock(&kiwi_lock);
        return 1.0; /* tried again in a second */
    }
    pthread_mutex_lock(&kiwi_lock);
    c->release_done = c->release_asked;
    if (kiwi_gate_refusing() || (c->policy_closed && due <= 0))
        kiwi_room_fail("the scheduler is unreachable, and the fail policy is closed");
    double outage = kiwi_now() - c->outage_since;
    double left = c->policy_timeout - outage;
    if (left <= 0 && !c->stats.failed_open && !kiwi_gate_refusing()) {
        if (c->policy_closed) {
            kiwi_gate_refuse(true);
            kiwi_warn("no scheduler at %s: GPU work is refused until it is back (fail closed)",
                      kiwi_cfg.socket_path);
        } else {
            c->stats.failed_open = true;
            kiwi_gate_open();
            kiwi_warn("no scheduler at %s: GPU work runs unscheduled until it is back "
                      "(fail open)", kiwi_cfg.socket_path);
        }
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    return left > 0 ? left : 1e9;
}
