/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1 with one GPU, for the panel's NVML figures on a
 * machine without a GPU. It answers the calls pynvml makes for kiwi_jupyter/server/nvml.py and
 * nodeside/daemon/gpus.py, with the layouts of NVML's public header (nvml.h): the memory info
 * is three unsigned long longs (total, free, used), the utilization two unsigned ints (gpu,
 * memory). Everything else pynvml asks for is missing, which pynvml reports as "function not
 * found": the code under test must not need more.
 *
 * The figures come from the environment so a test can say what the device shows:
 * FAKE_NVML_USED (bytes), FAKE_NVML_TOTAL (bytes), FAKE_NVML_UTILIZATION (percent).
 */

#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_INSUFFICIENT_SIZE = 7 };

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

struct fake_device {
    int index;
};

static struct fake_device the_device = {0};

static unsigned long long from_env(const char *name, unsigned long long fallback) {
    const char *text = getenv(name);
    return text && *text ? strtoull(text, NULL, 10) : fallback;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (out == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(text) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }

nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
    return result == NVML_SUCCESS ? "Success" : "Fake NVML error";
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (count == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *count = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index != 0 || device == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &the_device;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    return copy_text("Fake GPU (tests)", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    (void)device;
    return copy_text("GPU-00000000-fake-0000-0000-000000000000", uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    (void)device;
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    memory->total = from_env("FAKE_NVML_TOTAL", 16ULL << 30);
    memory->used = from_env("FAKE_NVML_USED", 6ULL << 30);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    (void)device;
    if (rates == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    rates->gpu = (unsigned int)from_env("FAKE_NVML_UTILIZATION", 37);
    rates->memory = 12;
    return NVML_SUCCESS;
}
