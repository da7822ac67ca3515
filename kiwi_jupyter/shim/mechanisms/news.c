/* What the mechanisms tell the client, without calling it.
 *
 * The mechanisms sit below the client and never call up into it. Whatever the comm thread must
 * act on, they leave here: a flag it takes when it next wakes (the allocation totals changed),
 * or nothing but the wake-up itself when the comm thread reads the state on its own (a call
 * waiting at the closed gate, the last graph capture over, an interrupt). Waking it is one
 * write(2) of a byte to its pipe, which is async-signal-safe.
 *
 * One thing cannot be a flag: starting the comm thread, the first time something needs it (the
 * first gated call, the first allocation). The client hands its start function down when the
 * library is loaded (kiwi_news_subscribe, from a constructor in client/start.c), and
 * kiwi_news_need_client calls it. Nothing here ever waits for the client.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <unistd.h>

#include "../shim.h"

typedef void (*start_fn)(void);

static atomic_uint posted;
/* The client's own thread, once it runs (what it must never wait for is its own doing). */
static pthread_t client_thread;
static atomic_bool client_thread_known;
/* The write end of the comm thread's pipe; -1 until it exists. Published with an atomic store,
 * so that a thread or signal handler writing to it is ordered after the pipe's creation. */
static atomic_int wake_fd = -1;
static _Atomic(start_fn) start_client;

void kiwi_news_subscribe(void (*start)(void))
{
    atomic_store(&start_client, start);
}

void kiwi_news_listen(int fd)
{
    atomic_store(&wake_fd, fd);
}

void kiwi_news_client_thread(void)
{
    client_thread = pthread_self();
    atomic_store(&client_thread_known, true);
}

bool kiwi_news_on_client_thread(void)
{
    return atomic_load(&client_thread_known) && pthread_equal(client_thread, pthread_self());
}

void kiwi_news_need_client(void)
{
    start_fn start = atomic_load(&start_client);
    if (start)
        start(); /* cheap once it runs: one atomic load */
}

void kiwi_news_wake(void)
{
    int fd = atomic_load(&wake_fd); /* lock-free: safe in a signal handler too */
    if (fd >= 0) {
        ssize_t ignored = write(fd, "!", 1);
        (void)ignored; /* a full pipe already means "wake up" */
    }
}

void kiwi_news_post(unsigned news)
{
    kiwi_news_need_client();
    if ((atomic_fetch_or(&posted, news) & news) != news)
        kiwi_news_wake();
}

void kiwi_news_set(unsigned news)
{
    atomic_fetch_or(&posted, news);
}

unsigned kiwi_news_take(unsigned news)
{
    return atomic_fetch_and(&posted, ~news) & news;
}

void kiwi_news_after_fork(void)
{
    /* The child has no comm thread yet: its pipe is made when it starts one. */
    atomic_store(&wake_fd, -1);
    atomic_store(&posted, 0);
    atomic_store(&client_thread_known, false);
}
