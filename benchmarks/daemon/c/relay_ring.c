/* The floor for the daemon's handoff: the least a lock server on a Unix socket can do.
 *
 *   relay_ring SOCKET
 *
 * One epoll loop in C. It speaks just enough of protocol version 1 for contenders.c: hello,
 * register, acquire, release (and release with "requeue"), ping; one holder at a time, and on
 * release the token passes to the next waiter in a ring (first come, first served). The same
 * lines go over the same kind of socket as with the Kiwi daemon, so what the daemon adds over
 * this is the cost of being the daemon: parsing, checks, pools, priorities, quanta, status.
 * It stops on SIGTERM or SIGINT. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { MAX_CONNS = 1 << 16, IN_CAP = 1 << 16, OUT_CAP = 1 << 16 };

struct conn {
    int fd, waiting;
    size_t in_len, out_len;
    char in[IN_CAP], out[OUT_CAP];
};

static struct conn *conns[MAX_CONNS];
static int ring[MAX_CONNS], head, count, holder = -1, ep;
static volatile sig_atomic_t stopping;

static void on_signal(int sig) { (void)sig; stopping = 1; }

static void flush(int fd) {
    struct conn *c = conns[fd];
    while (c->out_len > 0) {
        ssize_t w = write(fd, c->out, c->out_len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* EAGAIN: EPOLLOUT finishes it; an error: the read side sees it */
        memmove(c->out, c->out + w, c->out_len - (size_t)w);
        c->out_len -= (size_t)w;
    }
    struct epoll_event ev = {.events = EPOLLIN | (c->out_len ? EPOLLOUT : 0), .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

static void say(int fd, const char *line, long seq) {
    struct conn *c = conns[fd];
    char tail[48] = "}\n";
    if (seq >= 0) snprintf(tail, sizeof tail, ",\"seq\":%ld}\n", seq);
    int n = snprintf(c->out + c->out_len, OUT_CAP - c->out_len, "%s%s", line, tail);
    if (n > 0 && (size_t)n < OUT_CAP - c->out_len) c->out_len += (size_t)n;
}

static void grant(int fd, long seq) {
    holder = fd;
    say(fd, "{\"op\":\"grant\",\"gpu\":0,\"quantum\":30.0", seq);
}

static void leave_ring(int fd) {
    for (int i = 0; i < count; i++)
        if (ring[(head + i) % MAX_CONNS] == fd) {
            for (int j = i; j + 1 < count; j++)
                ring[(head + j) % MAX_CONNS] = ring[(head + j + 1) % MAX_CONNS];
            count--;
            break;
        }
    conns[fd]->waiting = 0;
}

/* The holder is gone: the token passes on, and the next holder hears it before anyone else. */
static void pass_on(void) {
    holder = -1;
    if (count == 0) return;
    int next = ring[head];
    head = (head + 1) % MAX_CONNS;
    count--;
    conns[next]->waiting = 0;
    grant(next, -1);
    flush(next);
}

static void acquire(int fd, long seq) {
    if (holder < 0) { grant(fd, seq); return; }
    if (holder == fd || conns[fd]->waiting) { say(fd, "{\"op\":\"waiting\",\"position\":1", seq); return; }
    ring[(head + count) % MAX_CONNS] = fd;
    count++;
    conns[fd]->waiting = 1;
    char line[64];
    snprintf(line, sizeof line, "{\"op\":\"waiting\",\"position\":%d", count);
    say(fd, line, seq);
}

static void handle(int fd, char *line) {
    char *at = strstr(line, "\"op\":\"");
    char *s = strstr(line, "\"seq\":");
    long seq = s ? strtol(s + 6, 0, 10) : -1;
    if (!at) { say(fd, "{\"op\":\"error\",\"code\":\"malformed\",\"message\":\"no op\"", seq); return; }
    at += 6;
    if (!strncmp(at, "hello\"", 6)) {
        say(fd, "{\"op\":\"welcome\",\"version\":1,\"daemon\":\"relay-ring\",\"mode\":\"on\",\"tq\":30.0", -1);
    } else if (!strncmp(at, "register\"", 9)) {
        char reply[96];
        snprintf(reply, sizeof reply, "{\"op\":\"registered\",\"client\":\"c%d\",\"gpu\":0", fd);
        say(fd, reply, seq);
    } else if (!strncmp(at, "acquire\"", 8)) {
        acquire(fd, seq);
    } else if (!strncmp(at, "release\"", 8)) {
        if (holder == fd) pass_on();
        else if (conns[fd]->waiting) leave_ring(fd);
        if (strstr(line, "\"requeue\":true")) acquire(fd, seq);
        else say(fd, "{\"op\":\"released\",\"evict\":false", seq);
    } else if (!strncmp(at, "ping\"", 5)) {
        say(fd, "{\"op\":\"pong\"", seq);
    } else {
        say(fd, "{\"op\":\"error\",\"code\":\"unknown_op\",\"message\":\"not served by the floor\"", seq);
    }
}

static void drop(int fd) {
    if (conns[fd]->waiting) leave_ring(fd);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, 0);
    close(fd);
    free(conns[fd]);
    conns[fd] = 0;
    if (holder == fd) pass_on();
}

static void readable(int fd) {
    struct conn *c = conns[fd];
    for (;;) {
        ssize_t r = read(fd, c->in + c->in_len, IN_CAP - c->in_len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) break;
        if (r <= 0) { drop(fd); return; }
        c->in_len += (size_t)r;
        char *start = c->in, *nl;
        while ((nl = memchr(start, '\n', c->in_len - (size_t)(start - c->in)))) {
            *nl = 0;
            handle(fd, start);
            start = nl + 1;
        }
        c->in_len -= (size_t)(start - c->in);
        memmove(c->in, start, c->in_len);
        if (c->in_len == IN_CAP) { drop(fd); return; } /* a line longer than the buffer */
    }
    flush(fd);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: relay_ring SOCKET\n"); return 2; }
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, argv[1], sizeof addr.sun_path - 1);
    unlink(argv[1]);
    int server = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (server < 0 || bind(server, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        listen(server, 4096) < 0) {
        perror("relay_ring");
        return 2;
    }
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = server};
    epoll_ctl(ep, EPOLL_CTL_ADD, server, &ev);
    struct epoll_event events[256];
    while (!stopping) {
        int n = epoll_wait(ep, events, 256, 200);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == server) {
                int client;
                while ((client = accept4(server, 0, 0, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    if (client >= MAX_CONNS || !(conns[client] = calloc(1, sizeof **conns))) {
                        close(client);
                        continue;
                    }
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = client};
                    epoll_ctl(ep, EPOLL_CTL_ADD, client, &cev);
                }
            } else if (conns[fd]) {
                if (events[i].events & EPOLLOUT) flush(fd);
                if (conns[fd] && events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readable(fd);
            }
        }
    }
    unlink(argv[1]);
    return 0;
}
