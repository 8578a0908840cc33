/*
 * gpuobs NVML simulator: a stand-in for libnvidia-ml.so.1 at the C ABI.
 *
 * pynvml loads this library exactly as it loads the driver's. Every answer comes from a
 * state file (layout in sim_state.h, generated from gpuobs/sim/layout.py) that Python maps
 * and may change at any time from another process; the hot path reads it without parsing.
 *
 * Rules kept throughout:
 *  - a handle is only ever compared against the tables below, never dereferenced unchecked;
 *  - every public function counts its call (S->calls) and passes the fault table first;
 *  - a lost or absent GPU answers NVML_ERROR_GPU_IS_LOST to every call with its handle, and one
 *    marked reset-required answers NVML_ERROR_RESET_REQUIRED (its handle can still be had);
 *  - older versions of a call (nvmlDeviceGetMemoryInfo, ..._v2 and v1 process lists,
 *    nvmlEventSetWait) fill the older, smaller structs exactly, never past their end, so that a
 *    library built without the newer symbols (builder.build(hide=...)) behaves as an old driver;
 *  - per-process tables (event sets, GPM samples) are guarded by one mutex; shared state
 *    is read lock-free and written with atomics where C writes it (call counts, faults).
 */
#define _GNU_SOURCE
#include "sim_state.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_RESET_REQUIRED = 16, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};

/* ---- handles -------------------------------------------------------------------------- */

#define HANDLE_MAGIC 0x6E766D6Cu
typedef struct { uint32_t magic; int slot; int mig; } sim_handle_t;
typedef sim_handle_t *nvmlDevice_t;

static sim_handle_t H[SIM_MAX_GPUS];
static sim_handle_t HM[SIM_MAX_GPUS][SIM_MAX_MIG];

static sim_state_t *S;
static int init_refs;
static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER;

/* Resolve a handle by address only: anything not inside H or HM is rejected. */
static int resolve(const void *p, int *slot, int *mig) {
    uintptr_t a = (uintptr_t)p, h = (uintptr_t)H, hm = (uintptr_t)HM;
    if (a >= h && a < h + sizeof(H) && (a - h) % sizeof(sim_handle_t) == 0) {
        *slot = (int)((a - h) / sizeof(sim_handle_t));
        *mig = -1;
    } else if (a >= hm && a < hm + sizeof(HM) && (a - hm) % sizeof(sim_handle_t) == 0) {
        size_t i = (a - hm) / sizeof(sim_handle_t);
        *slot = (int)(i / SIM_MAX_MIG);
        *mig = (int)(i % SIM_MAX_MIG);
    } else {
        return 0;
    }
    return ((const sim_handle_t *)p)->magic == HANDLE_MAGIC;
}

static nvmlDevice_t gpu_handle(int slot) { return &H[slot]; }
static nvmlDevice_t mig_handle(int slot, int m) { return &HM[slot][m]; }

/* ---- values ----------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double eval(const sim_val_t *v) {
    double t = now_s() - v->t0, p = v->period > 0 ? v->period : 1.0;
    switch (v->shape) {
    case SIM_SHAPE_RAMP: {
        double f = t / p;
        return v->base + v->amp * (f < 0 ? 0 : f > 1 ? 1 : f);
    }
    case SIM_SHAPE_SINE: return v->base + v->amp * sin(2 * M_PI * t / p);
    case SIM_SHAPE_NOISE: {
        /* Same answer in every process for the same value and time bucket. */
        uint64_t bucket = (uint64_t)floor((now_s()) / p);
        uint64_t r = mix64(bucket ^ ((uintptr_t)v - (uintptr_t)S));
        return v->base + v->amp * ((double)(r >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
    }
    case SIM_SHAPE_COUNTER: return v->base + v->amp * (t > 0 ? t : 0);
    default: return v->base;
    }
}

/* Conversions clamp to the target range; NaN reads as 0 (casting it would be undefined). */
static unsigned to_u32(double x) { return !(x > 0) ? 0u : x >= 4294967295.0 ? 0xFFFFFFFFu : (unsigned)x; }
static unsigned long long to_u64(double x) { return !(x > 0) ? 0ull : x >= 1.8446744073709552e19 ? ~0ull : (unsigned long long)x; }
static long long to_i64(double x) { return x != x ? 0 : x <= -9.2e18 ? INT64_MIN : x >= 9.2e18 ? INT64_MAX : (long long)x; }
static int to_i32(double x) { return x != x ? 0 : x <= -2147483648.0 ? INT32_MIN : x >= 2147483647.0 ? INT32_MAX : (int)lround(x); }
static unsigned u32(const sim_val_t *v) { return to_u32(eval(v)); }
static unsigned long long u64(const sim_val_t *v) { return to_u64(eval(v)); }
static int i32(const sim_val_t *v) { return to_i32(eval(v)); }

#define GET(vp) do { if ((vp)->ret) return (vp)->ret; } while (0)
#define NEED(p) do { if (!(p)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

static nvmlReturn_t copy_str(const sim_str_t *s, char *buf, unsigned len) {
    NEED(buf);
    if (s->ret) return s->ret;
    size_t n = strnlen(s->s, SIM_STR_LEN);
    if (len < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s->s, n);
    buf[n] = 0;
    return NVML_SUCCESS;
}

/* ---- state file, call accounting and faults ------------------------------------------- */

static char S_path[4096];

/* Map the state file named by $GPUOBS_SIM_STATE. While no client holds NVML initialised, a
 * changed path is re-read, so one process can run several scenarios one after another. */
