"""Who the daemon may checkpoint: a process it can act on, through a driver that can.

The driver lets a process act on another only with the rights ptrace would need: the same user,
or root / CAP_SYS_PTRACE. The pid must also mean the same process to the daemon as to the
kernel, which holds only when the daemon sees it in its own PID namespace (on Kubernetes: the
node daemon with ``hostPID``). A process that fails any of these is paged the ``managed`` way.
"""

from __future__ import annotations

import os

from nodeside.evict import CHECKPOINT, EVICTORS, MANAGED

_CAP_SYS_PTRACE = 19


def choose(requested: str | None, pid: int | None, uid: int | None,
           api_missing: str | None) -> tuple[str, str | None]:
    """The evictor for a process that asked for ``requested`` (None: it did not say, which is
    an old client: managed). Returns (evictor, why checkpoint was refused or None)."""
    if requested not in EVICTORS or requested == MANAGED:
        return MANAGED, None
    why = api_missing or cannot_act_on(pid, uid)
    return (MANAGED, why) if why else (CHECKPOINT, None)


def cannot_act_on(pid: int | None, uid: int | None) -> str | None:
    """Why this daemon cannot checkpoint process ``pid`` of user ``uid``; None when it can."""
    if pid is None or pid <= 0:
        return "the kernel did not give the process's pid (peer credentials)"
    if not os.path.exists(f"/proc/{pid}"):
        return f"pid {pid} is not visible in the daemon's PID namespace (hostPID is off?)"
    me = os.geteuid()
    if me != 0 and uid != me and not _has_cap_sys_ptrace():
        return (f"the process belongs to uid {uid} and the daemon runs as uid {me} without "
                "CAP_SYS_PTRACE")
    return None


def _has_cap_sys_ptrace() -> bool:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        pass
    return False
