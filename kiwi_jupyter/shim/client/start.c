/* Starting the comm thread the first time the process does GPU work, and starting afresh in
 * a forked child, which has no comm thread and must not write on its parent's connection.
 *
 * The first GPU work is seen by the entry points and the mechanisms, which never call the
 * client: as the library loads, the client hands kiwi_comm_start down to the mechanisms
 * (kiwi_news_subscribe), and the first thing that needs the client starts it from there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

static atomic_bool started;
static atomic_bool held_off; /* the conformance entry points drive the client: no thread */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* ---- fork ------------------------------------------------------------------------------ */

static void before_fork(void)
{
    pthread_mutex_lock(&kiwi_lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&kiwi_lock);
}

/* The child has no comm thread and must not write on its parent's connection: it starts
 * afresh, and its first GPU call registers it as a client of its own. */
static void after_fork_child(void)
{
    kiwi_gate_after_fork(); /* first: kiwi_lock afresh */
    pthread_mutex_init(&start_lock, NULL);
    kiwi_news_after_fork();
    kiwi_link_after_fork();
    kiwi_session_after_fork();
    kiwi_ask_after_lost();
    kiwi_release_after_fork();
    kiwi_residency_after_fork();
    kiwi_way_out_after_fork();
    kiwi_room_after_fork();
    for (int i = 0; i < 2; i++) {
        if (kiwi_wake_pipe[i] >= 0)
            close(kiwi_wake_pipe[i]);
        kiwi_wake_pipe[i] = -1;
    }
    bool policy_set = kiwi_comm.policy_set, closed = kiwi_comm.policy_closed;
    double timeout = kiwi_comm.policy_timeout;
    memset(&kiwi_comm, 0, sizeof kiwi_comm); /* the hold too: idle (hold.c) */
    kiwi_comm.policy_set = policy_set;
    kiwi_comm.policy_closed = closed;
    kiwi_comm.policy_timeout = timeout;
    atomic_store(&started, false);
    if (!getenv("KIWI_CLIENT_NAME") || !*getenv("KIWI_CLIENT_NAME"))
        snprintf(kiwi_cfg.name, sizeof kiwi_cfg.name, "%s-%d", program_invocation_short_name,
                 (int)getpid());
    kiwi_memory_after_fork();
    kiwi_pager_after_fork();
    kiwi_capture_after_fork();
    kiwi_pool_after_fork();
}

static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- starting -------------------------------------------------------------------------- */


bool kiwi_comm_started(void)
{
    return atomic_load(&started);
}

bool kiwi_comm_hold_off(void)
{
    pthread_mutex_lock(&start_lock);
    if (!atomic_load(&started))
        atomic_store(&held_off, true);
    pthread_mutex_unlock(&start_lock);
    return atomic_load(&held_off);
}

void kiwi_comm_start(void)
{
    if (!kiwi_cfg.enabled || atomic_load(&started) || atomic_load(&held_off))
        return;
    pthread_once(&fork_once, register_fork_handlers);
    pthread_mutex_lock(&start_lock);
    if (!atomic_load(&started) && !atomic_load(&held_off) && pipe2(kiwi_wake_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        kiwi_news_listen(kiwi_wake_pipe[1]);
        pthread_mutex_lock(&kiwi_lock);
        kiwi_comm.outage_since = kiwi_now();
        if (!kiwi_comm.policy_set) {
            kiwi_comm.policy_closed = kiwi_cfg.fail_closed;
            kiwi_comm.policy_timeout = kiwi_cfg.fail_timeout;
        }
        pthread_mutex_unlock(&kiwi_lock);
        if (kiwi_thread_start(kiwi_comm_main))
            atomic_store(&started, true);
        else
            kiwi_warn("could not start the scheduler client thread; GPU work runs unscheduled");
        if (!atomic_load(&started)) {
            pthread_mutex_lock(&kiwi_lock);
            kiwi_comm.stats.failed_open = true;
            kiwi_gate_open();
            pthread_mutex_unlock(&kiwi_lock);
        }
    }
    pthread_mutex_unlock(&start_lock);
}

/* Runs as the library is loaded, before any entry point can be called. */
__attribute__((constructor)) static void subscribe(void)
{
    kiwi_news_subscribe(kiwi_comm_start);
}
