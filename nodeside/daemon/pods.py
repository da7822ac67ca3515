"""Which Kubernetes pod a peer process runs in, read from the kernel's cgroup file for its pid.

The pid comes from the socket (``SO_PEERCRED``), and the kubelet puts every container of a pod
in a cgroup whose path names the pod's UID: a process cannot move itself out of it. So the pod
found here is one the client cannot choose, unlike a label or an environment variable it sends.

The forms, as the kubelet writes them (both cgroup v1, one line per hierarchy, and v2, one
``0::`` line):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``
  with the UID's dashes turned into underscores (Guaranteed pods: ``kubepods-pod<uid>.slice``);
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container>``
  (Guaranteed: ``/kubepods/pod<uid>/<container>``).

A daemon in its own cgroup namespace sees paths relative to its own cgroup
(``/../../kubepods-…``); the pod's segment is still there. A pid the daemon cannot see (0,
None, a process in another PID namespace, or one gone already) has no pod.
"""

from __future__ import annotations

import re
from pathlib import Path

from nodeside.daemon.hostmem import PROC

#: Bytes of a cgroup file read at most: a real one is a few hundred bytes, even with 13 v1 lines.
_MAX_CGROUP_BYTES = 64 * 1024

_HEX = "[0-9a-f]"
# A pod UID (a UUID; dashes as underscores under the systemd driver), or the 32 hex digits of a
# static pod's config hash, which the kubelet uses as the UID of pods it reads from files.
_UID = f"{_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}}|{_HEX}{{32}}"
# ``pod<uid>`` as a whole path segment (cgroupfs) or as the tail of a ``kubepods-…`` slice name
# (systemd).
_POD_SEGMENT = re.compile(rf"(?:^|/|kubepods(?:-besteffort|-burstable)?-)pod({_UID})"
                          rf"(?:\.slice)?(?=/|$)")


def pod_uid_in(cgroup_text: str) -> str | None:
    """The pod UID that a ``/proc/<pid>/cgroup`` text names, with dashes; None if none or unclear.

    Every hierarchy must agree: lines that name two different pods give None, since which
    one holds the process cannot then be told.
    """
    found: set[str] = set()
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        uid = _uid_in_path(parts[2])
        if uid is not None:
            found.add(uid)
    return found.pop() if len(found) == 1 else None


def _uid_in_path(path: str) -> str | None:
    # The innermost pod segment counts: a pod's cgroup is never inside another pod's.
    matches = list(_POD_SEGMENT.finditer(path.strip().lower()))
    if not matches:
        return None
    return matches[-1].group(1).replace("_", "-")


def pod_uid_of(pid: int | None, proc_root: str | Path = PROC) -> str | None:
    """The UID of the pod that process ``pid`` runs in, as ``proc_root`` shows it; None if none."""
    if pid is None or pid <= 0:
        return None
    try:
        with open(Path(proc_root) / str(pid) / "cgroup", "rb") as cgroup:
            raw = cgroup.read(_MAX_CGROUP_BYTES)
    except OSError:  # gone, another PID namespace, or no /proc: no pod, never an error
        return None
    return pod_uid_in(raw.decode("utf-8", "replace"))
