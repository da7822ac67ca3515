"""The server's ear on the daemon: one asyncio connection that hears ``changed`` and keeps the
latest status document, so the panel's long-polls wait for a change instead of polling.

The connection says hello with the ``changes`` feature and asks for the status document once,
then again after every ``changed`` event the daemon sends (at most ten a second, coalesced by
the daemon; a change that arrives while a document is on its way asks for one more). Each
document read after a change gets a new tag; a long-poll that names the tag it has waits until
there is another. A document read only because it got old (a long-poll that timed out) keeps
its tag: otherwise every browser's timeout would wake every other browser.

The first long-poll connects it; it reconnects with backoff when the daemon goes away (a
restart of the embedded scheduler, a node daemon upgrade). Nothing here blocks the loop and
no thread is used: however many browsers wait, the daemon sees one connection per server.

A daemon that does not serve ``changes`` (an older node daemon) leaves ``pushing`` false: the
handlers then answer at once and the panel falls back to its refresh interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from typing import Any

from kiwi_jupyter.server.link import served_document
from nodeside import protocol as p
from nodeside.client.backoff import Backoff
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession

log = logging.getLogger("kiwi_jupyter")
#: Seconds before asking an older daemon (one without ``changes``) again: after an upgrade.
_OLD_DAEMON_RETRY = 60.0


class StatusWatch:
    """The latest status document and its tag, kept up to date by the daemon's events."""

    def __init__(self, socket_path: str, *, timeout: float = 5.0, max_age: float = 0.1) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        #: A document older than this is read afresh before it is served: what counts down
        #: (``quantum_remaining``) is counted from when the browser receives it.
        self.max_age = max_age
        #: The daemon is connected and tells us of changes.
        self.pushing = False
        self.document: dict[str, Any] | None = None
        self.tag = ""
        self._read_at = 0.0
        # Tags differ across server restarts, so a browser's old tag never matches a new one.
        self._tags = (f"{secrets.token_hex(4)}-{n}" for n in itertools.count(1))
        self._news = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._session = ClientSession(features=[p.FEATURE_CHANGES])
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading: asyncio.Task[None] | None = None
        self._again = False
        self._task: asyncio.Task[None] | None = None
        #: Set once the first connection attempt has an outcome (a document, or a failure).
        self._tried = asyncio.Event()

    async def start(self) -> None:
        """Connect, if not yet; returns once the first attempt has an outcome (or timed out).
        The first long-poll starts it: no connection until a panel asks."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._tried.wait(), self.timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def newer_than(self, tag: str, timeout: float) -> tuple[dict[str, Any], str] | None:
        """The document once its tag is not ``tag`` (at once if it is not already), or a fresh
        one after ``timeout`` seconds without a change; None when the daemon does not push."""
        await self.start()
        deadline = time.monotonic() + timeout
        while self.pushing and tag == self.tag:
            news = self._news
            try:
                await asyncio.wait_for(news.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        if self.pushing and time.monotonic() - self._read_at > self.max_age:
            await self._refresh()
        if not self.pushing or self.document is None:
            return None
        return self.document, self.tag

    # -- the connection -------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.socket_path, limit=p.MAX_REPLY_BYTES),
                    self.timeout)
            except (OSError, asyncio.TimeoutError):
                self._tried.set()
                await asyncio.sleep(backoff.next())
                continue
            pause = backoff.next()
            try:
                if await self._greet(reader, writer):
                    backoff.reset()
                    pause = backoff.next()
                    await self._listen(reader, writer)
                else:
                    log.info("Kiwi: the daemon at %s sends no change events; the panel polls "
                             "it", self.socket_path)
                    pause = _OLD_DAEMON_RETRY
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    asyncio.TimeoutError, p.ProtocolError) as exc:
                log.debug("Kiwi: lost the daemon's change events: %s", exc)
            except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, then try again
                log.warning("Kiwi: the status watch failed (%s: %s); reconnecting",
                            type(exc).__name__, exc)
            finally:
                self._disconnected(writer)
                self._tried.set()
            await asyncio.sleep(pause)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        self._session.connect()
        writer.write(self._session.data_to_send())
        line = await asyncio.wait_for(reader.readline(), self.timeout)
        if not line:
            raise ConnectionResetError("the daemon closed the connection")
        said = self._session.receive_data(line if line.endswith(b"\n") else line + b"\n")
        return bool(said) and isinstance(said[0], ev.Ready) and \
            p.FEATURE_CHANGES in self._session.features

    async def _listen(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._reading = asyncio.ensure_future(self._read_status(news=True))
        self.pushing = True
        while True:
            for event in self._session.receive_data(await reader.readuntil(b"\n")):
                if isinstance(event, ev.Reply):
                    future = self._replies.pop(event.seq, None)
                    if future is not None and not future.done():
                        future.set_result(event.message)
                elif isinstance(event, ev.StatusChanged):
                    self._changed()

    def _changed(self) -> None:
        if self._reading is not None and not self._reading.done():
            self._again = True  # the document on its way may predate this change
        else:
            self._reading = asyncio.ensure_future(self._read_status(news=True))

    async def _refresh(self) -> None:
        """A fresh document (the one on its way, if any), under the same tag unless it changed."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read_status(news=False))
        # shield: a browser that goes away must not cancel what the others wait for.
        await asyncio.shield(self._reading)

    async def _read_status(self, news: bool) -> None:
        """Ask for the document; publish it under a new tag when it follows a change."""
        writer = self._writer
        if writer is None:
            return
        while True:
            if self._writer is not writer:
                return  # disconnected meanwhile
            news = news or self._again
            self._again = False
            seq = self._session.request(p.STATUS)
            future = self._replies[seq] = asyncio.get_running_loop().create_future()
            try:
                writer.write(self._session.data_to_send())
                reply = await asyncio.wait_for(future, self.timeout)
            except (OSError, asyncio.TimeoutError, asyncio.CancelledError):
                self._replies.pop(seq, None)
                return
            status = reply.get("status")
            if reply.get("op") != p.STATUS_REPLY or not isinstance(status, dict):
                return
            self.document = served_document(status, self.socket_path)
            self._read_at = time.monotonic()
            if news:
                self.tag = next(self._tags)
                self._wake()
            self._tried.set()
            if not self._again:
                return
            news = False

    def _wake(self) -> None:
        waiting, self._news = self._news, asyncio.Event()
        waiting.set()

    def _disconnected(self, writer: asyncio.StreamWriter) -> None:
        self.pushing = False
        self._writer = None
        self._session.connection_lost()
        for future in self._replies.values():
            if not future.done():
                future.cancel()
        self._replies.clear()
        writer.close()
        self._wake()  # the long-polls answer with what the plain endpoint says now
