"""How a holder's GPU memory leaves the GPU when the next holder needs the room.

Two evictors, chosen per process when it registers:

* ``managed``: the shim in the process made its allocations managed memory and pages them
  to host itself when told to drop (the daemon only says ``evict``);
* ``checkpoint``: the daemon, another process, suspends the process with the driver's
  checkpoint API (lock, checkpoint; restore, unlock on its next grant), so device memory stays
  device memory and even a process that ignores a drop gives the GPU up.

``checkpoint`` holds the ctypes binding of the API, ``policy`` who may be checkpointed, and
``evictor`` the part of the daemon that carries checkpoints out between the scheduler's actions
(with ``lines``, each GPU's order of actions and jobs, ``runner``, which runs the jobs, and
``jobs``, their blocking part).
"""

from __future__ import annotations

from typing import Final

MANAGED: Final = "managed"
CHECKPOINT: Final = "checkpoint"
EVICTORS: Final = (MANAGED, CHECKPOINT)
