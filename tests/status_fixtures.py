"""Status documents for the tests of what shows them, made by the daemon's own ``build_status``
from a real scheduler, not written by hand: a fixture cannot drift from the document.

``sample_status()`` is one GPU with a holder and two waiters in two pools, the shape most views
need. The panel's specs (TypeScript) start from the same document, in
``labextension/test/status.generated.ts`` (typed by the generated ``IStatusDocument``, so tsc
checks it too), written by ``python tests/status_fixtures.py``; a test fails while that file
differs from what ``build_status`` makes now.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nodeside.config import from_mapping
from nodeside.model import Registration
from nodeside.scheduler.core import GpuSpec, Scheduler
from nodeside.scheduler.status import build_status

PANEL_FIXTURE = Path(__file__).resolve().parents[1] / "labextension/test/status.generated.ts"
GiB = 2**30

#: The panel's sample: two kernels, which register under their Jupyter kernel ids (the panel
#: finds its own kernel by it), and a worker.
PANEL_NAMES = ("3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", "8c0d4b2a-6e1f-4a3b-8c9d-0e1f2a3b4c5d",
               "worker-7")


def sample_status(names: tuple[str, str, str] = ("kernel-a", "kernel-b", "kernel-<c>"),
                  now: float = 18.5) -> dict[str, Any]:
    """At ``now``, on GPU 0 (an A100 of 80 GiB), clients c1, c2 and c3 named ``names``: c1
    (pool default, NORMAL, a working set of 3 GiB) has held the GPU since 1.0 (17.5 s of GPU
    time, 12.5 s left of its quantum of 30 s); c2 (training, LOW) asked at 2.0 and c3 (default,
    HIGH, which held the GPU from 0.0 to 1.0) at 3.0: positions 1 and 2."""
    holder_name, waiter_name, worker_name = names
    config = from_mapping({"tq": 30.0, "pools": {
        "default": {"guarantee": 0.5, "weight": 1, "maximum": -1},
        "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7}}})
    scheduler = Scheduler(config, [GpuSpec(0, name="A100", memory_total=80 * GiB)], 0.0)
    holder = scheduler.register(0.0, Registration(name=holder_name, pid=101, pool="default",
                                                  priority="NORMAL", kind="kernel"))
    waiter = scheduler.register(0.0, Registration(name=waiter_name, pid=102, pool="training",
                                                  priority="LOW",
                                                  kind="kernel"))
    worker = scheduler.register(0.0, Registration(name=worker_name, pid=103, pool="default",
                                                  priority="HIGH"))
    scheduler.report_working_set(0.0, holder.id, 3 * GiB)
    scheduler.acquire(0.0, worker.id)
    scheduler.release(1.0, worker.id)
    scheduler.acquire(1.0, holder.id)
    scheduler.acquire(2.0, waiter.id)
    scheduler.acquire(3.0, worker.id)
    return build_status(scheduler, now)


#: The memory sample's four notebooks, as the panel's fixture names their kernels.
MEMORY_PANEL_NAMES = ("0a1b2c3d-0000-4e55-9a61-5d2f7c8e9a01",
                      "1b2c3d4e-1111-4a3b-8c9d-0e1f2a3b4c5d",
                      "2c3d4e5f-2222-4b4c-9d0e-1f2a3b4c5d6e",
                      "3d4e5f60-3333-4c5d-8e0f-2a3b4c5d6e7f")

#: Where each of the memory sample's clients has its memory: residency, bytes on the GPU, bytes
#: in host RAM, and where the figures come from.
MEMORY = {
    "c1": ("evicting", 10 * GiB, 14 * GiB, "shim"),
    "c2": ("resident", 40 * GiB, 0, "nvml"),
    "c3": ("resident", 0, 0, "working_set"),
    "c4": ("evicted", 0, 20 * GiB, "shim"),
}
HOST_BUDGET = 64 * GiB


def memory_status(names: tuple[str, str, str, str] = ("kernel-a", "kernel-b", "kernel-c",
                                                      "kernel-d"),
                  now: float = 4.0) -> dict[str, Any]:
    """Four notebooks, nbA.ipynb to nbD.ipynb (clients c1 to c4), on GPU 0 (an A100 of 80 GiB)
    at ``now``: nbA held it from 0.0 to 1.0 and is moving its 24 GiB out (10 GiB still on the
    GPU, 14 GiB in host RAM); nbB has held it since 1.0 with 40 GiB resident; nbC (a working
    set of 40 GiB) asked at 2.0 and waits, first, for nbA's 24 GiB to move to host memory; nbD
    is idle with its 20 GiB in host RAM. 50 GiB are resident of 80 GiB, and evicted memory
    takes 34 GiB of a host budget of 64 GiB.

    The scheduler keeps no resident memory yet (issue 31 is being built beside this): its
    document is the daemon's, and the memory keys are laid on it from ``MEMORY`` as
    ``build_status`` lays them from a memory-keeping scheduler's records (names fixed in
    docs/protocol.md), the GPU's totals summed from the clients'."""
    config = from_mapping({"tq": 30.0})
    scheduler = Scheduler(config, [GpuSpec(0, name="A100", memory_total=80 * GiB)], 0.0)
    a, b, c, d = (scheduler.register(0.0, Registration(name=name, pid=201 + i, kind="kernel",
                                                       display_name=f"nb{'ABCD'[i]}.ipynb"))
                  for i, name in enumerate(names))
    scheduler.report_working_set(0.0, a.id, 24 * GiB)
    scheduler.report_working_set(0.0, b.id, 40 * GiB)
    scheduler.report_working_set(0.0, c.id, 40 * GiB)
    scheduler.report_working_set(0.0, d.id, 20 * GiB)
    scheduler.acquire(0.0, a.id)
    scheduler.release(1.0, a.id)
    scheduler.acquire(1.0, b.id)
    scheduler.acquire(2.0, c.id)
    document = build_status(scheduler, now, host_budget=HOST_BUDGET)
    for client in document["clients"]:
        residency, resident, host, source = MEMORY[client["id"]]
        client.update({"residency": residency, "resident_bytes": resident, "host_bytes": host,
                       "memory_source": source, "waiting_for": None})
    document["clients"][2]["waiting_for"] = {"client": a.id, "name": "nbA.ipynb",
                                             "bytes": 24 * GiB, "action": "evict"}
    for gpu in document["gpus"]:
        on_it = [c for c in document["clients"] if c["gpu"] == gpu["index"]]
        gpu.update({"resident_bytes": sum(c["resident_bytes"] for c in on_it),
                    "capacity": gpu["memory_total"],
                    "host_bytes": sum(c["host_bytes"] for c in on_it),
                    "host_budget": HOST_BUDGET})
    return document


#: Each client's tier keys in ``tiered_status`` (feature ``tiers``, issue 42).
TIERS = {
    "c1": {"tier": "moving", "disk_bytes": 0, "pinned_bytes": 14 * GiB},
    "c2": {"tier": "gpu", "disk_bytes": 0, "pinned_bytes": 0},
    "c3": {"tier": "gpu", "disk_bytes": 0, "pinned_bytes": 0},
    "c4": {"tier": "disk", "disk_bytes": 20 * GiB, "host_bytes": 0, "pinned_bytes": 0},
}


def tiered_status(names: tuple[str, str, str, str] = ("kernel-a", "kernel-b", "kernel-c",
                                                      "kernel-d"),
                  **c3: Any) -> dict[str, Any]:
    """``memory_status`` from a daemon with tiers (its keys laid on as for the memory keys):
    nbA moving (14 GiB pinned), nbD spilled its 20 GiB to disk, nbC as ``c3`` says (on the
    GPU otherwise); the GPU's 14 GiB in host memory all pinned, 20 GiB on disk."""
    document = memory_status(names)
    for client in document["clients"]:
        tiers = {**TIERS[client["id"]], **(c3 if client["id"] == "c3" else {})}
        client.update({"tier_failed": None, **tiers})
    for gpu in document["gpus"]:
        gpu.update({"host_bytes": 14 * GiB, "pinned_bytes": 14 * GiB, "spill_bytes": 20 * GiB})
    return document


def panel_fixture() -> str:
    """What ``labextension/test/status.generated.ts`` must read: the sample as the server
    extension serves it (``reachable`` added)."""
    document = json.dumps({"reachable": True, **sample_status(PANEL_NAMES)}, indent=2)
    memory = json.dumps({"reachable": True, **memory_status(MEMORY_PANEL_NAMES)}, indent=2)
    head = ("/**\n"
            " * The status document the daemon's build_status makes of tests/status_fixtures.py's\n"
            " * sample, as the server serves it. Generated by `python tests/status_fixtures.py`:\n"
            " * never edit it (a test fails while it differs from what build_status makes).\n"
            " */\n"
            "import { IStatusDocument } from '../src/tokens';\n\n")
    return (head + f"export const SAMPLE_STATUS: IStatusDocument = {document};\n\n"
            "/** tests/status_fixtures.py's memory sample: four notebooks, one waiting for "
            "another's memory to move out. */\n"
            f"export const MEMORY_STATUS: IStatusDocument = {memory};\n")


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        sys.exit(0 if PANEL_FIXTURE.read_text() == panel_fixture() else 1)
    PANEL_FIXTURE.write_text(panel_fixture())
    print(f"wrote {PANEL_FIXTURE}")
