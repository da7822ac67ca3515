"""A stand-in for the Kubernetes API server: a real HTTP server that answers the pod list.

It answers ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` with a ``PodList`` of the
pods the test put on that node, in the API's shape, and keeps every request it was sent, so a
test can see what the daemon asked for. ``status`` makes it answer an error instead (no RBAC).
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class PodApi:
    #: node name -> [(pod UID, namespace, name)]
    pods: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    status: int = 200
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    listed: threading.Condition = field(default_factory=threading.Condition)

    def pod_list(self, node: str) -> dict:
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                "items": [{"metadata": {"name": name, "namespace": namespace, "uid": uid},
                           "spec": {"nodeName": node}, "status": {"phase": "Running"}}
                          for uid, namespace, name in self.pods.get(node, [])]}

    def wait_requests(self, count: int, timeout: float) -> None:
        with self.listed:
            if not self.listed.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"the API was asked {len(self.requests)} times, "
                                     f"not {count}, in {timeout} s")


@contextmanager
def pod_api(tls: ssl.SSLContext | None = None) -> Iterator[PodApi]:
    """The stand-in, on plain HTTP, or on HTTPS with ``tls`` (a server context)."""
    api = PodApi()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parsed = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parsed.query)
            selector = query.get("fieldSelector", [""])[0]
            if api.status != 200:
                body = json.dumps({"kind": "Status", "code": api.status, "reason": "Forbidden",
                                   "message": "pods is forbidden"}).encode()
                self.send_response(api.status)
            elif parsed.path != "/api/v1/pods" or not selector.startswith("spec.nodeName="):
                body = b'{"kind": "Status", "code": 400}'
                self.send_response(400)
            else:
                body = json.dumps(api.pod_list(selector.split("=", 1)[1])).encode()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            with api.listed:
                api.requests.append((self.path, dict(self.headers)))
                api.listed.notify_all()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    api.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
