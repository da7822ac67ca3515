/* The client's side of one connection, without the connection: hello, register, and the
 * numbering of requests, as decisions that make lines and take lines (h11's shape). Where the
 * lines go is the shell's business: the comm thread hands them to the socket (link.c), the
 * conformance entry points (tests/protocol/conformance.c, in a test build only) keep them for
 * the transcripts to read. So the same code answers the daemon in both, and nothing here
 * touches a socket.
 *
 *   CLOSED --connect: hello--> GREETING --welcome: register--> REGISTERING --registered--> READY
 *
 * Only the comm thread (or, with no comm thread, the conformance entry points) calls these, on
 * the handle it owns (c->session); what other threads read of the outcome (connected, client,
 * mode) is in c->stats.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

#define KIWI_DIGITS(number) #number
#define KIWI_TEXT(number) KIWI_DIGITS(number)

void kiwi_session_send_to(struct kiwi_client *c, kiwi_line_sink send)
{
    c->session.sink = send;
}

static bool send_line(struct kiwi_client *c, const char *line)
{
    return c->session.sink && c->session.sink(c, line);
}

unsigned kiwi_session_request(struct kiwi_client *c, const char *op, const char *fields)
{
    char line[2200];
    unsigned seq = ++c->session.next_seq;
    snprintf(line, sizeof line, "{\"op\":\"%s\",\"seq\":%u%s%s}", op, seq, *fields ? "," : "",
             fields);
    return send_line(c, line) ? seq : 0;
}

bool kiwi_session_ready(struct kiwi_client *c)
{
    return c->session.phase == KIWI_PHASE_READY;
}

bool kiwi_session_memory(struct kiwi_client *c)
{
    return c->session.memory_feature && c->session.phase == KIWI_PHASE_READY;
}

bool kiwi_session_tiers(struct kiwi_client *c)
{
    return c->session.tiers_feature && kiwi_session_memory(c);
}

bool kiwi_session_welcomed(struct kiwi_client *c)
{
    return c->session.phase == KIWI_PHASE_REGISTERING || c->session.phase == KIWI_PHASE_READY;
}

void kiwi_session_connect(struct kiwi_client *c)
{
    c->session.phase = KIWI_PHASE_GREETING;
    /* Asking for position events costs nothing on the hot path (the daemon coalesces them)
     * and lets the waiting line show the place in the queue without asking for the status. */
    send_line(c, "{\"op\":\"" KIWI_OP_HELLO "\",\"version\":" KIWI_TEXT(KIWI_PROTOCOL_VERSION)
              ",\"software\":\"kiwi-shim " KIWI_SHIM_VERSION "\",\"features\":[\""
              KIWI_FEATURE_POSITION "\",\"" KIWI_FEATURE_MEMORY "\",\"" KIWI_FEATURE_TIERS
              "\"]}");
}

void kiwi_session_closed(struct kiwi_client *c)
{
    c->session.phase = KIWI_PHASE_CLOSED;
    c->session.register_seq = 0;
}


static void send_register(struct kiwi_client *c)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    kiwi_news_take(KIWI_NEWS_WORKING_SET); /* register says it */
    if (ws.evictable) /* register has no field for the evictable part */
        kiwi_news_set(KIWI_NEWS_WORKING_SET);
    char fields[2048];
    kiwi_registration_fields(fields, sizeof fields, ws.bytes, c->session.compatible,
                             c->session.memory_feature);
    c->session.register_seq = kiwi_session_request(c, KIWI_OP_REGISTER, fields);
}

static void welcomed(struct kiwi_client *c, const struct kiwi_message *welcome)
{
    c->session.position_events = welcome->welcome.features & KIWI_FEATURE_BIT_POSITION;
    c->session.memory_feature = welcome->welcome.features & KIWI_FEATURE_BIT_MEMORY;
    c->session.tiers_feature = welcome->welcome.features & KIWI_FEATURE_BIT_TIERS;
    c->session.phase = KIWI_PHASE_REGISTERING;
    c->session.compatible = false;
    send_register(c);
}

/* A daemon that predates the vmm evictor refuses it by name in register (an invalid value,
 * which leaves the connection open). */
static bool refused_vmm(struct kiwi_client *c, const struct kiwi_message *answer)
{
    return !c->session.compatible && answer->op == KIWI_DAEMON_ERROR &&
           strcmp(answer->error.code, KIWI_E_INVALID) == 0 &&
           strstr(answer->error.message, KIWI_FIELD_EVICT) &&
           kiwi_evict_proposal_is_new();
}

static void registered(struct kiwi_client *c, const struct kiwi_message *answer)
{
    const struct kiwi_msg_registered *registration = &answer->registered;
    c->session.phase = KIWI_PHASE_READY;
    kiwi_evict_answered(registration->evict);
    /* 0: the daemon has no word, the shim's own default stands */
    int64_t budget = registration->pin_budget;
    kiwi_pager_pin_budget(budget > 0 && budget < (INT64_C(1) << 62) ? (uint64_t)budget : 0);
    pthread_mutex_lock(&kiwi_lock);
    snprintf(c->stats.client, sizeof c->stats.client, "%s",
             registration->client);
    if (answer->has & KIWI_HAS_MODE)
        snprintf(c->stats.mode, sizeof c->stats.mode, "%s", registration->mode);
    bool was_failed_open = c->stats.failed_open;
    c->stats.connected = true;
    c->stats.position_live = c->session.position_events;
    c->stats.failed_open = false;
    c->ask_refused = false; /* a new daemon may answer otherwise */
    kiwi_gate_refuse(false);
    if (was_failed_open)
        kiwi_gate_close(); /* from now on, work waits for a grant again */
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_log("registered as %s with %s", c->stats.client, kiwi_cfg.socket_path);
}

enum kiwi_handshake kiwi_session_handshake(struct kiwi_client *c, const struct kiwi_message *msg)
{
    if (c->session.phase == KIWI_PHASE_GREETING && msg->op == KIWI_DAEMON_WELCOME) {
        welcomed(c, msg);
        return KIWI_HANDSHAKE_WELCOMED;
    }
    if (c->session.phase != KIWI_PHASE_REGISTERING)
        return KIWI_HANDSHAKE_NONE;
    /* The reply to register carries its seq; one that carries none is read as it, too. */
    bool answer = msg->seq < 0 || msg->seq == (int64_t)c->session.register_seq;
    if (msg->op == KIWI_DAEMON_REGISTERED && answer) {
        registered(c, msg);
        return KIWI_HANDSHAKE_REGISTERED;
    }
    if (answer && refused_vmm(c, msg)) {
        kiwi_log("the daemon does not know the vmm evictor; registering as managed (this "
                 "process pages itself either way)");
        c->session.compatible = true;
        send_register(c);
        return KIWI_HANDSHAKE_WELCOMED;
    }
    if (answer && (msg->seq >= 0 || msg->op == KIWI_DAEMON_ERROR)) {
        kiwi_warn("the daemon did not register this process: %s %s", msg->op_name,
                  msg->op == KIWI_DAEMON_ERROR ? msg->error.message : "");
        c->session.phase = KIWI_PHASE_CLOSED;
        return KIWI_HANDSHAKE_REFUSED;
    }
    return KIWI_HANDSHAKE_NONE; /* an event, read as any other */
}
