"""Trace generators and readers for the router benchmarks.

A trace is a list of requests in the Mooncake JSONL format:
    {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}
`hash_ids` name prefix-chained blocks of `block_size` tokens: equal ids = reusable KV.

    python -m bench.workloads shared_prefix --out /tmp/sp.jsonl
    python -m bench.workloads multi_turn --out /tmp/mt.jsonl
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TypedDict

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
"""The public traces beside the checkout (../shared/traces), wherever it is."""
DEFAULT_TRACE = {
    "mooncake": TRACES / "mooncake" / "synthetic_trace.jsonl",
    "azure": TRACES / "azure" / "AzureLLMInferenceTrace_conv.csv",
}


class TraceRequest(TypedDict):
    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


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
                timestamp=int(t),
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
                    timestamp=int(t),
                    input_length=len(chain) * block_size,
                    output_length=out_len,
                    hash_ids=list(chain),
                )
            )
            chain = chain + [next(ids) for _ in range(out_len // block_size)]  # the answer
            t += rng.expovariate(1 / think_time_s) * 1000
    out.sort(key=lambda r: r["timestamp"])
    return out


def read_jsonl(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    with open(path) as f:
        rows = [json.loads(line) for line in itertools.islice(f, limit) if line.strip()]
    for r in rows:
        if not {"timestamp", "input_length", "output_length", "hash_ids"} <= r.keys():
            raise ValueError(f"{path}: not a Mooncake-format trace line: {sorted(r)}")
    return rows  # type: ignore[return-value]


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
                timestamp=int(ts - t0),
                input_length=n,
                output_length=int(row["GeneratedTokens"]),
                hash_ids=[next(ids) for _ in range(n // block_size)],
            )


def write_jsonl(trace: list[TraceRequest], path: str | Path) -> None:
    with open(path, "w") as f:
        for r in trace:
            f.write(json.dumps(r) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["shared_prefix", "multi_turn"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gen = shared_prefix if args.kind == "shared_prefix" else multi_turn
    trace = gen(seed=args.seed)
    write_jsonl(trace, args.out)
    print(f"{len(trace)} requests -> {args.out}")


if __name__ == "__main__":
    main()
