/* The client's side of one connection, without the connection: hello, register, and the
 * numbering of requests, as decisions that make lines and take lines (h11's shape). Where the
 * lines go is the shell's business: the comm thread hands them to the socket (link.c), the
 * conformance entry points (tests/protocol/conformance.c, in a test build only) keep them for
 * the transcripts to read. So the same code answers the daemon in both, and nothing here
 * touches a socket.
 *
 *   CLOSED --connect: hello--> GREETING --welcome: register--> REGISTERING --registered--> READY
 *
 * Only the comm thread (or, with no comm thread, the conformance entry points) calls these;
 * what other threads read of the outcome (connected, client, mode) is in kiwi_comm.stats.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

#define KIWI_DIGITS(number) #number
#define KIWI_TEXT(number) KIWI_DIGITS(number)

static enum { CLOSED, GREETING, REGISTERING, READY } phase;
static unsigned next_seq;
static unsigned register_seq;
static bool (*sink)(const char *line);
/* Position events (hello feature "position"): whether the latest welcome listed them. */
static bool position_events;
/* Where memory is (hello feature "memory", residency.c): whether the latest welcome listed it. */
static bool memory_feature;
/* Register said managed where vmm was chosen: the daemon predates vmm. */
static bool compatible;

void kiwi_session_send_to(bool (*send)(const char *line))
{
    sink = send;
}

static bool send_line(const char *line)
{
    return sink && sink(line);
}

unsigned kiwi_session_request(const char *op, const char *fields)
{
    char line[2200];
    unsigned seq = ++next_seq;
    snprintf(line, sizeof line, "{\"op\":\"%s\",\"seq\":%u%s%s}", op, seq, *fields ? "," : "",
             fields);
    return send_line(line) ? seq : 0;
}

bool kiwi_session_ready(void)
{
    return phase == READY;
}

bool kiwi_session_memory(void)
{
    return memory_feature && phase == READY;
}

bool kiwi_session_welcomed(void)
{
    return phase == REGISTERING || phase == READY;
}

void kiwi_session_connect(void)
{
    phase = GREETING;
    /* Asking for position events costs nothing on the hot path (the daemon coalesces them)
     * and lets the waiting line show the place in the queue without asking for the status. */
    send_line("{\"op\":\"" KIWI_OP_HELLO "\",\"version\":" KIWI_TEXT(KIWI_PROTOCOL_VERSION)
              ",\"software\":\"kiwi-shim " KIWI_SHIM_VERSION "\",\"features\":[\""
              KIWI_FEATURE_POSITION "\",\"" KIWI_FEATURE_MEMORY "\"]}");
}

void kiwi_session_closed(void)
{
    phase = CLOSED;
    register_seq = 0;
}

void kiwi_session_after_fork(void)
{
    kiwi_session_closed();
    sink = NULL;
}

/* The daemon writes compact JSON, "features":["position",...], and the list holds no
 * brackets. */
static bool welcome_lists(const char *welcome, const char *feature)
{
    const char *list = strstr(welcome, "\"features\":[");
    if (!list)
        return false;
    const char *end = strchr(list, ']');
    char quoted[48];
    snprintf(quoted, sizeof quoted, "\"%s\"", feature);
    const char *found = strstr(list, quoted);
    return end && found && found < end;
}

static void send_register(void)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    kiwi_news_take(KIWI_NEWS_WORKING_SET); /* register says it */
    if (ws.evictable) /* register has no field for the evictable part */
        kiwi_news_set(KIWI_NEWS_WORKING_SET);
    char fields[2048];
    kiwi_registration_fields(fields, sizeof fields, ws.bytes, compatible, memory_feature);
    register_seq = kiwi_session_request(KIWI_OP_REGISTER, fields);
}

static void welcomed(const char *line)
{
    position_events = welcome_lists(line, KIWI_FEATURE_POSITION);
    memory_feature = welcome_lists(line, KIWI_FEATURE_MEMORY);
    phase = REGISTERING;
    compatible = false;
    send_register();
}

/* A daemon that predates the vmm evictor refuses it by name in register (an invalid value,
 * which leaves the connection open). */
static bool refused_vmm(const char *op, const char *line)
{
    char code[16] = "", message[256] = "";
    kiwi_json_string(line, KIWI_FIELD_CODE, code, sizeof code);
    kiwi_json_string(line, KIWI_FIELD_MESSAGE, message, sizeof message);
    return !compatible && strcmp(op, KIWI_OP_ERROR) == 0 && strcmp(code, KIWI_E_INVALID) == 0 &&
           strstr(message, KIWI_FIELD_EVICT) && kiwi_evict_proposal_is_new();
}

static void registered(const char *line)
{
    phase = READY;
    char evictor[16] = "";
    kiwi_json_string(line, KIWI_FIELD_EVICT, evictor, sizeof evictor);
    kiwi_evict_answered(evictor);
    double budget = 0; /* 0: the daemon has no word, the shim's own default stands */
    if (!kiwi_json_number(line, KIWI_FIELD_PIN_BUDGET, &budget) || budget < 0 || budget >= 0x1p62)
        budget = 0;
    kiwi_pager_pin_budget((uint64_t)budget);
    pthread_mutex_lock(&kiwi_lock);
    kiwi_json_string(line, KIWI_FIELD_CLIENT, kiwi_comm.stats.client,
                     sizeof kiwi_comm.stats.client);
    kiwi_json_string(line, KIWI_FIELD_MODE, kiwi_comm.stats.mode, sizeof kiwi_comm.stats.mode);
    bool was_failed_open = kiwi_comm.stats.failed_open;
    kiwi_comm.stats.connected = true;
    kiwi_comm.stats.position_live = position_events;
    kiwi_comm.stats.failed_open = false;
    kiwi_comm.ask_refused = false; /* a new daemon may answer otherwise */
    kiwi_gate_refuse(false);
    if (was_failed_open)
        kiwi_gate_close(); /* from now on, work waits for a grant again */
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_log("registered as %s with %s", kiwi_comm.stats.client, kiwi_cfg.socket_path);
}

enum kiwi_handshake kiwi_session_handshake(const char *op, double seq, const char *line)
{
    if (phase == GREETING && strcmp(op, KIWI_OP_WELCOME) == 0) {
        welcomed(line);
        return KIWI_HANDSHAKE_WELCOMED;
    }
    if (phase != REGISTERING)
        return KIWI_HANDSHAKE_NONE;
    /* The reply to register carries its seq; one that carries none is read as it, too. */
    bool answer = seq < 0 || seq == (double)register_seq;
    if (strcmp(op, KIWI_OP_REGISTERED) == 0 && answer) {
        registered(line);
        return KIWI_HANDSHAKE_REGISTERED;
    }
    if (answer && refused_vmm(op, line)) {
        kiwi_log("the daemon does not know the vmm evictor; registering as managed (this "
                 "process pages itself either way)");
        compatible = true;
        send_register();
        return KIWI_HANDSHAKE_WELCOMED;
    }
    if (answer && (seq >= 0 || strcmp(op, KIWI_OP_ERROR) == 0)) {
        kiwi_warn("the daemon did not register this process: %s", line);
        phase = CLOSED;
        return KIWI_HANDSHAKE_REFUSED;
    }
    return KIWI_HANDSHAKE_NONE; /* an event, read as any other */
}
