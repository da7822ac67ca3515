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
* **Metered.** What building costs is charged to the uid that asked, from a bucket that fills
  at ``SHARE`` of a second per second up to ``BURST`` seconds; a uid in debt has its
  connection's next request wait until the debt is paid (``StatusMeter``). A peer that floods
  status requests slows itself (and its own uid), never the handoffs of others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from nodeside import protocol as p
from nodeside.daemon.hostmem import evictions_budget
from nodeside.daemon.pause_watch import PauseWatch
from nodeside.daemon.status_line import status_line
from nodeside.evict.lines import EvictionLines
from nodeside.scheduler.core import Scheduler
from nodeside.scheduler.status import build_status

#: Seconds a kept document is served while nothing it shows changed.
MAX_AGE: Final = 0.1
#: The fraction of one CPU a uid's status requests may take over time, and the most it may
#: take at once (seconds of building), before its requests wait.
SHARE: Final = 0.02
BURST: Final = 0.25

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
        self._kept: dict[Viewer, _Kept] = {}

    def document(self, now: float, viewer: Viewer | None = None) -> dict[str, Any]:
        """The document as ``viewer`` may see it (None: everything), built now."""
        admin, uid = (True, None) if viewer is None else viewer
        document = build_status(self.scheduler, now, self.memory_used(), viewer_admin=admin,
                                viewer_uid=uid, evictions=self.lines,
                                host_budget=self._host_budget())
        counts = self.pauses.counts
        if counts:
            for entry in document["clients"]:
                if entry["id"] in counts:
                    entry["pause_ignored"] = counts[entry["id"]]
        return document

    def _host_budget(self) -> int | None:
        """The host memory evicted clients may take, read only where some client speaks the
        ``memory`` feature (the document shows it for their GPUs only). Shadows made ahead
        are host memory evictions have already: MemAvailable no longer counts them."""
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


class StatusMeter:
    """What status documents cost each uid, and how long its next request must wait."""

    def __init__(self, share: float = SHARE, burst: float = BURST) -> None:
        self.share = share
        self.burst = burst
        #: uid -> (seconds left in its bucket, when that was counted)
        self._buckets: dict[int | None, tuple[float, float]] = {}

    def owed(self, uid: int | None, now: float) -> float:
        """Seconds until ``uid`` may have another document built (0: now)."""
        bucket = self._buckets.get(uid)
        if bucket is None:
            return 0.0
        left = bucket[0] + (now - bucket[1]) * self.share
        return -left / self.share if left < 0 else 0.0

    def charge(self, uid: int | None, seconds: float, now: float) -> None:
        """Charge ``seconds`` of building to ``uid``: past its bucket, its next waits."""
        if not seconds:
            return
        left, at = self._buckets.get(uid, (self.burst, now))
        left = min(self.burst, left + (now - at) * self.share) - seconds
        if len(self._buckets) > 4096 and uid not in self._buckets:
            self._forget_full(now)
        self._buckets[uid] = (left, now)

    def _forget_full(self, now: float) -> None:
        for uid, (left, at) in list(self._buckets.items()):
            if left + (now - at) * self.share >= self.burst:
                del self._buckets[uid]
