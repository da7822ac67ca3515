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

Sans-I/O like the rest of the core: uid, gids and verified namespace in, a verdict out. The
policy's types (``AccessPolicy``, ``AccessRule``) are the domain's, in ``nodeside.model``, where
the config reads them too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nodeside import protocol as p
from nodeside.model import ANY, REFUSE, AccessPolicy


@dataclass(frozen=True)
class AccessVerdict:
    pool: str
    priority: str
    #: Why the claim was changed (downgrade), for the log and the client; None when it stood.
    warning: str | None = None


def judge(policy: AccessPolicy | None, *, uid: int | None, gids: Iterable[int], pool: str,
          priority: str, namespace: str | None = None) -> AccessVerdict:
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
        return AccessVerdict(pool, priority)
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
        return AccessVerdict(candidate, given,
                       f"{refusal}: registered in pool {candidate!r} at {given} instead")
    raise PermissionError(f"{refusal}, and no pool is open to it")
