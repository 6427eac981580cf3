"""A Baton cluster over several hosts (conftest.py has the map), in order:

1. prefill on one host, decode on another: KV crosses the bridge over a network backend
   (never loopback, never shm) and greedy output is exactly transformers';
2. losing the decode host, then the prefill host, with streams in flight: every stream
   completes, identical to a fault-free run, and the controller starts replacements on the
   spare host."""

from __future__ import annotations

import json
import re
import sys
import time

from tests.cluster.helpers import prompts
from tests.multinode.bed import client
from tests.multinode.conftest import ADMIN_TOKEN
from tests.oracle import hf_greedy

MAX_TOKENS = 12


def test_kv_crosses_hosts_and_output_is_exact(bed_cluster) -> None:  # type: ignore[no-untyped-def]
    bed = bed_cluster.bed
    batch = prompts(6, 1000, [300, 420, 360], seed=3)  # > 256 tokens: prefilled on the prefill host
    got = client(
        bed, 1, "streams", target=bed_cluster.grpc(1), prompts=batch, max_tokens=MAX_TOKENS,
        concurrency=3, timeout_s=180,
    )  # fmt: skip
    for prompt, result in zip(batch, got, strict=True):
        assert result["error"] is None
        assert result["token_ids"] == hf_greedy(
            str(bed_cluster.model_dir), tuple(prompt), MAX_TOKENS
        )
    moved = client(bed, 1, "metric", url=bed_cluster.http(1), name="baton:kv_transfer_bytes_total")
    assert moved > 0
    log = bed.log_text("frontdoor-h1.log")  # the workers' logs reach the driver's
    assert re.search(r"connected to peer (decode|prefill)-\d+ over nixl", log), log[-3000:]
    # Ray prefixes a line logged on another node with that node's ip; the controller's lines
    # have none: it runs beside the first front door, so losing a worker's host spares it.
    assert set(re.findall(r"\(Controller pid=\d+(, ip=[\d.]+)?\)", log)) == {""}


LONG = 200
"""Tokens per stream in the host-loss tests. Eight streams, two at a time: streams are
decoding and new prompts are being prefilled all through the run, whenever a host goes."""


def streams_through_a_lost_host(bed_cluster, host: int, seed: int, retried: bool) -> None:  # type: ignore[no-untyped-def]
    """The same streams twice, the second time losing `host` a third of the way in: every
    stream of the second run must equal the first's. `retried`: some request was on the
    lost host (and had to be retried elsewhere). A prefill takes milliseconds here, so the
    prefill host is lost between prefills; the requests that start after it still need
    one (`tests/cluster/test_failures.py` kills a prefill worker in the middle of one)."""
    bed = bed_cluster.bed
    batch = prompts(8, 1000, [300, 360], seed=seed)
    args = {"target": bed_cluster.grpc(1), "prompts": batch, "max_tokens": LONG,
            "concurrency": 2, "timeout_s": 280}  # fmt: skip
    retried_before = bed.log_text("frontdoor-h1.log").count("worker failed")
    started = time.monotonic()
    reference = client(bed, 1, "streams", **args)
    fault_free_s = time.monotonic() - started
    assert all(r["error"] is None and len(r["token_ids"]) == LONG for r in reference)
    log = f"streams-losing-h{host}.log"
    run = bed.spawn(1, [sys.executable, "-m", "tests.multinode.client", "streams",
                        json.dumps(args)], log)  # fmt: skip
    time.sleep(fault_free_s / 3)
    assert run.poll() is None, "the streams ended before the host could be lost"
    bed.stop_host(host)
    run.wait(330)
    got = json.loads(bed.log_text(log).strip().splitlines()[-1])
    assert [r["error"] for r in got] == [None] * len(batch)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in reference]
    if retried:
        num_retried = bed.log_text("frontdoor-h1.log").count("worker failed")
        assert num_retried > retried_before, "no request was in flight on the lost host"


def ready_workers(bed_cluster, pool: str) -> set[str]:  # type: ignore[no-untyped-def]
    state = client(bed_cluster.bed, 1, "state", target=bed_cluster.grpc(1),
                   admin_token=ADMIN_TOKEN)  # fmt: skip
    return {w for w, s in state[pool]["workers"].items() if s == "WORKER_STATE_READY"}


def wait_for_replacement(bed_cluster, pool: str, lost: set[str]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready = ready_workers(bed_cluster, pool)
        if ready and not ready & lost:
            return
        time.sleep(2)
    raise AssertionError(f"no replacement for {lost} in the {pool} pool")


def test_losing_the_decode_host_loses_no_stream(bed_cluster) -> None:  # type: ignore[no-untyped-def]
    lost = ready_workers(bed_cluster, "decode")
    streams_through_a_lost_host(bed_cluster, host=3, seed=11, retried=True)
    wait_for_replacement(bed_cluster, "decode", lost)


def test_losing_the_prefill_host_loses_no_stream(bed_cluster) -> None:  # type: ignore[no-untyped-def]
    lost = ready_workers(bed_cluster, "prefill")
    streams_through_a_lost_host(bed_cluster, host=2, seed=12, retried=False)
    wait_for_replacement(bed_cluster, "prefill", lost)


def test_a_replica_on_another_host_serves_the_same_cluster(bed_cluster) -> None:  # type: ignore[no-untyped-def]
    """A second front door on host 5 (`--attach`): no workers of its own, exact output."""
    bed_cluster.serve(5, "--attach")
    batch = prompts(3, 1000, [300, 330], seed=21)
    got = client(bed_cluster.bed, 5, "streams", target=bed_cluster.grpc(5), prompts=batch,
                 max_tokens=MAX_TOKENS, concurrency=3, timeout_s=120)  # fmt: skip
    for prompt, result in zip(batch, got, strict=True):
        assert result["error"] is None
        assert result["token_ids"] == hf_greedy(
            str(bed_cluster.model_dir), tuple(prompt), MAX_TOKENS
        )
    assert ready_workers(bed_cluster, "decode") and ready_workers(bed_cluster, "prefill")


def test_losing_the_head_ends_every_stream_cleanly(bed_cluster) -> None:  # type: ignore[no-untyped-def]
    """The head (Ray's GCS, the controller, the first front door) lost while the replica on
    host 5 streams: each stream either completes exactly or ends with an error, and none
    outlives its deadline. (Last: the cluster does not survive it.)"""
    bed = bed_cluster.bed
    batch = prompts(4, 1000, [300, 360], seed=31)
    args = {"target": bed_cluster.grpc(5), "prompts": batch, "max_tokens": LONG,
            "concurrency": 4, "timeout_s": 60}  # fmt: skip
    started = time.monotonic()
    reference = client(bed, 5, "streams", **args)
    fault_free_s = time.monotonic() - started
    run = bed.spawn(5, [sys.executable, "-m", "tests.multinode.client", "streams",
                        json.dumps(args)], "streams-losing-head.log")  # fmt: skip
    time.sleep(fault_free_s / 3)
    bed.stop_host(1)
    run.wait(120)  # the deadline (60 s) and the client's own exit: no stream may hang
    got = json.loads(bed.log_text("streams-losing-head.log").strip().splitlines()[-1])
    for result, want in zip(got, reference, strict=True):
        if result["error"] is None:
            assert result["token_ids"] == want["token_ids"]
        else:
            assert result["error"].split(":")[0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED",
                                                     "INTERNAL", "RESOURCE_EXHAUSTED")  # fmt: skip
