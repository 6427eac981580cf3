"""Prefill on one host, decode on another: KV crosses the bed's bridge over a network
backend (never loopback, never shm) and greedy output is exactly transformers'."""

from __future__ import annotations

from tests.cluster.helpers import prompts
from tests.multinode.bed import client
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
        assert result["token_ids"] == hf_greedy(str(bed_cluster.model_dir), tuple(prompt), MAX_TOKENS)
    moved = client(bed, 1, "metric", url=bed_cluster.http(1), name="baton:kv_transfer_bytes_total")
    assert moved > 0
    log = bed.log_text("frontdoor-h1.log")  # the workers' logs reach the driver's
    assert "connected to peer decode-1 over nixl" in log or "over ucx" in log, log[-3000:]