static nvmlReturn_t map_state(void) {
    const char *path = getenv("GPUOBS_SIM_STATE");
    if (S && (init_refs > 0 || (path && strcmp(path, S_path) == 0))) return NVML_SUCCESS;
    /* An earlier mapping is left in place (not unmapped): a racing caller may still read it. */
    if (!path || !*path || strlen(path) >= sizeof(S_path)) return NVML_ERROR_DRIVER_NOT_LOADED;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(sim_state_t)) {
        close(fd);
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    void *m = mmap(NULL, sizeof(sim_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return NVML_ERROR_DRIVER_NOT_LOADED;
    sim_state_t *s = m;
    if (s->magic != SIM_MAGIC || s->version != SIM_LAYOUT_VERSION || s->size != sizeof(sim_state_t)) {
        munmap(m, sizeof(sim_state_t));
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    for (int g = 0; g < SIM_MAX_GPUS; g++) {
        H[g] = (sim_handle_t){HANDLE_MAGIC, g, -1};
        for (int i = 0; i < SIM_MAX_MIG; i++) HM[g][i] = (sim_handle_t){HANDLE_MAGIC, g, i};
    }
    snprintf(S_path, sizeof(S_path), "%s", path);
    __atomic_store_n(&S, s, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

/* Count one call; then wait the node's per-call latency, if any: the time a real driver takes to
   answer (an ioctl into the kernel module, which may ask the GPU's firmware), spent asleep. */
static void count(int fid) {
    if (!S) return;
    __atomic_fetch_add(&S->calls[fid], 1, __ATOMIC_RELAXED);
    int us = __atomic_load_n(&S->call_latency_us, __ATOMIC_RELAXED);
    if (us > 0) usleep((useconds_t)us);
}

/* Take one use of a fault; returns 1 when it applies to this call. */
static int take(sim_fault_t *f) {
    int r = __atomic_load_n(&f->remaining, __ATOMIC_ACQUIRE);
    while (r != -1) {
        if (r <= 0) return 0;
        if (__atomic_compare_exchange_n(&f->remaining, &r, r - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            /* A used-up hang stays active: its callers block until Python clears it. */
            if (r == 1 && f->delay_ms >= 0) __atomic_store_n(&f->active, 0, __ATOMIC_RELEASE);
            return 1;
        }
    }
    return 1;
}

/* field: -1 for a whole call; a field id for one value inside nvmlDeviceGetFieldValues. */
static nvmlReturn_t fault(int fid, int slot, int field) {
    for (int i = 0; i < SIM_MAX_FAULTS; i++) {
        sim_fault_t *f = &S->faults[i];
        if (!__atomic_load_n(&f->active, __ATOMIC_ACQUIRE)) continue;
        if ((f->func != -1 && f->func != fid) || (f->gpu != -1 && f->gpu != slot) || f->field != field)
            continue;
        int delay = f->delay_ms, err = f->error;
        if (!take(f)) continue;
        if (delay > 0) usleep((useconds_t)delay * 1000);
        while (delay < 0 && __atomic_load_n(&f->active, __ATOMIC_ACQUIRE)) usleep(5000);
        return err;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_sys(int fid) {
    count(fid);
    if (!__atomic_load_n(&init_refs, __ATOMIC_ACQUIRE)) return NVML_ERROR_UNINITIALIZED;
    return fault(fid, -1, -1);
}

#define ALLOW_MIG 1

/* Entry of every device function: accounting, init, handle, loss, faults, support. */
static nvmlReturn_t enter(int fid, nvmlDevice_t dev, int flags, sim_gpu_t **gp, sim_mig_t **mp) {
    count(fid);
    if (!__atomic_load_n(&init_refs, __ATOMIC_ACQUIRE)) return NVML_ERROR_UNINITIALIZED;
    int slot, mig;
    if (!dev || !resolve(dev, &slot, &mig) || slot >= S->gpu_slots) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu_t *g = &S->gpus[slot];
    if (!g->present || g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->reset_required) return NVML_ERROR_RESET_REQUIRED;
    if (mig >= 0 && (mig >= g->mig_count || g->mig_current.base != 1)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = fault(fid, slot, -1);
    if (r) return r;
    if (g->unsupported[fid]) return NVML_ERROR_NOT_SUPPORTED;
    if (mig >= 0 && !(flags & ALLOW_MIG)) return NVML_ERROR_NOT_SUPPORTED;
    *gp = g;
    if (mp) *mp = mig >= 0 ? &g->migs[mig] : NULL;
    return NVML_SUCCESS;
}

#define DEV(fid, flags) \
    sim_gpu_t *g = NULL; sim_mig_t *m = NULL; \
    nvmlReturn_t _r = enter(fid, dev, flags, &g, &m); \
    (void)m; \
    if (_r) return _r
#define SYS(fid) do { nvmlReturn_t _r = enter_sys(fid); if (_r) return _r; } while (0)

static int slot_of(sim_gpu_t *g) { return (int)(g - S->gpus); }

/* ---- init and system -------------------------------------------------------------------- */

static nvmlReturn_t do_init(int fid) {
    pthread_mutex_lock(&L);
    nvmlReturn_t r = map_state();
    if (r == NVML_SUCCESS) {
        count(fid);
        int e = __atomic_load_n(&S->init_error, __ATOMIC_ACQUIRE);
        if (e) {
            int rem = __atomic_load_n(&S->init_error_remaining, __ATOMIC_ACQUIRE);
            if (rem != 0) {
                r = e;
                if (rem > 0 && __atomic_sub_fetch(&S->init_error_remaining, 1, __ATOMIC_ACQ_REL) == 0)
                    __atomic_store_n(&S->init_error, 0, __ATOMIC_RELEASE);
            }
        }
    }
    pthread_mutex_unlock(&L);
    if (r == NVML_SUCCESS) r = fault(fid, -1, -1); /* outside the lock: a hung init blocks only its caller */
    if (r == NVML_SUCCESS) __atomic_add_fetch(&init_refs, 1, __ATOMIC_ACQ_REL);
    return r;
}

API nvmlReturn_t nvmlInit(void) { return do_init(F_nvmlInit); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init(F_nvmlInit_v2); }
API nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return do_init(F_nvmlInitWithFlags); }

API nvmlReturn_t nvmlShutdown(void) {
    count(F_nvmlShutdown);
    pthread_mutex_lock(&L);
    nvmlReturn_t r = NVML_SUCCESS;
    if (init_refs > 0) __atomic_sub_fetch(&init_refs, 1, __ATOMIC_ACQ_REL);
    else r = NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&L);
    return r;
}

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) {
    SYS(F_nvmlSystemGetDriverVersion);
    return copy_str(&S->driver_version, v, len);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned len) {
    SYS(F_nvmlSystemGetNVMLVersion);
    return copy_str(&S->nvml_version, v, len);
}

static nvmlReturn_t cuda_version(int fid, int *v) {
    NEED(v);
    pthread_mutex_lock(&L); /* allowed before nvmlInit, as in NVML */
    nvmlReturn_t r = map_state();
    pthread_mutex_unlock(&L);
    if (r) return r;
    count(fid);
    if ((r = fault(fid, -1, -1))) return r;
    *v = S->cuda_version;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(F_nvmlSystemGetCudaDriverVersion, v); }
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(F_nvmlSystemGetCudaDriverVersion_v2, v); }

API nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned len) {
    SYS(F_nvmlSystemGetProcessName);
    NEED(name && len);
    for (int s = 0; s < S->gpu_slots && s < SIM_MAX_GPUS; s++) {
        sim_gpu_t *g = &S->gpus[s];
        for (int i = 0; g->present && i < g->proc_count && i < SIM_MAX_PROCS; i++) {
            if (g->procs[i].pid != pid) continue;
            size_t n = strnlen(g->procs[i].name.s, SIM_STR_LEN);
            if (n >= len) n = len - 1; /* NVML truncates process names */
            memcpy(name, g->procs[i].name.s, n);
            name[n] = 0;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- device enumeration: index i is the i-th present slot ------------------------------- */

static unsigned present_count(void) {
    unsigned n = 0;
    for (int s = 0; s < S->gpu_slots && s < SIM_MAX_GPUS; s++) n += S->gpus[s].present != 0;
    return n;
}

static nvmlReturn_t get_count(int fid, unsigned *c) {
    SYS(fid);
    NEED(c);
    *c = present_count();
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned *c) { return get_count(F_nvmlDeviceGetCount, c); }
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *c) { return get_count(F_nvmlDeviceGetCount_v2, c); }

static nvmlReturn_t by_index(int fid, unsigned idx, nvmlDevice_t *dev) {
    SYS(fid);
    NEED(dev);
    unsigned n = 0;
    for (int s = 0; s < S->gpu_slots && s < SIM_MAX_GPUS; s++) {
        if (!S->gpus[s].present) continue;
        if (n++ == idx) {
            nvmlReturn_t r = fault(fid, s, -1);
            if (r) return r;
            *dev = gpu_handle(s);
            return S->gpus[s].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *d) { return by_index(F_nvmlDeviceGetHandleByIndex, i, d); }
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) { return by_index(F_nvmlDeviceGetHandleByIndex_v2, i, d); }

/* Find a GPU (or MIG device) whose string field equals key. */
static nvmlReturn_t by_string(int fid, const char *key, size_t field_off, nvmlDevice_t *dev) {
    SYS(fid);
    NEED(key && dev);
    for (int s = 0; s < S->gpu_slots && s < SIM_MAX_GPUS; s++) {
        sim_gpu_t *g = &S->gpus[s];
        if (!g->present) continue;
        const sim_str_t *v = (const sim_str_t *)((const char *)g + field_off);
        if (v->ret == 0 && strncasecmp(v->s, key, SIM_STR_LEN) == 0) {
            *dev = gpu_handle(s);
            return g->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
        }
        if (field_off != offsetof(sim_gpu_t, uuid)) continue;
        for (int i = 0; i < g->mig_count && i < SIM_MAX_MIG; i++) {
            if (strncmp(g->migs[i].uuid.s, key, SIM_STR_LEN) == 0) {
                *dev = mig_handle(s, i);
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) { return by_string(F_nvmlDeviceGetHandleByUUID, u, offsetof(sim_gpu_t, uuid), d); }
API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *u, nvmlDevice_t *d) { return by_string(F_nvmlDeviceGetHandleBySerial, u, offsetof(sim_gpu_t, serial), d); }
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) { return by_string(F_nvmlDeviceGetHandleByPciBusId, b, offsetof(sim_gpu_t, bus_id), d); }
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d) { return by_string(F_nvmlDeviceGetHandleByPciBusId_v2, b, offsetof(sim_gpu_t, bus_id), d); }

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned *idx) {
    DEV(F_nvmlDeviceGetIndex, 0);
    NEED(idx);
    unsigned n = 0;
    for (int s = 0; s < slot_of(g); s++) n += S->gpus[s].present != 0;
    *idx = n;
    return NVML_SUCCESS;
}

/* ---- identity ------------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned len) {
    DEV(F_nvmlDeviceGetName, ALLOW_MIG);
    if (!m) return copy_str(&g->name, name, len);
    NEED(name);
    if (g->name.ret) return g->name.ret;
    int n = snprintf(name, len, "%.*s MIG %.*s", (int)strnlen(g->name.s, SIM_STR_LEN), g->name.s,
                     (int)strnlen(m->profile.s, SIM_STR_LEN), m->profile.s);
    return n < 0 || (unsigned)n >= len ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned len) {
    DEV(F_nvmlDeviceGetUUID, ALLOW_MIG);
    return copy_str(m ? &m->uuid : &g->uuid, uuid, len);
}

#define STR_GETTER(fn, field) \
    API nvmlReturn_t fn(nvmlDevice_t dev, char *buf, unsigned len) { \
        DEV(F_##fn, 0); \
        return copy_str(&g->field, buf, len); \
    }
STR_GETTER(nvmlDeviceGetSerial, serial)
STR_GETTER(nvmlDeviceGetVbiosVersion, vbios)
STR_GETTER(nvmlDeviceGetBoardPartNumber, board_part)

API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t dev, char *buf, unsigned len) {
    DEV(F_nvmlDeviceGetInforomImageVersion, 0);
    return copy_str(&g->inforom_image, buf, len);
}

/* Getters of one unsigned value from one Val. */
#define U32_GETTER(fn, field, flags) \
    API nvmlReturn_t fn(nvmlDevice_t dev, unsigned *out) { \
        DEV(F_##fn, flags); \
        NEED(out); \
        GET(&g->field); \
        *out = u32(&g->field); \
        return NVML_SUCCESS; \
    }
U32_GETTER(nvmlDeviceGetMinorNumber, minor, 0)
U32_GETTER(nvmlDeviceGetBrand, brand, 0)
U32_GETTER(nvmlDeviceGetArchitecture, arch, 0)
U32_GETTER(nvmlDeviceGetPersistenceMode, persistence, 0)
U32_GETTER(nvmlDeviceGetComputeMode, compute_mode, 0)
U32_GETTER(nvmlDeviceGetNumGpuCores, num_cores, 0)
/* nvml.h: "On Ampere (except GA100) or newer GPUs, the API returns power averaged over 1 sec interval";
   older GPUs and GA100 (A100, A30) answer the instant draw. The average is power_avg_mw where the GPU has one. */
API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned *out) {
    DEV(F_nvmlDeviceGetPowerUsage, 0);
    NEED(out);
    char name[SIM_STR_LEN + 1];
    memcpy(name, g->name.s, SIM_STR_LEN);
    name[SIM_STR_LEN] = 0;
    double arch = g->arch.ret ? 0 : eval(&g->arch);
    int averaged = arch >= 7 && arch < 100 && !g->power_avg_mw.ret && !strstr(name, "A100") && !strstr(name, "A30");
    sim_val_t *v = averaged ? &g->power_avg_mw : &g->power_mw;
    GET(v);
    *out = u32(v);
    return NVML_SUCCESS;
}
U32_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit_mw, 0)
U32_GETTER(nvmlDeviceGetEnforcedPowerLimit, enforced_limit_mw, 0)
U32_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, default_limit_mw, 0)
U32_GETTER(nvmlDeviceGetPerformanceState, pstate, 0)
U32_GETTER(nvmlDeviceGetPowerState, pstate, 0)
U32_GETTER(nvmlDeviceGetFanSpeed, fan[0], 0)
U32_GETTER(nvmlDeviceGetNumFans, fan_count, 0)
U32_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen, 0)
U32_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen, 0)
U32_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gpu_max_gen, 0)
U32_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width, 0)
U32_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width, 0)
U32_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay, 0)

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    DEV(F_nvmlDeviceGetCudaComputeCapability, ALLOW_MIG);
    NEED(major && minor);
    GET(&g->cc_major);
    *major = i32(&g->cc_major);
    *minor = i32(&g->cc_minor);
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[32];
} nvmlPciInfoExt_t;

