/* The conformance entry points (docs/protocol.md, "Conformance"): the protocol's transcripts
 * (tests/protocol/transcripts) drive the client through these, in a process of their own, on
 * the caller's thread, with the comm thread never started and no socket. They call the very
 * decisions the comm thread makes (session.c, asking.c, dispatch.c, release.c); only where the
 * lines go differs: into a buffer the caller reads, instead of down the socket. What the comm
 * thread does beyond the decisions is left out: no release sequence after a drop (the gate, the
 * pager), no idle release, no asking for threads waiting at the gate (there are none).
 *
 * Moves between tiers (tiers.c) are the client's own decisions too, made on an account of where
 * its memory is (`held`: evicted, 1 GiB in host memory at the start) instead of the pager's; a
 * move begins where tiers.c begins it and ends where the transcript says so (`spilled`,
 * `fetched`, `restored`), nothing moved in between. A transcript ends a move before a grant:
 * the grant waits for it (kiwi_tiers_join), and here nothing else would end it.
 *
 * A process whose client has started cannot use them, and one that used them never starts its
 * client: the two would share the one hold.
 *
 * Test-only: compiled into a test build of the shim beside its sources (kiwi_jupyter/shim/
 * build.py, compile_library's test_sources; "client.h" is found in the client tier), never
 * into the library the wheel ships.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

static bool usable;
/* The transcripts' client: a handle of their own, never the process's (which never starts). */
static struct kiwi_client client;
static char sent[1 << 16];
static size_t sent_length;

/* Where the transcripts' client's memory is, and the move under way (tiers.c asks it). */
static struct kiwi_residency held;
static enum kiwi_tier_move moving;

static void held_residency(struct kiwi_residency *out)
{
    *out = held;
}

static bool held_away(void)
{
    return held.host || held.disk;
}

static bool held_begin(enum kiwi_tier_move move, uint64_t bytes)
{
    (void)bytes;
    moving = move;
    return true;
}

static const struct kiwi_tier_mover held_mover = {
    .residency = held_residency,
    .away = held_away,
    .begin = held_begin,
};

/* The move under way ended, as `move` would: the account follows it. */
static void move_ended(enum kiwi_tier_move move)
{
    if (moving != move)
        return; /* not the one under way: nothing moved */
    if (move == KIWI_TIER_SPILL) {
        held.disk += held.host;
        held.host = 0;
    } else if (move == KIWI_TIER_FETCH_HOST) {
        held.host += held.disk;
        held.disk = 0;
    } else if (move == KIWI_TIER_FETCH_GPU) {
        held.resident += held.host;
        held.host = 0;
    }
    moving = KIWI_TIER_NONE;
    struct kiwi_transfer moved = {0};
    kiwi_tiers_ended(&moved);
    kiwi_tiers_act(&client);
}

static bool keep(struct kiwi_client *c, const char *line)
{
    (void)c;
    size_t length = strlen(line);
    if (sent_length + length + 2 > sizeof sent)
        return false;
    memcpy(sent + sent_length, line, length);
    sent_length += length;
    sent[sent_length++] = '\n';
    sent[sent_length] = '\0';
    return true;
}

/* A fresh client: no connection, hold IDLE, nothing wanted, nothing sent. */
KIWI_EXPORT void kiwi_conformance_reset(void)
{
    kiwi_init();
    usable = kiwi_comm_hold_off();
    if (!usable) {
        kiwi_warn("the conformance entry points need a process whose client has not started");
        return;
    }
    pthread_mutex_lock(&kiwi_lock);
    kiwi_client_init(&client); /* the hold too: idle (hold.c) */
    kiwi_gate_refuse(false);
    kiwi_gate_close();
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_session_send_to(&client, keep);
    held = (struct kiwi_residency){.host = 1u << 30};
    moving = KIWI_TIER_NONE;
    kiwi_tiers_set_mover(&client, &held_mover);
    sent_length = 0;
    sent[0] = '\0';
}

static void set_wish(bool wanted)
{
    pthread_mutex_lock(&kiwi_lock);
    client.acquire_wanted = wanted;
    client.ask_refused = false;
    pthread_mutex_unlock(&kiwi_lock);
}

static bool holds(void)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = client.stats.hold;
    pthread_mutex_unlock(&kiwi_lock);
    return hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING;
}

