/* What the client's files share: the daemon client, its thread, and the hold (../shim.h lists
 * the files). Nothing below the client calls it: the mechanisms post news (news.c), which the
 * comm thread takes, and the entry points do not know it exists. Only api.c's functions are
 * called from outside, through ctypes.
 */
#ifndef KIWI_CLIENT_H
#define KIWI_CLIENT_H

#include "../shim.h"
#include "hold.h"

struct kiwi_stats {
    bool connected;
    bool failed_open;        /* the daemon is unreachable and the policy lets work through */
    bool failed_closed;      /* the daemon is unreachable and the policy refuses work */
    bool in_cell;
    bool evicted;            /* the working set is in host memory now */
    bool paused;             /* holding, but another holder beside it has its turn */
    enum kiwi_hold hold;     /* written by kiwi_hold_move only */
    int queue_position;      /* 0 when not waiting */
    bool position_live;      /* the daemon sends an event whenever queue_position changes */
    char client[32];         /* the daemon's id for this process */
    char mode[8];
    double quantum;
    uint64_t grants, drops, revokes, releases;
    uint64_t pauses;         /* turns taken by holders beside this one (mode auto, turns) */
    uint64_t evictions, bytes_evicted;
    uint64_t bytes_skipped, bytes_discarded; /* free blocks of the framework's cache */
    double seconds_evicting;
    uint64_t restores, bytes_restored;
    double seconds_restoring;
    uint64_t restore_failures; /* restores rolled back for want of room: the grant went back */
    double seconds_waiting;  /* time gated calls spent waiting for the GPU */
    /* CLOCK_MONOTONIC when the last grant arrived, before its restore: benchmarks time the
     * way back to full speed from here, whichever way the pages come back. 0 before any. */
    double last_grant_at;
};

/* The hold and the wishes of other threads; all under kiwi_lock (gate.c). Whether calls are
 * refused (failed_closed) and how long they waited are the gate's own (kiwi_gate_refusing,
 * kiwi_gate_seconds_waiting): kiwi_comm_stats fills them in; stats.failed_closed and
 * stats.seconds_waiting are not kept here. */
struct kiwi_comm_state {
    struct kiwi_stats stats;
    bool acquire_wanted;     /* kiwi_shim_acquire: eager acquisition */
    unsigned release_asked;  /* generations: kiwi_shim_release waits for done to catch up */
    unsigned release_done;
    double outage_since;
    double granted_at;
    double retry_after;      /* after a failed restore: no acquire before this */
    double retry_backoff;    /* and how long the next failure waits */
    bool policy_set;         /* kiwi_shim_set_policy overrides the environment */
    bool policy_closed;
    double policy_timeout;
};

extern struct kiwi_comm_state kiwi_comm;
/* The comm thread's wake-up pipe: it polls the read end; the write end is handed to news.c,
 * through which every other thread (and a signal handler) wakes it. */
extern int kiwi_wake_pipe[2];

/* ---- hold.c ------------------------------------------------------------------------------ */

/* Under kiwi_lock: moves the hold to `to` when hold.h's table allows the move from where it
 * is; otherwise refuses it (a bug: said aloud in checked builds) and returns false. */
bool kiwi_hold_move(enum kiwi_hold to);
const char *kiwi_hold_name(enum kiwi_hold hold);

/* ---- comm.c ------------------------------------------------------------------------------ */

void *kiwi_comm_main(void *unused);
/* A line the daemon sent on its own while a reply was awaited (link.c hands it over). */
void kiwi_comm_handle_line(const char *line);

/* ---- outage.c ---------------------------------------------------------------------------- */

/* The connection is gone (link.c), and with it whatever the process held. */
void kiwi_comm_link_lost(const char *why);
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

/* ---- wishes.c (for api.c) ---------------------------------------------------------------- */

void kiwi_comm_cell_begin(void);
int kiwi_comm_acquire(double timeout);
int kiwi_comm_release(void);
void kiwi_comm_stats(struct kiwi_stats *out);
void kiwi_comm_set_policy(bool fail_closed, double timeout);

