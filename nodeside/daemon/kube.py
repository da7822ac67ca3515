"""The namespace of each pod on this node, from the Kubernetes API: never from the client.

With the opt-in component nodeside/deploy/components/namespaces, the scheduler DaemonSet's
service account may list pods (docs/policy.md, "Namespaces"); the daemon lists those bound to
its own node, keeps pod UID -> namespace in a dict, and the access policy looks a peer's pod up
there (its UID read from ``/proc``, see ``pods.py``). The list is read on start, every
``refresh`` seconds, and again soon after a lookup misses (a pod started since), at most once
per ``miss_interval``. Reading the API is blocking I/O, so it runs in an executor thread; the
registration itself only looks up the dict.

Fail closed: no component (no NODE_NAME or no token: the API is never asked), no API, no RBAC,
an unknown pod: the peer has no namespace, and the policy judges it on its uid and groups alone,
which can only allow less.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeside import limits
from nodeside.daemon.hostmem import PROC
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.pods import pod_uid_of

log = logging.getLogger("kiwi.daemon")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: A static pod's API object (its mirror) has its own UID; the kubelet's UID is this annotation.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class PodListError(Exception):
    """The pod list could not be read; the message says why, in one line."""


@dataclass(frozen=True)
class PodSource:
    """Where this node's pods are listed: the API server's URL, the node, the credentials."""

    base_url: str
    node: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, env: Mapping[str, str],
                   account: Path = SERVICE_ACCOUNT) -> PodSource | None:
        """The in-cluster source, from the environment every pod gets; None outside a cluster."""
        return in_cluster_or_why_not(env, account)[0]

    def url(self) -> str:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        return f"{self.base_url.rstrip('/')}/api/v1/pods?{query}"


def in_cluster_or_why_not(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT
                          ) -> tuple[PodSource | None, str | None]:
    """The in-cluster source, or None and why a daemon in a pod cannot list its node's pods.

    The why is None outside Kubernetes (no ``KUBERNETES_SERVICE_HOST``, which every pod gets).
    In a pod, the component ``nodeside/deploy/components/namespaces`` gives ``NODE_NAME`` and
    the service account's token; without it the daemon does not try the API at all (it would
    only be refused, again and again), and the caller says so once.
    """
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None, None
    node = env.get("NODE_NAME")
    if not node:
        return None, "NODE_NAME (the downward API's spec.nodeName) is not set"
    token = account / "token"
    if not token.is_file():
        return None, f"no service account token is mounted at {token}"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return PodSource(f"https://{host}:{port}", node, token, account / "ca.crt"), None


def list_namespaces(source: PodSource, timeout: float = 10.0) -> dict[str, str]:
    """Pod UID -> namespace for the pods on ``source.node``: blocking, for an executor thread."""
    url = source.url()
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    context = None
    try:
        if source.token_file is not None:
            # Read every time: projected service account tokens are rotated by the kubelet.
            token = source.token_file.read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        if url.startswith("https:"):
            context = ssl.create_default_context(
                cafile=str(source.ca_file) if source.ca_file else None)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read(limits.MAX_POD_LIST_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise PodListError(f"the API server answered {exc.code} {exc.reason}") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise PodListError(str(getattr(exc, "reason", None) or exc)) from None
    if len(body) > limits.MAX_POD_LIST_BYTES:
        raise PodListError(f"the pod list is over {limits.MAX_POD_LIST_BYTES} bytes")
    try:
        return namespaces_in(json.loads(body))
    except (ValueError, TypeError, AttributeError) as exc:
        raise PodListError(f"not a pod list: {exc}") from None


def namespaces_in(pod_list: Any) -> dict[str, str]:
    """Pod UID -> namespace from a ``PodList`` document (a static pod under both its UIDs)."""
    out: dict[str, str] = {}
    for item in pod_list.get("items") or []:
        meta = item.get("metadata") or {}
        namespace = meta.get("namespace")
        if not isinstance(namespace, str) or not namespace:
            continue
        for uid in (meta.get("uid"), (meta.get("annotations") or {}).get(MIRROR_ANNOTATION)):
            if isinstance(uid, str) and uid:
                out[uid.lower()] = namespace
    return out


class PodNamespaces:
    """The verified namespace of a peer process, from a cache the shell keeps up to date."""

    def __init__(self, source: PodSource | None, proc_root: str | Path = PROC, *,
                 refresh: float = 60.0, miss_interval: float = 5.0) -> None:
        self.source = source
        self.proc_root = proc_root
        self.refresh = refresh
        self.miss_interval = miss_interval
        self.by_uid: dict[str, str] = {}
        #: Set once the first list is read (or failed), for whoever must wait for it.
        self.listed = asyncio.Event()
        self._missed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._trouble = RateLimitedLog(log, interval=300.0)
        self._read_once = False

    def of(self, pid: int | None) -> str | None:
        """The namespace of the pod that process ``pid`` runs in, if the cache knows; else None."""
        if self.source is None:
            return None
        uid = pod_uid_of(pid, self.proc_root)
        if uid is None:
            return None
        namespace = self.by_uid.get(uid)
        if namespace is None:
            self._missed.set()  # a pod started since the last list, perhaps: list again soon
        return namespace

    def start(self) -> None:
        if self.source is not None and self._task is None:
            log.info("Reading the namespaces of node %s's pods from %s for the access policy",
                     self.source.node, self.source.base_url)
            self._task = asyncio.get_running_loop().create_task(self._keep_listing())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _keep_listing(self) -> None:
        assert self.source is not None
        loop = asyncio.get_running_loop()
        while True:
            self._missed.clear()
            try:
                self.by_uid = await loop.run_in_executor(None, list_namespaces, self.source)
                if not self._read_once:
                    log.info("Read the namespaces of %d pod(s) on node %s", len(self.by_uid),
                             self.source.node)
                self._read_once = True
            except PodListError as exc:
                # Keep the last list: a pod's namespace never changes, and one the API has not
                # shown is still judged without it.
                self._trouble.warning("pods", "Cannot list this node's pods at %s, so access "
                                      "rules by namespace match nobody new: %s",
                                      self.source.base_url, exc)
            self.listed.set()
            await asyncio.sleep(self.miss_interval)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._missed.wait(), self.refresh - self.miss_interval)
