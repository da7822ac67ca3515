"""What the Jupyter-side tests share: server config for the Kiwi extension, authorizers that
stand for users with fewer rights, and reading the status endpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.authorizer import Authorizer


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


def kiwi_app(serverapp: Any) -> Any:
    """The running KiwiExtension instance of a server."""
    (app,) = serverapp.extension_manager.extension_apps["kiwi_jupyter"]
    return app
