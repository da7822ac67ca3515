/* The disk tier's files, for any evictor (vmm_spill.c is the vmm evictor's use of them):
 *
 *   spill_files.c  the uid's own directory under KIWI_SPILL_DIR (made 0700; one that is not
 *                  the uid's, or that others may write, is refused), a file in it that has no
 *                  name (O_TMPFILE; else made 0600 and unlinked at once), so that nothing of it
 *                  remains after the process ends however it ends, and each block's checksum
 *   spill_io.c     a stream of host memory written to one file and read back, in large aligned
 *                  blocks by a few threads at once, each block checksummed (CRC32C) on the way
 *                  out and checked on the way back; or one block at a time, into memory
 *                  of the caller's (a restore's staging ring)
 *
 * A spill file holds one stream: segments of host memory laid end to end from offset 0, cut
 * into blocks of KIWI_SPILL_BLOCK; a reader asks for any of the segments back by their offsets.
 */
#ifndef KIWI_SPILL_H
#define KIWI_SPILL_H

#include "../shim.h"

/* Large enough that a direct write reaches an NVMe disk's speed, small enough that a few
 * threads' staging buffers cost little host memory. */
#define KIWI_SPILL_BLOCK ((uint64_t)4 << 20)
/* Direct I/O wants buffers, offsets and lengths in whole logical blocks: 4 KiB covers them. */
#define KIWI_SPILL_ALIGN ((uint64_t)4096)

struct kiwi_spill_segment {
    void *host;
    uint64_t offset; /* in the file's stream */
    uint64_t size;
};

struct kiwi_spill_file {
    int fd;
    bool direct;          /* O_DIRECT: writes bypass the page cache */
    uint64_t length;      /* of the stream written */
    uint32_t *checksums;  /* one per block */
    size_t block_count;
    size_t holders;       /* what still has bytes in it; closed at 0 */
};

/* ---- spill_files.c ---------------------------------------------------------------------- */

/* A new spill file of no name in the uid's directory, held once; NULL with *why (a reason a
 * person can act on) when the directory cannot be made, is unsafe, or takes no file. */
struct kiwi_spill_file *kiwi_spill_create(char *why, size_t why_size);
/* One more holder; one fewer, and at none the file is closed (its blocks go back to the
 * filesystem at once: it has no name). */
void kiwi_spill_hold(struct kiwi_spill_file *file);
void kiwi_spill_release(struct kiwi_spill_file *file);
/* CRC32C (Castagnoli) of size bytes, continuing crc (0 to start). */
uint32_t kiwi_crc32c(uint32_t crc, const void *bytes, size_t size);

/* ---- spill_io.c -------------------------------------------------------------------------- */

/* Writes segments (in stream order, laid end to end from 0) to file and syncs it; false with
 * *why when a write or the sync failed (the host memory is untouched either way). */
bool kiwi_spill_write(struct kiwi_spill_file *file, const struct kiwi_spill_segment *segments,
                      size_t count, char *why, size_t why_size);
/* Reads segments (in stream order, any of those written) back into their host memory, each
 * block checked against its checksum and read again when it does not match; false with *why
 * when a read failed or a block stayed corrupt (what was read in may be partial). */
bool kiwi_spill_read(struct kiwi_spill_file *file, const struct kiwi_spill_segment *segments,
                     size_t count, char *why, size_t why_size);
/* Reads block (of KIWI_SPILL_BLOCK) of the stream into into (aligned to KIWI_SPILL_ALIGN, room
 * for a whole block), checked and read again as above; false with *why when it could not be.
 * Where the kernel refuses into's memory for a direct read, through *bounce (an aligned block,
 * made at the first need, the caller's to keep or free). Any thread, several at once (a restore
 * from disk, vmm_staging.c). */
bool kiwi_spill_read_block(struct kiwi_spill_file *file, size_t block, unsigned char *into,
                           unsigned char **bounce, char *why, size_t why_size);

#endif
