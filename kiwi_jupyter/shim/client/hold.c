/* The hold's one writer. Every change of kiwi_comm.stats.hold goes through kiwi_hold_move,
 * against the table of legal moves in hold.h, so that the comm thread's state machine is the
 * table and nothing else: a move the table does not list is a bug in the caller. It is refused
 * (the hold stays where it is, and the caller sees false), and said aloud in checked builds
 * (KIWI_CHECKED: the sanitizer builds the tests run, which fail on the line); a shipped build
 * says it only with KIWI_SHIM_LOG=1.
 */
#define _GNU_SOURCE
#include "client.h"

#define KIWI_HOLD_WORD(name, word) [KIWI_##name] = word,
static const char *const words[KIWI_HOLD_COUNT] = {KIWI_HOLD_STATES(KIWI_HOLD_WORD)};
#undef KIWI_HOLD_WORD

#define KIWI_HOLD_LEGAL(from, to) [KIWI_##from][KIWI_##to] = true,
static const bool legal[KIWI_HOLD_COUNT][KIWI_HOLD_COUNT] = {KIWI_HOLD_MOVES(KIWI_HOLD_LEGAL)};
#undef KIWI_HOLD_LEGAL

_Static_assert(KIWI_IDLE == 0, "a zeroed client (a forked child's) holds nothing");

const char *kiwi_hold_name(enum kiwi_hold hold)
{
    return (unsigned)hold < KIWI_HOLD_COUNT ? words[hold] : "idle";
}

bool kiwi_hold_move(enum kiwi_hold to)
{
    enum kiwi_hold from = kiwi_comm.stats.hold;
    if ((unsigned)from < KIWI_HOLD_COUNT && (unsigned)to < KIWI_HOLD_COUNT && legal[from][to]) {
        kiwi_comm.stats.hold = to;
        return true;
    }
#ifdef KIWI_CHECKED
    kiwi_warn("BUG: the hold cannot move from %s to %s; refused", kiwi_hold_name(from),
              kiwi_hold_name(to));
#else
    kiwi_log("the hold cannot move from %s to %s; refused", kiwi_hold_name(from),
             kiwi_hold_name(to));
#endif
    return false;
}
