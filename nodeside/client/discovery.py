"""Where the scheduler listens: the node's socket, or the one a Jupyter server published.

On a node the daemon listens at ``DEFAULT_SOCKET``. On a laptop there is none, and the Jupyter
server starts a private scheduler of its own at a temporary path (``kiwi_jupyter.server.
embedded``). That path is published for the user as a symlink at one fixed place,
``published_socket_path()``, so that ``kiwictl`` in a terminal finds it with no flag, and
removed when the server stops.

The order a caller that was given no path looks in: ``$KIWI_SOCKET`` (when set it is the only
place), then ``DEFAULT_SOCKET``, then the published link. When nothing answers, ``not_found``
says where it looked and how to point elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from nodeside.protocol import DEFAULT_SOCKET

SOCKET_ENV = "KIWI_SOCKET"


def published_socket_path() -> Path:
    """Where a user's private scheduler publishes its socket: ``$XDG_RUNTIME_DIR/kiwi/``
    (per user, cleared at logout), else Jupyter's runtime directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "kiwi" / "scheduler.sock"
    jupyter = os.environ.get("JUPYTER_RUNTIME_DIR") or \
        os.path.join(os.path.expanduser("~"), ".local", "share", "jupyter", "runtime")
    return Path(jupyter) / "kiwi" / "scheduler.sock"


def candidates(explicit: str | None = None) -> list[str]:
    """The socket paths to try, in order: the one given, else ``$KIWI_SOCKET``, else the node's
    default followed by the published link."""
    chosen = explicit or os.environ.get(SOCKET_ENV)
    if chosen:
        return [chosen]
    return [DEFAULT_SOCKET, str(published_socket_path())]


def is_socket(path: str) -> bool:
    """Whether ``path`` (a symlink is followed) names a Unix socket."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def find_socket(explicit: str | None = None) -> str:
    """The first candidate that is a socket now, else the first candidate (so an error names
    the place the caller was most likely to mean). Never connects."""
    paths = candidates(explicit)
    return next((path for path in paths if is_socket(path)), paths[0])


def not_found(tried: list[tuple[str, str]]) -> str:
    """The message for "nothing answered": each place tried, why it failed, what to do next."""
    where = "; ".join(f"{path} ({reason})" for path, reason in tried)
    return (f"cannot reach the Kiwi scheduler: looked at {where}. "
            f"Point elsewhere with --socket PATH or {SOCKET_ENV}=PATH")


def _entry(link: Path, socket_path: str) -> Path:
    """This server's own entry beside the published link: every running server keeps one, so
    that the link can be handed to another when its own server stops."""
    digest = hashlib.sha256(socket_path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return link.with_name(f"{link.stem}-{digest}{link.suffix}")


def _point(link: Path, target: str) -> None:
    """Make ``link`` a symlink to ``target`` in one rename: never a moment without one."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(target)
    temporary.replace(link)


def publish(socket_path: str) -> Path | None:
    """Make ``published_socket_path()`` a symlink to ``socket_path`` (the latest server's wins);
    None when it cannot be made (a read-only home: the scheduler still works, kiwictl then
    needs --socket)."""
    link = published_socket_path()
    try:
        link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _point(_entry(link, socket_path), socket_path)
        _point(link, socket_path)
    except OSError:
        return None
    return link


def unpublish(socket_path: str) -> None:
    """Take back what ``publish`` made. Where the published link still points at
    ``socket_path``, it goes to the newest other server that still listens (two Labs of one
    user: when the second stops, kiwictl finds the first again), else it is removed; a later
    server's link is left alone."""
    link = published_socket_path()
    with contextlib.suppress(OSError):
        _entry(link, socket_path).unlink()
    with contextlib.suppress(OSError):
        if os.readlink(link) != socket_path:
            return
        other = _newest_other(link)
        if other is None:
            link.unlink()
        else:
            _point(link, other)


def _newest_other(link: Path) -> str | None:
    """The socket of the newest entry of another server that still listens; the entries of
    servers that went without a word (SIGKILL) are removed on the way."""
    found: list[tuple[float, str]] = []
    for entry in link.parent.glob(f"{link.stem}-*{link.suffix}"):
        try:
            target = os.readlink(entry)
            made = entry.lstat().st_mtime
        except OSError:
            continue
        if is_socket(target):
            found.append((made, target))
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    return max(found)[1] if found else None
