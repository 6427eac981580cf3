"""A discrete-event model of a whole disaggregated cluster, driven by a `baton profile`: what
`baton plan` runs for each candidate (prefill workers, decode workers).

    arrival --route--> prefill worker (prefix cache, FIFO)  --KV transfer-->  decode worker
            (the router's        prefill_ms(uncached, cached)      latency +       (continuous
             own policy, fed     from the profile's fit            bytes / rate    batching)
             KV events and loads)

- Prefill: bench.sim_worker.SimWorker (an LRU prefix cache of the worker's KV blocks in
  front of a FIFO server) routed by Baton's Router with the cluster's policy, fed the same
  KV events and load reports a real one gets (bench.sim_run does this for the prefill pool
  alone). The first token leaves with the prefill's last step.
- Transfer: the prompt's KV (`kv_bytes_per_token`) at the profile's rate, plus its latency;
  free when the profile gives no rate.
- Decode: each worker runs steps back to back while it has requests; a step takes
  decode_step_ms + decode_row_ms * B + decode_ctx_ms * B * mean_context / 1000 (the
  profile's fit) and gives every running request one token. A request whose KV arrived joins
  at the next step boundary, if the worker has a free sequence slot and KV room for its whole
  length (else it waits, first in first out). Decode workers are picked by fewest tokens in
  flight, as Baton's decode policy does.

Per request: TTFT (arrival -> prefill done + first-token delivery) and ITL (mean time
between its later tokens); goodput is the share of requests that meet both targets.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.sim_profile import WorkerProfile
from bench.sim_run import percentile
from bench.sim_worker import SimWorker
from bench.workloads import TraceRequest
from engine.perf_profile import decode_terms
from router.routing.router import Router, RouterConfig


@dataclass(frozen=True)
class DecodeProfile:
    step_ms: float
    row_ms: float
    ctx_ms: float
    """Per row per thousand tokens of context."""

    @classmethod
    def load(cls, path: str | Path) -> DecodeProfile:
        raw = json.loads(Path(path).read_text()).get("decode")
        if not raw:
            raise ValueError(f"{path}: no decode fit (measure it with `baton profile`)")
        return cls(raw["decode_step_ms"], raw["decode_row_ms"], raw["decode_ctx_ms"])

    def step(self, batch: int, mean_context: float) -> float:
        terms = decode_terms(batch, mean_context)  # the fit `baton profile` made
        return sum(c * x for c, x in zip((self.step_ms, self.row_ms, self.ctx_ms), terms))


@dataclass
class _Running:
    index: int
    context: int
    left: int
    """Output tokens still to come from decode steps."""
    last_token_ms: float
    gaps: list[float] = field(default_factory=list)


class DecodeSim:
    """One decode worker: continuous batching on the profile's step time."""

    def __init__(self, profile: DecodeProfile, max_seqs: int, kv_tokens: int) -> None:
        self.profile, self.max_seqs, self.kv_tokens = profile, max_seqs, kv_tokens
        self.clock = 0.0
        self.running: list[_Running] = []
        self.waiting: deque[tuple[float, _Running]] = deque()  # (KV arrived, request)
        self.finished: dict[int, list[float]] = {}

    def tokens_in_flight(self) -> int:
        return sum(r.context + r.left for r in self.running) + sum(
            r.context + r.left for _, r in self.waiting
        )

    def add(self, kv_at_ms: float, index: int, prompt: int, left: int, first_token_ms: float):
        """A request whose KV lands at `kv_at_ms`; its first token left at `first_token_ms`
        (the prefill's), so its first gap here counts from then, as a client sees it."""
        self.waiting.append((kv_at_ms, _Running(index, prompt, left, first_token_ms)))

    def run_until(self, t: float) -> None:
        """Every step that starts before `t`."""
        while True:
            self._admit()
            if not self.running:
                if self.waiting and self.waiting[0][0] < t:
                    self.clock = max(self.clock, self.waiting[0][0])
                    continue
                if t != float("inf"):
                    self.clock = max(self.clock, t)
                return
            if self.clock >= t:
                return
            mean_ctx = sum(r.context for r in self.running) / len(self.running)
            self.clock += self.profile.step(len(self.running), mean_ctx)
            for r in list(self.running):
                r.gaps.append(self.clock - r.last_token_ms)
                r.last_token_ms, r.context, r.left = self.clock, r.context + 1, r.left - 1
                if r.left <= 0:
                    self.running.remove(r)
                    self.finished[r.index] = r.gaps

    def _admit(self) -> None:
        used = sum(r.context + r.left for r in self.running)
        while self.waiting and self.waiting[0][0] <= self.clock:
            r = self.waiting[0][1]
            full = len(self.running) >= self.max_seqs or used + r.context + r.left > self.kv_tokens
            if full and self.running:  # an empty worker takes even what does not fit
                return
            self.waiting.popleft()
            used += r.context + r.left
            if r.left <= 0:
                self.finished[r.index] = []
            else:
                self.running.append(r)


