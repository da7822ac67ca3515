"""The device plugin's parts on their own: the committed API stubs, vGPU ids and grants, and
the GPU inventory (NVML where a GPU exists)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nodeside.deviceplugin import vgpus
from nodeside.deviceplugin.gpus import FakeGpus, PhysicalGpu, read_unhealthy_file

REPO = Path(__file__).resolve().parents[2]
GPU_A = PhysicalGpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000")
GPU_B = PhysicalGpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000")


def test_committed_stubs_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed")
    from google.protobuf import descriptor_pb2

    from nodeside.deviceplugin.api import api_pb2

    out = tmp_path / "api.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".",
                    f"--descriptor_set_out={out}", "nodeside/deviceplugin/api/api.proto"],
                   cwd=REPO, check=True, timeout=60)
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    # The Python generator leaves out json_name; nothing else may differ.
    for message in [*fresh.message_type, *(n for m in fresh.message_type for n in m.nested_type)]:
        for fld in message.field:
            fld.ClearField("json_name")
    committed = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    assert committed == fresh, "api.proto changed: run nodeside/deviceplugin/api/regenerate.sh"


def test_the_api_keeps_the_kubelets_package_and_service_names():
    pytest.importorskip("grpc")
    from nodeside.deviceplugin.api import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert set(services) == {"Registration", "DevicePlugin"}
    assert set(services["DevicePlugin"].methods_by_name) == {
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer"}


def test_vgpu_ids_are_the_gpu_uuid_and_a_number():
    assert vgpus.vgpu_ids(GPU_A, 2) == [f"{GPU_A.uuid}::0", f"{GPU_A.uuid}::1"]
    assert vgpus.gpu_uuid_of(f"{GPU_A.uuid}::1") == GPU_A.uuid


def test_a_vgpu_id_longer_than_the_kubelet_allows_is_refused():
    long = PhysicalGpu(0, "GPU-" + "x" * 60)
    with pytest.raises(ValueError, match="63"):
        vgpus.vgpu_ids(long, 1)


def test_vgpus_of_two_gpus_make_both_visible_in_host_order():
    granted = vgpus.grant([f"{GPU_B.uuid}::0", f"{GPU_A.uuid}::3"], [GPU_A, GPU_B],
                          vgpus.Placement())
    assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A.uuid},{GPU_B.uuid}"
    assert granted.envs["KIWI_GPU"] == "0"


def test_several_vgpus_of_one_gpu_are_one_gpu_to_the_container():
    granted = vgpus.grant([f"{GPU_B.uuid}::0", f"{GPU_B.uuid}::1"], [GPU_A, GPU_B],
                          vgpus.Placement())
    assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B.uuid
    assert granted.envs["KIWI_GPU"] == "1"


def test_placement_puts_socket_and_shim_where_configured():
    placement = vgpus.Placement(kiwi_socket="/run/k/s.sock", socket_host_dir="/host/k",
                                shim_host_path="/h/shim.so", shim_container_path="/c/shim.so")
    granted = vgpus.grant([f"{GPU_A.uuid}::0"], [GPU_A], placement)
    assert granted.envs["KIWI_SOCKET"] == "/run/k/s.sock"
    assert granted.envs["LD_PRELOAD"] == "/c/shim.so"
    assert granted.mounts == [("/run/k", "/host/k", True), ("/c/shim.so", "/h/shim.so", True)]


def test_preferred_allocation_starts_from_the_required_vgpus_gpu():
    available = vgpus.vgpu_ids(GPU_A, 4) + vgpus.vgpu_ids(GPU_B, 2)
    chosen = vgpus.preferred(available, [f"{GPU_B.uuid}::0"], 2)
    assert chosen == [f"{GPU_B.uuid}::0", f"{GPU_B.uuid}::1"]


def test_unhealthy_file_names_gpus_by_uuid_or_index_and_ignores_others(tmp_path):
    gpus = FakeGpus(3).discover()
    path = tmp_path / "unhealthy"
    path.write_text(f"{gpus[0].uuid}\n2  # fan failure\nGPU-elsewhere\n\n")
    assert read_unhealthy_file(path, gpus) == {gpus[0].uuid, gpus[2].uuid}
    assert read_unhealthy_file(tmp_path / "missing", gpus) == set()


def test_fake_gpus_have_stable_distinct_uuids():
    first, second = FakeGpus(2).discover(), FakeGpus(2).discover()
    assert first == second and len({g.uuid for g in first}) == 2


@pytest.mark.gpu
def test_nvml_lists_this_nodes_gpus_healthy():
    from nodeside.deviceplugin.gpus import NvmlGpus

    source = NvmlGpus()
    try:
        gpus = source.discover()
        assert gpus and all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
        assert source.unhealthy() == set()
    finally:
        source.close()
