/* What the client's files share: the daemon client, its thread, and the hold (../shim.h lists
 * the files). Nothing below the client calls it: the mechanisms post news (news.c), which the
 * comm thread takes, and the entry points do not know it exists. Only api.c's functions are
 * called from outside, through ctypes.
 */
#ifndef KIWI_CLIENT_H
#define KIWI_CLIENT_H

#include "../shim.h"
#include "protocol.h"

struct kiwi_stats {
    bool connected;
    bool failed_open;        /* the daemon is unreachable and the policy lets work through */
    bool failed_closed;      /* the daemon is unreachable and the policy refuses work */
    bool in_cell;
    bool evicted;            /* the working set is in host memory now */
    bool paused;             /* holding, but another holder beside it has its turn */
    enum kiwi_hold_state hold; /* written by kiwi_hold_move only */
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
    uint64_t room_requeues;  /* holds given back and asked again for an allocation's room */
    uint64_t room_refusals;  /* waits the daemon refused: the room they need cannot be made */
    /* While calls wait for the GPU and the daemon refused the last ask for want of room: its
     * words, and the seconds until the next ask (kiwi_comm_stats fills both in); "" and 0
     * otherwise. room_last_refusal: its words at the last refusal, kept until a grant. */
    char room_refused[256];
    char room_last_refusal[256];
    double room_retry_in;
    double seconds_waiting;  /* time gated calls spent waiting for the GPU */
    /* CLOCK_MONOTONIC when the last grant arrived, before its restore: benchmarks time the
     * way back to full speed from here, whichever way the pages come back. 0 before any. */
    double last_grant_at;
};

/* Where the session stands on its connection (session.c). */
enum kiwi_phase {
    KIWI_PHASE_CLOSED,      /* no connection */
    KIWI_PHASE_GREETING,    /* hello sent, no welcome yet */
    KIWI_PHASE_REGISTERING, /* register sent, not answered yet */
    KIWI_PHASE_READY,
};

struct kiwi_client;

/* The moves between tiers (tiers.c) a `spill` or `fetch` asks for. */
enum kiwi_tier_move {
    KIWI_TIER_NONE,
    KIWI_TIER_SPILL,      /* host memory -> spill files */
    KIWI_TIER_FETCH_HOST, /* spill files -> host memory */
    KIWI_TIER_FETCH_GPU,  /* host memory -> the card, without holding the GPU */
};
/* Where the client's memory is, and who moves it between tiers: the process's pager, moved on
 * tiers.c's worker thread (a handle's default), or the conformance entry points' account of
 * it, moved when a transcript says the move ended. */
struct kiwi_tier_mover {
    void (*residency)(struct kiwi_residency *out);
    bool (*away)(void); /* memory moved out is still away */
    /* Under tiers.c's lock: makes the move, whose end is posted with kiwi_tiers_ended; false
     * when it cannot begin. */
    bool (*begin)(enum kiwi_tier_move move, uint64_t bytes);
};

/* Where the session's lines go (link.c's kiwi_link_send, or the conformance buffer). */
typedef bool (*kiwi_line_sink)(struct kiwi_client *c, const char *line);

/* The client: everything the daemon client keeps, in one handle (libuv's loop handle) that the
 * comm thread owns and hands to every function of the tier. The process has one (start.c
 * makes it and starts the comm thread on it); the conformance entry points make their own,
 * and a test may keep one on its stack.
 *
 * Other threads reach it only through the wishes path (wishes.c: what they ask for, and the
 * stats, under kiwi_lock) and wake the comm thread through the news path (mechanisms/news.c,
 * its wake_pipe). Whether calls are refused (failed_closed) and how long they waited are the
 * gate's own (kiwi_gate_refusing, kiwi_gate_seconds_waiting): kiwi_comm_stats fills them in;
 * stats.failed_closed and stats.seconds_waiting are not kept here. */
