/* The disk tier's directory and files (spill.h).
 *
 * Spill files hold a kernel's memory: other users must not read them, and nothing may outlive
 * the kernel. So they go in a directory of the uid's own, KIWI_SPILL_DIR/uid-<uid>, made 0700;
 * an existing one is used only when it is a directory (not a link), owned by this uid, that
 * neither its group nor others may write: another user who made it first could otherwise read
 * or swap the files. Each file is made without a name (O_TMPFILE), so it is gone with its last
 * descriptor: at exit, at kill -9, and after a node restart there is nothing to clean. Where the
 * filesystem has no O_TMPFILE, the file is made 0600 under a fresh name and unlinked at once.
 *
 * Direct I/O (O_DIRECT) is asked for: a spill of tens of GiB through the page cache would push
 * out the page cache of everyone on the node and count against the pod's memory until written
 * back, the very host memory the spill frees. A filesystem that refuses it (tmpfs, some network
 * ones) gets buffered writes and fdatasync; the log says which.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spill.h"

static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static bool said_how; /* the log said direct or buffered once */

/* The uid's directory, opened; -1 with *why. */
static int open_directory(char *why, size_t why_size)
{
    const char *top = kiwi_cfg.spill_dir;
    /* Others' kernels make their own directories here: the top one is everyone's, as /var/tmp
     * is (sticky: nobody removes another's). An existing one keeps its mode. */
    if (mkdir(top, 01777) == 0)
        chmod(top, 01777); /* the umask narrowed it */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/uid-%u", top, (unsigned)geteuid());
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        snprintf(why, why_size, "cannot make the spill directory %s: %s", path, strerror(errno));
        return -1;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_size, "cannot open the spill directory %s: %s%s", path,
                 strerror(errno), errno == ELOOP || errno == ENOTDIR ? " (not a directory)" : "");
        return -1;
    }
    struct stat st;
    const char *unsafe = fstat(fd, &st) != 0        ? "it cannot be read"
                         : st.st_uid != geteuid()   ? "another user owns it"
                         : (st.st_mode & 022) != 0  ? "its group or others may write in it"
                                                    : NULL;
    if (unsafe) {
        snprintf(why, why_size, "the spill directory %s is unsafe: %s; remove it or set "
                 "KIWI_SPILL_DIR elsewhere", path, unsafe);
        close(fd);
        return -1;
    }
    return fd;
}

/* A file of no name in directory, direct where the filesystem takes it; -1 with errno. */
static int open_unnamed(int directory, bool *direct)
{
    const int flags = O_RDWR | O_CLOEXEC;
    for (int attempt = 0; attempt < 2; attempt++) {
        *direct = attempt == 0;
        int fd = openat(directory, ".", O_TMPFILE | flags | (*direct ? O_DIRECT : 0), 0600);
        if (fd >= 0)
            return fd;
    }
    /* No O_TMPFILE here: a fresh name, never an existing file's, and gone at once. */
    static unsigned serial;
    for (int attempt = 0; attempt < 4; attempt++) {
        char name[64];
        snprintf(name, sizeof name, "spill-%d-%u-%d", (int)getpid(), serial++, attempt);
        *direct = attempt % 2 == 0;
        int fd = openat(directory, name, O_CREAT | O_EXCL | O_NOFOLLOW | flags |
                        (*direct ? O_DIRECT : 0), 0600);
        if (fd >= 0) {
            unlinkat(directory, name, 0);
            return fd;
        }
        if (errno == EEXIST)
            attempt--; /* another's, left by a crash between the two calls: try another name */
    }
    return -1;
}

struct kiwi_spill_file *kiwi_spill_create(char *why, size_t why_size)
{
    pthread_mutex_lock(&files_lock);
    int directory = open_directory(why, why_size);
    bool direct = false;
    int fd = directory < 0 ? -1 : open_unnamed(directory, &direct);
    if (directory >= 0 && fd < 0)
        snprintf(why, why_size, "cannot make a spill file in %s/uid-%u: %s", kiwi_cfg.spill_dir,
                 (unsigned)geteuid(), strerror(errno));
    if (directory >= 0)
        close(directory);
    if (fd >= 0 && !said_how) {
        said_how = true;
        kiwi_log("spill files in %s: %s", kiwi_cfg.spill_dir,
                 direct ? "direct I/O" : "buffered writes and fdatasync (the filesystem refuses "
                                         "O_DIRECT)");
    }
    pthread_mutex_unlock(&files_lock);
    if (fd < 0)
        return NULL;
    struct kiwi_spill_file *file = calloc(1, sizeof *file);
    if (!file) {
        close(fd);
        snprintf(why, why_size, "out of host memory");
        return NULL;
    }
    *file = (struct kiwi_spill_file){.fd = fd, .direct = direct, .holders = 1};
    return file;
}

void kiwi_spill_hold(struct kiwi_spill_file *file)
{
    pthread_mutex_lock(&files_lock);
    file->holders++;
    pthread_mutex_unlock(&files_lock);
}

void kiwi_spill_release(struct kiwi_spill_file *file)
{
    pthread_mutex_lock(&files_lock);
    bool last = --file->holders == 0;
    pthread_mutex_unlock(&files_lock);
    if (!last)
        return;
    close(file->fd);
    free(file->checksums);
    free(file);
}

/* ---- CRC32C ------------------------------------------------------------------------------- */

/* The Castagnoli polynomial, reflected. Where the CPU has SSE 4.2 its crc32 instruction
 * computes the same eight bytes at a time, fast enough to stay out of a disk's way. */
#define CASTAGNOLI 0x82F63B78u

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? (crc >> 1) ^ CASTAGNOLI : crc >> 1;
        table[n] = crc;
    }
}

static uint32_t by_table(uint32_t crc, const unsigned char *p, size_t size)
{
    pthread_once(&table_once, make_table);
    while (size--)
        crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t by_instruction(uint32_t crc,
                                                                 const unsigned char *p,
                                                                 size_t size)
{
    uint64_t wide = crc;
    for (; size >= 8; p += 8, size -= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof word);
        wide = __builtin_ia32_crc32di(wide, word);
    }
    crc = (uint32_t)wide;
    for (; size; p++, size--)
        crc = __builtin_ia32_crc32qi(crc, *p);
    return crc;
}
#endif

uint32_t kiwi_crc32c(uint32_t crc, const void *bytes, size_t size)
{
    crc = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return ~by_instruction(crc, bytes, size);
#endif
    return ~by_table(crc, bytes, size);
}
