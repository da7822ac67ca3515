"""Restore on intent, the server's half (issue 42 item 4): a cell's execute request tells the
daemon (``intent``, reason ``execute``) before the kernel runs it, through the server's own
websocket in both of its wire formats; the panel's ``POST kiwi/api/intent`` says a notebook came
to the front (reason ``front``). A daemon that is away costs a cell nothing.

The daemon's side is a recorder here (``hint_recorder``): what is tested is when the server
sends, and what; the daemon's handling of ``intent`` is the daemon's own tests'."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hint_recorder import HintRecorder, intents, recording
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1
from kiwiserver import kiwi_app, kiwi_config, wait_status
from support import scaled, short_tmpdir
from tornado.httpclient import HTTPClientError

import kiwi_jupyter
from kiwi_jupyter.server.intents import FrontHints

V1 = "v1.kernel.websocket.jupyter.org"
KIWI_SPEC = Path(kiwi_jupyter.__file__).parent / "kernel" / "spec"


@pytest.fixture
def recorder() -> Iterator[HintRecorder]:
    directory = short_tmpdir()
    yield from recording(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def jp_server_config(recorder: HintRecorder) -> dict:
    return kiwi_config(socket=str(recorder.path), embedded_scheduler=False)


async def start_kernel(jp_fetch: Any) -> str:
    response = await jp_fetch("api", "kernels", method="POST",
                              body=json.dumps({"name": "python3"}))
    return str(json.loads(response.body)["id"])


def execute_request(code: str) -> dict[str, Any]:
    msg_id = uuid.uuid4().hex
    return {"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}


def encoded(message: dict[str, Any], subprotocol: str | None) -> str | bytes:
    if subprotocol == V1:
        parts = [json.dumps(message[key]).encode()
                 for key in ("header", "parent_header", "metadata", "content")]
        return serialize_msg_to_ws_v1(parts, "shell")
    return json.dumps({**message, "channel": "shell"})


async def run_cell(jp_ws_fetch: Any, kernel: str, code: str,
                   subprotocol: str | None = None) -> dict[str, Any]:
    """Send a cell over the kernel's websocket as the Lab does; its execute_reply's content."""
    ws = await jp_ws_fetch("api", "kernels", kernel, "channels",
                           subprotocols=[subprotocol] if subprotocol else None)
    try:
        request = execute_request(code)
        await ws.write_message(encoded(request, subprotocol), binary=subprotocol == V1)
        while True:
            frame = await ws.read_message()
            assert frame is not None, "the kernel's websocket closed"
            reply = decoded(frame)
            if reply["header"]["msg_type"] == "execute_reply" and \
                    reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                return dict(reply["content"])
    finally:
        ws.close()


def decoded(frame: str | bytes) -> dict[str, Any]:
    if isinstance(frame, str):
        return dict(json.loads(frame))
    from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1
    _, parts = deserialize_msg_from_ws_v1(frame)
    return {"header": json.loads(parts[0]), "parent_header": json.loads(parts[1]),
            "content": json.loads(parts[3])}


def cell_that_tells(recorder: HintRecorder) -> str:
    """A cell whose running reaches the recorder too (a ping on a connection of its own): the
    recorder's order is then the order of the hint and the cell's run."""
    return ("from nodeside.client import ControlClient\n"
            f"with ControlClient({str(recorder.path)!r}) as c:\n    c.ping()\n")


@pytest.mark.parametrize("subprotocol", [None, V1], ids=["json", "v1"])
async def test_an_execute_request_reaches_the_daemon_as_intent_before_the_cell_runs(
        jp_fetch: Any, jp_ws_fetch: Any, recorder: HintRecorder, subprotocol: str | None
) -> None:
    kernel = await start_kernel(jp_fetch)
    reply = await run_cell(jp_ws_fetch, kernel, cell_that_tells(recorder), subprotocol)
    assert reply["status"] == "ok", reply
    heard = recorder.wait_for(lambda got: "ping" in [m["op"] for m in got])
    ops = [m["op"] for m in heard]
    assert intents(heard) == [(kernel, "execute")]
    assert ops.index("intent") < ops.index("ping"), ops


async def test_messages_that_are_no_cell_send_no_hint(
        jp_fetch: Any, jp_ws_fetch: Any, recorder: HintRecorder) -> None:
    kernel = await start_kernel(jp_fetch)
    ws = await jp_ws_fetch("api", "kernels", kernel, "channels")
    request = execute_request("")
    request["header"]["msg_type"] = "kernel_info_request"
    request["content"] = {}
    await ws.write_message(json.dumps({**request, "channel": "shell"}))
    while decoded(await ws.read_message())["header"]["msg_type"] != "kernel_info_reply":
        pass
    ws.close()
    await run_cell(jp_ws_fetch, kernel, cell_that_tells(recorder))
    heard = recorder.wait_for(lambda got: "ping" in [m["op"] for m in got])
    assert intents(heard) == [(kernel, "execute")]  # the cell's, and none for the info


class TestWithTheDaemonAway:
    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(socket=nowhere, embedded_scheduler=False)

    async def test_the_cell_runs_as_before(self, jp_fetch: Any, jp_ws_fetch: Any,
                                           jp_serverapp: Any) -> None:
        kernel = await start_kernel(jp_fetch)
        for _ in range(3):
            reply = await run_cell(jp_ws_fetch, kernel, "1 + 1")
            assert reply["status"] == "ok"
        link = kiwi_app(jp_serverapp).link
        assert link.hints_sent == 0

    async def test_a_front_hint_is_answered_at_once(self, jp_fetch: Any) -> None:
        kernel = await start_kernel(jp_fetch)
        response = await jp_fetch("kiwi", "api", "intent", method="POST",
                                  body=json.dumps({"kernel": kernel}))
        assert response.code == 202


async def test_a_notebook_brought_to_the_front_sends_intent_front(
        jp_fetch: Any, recorder: HintRecorder) -> None:
    kernel = await start_kernel(jp_fetch)
    response = await jp_fetch("kiwi", "api", "intent", method="POST",
                              body=json.dumps({"kernel": kernel}))
    assert response.code == 202
    assert json.loads(response.body) == {"hinted": True}
    heard = recorder.wait_for(lambda got: intents(got))
    assert intents(heard) == [(kernel, "front")]


@pytest.mark.parametrize("body", [b"", b"not json", b"\xff\xfe", b"[]", b'{"kernel": 3}',
                                  b'{"kernel": ""}', b'{"other": "x"}'])
async def test_a_bad_intent_body_is_400(jp_fetch: Any, body: bytes,
                                         recorder: HintRecorder) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("kiwi", "api", "intent", method="POST", body=body,
                       allow_nonstandard_methods=True)
    assert refused.value.code == 400
    assert intents(recorder.requests) == []


async def test_a_kernel_this_server_does_not_run_is_404(jp_fetch: Any,
                                                       recorder: HintRecorder) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("kiwi", "api", "intent", method="POST",
                       body=json.dumps({"kernel": str(uuid.uuid4())}))
    assert refused.value.code == 404
    assert intents(recorder.requests) == []


async def test_a_post_without_its_xsrf_token_is_refused(
        jp_fetch: Any, recorder: HintRecorder) -> None:
    """A browser's cookie alone (no token header, no XSRF token): what a page on another site
    could make a browser send."""
    kernel = await start_kernel(jp_fetch)
    login = await jp_fetch("api", "status")  # sets the server's cookies for this client
    cookies = "; ".join(c.split(";", 1)[0] for c in login.headers.get_list("Set-Cookie"))
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("kiwi", "api", "intent", method="POST",
                       body=json.dumps({"kernel": kernel}),
                       headers={"Authorization": "", "Cookie": cookies})
    assert refused.value.code in (401, 403)
    assert intents(recorder.requests) == []


class TestAUserWhoMayNotExecute:
    @pytest.fixture
    def jp_server_config(self, recorder: HintRecorder) -> dict:
        return kiwi_config(socket=str(recorder.path), embedded_scheduler=False,
                           authorizer=NoExecute)

    async def test_gets_403(self, jp_fetch: Any, recorder: HintRecorder) -> None:
        kernel = await start_kernel(jp_fetch)
        with pytest.raises(HTTPClientError) as refused:
            await jp_fetch("kiwi", "api", "intent", method="POST",
                           body=json.dumps({"kernel": kernel}))
        assert refused.value.code == 403
        assert intents(recorder.requests) == []


class NoExecute(Authorizer):
    """A user who may see the panel but not run code in kernels."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (resource == "kernels" and action == "execute")


