"""What a client used, for ``policy: interactive``: its attained service in GPU seconds.

The request in progress counts in full (its holds so far, across drops: a cell that goes on
after a drop keeps what it used); earlier requests count half after ``half_life`` seconds. A
hold given back when asked (a drop, a revocation) leaves the request open; one given back of the
client's own accord (a cell ended) closes it. ``interactive.InteractivePolicy`` orders its
waiters by these figures; a request is light beside another that used at least 1/CUT_RATIO
times its GPU time (``pricing`` cuts a quantum short for it, ``light`` lets it go ahead).
"""

from __future__ import annotations

from nodeside import protocol as p
from nodeside.config import InteractiveSettings
from nodeside.scheduler.gpu_state import ClientRecord
from nodeside.scheduler.view import PolicyView

#: Seconds between a hold that ended by a drop and the client's next request within which the
#: request goes on (the client asks again at once to continue its work); later, it is a new one.
GOES_ON_WITHIN = 1.0
#: A waiter cuts a quantum short only if it used at most this fraction of the holder's recent
#: GPU time: two training runs never ping-pong by early cuts, they alternate by quanta.
CUT_RATIO = 0.5


class AttainedService:
    """Each client's GPU seconds: the request in progress, and the decayed history before it."""

    def __init__(self, view: PolicyView) -> None:
        # The interactive settings, read each time: SIGHUP may change them.
        self.view = view
        #: Client id -> (decayed GPU seconds of ended requests, when that was computed).
        self._used: dict[str, tuple[float, float]] = {}
        #: Client id -> GPU seconds of the request in progress (its holds so far, across drops).
        self._request: dict[str, float] = {}
        self._holding_since: dict[str, float] = {}
        #: Client id -> when its last hold ended by a drop, its request left open, and the client
        #: (``_settle`` reads when it asked again); gone with the client (``forget``).
        self._dropped_at: dict[str, tuple[float, ClientRecord]] = {}

    @property
    def settings(self) -> InteractiveSettings:
        return self.view.settings.interactive

    def attained(self, client_id: str, now: float) -> float:
        """GPU seconds used: the request in progress in full, its open hold included, and the
        earlier ones each counting half after ``half_life`` seconds."""
        work = self.request_work(client_id, now)  # settles first: history may take its part
        return work + self._history(client_id, now)

    def request_seconds(self, client_id: str) -> float:
        """GPU seconds of the request in progress held before drops (its open hold aside)."""
        self._settle(client_id)
        return self._request.get(client_id, 0.0)

    def request_work(self, client_id: str, now: float) -> float:
        """GPU seconds of the request in progress: its holds so far, less their pauses, and its
        open hold if it works. What taking turns orders by: the current cell's own work."""
        since = self._holding_since.get(client_id)
        return self.request_seconds(client_id) + (now - since if since is not None else 0.0)

    def pause(self, client_id: str, now: float) -> None:
        """A holder waits for its turn: the hold goes on, its GPU time stops counting."""
        since = self._holding_since.pop(client_id, None)
        if since is not None:
            self._request[client_id] = self._request.get(client_id, 0.0) + now - since

    def resume(self, client_id: str, now: float) -> None:
        self._holding_since[client_id] = now

    def _history(self, client_id: str, now: float) -> float:
        value, at = self._used.get(client_id, (0.0, now))
        return value * 0.5 ** (max(0.0, now - at) / self.settings.half_life)

    def _settle(self, client_id: str) -> None:
        """A hold that ended by a drop leaves its request open: the client asks again at once
        to go on. If instead it asked again only later (its cell had ended while the drop was
        out: the release answered the drop and the work both), that request was over when
        the hold ended, and its GPU time is history from then on."""
        dropped = self._dropped_at.get(client_id)
        if dropped is None:
            return
        ended, client = dropped
        asked = client.requested_at
        if asked is None and client.hold is not None:
            asked = client.hold.granted_at
        if asked is None or asked - ended <= GOES_ON_WITHIN:
            return  # not asked again yet, or asked at once: it goes on
        del self._dropped_at[client_id]
        self._used[client_id] = (self._history(client_id, ended)
                                 + self._request.pop(client_id, 0.0), ended)

    def granting(self, client_id: str) -> None:
        """``client_id`` is being granted: a request a drop left open is settled, and over."""
        self._settle(client_id)
        self._dropped_at.pop(client_id, None)

    def hold_starts(self, client_id: str, now: float) -> None:
        self._holding_since[client_id] = now

    def hold_ends(self, client: ClientRecord, now: float) -> None:
        """A hold ends. Given back when asked (a drop, a revocation), the request goes on; given
        back of the client's own accord (a cell ended), the next request starts afresh."""
        since = self._holding_since.pop(client.id, None)
        held = now - since if since is not None else 0.0
        self._request[client.id] = self._request.get(client.id, 0.0) + held
        hold = client.hold
        if hold is None or hold.drop_reason in (None, p.REASON_RELEASE):
            self._dropped_at.pop(client.id, None)
            self._used[client.id] = (self.attained(client.id, now), now)
            self._request.pop(client.id, None)
        else:
            self._dropped_at[client.id] = (now, client)

    def fresh(self, client: ClientRecord) -> bool:
        """Has ``client``'s request not held the GPU yet (no hold open, none before a drop)?"""
        self._settle(client.id)
        return client.id not in self._holding_since and client.id not in self._request

    def forget(self, client_id: str) -> None:
        self._used.pop(client_id, None)
        self._holding_since.pop(client_id, None)
        self._request.pop(client_id, None)
        self._dropped_at.pop(client_id, None)