struct kiwi_client {
    /* ---- under kiwi_lock: the hold, the stats and the wishes of other threads ---- */
    struct kiwi_stats stats;
    bool acquire_wanted;     /* kiwi_shim_acquire: eager acquisition */
    bool moving_out;         /* a way out runs on its own thread (way_out.c) */
    bool ask_refused;        /* the daemon refused an acquire: not asked again for the same
                                wish (a new cell, eager acquire or connection clears it) */
    unsigned release_asked;  /* generations: kiwi_shim_release waits for done to catch up */
    unsigned release_done;
    double outage_since;
    double granted_at;
    double retry_after;      /* after a failed restore or a refusal for room: no acquire
                                before this */
    double retry_backoff;    /* and how long the next failed restore waits */
    double room_backoff;     /* how long the next refusal for room waits (room.c) */
    double room_refused_since; /* the first refusal of the wait now: its KIWI_ROOM_TIMEOUT
                                  counts from here; 0 when none */
    int room_restores_failed; /* restores without room in a row, while allocations wait */
    bool policy_set;         /* kiwi_shim_set_policy overrides the environment */
    bool policy_closed;
    double policy_timeout;

    /* ---- the comm thread's own ---- */
    /* Its wake-up pipe: it polls the read end; the write end is handed to news.c, through
     * which every other thread (and a signal handler) wakes it. -1 while there is none. */
    int wake_pipe[2];
    /* The requests whose answers are awaited; 0 when none. */
    struct {
        unsigned ask;     /* the acquire (or requeue) whose answer has not been read */
        unsigned cancel;  /* the release taking a request back (RELEASING) */
        unsigned release; /* the last plain release: its `released` may ask for the room */
        unsigned yield;   /* a release with evict_first (RELEASING): the gate is closed,
                             and no acquire is sent meanwhile */
    } seq;
    struct {
        enum kiwi_phase phase;
        unsigned next_seq;
        unsigned register_seq;
        kiwi_line_sink sink;
        bool position_events; /* hello feature "position": the latest welcome listed it */
        bool memory_feature;  /* hello feature "memory" (residency.c): likewise */
        bool tiers_feature;   /* hello feature "tiers" (tiers.c): likewise */
        bool compatible;      /* register said managed where vmm was chosen: the daemon
                                 predates vmm */
    } session;
    /* A release that must wait for graph captures to end (mechanisms/captures.c): a drop, and
     * whether it asked for eviction, or a release of the process's own accord (release.c). */
    struct {
        bool drop;
        bool evict;
        bool yield;
    } deferred;
    /* What a drop read left to do (kiwi_release_dropped), while the hold is DROPPING. */
    struct {
        bool evict;
        bool quiesced; /* the answer to evict_first: steps 1 and 2 are done */
    } dropped;
    const struct kiwi_tier_mover *tier_mover; /* NULL: the process's (tiers.c) */
    bool evict_asked;    /* an `evict` read, for kiwi_comm_handle_line to carry out */
    double last_report;  /* when the last working set report went (residency.c) */
    double report_wait;  /* a report held back by the rate limit: the seconds until it may go */
    /* The connection (link.c): its socket (-1: none) and what was read of it, not yet lines. */
    struct {
        int fd;
        char inbox[65536]; /* daemon lines other than status are under 1 KiB */
        size_t inbox_length;
    } link;
};

/* ---- the handle's owner (start.c) ------------------------------------------------------ */

/* The process's client, for the wishes path (wishes.c) and the comm thread it starts on. */
struct kiwi_client *kiwi_client_of_process(void);
/* A handle as the process's starts: nothing held, asked or connected, no pipe, no socket. */
void kiwi_client_init(struct kiwi_client *c);

/* ---- hold.c ------------------------------------------------------------------------------ */

/* Under kiwi_lock: moves the hold to `to` when the protocol's table (kiwi_hold_legal,
 * protocol.h) allows the move from where it is; otherwise refuses it (a bug: said aloud in
 * checked builds) and returns false. */
bool kiwi_hold_move(struct kiwi_client *c, enum kiwi_hold_state to);
/* The word the statistics show for a state: idle, waiting, holding or releasing. */
const char *kiwi_hold_word(enum kiwi_hold_state hold);

/* ---- comm.c ------------------------------------------------------------------------------ */

void *kiwi_comm_main(void *unused);

/* ---- dispatch.c -------------------------------------------------------------------------- */

/* What a line from the daemon does: the hold, the counts, the gate, the answers. A line that
 * breaks the protocol is left, and said aloud. */
void kiwi_dispatch_line(struct kiwi_client *c, const char *line);
/* The comm thread's: kiwi_dispatch_line, then what a drop leaves to do (the release sequence). */
void kiwi_comm_handle_line(struct kiwi_client *c, const char *line);

/* ---- session.c --------------------------------------------------------------------------- */

/* Where the session's lines go (link.c's kiwi_link_send, or the conformance buffer); false
 * when a line could not be sent. */
