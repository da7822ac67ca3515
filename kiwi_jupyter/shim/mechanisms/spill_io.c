/* A stream of host memory to a spill file and back (spill.h).
 *
 * The stream is cut into blocks of KIWI_SPILL_BLOCK, block k at offset k * KIWI_SPILL_BLOCK of
 * the file. WORKERS threads take the blocks in turn (block k is worker k mod WORKERS's), so
 * that several writes or reads are in flight at once, as an NVMe disk needs to reach its speed.
 * Each worker gathers its block's bytes from the segments into an aligned buffer of its own
 * (direct I/O takes no other), unless one segment holds the whole block, aligned (the usual
 * case: shadows are huge-page aligned), which is transferred in place (where the kernel takes
 * the memory: the driver's own pinned memory may be refused with EFAULT); checksums them, and
 * writes the block padded to whole KIWI_SPILL_ALIGN; the way back reads the block, checks it
 * (a mismatch is read again, RETRIES times, then fails) and scatters it into the
 * segments that ask for it. The first failure stops every worker; the file is synced once all
 * blocks are written, and only then does the caller free the host memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spill.h"

#define WORKERS 4
#define RETRIES 2

struct job {
    struct kiwi_spill_file *file;
    const struct kiwi_spill_segment *segments;
    size_t count;
    bool writing;
    pthread_mutex_t lock;
    bool failed; /* under lock: the first failure's why is written, the others stop */
    char *why;
    size_t why_size;
};

struct worker {
    struct job *job;
    int index;
};

/* The first failure's reason: what failed (of block, when it names one) and the error. */
static void fail(struct job *job, const char *what, size_t block, int error)
{
    pthread_mutex_lock(&job->lock);
    if (!job->failed) {
        job->failed = true;
        snprintf(job->why, job->why_size, "%s block %zu of a spill file: %s", what, block,
                 strerror(error));
    }
    pthread_mutex_unlock(&job->lock);
}

static bool stopped(struct job *job)
{
    pthread_mutex_lock(&job->lock);
    bool failed = job->failed;
    pthread_mutex_unlock(&job->lock);
    return failed;
}

/* The first segment that ends after offset (count when none does). */
static size_t first_after(const struct job *job, uint64_t offset)
{
    size_t low = 0, high = job->count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        const struct kiwi_spill_segment *s = &job->segments[mid];
        if (s->offset + s->size <= offset)
            low = mid + 1;
        else
            high = mid;
    }
    return low;
}

/* Copies between the block at [start, start + length) of the stream and the segments that
 * overlap it; false when none does (a read skips such a block). */
static bool exchange(const struct job *job, unsigned char *block, uint64_t start, uint64_t length)
{
    bool any = false;
    for (size_t i = first_after(job, start); i < job->count; i++) {
        const struct kiwi_spill_segment *s = &job->segments[i];
        if (s->offset >= start + length)
            break;
        uint64_t from = s->offset > start ? s->offset : start;
        uint64_t to = s->offset + s->size < start + length ? s->offset + s->size : start + length;
        unsigned char *host = (unsigned char *)s->host + (from - s->offset);
        if (job->writing)
            memcpy(block + (from - start), host, to - from);
        else
            memcpy(host, block + (from - start), to - from);
        any = true;
    }
    return any;
}

/* Direct I/O wants whole aligned blocks: the last block is written with zeros after it. */
static uint64_t aligned_length(uint64_t length)
{
    return (length + KIWI_SPILL_ALIGN - 1) / KIWI_SPILL_ALIGN * KIWI_SPILL_ALIGN;
}

/* A filesystem may take O_DIRECT at open and refuse it at the first transfer: the file goes
 * on buffered (kiwi_spill_write syncs it), once, whichever thread finds it first. */
static pthread_mutex_t direct_lock = PTHREAD_MUTEX_INITIALIZER;

static bool direct_refused(struct kiwi_spill_file *file)
{
    pthread_mutex_lock(&direct_lock);
    bool retry = !file->direct; /* another thread made it buffered: once more */
    if (file->direct) {
        int flags = fcntl(file->fd, F_GETFL);
        retry = flags >= 0 && fcntl(file->fd, F_SETFL, flags & ~O_DIRECT) == 0;
        file->direct = false;
        if (retry)
            kiwi_log("spill files in %s: the filesystem refused a direct transfer; buffered "
                     "writes and fdatasync instead", kiwi_cfg.spill_dir);
    }
    pthread_mutex_unlock(&direct_lock);
    return retry;
}

