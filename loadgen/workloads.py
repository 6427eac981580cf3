"""Workloads for the serving benchmark: what to send (token ids, output length) and when.

A workload is a list of `TraceRequest`s (loadgen.traces) whose prompts are drawn: token ids
and arrival offsets. Prompts are token-id
lists (sent as `prompt: [ids]` to /v1/completions) so lengths are exact and no tokenizer is
involved. Prefix sharing is expressed through *hash ids*, as in the Mooncake traces: each
id names one block of tokens, drawn deterministically from the id alone, so two requests
whose hash-id lists share their first k ids share their first k blocks of tokens, and the
prefix caches see exactly the reuse the trace describes.

Arrivals are either open-loop Poisson at a given rate (`poisson_arrivals`) or the trace's own
timestamps, time-scaled (`retime`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loadgen import traces
from loadgen.traces import TraceRequest


@dataclass(frozen=True)
class TokenSpace:
    """Token ids prompts are drawn from: [low, high). `low` skips the special tokens (BOS,
    EOS, pad sit at the bottom of every tiny-model vocabulary); 1000 fits every preset."""

    low: int = 16
    high: int = 1000

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high:
            raise ValueError(f"token space [{self.low}, {self.high}) is empty")


def block_tokens(hash_id: int, num_tokens: int, space: TokenSpace, seed: int = 0) -> list[int]:
    """The tokens of the block named `hash_id`: a pure function of (seed, hash id), so equal
    ids give equal blocks in every request, run and process (no `hash()` salt)."""
    digest = hashlib.blake2b(f"{seed}:{hash_id}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    span = space.high - space.low
    return [space.low + rng.randrange(span) for _ in range(num_tokens)]


def tokens_for_hash_ids(
    hash_ids: Sequence[int], input_length: int, block_size: int, space: TokenSpace, seed: int = 0
) -> list[int]:
    """A prompt of exactly `input_length` tokens: the blocks of `hash_ids` in order, the last
    one cut short (or, if the ids cover too little, padded with blocks of fresh ids derived
    from the last id, so a short id list never silently shortens the prompt)."""
    if input_length < 1:
        raise ValueError(f"input_length must be >= 1, got {input_length}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out: list[int] = []
    for h in hash_ids:
        if len(out) >= input_length:
            break
        out.extend(block_tokens(h, block_size, space, seed))
    pad = 0
    while len(out) < input_length:
        # Negative ids never occur in traces: these pad blocks cannot collide with real ones.
        last = hash_ids[-1] if hash_ids else 0
        out.extend(block_tokens(-(last * 1_000_003 + pad + 1), block_size, space, seed))
        pad += 1
    return out[:input_length]


# -- arrivals ---------------------------------------------------------------------------------


def poisson_arrivals(rate_per_s: float, num_requests: int, rng: random.Random) -> list[float]:
    """Arrival offsets of a Poisson process: exponential gaps with mean 1/rate. The first
    request waits one gap too, so every offset is a sample of the same process."""
    if rate_per_s <= 0:
        raise ValueError(f"the request rate must be > 0, got {rate_per_s}")
    t, out = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


def with_poisson_arrivals(
    requests: Sequence[TraceRequest], rate_per_s: float, seed: int
) -> list[TraceRequest]:
    """The same requests, in the same order, re-timed as a Poisson process."""
    times = poisson_arrivals(rate_per_s, len(requests), random.Random(seed))
    return [replace(r, arrival_ms=t * 1000) for r, t in zip(requests, times, strict=True)]


def retime(requests: Sequence[TraceRequest], time_scale: float) -> list[TraceRequest]:
    """Trace-timed arrivals, first at 0, gaps multiplied by `time_scale` (<1 compresses)."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not requests:
        return []
    t0 = min(r.arrival_ms for r in requests)
    return sorted(
        (replace(r, arrival_ms=(r.arrival_ms - t0) * time_scale) for r in requests),
        key=lambda r: r.arrival_ms,
    )


