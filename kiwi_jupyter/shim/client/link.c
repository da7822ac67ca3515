/* The connection to the daemon: a Unix socket speaking docs/protocol.md, one JSON object per
 * line. Only the comm thread calls these. The link carries lines and knows nothing of what
 * they mean: what to say (hello, register, the requests) is session.c's, which hands its lines
 * to kiwi_link_send, and a lost connection is told to outage.c.
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

bool kiwi_link_up(struct kiwi_client *c)
{
    return c->link.fd >= 0;
}

int kiwi_link_fd(struct kiwi_client *c)
{
    return c->link.fd;
}

void kiwi_link_close(struct kiwi_client *c, const char *why)
{
    if (c->link.fd < 0)
        return;
    close(c->link.fd);
    c->link.fd = -1;
    c->link.inbox_length = 0;
    kiwi_comm_link_lost(c, why);
}

void kiwi_link_after_fork(struct kiwi_client *c)
{
    /* The child's copy of the socket is the parent's connection: close it without a word. */
    if (c->link.fd >= 0)
        close(c->link.fd);
    c->link.fd = -1;
    c->link.inbox_length = 0;
}

bool kiwi_link_send(struct kiwi_client *c, const char *line)
{
    if (c->link.fd < 0)
        return false;
    kiwi_log("-> %s", line);
    char framed[2400];
    int n = snprintf(framed, sizeof framed, "%s\n", line);
    if (n < 0 || (size_t)n >= sizeof framed)
        return false;
    for (size_t sent = 0; sent < (size_t)n;) {
        /* MSG_NOSIGNAL: a daemon gone away must not SIGPIPE the notebook kernel. */
        ssize_t k = send(c->link.fd, framed + sent, (size_t)n - sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            kiwi_link_close(c, strerror(errno));
            return false;
        }
        sent += (size_t)k;
    }
    return true;
}

bool kiwi_link_next_line(struct kiwi_client *c, char *line, size_t size)
{
    char *end = memchr(c->link.inbox, '\n', c->link.inbox_length);
    if (!end)
        return false;
    size_t length = (size_t)(end - c->link.inbox);
    size_t kept = length < size ? length : size - 1;
    memcpy(line, c->link.inbox, kept);
    line[kept] = '\0';
    c->link.inbox_length -= length + 1;
    memmove(c->link.inbox, end + 1, c->link.inbox_length);
    return true;
}

bool kiwi_link_fill(struct kiwi_client *c, double timeout)
{
    if (c->link.fd < 0)
        return false;
    struct pollfd p = {.fd = c->link.fd, .events = POLLIN};
    if (poll(&p, 1, (int)(timeout * 1000)) <= 0)
        return false;
    if (c->link.inbox_length == sizeof c->link.inbox) {
        kiwi_link_close(c, "a line longer than the protocol allows");
        return false;
    }
    size_t room = sizeof c->link.inbox - c->link.inbox_length;
    ssize_t n = recv(c->link.fd, c->link.inbox + c->link.inbox_length, room, 0);
    if (n <= 0) {
        kiwi_link_close(c, n == 0 ? "connection closed" : strerror(errno));
        return false;
    }
    c->link.inbox_length += (size_t)n;
    return true;
}

bool kiwi_link_open(struct kiwi_client *c)
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
    c->link.fd = fd;
    c->link.inbox_length = 0;
    return true;
}
