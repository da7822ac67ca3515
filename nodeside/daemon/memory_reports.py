"""What the scheduler hears of each client's memory figures: metered and damped, sans-I/O.

A client that speaks the ``memory`` feature reports where its memory is (``resident`` and
``host`` bytes, its ``shadow``) in ``working_set`` requests. Each report the scheduler hears
costs a scheduling pass; a resident figure that swings makes every "does it fit" swing with it.
So, as working sets are (working_sets.py), between a client's figures and the scheduler stand
two rules:

* **meter**: the scheduler hears a client's figures at most once per ``INTERVAL`` (the 50 ms
  the protocol asks of clients); a report in between waits, merged into the latest, and is
  heard when its time comes. A client that sends reports as fast as it can costs the daemon a
  parsed line each, never a scheduling pass or a new status document each;
* **hysteresis** on an idle client's ``resident``: a larger figure is heard only once nothing
  as small as the one the scheduler has was reported for ``HOLD`` seconds; a smaller one as
  soon as the meter allows. An idle client's memory grows only when it allocates ahead of its
  next cell, which then asks for the GPU with a working set that speaks for it at once; a
  figure that swings up and down is noise, and every fit the scheduler judges (which holder
  must evict when it leaves, who is asked to evict) would swing with it. A holder's figures are
  metered only. While its memory is moving (an eviction or a restore under way, or an idle
  client with memory in host memory coming back without a grant: a ``fetch`` to the GPU on an
  intent) the figures are progress, heard as soon as the meter allows, and at once when the
  resident bytes moved by
  ``PROGRESS_BYTES`` since the last figure heard (the protocol lets a client report each
  256 MiB of an eviction, however soon): an eviction's way out overlaps the next way in, and a
  client can buy no more passes than its memory has such steps.

The first report is heard at once, and so are the figures an ``evicted`` carries (``heard``),
and a way out's first report (``STARTING``), its figures unchanged or not: from then on the
way out is never checkpointed (residency.py). Damped as unchanged, it waited for the first
chunk out, and a first chunk slower than ``evict_timeout`` had the process checkpointed in
the middle of its move.
``report`` answers what to tell the scheduler now (or nothing), ``due`` what has waited long
enough, and ``next_due`` when the shell should ask again.
"""

from __future__ import annotations

from typing import Final

from nodeside.daemon.working_sets import HOLD, Damper, Heard
from nodeside.model import EVICTING, RESTORING
from nodeside.scheduler.clients import ClientRecord
from nodeside.scheduler.residency import PROGRESS_BYTES

#: Least seconds between two reports of one client's figures that the scheduler hears.
INTERVAL: Final = 0.05

#: (resident, host, shadow), each None where the report did not say it.
Figures = tuple[int | None, int | None, int | None]

#: Where the client's memory stands, for the rules above.
IDLE: Final = "idle"
HOLDING: Final = "holding"
MOVING: Final = "moving"
#: Asked to move its memory out, and not heard since: its way out's first word.
STARTING: Final = "starting"


def standing(client: ClientRecord) -> str:
    """Where ``client``'s memory stands for the rules above. An idle client with memory in host
    memory whose resident bytes rise is bringing it back (a ``fetch`` to the GPU), not
    allocating ahead: heard late, the room it takes back would count for nobody, and a grant in
    between would put two working sets on a card with room for one."""
    if client.residency is EVICTING:
        return MOVING if client.eviction.began else STARTING
    if client.residency is RESTORING:
        return MOVING
    if client.state == "holding":
        return HOLDING
    return MOVING if client.host_bytes else IDLE


def merged(old: Figures, new: Figures) -> Figures:
    """``new`` over ``old``: a field a report leaves out keeps its earlier value."""
    return (new[0] if new[0] is not None else old[0], new[1] if new[1] is not None else old[1],
            new[2] if new[2] is not None else old[2])


class MemoryReports(Damper[Figures]):
    def __init__(self, interval: float = INTERVAL, hold: float = HOLD) -> None:
        super().__init__(interval, hold)

    def report(self, client_id: str, figures: Figures, stands: str,
               now: float) -> Figures | None:
        """A client reported ``figures``; ``stands``: ``IDLE``, ``HOLDING``, ``MOVING`` (an
        eviction or a restore of its memory under way) or ``STARTING``. What the scheduler
        should hear now, or None (see ``next_due``)."""
        state = self._clients.get(client_id)
        if state is None:
            self._clients[client_id] = Heard(figures, now)
            return figures
        if stands == STARTING:
            self.heard(client_id, figures, now)
            return state.heard
        latest = state.latest = merged(state.latest, figures)
        heard_resident, resident = state.heard[0], latest[0]
        if resident is not None and (heard_resident is None or resident <= heard_resident):
            state.mark_at = now
        if latest == state.heard:
            self._settled(client_id, state)
            return None
        due = state.heard_at + self.interval
        if resident is not None and heard_resident is not None:
            if stands == MOVING:
                if abs(resident - heard_resident) >= PROGRESS_BYTES:
                    due = now
            elif stands == IDLE and resident > heard_resident:
                due = max(due, state.mark_at + self.hold)
        return self._wait(client_id, state, due, now)

    def heard(self, client_id: str, figures: Figures, now: float) -> None:
        """The scheduler heard ``figures`` some other way (an ``evicted``): they stand, and
        whatever waited is superseded by them."""
        state = self._clients.get(client_id)
        if state is None:
            self._clients[client_id] = Heard(figures, now)
            return
        state.latest = merged(state.latest, figures)
        self._hear(client_id, state, now)
