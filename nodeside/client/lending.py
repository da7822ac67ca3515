"""Lending the socket to a waiting caller, the one exception to "the connection thread reads".

A caller blocked waiting for a grant borrows the socket and reads it itself, so a grant wakes
the thread that waits for it directly instead of waking the connection thread, which would then
have to wake the caller (each wake-up of a sleeping thread costs tens of microseconds on a busy
machine, and a handoff is mostly wake-ups). The connection thread stands aside while the socket
is lent and takes it back when the caller is done; it alone connects and reconnects.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from nodeside import protocol as p
from nodeside.client.reader import LineReader


class SocketLender:
    """Who asked for the socket, who has it, and the wire that wakes the connection thread out
    of its poll so that it hands the socket over. Every method but ``close`` is called with
    ``changed`` held: the connection's condition, on ``lock``."""

    def __init__(self, changed: threading.Condition, lock: threading.RLock) -> None:
        self.changed = changed
        # The connection thread waits on this one (same lock) while it has lent the socket, so
        # that the messages the borrower handles, which notify ``changed``, do not wake it.
        self._returned = threading.Condition(lock)
        self.wanted_by: int | None = None  # the thread that asked for the socket
        self.lent_to: int | None = None    # the thread that has it
        self._closed = False
        #: Read by the connection thread's poll beside the socket.
        self.wake_rx, self._wake_tx = socket.socketpair()
        self.wake_rx.setblocking(False)
        self._wake_tx.setblocking(False)

    def borrow(self) -> None:
        """Ask the connection thread for the socket. It hands it over when it next looks,
        which the byte sent here makes at once; until then, and whenever it is not lent to us,
        we wait on ``changed`` as any caller does."""
        if self.wanted_by is not None:
            return  # another thread of ours is waiting for a grant and reads for both
        self.wanted_by = threading.get_ident()
        with contextlib.suppress(OSError):  # a full wire has a wake-up in it already
            self._wake_tx.send(b"!")

    def give_back(self) -> None:
        """Give the socket back to the connection thread, if this thread borrowed it."""
        if self.wanted_by != threading.get_ident():
            return
        self.wanted_by = None
        if self.lent_to is not None:
            self.lent_to = None
            self._returned.notify()

    def wait(self, timeout: float, reader: LineReader | None,
             dispatch: Callable[[dict[str, Any]], None]) -> None:
        """Wait for something to change: on ``changed``, or, while the socket is lent to this
        thread, on the socket itself, handing what arrives to ``dispatch``."""
        if self.lent_to != threading.get_ident() or reader is None:
            self.changed.wait(timeout)
            return
        self.changed.release()
        try:
            if reader.wait(timeout):
                # From the read to the last message handled, an interrupt (Ctrl-C lands in
                # this thread) would lose what was read, so the reader counts as done until
                # then: if one comes, the connection thread reconnects rather than go on with
                # a stream it can no longer trust. An interrupt while waiting loses nothing.
                reader.done = True
                messages = reader.take()
                if messages is not None:
                    for message in messages:
                        dispatch(message)
                    reader.done = False
        except (OSError, p.ProtocolError):
            reader.done = True
        finally:
            self.changed.acquire()
        if reader.done:
            # The connection ended or broke: the connection thread, given the socket back,
            # finds the reader done and reconnects, as when it sees that itself.
            self.lent_to = None
            self._returned.notify()

    def lend(self) -> None:
        """On the connection thread: lend the socket to the caller that asked for it, and wait
        until it comes back."""
        self.lent_to = self.wanted_by
        self.changed.notify_all()
        while self.lent_to is not None and not self._closed:
            self._returned.wait()

    def take_back(self) -> None:
        """The connection ended: nothing is lent any more."""
        self.lent_to = None

    def stop(self) -> None:
        """The client is closing: a connection thread waiting for the socket stops waiting."""
        self._closed = True
        self._returned.notify_all()

    def close(self) -> None:
        """Close the wire, once the connection thread has stopped."""
        self.wake_rx.close()
        self._wake_tx.close()