/* ---- start.c ----------------------------------------------------------------------------- */

/* Starts the daemon client's thread the first time the process does GPU work (news.c calls it
 * through the mechanisms' kiwi_news_need_client). */
void kiwi_comm_start(void);
bool kiwi_comm_started(void);

/* ---- link.c ------------------------------------------------------------------------------ */

/* Connects, says hello and registers (with the working set so far); the registered reply is
 * left in registered. A line the daemon sends on its own meanwhile goes to on_event. */
bool kiwi_link_connect(uint64_t working_set, char *registered, size_t size,
                       void (*on_event)(const char *line));
/* Whether the daemon of the current connection sends "waiting" events as the position moves. */
bool kiwi_link_position_events(void);
/* Whether it speaks of where memory is (hello feature "memory": residency.c). */
bool kiwi_link_memory(void);
bool kiwi_link_up(void);
int kiwi_link_fd(void);
/* Sends a request with the next seq; returns the seq, or 0 when the connection is gone. */
unsigned kiwi_link_request(const char *op, const char *fields);
/* Reads what the socket has, waiting at most timeout seconds; false when nothing came. */
bool kiwi_link_fill(double timeout);
bool kiwi_link_next_line(char *line, size_t size);
/* Closes the connection and tells the comm thread why. */
void kiwi_link_close(const char *why);
void kiwi_link_after_fork(void);

/* ---- registration.c ---------------------------------------------------------------------- */

/* The register request's fields: the client's names and labels, quoted, its GPU and its
 * working set; with memory (the daemon's welcome listed the feature) where its memory is;
 * compatible: for a daemon that refused the evictor vmm (it predates it), managed instead. */
void kiwi_registration_fields(char *fields, size_t size, uint64_t working_set, bool compatible,
                              bool memory);

/* ---- residency.c ------------------------------------------------------------------------- */

/* Sends working_set (with where the memory is, when the daemon speaks of it); or, too soon
 * after the last report, keeps the news for later and returns the seconds to wait. */
double kiwi_residency_report(void);
/* A move's progress callback (struct kiwi_transfer): working_set with those figures. */
void kiwi_residency_progress(const struct kiwi_residency *now, void *unused);
/* Ends an eviction for the daemon: `evicted` with where the memory is and what moved, or with
 * failed (why the memory could not be moved, or a restore rolled back). Nothing to a daemon
 * without the memory feature. */
void kiwi_residency_evicted(const struct kiwi_transfer *moved, const char *failed);
void kiwi_residency_after_fork(void);
/* The GPU's UUID as far as it is known ("" while not), copied under kiwi_lock. */
void kiwi_gpu_uuid(char *text, size_t size);

/* ---- wire.c ------------------------------------------------------------------------------ */

/* A value of a flat JSON object: points into the line; strings are not unescaped. */
struct kiwi_json_value {
    const char *start;
    size_t length;
    char kind; /* 's' string (without quotes), 'n' number, 't' true, 'f' false, 'z' null,
                  'o' object or array (skipped) */
};

bool kiwi_json_get(const char *line, const char *key, struct kiwi_json_value *out);
bool kiwi_json_string(const char *line, const char *key, char *buf, size_t size);
bool kiwi_json_number(const char *line, const char *key, double *out);
bool kiwi_json_true(const char *line, const char *key);
/* Appends a JSON string literal (quoted, escaped) to buf; returns false when it does not fit. */
bool kiwi_json_quote(char *buf, size_t size, const char *text);

/* ---- evict.c ----------------------------------------------------------------------------- */

/* What register proposes ("vmm", "managed" or "checkpoint"), and the daemon's answer ("" when
 * it gave none): the pager's choice (mechanisms/pager.c) follows it. */
const char *kiwi_evict_proposal(void);
void kiwi_evict_answered(const char *evictor);

#endif
