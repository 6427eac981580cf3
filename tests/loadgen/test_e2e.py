"""The load generator against a real in-process front door (a tiny engine, no cluster)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from core.config import EngineConfig
from loadgen import workloads as wl
from loadgen.cli import build_arg_parser, run_from_args
from loadgen.client import run_load, scrape_metrics
from loadgen.run import served_model
from loadgen.traces import TraceRequest
from router.frontdoor.http.app import create_app
from tests.support.grpc_server import GRPCServerThread
from tests.support.http_server import HTTPServerThread
from tests.support.local_backend import LocalBackend

torch.set_num_threads(1)
SPACE = wl.TokenSpace(16, 1000)


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Callable[..., Path]) -> Iterator[LocalBackend]:
    config = EngineConfig(num_kv_blocks=128, max_model_len=512, max_num_seqs=16, num_threads=1)
    b = LocalBackend(tiny_model_dir("llama"), config)
    yield b
    b.close()


@pytest.fixture(scope="module")
def server(backend: LocalBackend) -> Iterator[HTTPServerThread]:
    s = HTTPServerThread(create_app(backend, None, admin_token="t")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model(server: HTTPServerThread) -> str:
    return asyncio.run(served_model(server.url))


def test_open_loop_run_times_every_request(server: HTTPServerThread, model: str) -> None:
    # Two tenants: each one's later requests hit its cached 64-token system prompt.
    reqs = wl.shared_prefix(10, SPACE, num_tenants=2, system_tokens=64, user_tokens=16,
                            output_len=5, seed=1)  # fmt: skip
    timed = wl.with_poisson_arrivals(reqs, 20.0, seed=0)
    run = asyncio.run(run_load(server.url, model, timed, max_duration_s=30,
                               drain_timeout_s=30, progress=False))  # fmt: skip
    assert len(run.results) == 10 and run.num_not_sent == 0
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    for r, req in zip(sorted(run.results, key=lambda r: r.sent_s), timed, strict=True):
        assert r.num_prompt_tokens == len(req.prompt_token_ids)
        assert r.num_output_tokens == 5  # ignore_eos: exactly max_tokens
        assert r.ttft_s is not None and r.e2e_s is not None and r.e2e_s >= r.ttft_s
        assert 1 <= len(r.itl_s) <= 4  # a chunk per token unless a token had no text
    assert sum(r.num_cached_tokens for r in run.results) >= 64  # the prefixes were reused
    assert [r.sent_s for r in run.results] == sorted(r.sent_s for r in run.results)


def test_a_bad_request_is_an_error_not_a_crash(server: HTTPServerThread, model: str) -> None:
    too_long = [TraceRequest.of_prompt(0.0, [20] * 600, 4)]  # over max_model_len
    run = asyncio.run(run_load(server.url, model, too_long, progress=False))
    assert not run.results[0].ok
    assert run.results[0].error.startswith("HTTP 400")


def test_requests_after_the_time_bound_are_not_sent(server: HTTPServerThread, model: str) -> None:
    reqs = [TraceRequest.of_prompt(t, [30, 31, 32], 2) for t in (0.0, 0.05, 50.0)]
    run = asyncio.run(run_load(server.url, model, reqs, max_duration_s=1.0,
                               progress=False))  # fmt: skip
    assert len(run.results) == 2 and run.num_not_sent == 1


def test_metrics_are_scraped(server: HTTPServerThread) -> None:
    text = asyncio.run(scrape_metrics(server.url))
    assert text is not None and "baton:time_to_first_token_seconds" in text


def test_the_cli_writes_json_and_a_plot(server: HTTPServerThread, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    args = build_arg_parser(__import__("argparse").ArgumentParser()).parse_args(
        ["--url", server.url, "--workload", "fixed", "--input-len", "12", "--output-len", "3",
         "--num-requests", "4", "--rate", "40", "--no-progress", "--out", str(out)]
    )  # fmt: skip
    assert run_from_args(args) == 0
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["num_ok"] == 4 and run["rate"] == 40
    assert run["output_tokens"] == 12 and run["ttft_s"]["p99"] is not None
    assert out.with_suffix(".png").stat().st_size > 1000


def test_the_load_can_go_over_grpc(backend: LocalBackend, server: HTTPServerThread) -> None:
    reqs = wl.with_poisson_arrivals(wl.fixed_lengths(3, 10, 4, SPACE), 30.0, seed=0)
    grpc_server = GRPCServerThread(backend, None, admin_token="t").start()
    try:
        run = asyncio.run(run_load(server.url, "", reqs, progress=False,
                                   grpc_target=grpc_server.target))  # fmt: skip
    finally:
        grpc_server.stop()
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    assert [r.num_output_tokens for r in run.results] == [4, 4, 4]
    assert all(r.ttft_s is not None and len(r.itl_s) >= 1 for r in run.results)
