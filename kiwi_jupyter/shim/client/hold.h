/* The hold: what this process has of its GPU, as the comm thread sees it, and the moves between
 * its states that are legal. kiwi_hold_move (hold.c) is the only writer of the hold, and
 * refuses any move this table does not list.
 *
 * Written by hand until the protocol's message table (nodeside/protocol/) generates the shim's
 * client/protocol.h; that header must then provide these two lists, under these names, and
 * hold.c includes it instead:
 *
 *   KIWI_HOLD_STATES(X)  X(NAME, "word") for each state, IDLE first (a zeroed client holds
 *                        nothing): the enum kiwi_hold (KIWI_IDLE, ...) and the words the
 *                        statistics show;
 *   KIWI_HOLD_MOVES(X)   X(FROM, TO) for each legal move.
 */
#ifndef KIWI_HOLD_H
#define KIWI_HOLD_H

/* idle: nothing asked for, nothing held; waiting: acquire sent, no grant yet; holding:
 * granted, the gate open (unless paused for another holder's turn); releasing: the gate closed
 * for the release sequence (release.c), until the GPU is handed back or kept after all. */
#define KIWI_HOLD_STATES(X) \
    X(IDLE, "idle")         \
    X(WAITING, "waiting")   \
    X(HOLDING, "holding")   \
    X(RELEASING, "releasing")

/* idle -> waiting: a call waits at the gate, or an eager acquire.
 * waiting -> holding: a grant; -> idle: the wait is released (a cell's end), or the
 *     connection is lost.
 * holding -> releasing: a drop, a cell's end or an idle spell starts the release sequence;
 *     -> idle: revoked, or the connection lost.
 * releasing -> holding: the release cannot go ahead (a graph capture began, or work may still
 *     run); -> idle: released, or the connection lost. */
#define KIWI_HOLD_MOVES(X) \
    X(IDLE, WAITING)       \
    X(WAITING, HOLDING)    \
    X(WAITING, IDLE)       \
    X(HOLDING, RELEASING)  \
    X(HOLDING, IDLE)       \
    X(RELEASING, HOLDING)  \
    X(RELEASING, IDLE)

#define KIWI_HOLD_ENUM(name, word) KIWI_##name,
enum kiwi_hold { KIWI_HOLD_STATES(KIWI_HOLD_ENUM) KIWI_HOLD_COUNT };
#undef KIWI_HOLD_ENUM

#endif
