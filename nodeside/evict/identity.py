"""Which process a pid names: bound when a peer connects, checked before the daemon acts on it.

A pid is only a number: a client's process may exit while its parent keeps the socket, and the
kernel may give the pid to another user's process. So the daemon keeps, with the pid the socket
gave (``SO_PEERCRED``), the process's start time (clock ticks after boot, field 22 of
``/proc/<pid>/stat``, which no later process with the same pid can share) and its effective uid,
read the moment the peer connects. Before every call that suspends or resumes a process the
checkpoint evictor reads both again (``mismatch``): a pid that now names another process, or a
process of another uid than the peer that registered, is never touched.

The check and the driver's call are two steps, but the window between them is microseconds,
and a pid comes round again only after the kernel has handed out every other one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    #: Clock ticks after boot when the process started.
    start_time: int
    #: Its effective uid when it connected (the socket's credentials say the same).
    uid: int

    def mismatch(self, proc: Path = PROC) -> str | None:
        """Why ``pid`` no longer names this process (gone, another process, another uid), or
        None when it still does."""
        now = read_identity(self.pid, proc)
        if now is None:
            return f"pid {self.pid} has exited"
        if now.start_time != self.start_time:
            return (f"pid {self.pid} is now another process (started at tick {now.start_time}, "
                    f"not {self.start_time})")
        if now.uid != self.uid:
            return f"pid {self.pid} now runs as uid {now.uid}, not uid {self.uid}"
        return None


def read_identity(pid: int | None, proc: Path = PROC) -> ProcessIdentity | None:
    """The identity of process ``pid`` now, or None when it cannot be read (gone, or not
    visible in this PID namespace)."""
    if pid is None or pid <= 0:
        return None
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses itself:
    # the fields that follow start after the last ")".
    fields = stat[stat.rfind(b")") + 2:].split()
    uid = next((line.split()[2] for line in status.splitlines() if line.startswith("Uid:")),
               None)
    try:
        return ProcessIdentity(pid, int(fields[19]), int(uid) if uid is not None else -1)
    except (IndexError, ValueError):
        return None
