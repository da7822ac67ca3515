"""kiwi-device-plugin against a kubelet stand-in speaking the device plugin API v1beta1."""

from __future__ import annotations

from collections import Counter

import pytest

grpc = pytest.importorskip("grpc")

from k8s_standins import DEADLINE, KubeletStandIn, PluginProcess  # noqa: E402
from support import wait_for  # noqa: E402

from nodeside.deviceplugin.api import api_pb2  # noqa: E402
from nodeside.deviceplugin.main import build_parser  # noqa: E402


def _devices(response: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in response.devices}


def _gpu(vgpu: str) -> str:
    return vgpu.rpartition("::")[0]


def test_defaults_are_arrikto_gpu_and_ten_vgpus_per_gpu():
    args = build_parser().parse_args([])
    assert args.resource_name == "arrikto.com/gpu"
    assert args.vgpus_per_gpu == 10


def test_plugin_registers_its_resource_and_socket_with_the_kubelet(kubelet, start_plugin):
    start_plugin("--fake-gpus", "1", "--resource-name", "example.com/vgpu")
    request = kubelet.next_registration()
    assert request.version == "v1beta1"
    assert request.resource_name == "example.com/vgpu"
    assert request.endpoint == "kiwi.sock"
    assert request.options.get_preferred_allocation_available
    assert (kubelet.plugin_dir / request.endpoint).is_socket()


def test_plugin_waits_for_a_kubelet_that_is_not_up_yet(plugin_dir, start_plugin):
    start_plugin("--fake-gpus", "1")
    late = KubeletStandIn(plugin_dir)
    late.start()
    try:
        assert late.next_registration().resource_name == "arrikto.com/gpu"
    finally:
        late.stop()


def test_get_device_plugin_options_offers_preferred_allocation_without_prestart(
        kubelet, plugin):
    options = kubelet.dial("kiwi.sock").GetDevicePluginOptions(api_pb2.Empty(),
                                                               timeout=DEADLINE)
    assert options.get_preferred_allocation_available is True
    assert options.pre_start_required is False


def test_list_and_watch_advertises_vgpus_per_gpu_with_ids_from_the_gpu_uuid(kubelet, plugin):
    stream = kubelet.dial("kiwi.sock").ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    devices = _devices(next(stream))
    stream.cancel()
    per_gpu = Counter(_gpu(i) for i in devices)
    assert len(per_gpu) == 2 and set(per_gpu.values()) == {3}
    assert all(uuid.startswith("GPU-") for uuid in per_gpu)
    assert {i.rpartition("::")[2] for i in devices} == {"0", "1", "2"}
    assert set(devices.values()) == {"Healthy"}


def test_unhealthy_gpu_marks_its_vgpus_unhealthy_on_the_stream_and_recovers(kubelet, plugin):
    stream = kubelet.dial("kiwi.sock").ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    first = _devices(next(stream))
    sick = sorted({_gpu(i) for i in first})[1]

    plugin.unhealthy_file.write_text(f"# drained for maintenance\n{sick}\n")
    update = _devices(next(stream))
    assert {i for i, h in update.items() if h == "Unhealthy"} == {
        i for i in first if _gpu(i) == sick}
    assert all(h == "Healthy" for i, h in update.items() if _gpu(i) != sick)

    plugin.unhealthy_file.write_text("")
    assert set(_devices(next(stream)).values()) == {"Healthy"}
    stream.cancel()


def test_unhealthy_file_also_accepts_a_gpu_index(kubelet, plugin):
    stream = kubelet.dial("kiwi.sock").ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    next(stream)
    plugin.unhealthy_file.write_text("0\n")
    update = next(stream)
    stream.cancel()
    assert len({_gpu(d.ID) for d in update.devices if d.health == "Unhealthy"}) == 1
    assert "GPU-00000000-0000-0000-0000-000000000001" in plugin.log  # logged at start


def test_allocate_points_the_container_at_the_daemon_socket_its_gpu_and_the_shim(
        kubelet, plugin):
    stub = kubelet.dial("kiwi.sock")
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    vgpus = sorted(_devices(next(stream)))
    stream.cancel()
    second_gpu = [v for v in vgpus if _gpu(v) == _gpu(vgpus[-1])][:2]

    response = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=second_gpu)]), timeout=DEADLINE)

    [container] = response.container_responses
    assert dict(container.envs) == {
        "KIWI_SOCKET": "/var/run/kiwi/scheduler.sock",
        "NVIDIA_VISIBLE_DEVICES": _gpu(vgpus[-1]),
        "KIWI_GPU": "1",
        "LD_PRELOAD": "/usr/local/lib/kiwi/libkiwi.so",
    }
    mounts = {m.container_path: (m.host_path, m.read_only) for m in container.mounts}
    assert mounts == {
        "/var/run/kiwi": ("/var/run/kiwi", True),
        "/usr/local/lib/kiwi/libkiwi.so": ("/var/lib/kiwi/lib/libkiwi.so", True),
    }


