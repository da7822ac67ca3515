"""Who is on the other end of a connection, read from the kernel, never from the peer's words."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from nodeside.evict.identity import ProcessIdentity, read_identity

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    pid: int | None
    uid: int | None
    gid: int | None
    fd: int
    #: The process behind ``pid`` as it was when the peer connected (its start time and uid),
    #: so that the pid, once reused, is never taken for it; None when it could not be read
    #: (gone already, or outside the daemon's PID namespace).
    identity: ProcessIdentity | None = None

    @classmethod
    def of(cls, sock: socket.socket) -> Peer:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            pid, uid, gid = _UCRED.unpack(raw)
        except (OSError, AttributeError):
            pid = uid = gid = None
        identity = read_identity(pid)
        if identity is not None and identity.uid != uid:
            identity = None  # not the process that connected, or it changed its uid since
        return cls(pid, uid, gid, sock.fileno(), identity)


def resolve_group(name_or_gid: str | None) -> int | None:
    if name_or_gid is None:
        return None
    if name_or_gid.isdigit():
        return int(name_or_gid)
    try:
        return grp.getgrnam(name_or_gid).gr_gid
    except KeyError:
        raise ValueError(f"no such group: {name_or_gid}") from None


def is_admin(peer: Peer, admin_gid: int | None) -> bool:
    """Root, the daemon's own user, and members of the admin group may change mode and TQ."""
    if peer.uid is None:
        return False
    if peer.uid in (0, os.getuid()):
        return True
    if admin_gid is None:
        return False
    return peer.gid == admin_gid or admin_gid in groups_of(peer)


def groups_of(peer: Peer) -> set[int]:
    """The peer's groups: its primary group and its supplementary ones."""
    # The process's own supplementary groups, as the kernel has them; the group database is
    # the fallback when /proc is not ours to read.
    if peer.pid is not None:
        try:
            with open(f"/proc/{peer.pid}/status") as status:
                for line in status:
                    if line.startswith("Groups:"):
                        found = {int(g) for g in line.split()[1:]}
                        return found if peer.gid is None else found | {peer.gid}
        except OSError:
            pass
    try:
        user = pwd.getpwuid(peer.uid or 0).pw_name
    except KeyError:
        return set()
    return {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}


def user_name(uid: int | None) -> str | None:
    """The user name of ``uid`` (for people reading the status), or None when unknown."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
