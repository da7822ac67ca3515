"""What the Jupyter-side tests share: server config for the Kiwi extension, authorizers that
stand for users with fewer rights, and reading the status endpoint."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.authorizer import Authorizer
from support import scaled


class KiwiReadOnly(Authorizer):
    """An authorizer that lets users see the Kiwi panel but not change the scheduler."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (resource == "kiwi" and action == "write")


class NoKiwi(Authorizer):
    """An authorizer that keeps users away from every Kiwi endpoint."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "kiwi"


def kiwi_config(*, authorizer: type[Authorizer] | None = None, **kiwi: Any) -> dict[str, Any]:
    """Server config enabling the extension, with ``c.KiwiExtension`` options and, if given,
    the server's authorizer class."""
    server: dict[str, Any] = {"jpserver_extensions": {"kiwi_jupyter": True}}
    if authorizer is not None:
        server["authorizer_class"] = authorizer
    return {"ServerApp": server, "KiwiExtension": kiwi}


async def get_status(jp_fetch: Callable[..., Any]) -> dict[str, Any]:
    response = await jp_fetch("kiwi", "api", "status")
    assert response.code == 200
    return json.loads(response.body)


async def wait_status(jp_fetch: Callable[..., Any], predicate: Callable[[dict[str, Any]], Any],
                      timeout: float = 10.0) -> dict[str, Any]:
    """The status document once ``predicate`` holds: read at once, then each time the server's
    long-poll (``?after=TAG``) answers with a change, as the panel waits. No polling while the
    server hears the daemon's changes; until its watch is up (``pushed`` false, answered at
    once), it asks again after a short pause. Fails after ``timeout`` (a quiet machine's
    figure, stretched by the load factor)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    tag = ""
    while True:
        response = await jp_fetch("kiwi", "api", "status", params={"after": tag},
                                  request_timeout=max(deadline - loop.time(), 1.0) + 30)
        assert response.code == 200
        status: dict[str, Any] = json.loads(response.body)
        if predicate(status):
            return status
        assert loop.time() < deadline, f"status never matched; last: {status}"
        if status["pushed"]:
            tag = status["etag"]
        else:
            await asyncio.sleep(0.05)


def kiwi_app(serverapp: Any) -> Any:
    """The running KiwiExtension instance of a server."""
    (app,) = serverapp.extension_manager.extension_apps["kiwi_jupyter"]
    return app
