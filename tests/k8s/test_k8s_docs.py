"""docs/kubernetes.md: the operations guide's steps as written, with commands that parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

from nodeside.ctl import build_parser as kiwictl_parser
from nodeside.deviceplugin.main import build_parser as plugin_parser

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "kubernetes.md").read_text()
# Continuation lines joined, as the shell reads them.
COMMANDS = re.sub(r"\\\n\s*", "", DOC)
KUBECTL_VERBS = {"apply", "delete", "describe", "edit", "exec", "get", "label", "logs", "rollout"}


def _invocations(program: str) -> list[list[str]]:
    found = []
    for line in COMMANDS.splitlines():
        if f"-- {program} " in line or line.strip().startswith(f"{program} "):
            words = shlex.split(line.split(f"{program} ", 1)[1].split("|")[0])
            found.append(words)
    return found


def test_every_kiwictl_command_in_the_guide_parses():
    invocations = _invocations("kiwictl")
    assert len(invocations) >= 5
    for words in invocations:
        kiwictl_parser().parse_args(words)


def _kubectl_commands() -> list[list[str]]:
    """Every kubectl command in the guide, as the shell splits it, up to its pipe or its end
    (``$(kubectl ...)`` included)."""
    found = []
    for line in COMMANDS.splitlines():
        for start in re.finditer(r"(?:^\s*|\$\(|\|\s*)kubectl ", line):
            lexer = shlex.shlex(line[start.end():], posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = []
            for word in lexer:
                if word in {"|", "||", "&&", ";", ")"}:
                    break
                words.append(word)
            found.append(words)
    return found


def _option(words: list[str], *names: str) -> str | None:
    for i, word in enumerate(words):
        if word in names:
            return words[i + 1]
    return None


def _manifest_objects() -> list[dict]:
    return [doc for path in sorted((REPO / "nodeside" / "deploy").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc and "metadata" in doc]


def test_every_kubectl_command_in_the_guide_parses_and_names_what_the_manifests_make():
    commands = _kubectl_commands()
    assert len(commands) >= 10
    objects = _manifest_objects()
    namespaces = {d["metadata"]["name"] for d in objects if d["kind"] == "Namespace"}
    named = {(d["kind"].lower(), d["metadata"]["name"]) for d in objects}
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in objects
                  if d["kind"] == "DaemonSet"]
    for words in commands:
        assert words[0] in KUBECTL_VERBS, words
        namespace = _option(words, "-n", "--namespace")
        if namespace is not None and not namespace.startswith("$"):
            assert namespace in namespaces, words
        selector = _option(words, "-l", "--selector")
        if selector is not None:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            assert any(wanted.items() <= labels.items() for labels in pod_labels), words
        directory = _option(words, "-k", "--kustomize")
        if directory is not None:
            assert (REPO / directory / "kustomization.yaml").is_file(), words
        file = _option(words, "-f", "--filename")
        if file not in (None, "-"):
            assert (REPO / file).is_file(), words
        for word in words[1:]:
            kind, _, name = word.partition("/")
            if name and kind in {"daemonset", "configmap"}:
                assert (kind, name) in named, words
        if words[:2] == ["edit", "configmap"]:
            assert ("configmap", words[2]) in named, words


def test_every_image_build_in_the_guide_names_a_dockerfile_and_its_arguments():
    builds = [shlex.split(line.split("docker build ", 1)[1]) for line in COMMANDS.splitlines()
              if line.strip().startswith("docker build ")]
    assert len(builds) >= 2
    for words in builds:
        dockerfile = REPO / _option(words, "-f", "--file")
        declared = {v.split("=", 1)[0] for v in _dockerfile_args(dockerfile)}
        for i, word in enumerate(words):
            if word == "--build-arg":
                assert words[i + 1].split("=", 1)[0] in declared, words
        assert words[-1] == "."  # the repository root is the build context


def _dockerfile_args(path: Path) -> list[str]:
    with open(path, "rb") as dockerfile:
        structure = DockerfileParser(fileobj=dockerfile).structure
    return [i["value"] for i in structure if i["instruction"] == "ARG"]


def test_the_documented_device_plugin_flags_exist():
    flags = set(re.findall(r"`(--[a-z-]+)", DOC.split("`kiwi-device-plugin` flags:")[1]
                           .split("\n\n")[0]))
    known = {a for action in plugin_parser()._actions for a in action.option_strings}
    assert flags and flags <= known