def test_allocate_answers_each_container_of_a_pod(kubelet, plugin):
    stub = kubelet.dial("kiwi.sock")
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    by_gpu: dict[str, list[str]] = {}
    for vgpu in sorted(_devices(next(stream))):
        by_gpu.setdefault(_gpu(vgpu), []).append(vgpu)
    stream.cancel()
    first, second = sorted(by_gpu)

    response = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=by_gpu[first][:1]),
        api_pb2.ContainerAllocateRequest(devices_ids=by_gpu[second][:1])]), timeout=DEADLINE)

    visible = [c.envs["NVIDIA_VISIBLE_DEVICES"] for c in response.container_responses]
    assert visible == [first, second]


def test_allocate_refuses_a_vgpu_the_plugin_never_advertised(kubelet, plugin):
    stub = kubelet.dial("kiwi.sock")
    with pytest.raises(grpc.RpcError) as refused:
        stub.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=["GPU-not-on-this-node::0"])]),
            timeout=DEADLINE)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-not-on-this-node::0" in refused.value.details()


def test_preferred_allocation_keeps_one_container_on_the_emptiest_gpu(kubelet, plugin):
    stub = kubelet.dial("kiwi.sock")
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    vgpus = sorted(_devices(next(stream)))
    stream.cancel()
    busy, idle = sorted({_gpu(v) for v in vgpus})
    # One vGPU of `busy` is taken already: `idle` has more free vGPUs.
    available = [v for v in vgpus if v != f"{busy}::0"]

    response = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
        container_requests=[api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, allocation_size=2)]), timeout=DEADLINE)

    [chosen] = response.container_responses
    assert len(chosen.deviceIDs) == 2
    assert {_gpu(v) for v in chosen.deviceIDs} == {idle}


def test_recreated_kubelet_socket_makes_the_plugin_register_again(kubelet, plugin):
    kubelet.stop()  # the kubelet restarts: its socket disappears ...
    kubelet.start()  # ... and a new one appears at the same path
    again = kubelet.next_registration()
    assert again.resource_name == "arrikto.com/gpu"
    # and the plugin's socket answers the new kubelet
    stream = kubelet.dial(again.endpoint).ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    assert len(next(stream).devices) == 6
    stream.cancel()


def test_plugin_socket_wiped_by_the_kubelet_is_served_and_registered_again(kubelet, plugin):
    (kubelet.plugin_dir / "kiwi.sock").unlink()
    again = kubelet.next_registration()
    options = kubelet.dial(again.endpoint).GetDevicePluginOptions(api_pb2.Empty(),
                                                                  timeout=DEADLINE)
    assert options.get_preferred_allocation_available


def test_plugin_stops_cleanly_on_sigterm_and_removes_its_socket(kubelet, plugin: PluginProcess):
    assert plugin.stop() == 0
    assert "stopping" in plugin.log
    assert not (kubelet.plugin_dir / "kiwi.sock").exists()


def test_plugin_refuses_a_malformed_resource_name(start_plugin):
    plugin = start_plugin("--fake-gpus", "1", "--resource-name", "no-slash")
    assert plugin.proc.wait(timeout=DEADLINE) == 2
    assert "not an extended resource name" in plugin.log


def test_streams_past_the_bound_are_refused_and_allocate_is_still_served(kubelet, plugin):
    """Issue 34.10: seven extra ListAndWatch streams once took every worker thread, and
    Allocate timed out."""
    stub = kubelet.dial("kiwi.sock")
    streams, advertised, refused = [], [], []
    for _ in range(8):
        stream = stub.ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
        try:
            advertised.append(sorted(_devices(next(stream))))
            streams.append(stream)
        except grpc.RpcError as exc:
            refused.append(exc.code())
    try:
        assert len(streams) == 2
        assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 6
        response = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=advertised[0][:1])]), timeout=5)
        assert len(response.container_responses) == 1
        assert plugin.log.count("refused a ListAndWatch stream") == 6
    finally:
        for stream in streams:
            stream.cancel()
    # A slot is free again as soon as its stream is gone.
    again = wait_for(lambda: _open(stub), what="a stream slot to free")
    again.cancel()


def _open(stub):
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=DEADLINE)
    try:
        next(stream)
    except grpc.RpcError:
        return None
    return stream
