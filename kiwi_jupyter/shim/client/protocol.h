/* The Kiwi wire protocol's names and the client's hold table, for the CUDA shim.
 *
 * Generated from nodeside/protocol/messages.py and hold.py by
 * `python -m nodeside.protocol.generate`: edit the table there and run it, never this file (a
 * test fails while the two differ). docs/protocol.md says what each message means.
 */
#ifndef KIWI_PROTOCOL_H
#define KIWI_PROTOCOL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ---- limits and defaults --------------------------------------------------------------------- */

/* The protocol version spoken by this code. A peer announcing another one is refused. */
#define KIWI_PROTOCOL_VERSION 1
/*
 * Largest line a client may send, newline included. Requests are small; anything larger is a
 * broken or hostile peer, and the daemon must not buffer without bound for it.
 */
#define KIWI_MAX_REQUEST_BYTES 65536
/*
 * Largest line the daemon may send. Status documents grow with the number of clients (about 300
 * bytes each), so replies get far more room than requests.
 */
#define KIWI_MAX_REPLY_BYTES 16777216
/* Where the node daemon listens unless told otherwise (KIWI_SOCKET, --socket). */
#define KIWI_DEFAULT_SOCKET "/var/run/kiwi/scheduler.sock"
/* The pool a client joins unless it names one (KIWI_POOL). */
#define KIWI_DEFAULT_POOL "default"
/* The priority a client asks for unless it names one (KIWI_PRIORITY). */
#define KIWI_DEFAULT_PRIORITY "NORMAL"

/* ---- ops: what a client sends, then what the daemon sends ------------------------------------ */

#define KIWI_OP_HELLO "hello" /* request */
#define KIWI_OP_REGISTER "register" /* request */
#define KIWI_OP_ACQUIRE "acquire" /* request */
#define KIWI_OP_RELEASE "release" /* request */
#define KIWI_OP_WORKING_SET "working_set" /* request */
#define KIWI_OP_EVICTED "evicted" /* request */
#define KIWI_OP_TIER_MOVED "tier_moved" /* request */
#define KIWI_OP_INTENT "intent" /* request */
#define KIWI_OP_STATUS "status" /* request */
#define KIWI_OP_SET_MODE "set_mode" /* request */
#define KIWI_OP_SET_TQ "set_tq" /* request */
#define KIWI_OP_PING "ping" /* request */
#define KIWI_OP_WELCOME "welcome" /* reply */
#define KIWI_OP_REGISTERED "registered" /* reply */
#define KIWI_OP_GRANT "grant" /* reply and event */
#define KIWI_OP_WAITING "waiting" /* reply and event */
#define KIWI_OP_RELEASED "released" /* reply */
#define KIWI_OP_DROP "drop" /* reply and event */
#define KIWI_OP_REVOKED "revoked" /* event */
#define KIWI_OP_PAUSE "pause" /* event */
#define KIWI_OP_RESUME "resume" /* event */
#define KIWI_OP_EVICT "evict" /* event */
#define KIWI_OP_SPILL "spill" /* event */
#define KIWI_OP_FETCH "fetch" /* event */
#define KIWI_OP_PIN_BUDGET "pin_budget" /* event */
#define KIWI_OP_CHANGED "changed" /* event */
#define KIWI_OP_MODE "mode" /* event */
#define KIWI_OP_OK "ok" /* reply */
#define KIWI_OP_PONG "pong" /* reply */
#define KIWI_OP_STATUS_REPLY "status" /* reply */
#define KIWI_OP_ERROR "error" /* reply and event */

/* ---- field names (every message has an op; requests and replies may have a seq) -------------- */

