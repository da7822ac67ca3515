"""The panel's long-poll, ``GET kiwi/api/status?after=TAG``: it answers when the daemon says the
status document changed, not on an interval. A real server, a real daemon, real clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kiwiserver import NoKiwi, kiwi_config
from support import DaemonProcess, scaled
from tornado.httpclient import HTTPClientError

from nodeside.client import Client


async def long_poll(jp_fetch: Any, after: str, **kwargs: Any) -> dict[str, Any]:
    response = await jp_fetch("kiwi", "api", "status", params={"after": after},
                              request_timeout=120, **kwargs)
    assert response.code == 200
    return json.loads(response.body)


async def pushed_document(jp_fetch: Any) -> dict[str, Any]:
    """The current document and its tag, once the server's watch on the daemon is up."""
    deadline = asyncio.get_running_loop().time() + scaled(10)
    while True:
        document = await long_poll(jp_fetch, "")
        if document["pushed"] or asyncio.get_running_loop().time() > deadline:
            return document
        await asyncio.sleep(0.05)


def holder_names(document: dict[str, Any]) -> list[str]:
    names = {c["id"]: c["name"] for c in document["clients"]}
    return [names[i] for i in document["gpus"][0]["holders"]]


async def test_a_pending_long_poll_answers_with_the_change_and_not_before(
        jp_fetch: Any, kiwi_daemon: DaemonProcess) -> None:
    first = await pushed_document(jp_fetch)
    assert first["pushed"] is True and first["reachable"] is True and first["etag"]
    waiting = asyncio.ensure_future(long_poll(jp_fetch, first["etag"]))
    await asyncio.sleep(0.3)  # time for it to reach the server and wait there
    assert not waiting.done()  # nothing changed: it waits (for 25 s, the default)
    client = Client(kiwi_daemon.socket, name="kernel-a")  # registers: the change
    try:
        # The poll that was pending answers, under a new tag, with the change that woke it: a
        # long-poll that answered without one (on a timer, or at once) would show no kernel-a.
        document = await asyncio.wait_for(waiting, scaled(20))
        assert document["etag"] != first["etag"]
        assert "kernel-a" in [c["name"] for c in document["clients"]]
        client.acquire(timeout=10)
        # The grant is a change of its own (or came in the same one): each poll answers the next.
        while holder_names(document) != ["kernel-a"]:
            later = await asyncio.wait_for(long_poll(jp_fetch, document["etag"]), scaled(20))
            assert later["etag"] != document["etag"]
            document = later
    finally:
        client.close()
        waiting.cancel()


async def test_a_long_poll_answers_a_changed_tag_at_once(jp_fetch: Any) -> None:
    document = await long_poll(jp_fetch, "a-tag-from-another-server")
    assert document["reachable"] is True and "etag" in document


async def test_the_plain_status_stays_as_it_was(jp_fetch: Any) -> None:
    response = await jp_fetch("kiwi", "api", "status")
    document = json.loads(response.body)
    assert document["reachable"] is True and "pushed" not in document


class TestAShortLongPoll:
    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: DaemonProcess) -> dict:
        return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False,
                           long_poll_timeout=0.5)

    async def test_without_a_change_it_answers_a_fresh_document_under_the_same_tag(
            self, jp_fetch: Any, kiwi_daemon: DaemonProcess) -> None:
        with Client(kiwi_daemon.socket, name="kernel-a") as client:
            client.acquire(timeout=10)
            first = await pushed_document(jp_fetch)
            while holder_names(first) != ["kernel-a"]:
                first = await long_poll(jp_fetch, first["etag"])
            later = await long_poll(jp_fetch, first["etag"])
            assert later["etag"] == first["etag"]
            # Read afresh, not the cached one: the quantum has counted down since.
            assert later["gpus"][0]["quantum_remaining"] < first["gpus"][0]["quantum_remaining"]


class TestWithoutADaemon:
    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(socket=nowhere, embedded_scheduler=False)

    async def test_a_long_poll_answers_at_once_and_says_it_is_not_pushed(
            self, jp_fetch: Any, nowhere: str) -> None:
        document = await asyncio.wait_for(long_poll(jp_fetch, "any"), scaled(10))
        assert document["reachable"] is False and document["pushed"] is False
        assert nowhere in document["reason"]


class TestAUserKeptAwayFromKiwi:
    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: DaemonProcess) -> dict:
        return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False,
                           authorizer=NoKiwi)

    async def test_gets_403_for_the_long_poll(self, jp_fetch: Any) -> None:
        with pytest.raises(HTTPClientError) as refused:
            await long_poll(jp_fetch, "")
        assert refused.value.code == 403

    async def test_and_401_or_403_without_credentials(self, jp_fetch: Any) -> None:
        with pytest.raises(HTTPClientError) as refused:
            await long_poll(jp_fetch, "", headers={"Authorization": ""})
        assert refused.value.code in (401, 403)
