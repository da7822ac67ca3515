"""Registering a client: every value a peer chose checked against its bound, then the scheduler.

A registration is the only request that makes the daemon keep something of the peer's for as
long as it stays: its names and labels, shown in every status document. So besides each
value's own bound (``nodeside.limits``), the node as a whole keeps at most ``MAX_CLIENTS``
clients and ``MAX_LABEL_BYTES_TOTAL`` bytes of labels: the status document can then never grow
past what clients read. Those budgets are shared out so that no group of peers shuts another
out (admins, who are not counted, aside):

* **by uid**: a uid may hold at most half of what the other uids leave of a budget, and never
  more than its share (``connections.uid_share``, a quarter by default). Four users who take
  all they can leave the fifth a sixteenth of the node, never nothing;
* **by pod, within a uid**: every Jupyter pod runs as one uid (``jovyan``), so within a uid a
  pod may hold at most half of what the uid's other pods leave of the uid's own. A pod is known
  by its UID, read from the peer's cgroup (pods.py; the kernel puts the process there, the
  client cannot choose it), else by the ``namespace``/``pod`` labels the kernel sends from the
  downward API (a hostile pod could name itself many pods that way; in the host's PID namespace,
  the ``namespaces`` and ``checkpoint`` components, the daemon reads the cgroup instead).

Who the peer is (pid, uid, groups, its pod, and on Kubernetes its pod's namespace) comes from
the socket, /proc and the API server, never from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeside import limits
from nodeside import protocol as p
from nodeside.daemon.peer import Peer, groups_of, user_name
from nodeside.daemon.pods import pod_uid_of
from nodeside.model import Registration
from nodeside.scheduler.core import ClientRecord, Scheduler

#: (uid, pod or None): who a registration is counted under.
Owner = tuple[int | None, str | None]


class Budget:
    """One node budget (clients, or label bytes) and what each uid and each pod holds of it."""

    def __init__(self, total: int, what: str) -> None:
        self.total = total
        self.what = what
        self.used = 0
        self.of_uid: dict[int | None, int] = {}
        self.of_pod: dict[Owner, int] = {}

    def refusal(self, owner: Owner, amount: int, share: float) -> str | None:
        """Why ``owner`` may not take ``amount`` more, or None when it may."""
        uid, pod = owner
        mine = self.of_uid.get(uid, 0)
        uid_cap = min(int(self.total * share), (self.total - (self.used - mine)) // 2)
        if mine + amount > uid_cap:
            return (f"uid {uid} already has {mine} {self.what}, its share of the node's "
                    f"{self.total} (at most half of what the other uids leave, and "
                    f"connections.uid_share {share:g})")
        if pod is None:
            return None
        in_pod = self.of_pod.get(owner, 0)
        pod_cap = (uid_cap - (mine - in_pod)) // 2
        if in_pod + amount > pod_cap:
            return (f"pod {limits.shown_name(pod)} of uid {uid} already has {in_pod} "
                    f"{self.what}, its share of the uid's {uid_cap} (at most half of what its "
                    f"other pods leave)")
        return None

    def take(self, owner: Owner | None, amount: int) -> None:
        self.used += amount
        if owner is not None and amount:
            self.of_uid[owner[0]] = self.of_uid.get(owner[0], 0) + amount
            self.of_pod[owner] = self.of_pod.get(owner, 0) + amount

    def give_back(self, owner: Owner | None, amount: int) -> None:
        self.used -= amount
        if owner is None or not amount:
            return
        left = self.of_uid.get(owner[0], 0) - amount
        if left > 0:
            self.of_uid[owner[0]] = left
        else:
            self.of_uid.pop(owner[0], None)
        left = self.of_pod.get(owner, 0) - amount
        if left > 0:
            self.of_pod[owner] = left
        else:
            self.of_pod.pop(owner, None)


class Registrations:
    def __init__(self, scheduler: Scheduler,
                 namespace_of: Callable[[int | None], str | None] | None = None,
                 pod_of: Callable[[int | None], str | None] = pod_uid_of) -> None:
        self.scheduler = scheduler
        self.by_uuid = {g.spec.uuid: i for i, g in scheduler.gpus.items() if g.spec.uuid}
        #: Label bytes per registered client; the node's two budgets, shared out by owner.
        self.label_bytes: dict[str, int] = {}
        self.clients = Budget(limits.MAX_CLIENTS, "clients")
        self.labels = Budget(limits.MAX_LABEL_BYTES_TOTAL, "bytes of labels")
        #: Who each client was counted under (admins' are not).
        self.owner: dict[str, Owner] = {}
        #: The verified namespace of a peer's pod by its pid (``kube.PodNamespaces.of``); None
        #: for a peer in no pod, or one that could not be verified.
        self.namespace_of: Callable[[int | None], str | None] = namespace_of or _no_namespace
        #: The UID of a peer's pod by its pid, from its cgroup; None where it is in no pod (or
        #: the daemon cannot read its cgroup).
        self.pod_of = pod_of

    def register(self, peer: Peer, msg: dict[str, Any], now: float,
                 admin: bool = False, evict: str | None = None) -> ClientRecord:
        """Register ``peer`` as the request ``msg`` asks; LimitError or SchedulerError if not.
        ``admin``: the peer is one of the daemon's admins, not held to any share; ``evict``:
        the evictor the daemon can carry out for it (None: what it asked for)."""
        if len(self.scheduler.clients) >= limits.MAX_CLIENTS:
            raise limits.LimitError(f"this node already has {limits.MAX_CLIENTS} clients")
        share = self.scheduler.config.connections.uid_share
        labels = limits.labels({k: _label_text(v) for k, v in (msg.get("labels") or {}).items()})
        owner: Owner | None = None if admin else (peer.uid, self._pod(peer, labels))
        if owner is not None:
            refused = self.clients.refusal(owner, 1, share)
            if refused is not None:
                raise limits.LimitError(refused)
        namespace = self.namespace_of(peer.pid)
        if namespace is not None:
            # The label the kernel hook sends from the downward API, replaced by the verified
            # value (after the client's labels met their bound: it is the daemon's), so that
            # kiwictl, the panel and the metrics show the namespace the policy used.
            labels["namespace"] = namespace
        label_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in labels.items())
        if self.labels.used + label_bytes > limits.MAX_LABEL_BYTES_TOTAL:
            raise limits.LimitError(f"labels: the node's clients already carry "
                                    f"{self.labels.used} bytes of labels, and "
                                    f"{limits.MAX_LABEL_BYTES_TOTAL} is the most")
        if owner is not None:
            refused = self.labels.refusal(owner, label_bytes, share)
            if refused is not None:
                raise limits.LimitError(f"labels: {refused}")
        working_set = msg.get("working_set")
        client = self.scheduler.register(now, Registration(
            name=self.name(peer, msg),
            display_name=_optional_text(msg, "display_name"),
            gpu=self._gpu(msg.get("gpu") or 0, _optional_text(msg, "gpu_uuid")),
            pool=limits.short_text(msg.get("pool") or p.DEFAULT_POOL, "pool"),
            priority=limits.short_text(msg.get("priority") or p.DEFAULT_PRIORITY,
                                       "priority").upper(),
            kind=limits.short_text(msg.get("kind") or "client", "kind"),
            labels=labels,
            working_set=None if working_set is None
            else limits.byte_count(working_set, "working_set"),
            evict=evict or _optional_text(msg, "evict") or "managed",
            pid=peer.pid, uid=peer.uid, gids=tuple(sorted(groups_of(peer))),
            user=user_name(peer.uid),
            namespace=namespace, pausable=msg.get("pausable") is True,
        ))
        self.label_bytes[client.id] = label_bytes
        self.clients.take(owner, 1)
        self.labels.take(owner, label_bytes)
        if owner is not None:
            self.owner[client.id] = owner
        return client

    @staticmethod
    def name(peer: Peer, msg: dict[str, Any]) -> str:
        """The name a ``register`` request gives its client (its pid's when it gives none)."""
        return limits.short_text(msg.get("name") or f"pid-{peer.pid}", "name")

    def forget(self, client_id: str) -> None:
        """The client's connection is gone (the shell unregisters it from the scheduler)."""
        if client_id not in self.label_bytes:
            return
        label_bytes = self.label_bytes.pop(client_id)
        owner = self.owner.pop(client_id, None)
        self.clients.give_back(owner, 1)
        self.labels.give_back(owner, label_bytes)

    def _pod(self, peer: Peer, labels: dict[str, str]) -> str | None:
        """The pod a peer runs in: its UID where its cgroup says, else what the kernel's
        labels say, else None."""
        uid = self.pod_of(peer.pid)
        if uid is not None:
            return uid
        pod = labels.get("pod")
        return None if pod is None else f"{labels.get('namespace', '')}/{pod}"

    def placement(self, msg: dict[str, Any]) -> int:
        """The GPU a ``register`` request asks for (by UUID where the node knows it)."""
        index, uuid = msg.get("gpu") or 0, msg.get("gpu_uuid")
        return self._gpu(index if isinstance(index, int) else 0,
                         uuid if isinstance(uuid, str) else None)

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