static nvmlReturn_t fill_pci(sim_gpu_t *g, nvmlPciInfo_t *p) {
    NEED(p);
    GET(&g->pci_bus);
    memset(p, 0, sizeof(*p));
    p->domain = u32(&g->pci_domain);
    p->bus = u32(&g->pci_bus);
    p->device = u32(&g->pci_device);
    p->pciDeviceId = u32(&g->pci_device_id);
    p->pciSubSystemId = u32(&g->pci_subsystem_id);
    snprintf(p->busId, sizeof(p->busId), "%.31s", g->bus_id.s);
    snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "%04X:%02X:%02X.0", p->domain & 0xFFFF, p->bus, p->device);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *p) { DEV(F_nvmlDeviceGetPciInfo, 0); return fill_pci(g, p); }
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *p) { DEV(F_nvmlDeviceGetPciInfo_v2, 0); return fill_pci(g, p); }
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *p) { DEV(F_nvmlDeviceGetPciInfo_v3, 0); return fill_pci(g, p); }

API nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t dev, nvmlPciInfoExt_t *p) {
    DEV(F_nvmlDeviceGetPciInfoExt, 0);
    NEED(p);
    if (p->version != 0x1000040u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t b;
    nvmlReturn_t r = fill_pci(g, &b);
    if (r) return r;
    p->domain = b.domain; p->bus = b.bus; p->device = b.device;
    p->pciDeviceId = b.pciDeviceId; p->pciSubSystemId = b.pciSubSystemId;
    p->baseClass = 3; p->subClass = 2;
    memcpy(p->busId, b.busId, sizeof(p->busId));
    return NVML_SUCCESS;
}

/* ---- memory -------------------------------------------------------------------------------- */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;

static nvmlReturn_t mem_vals(sim_gpu_t *g, sim_mig_t *m, unsigned long long *t, unsigned long long *r, unsigned long long *u) {
    sim_val_t *vt = m ? &m->mem_total : &g->mem_total, *vr = m ? &m->mem_reserved : &g->mem_reserved;
    sim_val_t *vu = m ? &m->mem_used : &g->mem_used;
    GET(vt);
    GET(vu);
    *t = u64(vt);
    *r = vr->ret ? 0 : u64(vr);
    *u = u64(vu);
    if (*r > *t) *r = *t;
    if (*u > *t - *r) *u = *t - *r;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    DEV(F_nvmlDeviceGetMemoryInfo, ALLOW_MIG);
    NEED(mem);
    unsigned long long t, r, u;
    nvmlReturn_t e = mem_vals(g, m, &t, &r, &u);
    if (e) return e;
    /* v1 counts reserved memory as used, as the driver does. */
    mem->total = t; mem->used = u + r; mem->free = t - u - r;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    DEV(F_nvmlDeviceGetMemoryInfo_v2, ALLOW_MIG);
    NEED(mem);
    if (mem->version != 0x02000028u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long t, r, u;
    nvmlReturn_t e = mem_vals(g, m, &t, &r, &u);
    if (e) return e;
    mem->total = t; mem->reserved = r; mem->used = u; mem->free = t - r - u;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t dev, nvmlBAR1Memory_t *b) {
    DEV(F_nvmlDeviceGetBAR1MemoryInfo, ALLOW_MIG);
    NEED(b);
    sim_val_t *vt = m ? &m->bar1_total : &g->bar1_total, *vu = m ? &m->bar1_used : &g->bar1_used;
    GET(vt);
    GET(vu);
    b->bar1Total = u64(vt);
    b->bar1Used = u64(vu);
    if (b->bar1Used > b->bar1Total) b->bar1Used = b->bar1Total;
    b->bar1Free = b->bar1Total - b->bar1Used;
    return NVML_SUCCESS;
}

/* ---- utilization -------------------------------------------------------------------------- */

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    DEV(F_nvmlDeviceGetUtilizationRates, 0);
    NEED(u);
    /* nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently supported." */
    if (!g->mig_current.ret && u32(&g->mig_current) == 1) return NVML_ERROR_NOT_SUPPORTED;
    GET(&g->util_gpu);
    u->gpu = u32(&g->util_gpu);
    u->memory = g->util_mem.ret ? 0 : u32(&g->util_mem);
    return NVML_SUCCESS;
}

static nvmlReturn_t codec_util(sim_val_t *v, unsigned *util, unsigned *period) {
    NEED(util && period);
    GET(v);
    *util = u32(v);
    *period = 167000; /* microseconds, a typical driver sampling period */
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned *u, unsigned *p) { DEV(F_nvmlDeviceGetEncoderUtilization, 0); return codec_util(&g->util_enc, u, p); }
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned *u, unsigned *p) { DEV(F_nvmlDeviceGetDecoderUtilization, 0); return codec_util(&g->util_dec, u, p); }

/* Session statistics (encoder, frame-buffer capture): NOT_SUPPORTED while the session count is unset;
   an unset rate or latency reads 0, as NVML reports them with no session running. */
