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

/* The process's client: the comm thread's, once started (comm.c). */
static struct kiwi_client process_client = {.wake_pipe = {-1, -1}, .link = {.fd = -1}};
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
    struct kiwi_client *c = &process_client;
    kiwi_link_after_fork(c);
    for (int i = 0; i < 2; i++)
        if (c->wake_pipe[i] >= 0)
            close(c->wake_pipe[i]);
    bool policy_set = c->policy_set, closed = c->policy_closed;
    double timeout = c->policy_timeout;
    kiwi_client_init(c); /* the hold too: idle (hold.c) */
    c->policy_set = policy_set;
    c->policy_closed = closed;
    c->policy_timeout = timeout;
    kiwi_way_out_after_fork();
    kiwi_tiers_after_fork();
    kiwi_room_after_fork();
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

struct kiwi_client *kiwi_client_of_process(void)
{
    return &process_client;
}

void kiwi_client_init(struct kiwi_client *c)
{
    memset(c, 0, sizeof *c);
    c->wake_pipe[0] = c->wake_pipe[1] = -1;
    c->link.fd = -1;
}


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
    struct kiwi_client *c = &process_client;
    pthread_once(&fork_once, register_fork_handlers);
    pthread_mutex_lock(&start_lock);
    if (!atomic_load(&started) && !atomic_load(&held_off) &&
        pipe2(c->wake_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
        kiwi_news_listen(c->wake_pipe[1]);
        pthread_mutex_lock(&kiwi_lock);
        c->outage_since = kiwi_now();
        if (!c->policy_set) {
            c->policy_closed = kiwi_cfg.fail_closed;
            c->policy_timeout = kiwi_cfg.fail_timeout;
        }
        pthread_mutex_unlock(&kiwi_lock);
        if (kiwi_thread_start(kiwi_comm_main))
            atomic_store(&started, true);
        else
            kiwi_warn("could not start the scheduler client thread; GPU work runs unscheduled");
        if (!atomic_load(&started)) {
            pthread_mutex_lock(&kiwi_lock);
            c->stats.failed_open = true;
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
