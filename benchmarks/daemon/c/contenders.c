/* The benchmarks' client harness: many Kiwi protocol clients in one process, none in Python.
 *
 * One process, one epoll loop, N connections, so 512 contenders cost the 2-core machine one
 * process rather than 512 interpreters, and the daemon under test is the only thing that grows.
 * It speaks protocol version 1 (docs/protocol.md) to whatever listens on the socket: the Kiwi
 * daemon, or the relay-ring floor (relay_ring.c) in the same run.
 *
 *   contenders SOCKET [options]             every contender waits all the time: each holds the
 *                                           GPU for --hold-us, releases and asks again at once
 *   contenders SOCKET --probe [options]     one client: acquire, release, pause, again
 *   contenders SOCKET --nvshare [options]   the contenders speak nvshare's scheduler protocol
 *                                           instead (github.com/grgalex/nvshare, src/comm.h):
 *                                           the same rounds against its C scheduler
 *
 * Options: --contenders N (2)  --idle K (0: registered connections that never ask)
 *          --handoffs H (2000) --warmup W (200) --seconds S (60: stop by then whatever H says)
 *          --hold-us U (20)    --requeue (release and ask again in one request)
 *          --server-pid P (read P's CPU time over the measured handoffs)
 *          --interval-us I (probe: pause between rounds, 1000)  --progress M (a line every M)
 *          --start-after-ms T (probe: connect and register, then wait T ms before the rounds)
 *          --setup-seconds D (30: exit 3 when hello or register is unanswered for D s)
 *          --wait-stdin (probe: once registered, start the rounds when a line comes on stdin)
 *          --samples (print every sample, ns, one a line)
 *          --wait-stdin (also for contenders: start asking when a line comes on stdin)
 *
 * Output, one fact a line, "key value": handoffs, seconds, server_cpu_s, p50_ns, p99_ns,
 * max_ns, stalled (probe rounds with no answer by the end), closed (probe: the server closed
 * it), requeue_unserved (releases with "requeue" that the server answered as plain releases),
 * grants (every grant the contenders read after the warmup, whoever released: a process with
 * one contender hands the GPU to other processes), then the samples if asked.
 * Times are CLOCK_MONOTONIC; a handoff is from just before the holder's release is written to
 * the moment the next holder has read its grant. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { IN_CAP = 1 << 16 };
enum state { IDLE, WAITING, HOLDING, RELEASING };
/* What a contender heard, in either protocol. */
enum heard { HEARD_GRANT, HEARD_DROP, HEARD_RELEASED, HEARD_ERROR, HEARD_OTHER };

/* nvshare's wire, as its src/comm.h describes it (1a8f211): every message is one packed record
 * of a fixed size, a type byte, the pod's name and namespace (254 bytes each, NUL-padded), a
 * 64-bit client id and 20 bytes of data. Its scheduler answers REGISTER with SCHED_ON (the id
 * it chose in data), REQ_LOCK with LOCK_OK once it is the client's turn, a quantum's end with
 * DROP_LOCK, and LOCK_RELEASED with nothing. It reads exactly one record per read, and takes a
 * short one for a dead client. */
enum { NV_REGISTER = 1, NV_SCHED_ON = 2, NV_REQ_LOCK = 4, NV_LOCK_OK = 5, NV_DROP_LOCK = 6,
       NV_LOCK_RELEASED = 7 };
enum { NV_NAME = 254, NV_ID_AT = 1 + 2 * NV_NAME, NV_RECORD = NV_ID_AT + 8 + 20 };
/* The protocol spoken: Kiwi's lines (0) or nvshare's records (1). */
static int nvshare;

struct conn {
    int fd;
    enum state state;
    unsigned seq;
    size_t len;
    char in[IN_CAP];
};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* How long the setup (hello, register) may wait for each answer; past it the harness exits 3. */
static long setup_seconds = 30;

static void die(const char *what) {
    fprintf(stderr, "contenders: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(2);
}

static void send_all(int fd, const char *data, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) { /* replies are tiny: the daemon reads them soon */
            struct timespec pause = {0, 50000};
            nanosleep(&pause, 0);
            continue;
        }
        if (w <= 0) die("write");
        data += w;
        n -= (size_t)w;
    }
}

