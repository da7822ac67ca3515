"""How a holder's GPU memory leaves the GPU when the next holder needs the room.

Two evictors, chosen per process when it registers:

* ``managed``: the shim in the process made its allocations managed memory and pages them
  to host itself when told to drop (the daemon only says ``evict``);
* ``checkpoint``: the daemon, another process, suspends the process with the driver's
  checkpoint API (lock, checkpoint; restore, unlock on its next grant), so device memory stays
  device memory and even a process that ignores a drop gives the GPU up.

``checkpoint`` holds the ctypes binding of the API and ``policy`` who may be checkpointed.
``lines`` is the sans-I/O part beside the scheduler's core: each GPU's order of actions and of
the ``Checkpoint`` and ``Restore`` jobs they wait for, taking the jobs' results as events.
``evictor`` is its shell (it runs each job's blocking part, ``jobs``, on a worker thread and
feeds the result back).
"""

from __future__ import annotations

from typing import Final

MANAGED: Final = "managed"
CHECKPOINT: Final = "checkpoint"
#: Feature ``memory``: the shim pages its own memory (``cuMem*`` mappings), which the checkpoint
#: API can also suspend (it has no managed memory).
VMM: Final = "vmm"
EVICTORS: Final = (MANAGED, CHECKPOINT)