void kiwi_session_send_to(struct kiwi_client *c, kiwi_line_sink send);
/* Sends a request with the next seq; returns the seq, or 0 when it could not be sent. */
unsigned kiwi_session_request(struct kiwi_client *c, const char *op, const char *fields);
/* A new connection: says hello; the welcome is answered with register (the working set so
 * far), and registered makes the session ready. */
void kiwi_session_connect(struct kiwi_client *c);
/* Reads the answers to hello and register; NONE for any other line, which dispatch.c reads
 * on. WELCOMED: the handshake goes on (register sent, or sent again: a daemon that predates
 * the vmm evictor refused it). REFUSED: the daemon would not register this process; the
 * connection is of no use. */
enum kiwi_handshake {
    KIWI_HANDSHAKE_NONE,
    KIWI_HANDSHAKE_WELCOMED,
    KIWI_HANDSHAKE_REGISTERED,
    KIWI_HANDSHAKE_REFUSED,
};
enum kiwi_handshake kiwi_session_handshake(struct kiwi_client *c, const struct kiwi_message *msg);
bool kiwi_session_welcomed(struct kiwi_client *c);
bool kiwi_session_ready(struct kiwi_client *c);
/* Whether the daemon of this ready session speaks of where memory is (the hello feature
 * `memory`: residency.c). */
bool kiwi_session_memory(struct kiwi_client *c);
/* The daemon hears the tiers: `disk` and `pinned` figures, `tier_moved` (tiers.c). */
bool kiwi_session_tiers(struct kiwi_client *c);
/* The connection ended (outage.c). */
void kiwi_session_closed(struct kiwi_client *c);

/* ---- asking.c ---------------------------------------------------------------------------- */

/* Under kiwi_lock: whether the process wants the GPU (a gated call or an allocation waits, or
 * an eager acquire), and was not refused it for that wish. */
bool kiwi_ask_wanted(struct kiwi_client *c);
/* Sends acquire when the GPU is wanted, nothing is asked, held or being released, and the
 * session is ready. */
void kiwi_ask_if_wanted(struct kiwi_client *c);
/* Takes back a request out (ASKING, WAITING): RELEASING until its answer comes. */
void kiwi_ask_cancel(struct kiwi_client *c);
/* Whether a line with this seq answers the cancel (the hold is IDLE then) or the ask (an error
 * or `released` are read here; a grant or `waiting` are dispatch.c's). */
bool kiwi_ask_cancel_answered(struct kiwi_client *c, int64_t seq);
bool kiwi_ask_answered(struct kiwi_client *c, enum kiwi_daemon_op op, int64_t seq);
/* Gives the hold back and asks again in one request (release with requeue); without a hold,
 * asks. */
void kiwi_ask_requeue(struct kiwi_client *c);
void kiwi_ask_after_lost(struct kiwi_client *c);

/* ---- way_out.c --------------------------------------------------------------------------- */

/* The comm thread, once the hold has ended: hands the way out to a thread of its own and tells
 * the daemon it began; false when one is under way already (its `evicted` answers for both) or
 * there is no thread for it. */
bool kiwi_way_out_start(struct kiwi_client *c);
/* A way out is under way, or its end is not carried out yet. */
bool kiwi_way_out_busy(void);
/* The comm thread's turn: the way out's progress reported, its end counted and `evicted` sent. */
void kiwi_way_out_act(struct kiwi_client *c);
/* On a grant, before the restore: waits for the way out under way to end, and carries it out. */
void kiwi_way_out_join(struct kiwi_client *c);
void kiwi_way_out_after_fork(void);

/* ---- tiers.c ----------------------------------------------------------------------------- */

/* A `spill`, `fetch` or `pin_budget` event (the tiers feature): a move between host memory and
 * disk, or on to the card, handed to a thread of its own; the budget passed on. */
void kiwi_tiers_on_event(struct kiwi_client *c, const struct kiwi_message *msg);
/* The comm thread's turn: the move's progress reported, its end sent (`tier_moved`). */
void kiwi_tiers_act(struct kiwi_client *c);
/* On a grant, before the restore: waits for a move under way to end, and carries it out. */
void kiwi_tiers_join(struct kiwi_client *c);
void kiwi_tiers_after_fork(void);
/* The move under way ended (moved->failed: why not; the memory stayed where it was): the
 * worker's word, or a mover's without a thread of its own. */
void kiwi_tiers_ended(const struct kiwi_transfer *moved);
/* Who moves c's memory between tiers from now on (NULL: the process's); forgets any move under
 * way, so only before any begins. */
