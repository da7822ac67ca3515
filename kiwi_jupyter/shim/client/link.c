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

static int link_fd = -1;
static char inbox[65536]; /* daemon lines other than status are under 1 KiB */
static size_t inbox_length;

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

bool kiwi_link_send(const char *line)
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

bool kiwi_link_open(void)
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
    return true;
}
