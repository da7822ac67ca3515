"""The node's domain values that the configuration names and the scheduler applies.

A leaf module: it imports only the protocol's words. ``nodeside.config`` reads a file into these
types and ``nodeside.scheduler`` applies them; neither imports the other for them.

- ``Pool``: a team's share of one GPU's time (guarantee, weight, maximum), after the KAI
  scheduler's queues; ``UNLIMITED`` is the maximum that caps nothing.
- ``AccessRule`` and ``AccessPolicy``: who may claim which pools and priorities (``access:`` in
  the config; the scheduler's ``access.judge`` applies them to each registration).
- The policy names ``policy:`` accepts (``POLICY_NAMES``); ``nodeside.scheduler.policies`` has
  a policy for each.
- Where a client's memory is (``Residency``, whose values are ``RESIDENCIES``): on the GPU,
  moving out, in host memory, moving in (docs/protocol.md, feature ``memory``).
- What the daemon hands the scheduler as values: a client's ``Registration`` and the
  ``MemoryFigures`` it reports (where its memory is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from nodeside import protocol as p
from nodeside.protocol.document import RESIDENCIES

__all__ = ["ANY", "DOWNGRADE", "EVICTED", "EVICTING", "ON_VIOLATION", "POLICY_INTERACTIVE",
           "POLICY_NAMES", "POLICY_POOLS", "POLICY_ROUND_ROBIN", "REFUSE", "RESIDENCIES",
           "RESIDENT", "RESTORING", "UNLIMITED", "AccessPolicy", "AccessRule", "MemoryFigures",
           "Pool", "Registration", "Residency"]

# -- pools --------------------------------------------------------------------------------------

#: A pool's maximum when it has none.
UNLIMITED = -1.0


@dataclass(frozen=True)
class Pool:
    """A team's share of one GPU's time: fractions of it, as KAI's queues give them."""

    name: str
    guarantee: float = 0.0
    weight: float = 1.0
    maximum: float = UNLIMITED
    #: False when the config left out guarantee, weight or maximum. KAI turns preemption off for
    #: every pool when any pool is partially configured; so do we.
    complete: bool = True
    #: Which of guarantee, weight and maximum the config left out (for the reason shown to users).
    missing: tuple[str, ...] = ()

    @property
    def cap(self) -> float:
        return 1.0 if self.maximum < 0 else min(self.maximum, 1.0)


# -- who may claim which pools and priorities ---------------------------------------------------

ANY = "*"
REFUSE = "refuse"
DOWNGRADE = "downgrade"
ON_VIOLATION = (REFUSE, DOWNGRADE)


@dataclass(frozen=True)
class AccessRule:
    """Peers with one of ``uids`` or ``gids``, or whose pod is in one of ``namespaces``, may
    use ``pools`` at ``priorities``."""

    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()
    pools: frozenset[str] = frozenset({ANY})
    priorities: frozenset[str] = frozenset(p.PRIORITIES)
    namespaces: frozenset[str] = frozenset()

    def matches(self, uid: int | None, gids: Iterable[int], namespace: str | None = None) -> bool:
        return ((uid is not None and uid in self.uids) or bool(self.gids.intersection(gids))
                or (namespace is not None and namespace in self.namespaces))

    def allows(self, pool: str, priority: str) -> bool:
        return (ANY in self.pools or pool in self.pools) and priority in self.priorities


@dataclass(frozen=True)
class AccessPolicy:
    #: What everyone may claim, whatever their uid (when no rule below says more).
    default: AccessRule = AccessRule(pools=frozenset({"default"}),
                                     priorities=frozenset({"NORMAL", "LOW"}))
    rules: tuple[AccessRule, ...] = ()
    #: ``refuse``: a claim outside the policy is an E_PERMISSION error. ``downgrade``: the
    #: client is registered with the nearest claim it may make, and a warning says so.
    on_violation: str = REFUSE
    uids_exempt: frozenset[int] = field(default_factory=lambda: frozenset({0}))

    @property
    def names_namespaces(self) -> bool:
        """Whether some rule names a namespace (and so needs the daemon to verify them)."""
        return any(r.namespaces for r in (self.default, *self.rules))

    def rules_for(self, uid: int | None, gids: Iterable[int],
                  namespace: str | None = None) -> list[AccessRule]:
        gids = tuple(gids)
        return [self.default, *(r for r in self.rules if r.matches(uid, gids, namespace))]

    def allowed(self, uid: int | None, gids: Iterable[int], pool: str, priority: str,
                namespace: str | None = None) -> bool:
        if uid in self.uids_exempt:
            return True
        return any(r.allows(pool, priority) for r in self.rules_for(uid, gids, namespace))


