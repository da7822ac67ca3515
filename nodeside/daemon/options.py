"""What the daemon is started with (``main.py`` builds it from the command line, the config
file and the node).

Kept apart from the shell (``server.py``) that runs on them: the entry point, the metrics
server and the benchmarks name these without the running daemon's parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeside.config import SchedulerConfig
from nodeside.daemon.hostmem import MEMINFO, PROC
from nodeside.daemon.kube import PodSource
from nodeside.scheduler.core import GpuSpec


@dataclass
class DaemonOptions:
    socket: str
    config: SchedulerConfig
    gpus: list[GpuSpec]
    memory_used: Callable[[], dict[int, int | None]] = dict
    config_file: str | None = None
    #: The command line's settings, laid over the config file again on every reload.
    overrides: dict[str, Any] = field(default_factory=dict)
    state_file: str | None = None
    #: The driver whose checkpoint API suspends processes registered with evict "checkpoint".
    cuda_library: str = "libcuda.so.1"
    #: Where this node's pods are listed, for the namespaces in the access policy; None: not on
    #: Kubernetes (or not asked), and no peer has a namespace.
    pods: PodSource | None = None
    #: Why a daemon in a Kubernetes pod cannot verify namespaces (``pods`` is then None): the
    #: namespaces component is not deployed. None outside Kubernetes, or when it can.
    pods_off: str | None = None
    #: Where peers' ``<pid>/cgroup`` files are read. Only tests point it elsewhere.
    proc_root: Path = PROC
    #: Where the host's MemAvailable is read for the host budget. Only tests point it elsewhere.
    meminfo: Path = MEMINFO
    #: Reads each process's use of each GPU as NVML samples it (utilization.py), for the pause
    #: watch (pause_watch.py); None where NVML cannot.
    process_utilization: Callable[[], Sequence[tuple[int, int, float, int]]] | None = None
    #: Reads each compute process's used GPU memory as NVML counts it (process_memory.py), to
    #: check what memory clients report; None where NVML cannot.
    process_memory: Callable[[], Sequence[tuple[int, int, int | None]]] | None = None
