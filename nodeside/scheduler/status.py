"""The status document (CONTRACT section 5), built in this one place.

``Client.status()``, ``kiwictl status --json``, the server extension's REST endpoint and the
panel all show what this function returns. Keys named by the contract are fixed; others may be
added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from nodeside.scheduler.core import ClientRecord, Scheduler
from nodeside.scheduler.ledger import counted, holding, need, occupies
from nodeside.scheduler.report import pool_reports
from nodeside.scheduler.tiers import tier

STATUS_VERSION = 1


class Evictions(Protocol):
    """What the daemon's checkpoint evictor knows beside the scheduler (its sans-I/O lines,
    ``nodeside.evict.lines.EvictionLines``): shown in the document, not patched into it."""

    def blocked(self, gpu: int, full: bool = True) -> str | None:
        """Why nothing is granted on this GPU now (a failed checkpoint), or None; ``full``
        False: as a non-admin may read it (without a pid)."""

    def checkpoint(self, client_id: str) -> tuple[str, str | None] | None:
        """A checkpointed client's state and last error; None for any other client."""


def build_status(scheduler: Scheduler, now: float,
                 memory_used: Mapping[int, int | None] | None = None, *,
                 viewer_admin: bool = True, viewer_uid: int | None = None,
                 evictions: Evictions | None = None,
                 host_budget: int | None = None,
                 host_total: int | None = None) -> dict[str, Any]:
    """Snapshot the scheduler. ``memory_used`` is what NVML reads per GPU, where it can;
    ``evictions`` adds the checkpoint evictor's state (``evict_blocked`` per GPU,
    ``checkpoint_state`` and ``checkpoint_error`` per client it checkpoints); ``host_total``:
    the host's memory, which no host figure shown exceeds, whatever clients say.

    A viewer that is not an admin sees every client's name and state, but the pid and labels
    only of clients with its own uid (``viewer_uid``): others' pids, labels (a pod's name, a
    path) and verified namespaces are theirs.
    """
    memory_used = memory_used or {}
    queues = {index: scheduler.queue(index, now) for index in scheduler.gpus}
    positions = {c.id: i + 1 for queue in queues.values() for i, c in enumerate(queue)}
    gpus = []
    for index, gpu in scheduler.gpus.items():
        spec = gpu.spec
        used = memory_used.get(index)
        if used is None:
            used = _reported_use(c for c in scheduler.clients.values() if c.gpu == index)
        gpus.append({
            "index": index,
            "name": spec.name,
            "uuid": spec.uuid,
            "memory_total": spec.memory_total,
            "memory_used": used,
            "holders": list(gpu.holders),
            "queue": [c.id for c in queues[index]],
            "quantum_remaining": scheduler.quantum_remaining(index, now),
            "tq": scheduler.tq_for(index),
            # Which policy chooses, and why the first in the queue is next (None: nobody waits).
            "policy": scheduler.choice.name,
            "next_reason": scheduler.choice.reason(gpu, queues[index][0], now)
            if queues[index] else None,
            # Seconds of a turn when its pausable holders take turns (mode auto,
            # interactive.turns); 0: the driver time-slices between them.
            "turns": scheduler.turn_length(),
            # Its recent holds, whole and named, oldest first (history.py): the panel's
            # timeline, the same in every tab and after every reload.
            "recent_holders": gpu.history.recent(now),
        })
        if evictions is not None:
            gpus[-1]["evict_blocked"] = evictions.blocked(index, viewer_admin)
        if gpu.memory_clients:
            on_it = [c for c in scheduler.clients.values() if c.gpu == index]
            gpus[-1].update({
                "resident_bytes": sum(_resident(c) for c in on_it),
                "capacity": spec.memory_total,
                "host_bytes": _at_most(sum(c.host_bytes for c in on_it if c.memory), host_total),
                "host_budget": None if host_budget is None
                else _at_most(host_budget, host_total),
            })
            tiered = [c.tiering for c in on_it if c.tiering is not None]
            if tiered:
                gpus[-1].update({
                    "pinned_bytes": _at_most(sum(t.pinned for t in tiered), host_total),
                    "spill_bytes": sum(t.disk for t in tiered),
                })
    clients = []
    for client in scheduler.clients.values():
        entry = _client_entry(scheduler, client, positions.get(client.id), now)
        checkpoint = evictions.checkpoint(client.id) if evictions is not None else None
        if checkpoint is not None:
            entry["checkpoint_state"], entry["checkpoint_error"] = checkpoint
        if client.memory:
            waiting_for = client.waiting_for
            entry.update({
                "residency": client.residency.value,
                "resident_bytes": occupies(client),
                "counted_bytes": counted(client),
                "evict_failed": client.evict_failed,
                "evictions_asked": client.evictions_asked,
                "host_bytes": _at_most(client.host_bytes, host_total),
                "shadow_bytes": _at_most(client.shadow_bytes, host_total),
                "memory_source": client.memory_source,
                "waiting_for": None if waiting_for is None else {
                    "client": waiting_for.client, "name": waiting_for.name,
                    "bytes": waiting_for.bytes, "action": waiting_for.action},
            })
            tiering = client.tiering
            if tiering is not None:
                entry.update({"tier": tier(client), "disk_bytes": tiering.disk,
                              "pinned_bytes": _at_most(tiering.pinned, host_total),
                              "tier_failed": tiering.failed})
        clients.append(entry if sees_whole(viewer_admin, viewer_uid, client.uid)
                       else as_others_see(entry))
    pools = sorted(pool_reports(scheduler, now, queues), key=lambda r: r.name)
    return {
        "version": STATUS_VERSION,
        "mode": scheduler.mode,
        "tq": scheduler.tq,
        "policy": scheduler.choice.name,
        "gpus": gpus,
        "clients": clients,
        "pools": [r.as_status() for r in pools],
        # What the config's pools section names ([]: none): %kiwi pool refuses other names there.
        "configured_pools": sorted(scheduler.config.pools),
        "preemption": scheduler.preemption,
        "preemption_off_reason": scheduler.preemption_off_reason,
    }


