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

from typing import Final, Generic, TypeVar

#: Least seconds between two working sets of one client that the scheduler hears.
INTERVAL: Final = 0.5
#: Seconds a smaller working set must hold, with nothing as large reported, before it is heard.
HOLD: Final = 2.0

#: (bytes, evictable bytes or None): one report.
Report = tuple[int, int | None]


R = TypeVar("R")


class Heard(Generic[R]):
    """One client's reports: what the scheduler heard and since when, the latest, and when that
    is to be heard."""

    __slots__ = ("heard", "heard_at", "mark_at", "latest", "due_at", "flaps")

    def __init__(self, heard: R, now: float) -> None:
        #: What the scheduler has, and since when.
        self.heard = heard
        self.heard_at = now
        #: When a report on the side that stands last came (as large as ``heard`` for a working
        #: set, as small for an idle client's resident bytes): a hold counts from there.
        self.mark_at = now
        #: The latest report, and when it is to be heard (None: nothing waits).
        self.latest = heard
        self.due_at: float | None = None
        #: Reports on the other side taken back before they were heard.
        self.flaps = 0


class Damper(Generic[R]):
    """Each client's reports between it and the scheduler: what waits, and when it is due. The
    rules of what waits how long are the subclass's ``report``."""

    def __init__(self, interval: float, hold: float) -> None:
        self.interval = interval
        self.hold = hold
        self._clients: dict[str, Heard[R]] = {}
        #: Clients with a report waiting.
        self._waiting: set[str] = set()

    def next_due(self) -> float | None:
        """When the first waiting report is due, or None when none waits."""
        times = [self._clients[c].due_at for c in self._waiting]
        return min((t for t in times if t is not None), default=None)

    def due(self, now: float) -> list[tuple[str, R]]:
        """The waiting reports whose time has come, to be heard now."""
        out: list[tuple[str, R]] = []
        for client_id in list(self._waiting):
            state = self._clients[client_id]
            if state.due_at is not None and state.due_at <= now:
                out.append((client_id, self._hear(client_id, state, now)))
        return out

    def forget(self, client_id: str) -> None:
        self._clients.pop(client_id, None)
        self._waiting.discard(client_id)

    def _settled(self, client_id: str, state: Heard[R]) -> None:
        """The latest report is what the scheduler has: nothing waits."""
        state.due_at = None
        self._waiting.discard(client_id)

    def _wait(self, client_id: str, state: Heard[R], due: float, now: float) -> R | None:
        """The latest report is heard at ``due``: now, or it waits."""
        if due <= now:
            return self._hear(client_id, state, now)
        state.due_at = due
        self._waiting.add(client_id)
        return None

    def _hear(self, client_id: str, state: Heard[R], now: float) -> R:
        state.heard = state.latest
        state.heard_at = state.mark_at = now
        self._settled(client_id, state)
        return state.heard


class WorkingSetDamper(Damper[Report]):
    def __init__(self, interval: float = INTERVAL, hold: float = HOLD) -> None:
        super().__init__(interval, hold)

    def report(self, client_id: str, nbytes: int, evictable: int | None,
               now: float) -> Report | None:
        """A client reported its working set: what the scheduler should hear now, or None
        (it heard it already, or the report waits: see ``next_due``)."""
        report = (nbytes, evictable)
        state = self._clients.get(client_id)
        if state is None:
            self._clients[client_id] = Heard(report, now)
            return report
        state.latest = report
        if nbytes >= state.heard[0]:
            state.mark_at = now
        if report == state.heard:
            if state.due_at is not None:
                state.flaps += 1  # up and down again before the scheduler heard it go down
            self._settled(client_id, state)
            return None
        due = state.heard_at + self.interval
        if nbytes < state.heard[0]:
            due = max(due, state.mark_at + self.hold)
        return self._wait(client_id, state, due, now)

    def flaps(self, client_id: str) -> int:
        """How often the client took a smaller working set back before it was heard."""
        state = self._clients.get(client_id)
        return state.flaps if state is not None else 0
