"""A measured profile of one worker: the performance model's coefficients in milliseconds,
as `baton profile` writes them to JSON and `baton plan`, the cluster simulator and the
`ttft` routing policy's transfer terms read them.

The JSON's keys: `step_ms`, `token_ms`, `attn_ms` (per thousand attention pairs) and
`chunk_tokens` for the prefill; `decode` {`decode_step_ms`, `decode_row_ms`,
`decode_ctx_ms`} for the decode step; `kv_bytes_per_token`, `transfer_gbps`,
`transfer_latency_ms` for moving KV between workers (0: not measured, no transfer
modelled); `tp`, the tensor-parallel size it was measured at; `source`, how.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.perf.model import DecodeCost, PrefillCost, TransferCost, num_prefill_steps


def _read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class WorkerProfile:
    """A prefill worker's service times and the KV transfer between workers, in ms."""

    step_ms: float
    token_ms: float
    chunk_tokens: int
    attn_ms: float = 0.0
    source: str = ""
    kv_bytes_per_token: float = 0.0
    transfer_gbps: float = 0.0
    transfer_latency_ms: float = 0.0
    tp: int = 1

    @classmethod
    def load(cls, path: str | Path) -> WorkerProfile:
        raw = _read(path)
        profile = cls(
            float(raw["step_ms"]),
            float(raw["token_ms"]),
            int(raw["chunk_tokens"]),
            float(raw.get("attn_ms", 0.0)),
            str(raw.get("source", path)),
            float(raw.get("kv_bytes_per_token", 0.0)),
            float(raw.get("transfer_gbps", 0.0)),
            float(raw.get("transfer_latency_ms", 0.0)),
            int(raw.get("tp", 1)),
        )
        transfer = (profile.kv_bytes_per_token, profile.transfer_gbps, profile.transfer_latency_ms)
        if min(profile.step_ms, profile.attn_ms, *transfer) < 0 or profile.token_ms <= 0:
            raise ValueError(f"{path}: not a usable profile: {raw}")
        if profile.chunk_tokens < 1:
            raise ValueError(f"{path}: chunk_tokens must be >= 1")
        if profile.tp < 1:
            raise ValueError(f"{path}: tp must be >= 1")
        return profile

    @property
    def prefill(self) -> PrefillCost:
        return PrefillCost(self.step_ms, self.token_ms, self.attn_ms, self.chunk_tokens)

    @property
    def transfer(self) -> TransferCost:
        return TransferCost.at_rate(
            self.kv_bytes_per_token, self.transfer_gbps, self.transfer_latency_ms, unit_s=1e-3
        )

    @property
    def can_transfer(self) -> bool:
        return self.kv_bytes_per_token > 0 and self.transfer_gbps > 0

    def transfer_ms(self, tokens: int) -> float:
        """Time to copy `tokens` tokens' KV from a peer worker."""
        return self.transfer(tokens)

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
        return num_prefill_steps(tokens, self.chunk_tokens)

    def attention_ms(self, tokens: int, context: int = 0) -> float:
        """The attention part of `prefill_ms`."""
        return self.prefill.attention(tokens, context)

    def prefill_ms(self, tokens: int, context: int = 0) -> float:
        """Service time of `tokens` new prompt tokens after `context` cached ones."""
        return self.prefill(tokens, context)


@dataclass(frozen=True)
class DecodeProfile:
    """A decode worker's step time, in ms."""

    step_ms: float
    row_ms: float
    ctx_ms: float
    """Per row per thousand tokens of context."""

    @classmethod
    def load(cls, path: str | Path) -> DecodeProfile:
        raw = _read(path).get("decode")
        if not raw:
            raise ValueError(f"{path}: no decode fit (measure it with `baton profile`)")
        return cls(raw["decode_step_ms"], raw["decode_row_ms"], raw["decode_ctx_ms"])

    @property
    def cost(self) -> DecodeCost:
        return DecodeCost(self.step_ms, self.row_ms, self.ctx_ms)

    def step(self, batch: int, mean_context: float) -> float:
        return self.cost(batch, mean_context)