def sees_whole(viewer_admin: bool, viewer_uid: int | None, client_uid: int | None) -> bool:
    """Does this viewer see a client's entry whole? Admins see every one; another viewer only
    those of its own uid."""
    return viewer_admin or (viewer_uid is not None and client_uid == viewer_uid)


def as_others_see(entry: dict[str, Any]) -> dict[str, Any]:
    """A client's entry as a viewer of another uid sees it: without its pid, labels (a pod's
    name, a path) and the namespace verified against them. The keys keep their order."""
    cut = {**entry, "pid": None, "namespace": None}
    del cut["labels"]
    return cut


def gpus_as_others_see(gpus: list[dict[str, Any]],
                       evictions: Evictions | None) -> list[dict[str, Any]]:
    """The GPUs' entries of an admin's document as a non-admin sees them: why one is blocked,
    without the pid."""
    if evictions is None:
        return gpus
    return [{**gpu, "evict_blocked": evictions.blocked(gpu["index"], False)} for gpu in gpus]


def _client_entry(scheduler: Scheduler, client: ClientRecord, position: int | None,
                  now: float) -> dict[str, Any]:
    return {
        "id": client.id,
        "name": client.name,
        "display_name": client.display_name or client.name,
        "user": client.user,
        "pid": client.pid,
        "gpu": client.gpu,
        "pool": client.pool,
        "priority": client.priority,
        "state": client.state,
        # Holding, but paused while a holder beside it has its turn (taking_turns.py).
        "paused": client.paused,
        "queue_position": position,
        "working_set": client.working_set or 0,
        "gpu_seconds": round(scheduler.gpu_seconds(client, now), 6),
        "kind": client.kind,
        "evict": client.evict,
        "namespace": client.namespace,
        "labels": dict(client.labels),
        "waiting_since": None if client.requested_at is None
        else round(now - client.requested_at, 6),
    }


def _at_most(nbytes: int, total: int | None) -> int:
    return nbytes if total is None else min(nbytes, total)


def _resident(client: ClientRecord) -> int:
    """Bytes a client has on its GPU as the scheduler counts them (feature ``memory``), else a
    holder's working set."""
    if client.memory:
        return need(client) if holding(client) else counted(client)
    return (client.working_set or 0) if client.state == "holding" else 0


def _reported_use(clients: Any) -> int | None:
    sizes = [c.working_set for c in clients if c.state == "holding"]
    if any(s is None for s in sizes):
        return None
    return sum(s or 0 for s in sizes)