def simulate_cluster(
    trace: list[TraceRequest],
    prefill: WorkerProfile,
    decode: DecodeProfile,
    num_prefill: int,
    num_decode: int,
    policy: str = "cache_aware",
    block_size: int = 16,
    kv_blocks_per_worker: int = 4096,
    max_seqs: int = 64,
    first_token_ms: float = 0.0,
) -> list[dict[str, Any]]:
    """Per request (in trace order): ttft_ms, itl_ms (None for one output token), e2e_ms."""
    router = Router(RouterConfig(prefill_policy=policy, disagg_min_uncached_tokens=0))
    router.register_model("m", block_size=block_size)
    workers = [SimWorker(f"p{i}", kv_blocks_per_worker, prefill) for i in range(num_prefill)]
    by_id = {w.worker_id: w for w in workers}
    for w in workers:
        router.add_worker(w.worker_id, "prefill", "m")
    router.add_worker("d", "decode", "m")
    decoders = [DecodeSim(decode, max_seqs, kv_blocks_per_worker * block_size)
                for _ in range(num_decode)]  # fmt: skip
    pending: list[tuple[float, int, Any]] = []  # prefills in progress: (finish, n, ticket)
    out: list[dict[str, Any]] = []
    handoffs: list[tuple[float, int, int, int, float]] = []
    """(KV at decode, index, prompt, output tokens, first token out)"""
    for n, r in enumerate(trace):
        now = float(r["timestamp"])
        while pending and pending[0][0] <= now:
            _, _, ticket = heapq.heappop(pending)
            ticket.prefill_done()
            ticket.close()
        if n % 8 == 0:
            for w in workers:
                router.report_load(w.load(now))
        ticket = router.route("m", block_hashes=r["hash_ids"],
                              num_prompt_tokens=r["input_length"], request_id=f"q{n}")  # fmt: skip
        ticket.admit()
        w = by_id[ticket.decision.prefill_worker_id or ""]
        hit, _, events, _ = w.serve(r["hash_ids"])
        router.apply(w.batch(events))
        length = r["input_length"]
        cached = min(hit * block_size, length)
        done = w.enqueue(now, length, length - cached)
        heapq.heappush(pending, (done, n, ticket))
        kv_at = done + (prefill.transfer_ms(length) if prefill.can_transfer else 0.0)
        handoffs.append((kv_at, n, length, int(r["output_length"]), done + first_token_ms))
        out.append({"ttft_ms": done + first_token_ms - now, "arrival_ms": now})
    for _, _, ticket in pending:
        ticket.close()
    router.close()
    # Decode: requests go to the worker with the fewest tokens in flight, in KV arrival order.
    handoffs.sort()
    for kv_at, n, prompt, output, first_out in handoffs:
        for d in decoders:
            d.run_until(kv_at)
        target = min(decoders, key=DecodeSim.tokens_in_flight)
        target.add(kv_at, n, prompt, output - 1, first_out)
    for d in decoders:
        d.run_until(float("inf"))
        for index, gaps in d.finished.items():
            rec = out[index]
            rec["itl_ms"] = sum(gaps) / len(gaps) if gaps else None
            rec["e2e_ms"] = rec["ttft_ms"] + sum(gaps)
    return out


def summarize(records: list[dict[str, Any]], ttft_slo_ms: float, itl_slo_ms: float) -> dict:
    ttfts = [r["ttft_ms"] for r in records]
    itls = [r["itl_ms"] for r in records if r.get("itl_ms") is not None]
    good = sum(
        1
        for r in records
        if r["ttft_ms"] <= ttft_slo_ms and (r.get("itl_ms") is None or r["itl_ms"] <= itl_slo_ms)
    )
    return {
        "requests": len(records),
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "itl_p50_ms": percentile(itls, 0.5),
        "itl_p99_ms": percentile(itls, 0.99),
        "goodput": good / len(records) if records else 0.0,
    }
