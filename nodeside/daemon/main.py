"""``kiwi-scheduler``: the node daemon, in the foreground, logging to stderr."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from nodeside import __version__, core
from nodeside.config import (
    DEFAULT_SOCKET,
    ConfigError,
    argument_type,
    load,
    parse_mode,
    parse_size,
    parse_tq,
)
from nodeside.daemon.gpus import discover
from nodeside.daemon.hostmem import MEMINFO, PROC
from nodeside.daemon.kube import PodSource, in_cluster_or_why_not
from nodeside.daemon.options import DaemonOptions
from nodeside.daemon.process_memory import nvml_process_memory
from nodeside.daemon.server import Daemon
from nodeside.daemon.utilization import nvml_reader
from nodeside.errors import DaemonError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiwi-scheduler",
        description="Arbitrate this node's GPUs between the processes that share them.")
    parser.add_argument("--socket", default=os.environ.get("KIWI_SOCKET", DEFAULT_SOCKET),
                        help="Unix socket to listen on (default: $KIWI_SOCKET or %(default)s)")
    parser.add_argument("--tq", type=argument_type(parse_tq),
                        help="time quantum in seconds (default 30)")
    parser.add_argument("--mode", type=argument_type(parse_mode),
                        help="on, off or auto (default on)")
    parser.add_argument("--config", help="YAML or TOML file with tq, mode and pools")
    parser.add_argument("--state-file", help="keep runtime changes (kiwictl -S/-T) here")
    parser.add_argument("--gpus", type=int, help="number of GPUs to manage (default: all NVML "
                        "finds, or 1 without NVML)")
    parser.add_argument("--gpu-memory", type=argument_type(parse_size),
                        help="GPU memory for scheduling, e.g. 80GiB (overrides NVML)")
    parser.add_argument("--grace", type=argument_type(parse_tq),
                        help="seconds a holder has to give the GPU back when asked (default 10)")
    parser.add_argument("--checkpoint-timeout", type=argument_type(parse_tq),
                        help="seconds the driver's checkpoint or restore of a process may take "
                        "before the daemon gives up on it (default 120)")
    parser.add_argument("--cuda-library", default=os.environ.get("KIWI_CUDA_LIBRARY",
                                                                 "libcuda.so.1"),
                        help="CUDA driver whose checkpoint API suspends processes that "
                        "register with evict checkpoint (default: $KIWI_CUDA_LIBRARY or "
                        "%(default)s)")
    parser.add_argument("--admin-group", help="group whose members may change mode and TQ")
    parser.add_argument("--socket-group", help="group that owns the socket")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-address", default="127.0.0.1",
                        help="address for --metrics-port (default %(default)s; in a pod, "
                        "its IP: docs/kubernetes.md)")
    parser.add_argument("--metrics-pod-labels", action="store_true",
                        help="label per-client metrics with their pod and namespace (shown to "
                        "whoever reaches the metrics port)")
    parser.add_argument("--log-level", default=os.environ.get("KIWI_LOG_LEVEL", "INFO"),
                        type=str.upper, choices=["DEBUG", "INFO", "WARN", "WARNING", "ERROR"])
    # For tests only, so hidden: a fake /proc keyed by real peer pids, a meminfo whose
    # MemAvailable a test moves, and a stand-in API server on plain HTTP without a token
    # (docs/policy.md, "Namespaces").
    parser.add_argument("--proc-root", type=Path, default=PROC, help=argparse.SUPPRESS)
    parser.add_argument("--meminfo", type=Path, default=MEMINFO, help=argparse.SUPPRESS)
    parser.add_argument("--kube-api", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version",
                        version=f"kiwi-scheduler {__version__}, scheduler core {core()}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    log = logging.getLogger("kiwi.daemon")
    log.info("kiwi-scheduler %s: scheduler core %s", __version__, core())
    overrides: dict[str, Any] = {k: v for k, v in {
        "tq": args.tq, "mode": args.mode, "grace": args.grace,
        "checkpoint_timeout": args.checkpoint_timeout,
        "admin_group": args.admin_group, "socket_group": args.socket_group,
    }.items() if v is not None}
    try:
        config = load(args.config).with_runtime(**overrides)
    except ConfigError as exc:
        log.error("Bad configuration: %s", exc)
        return 2
    if args.gpus is not None and args.gpus < 1:
        log.error("--gpus must be at least 1")
        return 2
    _raise_open_file_limit()
    gpus, memory_used = discover(args.gpus, args.gpu_memory)
    pods, pods_off = _pod_source(args)
    options = DaemonOptions(socket=args.socket, config=config, gpus=gpus,
                            memory_used=memory_used, config_file=args.config,
                            overrides=overrides, state_file=args.state_file,
                            cuda_library=args.cuda_library, pods=pods, pods_off=pods_off,
                            proc_root=args.proc_root, meminfo=args.meminfo,
                            process_utilization=nvml_reader(gpus),
                            process_memory=nvml_process_memory(gpus))
    try:
        event_loop_runner()(_run(options, args))
    except DaemonError as exc:
        log.error("%s", exc)
        return 1
    except (PermissionError, ValueError) as exc:
        log.error("Cannot start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _pod_source(args: argparse.Namespace) -> tuple[PodSource | None, str | None]:
    """The in-cluster API server when the daemon runs in a pod (or why it cannot list pods);
    ``--kube-api`` in tests."""
    if args.kube_api:
        return PodSource(args.kube_api, os.environ.get("NODE_NAME", "")), None
    return in_cluster_or_why_not(os.environ)


def event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's runner where uvloop is installed, else asyncio's.

    A handoff is mostly the event loop waking up, reading one line and writing another, and
    uvloop does that part in C (in-process timing: about 40 microseconds less per handoff on a
    busy 2-core VM). The ``fast`` extra installs it. The plain loop behaves the same, only
    slower; KIWI_EVENT_LOOP=asyncio asks for it.
    """
    if os.environ.get("KIWI_EVENT_LOOP", "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run
    return asyncio.run


def _raise_open_file_limit() -> None:
    # One descriptor per client: a busy node has more kernels than the usual soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _run(options: DaemonOptions, args: argparse.Namespace) -> None:
    daemon = Daemon(options)
    if args.metrics_port is not None:
        from nodeside.metrics import serve_metrics

        await serve_metrics(daemon, args.metrics_port, args.metrics_address,
                            args.metrics_pod_labels)
    await daemon.serve_forever()


def setup_logging(level: str) -> None:
    # The seed's operations guide tells admins to look for lines like
    # "[INFO] Scheduler status changed to ON, broadcasting it ...": keep that shape.
    logging.addLevelName(logging.WARNING, "WARN")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    root = logging.getLogger("kiwi")
    root.handlers[:] = [handler]
    root.setLevel("WARNING" if level == "WARN" else level)
    root.propagate = False
