"""A client's side of the hold: six states, and the one table of moves between them.

The daemon keeps its own table (``nodeside/scheduler/gpu_state.py``); this one is what a client
knows from what it sent and what it read, which is not the same thing: between a request and its
answer the client does not know yet, and lines cross on the wire. Every client moves its hold only
through ``ClientSession``, which checks each move against ``MOVES``; the shim's C header carries
the same table (generated), for its own ``kiwi_hold_move``::

    IDLE --acquire--> ASKING --waiting--> WAITING --grant--> HOLDING --drop--> DROPPING
                        +------------grant-----------------^     ^----grant----/
    ASKING, WAITING --cancel--> RELEASING --released--> IDLE
    ASKING, WAITING --error room (no room can be made)--> IDLE
    HOLDING, DROPPING --release, revoked--> IDLE;  --requeue--> ASKING
    HOLDING, DROPPING --evict_first--> RELEASING --released--> IDLE, or --drop--> DROPPING

A lost connection takes everything: any state goes to IDLE, and a client that still wants the
GPU asks again on the next connection.

The shim gives a hold back through a release sequence (close its gate, drain, synchronize, maybe
evict) before its release leaves, whether the daemon asked (a drop) or not (a cell's end, an idle
spell): it spends the sequence in DROPPING, and goes back to HOLDING when the sequence cannot go
ahead yet (docs/shim.md, "The hold").
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class Hold(Enum):
    IDLE = "idle"
    ASKING = "asking"
    WAITING = "waiting"
    HOLDING = "holding"
    DROPPING = "dropping"
    RELEASING = "releasing"

    __hash__ = object.__hash__

    @property
    def holds(self) -> bool:
        """The GPU is this client's (to use, or to give back)."""
        return self is Hold.HOLDING or self is Hold.DROPPING


#: What each state means.
MEANING: Final[dict[Hold, str]] = {
    Hold.IDLE: "nothing asked, nothing held",
    Hold.ASKING: "an acquire (or a requeue) is out; its answer has not been read",
    Hold.WAITING: "queued: the grant comes as an event",
    Hold.HOLDING: "the GPU is this client's",
    Hold.DROPPING: "still this client's, but the daemon asked for it back (a `drop`): "
                   "release soon (the shim: also while its release sequence runs)",
    Hold.RELEASING: "a release is out whose answer decides what happens: a cancelled wait "
                    "(a grant read meanwhile crossed it) or a release with `evict_first` "
                    "(answered `released` or `drop`); nothing is asked meanwhile",
}


#: Every legal move, with what makes it. Anything else is a bug in a client.
MOVES: Final[dict[tuple[Hold, Hold], str]] = {
    (Hold.IDLE, Hold.ASKING): "acquire sent",
    (Hold.ASKING, Hold.WAITING): "its answer: waiting",
    (Hold.ASKING, Hold.HOLDING): "its answer: grant (or a grant event after a seq-less acquire)",
    (Hold.ASKING, Hold.IDLE): "its answer: an error (or an `error` event with code `room`); or "
                              "the connection was lost",
    (Hold.ASKING, Hold.RELEASING): "cancelled before its answer: release sent",
    (Hold.WAITING, Hold.HOLDING): "grant event",
    (Hold.WAITING, Hold.RELEASING): "cancelled: release sent",
    (Hold.WAITING, Hold.IDLE): "an `error` event with code `room` (`memory` feature): the room "
                               "it waits for cannot be made, and it is idle again; or the "
                               "connection was lost",
    (Hold.HOLDING, Hold.DROPPING): "drop event; the shim: its release sequence begins",
    (Hold.HOLDING, Hold.IDLE): "release sent (a plain one: the GPU changes hands at once); "
                               "revoked; the connection was lost",
    (Hold.HOLDING, Hold.RELEASING): "release with evict_first sent, or a release whose answer "
                                    "is awaited (a cancel)",
    (Hold.HOLDING, Hold.ASKING): "release with requeue sent",
    (Hold.DROPPING, Hold.HOLDING): "grant event: the drop is withdrawn (mode off); the shim: "
                                   "the release cannot go ahead yet (a graph capture is open, "
                                   "or synchronizing failed)",
    (Hold.DROPPING, Hold.IDLE): "release sent; revoked; the connection was lost",
    (Hold.DROPPING, Hold.RELEASING): "likewise",
    (Hold.DROPPING, Hold.ASKING): "release with requeue sent",
    (Hold.RELEASING, Hold.IDLE): "its answer: released (or an error); the connection was lost",
    (Hold.RELEASING, Hold.DROPPING): "its answer: drop (evict_first and the room is needed): "
                                     "evict, then release",
}


class IllegalMove(Exception):
    """A client tried a move ``MOVES`` does not allow: a bug of the client's, never the
    daemon's (what the daemon sends is checked before it moves anything)."""

    def __init__(self, before: Hold, after: Hold) -> None:
        super().__init__(f"hold {before.name} -> {after.name} is not a legal move")
        self.before = before
        self.after = after


def legal(before: Hold, after: Hold) -> bool:
    return (before, after) in MOVES