void kiwi_tiers_set_mover(struct kiwi_client *c, const struct kiwi_tier_mover *mover);

/* ---- room.c ------------------------------------------------------------------------------ */

/* An `error` event with code `room`: the daemon refused the wait; asked again later. */
void kiwi_room_on_refused(struct kiwi_client *c, const struct kiwi_message *refusal);
/* Under kiwi_lock: a grant ends the refusals, and their backoff. */
void kiwi_room_granted(struct kiwi_client *c);
/* The comm thread's turn: waits refused for longer than KIWI_ROOM_TIMEOUT give up. */
void kiwi_room_act(struct kiwi_client *c);
/* The comm thread's turn for allocations that wait for room (mechanisms/room_wait.c): they
 * fail where no daemon makes room; true when any wait on. Once the working set that includes
 * them is reported, kiwi_room_requeue: holding, the process gives the GPU back and asks again
 * (or they fail, when it cannot); otherwise the ask is asking.c's, as for calls at the gate. */
bool kiwi_room_wanted(struct kiwi_client *c);
void kiwi_room_requeue(struct kiwi_client *c);
/* A restore on a grant found no room: the third in a row fails the allocations waiting. */
void kiwi_room_restore_failed(struct kiwi_client *c);
/* Under kiwi_lock: a cell ended; the next wait has a KIWI_ROOM_TIMEOUT of its own. */
void kiwi_room_cell_end(struct kiwi_client *c);
/* Under kiwi_lock: the refusal the stats show (into out), while calls wait for the GPU. */
void kiwi_room_stats(struct kiwi_client *c, struct kiwi_stats *out);

/* ---- outage.c ---------------------------------------------------------------------------- */

/* The connection is gone (link.c), and with it whatever the process held. */
void kiwi_comm_link_lost(struct kiwi_client *c, const char *why);
/* The comm thread's turn while the daemon is away; returns how long it may sleep at most. */
double kiwi_outage_act(struct kiwi_client *c);

/* ---- release.c --------------------------------------------------------------------------- */

/* Moves the working set to host memory, if any of it is evictable, and counts it. */
void kiwi_release_evict_now(struct kiwi_client *c);
/* The daemon asked for the GPU back and said whether the next holder needs the room. */
void kiwi_release_sequence(struct kiwi_client *c, bool evict, const char *why);
/* The process gives the GPU back of its own accord (cell end, idle). */
void kiwi_release_yield(struct kiwi_client *c, const char *why);
/* The answer to a release sent with evict_first. */
void kiwi_release_on_yield_answer(struct kiwi_client *c, const struct kiwi_message *answer);
/* The decisions that end a release sequence, once the gate is closed and the work done: the
 * plain release (the hold is idle: the GPU changes hands at once), and the release asking
 * whether to evict first (RELEASING until the answer). */
void kiwi_release_finish(struct kiwi_client *c);
void kiwi_release_ask_evict_first(struct kiwi_client *c);
/* The release that ends a hold whose memory leaves after it (a drop with evict, to a daemon
 * with the memory feature, under an evictor that moves memory itself): `release` with
 * `evicting`, the way out to follow; false, nothing sent, where that is not the way. */
bool kiwi_release_finish_evicting(struct kiwi_client *c);
/* Allocations wait for room while this process holds the GPU: it gives it back and asks again
 * (release with requeue), since the daemon makes room before a grant; false (with why) when it
 * cannot now (a graph capture is open, or synchronizing failed). */
bool kiwi_release_for_room(struct kiwi_client *c, const char **why);
/* A drop was read (DROPPING): with evict, the next holder needs the room; quiesced, it answers
 * evict_first and only the eviction and the release are left. kiwi_release_carry_out does it. */
void kiwi_release_dropped(struct kiwi_client *c, bool evict, bool quiesced);
void kiwi_release_carry_out(struct kiwi_client *c);
/* A release deferred for graph captures, once they are over. */
void kiwi_release_act_deferred(struct kiwi_client *c);

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
/* For the conformance entry points: true when the thread has not started, and never will in
 * this process. */
bool kiwi_comm_hold_off(void);

/* ---- link.c ------------------------------------------------------------------------------ */