static nvmlReturn_t session_stats(sim_val_t *count, sim_val_t *fps, sim_val_t *latency_us,
                                  unsigned *count_out, unsigned *fps_out, unsigned *latency_out) {
    NEED(count_out && fps_out && latency_out);
    GET(count);
    *count_out = u32(count);
    *fps_out = fps->ret ? 0 : u32(fps);
    *latency_out = latency_us->ret ? 0 : u32(latency_us); /* microseconds */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t dev, unsigned *sessions, unsigned *fps, unsigned *latency_us) {
    DEV(F_nvmlDeviceGetEncoderStats, 0);
    return session_stats(&g->enc_sessions, &g->enc_fps, &g->enc_latency_us, sessions, fps, latency_us);
}

typedef struct { unsigned sessionsCount, averageFPS, averageLatency; } nvmlFBCStats_t;

API nvmlReturn_t nvmlDeviceGetFBCStats(nvmlDevice_t dev, nvmlFBCStats_t *st) {
    DEV(F_nvmlDeviceGetFBCStats, 0);
    NEED(st);
    return session_stats(&g->fbc_sessions, &g->fbc_fps, &g->fbc_latency_us,
                         &st->sessionsCount, &st->averageFPS, &st->averageLatency);
}

/* ---- power and energy ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t dev, unsigned *lo, unsigned *hi) {
    DEV(F_nvmlDeviceGetPowerManagementLimitConstraints, 0);
    NEED(lo && hi);
    GET(&g->min_limit_mw);
    GET(&g->max_limit_mw);
    *lo = u32(&g->min_limit_mw);
    *hi = u32(&g->max_limit_mw);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *mj) {
    DEV(F_nvmlDeviceGetTotalEnergyConsumption, 0);
    NEED(mj);
    GET(&g->energy_mj);
    *mj = u64(&g->energy_mj);
    return NVML_SUCCESS;
}

/* ---- thermal --------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned *t) {
    DEV(F_nvmlDeviceGetTemperature, 0);
    NEED(t);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&g->temp_gpu);
    *t = u32(&g->temp_gpu);
    return NVML_SUCCESS;
}

typedef struct { unsigned version; int sensorType; int temperature; } nvmlTemperature_v1_t;

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_v1_t *t) {
    DEV(F_nvmlDeviceGetTemperatureV, 0);
    NEED(t);
    if (t->version != 0x100000Cu) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (t->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&g->temp_gpu);
    t->temperature = i32(&g->temp_gpu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, int kind, unsigned *t) {
    DEV(F_nvmlDeviceGetTemperatureThreshold, 0);
    NEED(t);
    if (kind < 0 || kind >= 8) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&g->temp_threshold[kind]);
    *t = u32(&g->temp_threshold[kind]);
    return NVML_SUCCESS;
}

typedef struct { unsigned version; int marginTemperature; } nvmlMarginTemperature_t;

API nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t dev, nvmlMarginTemperature_t *t) {
    DEV(F_nvmlDeviceGetMarginTemperature, 0);
    NEED(t);
    if (t->version != 0x1000008u) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    GET(&g->temp_margin);
    t->marginTemperature = i32(&g->temp_margin);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t dev, unsigned fan, unsigned *speed) {
    DEV(F_nvmlDeviceGetFanSpeed_v2, 0);
    NEED(speed);
    GET(&g->fan_count);
    if (fan >= u32(&g->fan_count) || fan >= SIM_MAX_FANS) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&g->fan[fan]);
    *speed = u32(&g->fan[fan]);
    return NVML_SUCCESS;
}

/* ---- clocks and clock-event reasons ---------------------------------------------------------- */

static nvmlReturn_t clock_of(sim_val_t *arr, int type, unsigned *mhz) {
    NEED(mhz);
    if (type < 0 || type >= 4) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&arr[type]);
    *mhz = u32(&arr[type]);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned *mhz) { DEV(F_nvmlDeviceGetClockInfo, 0); return clock_of(g->clock, type, mhz); }
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned *mhz) { DEV(F_nvmlDeviceGetMaxClockInfo, 0); return clock_of(g->max_clock, type, mhz); }

API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t dev, int type, int id, unsigned *mhz) {
    DEV(F_nvmlDeviceGetClock, 0);
    if (id == 0) return clock_of(g->clock, type, mhz);          /* NVML_CLOCK_ID_CURRENT */
    if (id == 3) return clock_of(g->max_clock, type, mhz);      /* NVML_CLOCK_ID_CUSTOMER_BOOST_MAX */
    return NVML_ERROR_NOT_SUPPORTED;                            /* application clocks: deprecated */
}

static nvmlReturn_t mask_of(sim_val_t *v, unsigned long long *out) {
    NEED(out);
    GET(v);
    *out = u64(v);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) { DEV(F_nvmlDeviceGetCurrentClocksEventReasons, 0); return mask_of(&g->clock_events, r); }
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) { DEV(F_nvmlDeviceGetCurrentClocksThrottleReasons, 0); return mask_of(&g->clock_events, r); }
API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) { DEV(F_nvmlDeviceGetSupportedClocksEventReasons, 0); return mask_of(&g->clock_events_supported, r); }
API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) { DEV(F_nvmlDeviceGetSupportedClocksThrottleReasons, 0); return mask_of(&g->clock_events_supported, r); }

typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;

API nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t dev, int policy, nvmlViolationTime_t *v) {
    DEV(F_nvmlDeviceGetViolationStatus, 0);
    NEED(v);
    if (policy < 0 || policy >= SIM_PERF_POLICIES) return NVML_ERROR_INVALID_ARGUMENT;
    GET(&g->violation_ns[policy]);
    v->referenceTime = (unsigned long long)(now_s() * 1e6); /* microseconds */
    v->violationTime = u64(&g->violation_ns[policy]);
    return NVML_SUCCESS;
}

/* ---- ECC, retired pages, row remapping ------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned *cur, unsigned *pend) {
    DEV(F_nvmlDeviceGetEccMode, 0);
    NEED(cur && pend);
    GET(&g->ecc_current);
    *cur = u32(&g->ecc_current);
    *pend = g->ecc_pending.ret ? *cur : u32(&g->ecc_pending);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int type, int counter, unsigned long long *c) {
    DEV(F_nvmlDeviceGetTotalEccErrors, 0);
    NEED(c);
    if (type < 0 || type > 1 || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    sim_val_t *v = &g->ecc[type * 2 + counter];
    GET(v);
    *c = u64(v);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned *n, unsigned long long *addrs) {
    DEV(F_nvmlDeviceGetRetiredPages, 0);
    NEED(n);
    if (cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    sim_val_t *v = cause == 0 ? &g->retired_sbe : &g->retired_dbe; /* 0: multiple SBE, 1: DBE */
    GET(v);
    unsigned have = u32(v);
    if (!addrs || *n < have) { *n = have; return have ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS; }
    for (unsigned i = 0; i < have; i++) addrs[i] = 0x1000ull * (i + 1) + (cause ? 0x80000000ull : 0);
    *n = have;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, unsigned *pending) {
    DEV(F_nvmlDeviceGetRetiredPagesPendingStatus, 0);
    NEED(pending);
    GET(&g->retired_pending);
    *pending = u32(&g->retired_pending);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned *cor, unsigned *unc, unsigned *pend, unsigned *fail) {
    DEV(F_nvmlDeviceGetRemappedRows, 0);
    NEED(cor && unc && pend && fail);
    GET(&g->remap_cor);
    *cor = u32(&g->remap_cor);
    *unc = u32(&g->remap_unc);
    *pend = u32(&g->remap_pending);
    *fail = u32(&g->remap_failure);
    return NVML_SUCCESS;
}

/* nvmlMemoryLocation_t: the simulator keeps SRAM (7) and DRAM (2, also NVML_MEMORY_LOCATION_DEVICE_MEMORY) */
API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, int type, int counter, int location, unsigned long long *c) {
    DEV(F_nvmlDeviceGetMemoryErrorCounter, 0);
    NEED(c);
    if (type < 0 || type > 1 || counter < 0 || counter > 1 || location < 0 || location > 7) return NVML_ERROR_INVALID_ARGUMENT;
    if (location != 7 && location != 2) return NVML_ERROR_NOT_SUPPORTED;
    sim_val_t *v = &g->ecc_location[(location == 7 ? 0 : 4) + type * 2 + counter];
    GET(v);
    *c = u64(v);
    return NVML_SUCCESS;
}

typedef struct { unsigned max, high, partial, low, none; } nvmlRowRemapperHistogramValues_t;

API nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t dev, nvmlRowRemapperHistogramValues_t *h) {
    DEV(F_nvmlDeviceGetRowRemapperHistogram, 0);
    NEED(h);
    for (int i = 0; i < 5; i++) GET(&g->remap_histogram[i]);
    h->max = u32(&g->remap_histogram[0]);
    h->high = u32(&g->remap_histogram[1]);
    h->partial = u32(&g->remap_histogram[2]);
    h->low = u32(&g->remap_histogram[3]);
    h->none = u32(&g->remap_histogram[4]);
    return NVML_SUCCESS;
}