# -- synthetic workloads (arrival 0: give them arrivals with `with_poisson_arrivals`) --------


def _unique_prompt(rng: random.Random, n: int, space: TokenSpace) -> list[int]:
    return [space.low + rng.randrange(space.high - space.low) for _ in range(n)]


def fixed_lengths(
    num_requests: int, input_len: int, output_len: int, space: TokenSpace, seed: int = 0
) -> list[TraceRequest]:
    rng = random.Random(seed)
    return [
        TraceRequest.of_prompt(0.0, _unique_prompt(rng, input_len, space), output_len)
        for _ in range(num_requests)
    ]


def distributed_lengths(
    num_requests: int,
    input_len: int,
    output_len: int,
    space: TokenSpace,
    spread: float = 0.5,
    seed: int = 0,
) -> list[TraceRequest]:
    """Lengths uniform in [mean*(1-spread), mean*(1+spread)] (vLLM's `--random-range-ratio`)."""
    if not 0 <= spread < 1:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    rng = random.Random(seed)

    def draw(mean: int) -> int:
        return max(1, rng.randint(int(mean * (1 - spread)), int(mean * (1 + spread))))

    return [
        TraceRequest.of_prompt(0.0, _unique_prompt(rng, draw(input_len), space), draw(output_len))
        for _ in range(num_requests)
    ]


def long_prompt_mix(
    num_requests: int,
    space: TokenSpace,
    short_input: tuple[int, int] = (32, 96),
    short_output: tuple[int, int] = (48, 96),
    long_fraction: float = 0.15,
    long_factor: tuple[float, float] = (10.0, 50.0),
    long_output: tuple[int, int] = (16, 32),
    max_input: int = 3000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Mostly short chats plus `long_fraction` of prompts 10-50x a short one (documents to
    summarise): the mix where a long prefill stalls every stream decoding beside it."""
    if not 0 <= long_fraction <= 1:
        raise ValueError(f"long_fraction must be in [0, 1], got {long_fraction}")
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        n_in = rng.randint(*short_input)
        if rng.random() < long_fraction:
            n_in = min(max_input, int(n_in * rng.uniform(*long_factor)))
            n_out = rng.randint(*long_output)
        else:
            n_out = rng.randint(*short_output)
        out.append(TraceRequest.of_prompt(0.0, _unique_prompt(rng, n_in, space), n_out))
    return out


def from_trace(
    rows: Sequence[TraceRequest],
    block_size: int,
    space: TokenSpace,
    length_scale: float = 1.0,
    output_scale: float = 1.0,
    max_input: int | None = None,
    max_output: int | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """Trace rows with their prompts drawn: each keeps its arrival, its lengths scaled and
    capped, and the hash ids its prompt still covers. `block_size` is the trace's tokens per
    hash id; `length_scale` shrinks every block (and so every prompt) to fit a CPU while
    keeping block boundaries, so shared ids still mean shared prefixes."""
    if length_scale <= 0 or output_scale <= 0:
        raise ValueError("length_scale and output_scale must be > 0")
    scaled_block = max(1, round(block_size * length_scale))
    out = []
    for r in rows:
        n_in = max(1, round(r.input_length * length_scale))
        if max_input is not None:
            n_in = min(n_in, max_input)
        n_out = max(1, round(r.output_length * output_scale))
        if max_output is not None:
            n_out = min(n_out, max_output)
        prompt = tokens_for_hash_ids(r.hash_ids, n_in, scaled_block, space, seed)
        hash_ids = r.hash_ids[: -(-n_in // scaled_block)]
        out.append(replace(r, input_length=n_in, output_length=n_out, hash_ids=hash_ids,
                           prompt_token_ids=prompt))  # fmt: skip
    return out


def tenant_prefixes(
    space: TokenSpace, num_tenants: int, system_tokens: int, prefix_seed: int = 0
) -> list[list[int]]:
    """Each tenant's system prompt: blocks of hash ids of its own (tenant t owns ids
    t*1e6...), so prompts are the same for every run with the same `prefix_seed`."""
    num_blocks = -(-system_tokens // 16)
    prefixes = []
    for t in range(num_tenants):
        ids = range(t * 1_000_000, t * 1_000_000 + num_blocks)
        prefixes.append(tokens_for_hash_ids(ids, system_tokens, 16, space, prefix_seed))
    return prefixes


def shared_prefix(
    num_requests: int,
    space: TokenSpace,
    num_tenants: int = 8,
    system_tokens: int = 1024,
    user_tokens: int = 256,
    zipf_s: float = 0.0,
    output_len: int = 16,
    seed: int = 0,
    prefix_seed: int = 0,
) -> list[TraceRequest]:
    """Multi-tenant shared system prompts: a request is its tenant's system prompt (fixed by
    `prefix_seed`) plus a unique user part (drawn from `seed`); tenants Zipf(`zipf_s`)-popular
    (0: uniform). Runs that differ only in `seed` share the tenants but no whole prompt, so a
    sweep can keep the system prompts warm without replaying the previous run's requests."""
    if num_tenants < 1 or system_tokens < 1 or user_tokens < 1:
        raise ValueError("num_tenants, system_tokens and user_tokens must be >= 1")
    prefixes = tenant_prefixes(space, num_tenants, system_tokens, prefix_seed)
    rng = random.Random(seed)
    weights = [1.0 / (t + 1) ** zipf_s for t in range(num_tenants)]
    tenants = rng.choices(range(num_tenants), weights, k=num_requests)
    return [
        TraceRequest.of_prompt(
            0.0, prefixes[t] + _unique_prompt(rng, user_tokens, space), output_len
        )
        for t in tenants
    ]