/* Connects the socket (session.c says hello on it). */
bool kiwi_link_open(struct kiwi_client *c);
bool kiwi_link_up(struct kiwi_client *c);
int kiwi_link_fd(struct kiwi_client *c);
/* Writes one line (its newline added); false, with the connection closed, when it fails. */
bool kiwi_link_send(struct kiwi_client *c, const char *line);
/* Reads what the socket has, waiting at most timeout seconds; false when nothing came. */
bool kiwi_link_fill(struct kiwi_client *c, double timeout);
bool kiwi_link_next_line(struct kiwi_client *c, char *line, size_t size);
/* Closes the connection and tells the comm thread why. */
void kiwi_link_close(struct kiwi_client *c, const char *why);
void kiwi_link_after_fork(struct kiwi_client *c);

/* ---- registration.c ---------------------------------------------------------------------- */

/* The register request's fields: the client's names and labels, quoted, its GPU and its
 * working set; with memory (the daemon's welcome listed the feature) where its memory is;
 * compatible: for a daemon that refused the evictor vmm (it predates it), managed instead. */
void kiwi_registration_fields(char *fields, size_t size, uint64_t working_set, bool compatible,
                              bool memory);
/* The GPU's UUID as far as it is known ("" while not), copied under kiwi_lock. */
void kiwi_gpu_uuid(char *text, size_t size);

/* ---- residency.c ------------------------------------------------------------------------- */

/* Sends working_set (with where the memory is, when the daemon speaks of it); or, too soon
 * after the last report, keeps the news for later and returns the seconds to wait. */
double kiwi_residency_report(struct kiwi_client *c);
/* Before a release leaves: a report still to send (held back by the rate limit, or not yet
 * taken) goes now, whatever the rate limit says. */
void kiwi_residency_before_release(struct kiwi_client *c);
/* A move's progress callback (struct kiwi_transfer): working_set with those figures. */
void kiwi_residency_progress(const struct kiwi_residency *now, void *client);
/* Ends an eviction for the daemon: `evicted` with where the memory is and what moved, or with
 * failed (why the memory could not be moved, or a restore rolled back). Nothing to a daemon
 * without the memory feature. */
void kiwi_residency_evicted(struct kiwi_client *c, const struct kiwi_transfer *moved,
                            const char *failed);

/* ---- wire.c ------------------------------------------------------------------------------ */

/* A value of a flat JSON object: points into the line; strings are not unescaped. */
struct kiwi_json_value {
    const char *start;
    size_t length;
    char kind; /* 's' string (without quotes), 'n' number, 't' true, 'f' false, 'z' null,
                  'o' object or array (skipped) */
};

/* Whether line is one JSON object and nothing more (its values skipped over, not read). */
bool kiwi_json_object(const char *line);
bool kiwi_json_get(const char *line, const char *key, struct kiwi_json_value *out);
/* The words of a list of strings (list, length: a value kiwi_json_get found) that are among
 * words, as the bits of their places there. */
unsigned kiwi_json_words(const char *list, size_t length, const char *const *words, int count);
/* A string value as text for people: escapes read (a code point outside ASCII becomes '?',
 * a control character a space), cut with "..." to fit size; false when there is none. */
bool kiwi_json_text(const char *line, const char *key, char *buf, size_t size);
bool kiwi_json_number(const char *line, const char *key, double *out);
/* Appends a JSON string literal (quoted, escaped) to buf; returns false when it does not fit. */
bool kiwi_json_quote(char *buf, size_t size, const char *text);
/* Appends the memory feature's figures, `resident`, `host` and `shadow`, to a request's fields. */
void kiwi_json_residency(char *fields, size_t size, const struct kiwi_residency *where);
/* Appends the tiers feature's figures: `disk`, and `pinned` (shadows and the staging ring). */
void kiwi_json_tiers(char *fields, size_t size, const struct kiwi_residency *where);

/* ---- decode.c (generated from the protocol's table) ------------------------------------- */

/* Reads a line from the daemon, once, into out (protocol.h's struct kiwi_message). */
enum kiwi_decoded kiwi_message_decode(const char *line, struct kiwi_message *out);

/* ---- evict.c ----------------------------------------------------------------------------- */

/* What register proposes ("vmm", "managed" or "checkpoint"; compatible: to a daemon that
 * refused the offer's name, the name it knows), whether a daemon that predates the offer would
 * refuse its name, and the daemon's answer ("" when it gave none): the pager's choice
 * (mechanisms/pager.c) follows it. */
const char *kiwi_evict_proposal(bool compatible);
bool kiwi_evict_proposal_is_new(void);
void kiwi_evict_answered(const char *evictor);

#endif
