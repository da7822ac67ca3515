/* What the comm thread's files share, and nothing else of the shim needs (shim.h declares
 * what the others call):
 *
 *   comm.c     the thread: connecting, its loop, acting on the other threads' wishes
 *   outage.c   while the daemon is away: the lost connection, the fail policy
 *   release.c  the release sequence, whatever asked for it
 *   dispatch.c what each line from the daemon does to the hold
 *   wishes.c   what the other threads ask of the comm thread (api.c, the gate, the allocations)
 *   start.c    starting the thread, and starting afresh in a forked child
 */
#ifndef KIWI_COMM_H
#define KIWI_COMM_H

#include "shim.h"

/* The hold and the wishes of other threads; all under kiwi_lock. */
struct kiwi_comm_state {
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
};

extern struct kiwi_comm_state kiwi_comm;
extern atomic_bool kiwi_working_set_dirty;
/* Other threads wake the comm thread by writing a byte to kiwi_wake_fd, the pipe's write end
 * (-1 until the pipe exists: published with an atomic store, so that a thread or signal handler
 * writing to it is ordered after the pipe's creation); it polls the read end. */
extern int kiwi_wake_pipe[2];
extern atomic_int kiwi_wake_fd;

/* ---- comm.c ------------------------------------------------------------------------------ */

void *kiwi_comm_main(void *unused);

/* ---- outage.c ---------------------------------------------------------------------------- */

/* The comm thread's turn while the daemon is away; returns how long it may sleep at most. */
double kiwi_outage_act(void);

/* ---- release.c --------------------------------------------------------------------------- */

/* The seq of the last plain release sent. */
extern unsigned kiwi_release_seq;
/* The seq of a release sent with evict_first whose answer has not come yet; 0 when none. The
 * hold stays KIWI_RELEASING meanwhile: the gate is closed, and no acquire is sent. */
extern unsigned kiwi_yield_seq;

/* Moves the working set to host memory, if any of it is evictable, and counts it. */
void kiwi_release_evict_now(void);
/* The daemon asked for the GPU back and said whether the next holder needs the room. */
void kiwi_release_sequence(bool evict, const char *why);
/* The process gives the GPU back of its own accord (cell end, idle). */
void kiwi_release_yield(const char *why);
/* The answer to a release sent with evict_first. */
void kiwi_release_on_yield_answer(const char *op, const char *line);
/* A release deferred for graph captures, once they are over. */
void kiwi_release_act_deferred(void);
/* A forked child: no release of its parent's is under way in it. */
void kiwi_release_after_fork(void);

#endif
