"""A prefill worker's service-time profile: what the router simulator's queues replay.

    prefill_ms(U, C) = step_ms * ceil(U / chunk_tokens) + token_ms * U
                     + attn_ms * U * (C + U / 2) / 1000

for U new tokens after C cached ones: a cache hit saves the hit's own compute, not the
attention of the new tokens over it. Copying K tokens' KV from a peer prefill worker
(prefix migration) takes

    transfer_ms(K) = transfer_latency_ms + K * kv_bytes_per_token / transfer_gbps / 1e6

with the model's KV bytes per token and the KV transport's sustained rate between hosts
(bench.kv_transfer); a profile without them has no migration.

A profile is a small JSON file written by `python -m bench.worker_profile` from the engine's
own step totals (core.step_stats), the same numbers a router reads from load reports. The
default, `bench/profiles/cpu_small.json`, was measured on this project's build machine (the
Baton engine on CPU, `models/small`, one thread); its `source` field says how. Absolute
times scale with the hardware, so the simulator replays a trace at a chosen pool load
(bench.router_sim --load) rather than at the trace's own clock: the hit rates do not depend
on the profile, the queueing (TTFT, spills) depends on the load, not on which device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = PROFILES / "cpu_small.json"


@dataclass(frozen=True)
class WorkerProfile:
    step_ms: float
    token_ms: float
    chunk_tokens: int
    attn_ms: float = 0.0
    source: str = ""
    kv_bytes_per_token: float = 0.0
    transfer_gbps: float = 0.0
    transfer_latency_ms: float = 0.0

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PROFILE) -> WorkerProfile:
        raw = json.loads(Path(path).read_text())
        profile = cls(
            float(raw["step_ms"]),
            float(raw["token_ms"]),
            int(raw["chunk_tokens"]),
            float(raw.get("attn_ms", 0.0)),
            str(raw.get("source", path)),
            float(raw.get("kv_bytes_per_token", 0.0)),
            float(raw.get("transfer_gbps", 0.0)),
            float(raw.get("transfer_latency_ms", 0.0)),
        )
        transfer = (profile.kv_bytes_per_token, profile.transfer_gbps, profile.transfer_latency_ms)
        if min(profile.step_ms, profile.attn_ms, *transfer) < 0 or profile.token_ms <= 0:
            raise ValueError(f"{path}: not a usable profile: {raw}")
        if profile.chunk_tokens < 1:
            raise ValueError(f"{path}: chunk_tokens must be >= 1")
        return profile

    @property
    def can_transfer(self) -> bool:
        return self.kv_bytes_per_token > 0 and self.transfer_gbps > 0

    def transfer_ms(self, tokens: int) -> float:
        """Time to copy `tokens` tokens' KV from a peer prefill worker."""
        per_token = self.kv_bytes_per_token / (self.transfer_gbps * 1e6)
        return self.transfer_latency_ms + tokens * per_token

    def policy_args(self) -> dict[str, float]:
        """The `ttft` policy's transfer parameters (router.routing.policies.ttft)."""
        if not self.can_transfer:
            return {}
        return {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "transfer_gbps": self.transfer_gbps,
            "transfer_latency_s": self.transfer_latency_ms / 1000,
        }

    def num_steps(self, tokens: int) -> int:
        """Engine steps a prefill of `tokens` takes (at least one: the first token)."""
        return max(1, -(-tokens // self.chunk_tokens))

    def attention_ms(self, tokens: int, context: int = 0) -> float:
        """The attention part of `prefill_ms` (what an engine's step totals time apart)."""
        return self.attn_ms * tokens * (context + tokens / 2) / 1000

    def prefill_ms(self, tokens: int, context: int = 0) -> float:
        """Service time of `tokens` new prompt tokens after `context` cached ones."""
        attention = self.attention_ms(tokens, context)
        return self.step_ms * self.num_steps(tokens) + self.token_ms * tokens + attention