/* The whole of [buffer, buffer + size) at offset, short transfers continued; 0 or an errno. */
static int transfer(struct kiwi_spill_file *file, bool writing, unsigned char *buffer,
                    uint64_t size, uint64_t offset)
{
    bool buffered_tried = false;
    for (uint64_t done = 0; done < size;) {
        ssize_t n = writing ? pwrite(file->fd, buffer + done, size - done, (off_t)(offset + done))
                            : pread(file->fd, buffer + done, size - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EINVAL && !buffered_tried) {
            buffered_tried = true;
            if (direct_refused(file))
                continue;
        }
        if (n < 0)
            return errno;
        if (n == 0)
            return writing ? ENOSPC : EIO; /* a read past the end: the file was cut */
        done += (uint64_t)n;
    }
    return 0;
}

/* The host memory of the block at [start, start + length) where one segment holds all of it,
 * aligned as direct I/O wants: transferred in place, without the staging copy; else NULL. */
static unsigned char *in_place(const struct job *job, uint64_t start, uint64_t length)
{
    size_t i = first_after(job, start);
    if (i == job->count || length != aligned_length(length))
        return NULL;
    const struct kiwi_spill_segment *s = &job->segments[i];
    unsigned char *host = (unsigned char *)s->host + (start - s->offset);
    bool whole = s->offset <= start && s->offset + s->size >= start + length;
    return whole && (uintptr_t)host % KIWI_SPILL_ALIGN == 0 ? host : NULL;
}

/* The stream's bytes in block k: KIWI_SPILL_BLOCK, the last block's fewer. */
static uint64_t block_length(const struct kiwi_spill_file *file, size_t k)
{
    uint64_t length = file->length - k * KIWI_SPILL_BLOCK;
    return length > KIWI_SPILL_BLOCK ? KIWI_SPILL_BLOCK : length;
}

static void write_block(struct job *job, unsigned char *buffer, size_t k)
{
    uint64_t start = k * KIWI_SPILL_BLOCK, length = block_length(job->file, k);
    uint64_t padded = aligned_length(length);
    unsigned char *host = in_place(job, start, length);
    if (!host) {
        exchange(job, buffer, start, length);
        memset(buffer + length, 0, padded - length);
    }
    job->file->checksums[k] = kiwi_crc32c(0, host ? host : buffer, length);
    int error = host ? transfer(job->file, job->writing, host, padded, start) : EFAULT;
    if (error == EFAULT && host) { /* the kernel refused the memory: staged */
        exchange(job, buffer, start, length);
        memset(buffer + length, 0, padded - length);
    }
    if (error == EFAULT)
        error = transfer(job->file, job->writing, buffer, padded, start);
    if (error)
        fail(job, "writing", k, error);
}

/* Reads block k (padded to whole KIWI_SPILL_ALIGN) into into, or where there is none or the
 * kernel refuses that memory for a direct read (EFAULT), into *bounce (an aligned block, made
 * when first needed); checks it against its checksum and reads it again, RETRIES times, when
 * it does not match. 0 or an errno (EBADMSG: it stayed corrupt); *landed: where it is. */
static int read_checked(struct kiwi_spill_file *file, size_t k, unsigned char *into,
                        unsigned char **bounce, unsigned char **landed)
{
    uint64_t start = k * KIWI_SPILL_BLOCK, length = block_length(file, k);
    unsigned char *at = into;
    for (int attempt = 0;; attempt++) {
        int error = at ? transfer(file, false, at, aligned_length(length), start) : EFAULT;
        if (error == EFAULT && (!at || at != *bounce)) { /* staged from now on */
            void *made = *bounce;
            if (!made && posix_memalign(&made, KIWI_SPILL_ALIGN, KIWI_SPILL_BLOCK) != 0)
                return ENOMEM;
            at = *bounce = made;
            error = transfer(file, false, at, aligned_length(length), start);
        }
        if (error)
            return error;
        if (kiwi_crc32c(0, at, length) == file->checksums[k]) {
            *landed = at;
            return 0;
        }
        if (attempt == RETRIES)
            return EBADMSG;
        kiwi_warn("block %zu of a spill file does not match its checksum; reading it again", k);
    }
}

