"""The status document (CONTRACT section 5), built in this one place.

``Client.status()``, ``kiwictl status --json``, the server extension's REST endpoint and the
panel all show what this function returns. Keys named by the contract are fixed; others may be
added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodeside.scheduler.core import Client, Scheduler
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.report import pool_reports

STATUS_VERSION = 1


def build_status(scheduler: Scheduler, now: float,
                 memory_used: Mapping[int, int | None] | None = None) -> dict[str, Any]:
    """Snapshot the scheduler. ``memory_used`` is what NVML reads per GPU, where it can."""
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
        })
    clients = [_client_entry(scheduler, c, positions.get(c.id), now)
               for c in scheduler.clients.values()]
    return {
        "version": STATUS_VERSION,
        "mode": scheduler.mode,
        "tq": scheduler.tq,
        "gpus": gpus,
        "clients": clients,
        "pools": _pools(scheduler, now),
        "preemption": scheduler.preemption,
        "preemption_off_reason": scheduler.preemption_off_reason,
    }


def _client_entry(scheduler: Scheduler, client: Client, position: int | None,
                  now: float) -> dict[str, Any]:
    return {
        "id": client.id,
        "name": client.name,
        "pid": client.pid,
        "gpu": client.gpu,
        "pool": client.pool,
        "priority": client.priority,
        "state": client.state,
        "queue_position": position,
        "working_set": client.working_set or 0,
        "gpu_seconds": round(scheduler.gpu_seconds(client, now), 6),
        "kind": client.kind,
        "labels": dict(client.labels),
        "waiting_since": None if client.requested_at is None
        else round(now - client.requested_at, 6),
    }


def _pools(scheduler: Scheduler, now: float) -> list[dict[str, Any]]:
    names = set(scheduler.config.pools) | {c.pool for c in scheduler.clients.values()}
    if not scheduler.config.pools:
        names.add("default")
    # A pool's share is averaged over the node's GPUs: one GPU's time is the unit of the config,
    # and a node with several GPUs measures each against its own.
    shares: dict[str, float] = {}
    for index in scheduler.gpus:
        for name, share in scheduler.shares(index, now).items():
            shares[name] = shares.get(name, 0.0) + share / len(scheduler.gpus)
    contending = {c.pool for c in scheduler.clients.values() if c.state != "idle"}
    ent = entitlements(scheduler.pool(n) for n in sorted(contending))
    reports = {r.name: r for r in pool_reports(scheduler, now)}
    out = []
    for name in sorted(names):
        pool = scheduler.pool(name)
        report = reports.get(name)
        members = [c for c in scheduler.clients.values() if c.pool == name]
        out.append({
            "name": name,
            "guarantee": pool.guarantee,
            "weight": pool.weight,
            "maximum": pool.maximum,
            "share": round(shares.get(name, 0.0), 6),
            "entitlement": round(ent[name], 6) if name in ent else None,
            "clients": len(members),
            "waiting": sum(1 for c in members if c.state == "waiting"),
            "holding": sum(1 for c in members if c.state == "holding"),
            "configured": name in scheduler.config.pools or not scheduler.config.pools,
            "complete": pool.complete,
            # The pools report (``kiwictl pools``): who waits, and why a stuck pool is stuck.
            "missing": list(pool.missing),
            "waiting_clients": report.waiting if report else [],
            "stuck": report.stuck if report else None,
            "gpus": report.as_status()["gpus"] if report else [],
        })
    return out


def _reported_use(clients: Any) -> int | None:
    sizes = [c.working_set for c in clients if c.state == "holding"]
    if any(s is None for s in sizes):
        return None
    return sum(s or 0 for s in sizes)