#define KIWI_FIELD_BYTES "bytes"
#define KIWI_FIELD_CLIENT "client"
#define KIWI_FIELD_CODE "code"
#define KIWI_FIELD_DAEMON "daemon"
#define KIWI_FIELD_DISK "disk"
#define KIWI_FIELD_DISPLAY_NAME "display_name"
#define KIWI_FIELD_EVICT "evict"
#define KIWI_FIELD_EVICT_FIRST "evict_first"
#define KIWI_FIELD_EVICTABLE "evictable"
#define KIWI_FIELD_EVICTING "evicting"
#define KIWI_FIELD_FAILED "failed"
#define KIWI_FIELD_FEATURES "features"
#define KIWI_FIELD_FOR "for"
#define KIWI_FIELD_GPU "gpu"
#define KIWI_FIELD_GPU_UUID "gpu_uuid"
#define KIWI_FIELD_GRACE "grace"
#define KIWI_FIELD_HOST "host"
#define KIWI_FIELD_KIND "kind"
#define KIWI_FIELD_LABELS "labels"
#define KIWI_FIELD_MAX_MESSAGE "max_message"
#define KIWI_FIELD_MESSAGE "message"
#define KIWI_FIELD_MODE "mode"
#define KIWI_FIELD_MOVED "moved"
#define KIWI_FIELD_NAME "name"
#define KIWI_FIELD_OP "op"
#define KIWI_FIELD_PAUSABLE "pausable"
#define KIWI_FIELD_PIN_BUDGET "pin_budget"
#define KIWI_FIELD_PINNED "pinned"
#define KIWI_FIELD_POOL "pool"
#define KIWI_FIELD_POSITION "position"
#define KIWI_FIELD_PRIORITY "priority"
#define KIWI_FIELD_QUANTUM "quantum"
#define KIWI_FIELD_REASON "reason"
#define KIWI_FIELD_REQUEUE "requeue"
#define KIWI_FIELD_RESIDENT "resident"
#define KIWI_FIELD_SECONDS "seconds"
#define KIWI_FIELD_SEQ "seq"
#define KIWI_FIELD_SHADOW "shadow"
#define KIWI_FIELD_SOFTWARE "software"
#define KIWI_FIELD_STATUS "status"
#define KIWI_FIELD_TIER "tier"
#define KIWI_FIELD_TQ "tq"
#define KIWI_FIELD_VERSION "version"
#define KIWI_FIELD_WARNING "warning"
#define KIWI_FIELD_WORKING_SET "working_set"

/* ---- the values of mode, priority and evict -------------------------------------------------- */

#define KIWI_MODE_ON "on"
#define KIWI_MODE_OFF "off"
#define KIWI_MODE_AUTO "auto"
#define KIWI_PRIORITY_HIGH "HIGH"
#define KIWI_PRIORITY_NORMAL "NORMAL"
#define KIWI_PRIORITY_LOW "LOW"
#define KIWI_EVICT_MANAGED "managed"
#define KIWI_EVICT_CHECKPOINT "checkpoint"
#define KIWI_EVICT_VMM "vmm"

/* ---- error codes ----------------------------------------------------------------------------- */

#define KIWI_E_MALFORMED "malformed"
#define KIWI_E_TOO_LARGE "too_large"
#define KIWI_E_UNKNOWN_OP "unknown_op"
#define KIWI_E_VERSION "version"
#define KIWI_E_PERMISSION "permission"
#define KIWI_E_INVALID "invalid"
#define KIWI_E_STATE "state"
#define KIWI_E_LIMIT "limit"
#define KIWI_E_ROOM "room"

/* The daemon closes the connection after these errors. */
static inline bool kiwi_error_fatal(const char *code)
{
    return strcmp(code, KIWI_E_MALFORMED) == 0 ||
           strcmp(code, KIWI_E_TOO_LARGE) == 0 ||
           strcmp(code, KIWI_E_UNKNOWN_OP) == 0 ||
           strcmp(code, KIWI_E_VERSION) == 0;
}

/* ---- features a client may ask for in hello -------------------------------------------------- */

#define KIWI_FEATURE_POSITION "position"
#define KIWI_FEATURE_CHANGES "changes"
#define KIWI_FEATURE_MEMORY "memory"
#define KIWI_FEATURE_TIERS "tiers"