/* ---- PCIe ---------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned *kbps) {
    DEV(F_nvmlDeviceGetPcieThroughput, 0);
    NEED(kbps);
    if (counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    sim_val_t *v = counter == 0 ? &g->pcie_tx_bytes : &g->pcie_rx_bytes;
    GET(v);
    usleep(20000); /* the driver samples over 20 ms and blocks the caller meanwhile */
    *kbps = to_u32(v->amp / 1000.0);
    return NVML_SUCCESS;
}

/* ---- NVLink -------------------------------------------------------------------------------- */

static nvmlReturn_t link_of(sim_gpu_t *g, unsigned link, sim_link_t **l) {
    if (g->link_count <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->link_count || link >= SIM_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *l = &g->links[link];
    return NVML_SUCCESS;
}

#define LINK_DEV(fid) \
    DEV(fid, 0); \
    sim_link_t *l; \
    nvmlReturn_t _lr = link_of(g, link, &l); \
    if (_lr) return _lr

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned link, unsigned *active) {
    LINK_DEV(F_nvmlDeviceGetNvLinkState);
    NEED(active);
    GET(&l->state);
    *active = u32(&l->state);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t dev, unsigned link, unsigned *version) {
    LINK_DEV(F_nvmlDeviceGetNvLinkVersion);
    NEED(version);
    GET(&l->version);
    *version = u32(&l->version);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned link, int counter, unsigned long long *v) {
    LINK_DEV(F_nvmlDeviceGetNvLinkErrorCounter);
    NEED(v);
    /* nvmlNvLinkErrorCounter_t: 0 DL replay, 1 DL recovery, 2 DL CRC flit, 3 DL CRC data, 4 DL ECC data */
    sim_val_t *src[] = {&l->replay_errors, &l->recovery_errors, &l->crc_errors, &l->crc_errors, &l->ecc_errors};
    if (counter < 0 || counter > 4) return NVML_ERROR_INVALID_ARGUMENT;
    GET(src[counter]);
    *v = u64(src[counter]);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned link, nvmlPciInfo_t *p) {
    LINK_DEV(F_nvmlDeviceGetNvLinkRemotePciInfo_v2);
    NEED(p);
    if (l->remote_bus_id.ret) return l->remote_bus_id.ret;
    memset(p, 0, sizeof(*p));
    snprintf(p->busId, sizeof(p->busId), "%.31s", l->remote_bus_id.s);
    unsigned dom = 0, bus = 0, devn = 0;
    sscanf(p->busId, "%x:%x:%x", &dom, &bus, &devn); /* the bounded copy, not the shared string */
    p->domain = dom; p->bus = bus; p->device = devn;
    snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "%04X:%02X:%02X.0", dom & 0xFFFF, bus, devn);
    return NVML_SUCCESS;
}

/* ---- topology ------------------------------------------------------------------------------ */

/* The second GPU of a pair call: a full GPU's handle (a MIG device has no topology of its own). */
static nvmlReturn_t peer_of(nvmlDevice_t dev2, sim_gpu_t *g, sim_gpu_t **out) {
    int slot, mig;
    if (!dev2 || !resolve(dev2, &slot, &mig) || slot >= S->gpu_slots || mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu_t *p = &S->gpus[slot];
    if (!p->present || p->lost) return NVML_ERROR_GPU_IS_LOST;
    if (p == g) return NVML_ERROR_INVALID_ARGUMENT;
    *out = p;
    return NVML_SUCCESS;
}

static int link_active(const sim_link_t *l) { return !l->state.ret && u32(&l->state) == 1; }

/* NVLink links of g that reach p: its active links whose far end is p (an NVLink bridge, a direct
   mesh), else, when both have active links into NVSwitches, all of g's switch links (as
   `nvidia-smi topo -m` prints NV18 for every pair of a DGX H100). */
static int nvlinks_to(const sim_gpu_t *g, const sim_gpu_t *p) {
    int direct = 0, g_sw = 0, p_sw = 0;
    for (int i = 0; i < g->link_count && i < SIM_MAX_LINKS; i++) {
        const sim_link_t *l = &g->links[i];
        if (!link_active(l)) continue;
        if (l->remote_type == 2) g_sw++;
        else if (!l->remote_bus_id.ret && !p->bus_id.ret && strncmp(l->remote_bus_id.s, p->bus_id.s, SIM_STR_LEN) == 0)
            direct++;
    }
    for (int i = 0; i < p->link_count && i < SIM_MAX_LINKS; i++)
        if (link_active(&p->links[i]) && p->links[i].remote_type == 2) p_sw++;
    return direct ? direct : (g_sw && p_sw ? g_sw : 0);
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t dev, nvmlDevice_t dev2, int *level) {
    DEV(F_nvmlDeviceGetTopologyCommonAncestor, 0);
    NEED(level);
    sim_gpu_t *p;
    nvmlReturn_t r = peer_of(dev2, g, &p);
    if (r) return r;
    int stored = g->topo_level[slot_of(p)];
    if (stored <= 0) return NVML_ERROR_NOT_SUPPORTED;
    *level = stored - 1;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t dev, nvmlDevice_t dev2, int index, int *status) {
    DEV(F_nvmlDeviceGetP2PStatus, 0);
    NEED(status);
    sim_gpu_t *p;
    nvmlReturn_t r = peer_of(dev2, g, &p);
    if (r) return r;
    if (index < 0 || index > 4) return NVML_ERROR_INVALID_ARGUMENT;
    int level = g->topo_level[slot_of(p)] - 1;
    /* nvmlGpuP2PStatus_t: 0 OK, 3 IOH topology not supported, 5 not supported; index 2 is NVLink */
    if (index == 2) *status = nvlinks_to(g, p) ? 0 : 5;
    else *status = nvlinks_to(g, p) || (level >= 0 && level <= 40) ? 0 : 3;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned link, int *type) {
    LINK_DEV(F_nvmlDeviceGetNvLinkRemoteDeviceType);
    NEED(type);
    *type = l->remote_type;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, int *node) {
    DEV(F_nvmlDeviceGetNumaNodeId, 0);
    NEED(node);
    GET(&g->numa_node);
    *node = i32(&g->numa_node);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t dev, unsigned words, unsigned long long *set) {
    DEV(F_nvmlDeviceGetCpuAffinity, 0);
    NEED(set);
    uint64_t any = 0;
    for (int i = 0; i < SIM_CPU_WORDS; i++) any |= g->cpu_affinity[i];
    if (!any) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < words; i++) set[i] = i < SIM_CPU_WORDS ? g->cpu_affinity[i] : 0;
    return NVML_SUCCESS;
}

/* ---- NVSwitch fabric -------------------------------------------------------------------------- */

