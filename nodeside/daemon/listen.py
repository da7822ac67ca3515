"""The daemon's socket: one daemon per path, reachable by its owner (and group) only."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path

from nodeside.config import SchedulerConfig
from nodeside.daemon.peer import resolve_group
from nodeside.errors import DaemonError

#: The longest Unix socket path (sun_path is 108 bytes on Linux, 104 on the BSDs).
MAX_PATH_BYTES = 103


async def listen(loop: asyncio.AbstractEventLoop, path: Path, config: SchedulerConfig,
                 protocol: Callable[[], asyncio.Protocol]) -> asyncio.AbstractServer:
    """Listen on ``path``, with ``config``'s mode, group and backlog.

    A socket file left by a daemon that died is replaced; one that a live daemon answers on is
    an error, so that a second daemon never steals the first one's clients.
    """
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise DaemonError(f"socket path is too long for a Unix socket: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if answers(path):
            raise DaemonError(f"another kiwi-scheduler is already listening on {path}")
        path.unlink()
    socket_gid = resolve_group(config.socket_group)
    # Bind under a tight umask so the socket is never reachable by others, not even for the
    # moment between bind and chmod.
    old_umask = os.umask(0o177)
    try:
        server = await loop.create_unix_server(protocol, path=str(path),
                                               backlog=config.connections.backlog)
    finally:
        os.umask(old_umask)
    # The group first, then the mode: widened before the group is the right one, the socket
    # would be open for a moment to the daemon's own group.
    if socket_gid is not None:
        os.chown(path, -1, socket_gid)
    os.chmod(path, config.socket_mode)
    return server


def answers(path: str | os.PathLike[str], timeout: float = 1.0) -> bool:
    """Does anything accept a connection on the Unix socket at ``path``?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
        return True
