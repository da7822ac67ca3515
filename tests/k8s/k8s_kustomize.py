"""The node's manifests as kustomize builds them (kubectl's built-in kustomize), and the parts of
them the deploy switches' tests read."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

NODESIDE = Path(__file__).resolve().parents[2] / "nodeside"
KUBERNETES_VERSIONS = ["1.27.0", "1.33.0"]

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl (its built-in kustomize) is not installed")


def build(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(["kubectl", "kustomize", str(directory)],
                            check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def daemonset(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name]
    return ds


def scheduler_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return daemonset(docs, "kiwi-scheduler")["spec"]["template"]["spec"]


def scheduler_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = [c for c in scheduler_pod(docs)["containers"] if c["name"] == "kiwi-scheduler"]
    return container
