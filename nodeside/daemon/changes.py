"""``changed`` events for the peers that watch the status document (hello feature ``changes``).

A panel that shows the status document wants to hear when it changes, not to ask for it every
half second. A handoff changes it, and so does every request that moves a holder, a waiter, a
working set, the mode or the TQ, and every client coming or going; telling each watcher at
each of those would put messages on the handoff's path. Instead a change is marked, and the
shell sends one small ``changed`` event to every watcher per round: the first change after a
quiet spell goes out on the next turn of the loop (after the grant that caused it is written),
later ones at most every ``INTERVAL`` seconds. The watcher then asks for the document. Sans-I/O.
"""

from __future__ import annotations

from nodeside import protocol as p
from nodeside.daemon.session import Session

#: Least seconds between two rounds of ``changed`` events: ten a second looks live to a person,
#: and a watcher re-reading the document costs the daemon one status request per round.
INTERVAL = 0.1

#: The event is always the same few bytes.
CHANGED_LINE = p.encode(p.CHANGED)


class ChangeNotices:
    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        #: Greeted sessions that asked for the feature.
        self.listeners: set[Session] = set()
        self._arranged = False
        self._last_round: float | None = None

    def mark(self, now: float) -> float | None:
        """Something people see changed. Returns when the next round should run, if the shell
        must arrange one; None when one is arranged already or nobody listens."""
        if not self.listeners or self._arranged:
            return None
        self._arranged = True
        if self._last_round is None:
            return now
        return max(now, self._last_round + self.interval)

    def collect(self, now: float) -> list[Session]:
        """The round is due: the sessions to send ``CHANGED_LINE`` to."""
        self._arranged = False
        self._last_round = now
        return [session for session in self.listeners if not session.over]
