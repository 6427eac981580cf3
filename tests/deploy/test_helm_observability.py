"""The chart's Grafana dashboard ConfigMap and PrometheusRule: off by default; switched on,
they carry the repository's dashboard and rules unchanged, labelled for Grafana's sidecar and
the Prometheus Operator, and validate against their schemas."""

from __future__ import annotations

import json

import yaml

from tests.deploy.manifests import by_kind, one, render, validate
from tests.deploy.prometheus import DASHBOARD_FILE, RULES_FILE


def test_both_are_off_by_default() -> None:
    docs = render({})
    assert not by_kind(docs, "PrometheusRule")
    assert not [
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("dashboard")
    ]


def test_the_dashboard_configmap_is_labelled_for_grafanas_sidecar() -> None:
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "Baton"},
        }
    }
    configmap = one(render(values), "ConfigMap")
    validate(configmap)
    meta = configmap["metadata"]
    assert meta["name"] == "baton-dashboard"
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["annotations"] == {"grafana_folder": "Baton"}
    assert json.loads(configmap["data"]["baton.json"]) == json.loads(DASHBOARD_FILE.read_text())


def test_the_sidecars_label_can_be_changed() -> None:
    values = {"grafanaDashboard": {"enabled": True, "labels": {"dashboards": "baton"}}}
    meta = one(render(values), "ConfigMap")["metadata"]
    assert meta["labels"]["dashboards"] == "baton"
    assert meta["namespace"] == "serving"  # the release's


def test_the_prometheus_rule_carries_the_rules_file_unchanged() -> None:
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    rule = one(render(values), "PrometheusRule")
    validate(rule)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())
    # Alert templates reach Prometheus as written, not expanded by Helm.
    saturated = rule["spec"]["groups"][-1]["rules"][0]
    assert "{{ $labels.pool }}" in saturated["annotations"]["summary"]
