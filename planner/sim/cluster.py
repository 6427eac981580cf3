"""A discrete-event model of a whole disaggregated cluster, driven by a `baton profile`: what
`baton plan` runs for each candidate (prefill workers, decode workers).

    arrival --route--> prefill worker (prefix cache, FIFO)  --KV transfer-->  decode worker
            (the router's        prefill_ms(uncached, cached)      latency +       (continuous
             own policy, fed     from the profile's fit            bytes / rate    batching)
             KV events and loads)      (a short uncached part: prefilled on the decode worker)

- Routing: Baton's Router with the cluster's prefill policy and its decode policy, fed the
  KV events and load reports real workers send (every 8 requests), so it decides as the
  real one does, conditional disaggregation included: a prompt whose part the chosen decode
  worker does not hold is shorter than `disagg_min_uncached_tokens` (256 in `baton serve`)
  is prefilled by that decode worker, inside its steps.
- Prefill: planner.sim.prefill.SimWorker (an LRU prefix cache of the worker's KV blocks in
  front of a FIFO server), from the request's arrival, while the decode worker reserves the
  prompt's blocks at the end of the step it is running; the KV moves once both are done.
  The first token leaves with the prefill's last step.
  (The front door's gate lets a waiter with a longer cached prefix go first,
  router.cluster.prefill_gate; this model looks each prompt up in the cache when it arrives
  and keeps arrival order, as bench.routing.router_sim's queued workers do with
  `--gate-max-skips 0`.)
- Transfer: the prompt's KV (`kv_bytes_per_token`) at the profile's rate, plus its latency;
  free when the profile gives no rate.
- Decode: planner.sim.decode.DecodeSim, continuous batching with prompt chunks mixed in. A
  request whose KV arrived joins at the next step boundary if the worker has a free
  sequence slot and KV room for its whole length (else it waits, first in first out).

The decode workers move in step with the arrivals: before each request is routed, every
transfer that landed by then is handed over and every decode worker has run its steps up to
that moment, so the router reads their caches and loads as they stand.

Per request: TTFT (arrival -> prefill done + first-token delivery) and ITL (mean time
between its later tokens); goodput is the share of requests that meet both targets.

Serving overhead (`RequestOverhead`): what a served request spends outside the engines'
steps before its first token -- the door, the calls between front door and workers, the
output stream back -- measured on a live server at idle (bench/planning/request_overhead.py), one
figure for a request its decode worker prefills and one for a request that goes through the
prefill pool (reserve, prefill, admit: more calls). Added to each TTFT: it moves no work,
so it does not change the queues.

The host's CPUs (`host`, planner/sim/host.py), when given: every step of every worker, and a
first token's serving overhead, stretch by what the host's cores are doing then (the other
engines stepping, the serving work the recent requests and tokens ask for), and every token
a decode worker emits, and every arrival, is serving work on those cores. Without it the
engines never wait for a core.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from core.perf import DecodeProfile, WorkerProfile
from loadgen.traces import TraceRequest
from planner.sim.decode import DecodeSim
from planner.sim.host import HostCPU
from planner.sim.prefill import SimWorker
from planner.sim.prefill_pool import percentile
from router.routing.route import Router, RouterConfig
from router.routing.ticket import Ticket

__all__ = [
    "DecodeProfile", "DecodeSim", "HostCPU", "RequestOverhead", "simulate_cluster", "summarize",
]  # fmt: skip


@dataclass(frozen=True)
class RequestOverhead:
    """Milliseconds a request's first token takes beyond the engine steps that compute it."""

    local_ms: float = 0.0
    """Prefilled by its decode worker: door -> generate -> output stream -> client."""
    disagg_ms: float = 0.0
    """Through the prefill pool: door -> reserve and prefill at once -> admit -> output
    stream."""


