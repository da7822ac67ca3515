"""Who may claim which pools and priorities: pool and priority as permissions.

A pool with a guarantee and the HIGH priority are power over other people's work: a request of
a pool below its guarantee makes a LOW holder drop at once. Without a policy any peer on the
socket could claim them. The admin writes one in the config (``access:``); the core checks each
``register`` against it with the peer's uid and groups, which the daemon reads from the socket
(``SO_PEERCRED``) and the kernel's group list: credentials a client cannot forge. On Kubernetes
a rule may also name namespaces: the daemon finds the peer's pod from its pid's cgroup and the
pod's namespace from the Kubernetes API (nodeside/daemon/kube.py). What a client says about
itself (its environment, its labels, a namespace it names) is never used here; see
docs/policy.md.

Sans-I/O like the rest of the core: uid, gids and verified namespace in, a verdict out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nodeside import protocol as p

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


@dataclass(frozen=True)
class Verdict:
    pool: str
    priority: str
    #: Why the claim was changed (downgrade), for the log and the client; None when it stood.
    warning: str | None = None


def judge(policy: AccessPolicy | None, *, uid: int | None, gids: Iterable[int], pool: str,
          priority: str, namespace: str | None = None) -> Verdict:
    """The pool and priority a peer gets for its claim, or PermissionError saying why not.

    No policy: every claim stands (the daemon's behaviour before policies existed).
    A downgrade keeps the pool when some priority in it is allowed (the highest allowed at or
    below the claim, else the lowest allowed), and otherwise moves to the first pool allowed,
    ``default`` first, then the pools the peer's rules name, by name.
    ``namespace`` is the verified namespace of the peer's pod; None (no pod, or none the daemon
    could verify) matches no namespace rule, so it can only allow less.
    """
    gids = tuple(gids)
    if policy is None or policy.allowed(uid, gids, pool, priority, namespace):
        return Verdict(pool, priority)
    who = f"uid {uid}" if uid is not None else "this peer"
    if namespace is not None:
        who += f" in namespace {namespace}"
    refusal = f"{who} may not use pool {pool!r} at priority {priority}"
    if policy.on_violation == REFUSE:
        raise PermissionError(f"{refusal} (the access policy in the daemon's config)")
    pools = [pool, "default",
             *sorted({q for r in policy.rules_for(uid, gids, namespace) for q in r.pools} - {ANY})]
    ranks = list(p.PRIORITIES)  # HIGH, NORMAL, LOW
    for candidate in pools:
        allowed = [r for r in ranks if policy.allowed(uid, gids, candidate, r, namespace)]
        if not allowed:
            continue
        below = [r for r in allowed if ranks.index(r) >= ranks.index(priority)]
        given = below[0] if below else allowed[-1]
        return Verdict(candidate, given,
                       f"{refusal}: registered in pool {candidate!r} at {given} instead")
    raise PermissionError(f"{refusal}, and no pool is open to it")
