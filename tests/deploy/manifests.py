"""Render the Helm chart with Helm's own engine and check manifests against their schemas.

Built-in kinds are checked with `kubernetes-validate` (the Kubernetes OpenAPI schemas, strict:
an unknown field is an error). Custom resources are checked against the CRDs shipped in
deploy/schemas/, read strictly too, and every pod template inside a RayCluster against the
real core/v1 PodTemplateSpec schema.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

helm_python = pytest.importorskip("helm_python", reason="needs helm-python-sdk (Helm's engine)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate")

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "deploy" / "helm" / "baton"
SCHEMA_DIR = REPO / "deploy" / "schemas"
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas the validator ships.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())

Manifest = dict[str, Any]


def render(values: dict[str, Any] | None = None, release: str = "baton") -> list[Manifest]:
    """All manifests the chart renders for `values`, as parsed YAML documents."""
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(values)
        rendered = chart.render(values, name=release, namespace="serving", is_install=True)
    docs: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def load_values(name: str) -> dict[str, Any]:
    """A variant from the chart's ci/ folder (the files chart-testing also picks up)."""
    return yaml.safe_load((CHART_DIR / "ci" / name).read_text())


def _strict(schema: Any) -> Any:
    """An OpenAPI schema with unknown fields forbidden wherever the CRD lists fields and
    does not preserve unknown ones: what the API server's strict field validation does."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def crd_documents() -> list[Manifest]:
    return [yaml.safe_load(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.yaml"))]


@cache
def _crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> a validator for that custom resource."""
    validators = {}
    for crd in crd_documents():
        spec = crd["spec"]
        for version in spec["versions"]:
            api_version = f"{spec['group']}/{version['name']}"
            schema = _strict(version["schema"]["openAPIV3Schema"])
            validators[(api_version, spec["names"]["kind"])] = jsonschema.Draft7Validator(schema)
    return validators


def _validate_builtin(manifest: Manifest) -> None:
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def pod_templates(manifest: Manifest) -> list[tuple[str, Manifest]]:
    """(group name, pod template) of every pod a RayCluster asks for, head first."""
    spec = manifest["spec"]
    found = [("head", spec["headGroupSpec"]["template"])]
    found += [(g["groupName"], g["template"]) for g in spec.get("workerGroupSpecs", [])]
    return found


def validate(manifest: Manifest) -> None:
    """Raise if `manifest` does not validate against its kind's schema."""
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    validator = _crd_validators().get(key)
    if validator is None:
        _validate_builtin(manifest)
        return
    validator.validate(manifest)
    # A custom resource's metadata is a plain ObjectMeta: check it as a ConfigMap's.
    _validate_builtin({"apiVersion": "v1", "kind": "ConfigMap", "metadata": manifest["metadata"]})
    if key == ("ray.io/v1", "RayCluster"):
        for group, template in pod_templates(manifest):
            wrapped = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{manifest['metadata']['name']}-{group}"},
                "template": copy.deepcopy(template),
            }
            _validate_builtin(wrapped)


def container(template: Manifest) -> Manifest:
    """The one container of a pod template."""
    containers = template["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(template: Manifest) -> dict[str, Any]:
    """name -> value (or valueFrom) of the pod's container, failing on a name set twice."""
    entries = container(template).get("env", [])
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"env names set twice: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


def by_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
