"""The door's slow requests on a real local cluster (1 prefill + 1 decode, every prompt's KV
moved), with no collector configured, as `baton serve` runs by default: a disaggregated
request shows up on GET /admin/api/slow-requests with door-side spans covering routing, the
prefill gate, the reservation, the prefill, admission, the first token, decode and the
finish, each with its worker and what it moved."""

from __future__ import annotations

import httpx
import pytest

from core.tracing import SpanName
from tests.cluster.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.slow

STEPS = [SpanName.ROUTE, SpanName.GATE_WAIT, SpanName.PREFILL, SpanName.RESERVE,
         SpanName.FIRST_TOKEN, SpanName.ADMIT, SpanName.DECODE]  # fmt: skip
"""An attempt's steps, in the order they start (the prefill's call goes out just before the
reservation it runs beside; the first token is waited for from the prefill's reply on, so
admission runs inside it)."""


def test_a_disaggregated_request_has_its_whole_timeline(served) -> None:  # type: ignore[no-untyped-def]
    cluster, http, _grpc, _model_dir = served
    assert not cluster.tracing.exporting and cluster.slow_requests is not None
    base = f"http://{http.host}:{http.port}"
    with httpx.Client(base_url=base, timeout=120) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "stream": True, "max_tokens": 40, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Tell me about relays."}]}  # fmt: skip
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                pass
        report = client.get(
            "/admin/api/slow-requests", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ).json()
    assert report["enabled"]
    (kept,) = [q for q in report["e2e"] if q["output_tokens"] == 40]
    assert kept in report["ttft"] and kept["ttft_s"] < kept["e2e_s"]
    assert kept["status"] == "ok" and kept["retries"] == 0
    prefill, decode = kept["prefill_worker"], kept["decode_worker"]
    assert prefill and decode
    names = [s["name"] for s in kept["spans"]]
    assert names[0] == SpanName.REQUEST and SpanName.FINISH in names
    assert names.count(SpanName.ATTEMPT) == 1
    steps = [n for n in names if n in STEPS]
    assert steps[: len(STEPS)] == STEPS  # in order, then the other decode runs
    assert names.count(SpanName.DECODE) == 3  # 40 tokens: 1, then 16, 16, the rest
    spans = {s["name"]: s for s in kept["spans"]}
    assert spans[SpanName.RESERVE]["worker"] == decode
    assert spans[SpanName.ADMIT]["worker"] == decode
    assert spans[SpanName.FIRST_TOKEN]["worker"] == decode
    step = spans[SpanName.PREFILL]
    assert step["worker"] == prefill
    assert step["attributes"]["baton.blocks_sent"] > 0 and step["attributes"]["baton.kv.bytes"] > 0
    route = spans[SpanName.ROUTE]["attributes"]
    assert route["baton.route.prefill_worker"] == prefill
    assert "baton.route.prefill_cached_blocks" in route
    assert spans[SpanName.FINISH]["attributes"]["baton.output_tokens"] == 40
    root = spans[SpanName.REQUEST]
    for span in kept["spans"]:
        assert span["start_s"] >= 0
        assert span["start_s"] + span["duration_s"] <= root["duration_s"] + 1e-6, span
    # The door's spans account for the request's time: the stages and the attempt cover it.
    covered = sum(s["duration_s"] for s in kept["spans"] if s["depth"] == 1)
    assert covered >= 0.9 * root["duration_s"] - 0.02  # the door's own lines between them
