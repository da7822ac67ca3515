"""The endpoints of docs/interfaces.md section 8. Each one needs the server's authentication;
changing the scheduler needs the authorizer's leave to write resource ``kiwi``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from kiwi_jupyter.server.intents import FrontHints
from kiwi_jupyter.server.link import DaemonUnavailable, ServerDaemonLink
from kiwi_jupyter.server.nvml import GpuReadings
from kiwi_jupyter.server.watch import StatusWatch
from nodeside.limits import LimitError, tq_seconds
from nodeside.protocol import MODES

#: The resource the authorizer is asked about; GET is action "read", POST "write".
AUTH_RESOURCE = "kiwi"


class KiwiHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def link(self) -> ServerDaemonLink:
        link: ServerDaemonLink = self.settings["kiwi_link"]
        return link


class StatusHandler(KiwiHandler):
    """``GET kiwi/api/status``: the status document plus ``reachable``.

    With ``?after=TAG`` it is a long-poll: the answer comes when the document's tag (its field
    ``etag``) is no longer TAG, or after ``long_poll_timeout`` seconds with a fresh document, and
    says ``"pushed": true``. Where the daemon does not push (unreachable, or older), it answers
    at once with ``"pushed": false``, and the panel waits its refresh interval before asking
    again. ``after=`` (empty) answers at once with the current document and its tag.
    """

    _gone: asyncio.Event | None = None

    @web.authenticated
    @authorized
    async def get(self) -> None:
        after = self.get_query_argument("after", None)
        if after is None:
            self.finish(json.dumps(await self.link.status()))
            return
        answer = await self._wait_for_change(after)
        if answer is None:  # the browser left while it waited
            return
        self.finish(json.dumps(answer))

    async def _wait_for_change(self, after: str) -> dict[str, Any] | None:
        watch: StatusWatch = self.settings["kiwi_watch"]
        timeout: float = self.settings["kiwi_long_poll_timeout"]
        self._gone = asyncio.Event()
        change = asyncio.ensure_future(watch.newer_than(after, timeout))
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({change, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not change.done():
                change.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await change
        if self._gone.is_set():
            return None
        found = change.result()
        if found is None:
            return {**await self.link.status(), "pushed": False}
        document, tag = found
        return {**document, "etag": tag, "pushed": True}

    def on_connection_close(self) -> None:
        if self._gone is not None:
            self._gone.set()
        super().on_connection_close()


class NvmlHandler(KiwiHandler):
    """``GET kiwi/api/nvml``: each GPU's memory used and utilization as NVML reads them on this
    server's machine, or ``{"nvml": false, "reason": ...}`` where NVML is not there."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        readings: GpuReadings = self.settings["kiwi_nvml"]
        answer = await asyncio.get_running_loop().run_in_executor(None, readings.read)
        self.finish(json.dumps(answer))


class SchedulerHandler(KiwiHandler):
    """``POST kiwi/api/scheduler`` with ``{"mode": ...}`` and/or ``{"tq": ...}``: the new status."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        mode, tq = _parse_change(self._body())
        try:
            if mode is not None:
                await self.link.set_mode(mode)
            if tq is not None:
                await self.link.set_tq(tq)
        except PermissionError as exc:
            # The Jupyter authorizer said yes, but the daemon checks the server's own uid and
            # said no: an operator runs the node daemon for this node.
            raise web.HTTPError(403, f"the Kiwi daemon refused: {exc}") from exc
        except ValueError as exc:  # the daemon's own range check (error "invalid")
            raise web.HTTPError(400, str(exc)) from exc
        except DaemonUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from exc
        self.finish(json.dumps(await self.link.status()))

    def _body(self) -> Any:
        return json_body(self.request.body)


class IntentHandler(KiwiHandler):
    """``POST kiwi/api/intent`` with ``{"kernel": KERNEL_ID}``: the panel brought the kernel's
    notebook to the front. The server hints the daemon (``intent`` with reason ``front``), at
    most once a second per kernel, and answers 202 at once with ``{"hinted": bool}`` (false:
    hinted within the second, or the daemon is away). Allowed to whoever may execute in the
    server's kernels: a hint moves only that kernel's memory, and only closer."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized("execute")
    async def post(self) -> None:
        body = json_body(self.request.body)
        kernel = body.get("kernel") if isinstance(body, dict) else None
        if not isinstance(kernel, str) or not kernel:
            raise web.HTTPError(400, 'send a JSON object with "kernel": a kernel id')
        if kernel not in self.kernel_manager:
            # Only this server's kernels: the daemon would refuse any other name anyway, and
            # a kernel id must not become a way to probe the daemon for other users' names.
            raise web.HTTPError(404, f"no kernel {kernel[:64]!r} runs in this server")
        hints: FrontHints = self.settings["kiwi_front_hints"]
        self.set_status(202)
        self.finish(json.dumps({"hinted": hints.hint(kernel)}))


def json_body(raw: bytes) -> Any:
    """A request's JSON body. Read here rather than with ``get_json_body``, which logs a
    traceback for a body that is not JSON (and fails on one that is not UTF-8): a bad body is the
    client's mistake, answered 400, and the access log's line is all that is said."""
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        why = "the body is not UTF-8 text"
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        why = "the body is not JSON"
    # As the reason only: tornado logs an error's message as a line of its own, and the
    # access log's line says it already.
    raise web.HTTPError(400, reason=why)


def _parse_change(body: Any) -> tuple[str | None, float | None]:
    if not isinstance(body, dict) or not ({"mode", "tq"} & body.keys()):
        raise web.HTTPError(400, 'send a JSON object with "mode" and/or "tq"')
    mode, tq = body.get("mode"), body.get("tq")
    if mode is not None and mode not in MODES:
        raise web.HTTPError(400, f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if tq is not None:
        if isinstance(tq, bool) or not isinstance(tq, (int, float)):
            raise web.HTTPError(400, "tq must be a number of seconds")
        try:
            tq = tq_seconds(tq)  # the daemon's one TQ range
        except LimitError as exc:
            raise web.HTTPError(400, str(exc)) from None
    return mode, tq
