"""The daemon's configuration object: ``SchedulerConfig``, every limit and default in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nodeside import limits
from nodeside.config.interactive import InteractiveSettings
from nodeside.model import POLICY_INTERACTIVE, POLICY_ROUND_ROBIN, UNLIMITED, AccessPolicy, Pool
from nodeside.protocol import DEFAULT_POOL

# The policy names are the domain's; ``nodeside.config`` names them too, where they used to live.
__all__ = ["DEFAULT_TQ", "POLICY_INTERACTIVE", "POLICY_ROUND_ROBIN", "SchedulerConfig"]

DEFAULT_TQ = 30.0


@dataclass(frozen=True)
class SchedulerConfig:
    tq: float = DEFAULT_TQ
    mode: str = "on"
    #: Pools by name. Empty means one implicit pool, ``default``, guaranteed the whole GPU.
    pools: Mapping[str, Pool] = field(default_factory=dict)
    #: Per-GPU TQ overrides, by GPU index.
    gpu_tq: Mapping[int, float] = field(default_factory=dict)
    #: Seconds a holder has, after a drop request, before the GPU is taken from it. Giving the
    #: GPU back may mean moving tens of GiB to host memory, so this is generous.
    grace: float = 10.0
    #: Seconds a checkpoint or a restore by the driver may take before the daemon gives up on
    #: it and says so (the process's memory counts as still on the GPU). The driver's API moves
    #: ~1.5-2 GB/s, so 120 s covers a full 80 GiB card; past that it is the driver's known
    #: cross-process hang (NVIDIA/cuda-checkpoint #30, #44, #45), not a slow copy.
    checkpoint_timeout: float = 120.0
    #: Seconds over which pool shares are measured; None: 50 quanta of the GPU's TQ, long
    #: enough that one quantum moves a share by 0.02, short enough to forget last hour's burst.
    window: float | None = None
    #: Bytes of GPU memory kept free in auto mode, for the driver and the CUDA contexts.
    memory_reserve: int = 512 * 1024**2
    #: Seconds an idle client asked to ``evict`` (feature ``memory``) may go without progress
    #: before it is checkpointed, where the checkpoint evictor reaches it, or else given up on
    #: (what NVML does not vouch for of its memory stops counting, or the waiter is told who
    #: holds the memory).
    evict_timeout: float = 10.0
    #: Least seconds between two evictions asked of one idle client (a TQ for a waiter of
    #: lower priority; fair_eviction.py); 0: as often as the room is needed.
    evict_interval: float = 2.0
    #: Seconds an evicted client stays idle before it is checkpointed too, freeing its context,
    #: where the checkpoint evictor reaches it; 0: never.
    checkpoint_after: float = 600.0
    #: Bytes of host memory each client with the ``memory`` feature may keep pinned ahead for its
    #: evictions (the vmm evictor's shadows and staging ring), told in ``registered``; None: the
    #: client's own default (a quarter of the host's memory, within its cgroup's limit). With
    #: a host budget, clients that speak ``tiers`` are given their share of it (tiers.py) and
    #: never more than this.
    pin_budget: int | None = None
    #: Bytes of host memory the node's clients may take for evicted memory, pinned shadows and
    #: spill staging together (feature ``tiers``); None: measured, what they take already plus
    #: MemAvailable less a margin, read again every 30 s (hostmem.py, tiers.py).
    host_budget: int | None = None
    #: Seconds an evicted client stays idle before its host copy is spilled to disk (feature
    #: ``tiers``); 0: only when the host budget runs short.
    spill_after: float = 600.0
    #: Seconds a spill or a fetch (feature ``tiers``) may go without progress (its disk figure
    #: moving by 64 MiB) before it is given up: its ``tier_failed`` says so, the host budget
    #: stops counting on it, and it is not asked to move again for a backoff (this long, twice
    #: that after the next give-up, up to eight times); 0: never given up.
    tier_timeout: float = 300.0
    #: A ``vmm`` client is granted while the room it lacks is still on its way out (clients
    #: told to evict, or released ``evicting``): its restore maps chunk by chunk as the card
    #: frees them, so its way in overlaps the other's way out, each direction on its own copy
    #: engine. Off by default until a GPU run measures both directions at once.
    handoff_overlap: bool = False
    #: Group (name or gid) whose members may change mode and TQ, besides root and the daemon's uid.
    admin_group: str | None = None
    #: Group owning the socket; its members may connect. None: the daemon's group.
    socket_group: str | None = None
    socket_mode: int = 0o660
    #: Hello deadline, idle limit, per-uid cap and listen backlog (``connections:``).
    connections: limits.ConnectionLimits = field(default_factory=limits.ConnectionLimits)
    #: Who may claim which pools and priorities; None: anyone may claim anything.
    access: AccessPolicy | None = None
    #: How the next holder is chosen: one of ``nodeside.model.POLICY_NAMES``, ``round-robin``
    #: (the seed's rule, default) or ``interactive`` (``nodeside.scheduler.policies``).
    policy: str = POLICY_ROUND_ROBIN
    interactive: InteractiveSettings = field(default_factory=InteractiveSettings)

    def share_window(self, tq: float) -> float:
        return self.window if self.window is not None else 50 * tq

    def tq_for(self, gpu: int) -> float:
        return self.gpu_tq.get(gpu, self.tq)

    def pool(self, name: str) -> Pool:
        """The named pool; a name the config does not know gets guarantee 0, weight 1."""
        if name in self.pools:
            return self.pools[name]
        if not self.pools and name == DEFAULT_POOL:
            return Pool(DEFAULT_POOL, guarantee=1.0, weight=1.0, maximum=UNLIMITED)
        return Pool(name, guarantee=0.0, weight=1.0, maximum=UNLIMITED)

    def with_runtime(self, **changes: Any) -> SchedulerConfig:
        return replace(self, **changes)
