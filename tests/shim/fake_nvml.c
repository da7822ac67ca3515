/* A fake NVML (libnvidia-ml.so.1) for the daemon's tests: one GPU, and each process's use of it
 * as the test says.
 *
 * pynvml loads it by name through the dynamic linker (LD_LIBRARY_PATH points at it). Only the
 * calls the daemon makes exist: init and shutdown, the device count, handle, name, UUID and
 * memory, and nvmlDeviceGetProcessUtilization. Its samples are the lines of the file named by
 * FAKE_NVML_PROCESSES, "<pid> <sm percent>" each, read at every call and stamped with the
 * time of the call (a GPU that samples its processes all the time); a missing or empty file is
 * "no process sampled" (NVML_ERROR_NOT_FOUND), as the real library answers. The processes'
 * used memory (nvmlDeviceGetComputeRunningProcesses_v3) is the lines of FAKE_NVML_MEMORY,
 * "<pid> <bytes>" each; none there is "no compute process" (success, count 0).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

#define MAX_SAMPLES 64

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* microseconds since the epoch */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

static int the_device;

EXPORT int nvmlInitWithFlags(unsigned int flags) { (void)flags; return NVML_SUCCESS; }
EXPORT int nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT int nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(int result) {
    switch (result) {
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    default: return "Unknown Error";
    }
}

EXPORT int nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = 1;
    return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (index != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &the_device;
    return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    (void)device;
    snprintf(name, length, "Fake GPU");
    return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    (void)device;
    snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-000000000000");
    return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    (void)device;
    memory->total = 8ULL << 30;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

static unsigned int read_samples(nvmlProcessUtilizationSample_t *out) {
    const char *path = getenv("FAKE_NVML_PROCESSES");
    FILE *file = path != NULL ? fopen(path, "r") : NULL;
    if (file == NULL)
        return 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long stamp = (unsigned long long)now.tv_sec * 1000000ULL
                               + (unsigned long long)now.tv_nsec / 1000ULL;
    unsigned int n = 0, pid, sm;
    while (n < MAX_SAMPLES && fscanf(file, "%u %u", &pid, &sm) == 2) {
        memset(&out[n], 0, sizeof out[n]);
        out[n].pid = pid;
        out[n].smUtil = sm;
        out[n].timeStamp = stamp;
        n++;
    }
    fclose(file);
    return n;
}

EXPORT int nvmlDeviceGetProcessUtilization(void *device,
                                           nvmlProcessUtilizationSample_t *utilization,
                                           unsigned int *count,
                                           unsigned long long lastSeenTimeStamp) {
    (void)device;
    (void)lastSeenTimeStamp; /* every sample is stamped now: newer than any seen */
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessUtilizationSample_t samples[MAX_SAMPLES];
    unsigned int n = read_samples(samples);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (utilization == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(utilization, samples, n * sizeof samples[0]);
    *count = n;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count,
                                                   nvmlProcessInfo_t *infos) {
    (void)device;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[MAX_SAMPLES];
    unsigned int n = 0, pid;
    unsigned long long used;
    const char *path = getenv("FAKE_NVML_MEMORY");
    FILE *file = path != NULL ? fopen(path, "r") : NULL;
    while (file != NULL && n < MAX_SAMPLES && fscanf(file, "%u %llu", &pid, &used) == 2) {
        memset(&found[n], 0, sizeof found[n]);
        found[n].pid = pid;
        found[n].usedGpuMemory = used;
        n++;
    }
    if (file != NULL)
        fclose(file);
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos, found, n * sizeof found[0]);
    *count = n;
    return NVML_SUCCESS;
}
