"""The REST endpoints of docs/interfaces.md section 8, against a real server and a real daemon."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from kiwiserver import KiwiReadOnly, NoKiwi, get_status, kiwi_config
from support import DaemonProcess, scaled
from tornado.httpclient import HTTPClientError

from nodeside.client import Client


class Waiter:
    """Asks for the GPU from a thread, as a kernel's cell would, and keeps what ended it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.error: BaseException | None = None
        #: Set just before the test closes the client: a ConnectionError after it is expected.
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.client.acquire(timeout=60)
        except BaseException as exc:  # noqa: BLE001 - kept, and raised in the test's thread
            self.error = exc

    def check(self) -> None:
        """Fail with what ended the thread, unless it was the client's close."""
        self.thread.join(scaled(10))
        assert not self.thread.is_alive(), f"{self.client.name}: still waiting after its close"
        expected = isinstance(self.error, ConnectionError) and self.closing.is_set()
        if self.error is not None and not expected:
            raise AssertionError(f"{self.client.name} failed while it waited") from self.error


class Clients:
    """Registered clients of the test's daemon; closed, and their waiting threads checked, after
    the test."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.opened: list[Client] = []
        self.waiters: list[Waiter] = []

    def __call__(self, name: str) -> Client:
        client = Client(self.socket, name=name)
        self.opened.append(client)
        return client

    def start_waiting(self, client: Client) -> None:
        self.waiters.append(Waiter(client))

    def close(self) -> None:
        for waiter in self.waiters:
            waiter.closing.set()
        for client in self.opened:
            client.close()
        for waiter in self.waiters:
            waiter.check()


@pytest.fixture
def clients(kiwi_daemon: DaemonProcess) -> Any:
    opened = Clients(kiwi_daemon.socket)
    yield opened
    opened.close()


async def post_change(jp_fetch: Any, body: Any, **kwargs: Any) -> Any:
    return await jp_fetch(
        "kiwi", "api", "scheduler", method="POST", body=json.dumps(body), **kwargs
    )


async def test_status_is_the_daemons_document_plus_reachable(jp_fetch: Any, clients: Any) -> None:
    holder = clients("kernel-a")
    holder.acquire(timeout=10)
    status = await get_status(jp_fetch)
    assert status["reachable"] is True
    assert {"version", "mode", "tq", "gpus", "clients", "pools"} <= status.keys()
    (client,) = status["clients"]
    assert (client["name"], client["state"]) == ("kernel-a", "holding")
    assert status["gpus"][0]["holders"] == [client["id"]]


async def test_status_shows_the_queue_in_order(jp_fetch: Any, clients: Any) -> None:
    clients("kernel-a").acquire(timeout=10)
    waiting = [clients("kernel-b"), clients("kernel-c")]
    for client in waiting:
        clients.start_waiting(client)
        # Wait for each to be queued before the next asks, so the order is known.
        await _wait_status(jp_fetch, lambda s, n=client.name: _state(s, n) == "waiting")
    status = await get_status(jp_fetch)
    names = {c["id"]: c["name"] for c in status["clients"]}
    assert [names[i] for i in status["gpus"][0]["queue"]] == ["kernel-b", "kernel-c"]
    assert _client(status, "kernel-c")["queue_position"] == 2


async def test_the_server_itself_is_not_a_client_of_the_daemon(jp_fetch: Any) -> None:
    status = await get_status(jp_fetch)
    assert status["clients"] == []


async def test_post_mode_changes_the_daemons_mode(
    jp_fetch: Any, kiwi_daemon: DaemonProcess
) -> None:
    response = await post_change(jp_fetch, {"mode": "off"})
    assert json.loads(response.body)["mode"] == "off"
    with Client(kiwi_daemon.socket, register=False) as observer:
        assert observer.status()["mode"] == "off"


async def test_post_tq_changes_the_time_quantum(jp_fetch: Any, kiwi_daemon: DaemonProcess) -> None:
    response = await post_change(jp_fetch, {"tq": 2.5})
    assert json.loads(response.body)["tq"] == 2.5
    with Client(kiwi_daemon.socket, register=False) as observer:
        assert observer.status()["tq"] == 2.5


async def test_post_mode_and_tq_together(jp_fetch: Any) -> None:
    status = json.loads((await post_change(jp_fetch, {"mode": "auto", "tq": 4})).body)
    assert (status["mode"], status["tq"]) == ("auto", 4.0)


@pytest.mark.parametrize(
    "body",
    [{}, [], {"mode": "sometimes"}, {"tq": 0}, {"tq": -1}, {"tq": "30"}, {"tq": True},
     {"tq": float("nan")}, {"tq": float("inf")}, {"tq": 10**400}, {"tq": 86_401}],
    ids=["empty", "not-an-object", "unknown-mode", "zero-tq", "negative-tq", "string-tq",
         "bool-tq", "nan-tq", "infinite-tq", "huge-int-tq", "over-a-day-tq"],
)
async def test_post_rejects_a_bad_change_with_400(jp_fetch: Any, body: Any) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await post_change(jp_fetch, body)
    assert refused.value.code == 400


class TestWithoutADaemon:
    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(socket=nowhere, embedded_scheduler=False)

    async def test_status_says_unreachable_plainly(self, jp_fetch: Any, nowhere: str) -> None:
        status = await get_status(jp_fetch)
        assert status["reachable"] is False
        assert nowhere in status["reason"]
        assert status["socket"] == nowhere

    async def test_a_change_answers_503(self, jp_fetch: Any) -> None:
        with pytest.raises(HTTPClientError) as refused:
            await post_change(jp_fetch, {"mode": "off"})
        assert refused.value.code == 503


class TestAUserWhoMayOnlyRead:
    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: DaemonProcess) -> dict:
        return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False,
                           authorizer=KiwiReadOnly)

    async def test_sees_the_status(self, jp_fetch: Any) -> None:
        assert (await get_status(jp_fetch))["reachable"] is True

    async def test_gets_403_when_changing_the_scheduler(
        self, jp_fetch: Any, kiwi_daemon: DaemonProcess
    ) -> None:
        with pytest.raises(HTTPClientError) as refused:
            await post_change(jp_fetch, {"mode": "off"})
        assert refused.value.code == 403
        with Client(kiwi_daemon.socket, register=False) as observer:
            assert observer.status()["mode"] == "on"

    async def test_is_told_by_the_server_it_may_not_write(self, jp_fetch: Any) -> None:
        # What the panel asks before it shows the mode and TQ controls.
        response = await jp_fetch("api", "me", params={"permissions": '{"kiwi": ["write"]}'})
        assert json.loads(response.body)["permissions"]["kiwi"] == []


class TestAUserKeptAwayFromKiwi:
    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: DaemonProcess) -> dict:
        return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False,
                           authorizer=NoKiwi)

    async def test_gets_403_for_the_status(self, jp_fetch: Any) -> None:
        with pytest.raises(HTTPClientError) as refused:
            await jp_fetch("kiwi", "api", "status")
        assert refused.value.code == 403


async def test_an_admin_is_told_it_may_write(jp_fetch: Any) -> None:
    response = await jp_fetch("api", "me", params={"permissions": '{"kiwi": ["write"]}'})
    assert json.loads(response.body)["permissions"]["kiwi"] == ["write"]


def _client(status: dict, name: str) -> dict:
    return next(c for c in status["clients"] if c["name"] == name)


def _state(status: dict, name: str) -> str | None:
    found = [c for c in status["clients"] if c["name"] == name]
    return found[0]["state"] if found else None


async def _wait_status(jp_fetch: Any, predicate: Any, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + scaled(timeout)
    while True:
        status = await get_status(jp_fetch)
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"status never matched; last: {status}"
        await asyncio.sleep(0.02)

