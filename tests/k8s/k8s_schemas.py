"""Offline schema checks: Kubernetes objects against the API's JSON schemas (shipped inside the
kubernetes-validate package), and custom resources against their CRD's openAPIV3Schema."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMAS = Path(__file__).parent / "schemas"
#: The Kubernetes version manifests are checked against; strict = unknown fields are errors.
KUBERNETES_VERSION = "1.30.0"


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields forbidden wherever properties are listed.

    The API server prunes (or, with kubectl's default strict field validation, rejects) fields a
    structural schema does not list; plain JSON Schema would let a typo such as ``overQuotaWieght``
    pass silently.
    """
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def kai_queue_errors(obj: dict[str, Any]) -> list[str]:
    schema = closed(yaml.safe_load((SCHEMAS / "kai-queue-v2.schema.yaml").read_text()))
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(obj)]


def kubernetes_errors(obj: dict[str, Any]) -> list[str]:
    """Validation errors of one Kubernetes object against the strict schema of its kind."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(map(str, exc.path)) or "<root>"
        return [f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}: {path}: {exc.message}"]
    return []
