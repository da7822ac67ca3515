"""The Dockerfiles, parsed: pinned bases, a non-root user, sources that exist, and the commands
the manifests run actually installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from nodeside import kai

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "nodeside" / "Dockerfile"
NOTEBOOK = REPO / "images" / "notebook" / "Dockerfile"
DEPLOY = REPO / "nodeside" / "deploy"
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# An exact version (x.y.z or vX.Y.Z) or a digest: never a floating tag.
_PINNED = re.compile(r"^[^:@\s]+(:v?\d+\.\d+\.\d+[-\w.]*)?(@sha256:[0-9a-f]{64})?$")


def _parse(path: Path) -> DockerfileParser:
    parser = DockerfileParser(fileobj=open(path, "rb"))  # noqa: SIM115 - read at once
    return parser


def _instructions(path: Path, name: str) -> list[str]:
    return [i["value"] for i in _parse(path).structure if i["instruction"] == name]


def _arg_defaults(path: Path) -> dict[str, str]:
    return dict(v.split("=", 1) for v in _instructions(path, "ARG") if "=" in v)


def _stages(path: Path) -> list[str]:
    """Each FROM's image, with ARG defaults substituted."""
    args = _arg_defaults(path)
    images = []
    for value in _instructions(path, "FROM"):
        image = value.split()[0]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)
        images.append(image)
    return images


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_every_base_image_is_pinned_to_an_exact_version(path):
    stage_names = {v.split()[-1] for v in _instructions(path, "FROM") if " as " in v.lower()}
    for image in _stages(path):
        if image in stage_names:
            continue
        assert ":" in image and _PINNED.match(image), f"{path.name}: {image} is not pinned"
        assert not image.endswith(":latest")


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_the_final_stage_runs_as_a_non_root_user(path):
    final_user = _instructions(path, "USER")[-1].split(":")[0]
    assert final_user not in {"0", "root"}


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_every_copied_source_exists_in_the_build_context(path):
    for value in _instructions(path, "COPY"):
        words = [w for w in value.split() if not w.startswith("--")]
        if any(w.startswith("--from") for w in value.split()):
            continue
        for source in words[:-1]:
            assert (REPO / source).exists(), f"{path.name}: COPY {source}: no such file"


def test_node_image_entrypoint_is_an_installed_console_script():
    [entrypoint] = _instructions(NODE, "ENTRYPOINT")
    command = json.loads(entrypoint)[0]
    assert command in SCRIPTS


def test_node_image_puts_kiwictl_and_the_daemons_on_path():
    env = " ".join(_instructions(NODE, "ENV"))
    [bin_dir] = re.findall(r"PATH=(\S+?):\$PATH", env)
    install = " ".join(_instructions(NODE, "RUN"))
    assert bin_dir == "/opt/kiwi/venv/bin" and "python -m venv /opt/kiwi/venv" in install
    assert "[k8s,fast]" in install  # grpcio for the device plugin, uvloop for the daemon
    for script in ("kiwi-scheduler", "kiwictl", "kiwi-device-plugin"):
        assert script in SCRIPTS
        assert f"{script} --help" in install  # the build fails if one does not start


def test_daemonset_commands_exist_in_the_node_image():
    for path in DEPLOY.glob("*daemonset.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc["spec"]["template"]["spec"]
            for container in spec["containers"]:
                assert container["command"][0] in SCRIPTS, container["name"]
            probe = spec["containers"][0].get("livenessProbe", {}).get("exec", {})
            if probe:
                assert probe["command"][0] in SCRIPTS


def test_node_image_ships_the_shim_where_the_device_plugin_installs_it_from():
    install = " ".join(_instructions(NODE, "RUN"))
    assert "/opt/kiwi/lib/libkiwi.so" in install
    daemonset = yaml.safe_load((DEPLOY / "device-plugin-daemonset.yaml").read_text())
    [init] = daemonset["spec"]["template"]["spec"]["initContainers"]
    assert "cp /opt/kiwi/lib/libkiwi.so " in init["command"][-1]


def test_notebook_image_makes_kiwi_the_default_kernel_and_checks_the_extension():
    config = json.loads((REPO / "images/notebook/kiwi-default-kernel.json").read_text())
    assert config["MultiKernelManager"]["default_kernel_name"] == "kiwi"
    copies = " ".join(_instructions(NOTEBOOK, "COPY"))
    assert "/etc/jupyter/jupyter_server_config.d/" in copies
    checks = " ".join(_instructions(NOTEBOOK, "RUN"))
    assert "jupyter server extension list" in checks and "kiwi_jupyter.*OK" in checks
    assert "kernelspec list" in checks


@pytest.mark.parametrize(("kai_class", "expected"), [
    ("build-preemptible", "LOW"), ("build", "NORMAL"), ("inference", "HIGH")])
def test_notebook_start_turns_the_kai_priority_class_into_kiwi_priority(
        tmp_path, kai_class, expected):
    env = {**os.environ, "KIWI_S6_ENV_DIR": str(tmp_path), "KIWI_KAI_PRIORITY_CLASS": kai_class,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    env.pop("KIWI_PRIORITY", None)
    done = subprocess.run(["sh", str(REPO / "images/notebook/kiwi-priority-from-kai.sh")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "KIWI_PRIORITY").read_text() == expected == kai.priority_for(kai_class)


def test_notebook_start_leaves_an_explicit_priority_and_unknown_classes_alone(tmp_path):
    base = {**os.environ, "KIWI_S6_ENV_DIR": str(tmp_path), "PYTHONPATH": str(REPO),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = str(REPO / "images/notebook/kiwi-priority-from-kai.sh")
    explicit = subprocess.run(["sh", script], env={**base, "KIWI_PRIORITY": "HIGH",
                                                   "KIWI_KAI_PRIORITY_CLASS": "train"},
                              capture_output=True, text=True, timeout=60)
    unknown = subprocess.run(["sh", script], env={**base, "KIWI_KAI_PRIORITY_CLASS": "urgent"},
                             capture_output=True, text=True, timeout=60)
    assert explicit.returncode == 0 and unknown.returncode == 0
    assert not (tmp_path / "KIWI_PRIORITY").exists()
    assert "urgent" in unknown.stderr
