/* The hold's one writer. Every change of a client's stats.hold goes through kiwi_hold_move,
 * against the protocol's table of a client's legal moves (kiwi_hold_legal in protocol.h,
 * generated from nodeside/protocol/hold.py: the Python clients keep the same table), so that
 * the comm thread's state machine is the table and nothing else: a move the table does not
 * list is a bug in the caller. It is refused (the hold stays where it is, and the caller sees
 * false), and said aloud in checked builds (KIWI_CHECKED: the sanitizer builds the tests run,
 * which fail on the line); a shipped build says it only with KIWI_SHIM_LOG=1.
 */
#define _GNU_SOURCE
#include "client.h"

/* What the statistics call each state: the four words they have always shown (the kernel and
 * its users read them). An acquire not answered yet is waiting as much as one answered so;
 * a hold being given back is releasing, whether the release sequence runs (DROPPING) or a
 * release's answer is awaited (RELEASING). */
static const char *const words[KIWI_HOLD_STATES] = {
    [KIWI_HOLD_IDLE] = "idle",         [KIWI_HOLD_ASKING] = "waiting",
    [KIWI_HOLD_WAITING] = "waiting",   [KIWI_HOLD_HOLDING] = "holding",
    [KIWI_HOLD_DROPPING] = "releasing", [KIWI_HOLD_RELEASING] = "releasing",
};

_Static_assert(KIWI_HOLD_IDLE == 0, "a zeroed client (a forked child's) holds nothing");

const char *kiwi_hold_word(enum kiwi_hold_state hold)
{
    return (unsigned)hold < KIWI_HOLD_STATES ? words[hold] : "idle";
}

bool kiwi_hold_move(struct kiwi_client *c, enum kiwi_hold_state to)
{
    enum kiwi_hold_state from = c->stats.hold;
    if ((unsigned)from < KIWI_HOLD_STATES && (unsigned)to < KIWI_HOLD_STATES &&
        kiwi_hold_legal(from, to)) {
        c->stats.hold = to;
        return true;
    }
#ifdef KIWI_CHECKED
    kiwi_warn("BUG: the hold cannot move from %s to %s; refused", kiwi_hold_state_name(from),
              kiwi_hold_state_name(to));
#else
    kiwi_log("the hold cannot move from %s to %s; refused", kiwi_hold_state_name(from),
             kiwi_hold_state_name(to));
#endif
    return false;
}
