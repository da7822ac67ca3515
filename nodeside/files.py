"""Reading a file the daemon trusts: the config and the state file.

The daemon usually runs as root (or as its own user in a pod), so a file it reads at start can
put values into every scheduling decision. Before a word of it counts, the file must be a
regular file owned by root or by the daemon's own user and writable by nobody else; a file
another user planted, one that is world-writable, a FIFO or a device is refused with one line
saying why. Checked on the opened descriptor (``fstat``), so a rename or a symlink swapped
between the check and the read changes nothing.

A refused or unreadable file is never quoted: a config symlinked to ``/etc/shadow`` must not
put a line of it in the log. Nothing here keeps a file open or reads more than ``max_bytes``.
"""

from __future__ import annotations

import os
import stat


class FileRefused(Exception):
    """The file cannot be trusted or read; the message says why, never what it holds."""


def read_trusted_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """The UTF-8 text of ``path`` when the daemon may trust it, else FileRefused saying why.

    FileNotFoundError passes through (a missing file is a caller's own case)."""
    try:
        # O_NONBLOCK: a FIFO in place of the file must not hang the daemon on open.
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FileRefused(f"cannot open it: {exc.strerror}") from None
    try:
        refused = untrusted(os.fstat(fd))
        if refused is not None:
            raise FileRefused(refused)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileRefused(f"cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise FileRefused(f"it is larger than {max_bytes} bytes")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"it is not UTF-8 text (byte {exc.start})") from None


def untrusted(st: os.stat_result) -> str | None:
    """Why a file with this status may not be trusted, or None when it may."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return (f"it is owned by uid {st.st_uid}, not by root or the daemon's user "
                f"(uid {me})")
    if st.st_mode & stat.S_IWOTH:
        return "it is writable by every user (chmod o-w)"
    if st.st_mode & stat.S_IWGRP and st.st_gid not in (0, os.getegid()):
        return (f"it is writable by group {st.st_gid}, not root's or the daemon's own "
                "(chmod g-w)")
    return None