/* Reads whatever has come; returns 0 when the peer closed. */
static int fill(struct conn *c) {
    if (c->len == IN_CAP) { errno = 0; die("a line longer than 64 KiB"); }
    ssize_t r = read(c->fd, c->in + c->len, IN_CAP - c->len);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return 1;
    if (r <= 0) return 0;
    c->len += (size_t)r;
    return 1;
}

/* The next whole line's "op" into op (NUL-ended), consuming the line; 0 when none is whole. */
static int next_op(struct conn *c, char *op, size_t cap, char *line, size_t line_cap) {
    char *nl = memchr(c->in, '\n', c->len);
    if (!nl) return 0;
    size_t n = (size_t)(nl - c->in) + 1;
    size_t keep = n < line_cap ? n : line_cap - 1;
    memcpy(line, c->in, keep);
    line[keep] = 0;
    memmove(c->in, c->in + n, c->len - n);
    c->len -= n;
    op[0] = 0;
    char *at = strstr(line, "\"op\":\"");
    if (at) {
        at += 6;
        size_t i = 0;
        while (at[i] && at[i] != '"' && i + 1 < cap) { op[i] = at[i]; i++; }
        op[i] = 0;
    }
    return 1;
}

/* The next whole nvshare record's type, consuming it; 0 when none is whole. */
static int next_record(struct conn *c) {
    if (c->len < NV_RECORD) return 0;
    int type = (unsigned char)c->in[0];
    memmove(c->in, c->in + NV_RECORD, c->len - NV_RECORD);
    c->len -= NV_RECORD;
    return type;
}

/* The next whole message, in the protocol spoken, consuming it; 0 when none is whole. An
 * error line is left in line, to be said. */
static int next_message(struct conn *c, enum heard *what, char *line, size_t line_cap) {
    if (nvshare) {
        int type = next_record(c);
        if (!type) return 0;
        *what = type == NV_LOCK_OK ? HEARD_GRANT : type == NV_DROP_LOCK ? HEARD_DROP
                : HEARD_OTHER;
        return 1;
    }
    char op[32];
    if (!next_op(c, op, sizeof op, line, line_cap)) return 0;
    *what = !strcmp(op, "grant") ? HEARD_GRANT : !strcmp(op, "drop") ? HEARD_DROP
            : !strcmp(op, "released") ? HEARD_RELEASED : !strcmp(op, "error") ? HEARD_ERROR
            : HEARD_OTHER;
    return 1;
}

/* Blocks for more of the setup's answer; past SO_RCVTIMEO the harness exits 3 (no answer). */
static void fill_setup(struct conn *c) {
    for (;;) {
        if (c->len == IN_CAP) { errno = 0; die("a line longer than 64 KiB"); }
        ssize_t r = read(c->fd, c->in + c->len, IN_CAP - c->len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) { errno = 0; exit(3); } /* SO_RCVTIMEO: no answer */
        if (r <= 0) { errno = 0; die("the server closed during setup"); }
        c->len += (size_t)r;
        return;
    }
}

static void expect(struct conn *c, const char *want) {
    char op[32], line[512];
    for (;;) {
        if (next_op(c, op, sizeof op, line, sizeof line)) {
            if (strcmp(op, want) == 0) return;
            if (strcmp(op, "error") == 0) { errno = 0; fprintf(stderr, "%s", line); die(want); }
            continue; /* an event before the reply: nothing the setup needs */
        }
        fill_setup(c);
    }
}

static void expect_record(struct conn *c, int want) {
    for (;;) {
        int type = next_record(c);
        if (type == want) return;
        if (!type) fill_setup(c);
    }
}

static void send_record(int fd, int type, const char *name) {
    char record[NV_RECORD] = {0};
    record[0] = (char)type;
    if (name) {
        strncpy(record + 1, name, NV_NAME - 1);
        strncpy(record + 1 + NV_NAME, "kiwi-bench", NV_NAME - 1);
    }
    send_all(fd, record, sizeof record);
}

