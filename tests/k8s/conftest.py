"""Fixtures for the Kubernetes tests: a kubelet stand-in and a running kiwi-device-plugin."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the k8s extra (grpcio) is not installed")

from k8s_standins import KubeletStandIn, PluginProcess  # noqa: E402

StartPlugin = Callable[..., PluginProcess]


@pytest.fixture
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Unix socket paths must stay under ~100 bytes; mktemp gives a short one.
    path = tmp_path_factory.mktemp("dp") / "device-plugins"
    path.mkdir()
    assert len(str(path / "kubelet.sock")) < 100
    return path


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(plugin_dir)
    stand_in.start()
    yield stand_in
    stand_in.stop()


@pytest.fixture
def start_plugin(plugin_dir: Path) -> Iterator[StartPlugin]:
    started: list[PluginProcess] = []

    def start(*args: str) -> PluginProcess:
        plugin = PluginProcess(plugin_dir, list(args))
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        exited_by_itself = plugin.proc.poll() is not None  # the test has checked its status
        code = plugin.stop()
        assert exited_by_itself or code == 0, f"plugin exited with {code}:\n{plugin.log}"


@pytest.fixture
def plugin(kubelet: KubeletStandIn, start_plugin: StartPlugin) -> PluginProcess:
    """A plugin with 2 fake GPUs x 3 vGPUs, registered with the stand-in."""
    running = start_plugin("--fake-gpus", "2", "--vgpus-per-gpu", "3")
    kubelet.next_registration()
    return running
