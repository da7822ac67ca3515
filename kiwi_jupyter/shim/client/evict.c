/* Which evictor pages this process out, as the client settles it with the daemon: register
 * proposes what the pager offers (mechanisms/pager.c: vmm where KIWI_EVICT and the device allow
 * it, else checkpoint where KIWI_EVICT and the driver allow it, else managed), and the daemon
 * answers in `registered` with the evictor it will carry out (managed when it cannot act on
 * this pid). vmm and managed need nobody's help, and the pager takes them on its own; the
 * pager's choice follows a checkpoint answer; the first choice stands, since allocations are
 * made for it. A daemon that predates vmm refuses the word in register: link.c registers again
 * proposing managed, which to such a daemon means the same (the process pages itself).
 */
#define _GNU_SOURCE
#include <string.h>

#include "client.h"

const char *kiwi_evict_proposal(void)
{
    return kiwi_evictor_name(kiwi_pager_offer());
}

void kiwi_evict_answered(const char *evictor)
{
    if (kiwi_pager_evictor() != KIWI_EVICTOR_UNDECIDED) {
        /* A new daemon after a restart: what was allocated stays what it is. */
        if (kiwi_pager_checkpointing() && strcmp(evictor, "checkpoint") != 0)
            kiwi_warn("the scheduler no longer checkpoints this process; its device memory "
                      "cannot be paged out until it is restarted");
        return;
    }
    if (strcmp(evictor, "checkpoint") == 0)
        kiwi_pager_choose(KIWI_EVICTOR_CHECKPOINT, NULL);
    else if (strcmp(evictor, "vmm") == 0 && kiwi_pager_offer() == KIWI_EVICTOR_VMM)
        kiwi_pager_choose(KIWI_EVICTOR_VMM, NULL);
    else if (!kiwi_pager_settle_offer())
        kiwi_pager_choose(KIWI_EVICTOR_MANAGED,
                          evictor[0] ? "the scheduler cannot checkpoint it (its log says why)"
                                     : "the scheduler does not know the checkpoint evictor");
}
