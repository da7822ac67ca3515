"""Stand-ins for the Kubernetes tests: a kubelet and a running kiwi-device-plugin.

The stand-in is a real gRPC server built from the same proto as the plugin, serving the kubelet's
Registration service on ``kubelet.sock`` in a device plugin directory of its own; the plugin is a
real ``kiwi-device-plugin`` process with fake GPUs serving its socket in the same directory.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc

from nodeside.deviceplugin.api import api_pb2, api_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 20.0


class KubeletStandIn(api_pb2_grpc.RegistrationServicer):
    """The kubelet's side of the device plugin API: accepts registrations and dials plugins."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: queue.Queue[api_pb2.RegisterRequest] = queue.Queue()
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []

    @property
    def socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
                 ) -> api_pb2.Empty:
        if request.version != "v1beta1":  # as the real kubelet does
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unsupported API version {request.version}")
        self.registrations.put(request)
        return api_pb2.Empty()

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """Go away as a restarting kubelet does: stop serving and remove the socket."""
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)
        for channel in self._channels:
            channel.close()
        self._channels.clear()

    def next_registration(self, timeout: float = DEADLINE) -> api_pb2.RegisterRequest:
        try:
            return self.registrations.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no registration within {timeout:g}s") from None

    def dial(self, endpoint: str) -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channels.append(channel)
        grpc.channel_ready_future(channel).result(timeout=DEADLINE)
        return api_pb2_grpc.DevicePluginStub(channel)


class PluginProcess:
    def __init__(self, plugin_dir: Path, args: list[str]) -> None:
        self.plugin_dir = plugin_dir
        self.log_path = plugin_dir.parent / "plugin.log"
        self.unhealthy_file = plugin_dir.parent / "unhealthy"
        cmd = [sys.executable, "-m", "nodeside.deviceplugin",
               "--device-plugin-dir", str(plugin_dir), "--unhealthy-file",
               str(self.unhealthy_file), "--health-interval", "0.05", "--kubelet-poll", "0.05",
               *args]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        """SIGTERM the plugin and return its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
