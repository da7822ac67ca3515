"""Host memory: is there room for a client's working set before the daemon asks it to evict?

An eviction moves a process's GPU memory into host memory, and the kernel charges those pages
to the process's own memory cgroup (the notebook pod's limit, under Kubernetes). Asking a
process to evict more than its cgroup, or the host, has room for gets it OOM-killed, which is
worse for its user than waiting. So before the daemon asks for an eviction it reads the room
left, in the process's cgroup (v2: ``memory.max`` less ``memory.current``) and on the host
(``MemAvailable``), and says so when the working set does not fit.

Plain file reads, no I/O loop: called from the daemon's shell, never from the scheduler core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodeside.formats import size

PROC = Path("/proc")
MEMINFO = PROC / "meminfo"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class HostRoom:
    """The bytes an eviction may still put in host memory, and what bounds them."""

    available: int
    bound: str  # "host" or "cgroup <path>"


def host_available(proc: Path = PROC) -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    return _meminfo("MemAvailable:", proc / "meminfo")


def host_total(proc: Path = PROC) -> int | None:
    """MemTotal from /proc/meminfo, in bytes: more than this, no client has in host memory,
    whatever it says. None where it cannot be read."""
    return _meminfo("MemTotal:", proc / "meminfo")


def _meminfo(key: str, meminfo: Path) -> int | None:
    return _meminfo_figures(meminfo, (key,))[0]


def _meminfo_figures(meminfo: Path, keys: tuple[str, ...]) -> list[int | None]:
    """The figures of ``keys`` ("MemAvailable:") in bytes, read at once; None for each that
    cannot be read."""
    found: dict[str, int] = {}
    try:
        text = meminfo.read_text()
    except OSError:
        return [None] * len(keys)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in keys and fields[1].isdigit():
            found[fields[0]] = int(fields[1]) * 1024
    return [found.get(key) for key in keys]


def cgroup_of(pid: int, proc: Path = PROC) -> str | None:
    """The cgroup v2 path of a process ("0::/kubepods/..."), or None (v1, gone, unreadable)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _read_bytes(path: Path) -> int | None:
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None  # "max": no limit


def cgroup_available(cgroup: str, root: Path = CGROUP_ROOT) -> int | None:
    """The room left under the tightest memory.max from the cgroup up to the root; None when
    no level sets one."""
    tightest: int | None = None
    directory = root / cgroup.lstrip("/")
    while True:
        limit = _read_bytes(directory / "memory.max")
        used = _read_bytes(directory / "memory.current")
        if limit is not None and used is not None:
            left = max(limit - used, 0)
            tightest = left if tightest is None else min(tightest, left)
        if directory == root or root not in directory.parents:
            return tightest
        directory = directory.parent


def room_for(pid: int | None, *, proc: Path = PROC, root: Path = CGROUP_ROOT) -> HostRoom | None:
    """The room an eviction by process pid has in host memory; None where nothing is known."""
    host = host_available(proc)
    cgroup = cgroup_of(pid, proc) if pid else None
    in_cgroup = cgroup_available(cgroup, root) if cgroup else None
    if in_cgroup is not None and (host is None or in_cgroup < host):
        return HostRoom(in_cgroup, f"cgroup {cgroup}")
    if host is not None:
        return HostRoom(host, "host")
    return None


def eviction_shortfall(evictable: int | None, room: HostRoom | None) -> str | None:
    """Why an eviction of evictable bytes does not fit in room, or None when it does (or when
    either is unknown: the daemon does not refuse on a guess)."""
    if not evictable or room is None or evictable <= room.available:
        return None
    return (f"no room in host memory for an eviction of {size(evictable)}: "
            f"{size(room.available)} left in the {room.bound}")


def evictions_budget(held: int, proc: Path = PROC) -> int | None:
    """The host memory evicted GPU memory may take on this node: what it holds already
    (``held``) plus what the host has available; None where the host's figure cannot be read.
    (Each process's cgroup may allow less: ``room_for`` says so per eviction.)"""
    available = host_available(proc)
    return None if available is None else held + available


#: What the default host budget leaves the host: the larger of a floor and a share of its
#: memory (the OS, the kernels' own pageable memory, the page cache the spill files go through).
MARGIN_FLOOR = 4 << 30
MARGIN_SHARE = 0.1


def host_free(meminfo: Path = MEMINFO) -> int | None:
    """What the host has for the node's host budget beyond what Kiwi's clients take already
    (feature ``tiers``; the core adds their counted use): MemAvailable less a margin, negative
    where the host is short of the margin (Kiwi's clients then give memory back); None where
    the host's figures cannot be read. Read again and again: the host's other tenants come and
    go."""
    available, total = _meminfo_figures(meminfo, ("MemAvailable:", "MemTotal:"))
    if available is None or total is None:
        return None
    return available - max(MARGIN_FLOOR, int(total * MARGIN_SHARE))
