"""Who is on the node: clients registering, their claims checked, and clients leaving.

``register`` judges a client's claimed pool and priority by its credentials (access.py) and
finds the GPU it named; ``unregister`` frees whatever it held or waited for (through the turns,
turns.py) and tells the policy. A pool the config does not name lives as long as it has clients.
"""

from __future__ import annotations

from typing import final

from nodeside import protocol as p
from nodeside.model import Registration
from nodeside.scheduler.access import judge
from nodeside.scheduler.actions import Action, SchedulerError
from nodeside.scheduler.gpu_state import EVICT_MODES, PRIORITY_RANK, ClientRecord
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.turns import Turns
from nodeside.scheduler.view import Gone


@final
class Membership:
    """The events that add a client to the node or take one away."""

    def __init__(self, state: NodeState, turns: Turns) -> None:
        self.state = state
        self.turns = turns

    def register(self, now: float, registration: Registration) -> ClientRecord:
        """A new client. Its ``uid``, ``gids`` and ``namespace`` are the peer's credentials as
        the shell verified them, never what the client says: the access policy judges the
        claimed pool and priority by them (a ``namespace`` of None: not in a pod, or not
        verified). A downgraded claim leaves its reason in ``ClientRecord.warning``. ``pausable``:
        it honours ``Pause`` and ``Resume`` (taking turns).
        """
        r = registration
        gpu = self._gpu_named(r.gpu, r.gpu_uuid)
        if r.priority not in PRIORITY_RANK:
            raise SchedulerError(p.E_INVALID, f"priority must be one of {', '.join(p.PRIORITIES)}")
        if not r.pool:
            raise SchedulerError(p.E_INVALID, "pool must be a non-empty name")
        if r.evict not in EVICT_MODES:
            raise SchedulerError(p.E_INVALID, f"evict must be one of {', '.join(EVICT_MODES)}")
        gids = tuple(r.gids)
        try:
            verdict = judge(self.state.config.access, uid=r.uid, gids=gids, pool=r.pool,
                            priority=r.priority, namespace=r.namespace)
        except PermissionError as exc:
            raise SchedulerError(p.E_PERMISSION, str(exc)) from None
        state = self.state
        client = ClientRecord(id=f"c{next(state.ids)}", name=r.name, gpu=gpu, pool=verdict.pool,
                        priority=verdict.priority, pid=r.pid, uid=r.uid, gids=gids, kind=r.kind,
                        labels=dict(r.labels), working_set=r.working_set,
                        registered_at=now, display_name=r.display_name or r.name, user=r.user,
                        evict=r.evict, warning=verdict.warning, namespace=r.namespace,
                        pausable=r.pausable)
        state.clients[client.id] = client
        state.pool_members[client.pool] = state.pool_members.get(client.pool, 0) + 1
        return client

    def _gpu_named(self, gpu: int, uuid: str | None) -> int:
        """The GPU a client asked for: by UUID when it gave one and the node knows UUIDs."""
        gpus = self.state.gpus
        known = {g.spec.uuid: index for index, g in gpus.items() if g.spec.uuid}
        if uuid and known:
            if uuid not in known:
                raise SchedulerError(p.E_INVALID, f"no GPU {uuid} on this node")
            return known[uuid]
        if gpu not in gpus:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node "
                                 f"(it has {', '.join(map(str, gpus))})")
        return gpu

    def unregister(self, now: float, client_id: str) -> list[Action]:
        """The client's connection is gone: free whatever it held or waited for, at once."""
        state = self.state
        client = state.clients.pop(client_id, None)
        if client is None:
            return []
        gpu = state.gpus[client.gpu]
        self.turns.free(client, now)
        # Before the GPU is scheduled again: a grant there must not count a client gone.
        if state.choice.observes:
            state.choice.observe(Gone(gpu, client, now))
        self._leave_pool(client.pool)
        return self.turns.schedule(gpu, now)

    def _leave_pool(self, name: str) -> None:
        state = self.state
        left = state.pool_members[name] - 1
        if left:
            state.pool_members[name] = left
            return
        del state.pool_members[name]
        if name in state.config.pools:
            return
        # An ad-hoc pool with no clients left: its GPU-seconds counter (metrics) and cached
        # Pool go. The share meter forgets it as its holds leave the window.
        state.pools.pop(name, None)
        for gpu in state.gpus.values():
            gpu.pool_seconds.pop(name, None)
