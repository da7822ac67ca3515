"""Serving the plugin socket and registering with the kubelet, again whenever the kubelet restarts.

A restarting kubelet recreates ``kubelet.sock`` and wipes the other sockets in its device plugin
directory, ours included, and forgets every plugin. So the lifecycle watches two things: the
identity of ``kubelet.sock`` (inode and change time, since a recreated file may get the old inode
number back) and the existence of our own socket. When either changes, the plugin serves a fresh
socket and registers again. Polling keeps this free of inotify and works on any filesystem.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from pathlib import Path

import grpc

from nodeside.deviceplugin.api import api_pb2, api_pb2_grpc
from nodeside.deviceplugin.service import UNARY_WORKERS, DevicePluginService

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(RuntimeError):
    """The kubelet did not accept the registration; the message carries its reason."""


def register(kubelet_socket: Path, endpoint: str, resource_name: str,
             timeout: float = 5.0) -> None:
    """Tell the kubelet that ``resource_name`` is served on ``endpoint`` (a file name in the
    kubelet's device plugin directory)."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=endpoint, resource_name=resource_name,
                    options=api_pb2.DevicePluginOptions(
                        pre_start_required=False, get_preferred_allocation_available=True)),
                timeout=timeout)
        except grpc.FutureTimeoutError:
            raise RegistrationError(f"the kubelet at {kubelet_socket} did not answer within "
                                    f"{timeout:g}s") from None
        except grpc.RpcError as exc:
            raise RegistrationError(f"the kubelet refused {resource_name}: "
                                    f"{exc.code().name}: {exc.details()}") from None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


class PluginLifecycle:
    """Keeps the plugin served and registered until ``stop()``."""

    def __init__(self, service: DevicePluginService, plugin_dir: str | os.PathLike[str],
                 endpoint: str, resource_name: str, poll: float = 1.0) -> None:
        self.service = service
        self.plugin_dir = Path(plugin_dir)
        self.endpoint = endpoint
        self.resource_name = resource_name
        self.poll = poll
        self.registrations = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    def run(self) -> None:
        registered_with: tuple[int, int] | None = None
        waiting_logged = False
        try:
            while not self._stop.is_set():
                kubelet = _identity(self.kubelet_socket)
                if kubelet is None:
                    if not waiting_logged:
                        log.info("waiting for the kubelet socket %s", self.kubelet_socket)
                        waiting_logged = True
                    registered_with = None
                elif kubelet != registered_with or not self.socket_path.exists():
                    waiting_logged = False
                    registered_with = self._serve_and_register(kubelet)
                self._stop.wait(self.poll)
        finally:
            self._stop_server()
            # Leave no socket behind for the kubelet to dial after we are gone.
            self.socket_path.unlink(missing_ok=True)

    def stop(self) -> None:
        self._stop.set()

    def _serve_and_register(self, kubelet: tuple[int, int]) -> tuple[int, int] | None:
        # Serve a fresh socket each time: the kubelet may have deleted ours, and it dials the
        # endpoint as soon as it accepts the registration.
        self._serve()
        try:
            register(self.kubelet_socket, self.endpoint, self.resource_name)
        except RegistrationError as exc:
            log.error("%s; retrying", exc)
            return None
        self.registrations += 1
        log.info("registered %s with the kubelet, serving %s", self.resource_name,
                 self.socket_path)
        return kubelet

    def _serve(self) -> None:
        self._stop_server()
        self.socket_path.unlink(missing_ok=True)
        # A worker per ListAndWatch stream the service lets a peer open (the kubelet keeps
        # one, and a second while a stale one winds down), and the rest for Allocate and the
        # other unary calls, which no number of streams can then take.
        workers = self.service.max_streams_per_peer + UNARY_WORKERS
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                        thread_name_prefix="deviceplugin"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
