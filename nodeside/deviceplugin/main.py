"""``kiwi-device-plugin``: advertise each GPU of this node as ``--vgpus-per-gpu`` vGPUs."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

from nodeside.config import DEFAULT_SOCKET
from nodeside.deviceplugin.gpus import (
    FakeGpus,
    GpuDiscoveryError,
    GpuSource,
    NvmlGpus,
    read_unhealthy_file,
)
from nodeside.deviceplugin.vgpus import Placement

if TYPE_CHECKING:
    from nodeside.deviceplugin.service import VgpuBoard

log = logging.getLogger("kiwi-device-plugin")

DEFAULT_RESOURCE = "arrikto.com/gpu"
DEFAULT_VGPUS_PER_GPU = 10
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# An extended resource name: a DNS subdomain prefix, a slash, and a name.
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiwi-device-plugin", description=__doc__)
    p.add_argument("--resource-name", default=DEFAULT_RESOURCE,
                   help="extended resource to advertise (default %(default)s)")
    p.add_argument("--vgpus-per-gpu", type=int, default=DEFAULT_VGPUS_PER_GPU,
                   help="vGPUs advertised per physical GPU (default %(default)s)")
    p.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR,
                   help="the kubelet's device plugin directory (default %(default)s)")
    p.add_argument("--endpoint", default="kiwi.sock",
                   help="file name of this plugin's socket in that directory")
    p.add_argument("--kiwi-socket", default=DEFAULT_SOCKET,
                   help="the node daemon's socket as containers see it (KIWI_SOCKET)")
    p.add_argument("--kiwi-socket-host-dir", default="/var/run/kiwi",
                   help="the host directory holding the node daemon's socket")
    p.add_argument("--shim-host-path", default="/var/lib/kiwi/lib/libkiwi.so",
                   help="the CUDA shim on the host")
    p.add_argument("--shim-container-path", default="/usr/local/lib/kiwi/libkiwi.so",
                   help="where containers see the shim (LD_PRELOAD)")
    p.add_argument("--fake-gpus", type=int, metavar="N",
                   help="without NVML: advertise N made-up GPUs (for tests and dry runs)")
    p.add_argument("--unhealthy-file",
                   help="file naming GPUs (UUID or index, one per line) to report unhealthy")
    p.add_argument("--health-interval", type=float, default=5.0,
                   help="seconds between health checks (default %(default)s)")
    p.add_argument("--kubelet-poll", type=float, default=1.0,
                   help="seconds between checks for a restarted kubelet (default %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def watch_health(board: VgpuBoard, source: GpuSource, unhealthy_file: str | None,
                 interval: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            bad = source.unhealthy() | read_unhealthy_file(unhealthy_file, board.gpus)
        except Exception:  # a failing health probe must not take the plugin down
            log.exception("health check failed; keeping the last known health")
        else:
            board.set_unhealthy(bad)
        stop.wait(interval)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from nodeside.deviceplugin.kubelet import PluginLifecycle
        from nodeside.deviceplugin.service import DevicePluginService, VgpuBoard
    except ImportError as exc:  # grpcio/protobuf come with the k8s extra only
        print(f"kiwi-device-plugin: {exc}; install kiwi-jupyter[k8s]", file=sys.stderr)
        return 1
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="[%(levelname)s] %(name)s: %(message)s")
    if not _RESOURCE.match(args.resource_name):
        print(f"kiwi-device-plugin: --resource-name {args.resource_name!r} is not an extended "
              f"resource name such as {DEFAULT_RESOURCE}", file=sys.stderr)
        return 2
    if args.vgpus_per_gpu < 1 or args.health_interval <= 0 or args.kubelet_poll <= 0:
        print("kiwi-device-plugin: --vgpus-per-gpu, --health-interval and --kubelet-poll must "
              "be positive", file=sys.stderr)
        return 2
    try:
        source: GpuSource = (FakeGpus(args.fake_gpus) if args.fake_gpus is not None
                             else NvmlGpus())
        gpus = source.discover()
    except (GpuDiscoveryError, ValueError) as exc:
        print(f"kiwi-device-plugin: {exc}", file=sys.stderr)
        return 1
    if not gpus:
        print("kiwi-device-plugin: this node has no GPUs to share", file=sys.stderr)
        return 1
    board = VgpuBoard(gpus, args.vgpus_per_gpu)
    placement = Placement(kiwi_socket=args.kiwi_socket,
                          socket_host_dir=args.kiwi_socket_host_dir,
                          shim_host_path=args.shim_host_path,
                          shim_container_path=args.shim_container_path)
    lifecycle = PluginLifecycle(DevicePluginService(board, placement), args.device_plugin_dir,
                                args.endpoint, args.resource_name, poll=args.kubelet_poll)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()
        lifecycle.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("advertising %d GPU(s) x %d vGPUs as %s: %s", len(gpus), args.vgpus_per_gpu,
             args.resource_name, ", ".join(f"{g.index}={g.uuid}" for g in gpus))
    health = threading.Thread(target=watch_health, name="health", daemon=True,
                              args=(board, source, args.unhealthy_file, args.health_interval,
                                    stop))
    health.start()
    try:
        lifecycle.run()
    finally:
        stop.set()
        board.close()
        health.join(timeout=5)
        source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
