"""The dashboard and the rules against a real Prometheus (Debian's `prometheus`) scraping a
real `baton serve` (a subprocess on a tiny model: one prefill and one decode worker, every
prompt's KV moved between them, the autoscaler on with its pools pinned): after a few
requests every dashboard query returns series, every rule evaluates without error, and
the autoscaler's inputs are there per pool."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.server import ServerProcess
from tests.deploy.prometheus import (
    PROMETHEUS,
    RULES_FILE,
    PrometheusServer,
    dashboard,
    dashboard_queries,
    rules,
)

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs prometheus (Debian's package; make install installs it)"
)
ADMIN_TOKEN = "prometheus-test-token"
CONVERGE_S = 90.0
"""How long the scraped series may take to show every query's answer."""


@pytest.fixture(scope="module")
def baton(tiny_model_dir: Callable[..., Path], tmp_path_factory) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    model_dir = tiny_model_dir("llama")
    args = [
        "--model", str(model_dir), "--device", "cpu", "--prefill", "1", "--decode", "1",
        "--kv-cache-gb", "0.05", "--admin-token", ADMIN_TOKEN,
        "--disagg-min-uncached-tokens", "0",  # every prompt's KV crosses to the decode worker
        "--autoscale", "--autoscale-interval", "0.5",
        "--min-prefill", "1", "--max-prefill", "1", "--min-decode", "1", "--max-decode", "1",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("baton") / "serve.log"
    with ServerProcess(args, log, start_timeout_s=240.0) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(baton: ServerProcess, tmp_path_factory) -> Iterator[PrometheusServer]:  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("prometheus")
    server = PrometheusServer(workdir, [f"127.0.0.1:{baton.port}"], [RULES_FILE]).start()
    try:
        _wait(lambda: server.query('up{job="baton"} == 1'), "the first scrape of baton")
        send_requests(baton, 6)
        yield server
    finally:
        server.stop()


def send_requests(baton: ServerProcess, num_requests: int) -> None:
    """Completions sharing a prefix (the later ones hit the prefill worker's cache), each with
    a few output tokens (an ITL sample)."""
    model = httpx.get(baton.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    shared = "You are a careful assistant. Answer briefly. " * 4
    for i in range(num_requests):
        body = {"model": model, "prompt": f"{shared} Question {i}: what is {i} + {i}?",
                "max_tokens": 8, "min_tokens": 4}  # fmt: skip
        httpx.post(baton.url + "/v1/completions", json=body, timeout=120).raise_for_status()


def _wait_working(baton: ServerProcess, prometheus: PrometheusServer, query: str,
                  what: str) -> list:  # type: ignore[type-arg]  # fmt: skip
    """`_wait` for `query`, the server kept working (a request a try) until a scrape sees it."""

    def probe() -> list:  # type: ignore[type-arg]
        found = prometheus.query(query)
        if not found:
            send_requests(baton, 1)
        return found

    return _wait(probe, what)


def _wait(probe: Callable[[], list], what: str, timeout_s: float = CONVERGE_S) -> list:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found or time.monotonic() > deadline:
            assert found, f"no answer for {what} within {timeout_s} s"
            return found
        time.sleep(0.5)


def test_every_dashboard_query_returns_series(
    baton: ServerProcess, prometheus: PrometheusServer
) -> None:
    send_requests(baton, 2)  # fresh: the doors' latency window (30 s) holds samples
    missing = dict(dashboard_queries())
    deadline = time.monotonic() + CONVERGE_S
    while missing and time.monotonic() < deadline:
        for name, expr in list(missing.items()):
            if prometheus.query(expr):  # raises on a query Prometheus rejects
                del missing[name]
        time.sleep(1.0)
    assert not missing, f"dashboard queries without series: {sorted(missing)}"


def test_the_dashboards_variables_and_annotations_resolve(prometheus: PrometheusServer) -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert prometheus.label_values(variables["job"]["definition"]) == ["baton"]
    pools = prometheus.label_values(variables["pool"]["definition"])
    assert sorted(pools) == ["decode", "prefill"]
    for annotation in dashboard()["annotations"]["list"]:
        if "expr" in annotation:  # evaluates; it has series only after a pool was resized
            prometheus.query(annotation["expr"].replace("$job", ".+").replace("$pool", ".+"))


def test_every_rule_evaluates_without_error(prometheus: PrometheusServer) -> None:
    for rule in rules():
        prometheus.query(rule["expr"])  # raises with Prometheus' error
    expected = {r.get("record") or r.get("alert") for r in rules()}

    def evaluated() -> list:  # type: ignore[type-arg]
        loaded = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        done = [r for r in loaded if r.get("lastEvaluation", "").startswith("20")]
        return loaded if len(done) == len(loaded) else []

    loaded = _wait(evaluated, "every rule's first evaluation")
    assert {r["name"] for r in loaded} == expected
    broken = {r["name"]: r.get("lastError") for r in loaded if r["health"] != "ok"}
    assert not broken, broken


def test_the_recording_rules_see_the_pools_and_the_transfers(
    baton: ServerProcess, prometheus: PrometheusServer
) -> None:
    kv = _wait(lambda: prometheus.query("pool:baton_kv_cache_usage_perc:avg"), "KV per pool")
    assert {s["metric"]["pool"] for s in kv} == {"prefill", "decode"}

    # A minute past the earlier tests' requests the rate is 0 again: traffic until it shows.
    moved = _wait_working(baton, prometheus, "job:baton_kv_transfer_bytes:rate1m > 0", "KV moved")
    assert moved[0]["metric"]["job"] == "baton"
    ttft = _wait(
        lambda: prometheus.query('job:baton_slo_misses:ratio_rate5m{slo="ttft"} >= 0'),
        "the TTFT SLO's miss ratio",
    )
    assert float(ttft[0]["value"][1]) <= 1.0


def test_the_autoscalers_inputs_are_scraped_per_pool(
    baton: ServerProcess, prometheus: PrometheusServer
) -> None:
    terms = _wait(lambda: prometheus.query("baton:autoscale_pressure_term"), "pressure terms")
    by_pool = {}
    for series in terms:
        by_pool.setdefault(series["metric"]["pool"], set()).add(series["metric"]["term"])
    assert {"queue_wait", "busy"} <= by_pool["prefill"]
    assert {"queue_wait", "kv_usage", "batch_slots"} <= by_pool["decode"]
    targets = prometheus.query("baton:autoscale_target_workers")
    assert {s["metric"]["pool"]: s["value"][1] for s in targets} == {"prefill": "1", "decode": "1"}

    rate = 'max_over_time(baton:autoscale_tokens_per_second{pool="decode"}[5m]) > 0'
    assert _wait_working(baton, prometheus, rate, "the decode pool's measured work")
