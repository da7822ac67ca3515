"""The GPU's room: which working sets fit side by side in one GPU's memory, and who must evict.

``Room`` is the component the rules consult (turns.py for grants, preemption, quanta and drops,
queries.py for deadlines): it answers with the node's mode and each GPU's ledger (ledger.py,
which holds the one fit function and the idle memory clients' bytes), and the rules decide what
to do with the answers (grant beside, drop with ``evict``, ask an overgrown holder's neighbours
to leave). A client whose working set is unknown, or a GPU whose capacity is unknown, needs the
whole GPU.

The holders' working sets are counted here; for clients that speak the ``memory`` feature the
idle clients' resident memory counts too (the ledger books it, and a grant that does not fit
beside it asks idle clients to evict first, ``Residency.make_room``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

from nodeside.scheduler.gpu_state import ClientRecord, GpuState, HoldState
from nodeside.scheduler.node import NodeState


def leaving(gpu: GpuState) -> list[ClientRecord]:
    """Holders already asked to drop: their room is on its way back."""
    return [h for h in gpu.holders.values() if h.hold_state is HoldState.DROPPING]


def staying(gpu: GpuState) -> list[ClientRecord]:
    return [h for h in gpu.holders.values() if h.hold_state is HoldState.HOLDING]


@final
class Room:
    """What fits where on the node, in its mode: each GPU's ledger answers."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    def fits_beside(self, gpu: GpuState, newcomers: list[ClientRecord]) -> bool:
        """Would ``newcomers`` fit beside ``gpu``'s holders?"""
        return gpu.ledger.fits([*gpu.holders.values(), *newcomers])

    def room_after(self, gpu: GpuState, claimant: ClientRecord,
                   gone: Iterable[ClientRecord]) -> bool:
        """Would ``claimant`` be granted once ``gone`` have left? (In mode on, only once
        nobody holds.)"""
        gone = list(gone)
        rest = [h for h in gpu.holders.values() if h not in gone]
        if self.state.mode == "on":
            return not rest
        return gpu.ledger.fits([*rest, claimant])

    def evict_needed(self, gpu: GpuState, leaver: ClientRecord,
                     incoming: ClientRecord | None) -> bool:
        """Must ``leaver`` move its memory out? Only when ``incoming`` needs the room."""
        if incoming is None:
            return False
        # One list, appended to: asked on every release.
        together = [h for h in gpu.holders.values() if h is not leaver and h is not incoming]
        together.append(incoming)
        together.append(leaver)
        ledger = gpu.ledger
        # The idle clients' memory takes room too (none booked unless some speak the feature).
        beside = ledger.idle_except(incoming, leaver) if ledger.idle_total else 0
        return not ledger.fits(together, beside)

    def overcommitted(self, gpu: GpuState, keep: ClientRecord) -> list[ClientRecord]:
        """Holders to ask to leave, longest-running first, until the rest fits beside ``keep``.

        Happens when a holder's working set grows (side by side was granted on the sizes
        reported then) and when the mode turns auto while several hold.
        """
        going: list[ClientRecord] = []
        for holder in gpu.holders.values():
            rest = [h for h in staying(gpu) if h not in going]
            if gpu.ledger.fits(rest):
                break
            if holder is keep or holder.hold_state is not HoldState.HOLDING:
                continue
            going.append(holder)
        return going
