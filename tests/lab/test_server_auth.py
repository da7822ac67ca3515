"""No Kiwi endpoint answers a request that carries no credentials.

The handlers are found in the running server's routing table, not listed here, so an endpoint
added later without @web.authenticated makes this test fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from kiwiserver import kiwi_app
from tornado.httpclient import HTTPClientError

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def kiwi_routes(serverapp: Any) -> list[str]:
    """URL patterns of every handler the Kiwi extension registered."""
    app = kiwi_app(serverapp)
    patterns = [spec[0] for spec in app.handlers]
    assert patterns, "the Kiwi extension registered no handlers"
    return patterns


def concrete_path(pattern: str) -> str:
    # Our patterns have no groups today; fill any that appear so they are still requested.
    return pattern.replace("(.*)", "x").replace("(.+)", "x").lstrip("/")


async def test_every_kiwi_endpoint_refuses_unauthenticated_requests(
    jp_serverapp: Any, jp_fetch: Any
) -> None:
    reachable = []
    for pattern in kiwi_routes(jp_serverapp):
        for method in METHODS:
            try:
                response = await jp_fetch(
                    concrete_path(pattern),
                    method=method,
                    headers={"Authorization": ""},
                    body=b"{}" if method in ("POST", "PUT", "PATCH") else None,
                    allow_nonstandard_methods=True,
                    follow_redirects=False,
                )
            except HTTPClientError as refused:
                # 401/403: refused for want of credentials; 405: no such method at all.
                if refused.code not in (401, 403, 405):
                    reachable.append(f"{method} {pattern} -> {refused.code}")
            else:
                reachable.append(f"{method} {pattern} -> {response.code}")
    assert reachable == []


async def test_a_wrong_token_is_refused(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("kiwi", "api", "status", headers={"Authorization": "token wrong"})
    assert refused.value.code in (401, 403)


async def test_the_extension_registers_the_contract_endpoints(jp_serverapp: Any) -> None:
    assert {"/kiwi/api/status", "/kiwi/api/scheduler"} <= set(kiwi_routes(jp_serverapp))
