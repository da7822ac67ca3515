"""What the scheduler hears of each client's working set: rate-limited and damped, sans-I/O.

In mode auto a working set that grows past the free memory makes the other holders drop (and
evict), and one that shrinks lets them back: a client reporting 1 PiB and 0 in turn would make
every other holder drop and evict again and again, whatever the policy. So between a client's
reports and the scheduler stand two rules:

* **rate**: the scheduler hears a client's working set at most once per ``INTERVAL`` seconds;
  a report in between waits, and only the latest waiting one is heard when the time comes;
* **hysteresis**: a smaller working set is heard only once no report at least as large as the
  one the scheduler has came for ``HOLD`` seconds. A larger one is heard as soon as the rate
  allows: the room it needs is real.

A client's first report is heard at once. A client that reports the same value again costs
nothing. ``report`` answers what to tell the scheduler now (or nothing), ``due`` what has
waited long enough, and ``next_due`` when the shell should ask again.
"""

from __future__ import annotations

from typing import Final

#: Least seconds between two working sets of one client that the scheduler hears.
INTERVAL: Final = 0.5
#: Seconds a smaller working set must hold, with nothing as large reported, before it is heard.
HOLD: Final = 2.0

#: (bytes, evictable bytes or None): one report.
Report = tuple[int, int | None]


class _Client:
    __slots__ = ("heard", "heard_at", "high_at", "latest", "due_at", "flaps")

    def __init__(self, heard: Report, now: float) -> None:
        #: What the scheduler has, and since when.
        self.heard = heard
        self.heard_at = now
        #: When a report at least as large as ``heard`` last came.
        self.high_at = now
        #: The latest report, and when it is to be heard (None: nothing waits).
        self.latest = heard
        self.due_at: float | None = None
        #: Smaller working sets taken back before they were heard.
        self.flaps = 0


class WorkingSetDamper:
    def __init__(self, interval: float = INTERVAL, hold: float = HOLD) -> None:
        self.interval = interval
        self.hold = hold
        self._clients: dict[str, _Client] = {}
        #: Clients with a report waiting.
        self._waiting: set[str] = set()

    def report(self, client_id: str, nbytes: int, evictable: int | None,
               now: float) -> Report | None:
        """A client reported its working set: what the scheduler should hear now, or None
        (it heard it already, or the report waits: see ``next_due``)."""
        report = (nbytes, evictable)
        state = self._clients.get(client_id)
        if state is None:
            self._clients[client_id] = _Client(report, now)
            return report
        state.latest = report
        if nbytes >= state.heard[0]:
            state.high_at = now
        if report == state.heard:
            if state.due_at is not None:
                state.flaps += 1  # up and down again before the scheduler heard it go down
            state.due_at = None
            self._waiting.discard(client_id)
            return None
        due = state.heard_at + self.interval
        if nbytes < state.heard[0]:
            due = max(due, state.high_at + self.hold)
        if due <= now:
            return self._hear(client_id, state, now)
        state.due_at = due
        self._waiting.add(client_id)
        return None

    def flaps(self, client_id: str) -> int:
        """How often the client took a smaller working set back before it was heard."""
        state = self._clients.get(client_id)
        return state.flaps if state is not None else 0

    def next_due(self) -> float | None:
        """When the first waiting report is due, or None when none waits."""
        times = [self._clients[c].due_at for c in self._waiting]
        return min((t for t in times if t is not None), default=None)

    def due(self, now: float) -> list[tuple[str, Report]]:
        """The waiting reports whose time has come, to be heard now."""
        out: list[tuple[str, Report]] = []
        for client_id in list(self._waiting):
            state = self._clients[client_id]
            if state.due_at is not None and state.due_at <= now:
                out.append((client_id, self._hear(client_id, state, now)))
        return out

    def forget(self, client_id: str) -> None:
        self._clients.pop(client_id, None)
        self._waiting.discard(client_id)

    def _hear(self, client_id: str, state: _Client, now: float) -> Report:
        state.heard = state.latest
        state.heard_at = state.high_at = now
        state.due_at = None
        self._waiting.discard(client_id)
        return state.heard
