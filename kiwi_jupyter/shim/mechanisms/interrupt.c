/* Ctrl-C in a notebook: a wait for the GPU must end when the user interrupts the cell.
 *
 * A cell that waits for the GPU waits in C, inside a CUDA call, on the kernel's main thread.
 * Python's SIGINT handler only notes the signal there; the KeyboardInterrupt is raised once
 * the thread is back in the interpreter, which a wait for a grant may not be for minutes. So
 * the shim puts a handler of its own in front of the kernel's (kiwi_shim_catch_interrupts, which
 * the kernel calls as each cell starts, since ipykernel installs its handler per cell): it
 * counts the interrupt and wakes the comm thread through its pipe (both async-signal-safe),
 * then hands the signal on to the kernel's handler. The comm thread wakes the waiters, and a
 * wait that began before the count moved gives up: its call returns
 * CUDA_ERROR_SYSTEM_NOT_READY and Python raises the KeyboardInterrupt it noted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "../shim.h"

static atomic_uint interrupts;
static struct sigaction kernels_handler;

unsigned kiwi_interrupts(void)
{
    return atomic_load(&interrupts);
}

void kiwi_interrupt(void)
{
    atomic_fetch_add(&interrupts, 1);
    kiwi_news_wake(); /* one write(2); the comm thread broadcasts once it wakes */
}

static void on_interrupt(int sig, siginfo_t *info, void *context)
{
    struct sigaction next = kernels_handler;
    if (!(next.sa_flags & SA_SIGINFO) && next.sa_handler == SIG_IGN)
        return; /* the kernel ignores interrupts now (between cells): so does the shim */
    int saved_errno = errno; /* the interrupted code may be about to read it */
    kiwi_interrupt();
    errno = saved_errno;
    if (next.sa_flags & SA_SIGINFO) {
        next.sa_sigaction(sig, info, context);
    } else if (next.sa_handler == SIG_DFL) {
        /* The default action ends the process: restore it and let it act. */
        signal(sig, SIG_DFL);
        raise(sig);
    } else {
        next.sa_handler(sig);
    }
}

int kiwi_interrupt_catch(void)
{
    struct sigaction current;
    if (sigaction(SIGINT, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_interrupt)
        return 0; /* already in front of the kernel's handler */
    kernels_handler = current;
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_interrupt;
    ours.sa_mask = current.sa_mask;
    ours.sa_flags = SA_SIGINFO | (current.sa_flags & SA_ONSTACK);
    return sigaction(SIGINT, &ours, NULL) == 0 ? 0 : -1;
}
