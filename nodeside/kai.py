"""Kiwi pools as KAI Scheduler Queues, and KAI priority classes as Kiwi priorities.

One pool config drives both levels of sharing. Across the cluster, KAI Scheduler divides GPUs
between queues; on each shared GPU, the Kiwi node daemon divides GPU time between pools. Both use
the same three numbers with the same meaning (guarantee, weight, maximum; see
seeds/kai-scheduler-pools.txt), so a pool exported here behaves in KAI as it does on a node:

    pool (fractions of one GPU's time)         KAI Queue (GPUs, scheduling.run.ai/v2)
    guarantee   g                          ->  spec.resources.gpu.quota            g * GPUS
    weight      w                          ->  spec.resources.gpu.overQuotaWeight  w
    maximum     m (-1: none)               ->  spec.resources.gpu.limit            m * GPUS (-1)

    (not a Kiwi concern)                        spec.resources.cpu, .memory: quota -1, limit -1,
                                                overQuotaWeight 1 (unlimited)

KAI reads a resource a queue leaves out as a quota and a limit of 0, so a queue with only ``gpu``
refuses every pod that requests CPU or memory (every pod does). CPU and memory are exported as
unlimited, as in the default queues KAI itself creates at installation.

GPUS is the number of GPUs the pools share cluster-wide (``--gpus``): a pool guaranteed 0.3 of
every GPU's time is guaranteed 0.3 * GPUS GPUs' worth. A pod joins a queue with the label
``kai.scheduler/queue: <pool>``; the notebook pod template passes that label to ``KIWI_POOL``
through the downward API, so the pod lands in the same pool on its node.

KAI ships four priority classes and treats a value under 100 as preemptible. Kiwi's LOW is its
preemptible priority, so:

    KAI class (value)                 Kiwi priority
    train (50)                        LOW
    build-preemptible (75)            LOW
    build (100)                       NORMAL
    inference (125)                   HIGH
    any other value v                 v < 100: LOW, 100 <= v < 125: NORMAL, v >= 125: HIGH
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from nodeside.model import UNLIMITED, Pool

QUEUE_API_VERSION = "scheduling.run.ai/v2"
QUEUE_LABEL = "kai.scheduler/queue"
KAI_PRIORITY_CLASSES: Mapping[str, int] = {
    "train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
#: CPU and memory in every exported queue: unlimited, as in KAI's own default queues.
UNLIMITED_RESOURCE: Mapping[str, float] = {"quota": UNLIMITED, "overQuotaWeight": 1.0,
                                           "limit": UNLIMITED}
#: KAI's rule: a priority value at or above this is non-preemptible.
NON_PREEMPTIBLE_FROM = 100
#: Kiwi's HIGH starts at KAI's inference class.
HIGH_FROM = 125
# A queue name is a cluster-scoped object name and a label value at once: a DNS-1123 label.
_QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class KaiExportError(ValueError):
    """The pools cannot be expressed as KAI Queues; the message says which and why."""


class UnknownPriorityClass(KeyError):
    def __str__(self) -> str:
        return (f"{self.args[0]!r} is not a KAI priority class "
                f"({', '.join(KAI_PRIORITY_CLASSES)}) or a priority value")


def priority_for(kai_class: str | int) -> str:
    """The Kiwi priority (HIGH, NORMAL, LOW) of a KAI priority class name or value."""
    if isinstance(kai_class, int) and not isinstance(kai_class, bool):
        value = kai_class
    elif isinstance(kai_class, str) and kai_class.strip() in KAI_PRIORITY_CLASSES:
        value = KAI_PRIORITY_CLASSES[kai_class.strip()]
    elif isinstance(kai_class, str) and re.fullmatch(r"\s*-?\d+\s*", kai_class):
        value = int(kai_class)
    else:
        raise UnknownPriorityClass(kai_class)
    if value < NON_PREEMPTIBLE_FROM:
        return "LOW"
    return "HIGH" if value >= HIGH_FROM else "NORMAL"


def _gpus_of(fraction: float, gpus: float) -> float:
    # Round away float noise (0.3 * 100 = 30.000000000000004) so the YAML reads as written.
    return round(fraction * gpus, 6)


def queue(pool: Pool, *, gpus: float = 1.0, parent: str | None = None) -> dict[str, Any]:
    """The KAI Queue object for one pool."""
    if not _QUEUE_NAME.match(pool.name) or len(pool.name) > 63:
        raise KaiExportError(
            f"pool {pool.name!r} cannot be a KAI queue: queue names are lowercase letters, "
            f"digits and '-', at most 63 characters, starting and ending with a letter or digit")
    spec: dict[str, Any] = {}
    if parent:
        spec["parentQueue"] = parent
    spec["resources"] = {
        "cpu": dict(UNLIMITED_RESOURCE),
        "gpu": {
            "quota": _gpus_of(pool.guarantee, gpus),
            "overQuotaWeight": float(pool.weight),
            "limit": UNLIMITED if pool.maximum == UNLIMITED else _gpus_of(pool.maximum, gpus),
        },
        "memory": dict(UNLIMITED_RESOURCE),
    }
    return {"apiVersion": QUEUE_API_VERSION, "kind": "Queue",
            "metadata": {"name": pool.name, "labels": {"app.kubernetes.io/managed-by": "kiwi"}},
            "spec": spec}


def queues(pools: Mapping[str, Pool], *, gpus: float = 1.0, parent: str | None = None
           ) -> list[dict[str, Any]]:
    """KAI Queues for ``pools`` (as parsed by nodeside.config.parse_pools), with the parent
    queue first when one is named. Quotas and limits are the pools' fractions times ``gpus``."""
    if not gpus > 0:
        raise KaiExportError(f"--gpus must be a positive number of GPUs, got {gpus!r}")
    if not pools:
        raise KaiExportError("the config has no pools to export")
    if parent is not None and parent in pools:
        raise KaiExportError(f"the parent queue {parent!r} is also a pool's name")
    out = []
    if parent is not None:
        out.append(queue(Pool(parent, guarantee=1.0, weight=1.0, maximum=UNLIMITED), gpus=gpus))
    out.extend(queue(p, gpus=gpus, parent=parent) for p in pools.values())
    return out