def multi_turn(
    num_sessions: int,
    space: TokenSpace,
    turns: tuple[int, int] = (2, 6),
    think_time_s: float = 5.0,
    session_rate_per_s: float = 0.5,
    max_output: int = 64,
    block_size: int = 16,
    seed: int = 0,
) -> list[TraceRequest]:
    """Chat sessions (loadgen.traces.multi_turn): each turn's prompt is the previous
    prompt + a stand-in answer + a new message, with the trace's own (think-time) arrivals.
    The stand-in answer is fixed tokens, not the model's reply, so the load stays open-loop."""
    rows = traces.multi_turn(
        num_sessions=num_sessions, turns=turns, think_time_s=think_time_s,
        rate_per_s=session_rate_per_s, block_size=block_size, seed=seed,
    )  # fmt: skip
    return from_trace(rows, block_size, space, max_output=max_output, seed=seed)


def mooncake_trace(
    path: str | Path,
    space: TokenSpace,
    limit: int | None = None,
    block_size: int = 512,
    length_scale: float = 1 / 32,
    max_input: int | None = 3000,
    max_output: int | None = 128,
    seed: int = 0,
) -> list[TraceRequest]:
    """Mooncake JSONL (512-token hash-id blocks): 1/32 makes each block one 16-token KV block."""
    rows = traces.read_jsonl(path, limit)
    return from_trace(
        rows, block_size, space, length_scale, 1.0, max_input, max_output, seed
    )  # fmt: skip


def azure_trace(
    path: str | Path,
    space: TokenSpace,
    limit: int | None = None,
    length_scale: float = 0.25,
    output_scale: float = 0.5,
    max_input: int | None = 3000,
    max_output: int | None = 128,
    seed: int = 0,
) -> list[TraceRequest]:
    """Azure CSV (TIMESTAMP, ContextTokens, GeneratedTokens): no prefix data, every prompt is
    unique tokens; lengths scaled to fit a CPU (time scaling is `retime`'s job)."""
    rows = list(traces.read_azure_csv(path, block_size=16, limit=limit))
    return from_trace(
        rows, 16, space, length_scale, output_scale, max_input, max_output, seed
    )  # fmt: skip