/* What failed of a block's read, for fail's reason. */
static const char *read_failure(int error)
{
    return error == EBADMSG ? "a checksum mismatch, read three times, in" : "reading";
}

static void read_block(struct job *job, unsigned char *buffer, size_t k)
{
    uint64_t start = k * KIWI_SPILL_BLOCK, length = block_length(job->file, k);
    unsigned char *landed = NULL;
    int error = read_checked(job->file, k, in_place(job, start, length), &buffer, &landed);
    if (error)
        fail(job, read_failure(error), k, error);
    else if (landed == buffer)
        exchange(job, buffer, start, length);
}

/* A read needs only the blocks some segment overlaps. */
static bool wanted(const struct job *job, size_t k)
{
    size_t i = first_after(job, k * KIWI_SPILL_BLOCK);
    return i < job->count && job->segments[i].offset < (k + 1) * KIWI_SPILL_BLOCK;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct job *job = w->job;
    void *buffer = NULL;
    if (posix_memalign(&buffer, KIWI_SPILL_ALIGN, KIWI_SPILL_BLOCK) != 0) {
        fail(job, "no host memory to stage", (size_t)w->index, ENOMEM);
        return NULL;
    }
    for (size_t k = (size_t)w->index; k < job->file->block_count && !stopped(job);
         k += WORKERS) {
        if (job->writing)
            write_block(job, buffer, k);
        else if (wanted(job, k))
            read_block(job, buffer, k);
    }
    free(buffer);
    return NULL;
}

/* Runs the job on WORKERS threads (fewer for a short stream; the caller's own at least). */
static bool run(struct job *job)
{
    pthread_mutex_init(&job->lock, NULL);
    struct worker workers[WORKERS];
    pthread_t threads[WORKERS];
    bool started[WORKERS] = {false};
    size_t want = job->file->block_count < WORKERS ? job->file->block_count : WORKERS;
    for (size_t i = 0; i < WORKERS; i++) {
        workers[i] = (struct worker){job, (int)i};
        /* A thread that cannot be made leaves its blocks to the caller's thread, below. */
        started[i] = i > 0 && i < want &&
                     pthread_create(&threads[i], NULL, work, &workers[i]) == 0;
    }
    for (size_t i = 0; i < WORKERS; i++)
        if (!started[i] && (i == 0 || i < want))
            work(&workers[i]);
    for (size_t i = 0; i < WORKERS; i++)
        if (started[i])
            pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&job->lock);
    return !job->failed;
}

bool kiwi_spill_write(struct kiwi_spill_file *file, const struct kiwi_spill_segment *segments,
                      size_t count, char *why, size_t why_size)
{
    uint64_t length = count ? segments[count - 1].offset + segments[count - 1].size : 0;
    size_t blocks = (size_t)((length + KIWI_SPILL_BLOCK - 1) / KIWI_SPILL_BLOCK);
    free(file->checksums);
    file->checksums = blocks ? calloc(blocks, sizeof *file->checksums) : NULL;
    file->length = length;
    file->block_count = blocks;
    if (blocks && !file->checksums) {
        snprintf(why, why_size, "out of host memory for the spill file's checksums");
        return false;
    }
    struct job job = {.file = file, .segments = segments, .count = count, .writing = true,
                      .why = why, .why_size = why_size};
    if (!run(&job))
        return false;
    while (fdatasync(file->fd) != 0) {
        if (errno != EINTR) {
            snprintf(why, why_size, "syncing a spill file failed: %s", strerror(errno));
            return false;
        }
    }
    return true;
}

bool kiwi_spill_read(struct kiwi_spill_file *file, const struct kiwi_spill_segment *segments,
                     size_t count, char *why, size_t why_size)
{
    struct job job = {.file = file, .segments = segments, .count = count, .writing = false,
                      .why = why, .why_size = why_size};
    return run(&job);
}

bool kiwi_spill_read_block(struct kiwi_spill_file *file, size_t block, unsigned char *into,
                           unsigned char **bounce, char *why, size_t why_size)
{
    unsigned char *landed = NULL;
    int error = read_checked(file, block, into, bounce, &landed);
    if (error)
        snprintf(why, why_size, "%s block %zu of a spill file: %s", read_failure(error), block,
                 strerror(error));
    else if (landed != into)
        memcpy(into, landed, block_length(file, block));
    return !error;
}
