"""A real Prometheus server (Debian's `prometheus`) for the observability tests: one process
on a free loopback port, its TSDB in a temporary folder, scraping given targets every
second with given rule files loaded, and the queries the tests ask of its HTTP API.

Stopped by its PID (SIGTERM, then SIGKILL if it lingers); nothing else is touched.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadgen.server import free_port

REPO = Path(__file__).resolve().parents[2]
RULES_FILE = REPO / "deploy" / "prometheus" / "rules.yaml"
CHART_RULES_FILE = REPO / "deploy" / "helm" / "baton" / "files" / "prometheus-rules.yaml"
DASHBOARD_FILE = REPO / "deploy" / "helm" / "baton" / "dashboards" / "baton.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": ".+", "$pool": ".+"}
"""What Grafana puts in for the dashboard's variables here: every job and pool, and a rate
window that holds several of the test's one-second scrapes."""


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(panel title / legend, PromQL with the variables filled in) of every panel target."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield f"{panel['title']} / {target['legendFormat']}", fill_variables(target["expr"])


def fill_variables(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the tests do not fill: {expr}"
    return expr


def rules() -> list[dict[str, Any]]:
    """Every rule of the rules file, recording and alerting."""
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


class PrometheusServer:
    """`prometheus` scraping `targets` (host:port, path /metrics) every second."""

    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path]) -> None:
        assert PROMETHEUS is not None, "prometheus is not installed"
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": "baton", "static_configs": [{"targets": targets}]},
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout_s} s; see {self.log_path}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a /api/v1 answer; raises with Prometheus' error otherwise."""
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10.0)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series (a scalar answer counts as one)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_values(self, label_query: str) -> list[str]:
        """Grafana's `label_values(selector, label)`, through the series API."""
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", label_query)
        assert match, label_query
        selector, label = match.groups()
        return list(self.api(f"label/{label}/values", **{"match[]": fill_variables(selector)}))
