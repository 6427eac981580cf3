"""Chaos (issue 19): streaming load with greedy, seeded and stop-string requests on
multi-byte text, prefill and decode workers killed at seeded moments, clients hanging up
mid-stream. Every finished stream is its fault-free stream chunk by chunk (token ids and
text), every failure a `core.errors` error before its deadline, nothing hangs; afterwards
every worker's KV is free, the router holds no ticket and the pools are back at their
desired sizes. The driver is bench/chaos/driver.py (the soak runs it for minutes)."""

from __future__ import annotations

import logging

import pytest

from bench.chaos.driver import ChaosPlan, ChaosRun, settle
from bench.chaos.workload import workload
from tests.cluster.conftest import always_disaggregate, make_spec

pytestmark = pytest.mark.slow
SEED = 19
PLAN = ChaosPlan(
    seed=SEED,
    num_requests=32,
    duration_s=150.0,  # a bound; the run ends at the 4th kill's requests (~40 s on 2 cores)
    concurrency=6,
    timeout_s=90.0,
    kill_every_tokens=200,
    max_kills=4,
)


def test_kills_and_hang_ups_keep_every_stream_exact(
    cluster_factory, loop_thread, tiny_model_dir, caplog
) -> None:
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=2, num_decode=2)
    cluster = cluster_factory(spec, always_disaggregate())
    specs, references = workload(cluster.backend.tokenizer, model_dir, 12, 96, SEED)
    assert any(s.params.stop for s in specs)  # the stop strings were found
    with caplog.at_level(logging.WARNING, logger="router.cluster.request_path"):
        report = loop_thread.run(ChaosRun(cluster, specs, references, PLAN).run(), timeout=300)
    print(report.summary())
    assert report.ok, "\n".join(report.problems)
    assert len(report.kills) == PLAN.max_kills
    assert {w.split("-")[0] for _, w in report.kills} == {"prefill", "decode"}
    assert any("retrying with" in r.getMessage() for r in caplog.records)  # streams moved
    assert report.counts["exact"] >= PLAN.num_requests // 2
    assert report.counts["hung_up"] > 0
    loop_thread.run(settle(cluster), timeout=150)