class CountingLink:
    def __init__(self) -> None:
        self.hints: list[tuple[str, str]] = []

    def hint(self, name: str, reason: str) -> bool:
        self.hints.append((name, reason))
        return True


def test_a_user_flipping_tabs_sends_at_most_one_front_hint_a_second_per_kernel() -> None:
    now = [100.0]
    link = CountingLink()
    hints = FrontHints(link, interval=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(5):
        hints.hint("a")
        hints.hint("b")
        now[0] += 0.3
    assert link.hints == [("a", "front"), ("b", "front")] * 2


class TestWithARealDaemon:
    """The names the server hints by are those kernels register under: a real daemon takes a
    hint for a Kiwi kernel (its Jupyter kernel id) and refuses one for a kernel it never
    heard of, and the cell runs either way."""

    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: Any, jp_data_dir: Any) -> dict:
        # The package's kernelspec, where this test's isolated Jupyter looks for kernelspecs.
        spec = jp_data_dir / "kernels" / "kiwi"
        spec.mkdir(parents=True)
        shipped = json.loads((KIWI_SPEC / "kernel.json").read_text())
        (spec / "kernel.json").write_text(json.dumps({**shipped, "argv": [
            sys.executable, *shipped["argv"][1:]]}))  # this venv's Python
        return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False)

    async def test_a_kiwi_kernels_cell_is_hinted_by_the_name_it_registered(
            self, jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any) -> None:
        response = await jp_fetch("api", "kernels", method="POST",
                                  body=json.dumps({"name": "kiwi"}))
        kernel = str(json.loads(response.body)["id"])
        await wait_status(jp_fetch, lambda s: any(c["name"] == kernel for c in s["clients"]),
                          timeout=60)
        link = kiwi_app(jp_serverapp).link
        reply = await run_cell(jp_ws_fetch, kernel, "1 + 1")
        assert reply["status"] == "ok"
        await wait_until(lambda: link.hints_sent == 1)

    async def test_a_kernel_the_daemon_never_heard_of_is_refused_quietly(
            self, jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any) -> None:
        kernel = await start_kernel(jp_fetch)  # a plain python3 kernel: never registers
        link = kiwi_app(jp_serverapp).link
        reply = await run_cell(jp_ws_fetch, kernel, "1 + 1")
        assert reply["status"] == "ok"
        await wait_until(lambda: link.hints_refused == 1)
        assert link.hints_sent == 0


async def wait_until(done: Any, timeout: float = 10.0) -> None:
    """Until ``done()``: the link's worker answers on its own thread, with no event to await."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while not done():
        assert loop.time() < deadline, "never happened"
        await asyncio.sleep(0.02)
