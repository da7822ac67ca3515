"""The gRPC DevicePlugin service the kubelet calls, and the board of vGPUs it reports from.

``VgpuBoard`` is the one place that knows every vGPU and its health; the health monitor writes to
it and every ListAndWatch stream waits on it, so a health change reaches all streams at once.

Each ListAndWatch stream holds one of the server's worker threads for as long as it is open, so
a peer may hold at most ``MAX_STREAMS_PER_PEER`` of them: the kubelet keeps one (and, while it
restarts, briefly a second); a stream past that is refused with RESOURCE_EXHAUSTED and one log
line, and the other workers stay free for Allocate. gRPC names every peer of a Unix socket
alike, so on the kubelet's socket the bound holds for all peers together.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from nodeside.deviceplugin import vgpus
from nodeside.deviceplugin.api import api_pb2, api_pb2_grpc
from nodeside.deviceplugin.gpus import PhysicalGpu

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: ListAndWatch streams one peer may keep open at once.
MAX_STREAMS_PER_PEER = 2
#: Worker threads for unary calls (Allocate, GetPreferredAllocation, ...) beside the streams.
UNARY_WORKERS = 6


class VgpuBoard:
    """The advertised vGPUs and the set of unhealthy physical GPUs, with change notification."""

    def __init__(self, gpus: Sequence[PhysicalGpu], per_gpu: int) -> None:
        if per_gpu < 1:
            raise ValueError("--vgpus-per-gpu must be at least 1")
        self.gpus = list(gpus)
        self._ids = {g.uuid: vgpus.vgpu_ids(g, per_gpu) for g in self.gpus}
        self._unhealthy: frozenset[str] = frozenset()
        self._version = 0
        self._closed = False
        self._changed = threading.Condition()

    def set_unhealthy(self, uuids: set[str]) -> bool:
        """Record which GPUs are unhealthy; True when that changed what the kubelet sees."""
        new = frozenset(uuids) & self._ids.keys()
        with self._changed:
            if new == self._unhealthy:
                return False
            for uuid in sorted(new - self._unhealthy):
                log.warning("GPU %s is unhealthy: its vGPUs are withdrawn", uuid)
            for uuid in sorted(self._unhealthy - new):
                log.info("GPU %s is healthy again", uuid)
            self._unhealthy = new
            self._version += 1
            self._changed.notify_all()
            return True

    def close(self) -> None:
        """End every ListAndWatch stream (the server is going away)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def snapshot(self) -> tuple[int, list[api_pb2.Device]]:
        with self._changed:
            unhealthy, version = self._unhealthy, self._version
        devices = [api_pb2.Device(ID=vgpu, health=UNHEALTHY if uuid in unhealthy else HEALTHY)
                   for uuid, ids in self._ids.items() for vgpu in ids]
        return version, devices

    def wait_for_change(self, seen: int, timeout: float) -> bool:
        """Wait until the board moves past version ``seen``; False on timeout or close."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen or self._closed, timeout)
            return self._version != seen and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def knows(self, vgpu: str) -> bool:
        try:
            return vgpu in self._ids.get(vgpus.gpu_uuid_of(vgpu), ())
        except vgpus.UnknownDeviceError:
            return False


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, board: VgpuBoard, placement: vgpus.Placement,
                 max_streams_per_peer: int = MAX_STREAMS_PER_PEER) -> None:
        self.board = board
        self.placement = placement
        self.max_streams_per_peer = max_streams_per_peer
        #: Open ListAndWatch streams per peer.
        self._streams: Counter[str] = Counter()
        self._streams_lock = threading.Lock()

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: Any
                               ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False,
                                           get_preferred_allocation_available=True)

    def ListAndWatch(self, request: api_pb2.Empty, context: Any
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        peer = context.peer() or "unknown"
        with self._streams_lock:
            if self._streams[peer] >= self.max_streams_per_peer:
                refused = True
            else:
                self._streams[peer] += 1
                refused = False
        if refused:
            log.warning("refused a ListAndWatch stream from %s: it has %d open already, the "
                        "most one peer may hold", peer, self.max_streams_per_peer)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"at most {self.max_streams_per_peer} ListAndWatch streams per peer")
        closed = threading.Event()

        def close() -> None:  # once, whether the peer hangs up or the stream ends here
            with self._streams_lock:
                if closed.is_set():
                    return
                closed.set()
                self._streams[peer] -= 1
                if not self._streams[peer]:
                    del self._streams[peer]

        # The slot is free the moment the peer hangs up, not at the stream's next wake-up.
        context.add_callback(close)
        try:
            yield from self._watch(context)
        finally:
            close()

    def _watch(self, context: Any) -> Iterator[api_pb2.ListAndWatchResponse]:
        version, devices = self.board.snapshot()
        log.info("kubelet is watching %d vGPUs", len(devices))
        yield api_pb2.ListAndWatchResponse(devices=devices)
        # Wake up now and then to notice a kubelet that went away without closing the stream.
        while context.is_active() and not self.board.closed:
            if self.board.wait_for_change(version, timeout=1.0):
                version, devices = self.board.snapshot()
                yield api_pb2.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest, context: Any
                               ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for ask in request.container_requests:
            try:
                ids = vgpus.preferred(list(ask.available_deviceIDs),
                                      list(ask.must_include_deviceIDs), ask.allocation_size)
            except vgpus.UnknownDeviceError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: api_pb2.AllocateRequest, context: Any
                 ) -> api_pb2.AllocateResponse:
        responses = []
        for ask in request.container_requests:
            ids = list(ask.devices_ids)
            unknown = [i for i in ids if not self.board.knows(i)]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              str(vgpus.UnknownDeviceError(unknown[0])))
            try:
                granted = vgpus.grant(ids, self.board.gpus, self.placement)
            except (ValueError, vgpus.UnknownDeviceError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            log.info("allocated %s -> NVIDIA_VISIBLE_DEVICES=%s", ",".join(ids),
                     granted.envs["NVIDIA_VISIBLE_DEVICES"])
            responses.append(api_pb2.ContainerAllocateResponse(
                envs=granted.envs,
                mounts=[api_pb2.Mount(container_path=c, host_path=h, read_only=ro)
                        for c, h, ro in granted.mounts]))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: Any
                          ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
