"""The node's state: what every part of the scheduler reads and the events change.

One ``NodeState`` per scheduler: the config and what an admin changed since (mode, TQ), each GPU
(``GpuState``: holders, waiters, share meter), each client (``ClientRecord``, with its hold), the
policy that chooses, the counters the metrics read, and the few numbers derived from the config
once rather than on every event. The components (membership.py, controls.py, turns.py,
taking_turns.py, room.py, queries.py) each take it explicitly; ``Scheduler`` (core.py) makes it
and them. It is also the read-only view a policy gets (view.py): a policy is given this object,
typed as ``PolicyView``, and so sees only that much of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import final

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.model import Pool
from nodeside.scheduler.actions import SchedulerError
from nodeside.scheduler.choosing import PoolsPolicy, contending_pools
from nodeside.scheduler.gpu_state import ClientRecord, GpuSpec, GpuState
from nodeside.scheduler.policies import POLICIES
from nodeside.scheduler.pools import preemption_enabled
from nodeside.scheduler.view import PolicyView


@final
class NodeState(PolicyView):
    """Every GPU of one node, its clients and its policy; the components change it."""

    def __init__(self, config: SchedulerConfig, gpus: Iterable[GpuSpec], now: float) -> None:
        self.config = config
        self.mode = config.mode
        self.tq = config.tq
        self.gpus: dict[int, GpuState] = {}
        for spec in gpus:
            self.gpus[spec.index] = GpuState(spec, config.gpu_tq.get(spec.index), now)
        if not self.gpus:
            raise ValueError("a scheduler needs at least one GPU")
        self.clients: dict[str, ClientRecord] = {}
        #: Registered clients by pool name. A pool the config does not name exists while it has
        #: clients: when its last one leaves, what the scheduler keeps by its name goes too, so
        #: peers registering under ever new names cannot grow the daemon.
        self.pool_members: dict[str, int] = {}
        #: Pools by name, as ``pool`` made them from the config (cleared when it is reloaded).
        self.pools: dict[str, Pool] = {}
        self.ids = itertools.count(1)
        #: Request orders given so far, across GPUs and pools (``next_order``).
        self.orders = 0
        #: Counters for metrics; the shell reads them.
        self.counts = {"grants": 0, "drops": 0, "preemptions": 0, "revocations": 0,
                       "steps_aside": 0, "turns": 0, "evictions": 0, "refusals": 0, "restores": 0,
                       "evicted_bytes": 0}
        #: Events seen; a next deadline computed since the last one still holds.
        self.events = 0
        #: The host budget measured (Kiwi's own host use plus MemAvailable less a margin, at
        #: the shell's last read), where the config gives none; ``host_budget`` is the one the
        #: rules use (tiers.py).
        self.measured_host_budget: int | None = None
        #: When the shell last read the host's memory (None: never).
        self.host_read_at: float | None = None
        self.host_budget: int | None = None
        #: The clients that speak ``tiers``, by id (tiers.py keeps it; empty: no host planning).
        self.tiered: dict[str, ClientRecord] = {}
        #: Host memory a grant's evictions wait for beyond the budget's headroom: spills are
        #: asked to free it (residency.py sets it, tiers.py reads it).
        self.host_wanted = 0
        self.read_config()
        self.choice: PoolsPolicy = POLICIES[config.policy](self)
        self.resize_windows()

    def read_config(self) -> None:
        """Read off the config once, not on every event, what the rules ask on every event:
        may a holder be preempted, does any pool have a maximum below the whole GPU (most nodes
        have none, and then no share needs measuring on a handoff's path), the memory kept
        free and a drop's grace."""
        config = self.config
        self.preemption = preemption_enabled(config.pools)
        self.capped = any(pool.cap < 1.0 for pool in config.pools.values())
        for gpu in self.gpus.values():
            gpu.ledger.reserve = config.memory_reserve
        self.grace = config.grace
        self.host_budget = config.host_budget if config.host_budget is not None \
            else self.measured_host_budget

    def configure(self, config: SchedulerConfig) -> None:
        """Take a reloaded config: its pools, policy, per-GPU TQs and share window."""
        self.config = config
        self.read_config()
        self.pools = {}
        if config.policy != self.choice.name:
            self.choice = POLICIES[config.policy](self)
        for gpu in self.gpus.values():
            gpu.tq_override = config.gpu_tq.get(gpu.spec.index)
        self.resize_windows()

    def resize_windows(self) -> None:
        """Each GPU's share window follows its TQ (``SchedulerConfig.share_window``)."""
        for index, gpu in self.gpus.items():
            gpu.meter.window = self.config.share_window(self.tq_for(index))

    # -- what a policy reads (PolicyView), and the rules too --------------------------------

    @property
    def settings(self) -> SchedulerConfig:
        return self.config

    def pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = self.config.pool(name)
        return pool

    def tq_for(self, gpu: int) -> float:
        override = self.gpus[gpu].tq_override
        return self.tq if override is None else override

    def shares(self, gpu: int, now: float) -> dict[str, float]:
        state = self.gpus[gpu]
        return state.meter.shares(now, contending_pools(state))

    # -- what the components share ----------------------------------------------------------

    def next_order(self) -> int:
        """The next request order: a waiter's place in its lane. An int counted here, not an
        iterator: compiled, ``next()`` on one is a generic call, and every acquire takes one."""
        self.orders += 1
        return self.orders

    def tq_of(self, gpu: GpuState) -> float:
        """``tq_for`` for a GPU at hand, without looking it up by its index."""
        override = gpu.tq_override
        return self.tq if override is None else override

    def quantum(self, gpu: int) -> float | None:
        """The quantum a grant on ``gpu`` carries: none in mode off, where no quantum runs."""
        return None if self.mode == "off" else self.tq_for(gpu)

    def quantum_of(self, gpu: GpuState) -> float | None:
        """``quantum`` for a GPU at hand."""
        return None if self.mode == "off" else self.tq_of(gpu)

    def client(self, client_id: str) -> ClientRecord:
        """A registered client, or the error a peer gets for naming one that is not."""
        try:
            return self.clients[client_id]
        except KeyError:
            raise SchedulerError(p.E_STATE, f"no client {client_id}") from None
