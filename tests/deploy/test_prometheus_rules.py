"""The Prometheus rules and the Grafana dashboard as files: the plain rules file is the
chart's, promtool accepts it, the rules cover what an operator is paged for, and the
dashboard holds the panels issue 58 asks for."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.prometheus import (
    CHART_RULES_FILE,
    PROMTOOL,
    RULES_FILE,
    dashboard,
    dashboard_queries,
    rules,
)


def test_the_plain_rules_file_is_the_charts() -> None:
    assert RULES_FILE.read_bytes() == CHART_RULES_FILE.read_bytes(), (
        "deploy/prometheus/rules.yaml differs from the chart's files/prometheus-rules.yaml: "
        "edit the chart's and copy it"
    )


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian prometheus; make install)")
def test_promtool_checks_the_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_alerts_cover_saturation_transfers_the_index_and_slo_burn() -> None:
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert set(alerts) == {
        "BatonPoolSaturated",
        "BatonKVTransferFailures",
        "BatonRouterIndexOutOfSync",
        "BatonSLOBudgetBurnFast",
        "BatonSLOBudgetBurnSlow",
    }
    assert "baton:autoscale_pressure" in alerts["BatonPoolSaturated"]["expr"]
    assert "baton:router_index_resyncs_total" in alerts["BatonRouterIndexOutOfSync"]["expr"]
    for alert in alerts.values():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    # Multiwindow burn rates: a long and a short window at each burn rate, both SLOs.
    fast, slow = alerts["BatonSLOBudgetBurnFast"]["expr"], alerts["BatonSLOBudgetBurnSlow"]["expr"]
    assert "ratio_rate1h" in fast and "ratio_rate5m" in fast
    assert "ratio_rate6h" in slow and "ratio_rate30m" in slow
    slos = {r["labels"]["slo"] for r in rules() if r.get("record", "").startswith("job:baton_slo")}
    assert slos == {"ttft", "itl"}


def test_the_slo_bounds_are_buckets_of_the_histograms_and_the_autoscalers_defaults() -> None:
    """The burn rates count requests in the bucket at the SLO: each bound must be a bucket
    Baton exports, and the autoscaler's default target."""
    from router.cluster.autoscale.policy import AutoscaleConfig
    from router.frontdoor.metrics import Metrics

    m = Metrics()
    bounds = {
        "time_to_first_token": {str(b) for b in m.ttft._upper_bounds},
        "time_per_output_token": {str(b) for b in m.tpot._upper_bounds},
    }
    defaults = AutoscaleConfig()
    expected = {
        "time_to_first_token": defaults.ttft_slo_s,
        "time_per_output_token": defaults.itl_slo_s,
    }
    for rule in rules():
        for name, bucket_bounds in bounds.items():
            marker = f'baton:{name}_seconds_bucket{{le="'
            if marker in rule["expr"]:
                le = rule["expr"].split(marker)[1].split('"')[0]
                assert le in bucket_bounds, (rule, le)
                assert float(le) == expected[name]


def test_the_dashboard_has_the_panels_an_operator_looks_for() -> None:
    board = dashboard()
    assert board["uid"] == "baton-overview"
    titles = " | ".join(p["title"] for p in board["panels"]).lower()
    for subject in (
        "ttft", "itl", "queue", "kv cache usage", "kv transfer bandwidth", "prefix cache hit",
        "pressure", "scale decisions", "autoscaler inputs",
    ):  # fmt: skip
        assert subject in titles, subject
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "job", "pool"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"]
    queries = [q for _, q in dashboard_queries()]
    # Every autoscaler input the front door exports is on the dashboard.
    from router.frontdoor.autoscale_metrics import SIGNAL_GAUGES

    shown = " ".join(queries)
    for _, name, _ in SIGNAL_GAUGES:
        assert f"baton:{name}" in shown, name