/* 0 after doing call, -1 for a call it does not know (or before a usable reset). */
KIWI_EXPORT int kiwi_conformance_call(const char *call)
{
    if (!usable || !call)
        return -1;
    if (strcmp(call, "connect") == 0) {
        kiwi_session_connect(&client);
    } else if (strcmp(call, "lost") == 0) {
        kiwi_comm_link_lost(&client, "the transcript says so");
    } else if (strcmp(call, "ask") == 0) { /* as kiwi_shim_acquire, then the comm thread */
        set_wish(true);
        kiwi_ask_if_wanted(&client);
    } else if (strcmp(call, "release") == 0) {
        /* As a cell's end: a hold is given back (the sequence's last step), a request taken
         * back. */
        set_wish(false);
        if (holds())
            kiwi_release_finish(&client);
        else
            kiwi_ask_cancel(&client);
    } else if (strcmp(call, "cancel") == 0) { /* a request only: the shim gives a hold back
                                                 through its release sequence */
        set_wish(false);
        kiwi_ask_cancel(&client);
    } else if (strcmp(call, "yield") == 0) {
        set_wish(false);
        if (holds())
            kiwi_release_ask_evict_first(&client);
    } else if (strcmp(call, "requeue") == 0) {
        kiwi_ask_requeue(&client);
    } else if (strcmp(call, "report") == 0) { /* as the news of a working set, before a release */
        kiwi_news_set(KIWI_NEWS_WORKING_SET);
        kiwi_residency_before_release(&client);
    } else if (strcmp(call, "release_evicting") == 0) { /* a drop's release, evict asked */
        set_wish(false);
        if (!kiwi_release_finish_evicting(&client))
            kiwi_release_finish(&client);
    } else if (strcmp(call, "evicted") == 0) { /* a way out's end, nothing moved */
        struct kiwi_transfer moved = {0};
        kiwi_residency_evicted(&client, &moved, NULL);
    } else if (strcmp(call, "spilled") == 0) { /* a spill's end, its worker's word */
        move_ended(KIWI_TIER_SPILL);
    } else if (strcmp(call, "fetched") == 0) { /* a fetch from disk's end */
        move_ended(KIWI_TIER_FETCH_HOST);
    } else if (strcmp(call, "restored") == 0) { /* a fetch to the card's end */
        move_ended(KIWI_TIER_FETCH_GPU);
    } else {
        return -1;
    }
    return 0;
}

/* One line from the daemon, without its newline, as the comm thread reads it. */
KIWI_EXPORT void kiwi_conformance_receive(const char *line)
{
    if (usable && line)
        kiwi_dispatch_line(&client, line);
}

/* The lines sent since the last call, each ended by a newline, NUL-terminated as size allows;
 * returns their length. */
KIWI_EXPORT size_t kiwi_conformance_sent(char *out, size_t size)
{
    size_t length = sent_length;
    if (out && size)
        snprintf(out, size, "%s", sent);
    sent_length = 0;
    sent[0] = '\0';
    return length;
}

/* The hold, as enum kiwi_hold_state (protocol.h). */
KIWI_EXPORT int kiwi_hold_state(void)
{
    pthread_mutex_lock(&kiwi_lock);
    int hold = (int)client.stats.hold;
    pthread_mutex_unlock(&kiwi_lock);
    return hold;
}

/* The queue position (0 when not waiting). */
KIWI_EXPORT int kiwi_conformance_position(void)
{
    pthread_mutex_lock(&kiwi_lock);
    int position = client.stats.queue_position;
    pthread_mutex_unlock(&kiwi_lock);
    return position;
}

/* 1 while a holder beside this one has its turn. */
KIWI_EXPORT int kiwi_conformance_paused(void)
{
    pthread_mutex_lock(&kiwi_lock);
    int paused = client.stats.paused ? 1 : 0;
    pthread_mutex_unlock(&kiwi_lock);
    return paused;
}

/* The decoder alone (decode.c): line read into a struct kiwi_message, whose op, seq, presence
 * bits and a few members per op are written to out as "name=value" words; returns its enum
 * kiwi_decoded. */