/* v1 (R525+), and the versioned struct of nvmlDeviceGetGpuFabricInfoV (v2 adds healthMask, v3 healthSummary). */
typedef struct { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned cliqueId, state; } nvmlGpuFabricInfo_t;
typedef struct {
    unsigned version; unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned cliqueId, state, healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfoV_t;
#define FABRIC_INFO_V2 0x02000024u
#define FABRIC_INFO_V3 0x03000028u

static nvmlReturn_t fabric(sim_gpu_t *g, nvmlGpuFabricInfo_t *out) {
    GET(&g->fabric_state);
    memset(out->clusterUuid, 0, sizeof(out->clusterUuid));
    out->state = u32(&g->fabric_state);
    out->status = g->fabric_status.ret ? NVML_ERROR_NOT_SUPPORTED : i32(&g->fabric_status);
    out->cliqueId = g->fabric_clique.ret ? 0 : u32(&g->fabric_clique);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info) {
    DEV(F_nvmlDeviceGetGpuFabricInfo, 0);
    NEED(info);
    return fabric(g, info);
}

API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfoV_t *info) {
    DEV(F_nvmlDeviceGetGpuFabricInfoV, 0);
    NEED(info);
    if (info->version != FABRIC_INFO_V2 && info->version != FABRIC_INFO_V3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    GET(&g->fabric_health);
    nvmlGpuFabricInfo_t v1;
    nvmlReturn_t r = fabric(g, &v1);
    if (r) return r;
    memcpy(info->clusterUuid, v1.clusterUuid, sizeof(info->clusterUuid));
    info->status = v1.status;
    info->cliqueId = v1.cliqueId;
    info->state = v1.state;
    info->healthMask = u32(&g->fabric_health);
    if (info->version == FABRIC_INFO_V3) info->healthSummary = 0; /* NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED */
    return NVML_SUCCESS;
}

/* ---- field values ---------------------------------------------------------------------------- */

typedef union { double dVal; unsigned uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5 };

static nvmlReturn_t put(nvmlFieldValue_t *f, sim_val_t *v, int type, double scale) {
    if (v->ret) return v->ret;
    f->valueType = type;
    double x = eval(v) * scale;
    switch (type) {
    case VT_UINT: f->value.uiVal = to_u32(x); break;
    case VT_ULL: f->value.ullVal = to_u64(x); break;
    case VT_SLL: f->value.sllVal = to_i64(x); break;
    case VT_SINT: f->value.siVal = to_i32(x); break;
    default: f->value.dVal = x;
    }
    return NVML_SUCCESS;
}

/* Sum one link counter over every link, or read one link (scopeId) for the scoped fields. */
static nvmlReturn_t put_link_sum(sim_gpu_t *g, nvmlFieldValue_t *f, size_t off, double scale) {
    if (g->link_count <= 0) return NVML_ERROR_NOT_SUPPORTED;
    double sum = 0;
    for (int i = 0; i < g->link_count && i < SIM_MAX_LINKS; i++) {
        sim_val_t *v = (sim_val_t *)((char *)&g->links[i] + off);
        if (v->ret) return v->ret;
        sum += eval(v);
    }
    f->valueType = VT_ULL;
    f->value.ullVal = to_u64(sum * scale);
    return NVML_SUCCESS;
}

static nvmlReturn_t put_link(sim_gpu_t *g, nvmlFieldValue_t *f, unsigned link, size_t off, int type, double scale) {
    sim_link_t *l;
    nvmlReturn_t r = link_of(g, link, &l);
    if (r) return r;
    return put(f, (sim_val_t *)((char *)l + off), type, scale);
}

#define LINK_OFF(member) offsetof(sim_link_t, member)

/* T.Limit is the GPU's maximum operating temperature; a threshold reads as T.Limit minus it. */
static nvmlReturn_t put_tlimit(sim_gpu_t *g, nvmlFieldValue_t *f, int kind) {
    if (g->temp_margin.ret) return g->temp_margin.ret; /* no T.Limit on this GPU */
    if (g->temp_threshold[3].ret) return g->temp_threshold[3].ret;
    if (g->temp_threshold[kind].ret) return g->temp_threshold[kind].ret;
    f->valueType = VT_SINT;
    f->value.siVal = to_i32(eval(&g->temp_threshold[3]) - eval(&g->temp_threshold[kind]));
    return NVML_SUCCESS;
}

enum { POWER_SCOPE_GPU = 0, POWER_SCOPE_MEMORY = 2 };

static nvmlReturn_t field(sim_gpu_t *g, nvmlFieldValue_t *f) {
    unsigned id = f->fieldId, sc = f->scopeId;
    switch (id) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL: return put(f, &g->ecc[0], VT_ULL, 1);
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL: return put(f, &g->ecc[2], VT_ULL, 1);
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: return put(f, &g->ecc[1], VT_ULL, 1);
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: return put(f, &g->ecc[3], VT_ULL, 1);
    case NVML_FI_DEV_RETIRED_SBE: return put(f, &g->retired_sbe, VT_ULL, 1);
    case NVML_FI_DEV_RETIRED_DBE: return put(f, &g->retired_dbe, VT_ULL, 1);
    case NVML_FI_DEV_RETIRED_PENDING: return put(f, &g->retired_pending, VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: return put_link_sum(g, f, LINK_OFF(crc_errors), 1);
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: return put_link_sum(g, f, LINK_OFF(replay_errors), 1);
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: return put_link_sum(g, f, LINK_OFF(recovery_errors), 1);
    /* perf policy violation counters: slots 0-5 in field order, then total app clocks (10) and base clocks (11) */
    case NVML_FI_DEV_PERF_POLICY_POWER: case NVML_FI_DEV_PERF_POLICY_THERMAL:
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: case NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT:
    case NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: case NVML_FI_DEV_PERF_POLICY_RELIABILITY:
        return put(f, &g->violation_ns[id - NVML_FI_DEV_PERF_POLICY_POWER], VT_ULL, 1);
    case NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: return put(f, &g->violation_ns[10], VT_ULL, 1);
    case NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: return put(f, &g->violation_ns[11], VT_ULL, 1);
    /* slots 6, 7 and 8: clock-event reasons with no perf policy counter of their own (the SW thermal
       slowdown counter is not the thermal policy's, slot 1) */
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: return put(f, &g->violation_ns[8], VT_ULL, 1);
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: return put(f, &g->violation_ns[6], VT_ULL, 1);
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: return put(f, &g->violation_ns[7], VT_ULL, 1);
    case NVML_FI_DEV_MEMORY_TEMP: return put(f, &g->temp_mem, VT_UINT, 1);
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: case NVML_FI_DEV_ENERGY:
        return put(f, &g->energy_mj, VT_ULL, 1); /* millijoules */
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: return put_link(g, f, 0, LINK_OFF(speed_mbps), VT_UINT, 1);
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        f->valueType = VT_UINT;
        f->value.uiVal = g->link_count > 0 ? (unsigned)g->link_count : 0;
        return g->link_count > 0 ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: return put(f, &g->pcie_replay, VT_UINT, 1);
    /* THROUGHPUT_* count KiB; the scope 0xFFFFFFFF asks for the sum over the links */
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
        return sc == 0xFFFFFFFFu ? put_link_sum(g, f, LINK_OFF(tx_bytes), 1.0 / 1024)
                                 : put_link(g, f, sc, LINK_OFF(tx_bytes), VT_ULL, 1.0 / 1024);
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX:
        return sc == 0xFFFFFFFFu ? put_link_sum(g, f, LINK_OFF(rx_bytes), 1.0 / 1024)
                                 : put_link(g, f, sc, LINK_OFF(rx_bytes), VT_ULL, 1.0 / 1024);
    case NVML_FI_DEV_REMAPPED_COR: return put(f, &g->remap_cor, VT_UINT, 1);
    case NVML_FI_DEV_REMAPPED_UNC: return put(f, &g->remap_unc, VT_UINT, 1);
    case NVML_FI_DEV_REMAPPED_PENDING: return put(f, &g->remap_pending, VT_UINT, 1);
    case NVML_FI_DEV_REMAPPED_FAILURE: return put(f, &g->remap_failure, VT_UINT, 1);
    case NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: return put_link_sum(g, f, LINK_OFF(ecc_errors), 1);
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: return put_link(g, f, sc, LINK_OFF(replay_errors), VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: return put_link(g, f, sc, LINK_OFF(recovery_errors), VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: return put_link(g, f, sc, LINK_OFF(crc_errors), VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_GET_SPEED: return put_link(g, f, sc, LINK_OFF(speed_mbps), VT_UINT, 1);
    case NVML_FI_DEV_NVLINK_GET_STATE: return put_link(g, f, sc, LINK_OFF(state), VT_UINT, 1);
    case NVML_FI_DEV_NVLINK_GET_VERSION: return put_link(g, f, sc, LINK_OFF(version), VT_UINT, 1);
    /* scopeId is the nvmlPowerScopeType_t: 0 GPU, 1 module (not simulated), 2 GPU memory (average only,
       as an H100 reports "GPU Memory Power Readings: Instantaneous Power Draw: N/A") */
    case NVML_FI_DEV_POWER_AVERAGE:
        if (sc == POWER_SCOPE_MEMORY) return put(f, &g->power_mem_mw, VT_UINT, 1);
        if (sc != POWER_SCOPE_GPU) return NVML_ERROR_NOT_SUPPORTED;
        /* no average (before Ampere, where nvidia-smi prints Average Power Draw: N/A): NOT_SUPPORTED */
        return put(f, &g->power_avg_mw, VT_UINT, 1);
    case NVML_FI_DEV_POWER_INSTANT:
        return sc == POWER_SCOPE_GPU ? put(f, &g->power_mw, VT_UINT, 1) : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_POWER_MIN_LIMIT: return put(f, &g->min_limit_mw, VT_UINT, 1);
    case NVML_FI_DEV_POWER_MAX_LIMIT: return put(f, &g->max_limit_mw, VT_UINT, 1);
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT: return put(f, &g->default_limit_mw, VT_UINT, 1);
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: return put(f, &g->enforced_limit_mw, VT_UINT, 1);
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT: return put(f, &g->power_limit_mw, VT_UINT, 1);
    /* thresholds relative to T.Limit, as nvidia-smi prints them; kinds in the order of the fields */
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT: case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT:
        return put_tlimit(g, f, (int)(id - NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT));
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES: return put(f, &g->pcie_tx_bytes, VT_ULL, 1);
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: return put(f, &g->pcie_rx_bytes, VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES: return put_link(g, f, sc, LINK_OFF(tx_bytes), VT_ULL, 1);
    case NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES: return put_link(g, f, sc, LINK_OFF(rx_bytes), VT_ULL, 1);
    default:
        /* per-link error counters of the first six links, one field id per link */
        if (id >= NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 && id <= NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L5)
            return put_link(g, f, id - NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, LINK_OFF(crc_errors), VT_ULL, 1);
        if (id >= NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 && id <= NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L5)
            return put_link(g, f, id - NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, LINK_OFF(replay_errors), VT_ULL, 1);
        if (id >= NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0 && id <= NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L5)
            return put_link(g, f, id - NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, LINK_OFF(recovery_errors),
                            VT_ULL, 1);
        if (id >= 1000) return NVML_ERROR_INVALID_ARGUMENT; /* far beyond any NVML_FI_MAX: a garbage id */
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int n, nvmlFieldValue_t *values) {
    DEV(F_nvmlDeviceGetFieldValues, 0);
    NEED(values && n >= 0);
    long long ts = (long long)(now_s() * 1e6);
    for (int i = 0; i < n; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = ts;
        f->latencyUsec = 0;
        f->nvmlReturn = fault(F_nvmlDeviceGetFieldValues, slot_of(g), (int)f->fieldId);
        if (f->nvmlReturn == NVML_SUCCESS) f->nvmlReturn = field(g, f);
    }
    return NVML_SUCCESS;
}

/* ---- MIG -------------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned *cur, unsigned *pend) {
    DEV(F_nvmlDeviceGetMigMode, 0);
    NEED(cur && pend);
    GET(&g->mig_current);
    *cur = u32(&g->mig_current);
    *pend = g->mig_pending.ret ? *cur : u32(&g->mig_pending);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned *c) {
    DEV(F_nvmlDeviceGetMaxMigDeviceCount, 0);
    NEED(c);
    GET(&g->mig_current);
    *c = SIM_MAX_MIG;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned idx, nvmlDevice_t *out) {
    DEV(F_nvmlDeviceGetMigDeviceHandleByIndex, 0);
    NEED(out);
    GET(&g->mig_current);
    if (u32(&g->mig_current) != 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (idx >= SIM_MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (idx >= (unsigned)g->mig_count) return NVML_ERROR_NOT_FOUND;
    *out = mig_handle(slot_of(g), (int)idx);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev, nvmlDevice_t *out) {
    DEV(F_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, ALLOW_MIG);
    NEED(out);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    *out = gpu_handle(slot_of(g));
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned *is_mig) {
    DEV(F_nvmlDeviceIsMigDeviceHandle, ALLOW_MIG);
    NEED(is_mig);
    *is_mig = m != NULL;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned *id) {
    DEV(F_nvmlDeviceGetGpuInstanceId, ALLOW_MIG);
    NEED(id);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->gi_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned *id) {
    DEV(F_nvmlDeviceGetComputeInstanceId, ALLOW_MIG);
    NEED(id);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    *id = m->ci_id;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev, nvmlDeviceAttributes_t *a) {
    DEV(F_nvmlDeviceGetAttributes_v2, ALLOW_MIG);
    NEED(a);
    if (!m) return NVML_ERROR_NOT_SUPPORTED; /* attributes of a full GPU: not simulated */
    a->multiprocessorCount = m->sm_count;
    a->sharedCopyEngineCount = m->ce_count;
    a->sharedDecoderCount = m->dec_count;
    a->sharedEncoderCount = m->enc_count;
    a->sharedJpegCount = m->jpg_count;
    a->sharedOfaCount = m->ofa_count;
    a->gpuInstanceSliceCount = m->gi_slices;
    a->computeInstanceSliceCount = m->ci_slices;
    a->memorySizeMB = m->mem_total.ret ? 0 : u64(&m->mem_total) >> 20;
    return NVML_SUCCESS;
}

/* ---- processes ---------------------------------------------------------------------------- */

/* nvmlProcessInfo_v2_t, which the _v2 and _v3 calls take (R535.43-535.86 headers gave _v3 a larger
 * struct without a version bump; later drivers went back to this one, as pynvml does), and the
 * v1 struct of the unsuffixed calls, the only ones drivers before R450 have. */
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;

/* v1: write nvmlProcessInfo_v1_t records (16 bytes each) instead of nvmlProcessInfo_t (24). */
static nvmlReturn_t procs(sim_gpu_t *g, sim_mig_t *m, unsigned kind, unsigned *n, void *out, int v1) {
    NEED(n);
    unsigned have = 0;
    for (int i = 0; i < g->proc_count && i < SIM_MAX_PROCS; i++) {
        sim_proc_t *p = &g->procs[i];
        if (!(p->kind & kind) || (m && (p->gi_id != m->gi_id || p->ci_id != m->ci_id))) continue;
        if (out && have < *n) {
            if (v1) {
                ((nvmlProcessInfo_v1_t *)out)[have] = (nvmlProcessInfo_v1_t){p->pid, p->used_mem};
            } else {
                ((nvmlProcessInfo_t *)out)[have] = (nvmlProcessInfo_t){p->pid, p->used_mem, p->gi_id, p->ci_id};
            }
        }
        have++;
    }
    if (!out || have > *n) {
        nvmlReturn_t r = have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
        *n = have;
        return r;
    }
    *n = have;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetComputeRunningProcesses_v3, ALLOW_MIG); return procs(g, m, 1, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetGraphicsRunningProcesses_v3, ALLOW_MIG); return procs(g, m, 2, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetMPSComputeRunningProcesses_v3, ALLOW_MIG); return procs(g, m, 4, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetComputeRunningProcesses_v2, ALLOW_MIG); return procs(g, m, 1, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetGraphicsRunningProcesses_v2, ALLOW_MIG); return procs(g, m, 2, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_t *p) { DEV(F_nvmlDeviceGetMPSComputeRunningProcesses_v2, ALLOW_MIG); return procs(g, m, 4, n, p, 0); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_v1_t *p) { DEV(F_nvmlDeviceGetComputeRunningProcesses, ALLOW_MIG); return procs(g, m, 1, n, p, 1); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_v1_t *p) { DEV(F_nvmlDeviceGetGraphicsRunningProcesses, ALLOW_MIG); return procs(g, m, 2, n, p, 1); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t dev, unsigned *n, nvmlProcessInfo_v1_t *p) { DEV(F_nvmlDeviceGetMPSComputeRunningProcesses, ALLOW_MIG); return procs(g, m, 4, n, p, 1); }

typedef struct { unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *out, unsigned *n, unsigned long long since) {
    DEV(F_nvmlDeviceGetProcessUtilization, 0);
    NEED(n);
    (void)since;
    unsigned have = 0;
    /* sm_util 0xFFFFFFFF: the process has no utilization sample (a capture's pmon never sampled it) */
    for (int i = 0; i < g->proc_count && i < SIM_MAX_PROCS; i++) have += (g->procs[i].kind & 1) && g->procs[i].sm_util != 0xFFFFFFFFu;
    if (have == 0) { *n = 0; return NVML_ERROR_NOT_FOUND; } /* no samples since `since` */
    if (!out || *n < have) { *n = have; return NVML_ERROR_INSUFFICIENT_SIZE; }
    unsigned k = 0, cap = *n;
    unsigned long long ts = (unsigned long long)(now_s() * 1e6);
    for (int i = 0; i < g->proc_count && i < SIM_MAX_PROCS && k < cap; i++) { /* state may change meanwhile */
        sim_proc_t *p = &g->procs[i];
        if (!(p->kind & 1) || p->sm_util == 0xFFFFFFFFu) continue;
        out[k++] = (nvmlProcessUtilizationSample_t){p->pid, ts, p->sm_util, p->mem_util, 0, 0};
    }
    *n = k;
    return NVML_SUCCESS;
}

/* ---- events --------------------------------------------------------------------------------- */

#define MAX_SETS 64
typedef struct {
    int used;
    uint64_t next_seq;
    unsigned long long mask[SIM_MAX_GPUS];
} sim_set_t;
static sim_set_t SETS[MAX_SETS];
typedef sim_set_t *nvmlEventSet_t;

static sim_set_t *set_of(nvmlEventSet_t s) {
    uintptr_t a = (uintptr_t)s, b = (uintptr_t)SETS;
    if (a < b || a >= b + sizeof(SETS) || (a - b) % sizeof(sim_set_t)) return NULL;
    return s->used ? s : NULL;
}

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *out) {
    SYS(F_nvmlEventSetCreate);
    NEED(out);
    pthread_mutex_lock(&L);
    for (int i = 0; i < MAX_SETS; i++) {
        if (SETS[i].used) continue;
        memset(&SETS[i], 0, sizeof(SETS[i]));
        SETS[i].used = 1;
        SETS[i].next_seq = __atomic_load_n(&S->event_head, __ATOMIC_ACQUIRE);
        *out = &SETS[i];
        pthread_mutex_unlock(&L);
        return NVML_SUCCESS;
    }
    pthread_mutex_unlock(&L);
    return NVML_ERROR_MEMORY;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    SYS(F_nvmlEventSetFree);
    pthread_mutex_lock(&L);
    sim_set_t *s = set_of(set);
    if (s) s->used = 0;
    pthread_mutex_unlock(&L);
    return s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    DEV(F_nvmlDeviceGetSupportedEventTypes, 0);
    NEED(types);
    *types = g->supported_events;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    DEV(F_nvmlDeviceRegisterEvents, 0);
    pthread_mutex_lock(&L);
    sim_set_t *s = set_of(set);
    nvmlReturn_t r = NVML_ERROR_INVALID_ARGUMENT;
    if (s && (types & ~g->supported_events) == 0) {
        s->mask[slot_of(g)] |= types;
        r = NVML_SUCCESS;
    } else if (s) {
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&L);
    return r;
}

/* Next queued event for this set, or 0. Events older than the ring are skipped. */
static int next_event(sim_set_t *s, nvmlEventData_t *d) {
    uint64_t head = __atomic_load_n(&S->event_head, __ATOMIC_ACQUIRE);
    if (head > s->next_seq + SIM_MAX_EVENTS) s->next_seq = head - SIM_MAX_EVENTS;
    while (s->next_seq < head) {
        sim_event_t *e = &S->events[s->next_seq % SIM_MAX_EVENTS];
        s->next_seq++;
        if (e->gpu < 0 || e->gpu >= SIM_MAX_GPUS || !(s->mask[e->gpu] & e->type)) continue;
        d->device = gpu_handle(e->gpu);
        d->eventType = e->type;
        d->eventData = e->data;
        d->gpuInstanceId = e->gi_id;
        d->computeInstanceId = e->ci_id;
        return 1;
    }
    return 0;
}

/* Sleep until the event head is no longer `seen` (in its low 32 bits) or `seconds` pass: a futex on
   the shared state file, which SimState.queue_event wakes after queuing. Real NVML blocks in the
   kernel the same way; a writer that does not wake is seen within half a second. */
static void wait_head(uint64_t seen, double seconds) {
    if (seconds > 0.5) seconds = 0.5;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, (uint32_t *)&S->event_head, FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    NEED(data);
    double deadline = now_s() + timeout_ms / 1000.0;
    for (;;) {
        uint64_t seen = __atomic_load_n(&S->event_head, __ATOMIC_ACQUIRE);
        pthread_mutex_lock(&L);
        sim_set_t *s = set_of(set);
        int got = s ? next_event(s, data) : -1;
        pthread_mutex_unlock(&L);
        if (got < 0) return NVML_ERROR_INVALID_ARGUMENT;
        if (got) return NVML_SUCCESS;
        double left = deadline - now_s();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        wait_head(seen, left);
    }
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    SYS(F_nvmlEventSetWait_v2);
    return wait_event(set, data, timeout_ms);
}

/* The pre-R450 event struct: no MIG instance ids. nvmlEventSetWait fills only these 24 bytes. */
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; } nvmlEventData_v1_t;

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t *data, unsigned timeout_ms) {
    SYS(F_nvmlEventSetWait);
    NEED(data);
    nvmlEventData_t full;
    nvmlReturn_t r = wait_event(set, &full, timeout_ms);
    if (r == NVML_SUCCESS) *data = (nvmlEventData_v1_t){full.device, full.eventType, full.eventData};
    return r;
}

/* ---- GPM ----------------------------------------------------------------------------------- */

#define MAX_SAMPLES 4096
typedef struct { int used, taken, slot, gi; double t; } sim_sample_t;
static sim_sample_t SAMPLES[MAX_SAMPLES];
typedef sim_sample_t *nvmlGpmSample_t;

static sim_sample_t *sample_of(nvmlGpmSample_t p) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)SAMPLES;
    if (a < b || a >= b + sizeof(SAMPLES) || (a - b) % sizeof(sim_sample_t)) return NULL;
    return p->used ? p : NULL;
}

typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *s) {
    DEV(F_nvmlGpmQueryDeviceSupport, 0);
    NEED(s);
    if (s->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    GET(&g->gpm_supported);
    s->isSupportedDevice = u32(&g->gpm_supported);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t dev, unsigned *state) {
    DEV(F_nvmlGpmQueryIfStreamingEnabled, 0);
    NEED(state);
    *state = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    SYS(F_nvmlGpmSampleAlloc);
    NEED(out);
    pthread_mutex_lock(&L);
    for (int i = 0; i < MAX_SAMPLES; i++) {
        if (SAMPLES[i].used) continue;
        SAMPLES[i] = (sim_sample_t){1, 0, -1, -1, 0};
        *out = &SAMPLES[i];
        pthread_mutex_unlock(&L);
        return NVML_SUCCESS;
    }
    pthread_mutex_unlock(&L);
    return NVML_ERROR_MEMORY;
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t p) {
    SYS(F_nvmlGpmSampleFree);
    pthread_mutex_lock(&L);
    sim_sample_t *s = sample_of(p);
    if (s) s->used = 0;
    pthread_mutex_unlock(&L);
    return s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t take_sample(sim_gpu_t *g, int gi, nvmlGpmSample_t p) {
    GET(&g->gpm_supported);
    if (u32(&g->gpm_supported) != 1) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&L);
    sim_sample_t *s = sample_of(p);
    if (s) { s->taken = 1; s->slot = slot_of(g); s->gi = gi; s->t = now_s(); }
    pthread_mutex_unlock(&L);
    return s ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t p) {
    DEV(F_nvmlGpmSampleGet, 0);
    return take_sample(g, -1, p);
}

API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned gi_id, nvmlGpmSample_t p) {
    DEV(F_nvmlGpmMigSampleGet, 0);
    for (int i = 0; i < g->mig_count && i < SIM_MAX_MIG; i++)
        if (g->migs[i].gi_id == gi_id) return take_sample(g, (int)gi_id, p);
    return NVML_ERROR_INVALID_ARGUMENT;
}

