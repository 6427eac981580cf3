"""A workload as trace rows: its one request type, the trace readers and writers, and the
synthetic trace generators of the routing benchmarks.

A trace is a list of requests in the Mooncake JSONL format:
    {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}
`hash_ids` name prefix-chained blocks of `block_size` tokens: equal ids = reusable KV.

    python -m loadgen.traces shared_prefix --out /tmp/sp.jsonl
    python -m loadgen.traces multi_turn --out /tmp/mt.jsonl
    python -m loadgen.traces light_then_burst --out /tmp/ltb.jsonl
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from core import env as baton_env

REPO = Path(__file__).resolve().parents[1]
"""The checkout this file is in (a worktree, a clone, an installed copy's source tree)."""


def traces_dir() -> Path:
    """The public traces (their provenance: PROVENANCE.md in that folder): $BATON_TRACES if set,
    else `shared/traces` beside the checkout (../shared/traces from the repo root), else
    inside it. Never an absolute path of one machine."""
    given = baton_env.TRACES.get()
    if given:
        return Path(given)
    candidates = [REPO.parent / "shared" / "traces", REPO / "shared" / "traces"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def resolve_trace(path: str | Path) -> Path:
    """A trace path as given on a command line: absolute, relative to the working directory,
    or relative to the repo root (`../shared/traces/mooncake/...` works from anywhere)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return (REPO / p).resolve()


TRACES = traces_dir()
DEFAULT_TRACE = {
    "mooncake": TRACES / "mooncake" / "synthetic_trace.jsonl",
    "azure": TRACES / "azure" / "AzureLLMInferenceTrace_conv.csv",
}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload, as the simulators and the load generator both read it: when
    it arrives, how long its prompt and its output are, which prefix blocks its prompt is
    made of, and, once a load generator has drawn them (loadgen.workloads), its prompt's
    token ids."""

    arrival_ms: float
    """From the start of the trace (Mooncake's `timestamp`)."""
    input_length: int
    """Prompt tokens."""
    output_length: int
    """Output tokens asked for (`max_tokens`)."""
    hash_ids: Sequence[int] = ()
    """The prompt's blocks, prefix-chained: two requests share their first k ids exactly when
    they share their first k blocks. Empty where the workload says nothing of prefixes."""
    prompt_token_ids: list[int] | None = None
    """The prompt itself; None in a trace no load generator has drawn tokens for yet."""

    @property
    def arrival_s(self) -> float:
        return self.arrival_ms / 1000

    @classmethod
    def of_prompt(
        cls, arrival_s: float, prompt_token_ids: list[int], output_length: int
    ) -> TraceRequest:
        """A request given by its tokens (no prefix blocks named), arriving at `arrival_s`."""
        return cls(arrival_s * 1000, len(prompt_token_ids), output_length, (), prompt_token_ids)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> TraceRequest:
        """A Mooncake-format row."""
        return cls(row["timestamp"], row["input_length"], row["output_length"], row["hash_ids"])

    def to_json(self) -> dict[str, Any]:
        """The Mooncake-format row (the prompt's tokens are not part of it)."""
        return {
            "timestamp": self.arrival_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }


def shared_prefix(
    num_requests: int = 4000,
    num_tenants: int = 24,
    system_blocks: tuple[int, int] = (8, 32),
    user_blocks: tuple[int, int] = (1, 6),
    zipf_s: float = 1.1,
    rate_per_s: float = 40.0,
    block_size: int = 16,
    seed: int = 0,
) -> list[TraceRequest]:
    """Multi-tenant: each tenant has its own system prompt (+ a few-shot block shared by
    half the tenants); a request is its tenant's prefix plus a unique user part. Tenants are
    Zipf-popular, arrivals Poisson."""
    rng = random.Random(seed)
    ids = itertools.count()
    weights = [1.0 / (t + 1) ** zipf_s for t in range(num_tenants)]
    prefixes = [[next(ids) for _ in range(rng.randint(*system_blocks))] for _ in range(num_tenants)]
    out: list[TraceRequest] = []
    t = 0.0
    for _ in range(num_requests):
        t += rng.expovariate(rate_per_s) * 1000
        tenant = rng.choices(range(num_tenants), weights)[0]
        hashes = prefixes[tenant] + [next(ids) for _ in range(rng.randint(*user_blocks))]
        tail = rng.randint(0, block_size - 1)
        out.append(
            TraceRequest(
                arrival_ms=int(t),
                input_length=len(hashes) * block_size + tail,
                output_length=rng.randint(16, 256),
                hash_ids=hashes,
            )
        )
    return out


def multi_turn(
    num_sessions: int = 400,
    turns: tuple[int, int] = (2, 10),
    system_prompts: int = 4,
    system_blocks: int = 16,
    turn_blocks: tuple[int, int] = (1, 8),
    think_time_s: float = 20.0,
    rate_per_s: float = 4.0,
    block_size: int = 16,
    seed: int = 0,
) -> list[TraceRequest]:
    """Chat sessions: turn k's prompt = turn k-1's prompt + its answer + a new user message,
    so each turn extends the previous chain. Sessions start Poisson, turns follow after an
    exponential think time."""
    rng = random.Random(seed)
    ids = itertools.count()
    systems = [[next(ids) for _ in range(system_blocks)] for _ in range(system_prompts)]
    out: list[TraceRequest] = []
    start = 0.0
    for _ in range(num_sessions):
        start += rng.expovariate(rate_per_s) * 1000
        chain = list(rng.choice(systems))
        t = start
        for _turn in range(rng.randint(*turns)):
            chain = chain + [next(ids) for _ in range(rng.randint(*turn_blocks))]
            out_len = rng.randint(32, 256)
            out.append(
                TraceRequest(
                    arrival_ms=int(t),
                    input_length=len(chain) * block_size,
                    output_length=out_len,
                    hash_ids=list(chain),
                )
            )
            chain = chain + [next(ids) for _ in range(out_len // block_size)]  # the answer
            t += rng.expovariate(1 / think_time_s) * 1000
    out.sort(key=lambda r: r.arrival_ms)
    return out


def light_then_burst(
    num_prompts: int = 50,
    light_requests: int = 300,
    burst_requests: int = 3000,
    light_gap_ms: float = 1000.0,
    burst_rate_per_s: float = 200.0,
    shared_blocks: int = 1,
    system_blocks: tuple[int, int] = (8, 40),
    user_blocks: tuple[int, int] = (1, 6),
    zipf_s: float = 0.8,
    block_size: int = 16,
    seed: int = 0,
) -> list[TraceRequest]:
    """A quiet start, then a burst: `light_requests` spaced `light_gap_ms` apart (choose a gap
    longer than any prefill, so no queue ever forms), then `burst_requests` Poisson at
    `burst_rate_per_s` (choose one that saturates the pool). Every prompt is one of
    `num_prompts` system prompts (Zipf-popular) plus a unique user part, and all system
    prompts open with the same `shared_blocks` (a chat template's header): the pattern in
    which routers that follow the longest prefix while no queue pushes back pin every
    prompt to the first worker they saw."""
    rng = random.Random(seed)
    ids = itertools.count()
    header = [next(ids) for _ in range(shared_blocks)]
    systems = [
        header + [next(ids) for _ in range(rng.randint(*system_blocks))] for _ in range(num_prompts)
    ]
    weights = [1.0 / (k + 1) ** zipf_s for k in range(num_prompts)]
    order = list(range(num_prompts))
    rng.shuffle(order)  # the light phase sees every prompt early, in random order
    out: list[TraceRequest] = []
    t = 0.0
    for n in range(light_requests + burst_requests):
        if n < light_requests:
            prompt = order[n] if n < num_prompts else rng.choices(range(num_prompts), weights)[0]
            t += light_gap_ms
        else:
            prompt = rng.choices(range(num_prompts), weights)[0]
            t += rng.expovariate(burst_rate_per_s) * 1000
        hashes = systems[prompt] + [next(ids) for _ in range(rng.randint(*user_blocks))]
        out.append(
            TraceRequest(
                arrival_ms=int(t),
                input_length=len(hashes) * block_size + rng.randint(0, block_size - 1),
                output_length=rng.randint(16, 256),
                hash_ids=hashes,
            )
        )
    return out


def read_jsonl(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    with open(path) as f:
        rows = [json.loads(line) for line in itertools.islice(f, limit) if line.strip()]
    for r in rows:
        if not {"timestamp", "input_length", "output_length", "hash_ids"} <= r.keys():
            raise ValueError(f"{path}: not a Mooncake-format trace line: {sorted(r)}")
    return [TraceRequest.from_json(r) for r in rows]


def read_azure_csv(
    path: str | Path, block_size: int = 16, limit: int | None = None
) -> Iterator[TraceRequest]:
    """Azure LLM inference traces: load only (no prefix data), so every block id is unique."""
    ids = itertools.count()
    t0 = None
    with open(path) as f:
        for row in itertools.islice(csv.DictReader(f), limit):
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp() * 1000
            t0 = ts if t0 is None else t0
            n = int(row["ContextTokens"])
            yield TraceRequest(
                arrival_ms=int(ts - t0),
                input_length=n,
                output_length=int(row["GeneratedTokens"]),
                hash_ids=[next(ids) for _ in range(n // block_size)],
            )


def write_jsonl(trace: list[TraceRequest], path: str | Path) -> None:
    with open(path, "w") as f:
        for r in trace:
            f.write(json.dumps(r.to_json()) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["shared_prefix", "multi_turn", "light_then_burst"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gen = {"shared_prefix": shared_prefix, "multi_turn": multi_turn}.get(args.kind)
    trace = (gen or light_then_burst)(seed=args.seed)
    write_jsonl(trace, args.out)
    print(f"{len(trace)} requests -> {args.out}")


if __name__ == "__main__":
    main()
