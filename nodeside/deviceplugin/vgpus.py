"""vGPUs: the devices the kubelet sees, and what a container is given when it gets some.

A vGPU id is the physical GPU's UUID with the vGPU's number after ``::`` (the convention of
NVIDIA's time-slicing plugin), so the kubelet's checkpoint names the GPU a pod got and the id
stays stable across plugin restarts and GPU re-enumeration. Pure functions: no gRPC, no NVML.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nodeside.deviceplugin.gpus import PhysicalGpu

SEPARATOR = "::"
#: The kubelet rejects device ids longer than this.
MAX_ID_LENGTH = 63


class UnknownDeviceError(KeyError):
    """The kubelet asked for a vGPU this plugin does not advertise."""

    def __str__(self) -> str:
        return f"unknown vGPU id {self.args[0]!r}: not advertised by this plugin"


def vgpu_id(gpu: PhysicalGpu, number: int) -> str:
    return f"{gpu.uuid}{SEPARATOR}{number}"


def vgpu_ids(gpu: PhysicalGpu, per_gpu: int) -> list[str]:
    ids = [vgpu_id(gpu, n) for n in range(per_gpu)]
    too_long = [i for i in ids if len(i) > MAX_ID_LENGTH]
    if too_long:
        raise ValueError(f"vGPU id {too_long[0]!r} is longer than the kubelet's "
                         f"{MAX_ID_LENGTH} characters")
    return ids


def gpu_uuid_of(vgpu: str) -> str:
    uuid, sep, number = vgpu.rpartition(SEPARATOR)
    if not sep or not uuid or not number.isdigit():
        raise UnknownDeviceError(vgpu)
    return uuid


@dataclass(frozen=True)
class Placement:
    """Where the pieces a shared-GPU container needs are, on the host and inside the container."""

    #: The node daemon's socket as the container sees it (KIWI_SOCKET).
    kiwi_socket: str = "/var/run/kiwi/scheduler.sock"
    #: The host directory holding the daemon's socket (the scheduler DaemonSet's hostPath).
    socket_host_dir: str = "/var/run/kiwi"
    #: The CUDA shim on the host (put there by the device plugin DaemonSet's init container).
    shim_host_path: str = "/var/lib/kiwi/lib/libkiwi.so"
    #: Where the shim appears inside the container (LD_PRELOAD).
    shim_container_path: str = "/usr/local/lib/kiwi/libkiwi.so"

    @property
    def socket_container_dir(self) -> str:
        return self.kiwi_socket.rsplit("/", 1)[0] or "/"


@dataclass(frozen=True)
class ContainerGrant:
    """What the kubelet must give a container for the vGPUs it was allocated."""

    envs: dict[str, str]
    #: (container path, host path, read only)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)


def grant(vgpus: Sequence[str], gpus: Iterable[PhysicalGpu], placement: Placement
          ) -> ContainerGrant:
    """The environment and mounts for a container allocated ``vgpus``.

    Several vGPUs of one GPU are one GPU to the container (more vGPUs only reserve more of the
    node's sharing slots); vGPUs of several GPUs make all of them visible, in host index order.
    """
    by_uuid = {g.uuid: g for g in gpus}
    chosen: dict[str, PhysicalGpu] = {}
    for vgpu in vgpus:
        uuid = gpu_uuid_of(vgpu)
        if uuid not in by_uuid:
            raise UnknownDeviceError(vgpu)
        chosen[uuid] = by_uuid[uuid]
    if not chosen:
        raise ValueError("an allocation needs at least one vGPU")
    ordered = sorted(chosen.values(), key=lambda g: g.index)
    envs = {
        "KIWI_SOCKET": placement.kiwi_socket,
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in ordered),
        # The daemon numbers GPUs by host index; inside the container the GPU is device 0, so
        # the client must be told which host GPU it is queueing for.
        "KIWI_GPU": str(ordered[0].index),
        "LD_PRELOAD": placement.shim_container_path,
    }
    mounts = [
        # Read-only is enough: connect(2) on a Unix socket is allowed on a read-only mount, and
        # it keeps a pod from replacing the socket with its own.
        (placement.socket_container_dir, placement.socket_host_dir, True),
        (placement.shim_container_path, placement.shim_host_path, True),
    ]
    return ContainerGrant(envs=envs, mounts=mounts)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """A preferred allocation of ``size`` vGPUs: the required ones, then as few GPUs as possible,
    starting with the GPU that has the most free vGPUs.

    One container's vGPUs packed on one GPU keep it to one GPU; new containers landing on the
    emptiest GPU keep each GPU's queue short. The kubelet may ignore the advice.
    """
    chosen = list(dict.fromkeys(must_include))
    free_by_gpu: dict[str, list[str]] = {}
    for vgpu in available:
        if vgpu not in chosen:
            free_by_gpu.setdefault(gpu_uuid_of(vgpu), []).append(vgpu)
    required_gpus = {gpu_uuid_of(v) for v in chosen}
    order = sorted(free_by_gpu, key=lambda u: (u not in required_gpus, -len(free_by_gpu[u]), u))
    for uuid in order:
        for vgpu in free_by_gpu[uuid]:
            if len(chosen) >= size:
                return chosen
            chosen.append(vgpu)
    return chosen
