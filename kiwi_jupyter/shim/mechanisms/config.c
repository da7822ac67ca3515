/* The shim's settings, read once from the environment (docs/shim.md lists them). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../shim.h"

struct kiwi_config kiwi_cfg;

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static const char *env(const char *name, const char *fallback)
{
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

static double env_seconds(const char *name, double fallback)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback;
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    if (errno || *end || !isfinite(value) || value < 0) {
        kiwi_warn("%s=%s is not a number of seconds; using %g", name, text, fallback);
        return fallback;
    }
    return value;
}

static void copy(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

bool kiwi_parse_size(const char *text, uint64_t *bytes)
{
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1e3}, {"KB", 1e3}, {"M", 1e6}, {"MB", 1e6},
        {"G", 1e9}, {"GB", 1e9}, {"T", 1e12}, {"TB", 1e12},
        {"KI", 1024.0}, {"KIB", 1024.0}, {"MI", 1048576.0}, {"MIB", 1048576.0},
        {"GI", 1073741824.0}, {"GIB", 1073741824.0},
        {"TI", 1099511627776.0}, {"TIB", 1099511627776.0},
    };
    char *end;
    errno = 0;
    double number = strtod(text, &end);
    if (errno || end == text || !isfinite(number) || number < 0)
        return false;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            *bytes = (uint64_t)(number * units[i].scale);
            return true;
        }
    }
    return false;
}

/* The n-th entry of a device list ("3,5", "GPU-8f3a...,GPU-...", "MIG-...", "all") in the
 * variable name, copied into entry; false when there is none. */
static bool nth_entry(const char *name, int n, char *entry, size_t size)
{
    const char *list = getenv(name);
    for (int i = 0; list && *list && i < n; i++) {
        list = strchr(list, ',');
        list = list ? list + 1 : NULL;
    }
    if (!list || !*list)
        return false;
    size_t length = strcspn(list, ",");
    if (length >= size)
        length = size - 1;
    memcpy(entry, list, length);
    entry[length] = '\0';
    return length > 0;
}

static bool is_uuid(const char *entry)
{
    return strncmp(entry, "GPU-", 4) == 0 || strncmp(entry, "MIG-", 4) == 0;
}

/* Which GPU of the node this process uses: its index as NVML numbers the node's GPUs (the
 * daemon's numbering), and its UUID when the environment names it by one. The process's
 * device 0 is the first entry of CUDA_VISIBLE_DEVICES, counted among the devices the
 * container runtime made visible (NVIDIA_VISIBLE_DEVICES, in the node's numbering): so
 * CUDA_VISIBLE_DEVICES=1 with NVIDIA_VISIBLE_DEVICES=2,5 is the node's GPU 5. Either may name
 * a GPU or a MIG instance by UUID instead; the UUID is then what the daemon matches, and the
 * index stays 0. KIWI_GPU, when set, is the index. */
static void visible_gpu(void)
{
    char entry[sizeof kiwi_cfg.gpu_uuid];
    int index = 0, within = 0;
    if (nth_entry("CUDA_VISIBLE_DEVICES", 0, entry, sizeof entry)) {
        if (is_uuid(entry))
            copy(kiwi_cfg.gpu_uuid, sizeof kiwi_cfg.gpu_uuid, entry);
        else if (isdigit((unsigned char)entry[0]))
            index = within = atoi(entry);
    }
    if (!kiwi_cfg.gpu_uuid[0] &&
        nth_entry("NVIDIA_VISIBLE_DEVICES", within, entry, sizeof entry)) {
        if (is_uuid(entry)) {
            copy(kiwi_cfg.gpu_uuid, sizeof kiwi_cfg.gpu_uuid, entry);
            index = 0; /* the node's index is unknown: the UUID decides */
        } else if (isdigit((unsigned char)entry[0])) {
            index = atoi(entry);
        }
    }
    const char *gpu = getenv("KIWI_GPU");
    kiwi_cfg.gpu = gpu && isdigit((unsigned char)*gpu) ? atoi(gpu) : index;
}