static struct conn *open_client(const char *path, const char *name) {
    struct conn *c = calloc(1, sizeof *c);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!c) die("calloc");
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
    struct timeval patience = {setup_seconds, 0}, forever = {0, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    if (nvshare) {
        send_record(c->fd, NV_REGISTER, name);
        expect_record(c, NV_SCHED_ON);
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
        return c;
    }
    char hello[256];
    int n = snprintf(hello, sizeof hello,
                     "{\"op\":\"hello\",\"version\":1,\"software\":\"kiwi-bench\"}\n"
                     "{\"op\":\"register\",\"seq\":1,\"name\":\"%s\",\"kind\":\"client\"}\n", name);
    send_all(c->fd, hello, (size_t)n);
    c->seq = 1;
    expect(c, "welcome");
    expect(c, "registered");
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
    return c;
}

static void request(struct conn *c, const char *op, const char *extra) {
    char line[128];
    int n = snprintf(line, sizeof line, "{\"op\":\"%s\",\"seq\":%u%s}\n", op, ++c->seq, extra);
    send_all(c->fd, line, (size_t)n);
}

static void ask(struct conn *c) {
    if (nvshare) send_record(c->fd, NV_REQ_LOCK, 0);
    else request(c, "acquire", "");
}

/* The holder gives the GPU back and asks again at once, in one write (or, --requeue, in one
 * request). */
static void give_back_and_ask(struct conn *c, int requeue) {
    if (nvshare) {
        char both[2 * NV_RECORD] = {0};
        both[0] = NV_LOCK_RELEASED;
        both[NV_RECORD] = NV_REQ_LOCK;
        send_all(c->fd, both, sizeof both);
    } else if (requeue) {
        request(c, "release", ",\"requeue\":true");
    } else {
        char both[160];
        int k = snprintf(both, sizeof both,
                         "{\"op\":\"release\",\"seq\":%u}\n"
                         "{\"op\":\"acquire\",\"seq\":%u}\n", c->seq + 1, c->seq + 2);
        c->seq += 2;
        send_all(c->fd, both, (size_t)k);
    }
}

static int compare(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The server's CPU time: the sum of its threads' run time in ns from schedstat, which is
 * exact; utime + stime from stat (10 ms ticks) where schedstat is missing. */
static double cpu_seconds(long pid) {
    if (pid <= 0) return 0;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/task", pid);
    DIR *tasks = opendir(path);
    if (tasks) {
        double total = 0;
        int found = 0;
        struct dirent *t;
        while ((t = readdir(tasks))) {
            if (t->d_name[0] == '.') continue;
            char stat_path[320];
            unsigned long long ran = 0;
            snprintf(stat_path, sizeof stat_path, "/proc/%ld/task/%s/schedstat", pid, t->d_name);
            FILE *f = fopen(stat_path, "r");
            if (f && fscanf(f, "%llu", &ran) == 1) { total += (double)ran / 1e9; found = 1; }
            if (f) fclose(f);
        }
        closedir(tasks);
        if (found) return total;
    }
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long utime = 0, stime = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                     &utime, &stime) != 2)
        return 0;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

struct options {
    int contenders, idle, handoffs, warmup, hold_us, requeue, probe, interval_us, samples;
    int wait_stdin;
    long server_pid, progress, start_after_ms;
    double seconds;
};

static void report(const struct options *o, int64_t *samples, long n, double seconds,
                   double cpu, long stalled) {
    qsort(samples, (size_t)n, sizeof *samples, compare);
    printf("handoffs %ld\nseconds %.6f\nserver_cpu_s %.6f\nstalled %ld\n", n, seconds, cpu,
           stalled);
    if (n > 0) {
        long p50 = (n + 1) / 2 - 1, p99 = (long)((99 * n + 99) / 100) - 1;
        printf("p50_ns %lld\np99_ns %lld\nmax_ns %lld\n", (long long)samples[p50],
               (long long)samples[p99], (long long)samples[n - 1]);
    }
    if (o->samples)
        for (long i = 0; i < n; i++) printf("sample %lld\n", (long long)samples[i]);
    fflush(stdout);
}

