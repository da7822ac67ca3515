/* The gate: GPU work starts only while this process holds its GPU.
 *
 * Every launch, copy and memset passes here, so the open gate must cost almost nothing: two
 * atomic operations, no lock. The subtle part is closing it. The comm thread must know that,
 * once it has closed the gate and seen no call inside, no call can still slip through; a call
 * must know that, once it is inside, the comm thread will wait for it before synchronizing.
 * This is Dekker's handshake on two sequentially consistent atomics:
 *
 *     caller:  in_flight += 1; if open: go       comm thread:  open = 0; wait in_flight == 0
 *
 * Under seq_cst at least one side sees the other's write: either the caller sees the gate
 * closed (and backs out, undoing its increment), or the comm thread sees the caller inside
 * (and waits). The caller that brings in_flight to zero while the gate is closed wakes the
 * comm thread under kiwi_lock, which the comm thread holds while it checks, so no wakeup is
 * lost.
 *
 * A call that finds the gate closed waits on kiwi_changed; its count of waiters tells the comm
 * thread to ask the daemon for the GPU (the lazy acquisition of a cell's first GPU call). The
 * gate never calls the client: it starts it and wakes it through news.c, and the comm thread
 * reads the waiters, and sets whether they are refused, under kiwi_lock.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <time.h>

#include "../shim.h"

/* Each on a cache line of its own, and no other variable on theirs (a struct, so that the
 * linker cannot put a neighbour there): in_flight is written by every call, open only read,
 * and last_activity written rarely (see kiwi_gate_exit). */
static struct {
    _Alignas(64) atomic_int open;
    _Alignas(64) atomic_int in_flight;
    _Alignas(64) _Atomic double last_activity;
} gate;

pthread_mutex_t kiwi_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t kiwi_changed = PTHREAD_COND_INITIALIZER;
/* Under kiwi_lock: the calls waiting at the closed gate, the seconds calls have waited there,
 * and whether a call there fails at once (set by the client: fail-closed). */
static int waiters;
static double seconds_waiting;
static bool refusing;
static unsigned given_up; /* waits ended for want of room: a wait that sees it move gives up */

void kiwi_gate_open(void)
{
    atomic_store(&gate.open, 1);
}

void kiwi_gate_close(void)
{
    atomic_store(&gate.open, 0);
}

bool kiwi_gate_is_open(void)
{
    return atomic_load(&gate.open) != 0;
}

int kiwi_gate_waiters(void)
{
    return waiters;
}

double kiwi_gate_seconds_waiting(void)
{
    return seconds_waiting;
}

void kiwi_gate_refuse(bool refuse)
{
    refusing = refuse;
}

bool kiwi_gate_refusing(void)
{
    return refusing;
}

void kiwi_gate_give_up(void)
{
    given_up++;
    pthread_cond_broadcast(&kiwi_changed);
}

unsigned kiwi_gate_give_ups(void)
{
    return given_up;
}

int kiwi_gate_in_flight(void)
{
    return atomic_load(&gate.in_flight);
}

/* The idle timer needs milliseconds, not nanoseconds: the coarse clock costs a few
 * nanoseconds. */
static inline double coarse_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* last_activity doubles as a mark: kiwi_gate_mark stores the time negated, and the next call to
 * leave the gate stores a positive time (it differs), so a sign tells whether any call has left
 * since. Free for the gate's fast path, which stores the time anyway. */
double kiwi_gate_last_activity(void)
{
    double when = atomic_load_explicit(&gate.last_activity, memory_order_relaxed);
    return when < 0 ? -when : when;
}

void kiwi_gate_mark(void)
{
    double now = coarse_now();
    atomic_store(&gate.last_activity, now > 0 ? -now : -1e-9);
}

bool kiwi_gate_used_since_mark(void)
{
    return atomic_load(&gate.last_activity) >= 0;
}

/* Leaves the gate; the last one out of a closed gate wakes the comm thread waiting to drain. */
static void leave(bool locked)
{
    if (atomic_fetch_sub(&gate.in_flight, 1) == 1 && !atomic_load(&gate.open)) {
        if (!locked)
            pthread_mutex_lock(&kiwi_lock);
        pthread_cond_broadcast(&kiwi_changed);
        if (!locked)
            pthread_mutex_unlock(&kiwi_lock);
    }
}

static bool try_enter(bool locked)
{
    atomic_fetch_add(&gate.in_flight, 1);
    if (atomic_load(&gate.open))
        return true;
    leave(locked);
    return false;
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec = (long)((whole - (double)(time_t)whole) * 1e9);
}

/* Out of line: inlined, the closed gate's wait made the open gate's path save registers and set
 * up a stack guard on every call. */
__attribute__((noinline)) static CUresult wait_for_grant(void)
{
    kiwi_news_need_client();
    kiwi_pager_note_context(NULL);
    double started = kiwi_now();
    unsigned interrupts = kiwi_interrupts();
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&kiwi_lock);
    unsigned gave_up = given_up;
    waiters++;
    kiwi_news_wake(); /* the comm thread asks for the GPU */
    for (;;) {
        if (try_enter(true))
            break;
        if (refusing) {
            result = CUDA_ERROR_SYSTEM_NOT_READY;
            break;
        }
        if (given_up != gave_up) {
            result = CUDA_ERROR_OUT_OF_MEMORY; /* the client said why */
            break;
        }
        if (kiwi_interrupts() != interrupts) {
            kiwi_log("interrupted while waiting for the GPU");
            result = CUDA_ERROR_SYSTEM_NOT_READY;
            break;
        }
        /* Timed, so that a missed broadcast could only ever cost a moment, never a hang. */
        struct timespec deadline;
        deadline_after(&deadline, 0.5);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &deadline);
    }
    waiters--;
    seconds_waiting += kiwi_now() - started;
    pthread_mutex_unlock(&kiwi_lock);
    return result;
}

CUresult kiwi_gate_enter(void)
{
    if (!kiwi_cfg.enabled || try_enter(false))
        return CUDA_SUCCESS;
    return wait_for_grant();
}

void kiwi_gate_exit(void)
{
    if (!kiwi_cfg.enabled)
        return;
    /* Storing only when the coarse clock moved keeps threads launching at once from fighting
     * over the cache line. */
    double now = coarse_now();
    if (atomic_load_explicit(&gate.last_activity, memory_order_relaxed) != now)
        atomic_store_explicit(&gate.last_activity, now, memory_order_relaxed);
    leave(false);
}

void kiwi_gate_drain(void)
{
    pthread_mutex_lock(&kiwi_lock);
    while (atomic_load(&gate.in_flight) > 0) {
        struct timespec deadline;
        deadline_after(&deadline, 0.05);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &deadline);
    }
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_gate_after_fork(void)
{
    /* The child holds nothing: its first GPU call asks the daemon as a client of its own. */
    pthread_mutex_init(&kiwi_lock, NULL);
    pthread_cond_init(&kiwi_changed, NULL);
    atomic_store(&gate.open, 0);
    atomic_store(&gate.in_flight, 0);
    waiters = 0;
    seconds_waiting = 0;
    refusing = false;
    given_up = 0;
}
