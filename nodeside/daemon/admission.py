"""Who may hold a connection, and for how long without saying who it is: sans-I/O.

A connection costs the daemon a file descriptor and a little memory before it has said a word.
These rules keep a peer from spending all of them: a hello deadline, an idle limit for
connections that never registered, a cap per uid and one for the whole daemon (below its file
descriptor limit). At a cap, the oldest connection that never registered makes room for the
newcomer: idle sockets, however many, never lock a new kernel out. Only when every connection
at the cap is a registered client is the newcomer refused.

The shell calls ``admit`` on accept, ``registered`` and ``gone`` as sessions move on, and
``expired`` from a timer; this module never closes anything itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field

from nodeside.daemon.session import Session
from nodeside.limits import ConnectionLimits


@dataclass
class AdmissionVerdict:
    accepted: bool
    #: Connections to close to make room (the oldest that never registered).
    evicted: list[Session] = field(default_factory=list)
    #: Why the newcomer was refused (when it was).
    reason: str = ""


class Admission:
    def __init__(self, limits: ConnectionLimits, max_connections: int) -> None:
        self.limits = limits
        self.max_connections = max_connections
        self.per_uid: Counter[int | None] = Counter()
        self.total = 0
        #: Connections that never registered, oldest first: per uid, and all together.
        self._loose_by_uid: dict[int | None, dict[Session, None]] = {}
        self._loose: dict[Session, None] = {}
        self._members: set[Session] = set()
        #: (when to look at a connection again, tie-break, session), soonest first.
        self._due: list[tuple[float, int, Session]] = []
        self._order = itertools.count()

    def admit(self, session: Session, now: float) -> AdmissionVerdict:
        uid = session.peer.uid
        verdict = AdmissionVerdict(True)
        if self.per_uid[uid] >= self.limits.per_uid:
            victim = next(iter(self._loose_by_uid.get(uid, ())), None)
            if victim is None:
                return AdmissionVerdict(
                    False, reason=f"uid {uid} already has {self.limits.per_uid} "
                                  f"registered connections (connections.per_uid)")
            self._evict(victim, verdict)
        if self.total >= self.max_connections:
            victim = next(iter(self._loose), None)
            if victim is None:
                return AdmissionVerdict(False, evicted=verdict.evicted,
                               reason=f"the daemon holds {self.max_connections} registered "
                               f"connections, as many as its file descriptors allow")
            self._evict(victim, verdict)
        self._members.add(session)
        self.total += 1
        self.per_uid[uid] += 1
        self._loose[session] = None
        self._loose_by_uid.setdefault(uid, {})[session] = None
        # Looked at first when the earlier of its two limits could have passed.
        first = min(self.limits.hello_timeout, self.limits.idle_timeout)
        heapq.heappush(self._due, (now + first, next(self._order), session))
        return verdict

    def registered(self, session: Session) -> None:
        """A registered client is past every deadline and is never evicted for room."""
        self._loose.pop(session, None)
        self._loose_by_uid.get(session.peer.uid, {}).pop(session, None)

    def gone(self, session: Session) -> None:
        if session not in self._members:
            return
        self._members.discard(session)
        self.registered(session)
        uid = session.peer.uid
        self.total -= 1
        self.per_uid[uid] -= 1
        if not self.per_uid[uid]:
            del self.per_uid[uid]
            self._loose_by_uid.pop(uid, None)

    def expired(self, now: float) -> list[tuple[Session, str]]:
        """Connections past the hello deadline or the idle limit, with the reason; forgotten."""
        out: list[tuple[Session, str]] = []
        limits = self.limits
        while self._due and self._due[0][0] <= now:
            _, _, session = heapq.heappop(self._due)
            if session not in self._loose:
                continue  # gone, or registered
            if not session.greeted:
                if now >= session.opened_at + limits.hello_timeout:
                    out.append((session, f"no hello within {limits.hello_timeout:g} s"))
                    self.gone(session)
                    continue
                due = session.opened_at + limits.hello_timeout
            else:
                due = session.active_at + limits.idle_timeout
                if now >= due:
                    out.append((session, f"idle and unregistered for "
                                f"{limits.idle_timeout:g} s"))
                    self.gone(session)
                    continue
            heapq.heappush(self._due, (due, next(self._order), session))
        return out

    def next_check(self) -> float | None:
        return self._due[0][0] if self._due else None

    def _evict(self, victim: Session, verdict: AdmissionVerdict) -> None:
        verdict.evicted.append(victim)
        self.gone(victim)
