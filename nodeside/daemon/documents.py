"""The status document as the daemon serves it: kept between requests, and metered per user.

Building the document walks every client, and with a couple of thousand clients it costs tens of
milliseconds of the loop that also hands the GPU over. Two rules keep that cost bounded:

* **Kept.** The encoded document is kept for each kind of viewer (admins; each other uid, who
  sees less) and served again, with only the request's ``seq`` spliced in, until something it
  shows changes: a request that changes the scheduler's state, a deadline, a client gone, a
  reload (the shell's ``generation``), the checkpoint evictor's states (their lines'
  ``version``), or ``MAX_AGE`` seconds, after which what counts down (``quantum_remaining``,
  ``gpu_seconds``, NVML's memory) is read afresh. A document served is never older than the
  last change the peer could have seen.
* **Metered.** What building costs is charged to the group that asked (a uid, and within it a
  pod: every Jupyter pod runs as one uid), from a bucket that fills at the group's part of
  ``TOTAL_SHARE`` of a second per second (shared by the groups that asked lately, never past
  ``SHARE``), up to its part of ``BURST`` seconds (and never less than a document costs). A
  group whose bucket does not hold what the last document cost has its connection's next
  request wait until it does (``StatusMeter``). The parts add up to the node's share, and a
  newcomer starts with its part only, so peers that flood status requests slow themselves,
  however many uids or pods they are and however many come at once, never the handoffs of
  others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from nodeside import protocol as p
from nodeside.daemon.hostmem import evictions_budget, host_total
from nodeside.daemon.pause_watch import PauseWatch
from nodeside.daemon.status_line import status_line
from nodeside.evict.lines import EvictionLines
from nodeside.scheduler.core import Scheduler
from nodeside.scheduler.status import build_status

#: Seconds a kept document is served while nothing it shows changed.
MAX_AGE: Final = 0.1
#: The fraction of one CPU one group's status requests may take over time, and all groups'
#: together; and the most they may take at once (seconds of building), before requests wait.
SHARE: Final = 0.02
TOTAL_SHARE: Final = 0.05
BURST: Final = 0.25
#: Seconds after it last asked a group still counts among those sharing the node's part.
ACTIVE: Final = 10.0

#: Who sees what: admins see every entry whole; another viewer sees its own uid's whole.
Viewer = tuple[bool, int | None]

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class _Kept:
    __slots__ = ("version", "built_at", "body")

    def __init__(self, version: tuple[int, int], built_at: float, body: bytes) -> None:
        self.version = version
        self.built_at = built_at
        self.body = body


class StatusDocuments:
    def __init__(self, scheduler: Scheduler, memory_used: Callable[[], Mapping[int, int | None]],
                 lines: EvictionLines | None) -> None:
        self.scheduler = scheduler
        self.memory_used = memory_used
        self.lines = lines
        #: Paused holders seen working (pause_watch.py): their count is in their entries.
        self.pauses = PauseWatch()
        #: The host's memory, read once: no host figure the document shows exceeds it.
        self.host_total = host_total()
        self._kept: dict[Viewer, _Kept] = {}

    def document(self, now: float, viewer: Viewer | None = None) -> dict[str, Any]:
        """The document as ``viewer`` may see it (None: everything), built now."""
        admin, uid = (True, None) if viewer is None else viewer
        document = build_status(self.scheduler, now, self.memory_used(), viewer_admin=admin,
                                viewer_uid=uid, evictions=self.lines,
                                host_budget=self._host_budget(), host_total=self.host_total)
        counts = self.pauses.counts
        if counts:
            for entry in document["clients"]:
                if entry["id"] in counts:
                    entry["pause_ignored"] = counts[entry["id"]]
        return document

    def _host_budget(self) -> int | None:
        """The host memory evicted clients may take: the node's host budget where configured
        or where some client speaks ``tiers`` (the daemon plans with it); otherwise read only
        where some client speaks the ``memory`` feature (the document shows it for their GPUs
        only). Shadows made ahead are host memory evictions have already: MemAvailable no
        longer counts them."""
        scheduler = self.scheduler
        if scheduler.host_budget is not None and (scheduler.config.host_budget is not None
                                                  or scheduler.plans_host):
            return scheduler.host_budget  # the one the daemon plans with
        held, any_memory = 0, False
        for client in self.scheduler.clients.values():
            if client.memory:
                any_memory = True
                held += max(client.host_bytes, client.shadow_bytes)
        return evictions_budget(held) if any_memory else None

    def kept(self, viewer: Viewer, seq: int | None, now: float,
             generation: int) -> bytes | None:
        """The status reply for ``viewer`` from its kept document, if nothing it shows changed
        since (``generation``: the shell's count of changes, ``Requests.generation``)."""
        kept = self._kept.get(viewer)
        if kept is None or kept.version != self._version(generation) or \
                now - kept.built_at >= MAX_AGE:
            return None
        return _reply(kept.body, seq)

    def build(self, viewer: Viewer, seq: int | None, now: float,
              generation: int) -> tuple[bytes, float]:
        """The status reply for ``viewer``, built now and kept; and what building it cost."""
        started = time.perf_counter()
        document = self.document(now, viewer)
        body = _ENCODER.encode(document).encode()
        line = _reply(body, seq)
        if len(line) > p.MAX_REPLY_BYTES:  # too large whole: the one place that trims it
            self._kept.pop(viewer, None)
            return status_line(document, seq), time.perf_counter() - started
        if len(self._kept) > 256 and viewer not in self._kept:
            self._kept.clear()  # viewers are uids: a few per node, but never without bound
        self._kept[viewer] = _Kept(self._version(generation), now, body)
        return line, time.perf_counter() - started

    def _version(self, generation: int) -> tuple[int, int]:
        return generation, self.lines.version if self.lines is not None else 0


def _reply(body: bytes, seq: int | None) -> bytes:
    """``p.encode(p.STATUS_REPLY, seq=seq, status=document)``, from the encoded document."""
    if seq is None:
        return b'{"op":"status","status":' + body + b"}\n"
    return b'{"op":"status","seq":%d,"status":' % seq + body + b"}\n"


#: Who status documents are charged to: a uid, and the pod it asks from (None: not known).
Group = tuple[int | None, str | None]


class StatusMeter:
    """What status documents cost each group, and how long its next request must wait."""

    def __init__(self, share: float = SHARE, burst: float = BURST,
                 total_share: float = TOTAL_SHARE) -> None:
        self.share = share
        self.burst = burst
        self.total_share = total_share
        #: group -> (seconds left in its bucket, when that was counted)
        self._buckets: dict[Group, tuple[float, float]] = {}
        #: group -> when it last asked: the groups that share the node's part.
        self._active: dict[Group, float] = {}
        self._active_checked = 0.0
        #: What the last document built cost: what the next one is expected to.
        self.last_cost = 0.0

    def _part(self, now: float) -> tuple[float, float, float]:
        """Each group's rate and burst now (its part of the node's), and what its bucket must
        hold for a document."""
        if now - self._active_checked >= 1.0:  # forget those gone quiet, once a second
            self._active_checked = now
            for group in [g for g, at in self._active.items() if at < now - ACTIVE]:
                del self._active[group]
        parts = max(1, len(self._active))
        need = min(self.last_cost, self.burst)
        return min(self.share, self.total_share / parts), self.burst / parts, need

    def _left(self, group: Group, now: float, rate: float, burst: float, need: float) -> float:
        """What ``group``'s bucket holds now. Credit kept from when fewer groups asked is cut to
        the part it has now; the bucket holds at least a document's worth."""
        cap = max(burst, need)
        bucket = self._buckets.get(group)
        if bucket is None:
            return burst  # a newcomer starts with its part
        return min(cap, min(cap, bucket[0]) + (now - bucket[1]) * rate)

    def owed(self, group: Group, now: float) -> float:
        """Seconds until ``group`` may have another document built (0: now). Asking makes it
        one of the groups that share the node's part."""
        if group not in self._active and len(self._active) >= 4096:
            self._active.pop(next(iter(self._active)))
        self._active[group] = now
        rate, burst, need = self._part(now)
        if group not in self._buckets:  # its credit runs from its first ask
            if len(self._buckets) > 4096:
                self._forget_full(now, rate, burst)
            self._buckets[group] = (burst, now)
        left = self._left(group, now, rate, burst, need)
        return (need - left) / rate if left < need else 0.0

    def charge(self, group: Group, seconds: float, now: float) -> None:
        """Charge ``seconds`` of building to ``group``: its next waits until its bucket holds
        a document's worth again."""
        if not seconds:
            return
        rate, burst, need = self._part(now)
        self._buckets[group] = (self._left(group, now, rate, burst, need) - seconds, now)
        self.last_cost = seconds

    def _forget_full(self, now: float, rate: float, burst: float) -> None:
        for group, (left, at) in list(self._buckets.items()):
            if left + (now - at) * rate >= burst:
                del self._buckets[group]
