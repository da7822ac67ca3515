"""Queue positions told to the waiters that asked for them (hello feature ``position``).

A handoff moves every waiter of its GPU up by one; telling each of them at once would put a
message per waiter on every handoff's path. Instead the GPUs whose queue may have moved are
marked, and at most every ``INTERVAL`` seconds the shell asks this object what to say: one
``waiting`` event per waiter whose position changed since it last heard one. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodeside.daemon.session import Session
from nodeside.scheduler.core import Scheduler

#: Seconds between two rounds of position events: a waiting line that moves four times a
#: second looks live, and the work is once per round, not once per handoff.
INTERVAL = 0.25


class PositionNotices:
    def __init__(self) -> None:
        self._moved: set[int] = set()
        #: Sessions that asked for position events; none: nothing to compute.
        self.listeners = 0

    def mark(self, gpus: Iterable[int]) -> bool:
        """Note that these GPUs' queues may have moved; True when a round should be arranged."""
        if not self.listeners:
            return False
        first = not self._moved
        self._moved.update(gpus)
        return first and bool(self._moved)

    def collect(self, scheduler: Scheduler, sessions: Mapping[str, Session],
                now: float) -> list[tuple[Session, bytes]]:
        """The events to send now, for every GPU marked since the last round."""
        moved, self._moved = self._moved, set()
        out: list[tuple[Session, bytes]] = []
        for gpu in moved:
            if gpu not in scheduler.gpus:
                continue
            for position, client in enumerate(scheduler.queue(gpu, now), start=1):
                session = sessions.get(client.id)
                if session is None:
                    continue
                line = session.position_event(position)
                if line is not None:
                    out.append((session, line))
        return out
