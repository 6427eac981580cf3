"""The chaos run's requests and their fault-free streams.

Prompts are text with multi-byte characters (emoji, CJK, Greek, accents), so prompts and
outputs split UTF-8 sequences across tokens and the detokenizer holds bytes back. Requests
rotate through three kinds, each testing one piece of state a retry must carry over:

    greedy   temperature 0
    seeded   temperature 0.9, top-k, a seed, presence and frequency penalties
    stop     greedy with a stop string taken from the middle of its own fault-free text,
             so it stops there whether or not a retry falls inside the stop window

The reference is one in-process engine (no cluster, nothing failing), which a cluster
stream must match chunk by chunk: token ids and text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.config import EngineConfig
from core.sampling import SamplingParams

Chunks = list[tuple[tuple[int, ...], str]]
"""A stream as a client saw it: each delta's (token ids, text)."""

TEXTS = (
    "naïve café ☕ crème brûlée",
    "東京タワーと富士山 🗻",
    "数据并行和张量并行 🤖",
    "Ελληνικά γράμματα ΑΒΓ",
    "한국어 문장 🎉🎉",
    "emoji family 👩‍👩‍👧‍👦 and flags 🇯🇵🇫🇷",
    "mathematics ∑∫√∞ ≈ ≠",
    "plain ASCII words in between",
    "Привет, мир! 🚀",
    "🙂🙃😉😊 smiles",
)
KINDS = ("greedy", "seeded", "stop")


@dataclass(frozen=True)
class RequestSpec:
    name: str
    kind: str
    text: str
    prompt: tuple[int, ...]
    params: SamplingParams


def make_specs(tokenizer: Any, num: int, max_tokens: int, seed: int) -> list[RequestSpec]:
    """`num` requests (their stop strings not yet chosen: see `with_stops`)."""
    rng = random.Random(seed)
    specs = []
    for i in range(num):
        kind = KINDS[i % len(KINDS)]
        text = " ".join(rng.choice(TEXTS) for _ in range(rng.randint(2, 10)))
        length = rng.randint(max_tokens // 2, max_tokens)
        if kind == "seeded":
            params = SamplingParams(
                max_tokens=length,
                temperature=0.9,
                top_k=200,
                seed=seed * 1000 + i,
                presence_penalty=0.3,
                frequency_penalty=0.2,
                ignore_eos=True,
            )
        else:
            params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
        specs.append(RequestSpec(f"{kind}{i}", kind, text, tuple(tokenizer.encode(text)), params))
    return specs


def reference_streams(model_dir: str | Path, specs: list[RequestSpec]) -> dict[str, Chunks]:
    """Each request's stream from one in-process engine, nothing failing."""
    from engine.engine import LLMEngine

    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=2048, num_threads=1))
    streams: dict[str, Chunks] = {s.name: [] for s in specs}
    for s in specs:
        engine.add_request(s.name, list(s.prompt), s.params)
    while engine.has_unfinished():
        for delta in engine.step():
            streams[delta.request_id].append((tuple(delta.new_token_ids), delta.new_text))
    return streams


def with_stops(
    specs: list[RequestSpec], streams: dict[str, Chunks], seed: int
) -> list[RequestSpec]:
    """The `stop` requests get a stop string: two characters first seen in the second half of
    their own fault-free text (none when the text has no such pair)."""
    rng = random.Random(seed)
    out = []
    for s in specs:
        text = "".join(t for _, t in streams[s.name])
        if s.kind == "stop":
            starts = [
                j for j in range(len(text) // 2, len(text) - 2) if text.find(text[j : j + 2]) == j
            ]
            if starts:
                j = rng.choice(starts)
                s = replace(s, params=replace(s.params, stop=(text[j : j + 2],)))
        out.append(s)
    return out


def workload(
    tokenizer: Any, model_dir: str | Path, num: int, max_tokens: int, seed: int
) -> tuple[list[RequestSpec], dict[str, Chunks]]:
    """The requests and their fault-free streams."""
    specs = make_specs(tokenizer, num, max_tokens, seed)
    specs = with_stops(specs, reference_streams(model_dir, specs), seed)
    return specs, reference_streams(model_dir, specs)