#define GPM_METRIC_MAX 477 /* metrics[] length of nvmlGpmMetricsGet_t (NVML_GPM_METRIC_MAX) */
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct { unsigned version, numMetrics; nvmlGpmSample_t sample1, sample2; nvmlGpmMetric_t metrics[]; } nvmlGpmMetricsGet_t;

API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    SYS(F_nvmlGpmMetricsGet);
    NEED(mg);
    if (mg->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (mg->numMetrics > GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&L);
    sim_sample_t *a = sample_of(mg->sample1), *b = sample_of(mg->sample2);
    sim_sample_t s1 = a ? *a : (sim_sample_t){0}, s2 = b ? *b : (sim_sample_t){0};
    pthread_mutex_unlock(&L);
    if (!a || !b || !s1.taken || !s2.taken || s1.slot != s2.slot || s1.gi != s2.gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu_t *g = &S->gpus[s1.slot];
    if (!g->present || g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->reset_required) return NVML_ERROR_RESET_REQUIRED;
    sim_val_t *vals = g->gpm;
    if (s1.gi >= 0) {
        vals = NULL;
        for (int i = 0; i < g->mig_count && i < SIM_MAX_MIG; i++)
            if ((int)g->migs[i].gi_id == s1.gi) vals = g->migs[i].gpm;
        if (!vals) return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *mt = &mg->metrics[i];
        mt->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        mt->value = 0;
        mt->metricInfo = (nvmlGpmMetricInfo_t){"sim", "simulated metric", "%"};
        for (int k = 0; k < SIM_GPM_SLOTS; k++) {
            if (SIM_GPM_IDS[k] != mt->metricId) continue;
            mt->nvmlReturn = vals[k].ret;
            if (!vals[k].ret) mt->value = eval(&vals[k]);
        }
    }
    return NVML_SUCCESS;
}