KIWI_EXPORT int kiwi_conformance_decode(const char *line, char *out, size_t size)
{
    struct kiwi_message msg;
    enum kiwi_decoded decoded = kiwi_message_decode(line ? line : "", &msg);
    int n = snprintf(out, size, "op=%s seq=%lld has=%llx", msg.op_name, (long long)msg.seq,
                     (unsigned long long)msg.has);
    size_t used = n < 0 ? 0 : (size_t)n < size ? (size_t)n : size;
    char *rest = out + used;
    size_t left = size - used;
    if (decoded != KIWI_DECODED)
        return (int)decoded;
    switch (msg.op) {
    case KIWI_DAEMON_WELCOME:
        snprintf(rest, left, " features=%u tq=%g", msg.welcome.features, msg.welcome.tq);
        break;
    case KIWI_DAEMON_REGISTERED:
        snprintf(rest, left, " client=%s evict=%s pin_budget=%lld", msg.registered.client,
                 msg.registered.evict, (long long)msg.registered.pin_budget);
        break;
    case KIWI_DAEMON_GRANT:
        snprintf(rest, left, " gpu=%lld quantum=%g", (long long)msg.grant.gpu,
                 msg.grant.quantum);
        break;
    case KIWI_DAEMON_WAITING:
        snprintf(rest, left, " position=%lld", (long long)msg.waiting.position);
        break;
    case KIWI_DAEMON_DROP:
        snprintf(rest, left, " reason=%s evict=%d grace=%g", msg.drop.reason, msg.drop.evict,
                 msg.drop.grace);
        break;
    case KIWI_DAEMON_EVICT:
        snprintf(rest, left, " bytes=%lld for=%s", (long long)msg.evict.bytes,
                 msg.evict.for_name);
        break;
    case KIWI_DAEMON_ERROR:
        snprintf(rest, left, " code=%s message=%s", msg.error.code, msg.error.message);
        break;
    default:
        break;
    }
    return (int)decoded;
}

static bool discard(struct kiwi_client *c, const char *line)
{
    (void)c;
    (void)line;
    return true;
}

static bool holding(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    bool now = c->stats.hold == KIWI_HOLD_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    return now;
}

/* Two clients, each a handle on this stack, driven apart: what one is told moves its own hold
 * and session, and no other's (nothing of a client is kept outside its handle). Their lines go
 * nowhere. Returns how many of the checks failed (0: all held); -1 before a usable reset. */
KIWI_EXPORT int kiwi_conformance_two_handles(void)
{
    if (!usable)
        return -1;
    struct kiwi_client a, b;
    kiwi_client_init(&a);
    kiwi_client_init(&b);
    kiwi_session_send_to(&a, discard);
    kiwi_session_send_to(&b, discard);
    kiwi_session_connect(&a);
    kiwi_session_connect(&b);
    kiwi_dispatch_line(&a, "{\"op\":\"welcome\",\"version\":1,\"features\":[\"memory\"]}");
    kiwi_dispatch_line(&b, "{\"op\":\"welcome\",\"version\":1,\"features\":[]}");
    kiwi_dispatch_line(&a, "{\"op\":\"registered\",\"seq\":1,\"client\":\"ca\",\"mode\":\"on\"}");
    kiwi_dispatch_line(&b, "{\"op\":\"registered\",\"seq\":1,\"client\":\"cb\",\"mode\":\"off\"}");
    pthread_mutex_lock(&kiwi_lock);
    a.acquire_wanted = true;
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_ask_if_wanted(&a);
    kiwi_ask_if_wanted(&b); /* b wants nothing */
    unsigned asked = a.seq.ask;
    char grant[96];
    snprintf(grant, sizeof grant, "{\"op\":\"grant\",\"seq\":%u,\"gpu\":0,\"quantum\":30}", asked);
    kiwi_dispatch_line(&b, grant); /* not b's: it asked nothing */
    kiwi_dispatch_line(&a, grant);
    int failed = 0;
    failed += !(asked == 2 && a.seq.ask == 0 && b.seq.ask == 0);
    failed += !(holding(&a) && b.stats.hold == KIWI_HOLD_IDLE && b.stats.grants == 0);
    failed += !(kiwi_session_memory(&a) && kiwi_session_ready(&b) && !kiwi_session_memory(&b));
    failed += !(strcmp(a.stats.client, "ca") == 0 && strcmp(b.stats.client, "cb") == 0);
    failed += !(strcmp(a.stats.mode, "on") == 0 && strcmp(b.stats.mode, "off") == 0);
    kiwi_release_finish(&a);
    failed += !(a.stats.hold == KIWI_HOLD_IDLE && a.seq.release == 3 && b.session.next_seq == 1);
    pthread_mutex_lock(&kiwi_lock);
    kiwi_gate_close(); /* a's grant opened the process's gate */
    pthread_mutex_unlock(&kiwi_lock);
    return failed;
}