def partial_pools(pools: Mapping[str, Pool]) -> list[str]:
    """Pools missing guarantee, weight or maximum in the config. KAI turns preemption off when
    any pool is partial, and so does Kiwi; the export writes all three, which turns it on in KAI."""
    return [p.name for p in pools.values() if not p.complete]


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=float, default=1.0,
                        help="GPUs the pools share across the cluster; quotas and limits are "
                             "the pools' fractions times this (default %(default)s)")
    parser.add_argument("--parent", metavar="QUEUE",
                        help="also write this parent queue and make every pool its child")


#: Where the kiwi-scheduler pods see the ConfigMap (nodeside/deploy/scheduler-daemonset.yaml).
POD_CONFIG = "/etc/kiwi/config.yaml"


def add_export_parser(commands: Any) -> None:
    """``pools export --kai``: the subcommand kiwictl offers (``commands`` is its pools
    subparsers)."""
    export = commands.add_parser(
        "export", help="write the pools as another scheduler's objects",
        description="Write the pools as KAI Scheduler Queue objects (YAML on stdout), from a "
                    "config file, or else from the running daemon.")
    export.add_argument("--kai", action="store_true", required=True,
                        help="as KAI Scheduler Queues (scheduling.run.ai/v2)")
    export.add_argument("--config", help=f"a Kiwi config file (default: {POD_CONFIG} where it "
                                          f"exists, else the daemon's pools)")
    add_export_arguments(export)


def export(pools: Mapping[str, Pool], args: argparse.Namespace) -> int:
    """Print the KAI Queues for ``pools`` on stdout."""
    try:
        text = to_yaml(queues(pools, gpus=args.gpus, parent=args.parent))
    except KaiExportError as exc:
        print(f"[ERROR] {exc}", file=sys.stderr)
        return 1
    partial = partial_pools(pools)
    if partial:
        print(f"[WARNING] pool(s) {', '.join(partial)} leave out guarantee, weight or maximum: "
              f"Kiwi turns preemption off for them, KAI will not with the values exported",
              file=sys.stderr)
    sys.stdout.write(text)
    return 0


def export_command(args: argparse.Namespace) -> int:
    """Run ``pools export --kai`` (args from ``add_export_parser``, plus kiwictl's --socket)."""
    from pathlib import Path

    from nodeside.config import ConfigError, load, parse_pools

    path = args.config or (POD_CONFIG if Path(POD_CONFIG).exists() else None)
    try:
        pools = (load(path).pools if path is not None
                 else parse_pools(_pools_of_daemon(args.socket)))
    except (ConfigError, ConnectionError, TimeoutError) as exc:
        print(f"[ERROR] {exc}", file=sys.stderr)
        return 1
    return export(pools, args)


def _pools_of_daemon(socket: str | None) -> dict[str, dict[str, float]]:
    from nodeside.client import ControlClient

    with ControlClient(socket) as client:
        document = client.status()
    return {p["name"]: {k: p[k] for k in ("guarantee", "weight", "maximum")}
            for p in document["pools"]}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nodeside.kai priority CLASS`` prints the Kiwi priority of a KAI class;
    ``python -m nodeside.kai queues --config FILE`` prints the KAI Queues of a pool config."""
    from nodeside.config import ConfigError, load

    parser = argparse.ArgumentParser(prog="python -m nodeside.kai", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prio = sub.add_parser("priority", help="the Kiwi priority of a KAI priority class")
    prio.add_argument("kai_class")
    exp = sub.add_parser("queues", help="KAI Queues for a pool config")
    exp.add_argument("--config", required=True, help="a Kiwi config file (YAML or TOML)")
    add_export_arguments(exp)
    args = parser.parse_args(argv)
    if args.command == "priority":
        try:
            print(priority_for(args.kai_class))
        except UnknownPriorityClass as exc:
            print(f"[ERROR] {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        config = load(args.config)
    except ConfigError as exc:
        print(f"[ERROR] {exc}", file=sys.stderr)
        return 1
    return export(config.pools, args)


if __name__ == "__main__":
    sys.exit(main())
