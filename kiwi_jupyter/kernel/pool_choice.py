"""``%kiwi pool NAME``: whether the node's scheduler has a pool of that name, from its status.

The daemon takes any pool name at registration: a name its config does not list becomes a pool
of its own with no guarantee and weight 1 (``SchedulerConfig.pool``), which is how
``KIWI_POOL`` works with no config at all. Where the admin *did* configure pools, a name typed in
a notebook that is none of them is far more often a typo than a wish for a pool with no
guarantee, so the magic refuses it and names the pools there are. The list comes from the daemon
(the status document's ``configured_pools``), never from a second copy of the rules here; who
may claim which pool stays the daemon's to decide (docs/policy.md, "Access"), and its refusal
reaches the notebook as a refusal.
"""

from __future__ import annotations

from typing import Any

from nodeside.protocol import DEFAULT_POOL


def configured_pools(document: dict[str, Any]) -> list[str] | None:
    """The pools the daemon's config names; None from a daemon that does not say."""
    names = document.get("configured_pools")
    return None if names is None else [str(name) for name in names]


def unknown_pool(document: dict[str, Any], name: str) -> str | None:
    """Why ``name`` is refused (one line), or None when the scheduler has such a pool.

    ``default``, the pool of every client that names none, is always there."""
    known = configured_pools(document)
    if not known or name in known or name == DEFAULT_POOL:
        return None
    pools = ", ".join(sorted({*known, DEFAULT_POOL}))
    return (f"the scheduler has no pool {name!r}; its pools are: {pools} "
            f"(a kernel started with KIWI_POOL={name} gets a pool of its own, with no guarantee)")


def pool_note(document: dict[str, Any], name: str) -> str:
    """What joining ``name`` means, when the config says nothing about it: empty otherwise."""
    if configured_pools(document) == [] and name != DEFAULT_POOL:
        return (" (this node configures no pools: the scheduler takes any name, each a pool "
                "with weight 1 and no guarantee)")
    return ""
