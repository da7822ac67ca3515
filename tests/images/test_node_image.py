"""The node image started: its three programs run, the compiled scheduler core among them, and
its CUDA shim, where the device plugin's DaemonSet installs it from, gates a process on the fake
CUDA driver under the image's own scheduler."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from image_containers import NODE_IMAGE, REPO, TESTS_INSIDE, Container, container_of
from shim.shim_harness import build_fake_cuda
from support import scaled

FAKE_DRIVER_INSIDE = "/kiwi-fake-cuda"
pytestmark = pytest.mark.timeout(scaled(240))


def shim_installed_from() -> str:
    """The path the device plugin's init container copies the shim from, in the node image."""
    daemonset = yaml.safe_load((REPO / "nodeside/deploy/device-plugin-daemonset.yaml").read_text())
    [init] = daemonset["spec"]["template"]["spec"]["initContainers"]
    assert init["image"].split(":")[0] == "kiwi-node"
    copy = next(c for c in init["command"][-1].split("&&") if c.split()[0] == "cp")
    return shlex.split(copy)[1]


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fakecuda")
    directory.chmod(0o755)  # for the image's user, who is not this one
    return build_fake_cuda(directory)


@pytest.fixture(scope="module")
def node(fake_driver: Path) -> Iterator[Container]:
    yield from container_of(NODE_IMAGE, {fake_driver.parent: FAKE_DRIVER_INSIDE})


def test_the_image_runs_as_the_schedulers_user_not_root(node: Container) -> None:
    done = node.run("id", "-u")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "65532"


def test_kiwi_scheduler_runs_the_compiled_core(node: Container) -> None:
    done = node.run("kiwi-scheduler", "--version")
    assert done.returncode == 0, done.stderr
    assert re.search(r"kiwi-scheduler \S+, scheduler core compiled", done.stdout), done.stdout


@pytest.mark.parametrize("program", ["kiwictl", "kiwi-device-plugin"])
def test_the_other_programs_start(node: Container, program: str) -> None:
    done = node.run(program, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {program}")


def test_no_compiler_in_the_image(node: Container) -> None:
    done = node.run("sh", "-c", "command -v gcc cc c99 clang || echo none")
    assert done.stdout.strip() == "none"


def test_the_shim_gates_work_on_the_fake_driver_under_the_images_scheduler(
        node: Container) -> None:
    shim = shim_installed_from()
    timeout = scaled(30)
    done = node.run("python", f"{TESTS_INSIDE}/inside_node_image.py", shim, FAKE_DRIVER_INSIDE,
                    str(timeout), timeout=4 * timeout)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert "scheduler core compiled" in seen["daemon_log"], seen["daemon_log"]
    assert seen["workload"], seen["workload_errors"]
    workload = json.loads(seen["workload"])
    # The shim is on, the launch passed its gate once the scheduler granted the GPU, and the
    # call reached the driver beneath.
    assert workload == {"active": 1, "init": 0, "launch": 0, "holding": 1, "state": "holding"}
    assert "cuLaunchKernel" in seen["driver_calls"]
    status = json.loads(seen["kiwictl"])
    assert "clients" in status, seen["kiwictl_errors"]
