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
from typing import Any

from nodeside import protocol as p
from nodeside.client.reader import LineReader


class SocketLending:
    """The lending half of ``Connection``: who asked for the socket, who has it, and the wire
    that wakes the connection thread out of its poll so that it hands the socket over."""

    _cond: threading.Condition
    _socket_returned: threading.Condition  # same lock; the connection thread waits on it
    _reader: LineReader | None
    _closed: bool
    _wake_tx: socket.socket
    _socket_wanted: int | None = None   # the thread that asked for the socket
    _socket_lent_to: int | None = None  # the thread that has it

    def _dispatch(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def _borrow_socket(self) -> None:
        """Ask the connection thread for the socket (with self._cond held). It hands it over
        when it next looks, which the byte sent here makes at once; until then, and whenever it
        is not lent to us, we wait on the condition as any caller does."""
        if self._socket_wanted is not None:
            return  # another thread of ours is waiting for a grant and reads for both
        self._socket_wanted = threading.get_ident()
        with contextlib.suppress(OSError):  # a full wire has a wake-up in it already
            self._wake_tx.send(b"!")

    def _return_socket(self) -> None:
        """Give the socket back to the connection thread (with self._cond held)."""
        if self._socket_wanted != threading.get_ident():
            return
        self._socket_wanted = None
        if self._socket_lent_to is not None:
            self._socket_lent_to = None
            self._socket_returned.notify()

    def _wait(self, timeout: float) -> None:
        """Wait (with self._cond held) for something to change: on the condition, or, while
        the socket is lent to this thread, on the socket itself, handling what arrives."""
        reader = self._reader
        if self._socket_lent_to != threading.get_ident() or reader is None:
            self._cond.wait(timeout)
            return
        self._cond.release()
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
                        self._dispatch(message)
                    reader.done = False
        except (OSError, p.ProtocolError):
            reader.done = True
        finally:
            self._cond.acquire()
        if reader.done:
            # The connection ended or broke: the connection thread, given the socket back,
            # finds the reader done and reconnects, as when it sees that itself.
            self._socket_lent_to = None
            self._socket_returned.notify()

    def _lend_socket(self) -> None:
        """On the connection thread, with self._cond held: lend the socket to a caller that
        asked for it, and wait until it comes back."""
        self._socket_lent_to = self._socket_wanted
        self._cond.notify_all()
        while self._socket_lent_to is not None and not self._closed:
            self._socket_returned.wait()
