"""A client in a pod finds its pool and its GPU in the environment the device plugin and the
notebook pod template give it."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")

from nodeside.client import Client  # noqa: E402
from nodeside.deviceplugin.gpus import FakeGpus  # noqa: E402
from nodeside.deviceplugin.vgpus import Placement, grant, vgpu_id  # noqa: E402


def test_a_pod_on_the_second_gpu_queues_on_the_second_gpu(start_daemon, monkeypatch):
    daemon = start_daemon("--gpus", "2", "--tq", "5")
    gpus = FakeGpus(2).discover()
    granted = grant([vgpu_id(gpus[1], 0)], gpus, Placement(kiwi_socket=daemon.socket))
    for name, value in granted.envs.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KIWI_POOL", "training")  # from the kai.scheduler/queue label

    with Client() as client, client.hold():
        status = client.status()
    [me] = [c for c in status["clients"] if c["id"] == client.id]
    assert me["gpu"] == 1 and me["pool"] == "training"
    assert status["gpus"][1]["holders"] == [client.id]
    assert status["gpus"][0]["holders"] == []


def test_an_empty_queue_label_means_the_default_pool(start_daemon, monkeypatch):
    daemon = start_daemon()
    monkeypatch.setenv("KIWI_SOCKET", daemon.socket)
    monkeypatch.setenv("KIWI_POOL", "")  # the downward API's value for a missing label
    with Client() as client:
        assert client.pool == "default"
