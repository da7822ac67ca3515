/* Faults in the disk under the spill directory, for the disk tier's tests (test_spill.py):
 * preloaded first (before a sanitizer's runtime too), it takes pwrite and pread (the shim's
 * only transfers to spill files), makes them as system calls of its own, and for files under
 * FAULT_IO_DIR only follows FAULT_IO_PLAN, a comma-separated list of
 *
 *     write:N:ERROR    the Nth write fails with ERROR (ENOSPC or EIO)
 *     read:N:ERROR     the Nth read likewise (or EFAULT: the kernel refused the memory, as
 *                      it may the driver's own pinned memory for a direct transfer)
 *     read:N-M:corrupt reads N to M return their bytes with one flipped
 *     write:N:hang     the Nth write touches FAULT_IO_MARK and never returns (a kill -9 test;
 *                      read:N:hang likewise)
 *     read:N-M:delay:MS reads N to M take MS milliseconds more (a slow disk)
 *
 * counting from 1, writes and reads apart, over the whole process. With FAULT_IO_LOG naming a
 * file, each transfer there appends a line "pread offset=O bytes=B start=S end=E" (or pwrite;
 * S and E in ns of CLOCK_MONOTONIC, the clock of the fake driver's link lines), so a test can
 * line the disk up against the link. Never shipped: the tests build it (test_spill.py's
 * fault_io fixture).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* The transfer itself, by system call: no dlsym, which the shim (and a sanitizer) replace, and
 * no symbol lookup that a sanitizer's interceptor could route past this library. */
static ssize_t real(long call, int fd, void *buffer, size_t size, off_t offset)
{
    return syscall(call, fd, buffer, size, offset);
}

static atomic_long writes, reads;

static long long monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* One line for a transfer that ran from start to now, in one write (threads append at once). */
static void log_transfer(long call, off_t offset, ssize_t n, long long start)
{
    const char *path = getenv("FAULT_IO_LOG");
    if (!path || !*path)
        return;
    char line[160];
    int length = snprintf(line, sizeof line, "%s offset=%lld bytes=%zd start=%lld end=%lld\n",
                          call == SYS_pread64 ? "pread" : "pwrite", (long long)offset, n, start,
                          monotonic_ns());
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t written = write(fd, line, (size_t)length);
    (void)written; /* a lost line fails the test that reads it, not this transfer */
    close(fd);
}

/* Whether fd is a file under FAULT_IO_DIR (an unnamed one reads "<dir>/#123 (deleted)"). */
static int under_dir(int fd)
{
    const char *dir = getenv("FAULT_IO_DIR");
    if (!dir || !*dir)
        return 0;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0)
        return 0;
    target[n] = '\0';
    return strncmp(target, dir, strlen(dir)) == 0;
}

/* The plan's action for the count-th call of op, in action[32]: NULL for none. */
static const char *planned(const char *op, long count, char *action)
{
    const char *plan = getenv("FAULT_IO_PLAN");
    for (const char *p = plan; p && *p;) {
        char entry[64];
        size_t len = strcspn(p, ",");
        snprintf(entry, sizeof entry, "%.*s", (int)(len < sizeof entry ? len : sizeof entry - 1),
                 p);
        p += len + (p[len] == ',');
        char kind[16];
        long from, to;
        int used = 0;
        if (sscanf(entry, "%15[a-z]:%ld-%ld:%31s%n", kind, &from, &to, action, &used) == 4 ||
            (sscanf(entry, "%15[a-z]:%ld:%31s%n", kind, &from, action, &used) == 3 &&
             (to = from, 1))) {
            if (strcmp(kind, op) == 0 && count >= from && count <= to)
                return action;
        }
    }
    return NULL;
}

static ssize_t faulty(const char *op, atomic_long *counter, long call, int fd,
                      void *buffer, size_t size, off_t offset)
{
    if (!under_dir(fd))
        return real(call, fd, buffer, size, offset);
    long long start = monotonic_ns();
    long count = atomic_fetch_add(counter, 1) + 1;
    char planned_action[32];
    const char *action = planned(op, count, planned_action);
    long delay_ms = 0;
    if (action && sscanf(action, "delay:%ld", &delay_ms) == 1) {
        struct timespec pause = {delay_ms / 1000, delay_ms % 1000 * 1000000L};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
            ;
        action = NULL;
    }
    if (!action) {
        ssize_t n = real(call, fd, buffer, size, offset);
        int error = errno;
        log_transfer(call, offset, n, start);
        errno = error;
        return n;
    }
    if (strcmp(action, "ENOSPC") == 0 || strcmp(action, "EIO") == 0 ||
        strcmp(action, "EFAULT") == 0) {
        errno = strcmp(action, "EIO") == 0 ? EIO : strcmp(action, "EFAULT") == 0 ? EFAULT : ENOSPC;
        return -1;
    }
    if (strcmp(action, "hang") == 0) {
        const char *mark = getenv("FAULT_IO_MARK");
        int made = mark ? open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600) : -1;
        if (made >= 0)
            close(made);
        for (;;)
            pause();
    }
    ssize_t n = real(call, fd, buffer, size, offset);
    if (strcmp(action, "corrupt") == 0 && n > 0)
        ((unsigned char *)buffer)[n / 2] ^= 0x5A;
    return n;
}

ssize_t pwrite(int fd, const void *buffer, size_t size, off_t offset)
{
    return faulty("write", &writes, SYS_pwrite64, fd, (void *)buffer, size, offset);
}

ssize_t pwrite64(int fd, const void *buffer, size_t size, off_t offset)
{
    return faulty("write", &writes, SYS_pwrite64, fd, (void *)buffer, size, offset);
}

ssize_t pread(int fd, void *buffer, size_t size, off_t offset)
{
    return faulty("read", &reads, SYS_pread64, fd, buffer, size, offset);
}

ssize_t pread64(int fd, void *buffer, size_t size, off_t offset)
{
    return faulty("read", &reads, SYS_pread64, fd, buffer, size, offset);
}
