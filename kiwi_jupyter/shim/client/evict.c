/* Which evictor pages this process out, as the client settles it with the daemon: register
 * proposes what the pager offers (mechanisms/pager.c: vmm where KIWI_EVICT and the device allow
 * it, else checkpoint where KIWI_EVICT and the driver allow it, else managed), and the daemon
 * answers in `registered` with the evictor it will carry out (managed when it cannot act on
 * this pid). vmm and managed need nobody's help, and the pager takes them on its own; the
 * pager's choice follows a checkpoint answer; the first choice stands, since allocations are
 * made for it. A daemon that predates vmm refuses the word in register: session.c registers
 * again proposing the evictor's name for old daemons (vmm's: managed, which to such a daemon
 * means the same: the process pages itself).
 */
#define _GNU_SOURCE
#include "client.h"

const char *kiwi_evict_proposal(bool compatible)
{
    const struct kiwi_evictor *offer = kiwi_pager_offer();
    return compatible && offer->name_for_old_daemons ? offer->name_for_old_daemons : offer->name;
}

bool kiwi_evict_proposal_is_new(void)
{
    return kiwi_pager_offer()->name_for_old_daemons != NULL;
}

void kiwi_evict_answered(const char *evictor)
{
    kiwi_pager_answered(evictor);
}
