"""Mode auto's room: which working sets fit side by side in one GPU's memory.

Pure functions of a GPU's holders and the clients asked about; the core decides what to do with
the answers (grant beside, drop with ``evict``, ask an overgrown holder's neighbours to leave).
A client whose working set is unknown, or a GPU whose capacity is unknown, needs the whole GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodeside.scheduler.state import Client, GpuState, HoldState


def fits_together(gpu: GpuState, clients: list[Client], reserve: int) -> bool:
    """Do these clients' working sets fit on ``gpu`` at once, ``reserve`` bytes kept free?"""
    capacity = gpu.spec.memory_total
    if capacity is None:
        return len(clients) <= 1
    # A plain loop, not any() and sum() over generators: asked on every handoff.
    need = 0
    for client in clients:
        if client.working_set is None:
            return len(clients) <= 1
        need += client.working_set
    return need <= capacity - reserve


def fits_beside(gpu: GpuState, newcomers: list[Client], reserve: int) -> bool:
    """Would ``newcomers`` fit beside the current holders?"""
    return fits_together(gpu, [*gpu.holders.values(), *newcomers], reserve)


def leaving(gpu: GpuState) -> list[Client]:
    """Holders already asked to drop: their room is on its way back."""
    return [h for h in gpu.holders.values() if h.hold_state is HoldState.DROPPING]


def staying(gpu: GpuState) -> list[Client]:
    return [h for h in gpu.holders.values() if h.hold_state is HoldState.HOLDING]


def room_after(gpu: GpuState, claimant: Client, gone: Iterable[Client], *, serial: bool,
               reserve: int) -> bool:
    """Would ``claimant`` be granted once ``gone`` have left? ``serial``: mode on."""
    gone = list(gone)
    rest = [h for h in gpu.holders.values() if h not in gone]
    if serial:
        return not rest
    return fits_together(gpu, [*rest, claimant], reserve)


def evict_needed(gpu: GpuState, leaver: Client, incoming: Client | None, reserve: int) -> bool:
    """Must ``leaver`` move its memory out? Only when ``incoming`` needs the room."""
    if incoming is None:
        return False
    rest = [h for h in gpu.holders.values() if h is not leaver and h is not incoming]
    return not fits_together(gpu, [*rest, incoming, leaver], reserve)


def overcommitted(gpu: GpuState, keep: Client, reserve: int) -> list[Client]:
    """Holders to ask to leave, longest-running first, until the rest fits beside ``keep``.

    Happens when a holder's working set grows (side by side was granted on the sizes reported
    then) and when the mode turns auto while several hold.
    """
    going: list[Client] = []
    for holder in gpu.holders.values():
        rest = [h for h in staying(gpu) if h not in going]
        if fits_together(gpu, rest, reserve):
            break
        if holder is keep or holder.hold_state is not HoldState.HOLDING:
            continue
        going.append(holder)
    return going
