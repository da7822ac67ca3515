"""Registering a client: every value a peer chose checked against its bound, then the scheduler.

A registration is the only request that makes the daemon keep something of the peer's for as
long as it stays: its names and labels, shown in every status document. So besides each
value's own bound (``nodeside.limits``), the node as a whole keeps at most ``MAX_CLIENTS``
clients and ``MAX_LABEL_BYTES_TOTAL`` bytes of labels: the status document can then never grow
past what clients read. Of each budget one uid may hold its share (``connections.uid_share``,
a quarter by default; admins are not counted), so that one user filling the node refuses only
their own next kernel, not everyone's. Who the peer is (pid, uid, groups, and on Kubernetes
its pod's namespace) comes from the socket, /proc and the API server, never from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from nodeside import limits
from nodeside import protocol as p
from nodeside.daemon.peer import Peer, groups_of, user_name
from nodeside.scheduler.core import Client, Scheduler


class Registrations:
    def __init__(self, scheduler: Scheduler,
                 namespace_of: Callable[[int | None], str | None] | None = None) -> None:
        self.scheduler = scheduler
        self.by_uuid = {g.spec.uuid: i for i, g in scheduler.gpus.items() if g.spec.uuid}
        #: Label bytes per registered client, and their sum.
        self.label_bytes: dict[str, int] = {}
        self.label_bytes_total = 0
        #: Clients and label bytes counted against each uid's share (admins are not), and
        #: the uid each client was counted under.
        self.clients_of_uid: Counter[int | None] = Counter()
        self.label_bytes_of_uid: Counter[int | None] = Counter()
        self.counted_uid: dict[str, int | None] = {}
        #: The verified namespace of a peer's pod by its pid (``kube.PodNamespaces.of``); None
        #: for a peer in no pod, or one that could not be verified.
        self.namespace_of: Callable[[int | None], str | None] = namespace_of or _no_namespace

    def register(self, peer: Peer, msg: dict[str, Any], now: float,
                 admin: bool = False) -> Client:
        """Register ``peer`` as the request ``msg`` asks; LimitError or SchedulerError if not.
        ``admin``: the peer is one of the daemon's admins, not held to a uid's share."""
        if len(self.scheduler.clients) >= limits.MAX_CLIENTS:
            raise limits.LimitError(f"this node already has {limits.MAX_CLIENTS} clients")
        share = self.scheduler.config.connections.uid_share
        uid = peer.uid
        if not admin and self.clients_of_uid[uid] >= int(limits.MAX_CLIENTS * share):
            raise limits.LimitError(f"uid {uid} already has {self.clients_of_uid[uid]} "
                                    f"clients, its share of the node's {limits.MAX_CLIENTS} "
                                    f"(connections.uid_share {share:g})")
        labels = limits.labels({k: _label_text(v) for k, v in (msg.get("labels") or {}).items()})
        namespace = self.namespace_of(peer.pid)
        if namespace is not None:
            # The label the kernel hook sends from the downward API, replaced by the verified
            # value (after the client's labels met their bound: it is the daemon's), so that
            # kiwictl, the panel and the metrics show the namespace the policy used.
            labels["namespace"] = namespace
        label_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in labels.items())
        if self.label_bytes_total + label_bytes > limits.MAX_LABEL_BYTES_TOTAL:
            raise limits.LimitError(f"labels: the node's clients already carry "
                                    f"{self.label_bytes_total} bytes of labels, and "
                                    f"{limits.MAX_LABEL_BYTES_TOTAL} is the most")
        uid_bytes = int(limits.MAX_LABEL_BYTES_TOTAL * share)
        if not admin and self.label_bytes_of_uid[uid] + label_bytes > uid_bytes:
            raise limits.LimitError(f"labels: the clients of uid {uid} already carry "
                                    f"{self.label_bytes_of_uid[uid]} bytes of labels, and "
                                    f"{uid_bytes} is its share (connections.uid_share "
                                    f"{share:g})")
        working_set = msg.get("working_set")
        client = self.scheduler.register(
            now,
            name=limits.short_text(msg.get("name") or f"pid-{peer.pid}", "name"),
            display_name=_optional_text(msg, "display_name"),
            gpu=self._gpu(msg.get("gpu") or 0, _optional_text(msg, "gpu_uuid")),
            pool=limits.short_text(msg.get("pool") or p.DEFAULT_POOL, "pool"),
            priority=limits.short_text(msg.get("priority") or p.DEFAULT_PRIORITY,
                                       "priority").upper(),
            kind=limits.short_text(msg.get("kind") or "client", "kind"),
            labels=labels,
            working_set=None if working_set is None
            else limits.byte_count(working_set, "working_set"),
            evict=_optional_text(msg, "evict") or "managed",
            pid=peer.pid, uid=peer.uid, gids=groups_of(peer), user=user_name(peer.uid),
            namespace=namespace, pausable=msg.get("pausable") is True,
        )
        self.label_bytes[client.id] = label_bytes
        self.label_bytes_total += label_bytes
        if not admin:
            self.counted_uid[client.id] = uid
            self.clients_of_uid[uid] += 1
            self.label_bytes_of_uid[uid] += label_bytes
        return client

    def forget(self, client_id: str) -> None:
        """The client's connection is gone (the shell unregisters it from the scheduler)."""
        label_bytes = self.label_bytes.pop(client_id, 0)
        self.label_bytes_total -= label_bytes
        if client_id in self.counted_uid:
            uid = self.counted_uid.pop(client_id)
            self.clients_of_uid[uid] -= 1
            self.label_bytes_of_uid[uid] -= label_bytes
            if not self.clients_of_uid[uid]:
                del self.clients_of_uid[uid]
                del self.label_bytes_of_uid[uid]

    def _gpu(self, index: int, uuid: str | None) -> int:
        # A process's CUDA_VISIBLE_DEVICES renumbers GPUs; a UUID names one GPU everywhere. An
        # unknown UUID (a MIG instance, whose UUID NVML's device list does not carry, or a
        # daemon on logical GPUs) leaves the index to decide, so it is resolved here and not
        # passed on: the scheduler would refuse a UUID it does not know.
        return index if uuid is None else self.by_uuid.get(uuid, index)


def _no_namespace(pid: int | None) -> str | None:
    return None


def _optional_text(msg: dict[str, Any], key: str) -> str | None:
    value = msg.get(key)
    return None if value is None else limits.short_text(value, key)


def _label_text(value: Any) -> Any:
    # Older clients sent numbers as label values; they were always shown as text.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value