/* ---- why a holder is asked to drop the GPU --------------------------------------------------- */

#define KIWI_REASON_QUANTUM "quantum"
#define KIWI_REASON_PREEMPT "preempt"
#define KIWI_REASON_MODE "mode"
#define KIWI_REASON_ROOM "room"
#define KIWI_REASON_MAXIMUM "maximum"
#define KIWI_REASON_GRACE "grace"
#define KIWI_REASON_RELEASE "release"

/* ---- the client's hold (nodeside/protocol/hold.py) ------------------------------------------- */

enum kiwi_hold_state {
    /* nothing asked, nothing held */
    KIWI_HOLD_IDLE,
    /* an acquire (or a requeue) is out; its answer has not been read */
    KIWI_HOLD_ASKING,
    /* queued: the grant comes as an event */
    KIWI_HOLD_WAITING,
    /* the GPU is this client's */
    KIWI_HOLD_HOLDING,
    /* still this client's, but the daemon asked for it back (a drop): release soon (the
     * shim: also while its release sequence runs) */
    KIWI_HOLD_DROPPING,
    /* a release is out whose answer decides what happens: a cancelled wait (a grant read
     * meanwhile crossed it) or a release with evict_first (answered released or drop);
     * nothing is asked meanwhile */
    KIWI_HOLD_RELEASING,
};
#define KIWI_HOLD_STATES 6

static inline const char *kiwi_hold_state_name(enum kiwi_hold_state state)
{
    switch (state) {
    case KIWI_HOLD_IDLE: return "IDLE";
    case KIWI_HOLD_ASKING: return "ASKING";
    case KIWI_HOLD_WAITING: return "WAITING";
    case KIWI_HOLD_HOLDING: return "HOLDING";
    case KIWI_HOLD_DROPPING: return "DROPPING";
    case KIWI_HOLD_RELEASING: return "RELEASING";
    }
    return "?";
}

/* Every legal move of the hold; anything else is a bug in the client. */
static inline bool kiwi_hold_legal(enum kiwi_hold_state from, enum kiwi_hold_state to)
{
    switch (from) {
    case KIWI_HOLD_IDLE:
        /* -> ASKING: acquire sent */
        return to == KIWI_HOLD_ASKING;
    case KIWI_HOLD_ASKING:
        /* -> IDLE: its answer: an error (or an `error` event with code `room`); or the
         * connection was lost */
        /* -> WAITING: its answer: waiting */
        /* -> HOLDING: its answer: grant (or a grant event after a seq-less acquire) */
        /* -> RELEASING: cancelled before its answer: release sent */
        return to == KIWI_HOLD_IDLE ||
               to == KIWI_HOLD_WAITING ||
               to == KIWI_HOLD_HOLDING ||
               to == KIWI_HOLD_RELEASING;
    case KIWI_HOLD_WAITING:
        /* -> IDLE: an `error` event with code `room` (`memory` feature): the room it waits
         * for cannot be made, and it is idle again; or the connection was lost */
        /* -> HOLDING: grant event */
        /* -> RELEASING: cancelled: release sent */
        return to == KIWI_HOLD_IDLE ||
               to == KIWI_HOLD_HOLDING ||
               to == KIWI_HOLD_RELEASING;
    case KIWI_HOLD_HOLDING:
        /* -> IDLE: release sent (a plain one: the GPU changes hands at once); revoked; the
         * connection was lost */
        /* -> ASKING: release with requeue sent */
        /* -> DROPPING: drop event; the shim: its release sequence begins */
        /* -> RELEASING: release with evict_first sent, or a release whose answer is awaited
         * (a cancel) */
        return to == KIWI_HOLD_IDLE ||
               to == KIWI_HOLD_ASKING ||
               to == KIWI_HOLD_DROPPING ||
               to == KIWI_HOLD_RELEASING;
    case KIWI_HOLD_DROPPING:
        /* -> IDLE: release sent; revoked; the connection was lost */
        /* -> ASKING: release with requeue sent */
        /* -> HOLDING: grant event: the drop is withdrawn (mode off); the shim: the release
         * cannot go ahead yet (a graph capture is open, or synchronizing failed) */
        /* -> RELEASING: likewise */
        return to == KIWI_HOLD_IDLE ||
               to == KIWI_HOLD_ASKING ||
               to == KIWI_HOLD_HOLDING ||
               to == KIWI_HOLD_RELEASING;
    case KIWI_HOLD_RELEASING:
        /* -> IDLE: its answer: released (or an error); the connection was lost */
        /* -> DROPPING: its answer: drop (evict_first and the room is needed): evict, then
         * release */
        return to == KIWI_HOLD_IDLE ||
               to == KIWI_HOLD_DROPPING;
    }
    return false;
}

