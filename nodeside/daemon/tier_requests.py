"""The requests of the ``tiers`` feature: ``tier_moved`` from a kernel, ``intent`` from the
Jupyter server; the ``disk``/``pinned`` figures ``register`` and ``working_set`` carry; and the
host's MemAvailable, read for the measured host budget.

``Requests`` (requests.py) hands these here. A hint is cheap to send and must stay cheap to
receive: an ``intent`` is answered ``ok`` whatever it changed, and one for a client hinted in
the last ``INTENT_EVERY`` seconds is answered without asking the scheduler; only a hint the
scheduler acted on costs a scheduling pass or a new status document, so a peer flooding hints
slows nobody but itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from nodeside import limits
from nodeside import protocol as p
from nodeside.daemon.hostmem import MEMINFO, host_free
from nodeside.daemon.session import Outcome, Session
from nodeside.scheduler.core import ClientRecord, Scheduler, SchedulerError
from nodeside.scheduler.tiers import INTENT_REASONS

#: Least seconds between two hints about one client that the scheduler hears.
INTENT_EVERY: Final = 1.0


class TierRequests:
    def __init__(self, scheduler: Scheduler, is_admin: Callable[[Session], bool]) -> None:
        self.scheduler = scheduler
        self.is_admin = is_admin
        #: When each client was last hinted (a client's key goes with it: ``forget``).
        self._hinted: dict[str, float] = {}
        #: Where the host's MemAvailable is read (tests point it at a file of their own).
        self.meminfo: Path = MEMINFO

    def read_host_memory(self, now: float) -> list[Any]:
        """MemAvailable read again: the measured host budget kept current (tiers.py)."""
        return list(self.scheduler.host_memory_read(now, host_free(self.meminfo)))

    def host_memory_if_stale(self, now: float) -> list[Any]:
        """Before a decision that plans with the host budget: read again if the last read is
        old (none, where the budget is configured or nobody speaks ``tiers``)."""
        return self.read_host_memory(now) if self.scheduler.host_budget_stale(now) else []

    def registered(self, client_id: str, msg: dict[str, Any]) -> list[Any]:
        """A ``tiers`` client registered (``disk``: spill files it has already)."""
        return list(self.scheduler.track_tiers(client_id, byte_figure(msg, "disk")))

    def pin_budget(self, client_id: str) -> int | None:
        """The pin budget ``registered`` tells: the one planned for a ``tiers`` client, else
        the config's."""
        tiering = self.scheduler.clients[client_id].tiering
        if tiering is not None and tiering.pin_budget is not None:
            return tiering.pin_budget
        return self.scheduler.config.pin_budget

    def figures(self, client: ClientRecord, msg: dict[str, Any], now: float) -> None:
        """A ``working_set``'s ``disk`` and ``pinned``: recorded, never a scheduling pass of
        their own (the progress of a move; the move's end comes in ``tier_moved``)."""
        disk, pinned = byte_figure(msg, "disk"), byte_figure(msg, "pinned")
        if disk is not None or pinned is not None:
            self.scheduler.tier_figures(client.id, disk, pinned, now)

    def forget(self, client_id: str) -> None:
        self._hinted.pop(client_id, None)

    def _on_tier_moved(self, session: Session, msg: dict[str, Any], seq: int | None,
                       now: float) -> Outcome:
        client_id = _tiers_client(session)
        failed = msg.get("failed")
        failed = None if failed is None else limits.short_text(failed, "tier_moved.failed")
        to = limits.short_text(msg.get("tier"), "tier_moved.tier")
        took = said_seconds(msg.get("seconds"))
        actions = self.scheduler.tier_moved(
            now, client_id, to, byte_figure(msg, "host"), byte_figure(msg, "disk"),
            moved=byte_figure(msg, "moved"), seconds=took, failed=failed)
        client = self.scheduler.clients[client_id]
        return Outcome([p.encode(p.OK, seq=seq), *actions], gpus=(client.gpu,))

    def _on_intent(self, session: Session, msg: dict[str, Any], seq: int | None,
                   now: float) -> Outcome:
        name = limits.short_text(msg["name"], "intent.name")
        reason = msg.get("reason") or "execute"
        if reason not in INTENT_REASONS:
            raise SchedulerError(p.E_INVALID, f"reason must be one of "
                                 f"{', '.join(INTENT_REASONS)}")
        admin = self.is_admin(session)
        uid = session.peer.uid
        targets = [c for c in self.scheduler.clients.values()
                   if c.name == name and (admin or c.uid == uid)]
        if not targets:
            raise SchedulerError(p.E_INVALID, f"no kernel named {name!r} of uid {uid}")
        actions: list[Any] = []
        for client in targets:
            if client.tiering is None:
                continue  # it does not speak tiers: there is nothing to bring closer
            last = self._hinted.get(client.id)
            if last is not None and now - last < INTENT_EVERY:
                continue
            self._hinted[client.id] = now
            actions.extend(self.scheduler.intent(now, client.id, reason))
        acted = bool(actions)
        return Outcome([p.encode(p.OK, seq=seq), *actions], reschedule=acted, changed=acted,
                       gpus=tuple({c.gpu for c in targets}) if acted else ())


def said_seconds(seconds: Any) -> float | None:
    """How long a move took, as the client measured it: sane figures only (None otherwise)."""
    return float(seconds) if isinstance(seconds, (int, float)) and \
        not isinstance(seconds, bool) and 0 <= seconds < 86_400 else None


def byte_figure(msg: dict[str, Any], key: str) -> int | None:
    value = msg.get(key)
    return None if value is None else limits.byte_count(value, key)


def _tiers_client(session: Session) -> str:
    if session.client_id is None:
        raise SchedulerError(p.E_STATE, "register first")
    if p.FEATURE_TIERS not in session.features:
        raise SchedulerError(p.E_STATE, "tier_moved needs the tiers feature (hello)")
    return session.client_id