_REPORT_EVERY = 8
"""Requests between load reports (the real door polls every 50 ms)."""


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
    overhead: RequestOverhead = RequestOverhead(),
    disagg_min_uncached_tokens: int = 0,
    workers_out: dict[str, dict[str, float]] | None = None,
    host: HostCPU | None = None,
) -> list[dict[str, Any]]:
    """Per request (in trace order): ttft_ms, itl_ms (None for one output token), e2e_ms,
    and on_decode (prefilled by its decode worker). `workers_out`, when given, gets each
    worker's busy time, steps, decode rows and prefill tokens (as its step totals count)."""
    router = Router(RouterConfig(
        prefill_policy=policy, disagg_min_uncached_tokens=disagg_min_uncached_tokens,
    ))  # fmt: skip
    router.register_model("m", block_size=block_size)
    workers = [SimWorker(f"p{i}", kv_blocks_per_worker, prefill) for i in range(num_prefill)]
    by_id = {w.worker_id: w for w in workers}
    for w in workers:
        router.add_worker(w.worker_id, "prefill", "m")
    decoders = {
        f"d{i}": DecodeSim(
            decode, max_seqs, kv_blocks_per_worker * block_size, prefill, f"d{i}", block_size
        )
        for i in range(num_decode)
    }
    for d in decoders.values():
        router.add_worker(d.worker_id, "decode", "m")

    def busy(at_ms: float, but: object = None) -> int:
        """Engines stepping at `at_ms`, `but` one."""
        return sum(1 for w in workers if w is not but and w.busy_until > at_ms) + sum(
            1 for d in decoders.values() if d is not but and d.running
        )

    for d in decoders.values():
        d.host = host
        d.busy_elsewhere = lambda at, d=d: busy(at, d)
    prefilling: list[tuple[float, int, Ticket]] = []  # on prefill workers: (finish, n, ticket)
    on_decode: list[tuple[int, Ticket, DecodeSim]] = []  # prefills on their decode worker
    handoffs: list[tuple[float, int, str, int, int]] = []
    """Transfers on their way: (KV at decode, n, decode worker, prompt, output)"""
    out: list[dict[str, Any]] = []
    hashes_of = [r.hash_ids for r in trace]

    def advance(now: float) -> None:
        while handoffs and handoffs[0][0] <= now:
            kv_at, n, d_id, prompt, output = heapq.heappop(handoffs)
            for d in decoders.values():
                d.run_until(kv_at)
            decoders[d_id].add(kv_at, n, prompt, output - 1, hashes_of[n])
        for d in decoders.values():
            d.run_until(now)
            for batch in d.take_events():
                router.apply(batch)
        while prefilling and prefilling[0][0] <= now:
            _, _, ticket = heapq.heappop(prefilling)
            ticket.prefill_done()
            ticket.close()
        for item in [x for x in on_decode if x[2].first_token_ms.get(x[0], now + 1) <= now]:
            item[1].prefill_done()
            item[1].close()
            on_decode.remove(item)

    for n, r in enumerate(trace):
        now = float(r.arrival_ms)
        advance(now)
        if host is not None:
            host.request(now)
        if n % _REPORT_EVERY == 0:
            for w in workers:
                router.report_load(w.load(now))
            for d in decoders.values():
                router.report_load(d.load(now))
        hashes, length = r.hash_ids, r.input_length
        output = int(r.output_length)
        ticket = router.route("m", block_hashes=hashes, num_prompt_tokens=length,
                              num_output_tokens=output, request_id=f"q{n}")  # fmt: skip
        ticket.admit()
        decision = ticket.decision
        d = decoders[decision.decode_worker_id]
        d_hit = d.cached_blocks(hashes)  # its reservation reuses these; they are not sent
        out.append({"arrival_ms": now, "on_decode": decision.prefill_on_decode})
        if decision.prefill_on_decode:
            d.add_prefill(now, n, length, d_hit * block_size, output - 1, hashes)
            on_decode.append((n, ticket, d))
            continue
        w = by_id[decision.prefill_worker_id or ""]
        hit, _, events, _ = w.serve(hashes)
        router.apply(w.batch(events))
        cached = min(hit * block_size, length)
        # The decode worker reserves the blocks on its engine thread, between two of its steps
        # (worker/base.py `reserve`), while the prefill worker computes the prompt (the door
        # makes both calls at once: router/cluster/attempt.py); the KV goes once both are.
        reserved_at = max(now, d.clock)
        # the host as it is when the prompt is queued: a prefill worker's FIFO is priced at
        # enqueue, not stepped, so a job that starts later keeps the stretch of its arrival
        stretch = 1.0 if host is None else host.stretch(now, 1 + busy(now, w))
        done = w.enqueue(now, length, length - cached, stretch=stretch)
        heapq.heappush(prefilling, (done, n, ticket))
        sent = max(0, length - d_hit * block_size)  # blocks the decode worker holds stay
        kv_at = max(done, reserved_at) + (
            prefill.transfer_ms(sent) if prefill.can_transfer else 0.0
        )
        if output > 1:
            heapq.heappush(handoffs, (kv_at, n, d.worker_id, length, output))
        else:  # the prefill worker's reply ends it: the decode worker drops its reservation
            extra = overhead.disagg_ms * (1.0 if host is None else host.stretch(done, busy(done)))
            out[-1].update(ttft_ms=done + extra - now, itl_ms=None)
            out[-1]["e2e_ms"] = out[-1]["ttft_ms"]
    advance(float("inf"))
    for _, ticket, _ in prefilling:
        ticket.close()
    for _, ticket, _ in on_decode:
        ticket.close()
    router.close()
    if workers_out is not None:
        for w in workers:
            t = w.load(float("inf")).steps  # every job done: all in the step totals
            workers_out[w.worker_id] = _busy(t.forward_s, t.steps, 0, t.prefill_tokens)
        for d in decoders.values():
            workers_out[d.worker_id] = _busy(
                d.busy_ms / 1000, d.num_steps, d.num_rows, d.num_prefill_tokens
            )
    for d in decoders.values():
        for index, first in d.first_token_ms.items():
            rec = out[index]
            extra = overhead.local_ms if rec["on_decode"] else overhead.disagg_ms
            extra *= d.stretch_at_first.get(index, 1.0)
            rec["ttft_ms"] = first + extra - rec["arrival_ms"]
        for index, gaps in d.finished.items():
            rec = out[index]
            rec["itl_ms"] = sum(gaps) / len(gaps) if gaps else None
            rec["e2e_ms"] = rec["ttft_ms"] + sum(gaps)
    return out


def _busy(seconds: float, steps: int, rows: int, prefill_tokens: int) -> dict[str, float]:
    return {"busy_s": seconds, "steps": steps, "decode_rows": rows,
            "prefill_tokens": prefill_tokens}  # fmt: skip


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
