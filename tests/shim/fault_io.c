/* Faults in the disk under the spill directory, for the disk tier's tests (test_spill.py):
 * preloaded first (before a sanitizer's runtime too), it takes pwrite and pread (the shim's
 * only transfers to spill files), makes them as system calls of its own, and for files under
 * FAULT_IO_DIR only follows FAULT_IO_PLAN, a comma-separated list of
 *
 *     write:N:ERROR    the Nth write fails with ERROR (ENOSPC or EIO)
 *     read:N:ERROR     the Nth read likewise
 *     read:N-M:corrupt reads N to M return their bytes with one flipped
 *     write:N:hang     the Nth write touches FAULT_IO_MARK and never returns (a kill -9 test)
 *
 * counting from 1, writes and reads apart, over the whole process. Never shipped: the tests
 * build it (test_spill.py's fault_io fixture).
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
#include <unistd.h>

/* The transfer itself, by system call: no dlsym, which the shim (and a sanitizer) replace, and
 * no symbol lookup that a sanitizer's interceptor could route past this library. */
static ssize_t real(long call, int fd, void *buffer, size_t size, off_t offset)
{
    return syscall(call, fd, buffer, size, offset);
}

static atomic_long writes, reads;

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
    long count = atomic_fetch_add(counter, 1) + 1;
    char planned_action[32];
    const char *action = planned(op, count, planned_action);
    if (!action)
        return real(call, fd, buffer, size, offset);
    if (strcmp(action, "ENOSPC") == 0 || strcmp(action, "EIO") == 0) {
        errno = strcmp(action, "EIO") == 0 ? EIO : ENOSPC;
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