/* ---- the daemon's messages, decoded (decode.c) ----------------------------------------------- */

enum kiwi_daemon_op {
    KIWI_DAEMON_UNKNOWN, /* an op this version does not send a client */
    KIWI_DAEMON_WELCOME,
    KIWI_DAEMON_REGISTERED,
    KIWI_DAEMON_GRANT,
    KIWI_DAEMON_WAITING,
    KIWI_DAEMON_RELEASED,
    KIWI_DAEMON_DROP,
    KIWI_DAEMON_REVOKED,
    KIWI_DAEMON_PAUSE,
    KIWI_DAEMON_RESUME,
    KIWI_DAEMON_EVICT,
    KIWI_DAEMON_SPILL,
    KIWI_DAEMON_FETCH,
    KIWI_DAEMON_PIN_BUDGET,
    KIWI_DAEMON_CHANGED,
    KIWI_DAEMON_MODE,
    KIWI_DAEMON_OK,
    KIWI_DAEMON_PONG,
    KIWI_DAEMON_STATUS_REPLY,
    KIWI_DAEMON_ERROR,
};

/* struct kiwi_message's has: the fields the line carried. */
#define KIWI_HAS_SEQ (1ull << 0)
#define KIWI_HAS_VERSION (1ull << 1)
#define KIWI_HAS_DAEMON (1ull << 2)
#define KIWI_HAS_MAX_MESSAGE (1ull << 3)
#define KIWI_HAS_MODE (1ull << 4)
#define KIWI_HAS_TQ (1ull << 5)
#define KIWI_HAS_FEATURES (1ull << 6)
#define KIWI_HAS_CLIENT (1ull << 7)
#define KIWI_HAS_GPU (1ull << 8)
#define KIWI_HAS_EVICT (1ull << 9)
#define KIWI_HAS_POOL (1ull << 10)
#define KIWI_HAS_PRIORITY (1ull << 11)
#define KIWI_HAS_WARNING (1ull << 12)
#define KIWI_HAS_PIN_BUDGET (1ull << 13)
#define KIWI_HAS_QUANTUM (1ull << 14)
#define KIWI_HAS_POSITION (1ull << 15)
#define KIWI_HAS_REASON (1ull << 16)
#define KIWI_HAS_GRACE (1ull << 17)
#define KIWI_HAS_BYTES (1ull << 18)
#define KIWI_HAS_FOR (1ull << 19)
#define KIWI_HAS_TIER (1ull << 20)
#define KIWI_HAS_STATUS (1ull << 21)
#define KIWI_HAS_CODE (1ull << 22)
#define KIWI_HAS_MESSAGE (1ull << 23)

/* The features a welcome lists, as bits of its features member. */
#define KIWI_FEATURE_BIT_POSITION (1u << 0)
#define KIWI_FEATURE_BIT_CHANGES (1u << 1)
#define KIWI_FEATURE_BIT_MEMORY (1u << 2)
#define KIWI_FEATURE_BIT_TIERS (1u << 3)
#define KIWI_FEATURE_WORDS 4