/* One client, round after round: acquire until granted, release until released, pause. Each
 * sample is the whole round trip. A round still unanswered at the end counts as stalled. */
static int probe(const char *path, const struct options *o) {
    struct conn *c = open_client(path, "bench-probe");
    struct timespec before = {o->start_after_ms / 1000, (o->start_after_ms % 1000) * 1000000L};
    printf("registered 1\n"); /* for whoever waits on the probe being connected */
    fflush(stdout);
    nanosleep(&before, 0); /* connected first, as a kernel is before trouble starts */
    if (o->wait_stdin) { /* and its rounds start when whoever started it says so */
        char go[16];
        if (!fgets(go, sizeof go, stdin)) { errno = 0; die("stdin closed before the go"); }
    }
    int64_t *samples = calloc((size_t)o->handoffs, sizeof *samples);
    long n = 0, stalled = 0, closed = 0;
    /* rounds start until end; the last may finish within a grace, else it counts as stalled */
    int64_t start = now_ns(), end = start + (int64_t)(o->seconds * 1e9), grace = 2000000000;
    struct timespec pause = {o->interval_us / 1000000, (o->interval_us % 1000000) * 1000L};
    fcntl(c->fd, F_SETFL, O_NONBLOCK);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    char op[32], line[512];
    while (n < o->handoffs && now_ns() < end) {
        int64_t t0 = now_ns();
        request(c, "acquire", "");
        const char *wants[2] = {"grant", "released"};
        int done = 0;
        for (int step = 0; step < 2 && !done; step++) {
            int got = 0;
            while (!got) {
                while (next_op(c, op, sizeof op, line, sizeof line))
                    if (strcmp(op, wants[step]) == 0) { got = 1; break; }
                    else if (strcmp(op, "error") == 0) { errno = 0; die(line); }
                if (got) break;
                int64_t left = (end + grace - now_ns()) / 1000000;
                if (left <= 0) { stalled++; done = 1; break; }
                if (epoll_wait(ep, &ev, 1, (int)(left > 1000 ? 1000 : left)) > 0 && !fill(c)) {
                    closed = 1; /* the server died or threw the probe out: say so, stop */
                    stalled++;
                    done = 1;
                    break;
                }
            }
            if (got && step == 0) request(c, "release", "");
        }
        if (done) break;
        samples[n++] = now_ns() - t0;
        nanosleep(&pause, 0);
    }
    printf("closed %ld\n", closed);
    report(o, samples, n, (double)(now_ns() - start) / 1e9, 0, stalled);
    return 0;
}

