"""The status document's shape (docs/interfaces.md section 5): every key, its type, and who adds it.

``status`` replies carry this document; ``nodeside.scheduler.status.build_status`` builds it, the
checkpoint evictor adds its keys, and the Jupyter server adds its own before the panel reads it.
The panel's TypeScript types are generated from this table (``generate``), and a test holds what
``build_status`` returns to it, so the three cannot drift apart.

Types are those of ``messages.TYPES``, plus ``list[<part>]`` for a list of one of the parts
below and ``list[str]``. ``contract`` keys are the ones docs/interfaces.md section 5 fixes: the
panel may count on them; ``always`` keys are ours but always there with their part; the others
are ours and may be absent from an older daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nodeside.protocol.messages import EVICTORS, MODES, PRIORITIES

__all__ = ["CLIENT", "CLIENT_STATES", "DOCUMENT", "GPU", "HELD_SPAN", "MEMORY_SOURCES", "MODES",
           "PARTS", "POOL", "POOL_GPU", "RESIDENCIES", "TIERS", "WAITING_FOR", "Key", "Part",
           "part"]


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    doc: str = ""
    #: Fixed by docs/interfaces.md section 5.
    contract: bool = False
    #: Not fixed by the contract, but always there when its part is.
    always: bool = False
    #: May be null.
    nullable: bool = False
    #: The strings it takes, when it is one of a few.
    values: tuple[str, ...] = ()
    #: Who adds it, when not ``build_status``: "evictor" (the checkpoint evictor, in the
    #: daemon), "server" (the Jupyter server extension), "status_line" (a document too long);
    #: "memory": ``build_status``, for clients that speak the ``memory`` feature (and the GPUs
    #: they are on); "pause_watch" (the daemon, where NVML samples each process's use of the
    #: GPU); "tiers": ``build_status``, for clients that speak the ``tiers`` feature.
    added_by: str = ""


@dataclass(frozen=True)
class Part:
    #: The name of the TypeScript interface.
    interface: str
    doc: str
    keys: tuple[Key, ...]
    #: The daemon's keys may all be missing (the server's answer when the daemon is away).
    partial: bool = False


#: A client's state in the document: DROPPING is still "holding" (scheduler/gpu_state.py).
CLIENT_STATES: Final[tuple[str, ...]] = ("idle", "waiting", "holding")

HELD_SPAN: Final = Part("IHeldSpan", "One hold in the scheduler's own history of a GPU: times "
                                    "are seconds before the document was made.", (
    Key("client", "str", "The holder's client id.", always=True),
    Key("name", "str", always=True),
    Key("display_name", "str", nullable=True, always=True),
    Key("user", "str", nullable=True, always=True),
    Key("started_ago", "number", "Seconds before the document when the hold began.",
        always=True),
    Key("ended_ago", "number", "Seconds before the document when it ended; null while it "
                               "holds.", nullable=True, always=True),
    Key("started", "number", "`started_ago` under its first name, kept for the readers of "
                             "older documents.", always=True),
    Key("ended", "number", "`ended_ago` under its first name, kept likewise.", nullable=True,
        always=True),
))

#: Where a client's memory is (feature ``memory``): on the GPU, moving out, in host memory,
#: moving in. ``nodeside.model`` names each for the scheduler.
RESIDENCIES: Final[tuple[str, ...]] = ("resident", "evicting", "evicted", "restoring")

#: Which tier a client's memory is in (feature ``tiers``): the GPU, host memory, the node's
#: disk, or moving between two of them.
TIERS: Final[tuple[str, ...]] = ("gpu", "host", "disk", "moving")

#: Where a client's resident bytes come from.
MEMORY_SOURCES: Final[tuple[str, ...]] = ("shim", "nvml", "working_set")

WAITING_FOR: Final = Part("IWaitingFor", "What a waiter waits for besides its turn: another "
                                         "client to move memory out of the way.", (
    Key("client", "str", "The client id of who moves the memory.", always=True),
    Key("name", "str", "Its display name.", always=True),
    Key("bytes", "int", "How much it moves.", always=True),
    Key("action", "str", "What it does: `evict` or `checkpoint` (to host memory), `restore` "
                         "(back onto the GPU), `spill` (from host memory to disk: the node's "
                         "host budget cannot hold the evictions the waiter needs until it has).",
        always=True, values=("evict", "checkpoint", "restore", "spill")),
))

GPU: Final = Part("IGpuStatus", "One GPU as the daemon reports it.", (
    Key("index", "int", contract=True),
    Key("name", "str", contract=True),
    Key("uuid", "str", contract=True, nullable=True),
    Key("memory_total", "int", "bytes", contract=True, nullable=True),
    Key("memory_used", "int", "bytes", contract=True, nullable=True),
    Key("holders", "list[str]", "Client ids holding this GPU now (several only in mode off or "
                                "auto).", contract=True),
    Key("queue", "list[str]", "Client ids waiting for it, next first.", contract=True),
    Key("quantum_remaining", "number", "Seconds left in the current holder's quantum; null "
                                       "when nobody holds or no quantum runs.", contract=True,
        nullable=True),
    Key("tq", "number", "This GPU's time quantum, in seconds."),
    Key("policy", "str", "How the next holder is chosen: `round-robin` or `interactive` (absent "
                         "from older daemons)."),
    Key("next_reason", "str", "Why the first in the queue is next, in words; null when nobody "
                              "waits.", nullable=True),
    Key("turns", "number", "Seconds of a turn when holders side by side take turns; 0 or "
                           "absent: they do not."),
    Key("evict_blocked", "str", "Why nothing is granted on this GPU (a failed checkpoint); null "
                                "or absent when nothing is held back.", nullable=True,
        added_by="evictor"),
    Key("recent_holders", "list[IHeldSpan]", "The holds of the last minutes, oldest first (the "
                                             "panel's timeline; absent from older daemons)."),
    Key("resident_bytes", "int", "Bytes its clients have on it as the scheduler counts them: "
                                 "holders' needs, idle clients' `counted_bytes`.",
        added_by="memory"),
    Key("capacity", "int", "Bytes the scheduler plans with (`--gpu-memory` or NVML's total).",
        nullable=True, added_by="memory"),
    Key("host_bytes", "int", "Host memory held by its evicted clients (at most what the host "
                             "has).", added_by="memory"),
    Key("host_budget", "int", "Host memory evicted memory may take on this node: the node's "
                              "host budget where the daemon plans with one (the config's "
                              "`host_budget`, or where a client speaks `tiers`); otherwise "
                              "what it holds (its clients' `host_bytes`, or their "
                              "`shadow_bytes` where larger) plus the host's MemAvailable; at "
                              "most the host's MemTotal (a process's cgroup may allow less); "
                              "null where that cannot be read.",
        nullable=True, added_by="memory"),
    Key("pinned_bytes", "int", "Pinned host memory its clients keep (shadows, staging): part "
                               "of `host_bytes` the host's OS cannot page.", added_by="tiers"),
    Key("spill_bytes", "int", "Bytes its clients keep in spill files on the node's disk.",
        added_by="tiers"),
))

CLIENT: Final = Part("IClientStatus", "One scheduling client: a kernel registers under its "
                                      "Jupyter kernel id as `name`.", (
    Key("id", "str", contract=True),
    Key("name", "str", contract=True),
    Key("pid", "int", contract=True, nullable=True),
    Key("gpu", "int", contract=True),
    Key("pool", "str", contract=True),
    Key("priority", "str", contract=True, values=PRIORITIES),
    Key("state", "str", contract=True, values=CLIENT_STATES),
    Key("queue_position", "int", "1-based; null while not waiting.", contract=True,
        nullable=True),
    Key("working_set", "int", "bytes", contract=True),
    Key("gpu_seconds", "number", "Wall time it has held a GPU.", contract=True),
    Key("display_name", "str", "What people call it (a kernel's notebook path); falls back to "
                               "`name`.", nullable=True),
    Key("user", "str", "The user name of the client's process, when the daemon knows it.",
        nullable=True),
    Key("paused", "bool", "Holding, but paused while a holder beside it has its turn (mode "
                          "auto, taking turns)."),
    Key("kind", "str", "`kernel`, `shim` or `client`."),
    Key("evict", "str", "How its memory leaves the GPU: the shim's mapped (vmm) or managed "
                        "memory, or the driver's checkpoint.", values=EVICTORS),
    Key("namespace", "str", "The Kubernetes namespace verified for it; null when none (or "
                            "hidden from this viewer).", nullable=True),
    Key("labels", "object", "Its labels (a pod's name, a namespace); absent for a viewer who "
                            "may not see them, or when the document had to be cut."),
    Key("waiting_since", "number", "Seconds it has waited; null while not waiting.",
        nullable=True),
    Key("checkpoint_state", "str", "Checkpointed clients: running, checkpointing, "
                                   "checkpointed, restoring or failed.",
        added_by="evictor"),
    Key("checkpoint_error", "str", "Why its last checkpoint failed.", nullable=True,
        added_by="evictor"),
    Key("residency", "str", "Where its memory is: on the GPU, moving out, in host memory, "
                            "moving in.", values=RESIDENCIES, added_by="memory"),
    Key("resident_bytes", "int", "Bytes on the GPU now, on the best evidence: NVML's figure "
                                 "for its process where the daemon reads one, else its own "
                                 "report.", added_by="memory"),
    Key("counted_bytes", "int", "What of `resident_bytes` counts against others' room while it "
                                "is idle (0 once it could not evict and only its own report "
                                "says it holds them).", added_by="memory"),
    Key("evict_failed", "str", "Why it could not evict (or holds no GPU memory, by its "
                               "checkpoint); it is not asked again until its next grant. Null: "
                               "nothing failed.", nullable=True, added_by="memory"),
    Key("evictions_asked", "int", "Evictions of others asked so far for its grants.",
        added_by="memory"),
    Key("host_bytes", "int", "Bytes in host memory now (at most what the host has).",
        added_by="memory"),
    Key("shadow_bytes", "int", "Host memory it keeps for its evictions (the vmm evictor's "
                               "shadows, made ahead; they hold `host_bytes` while evicted).",
        added_by="memory"),
    Key("tier", "str", "The tier its memory is in: the GPU, host memory, the node's disk, or "
                       "moving between two.", values=TIERS, added_by="tiers"),
    Key("disk_bytes", "int", "Bytes in its spill files now.", added_by="tiers"),
    Key("pinned_bytes", "int", "Of `host_bytes` and `shadow_bytes`, the bytes that are pinned.",
        added_by="tiers"),
    Key("tier_failed", "str", "Why its last move between host memory and disk failed (a full "
                              "or failing disk: the memory stayed where it was). Null: nothing "
                              "failed.", nullable=True, added_by="tiers"),
    Key("memory_source", "str", "Where `resident_bytes` comes from: NVML wherever it vouches "
                                "for the process, else its reports.", values=MEMORY_SOURCES,
        added_by="memory"),
    Key("waiting_for", "IWaitingFor", "What it waits for besides its turn; null: nothing.",
        nullable=True, added_by="memory"),
    Key("pause_ignored", "int", "Pauses this `pausable` client was seen working through "
                                "(NVML's per-process samples); absent when none.",
        added_by="pause_watch"),
))

POOL_GPU: Final = Part("IPoolGpuStatus", "A pool on one GPU.", (
    Key("index", "int"),
    Key("share", "number", "Fraction of this GPU's time over the share window."),
    Key("entitlement", "number", "Null while the pool does not contend for this GPU.",
        nullable=True),
    Key("holding", "int"),
    Key("waiting", "int"),
    Key("stuck", "str", "Why the pool waits here, when it waits for a reason worth telling.",
        nullable=True),
    Key("below_guarantee", "bool"),
))

POOL: Final = Part("IPoolStatus", "A pool's share of GPU time against what it is promised "
                                  "(fractions of one GPU).", (
    Key("name", "str", contract=True),
    Key("guarantee", "number", contract=True),
    Key("weight", "number", contract=True),
    Key("maximum", "number", "-1 means no maximum.", contract=True),
    Key("share", "number", contract=True),
    Key("clients", "int", contract=True),
    Key("entitlement", "number", "Among the pools with a client holding or waiting, node-wide; "
                                 "null when not contending.", nullable=True),
    Key("waiting", "int", "How many of its clients wait."),
    Key("holding", "int", "How many of its clients hold a GPU."),
    Key("configured", "bool", "The config's `pools:` section names it."),
    Key("complete", "bool", "Guarantee, weight and maximum all configured."),
    Key("missing", "list[str]", "What its configuration leaves out."),
    Key("waiting_clients", "list[str]", "Names of the waiting clients, next first."),
    Key("stuck", "str", "Why the pool waits, when it waits for a reason worth telling.",
        nullable=True),
    Key("below_guarantee", "bool", "The daemon's verdict: the pool contends and gets less than "
                                   "its guarantee."),
    Key("gpus", "list[IPoolGpuStatus]", "The pool on each GPU."),
))

DOCUMENT: Final = Part("IStatusDocument", "`GET kiwi/api/status`: the status document plus "
                                          "whether the daemon answered.", (
    Key("reachable", "bool", contract=True, added_by="server"),
    Key("reason", "str", "Why the daemon could not be reached, when it could not.",
        added_by="server"),
    Key("socket", "str", "The socket the server talks to, for the unreachable message.",
        added_by="server"),
    Key("viewer", "str", "The user the server runs as: the panel names this user's own "
                         "clients without \"(user)\", as kiwictl does the user's who runs it.",
        added_by="server"),
    Key("version", "int", contract=True),
    Key("mode", "str", contract=True, values=MODES),
    Key("tq", "number", contract=True),
    Key("gpus", "list[IGpuStatus]", contract=True),
    Key("clients", "list[IClientStatus]", contract=True),
    Key("pools", "list[IPoolStatus]", contract=True),
    Key("policy", "str", "How the next holder is chosen on every GPU."),
    Key("configured_pools", "list[str]", "The names the config's `pools:` section gives, "
                                         "sorted; empty when it gives none."),
    Key("preemption", "bool", "Whether a request may cut a holder's quantum short."),
    Key("preemption_off_reason", "str", "Why preemption is off.", nullable=True),
    Key("labels_omitted", "bool", "The clients' labels were left out to keep the document "
                                  "within what a client reads.", added_by="status_line"),
    Key("etag", "str", "Long-poll answers only: the document's tag, to name in the next "
                       "`?after=`.", added_by="server"),
    Key("pushed", "bool", "Long-poll answers only: true when the server hears the daemon's "
                          "changes, so asking again at once waits for the next one; false "
                          "when it does not (poll at the refresh rate).", added_by="server"),
), partial=True)

#: Every part, the document last: the order the generated TypeScript declares them in.
PARTS: Final[tuple[Part, ...]] = (HELD_SPAN, WAITING_FOR, GPU, CLIENT, POOL_GPU, POOL,
                                  DOCUMENT)


def part(interface: str) -> Part:
    for each in PARTS:
        if each.interface == interface:
            return each
    raise KeyError(interface)