struct kiwi_msg_welcome {
    int64_t version; /* the protocol version */
    char daemon[64]; /* the daemon's software and version */
    int64_t max_message; /* the longest line a client may send, newline included */
    char mode[8];
    double tq; /* seconds */
    unsigned features; /* those asked for that the daemon serves; absent when none were asked */
};

struct kiwi_msg_registered {
    char client[32]; /* the daemon's id for this client */
    int64_t gpu; /* the GPU it was placed on */
    char mode[8];
    double tq; /* seconds, on its GPU */
    char evict[32]; /* the evictor the daemon carries out for it */
    char pool[32]; /* what it got, when the access policy downgraded its claim */
    char priority[32]; /* likewise */
    char warning[256]; /* why it was downgraded */
    /* memory feature: the most host memory, in bytes, the client may keep pinned ahead for its
     * evictions (the vmm evictor's shadows and staging ring); absent: its own default */
    int64_t pin_budget;
};

struct kiwi_msg_grant {
    int64_t gpu; /* the GPU's index */
    double quantum; /* seconds */
};

struct kiwi_msg_waiting {
    int64_t position; /* 1-based place in the queue */
};

struct kiwi_msg_released {
    bool evict; /* the next holder needed the room */
};

struct kiwi_msg_drop {
    int64_t gpu; /* the GPU's index */
    char reason[32]; /* one of the reasons below */
    bool evict; /* the next holder needs the memory: move your working set to host memory first */
    double grace; /* seconds before the GPU is revoked */
};

struct kiwi_msg_revoked {
    int64_t gpu; /* the GPU's index */
    char reason[32]; /* grace */
};

struct kiwi_msg_pause {
    int64_t gpu; /* the GPU's index */
};

struct kiwi_msg_resume {
    int64_t gpu; /* the GPU's index */
};

struct kiwi_msg_evict {
    int64_t gpu; /* the GPU's index */
    int64_t bytes; /* the room needed */
    char for_name[256]; /* the display name of who needs the room */
};

struct kiwi_msg_spill {
    int64_t gpu; /* the GPU's index */
    int64_t bytes; /* host memory to free; absent: all of it */
};

struct kiwi_msg_fetch {
    int64_t gpu; /* the GPU's index */
    /* host: from disk to host memory; gpu: on to the GPU, where there is room for it now */
    char tier[32];
};

struct kiwi_msg_pin_budget {
    int64_t pin_budget; /* bytes */
};

struct kiwi_msg_mode {
    char mode[8];
    double tq; /* seconds */
};

struct kiwi_msg_ok {
    char mode[8]; /* after set_mode and set_tq */
    double tq; /* likewise */
};

struct kiwi_msg_error {
    char code[32]; /* one of the codes below */
    char message[256]; /* for people */
};

/* One line from the daemon, decoded (decode.c): op, seq (-1: none), has, and the
 * members of that op's struct. */
struct kiwi_message {
    enum kiwi_daemon_op op;
    char op_name[32]; /* as read */
    int64_t seq;
    uint64_t has;
    union {
        struct kiwi_msg_welcome welcome;
        struct kiwi_msg_registered registered;
        struct kiwi_msg_grant grant;
        struct kiwi_msg_waiting waiting;
        struct kiwi_msg_released released;
        struct kiwi_msg_drop drop;
        struct kiwi_msg_revoked revoked;
        struct kiwi_msg_pause pause;
        struct kiwi_msg_resume resume;
        struct kiwi_msg_evict evict;
        struct kiwi_msg_spill spill;
        struct kiwi_msg_fetch fetch;
        struct kiwi_msg_pin_budget pin_budget;
        struct kiwi_msg_mode mode;
        struct kiwi_msg_ok ok;
        struct kiwi_msg_error error;
    };
};

enum kiwi_decoded {
    KIWI_DECODED,
    KIWI_DECODE_MALFORMED,  /* not an object, no string op, a field of another type */
    KIWI_DECODE_UNKNOWN_OP, /* well formed: an op this version does not send a client */
};

#endif
