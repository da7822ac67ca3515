/* The connection to the daemon: a Unix socket speaking docs/protocol.md, one JSON object per
 * line. Only the comm thread calls these. The register line's fields are built apart
 * (registration.c), since they come from the user and must be quoted and bounded with care.
 * The link carries lines and knows nothing of what they mean: a line that comes while it
 * awaits a reply goes to the handler the comm thread gave it (dispatch.c's), and a lost
 * connection is told to outage.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"

static int link_fd = -1;
static char inbox[65536]; /* daemon lines other than status are under 1 KiB */
static size_t inbox_length;
static unsigned next_seq;

bool kiwi_link_up(void)
{
    return link_fd >= 0;
}

int kiwi_link_fd(void)
{
    return link_fd;
}

void kiwi_link_close(const char *why)
{
    if (link_fd < 0)
        return;
    close(link_fd);
    link_fd = -1;
    inbox_length = 0;
    kiwi_comm_link_lost(why);
}

void kiwi_link_after_fork(void)
{
    /* The child's copy of the socket is the parent's connection: close it without a word. */
    if (link_fd >= 0)
        close(link_fd);
    link_fd = -1;
    inbox_length = 0;
}

static bool send_line(const char *line)
{
    if (link_fd < 0)
        return false;
    kiwi_log("-> %s", line);
    char framed[2400];
    int n = snprintf(framed, sizeof framed, "%s\n", line);
    if (n < 0 || (size_t)n >= sizeof framed)
        return false;
    for (size_t sent = 0; sent < (size_t)n;) {
        /* MSG_NOSIGNAL: a daemon gone away must not SIGPIPE the notebook kernel. */
        ssize_t k = send(link_fd, framed + sent, (size_t)n - sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            kiwi_link_close(strerror(errno));
            return false;
        }
        sent += (size_t)k;
    }
    return true;
}

unsigned kiwi_link_request(const char *op, const char *fields)
{
    char line[2200];
    unsigned seq = ++next_seq;
    snprintf(line, sizeof line, "{\"op\":\"%s\",\"seq\":%u%s%s}", op, seq, *fields ? "," : "",
             fields);
    return send_line(line) ? seq : 0;
}

bool kiwi_link_next_line(char *line, size_t size)
{
    char *end = memchr(inbox, '\n', inbox_length);
    if (!end)
        return false;
    size_t length = (size_t)(end - inbox);
    size_t kept = length < size ? length : size - 1;
    memcpy(line, inbox, kept);
    line[kept] = '\0';
    inbox_length -= length + 1;
    memmove(inbox, end + 1, inbox_length);
    return true;
}

bool kiwi_link_fill(double timeout)
{
    if (link_fd < 0)
        return false;
    struct pollfd p = {.fd = link_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(timeout * 1000)) <= 0)
        return false;
    if (inbox_length == sizeof inbox) {
        kiwi_link_close("a line longer than the protocol allows");
        return false;
    }
    ssize_t n = recv(link_fd, inbox + inbox_length, sizeof inbox - inbox_length, 0);
    if (n <= 0) {
        kiwi_link_close(n == 0 ? "connection closed" : strerror(errno));
        return false;
    }
    inbox_length += (size_t)n;
    return true;
}

/* Waits up to timeout for the reply to seq (or, with seq 0, for a line whose op is op),
 * handing events that arrive first to on_event. The reply is left in line. */
static bool await_reply(const char *op, unsigned seq, char *line, size_t size, double timeout,
                        void (*on_event)(const char *line))
{
    double deadline = kiwi_now() + timeout;
    while (link_fd >= 0) {
        while (kiwi_link_next_line(line, size)) {
            char got[32] = "";
            double got_seq = -1;
            kiwi_json_string(line, "op", got, sizeof got);
            kiwi_json_number(line, "seq", &got_seq);
            if ((seq && got_seq == (double)seq) || (!seq && strcmp(got, op) == 0))
                return strcmp(got, op) == 0;
            on_event(line);
        }
        double left = deadline - kiwi_now();
        if (left <= 0)
            return false;
        kiwi_link_fill(left);
    }
    return false;
}

/* Position events (hello feature "position"): whether the latest welcome listed them. The
 * daemon writes compact JSON, "features":["position",...], and the list holds no brackets. */
static bool position_events;

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

bool kiwi_link_position_events(void)
{
    return position_events;
}

/* The memory feature (residency.c): whether the latest welcome listed it. */
static bool memory_feature;

bool kiwi_link_memory(void)
{
    return memory_feature && link_fd >= 0;
}

/* A daemon that predates the vmm evictor refuses it by name in register (an invalid value,
 * which leaves the connection open). */
static bool refused_vmm(const char *reply)
{
    char op[16] = "", code[16] = "", message[256] = "";
    kiwi_json_string(reply, "op", op, sizeof op);
    kiwi_json_string(reply, "code", code, sizeof code);
    kiwi_json_string(reply, "message", message, sizeof message);
    return strcmp(op, "error") == 0 && strcmp(code, "invalid") == 0 &&
           strstr(message, "evict") && strcmp(kiwi_evict_proposal(), "vmm") == 0;
}

bool kiwi_link_connect(uint64_t working_set, char *registered, size_t size,
                       void (*on_event)(const char *line))
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "%s", kiwi_cfg.socket_path);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return false;
    }
    link_fd = fd;
    inbox_length = 0;
    /* Asking for position events costs nothing on the hot path (the daemon coalesces them)
     * and lets the waiting line show the place in the queue without asking for the status. */
    send_line("{\"op\":\"hello\",\"version\":1,\"software\":\"kiwi-shim " KIWI_SHIM_VERSION
              "\",\"features\":[\"position\",\"memory\"]}");
    if (!await_reply("welcome", 0, registered, size, 5.0, on_event)) {
        kiwi_link_close("no welcome from the daemon");
        return false;
    }
    position_events = welcome_lists(registered, "position");
    memory_feature = welcome_lists(registered, "memory");
    char fields[2048];
    kiwi_registration_fields(fields, sizeof fields, working_set, false, memory_feature);
    unsigned seq = kiwi_link_request("register", fields);
    bool done = seq && await_reply("registered", seq, registered, size, 5.0, on_event);
    if (!done && link_fd >= 0 && refused_vmm(registered)) {
        kiwi_log("the daemon does not know the vmm evictor; registering as managed (this "
                 "process pages itself either way)");
        kiwi_registration_fields(fields, sizeof fields, working_set, true, memory_feature);
        seq = kiwi_link_request("register", fields);
        done = seq && await_reply("registered", seq, registered, size, 5.0, on_event);
    }
    if (!done) {
        kiwi_warn("the daemon did not register this process: %s",
                  link_fd >= 0 ? registered : "connection lost");
        kiwi_link_close("registration refused");
        return false;
    }
    return true;
}