static void load(void)
{
    kiwi_cfg.enabled = strcmp(env("KIWI_SHIM", "1"), "0") != 0;
    kiwi_cfg.log = strcmp(env("KIWI_SHIM_LOG", "0"), "0") != 0;
    const char *limit = getenv("KIWI_GPU_MEMORY_LIMIT");
    if (limit && *limit && !kiwi_parse_size(limit, &kiwi_cfg.memory_limit)) {
        kiwi_warn("KIWI_GPU_MEMORY_LIMIT=%s is not a size (try 8GiB); no limit applies", limit);
        kiwi_cfg.memory_limit = 0;
    }
    kiwi_cfg.idle_release = env_seconds("KIWI_IDLE_RELEASE", 5.0);
    kiwi_cfg.fail_timeout = env_seconds("KIWI_FAIL_TIMEOUT", 1.0);
    kiwi_cfg.room_timeout = env_seconds("KIWI_ROOM_TIMEOUT", 300.0);
    const char *policy = env("KIWI_FAIL_POLICY", "open");
    kiwi_cfg.fail_closed = strcasecmp(policy, "closed") == 0;
    if (!kiwi_cfg.fail_closed && strcasecmp(policy, "open") != 0)
        kiwi_warn("KIWI_FAIL_POLICY=%s is neither open nor closed; failing open", policy);
    /* Benchmarks compare restoring by prefetch with nvshare's demand paging, same workload. */
    kiwi_cfg.restore_by_fault = strcasecmp(env("KIWI_RESTORE", "prefetch"), "fault") == 0;
    visible_gpu();
    const char *evict = env("KIWI_EVICT", "auto");
    kiwi_cfg.evict = strcasecmp(evict, "managed") == 0      ? KIWI_EVICT_MANAGED
                     : strcasecmp(evict, "checkpoint") == 0 ? KIWI_EVICT_CHECKPOINT
                     : strcasecmp(evict, "vmm") == 0        ? KIWI_EVICT_VMM
                                                            : KIWI_EVICT_AUTO;
    if (kiwi_cfg.evict == KIWI_EVICT_AUTO && strcasecmp(evict, "auto") != 0)
        kiwi_warn("KIWI_EVICT=%s is not auto, vmm, managed or checkpoint; using auto", evict);

    const char *shadow = env("KIWI_VMM_SHADOW", "register");
    kiwi_cfg.shadow = strcasecmp(shadow, "allochost") == 0  ? KIWI_SHADOW_ALLOC_HOST
                      : strcasecmp(shadow, "pageable") == 0 ? KIWI_SHADOW_PAGEABLE
                                                            : KIWI_SHADOW_REGISTER;
    if (kiwi_cfg.shadow == KIWI_SHADOW_REGISTER && strcasecmp(shadow, "register") != 0 &&
        *shadow)
        kiwi_warn("KIWI_VMM_SHADOW=%s is not register, allochost or pageable; using register",
                  shadow);
    /* Off unless asked: the default changes only after a GPU run has measured it. */
    const char *evict_copy = env("KIWI_EVICT_COPY", "off");
    kiwi_cfg.evict_copy = strcasecmp(evict_copy, "pinned") == 0     ? KIWI_EVICT_COPY_PINNED
                          : strcasecmp(evict_copy, "pageable") == 0 ? KIWI_EVICT_COPY_PAGEABLE
                                                                    : KIWI_EVICT_COPY_OFF;
    if (kiwi_cfg.evict_copy == KIWI_EVICT_COPY_OFF && strcasecmp(evict_copy, "off") != 0 &&
        *evict_copy)
        kiwi_warn("KIWI_EVICT_COPY=%s is not off, pinned or pageable; evicting by prefetch",
                  evict_copy);
    if (kiwi_cfg.evict_copy != KIWI_EVICT_COPY_OFF && kiwi_cfg.restore_by_fault) {
        /* Discarded ranges have no contents to fault back in: the copies must be written back. */
        kiwi_warn("KIWI_EVICT_COPY needs a restore by prefetch, not KIWI_RESTORE=fault; "
                  "evicting by prefetch");
        kiwi_cfg.evict_copy = KIWI_EVICT_COPY_OFF;
    }
    const char *budget = getenv("KIWI_VMM_PIN_BUDGET");
    if (budget && *budget && !kiwi_parse_size(budget, &kiwi_cfg.pin_budget)) {
        kiwi_warn("KIWI_VMM_PIN_BUDGET=%s is not a size (try 16GiB); a quarter of the host's "
                  "memory instead", budget);
        kiwi_cfg.pin_budget = 0;
    }
    /* Local disk, and not a tmpfs (/tmp often is one: spilling there would fill host memory). */
    copy(kiwi_cfg.spill_dir, sizeof kiwi_cfg.spill_dir,
         env("KIWI_SPILL_DIR", "/var/tmp/kiwi-spill"));
    copy(kiwi_cfg.cgroup_dir, sizeof kiwi_cfg.cgroup_dir, env("KIWI_CGROUP_DIR", ""));
    copy(kiwi_cfg.socket_path, sizeof kiwi_cfg.socket_path,
         env("KIWI_SOCKET", "/var/run/kiwi/scheduler.sock"));
    copy(kiwi_cfg.pool, sizeof kiwi_cfg.pool, env("KIWI_POOL", "default"));
    copy(kiwi_cfg.priority, sizeof kiwi_cfg.priority, env("KIWI_PRIORITY", "NORMAL"));
    const char *name = getenv("KIWI_CLIENT_NAME");
    if (name && *name)
        copy(kiwi_cfg.name, sizeof kiwi_cfg.name, name);
    else
        snprintf(kiwi_cfg.name, sizeof kiwi_cfg.name, "%s-%d", program_invocation_short_name,
                 (int)getpid());
}

void kiwi_init(void)
{
    pthread_once(&config_once, load);
}

double kiwi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void say(const char *level, const char *fmt, va_list args)
{
    /* One write per line, so lines from several threads and processes do not interleave. */
    char line[512];
    int n = snprintf(line, sizeof line, "[kiwi-shim %d] %s: ", (int)getpid(), level);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, args);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}

void kiwi_log(const char *fmt, ...)
{
    if (!kiwi_cfg.log)
        return;
    va_list args;
    va_start(args, fmt);
    say("debug", fmt, args);
    va_end(args);
}

void kiwi_warn(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    say("warning", fmt, args);
    va_end(args);
}

bool kiwi_thread_start(void *(*main)(void *))
{
    /* The shim's threads block every signal: a notebook's SIGINT belongs to the main thread. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    bool created = pthread_create(&thread, &attr, main, NULL) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return created;
}