# -- the scheduling policies' names -------------------------------------------------------------

#: How the next holder is chosen within the pools' rules (docs/policy.md says when to use which).
POLICY_ROUND_ROBIN = "round-robin"
POLICY_INTERACTIVE = "interactive"
#: The name the policy seam first had for round robin, still accepted.
POLICY_POOLS = "pools"
#: Every name ``policy:`` accepts.
POLICY_NAMES = (POLICY_ROUND_ROBIN, POLICY_POOLS, POLICY_INTERACTIVE)


# -- where a client's memory is ------------------------------------------------------------------

class Residency(Enum):
    """Where a client's memory is, in the order a client goes through them; each value is the
    status document's word (``protocol.document.RESIDENCIES``). The scheduler's table of legal
    moves between them is ``scheduler.clients.RESIDENCY_MOVES``."""

    #: On the GPU (a client with no memory anywhere is resident with 0 bytes).
    RESIDENT = "resident"
    #: Asked to move to host memory (or released with ``evicting``): on its way out.
    EVICTING = "evicting"
    #: In host memory, restored when the client is next granted.
    EVICTED = "evicted"
    #: Granted after an eviction: moving back in until a report says nothing is left in host
    #: memory.
    RESTORING = "restoring"

    # The members are singletons compared by identity; the identity hash is the same answer
    # in C as in Python (a move looks a pair up in the table), as for ``HoldState``.
    __hash__ = object.__hash__


RESIDENT: Final = Residency.RESIDENT
EVICTING: Final = Residency.EVICTING
EVICTED: Final = Residency.EVICTED
RESTORING: Final = Residency.RESTORING
assert tuple(r.value for r in Residency) == RESIDENCIES, "the wire's words and the enum differ"


# -- what the daemon hands the scheduler ---------------------------------------------------------

@dataclass(frozen=True)
class Registration:
    """A client registering, as the daemon read and bounded its ``register`` request; ``pid``,
    ``uid``, ``gids`` and ``namespace`` are the peer's credentials as the daemon verified them,
    never what the client says. The scheduler judges the claimed pool and priority."""

    name: str
    gpu: int = 0
    pool: str = "default"
    priority: str = "NORMAL"
    pid: int | None = None
    uid: int | None = None
    #: ``kernel``, ``shim`` or ``client``.
    kind: str = "client"
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Bytes it needs on the GPU; None while unknown (it needs the whole GPU).
    working_set: int | None = None
    gids: tuple[int, ...] = ()
    #: What people see (a notebook's path); ``name`` when None.
    display_name: str | None = None
    #: The user name of its uid, as the daemon resolved it.
    user: str | None = None
    #: How its memory leaves the GPU, as the daemon can carry it out (``EVICT_MODES``).
    evict: str = "managed"
    #: The GPU by UUID, where it named one the node knows (else ``gpu``).
    gpu_uuid: str | None = None
    #: The namespace of its pod, as the daemon verified it; None when not in a pod.
    namespace: str | None = None
    #: It stops its GPU work on ``pause`` and goes on at ``resume`` (taking turns).
    pausable: bool = False


@dataclass(frozen=True)
class MemoryFigures:
    """Where a client (feature ``memory``) says its memory is: bytes on the GPU, in host
    memory, and host memory it keeps for evictions (the vmm evictor's shadows); None: not said.
    """

    resident: int | None = None
    host: int | None = None
    shadow: int | None = None
    #: Feature ``tiers``: bytes in its spill files, and of its host memory pinned.
    disk: int | None = None
    pinned: int | None = None
