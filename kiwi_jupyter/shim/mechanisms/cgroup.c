/* The process's own memory limit, as its cgroup sets it: what the vmm evictor's pinning must
 * never take it past (issue 39, defect 2c). Pinned pages are the process's, charged to its
 * cgroup like any other; a pod whose limit is below its RSS plus its pinned shadows is killed
 * by the kernel's OOM killer, by its own doing.
 *
 * cgroup v2: /proc/self/cgroup has one line "0::<path>", and /sys/fs/cgroup/<path> holds
 * memory.max ("max" when unlimited) and memory.current; every ancestor's limit binds too, so the
 * room is the least, up the tree, of max - current. cgroup v1: the line naming the memory
 * controller ("<n>:memory:<path>", or a list with memory in it), and under
 * /sys/fs/cgroup/memory/<path> memory.limit_in_bytes (a huge number when unlimited) and
 * memory.usage_in_bytes. Inside a container the path is "/" (a cgroup namespace) and the files
 * are the container's. KIWI_CGROUP_DIR names one directory to read instead, v2's or v1's file
 * names (the tests' fake cgroup); nothing above it is read then.
 *
 * The files are read each time the room is asked for: the limit can change (a pod resized in
 * place) and what the process uses does all the time.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shim.h"

#define ROOT "/sys/fs/cgroup"
/* A v1 limit this large means none (the kernel writes PAGE_COUNTER_MAX in bytes). */
#define UNLIMITED_V1 ((uint64_t)1 << 62)

/* The number in directory/name; false when the file is missing, unreadable or says "max". */
static bool read_number(const char *directory, const char *name, uint64_t *value)
{
    char path[512], text[32] = "";
    snprintf(path, sizeof path, "%s/%s", directory, name);
    FILE *file = fopen(path, "re");
    if (!file)
        return false;
    bool read = fgets(text, sizeof text, file) != NULL;
    fclose(file);
    char *end = NULL;
    unsigned long long number = read ? strtoull(text, &end, 10) : 0;
    if (!read || end == text)
        return false;
    *value = number;
    return true;
}

/* One directory's limit and use, in either version's file names; false when it has no limit. */
static bool limit_in(const char *directory, uint64_t *limit, uint64_t *used)
{
    if (read_number(directory, "memory.max", limit))
        return read_number(directory, "memory.current", used);
    return read_number(directory, "memory.limit_in_bytes", limit) && *limit < UNLIMITED_V1 &&
           read_number(directory, "memory.usage_in_bytes", used);
}

/* The process's cgroup directory for the memory controller, from /proc/self/cgroup. */
static bool own_directory(char *directory, size_t size)
{
    FILE *file = fopen("/proc/self/cgroup", "re");
    if (!file)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, file)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':'), *path = controllers ? strchr(controllers + 1, ':')
                                                                   : NULL;
        if (!path)
            continue;
        *path++ = '\0';
        controllers++;
        if (!*controllers) { /* v2, unified */
            found = snprintf(directory, size, "%s%s", ROOT, path) < (int)size;
            continue;
        }
        for (char *save = NULL, *name = strtok_r(controllers, ",", &save); name && !found;
             name = strtok_r(NULL, ",", &save))
            if (strcmp(name, "memory") == 0)
                found = snprintf(directory, size, "%s/memory%s", ROOT, path) < (int)size;
    }
    fclose(file);
    return found;
}

bool kiwi_cgroup_room(uint64_t *room, uint64_t *limit)
{
    kiwi_init();
    char directory[512];
    bool fixed = kiwi_cfg.cgroup_dir[0] != '\0';
    if (fixed)
        snprintf(directory, sizeof directory, "%s", kiwi_cfg.cgroup_dir);
    else if (!own_directory(directory, sizeof directory))
        return false;
    bool limited = false;
    for (;;) {
        uint64_t max = 0, used = 0;
        if (limit_in(directory, &max, &used)) {
            uint64_t here = used < max ? max - used : 0;
            if (!limited || here < *room) {
                *room = here;
                *limit = max;
            }
            limited = true;
        }
        char *slash = strrchr(directory, '/');
        if (fixed || !slash || (size_t)(slash - directory) < strlen(ROOT))
            break; /* the tests' one directory, or the top of the tree */
        *slash = '\0';
    }
    return limited;
}