static int contend(const char *path, const struct options *o) {
    int total = o->contenders + o->idle;
    struct conn **conns = calloc((size_t)total, sizeof *conns);
    char name[64];
    for (int i = 0; i < total; i++) {
        snprintf(name, sizeof name, i < o->contenders ? "bench-%d" : "idle-%d", i);
        conns[i] = open_client(path, name);
    }
    int ep = epoll_create1(0);
    for (int i = 0; i < o->contenders; i++) {
        fcntl(conns[i]->fd, F_SETFL, O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = conns[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, conns[i]->fd, &ev);
    }
    if (o->wait_stdin) { /* everyone registered; the rounds start when whoever started it says */
        printf("registered %d\n", total);
        fflush(stdout);
        char go[16];
        if (!fgets(go, sizeof go, stdin)) { errno = 0; die("stdin closed before the go"); }
    }
    long capacity = o->handoffs, n = 0, seen = 0, unserved = 0, grants = 0;
    int64_t *samples = calloc((size_t)capacity, sizeof *samples);
    int64_t released_at = 0, start = now_ns(), measured_from = 0;
    int64_t end = start + (int64_t)(o->seconds * 1e9);
    double cpu_from = 0;
    struct conn *releaser = 0;
    for (int i = 0; i < o->contenders; i++) {
        conns[i]->state = WAITING;
        ask(conns[i]);
    }
    struct epoll_event events[64];
    char line[512];
    enum heard what;
    while (n < capacity && now_ns() < end) {
        int ready = epoll_wait(ep, events, 64, 1000);
        if (ready < 0 && errno != EINTR) die("epoll_wait");
        for (int e = 0; e < ready && n < capacity; e++) {
            struct conn *c = events[e].data.ptr;
            if (!fill(c)) { errno = 0; die("the server closed a contender"); }
            while (next_message(c, &what, line, sizeof line)) {
                if (what == HEARD_ERROR) { errno = 0; die(line); }
                if (o->requeue && what == HEARD_RELEASED) {
                    /* a daemon that predates "requeue" only released: ask again apart */
                    ask(c);
                    unserved++;
                    continue;
                }
                if (what != HEARD_GRANT && what != HEARD_DROP) continue;
                if (what == HEARD_GRANT) {
                    int64_t t = now_ns();
                    if (t < end) grants++;
                    if (releaser && releaser != c && seen++ >= o->warmup) {
                        if (n == 0) { measured_from = released_at; cpu_from = cpu_seconds(o->server_pid); }
                        samples[n++] = t - released_at;
                        if (o->progress && n % o->progress == 0) {
                            printf("progress %ld %lld\n", n, (long long)t);
                            fflush(stdout);
                        }
                    }
                    c->state = HOLDING;
                    for (int64_t until = t + o->hold_us * 1000LL; now_ns() < until;) {
                    }
                } else if (c->state != HOLDING) {
                    continue; /* a drop that crossed our release on the wire */
                }
                releaser = c;
                released_at = now_ns();
                give_back_and_ask(c, o->requeue);
                c->state = WAITING;
                if (n >= capacity) break;
            }
        }
    }
    double cpu = cpu_seconds(o->server_pid) - cpu_from;
    double seconds = n ? (double)(now_ns() - measured_from) / 1e9 : 0;
    if (o->requeue) printf("requeue_unserved %ld\n", unserved);
    printf("grants %ld\n", grants);
    report(o, samples, n, seconds, o->server_pid > 0 ? cpu : 0, 0);
    return 0;
}

int main(int argc, char **argv) {
    struct options o = {.contenders = 2, .handoffs = 2000, .warmup = 200, .hold_us = 20,
                        .interval_us = 1000, .seconds = 60};
    if (argc < 2) { fprintf(stderr, "usage: contenders SOCKET [options]\n"); return 2; }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--requeue")) o.requeue = 1;
        else if (!strcmp(a, "--nvshare")) nvshare = 1;
        else if (!strcmp(a, "--probe")) o.probe = 1;
        else if (!strcmp(a, "--samples")) o.samples = 1;
        else if (!strcmp(a, "--wait-stdin")) o.wait_stdin = 1;
        else if (!strcmp(a, "--contenders")) o.contenders = atoi(v), i++;
        else if (!strcmp(a, "--idle")) o.idle = atoi(v), i++;
        else if (!strcmp(a, "--handoffs")) o.handoffs = atoi(v), i++;
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v), i++;
        else if (!strcmp(a, "--hold-us")) o.hold_us = atoi(v), i++;
        else if (!strcmp(a, "--interval-us")) o.interval_us = atoi(v), i++;
        else if (!strcmp(a, "--seconds")) o.seconds = atof(v), i++;
        else if (!strcmp(a, "--server-pid")) o.server_pid = atol(v), i++;
        else if (!strcmp(a, "--progress")) o.progress = atol(v), i++;
        else if (!strcmp(a, "--start-after-ms")) o.start_after_ms = atol(v), i++;
        else if (!strcmp(a, "--setup-seconds")) setup_seconds = atol(v), i++;
        else { fprintf(stderr, "contenders: unknown option %s\n", a); return 2; }
    }
    if (o.handoffs < 1 || o.contenders < 1) { fprintf(stderr, "contenders: nothing to do\n"); return 2; }
    if (nvshare && (o.probe || o.requeue)) {
        fprintf(stderr, "contenders: --nvshare runs contenders only (no --probe or --requeue)\n");
        return 2;
    }
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    return o.probe ? probe(argv[1], &o) : contend(argv[1], &o);
}
