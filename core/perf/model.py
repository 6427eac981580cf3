"""The formulas of the performance model (see the package docstring), in whatever unit the
coefficients carry. Each cost is the dot product of its coefficients with its terms, so the
fit (`core.perf.fit`) and every reader use the same terms."""

from __future__ import annotations

from dataclasses import dataclass

KILO = 1000.0
"""Attention and context coefficients are per thousand pairs / row-tokens (readable sizes)."""


def attention_pairs(new: int, context: int) -> int:
    """Query-key pairs of a prompt chunk's attention: its `new` tokens over the `context`
    computed before them and over each other (causal). What an engine counts in its step
    totals; the cost formulas use `attention_area`."""
    return new * context + new * (new + 1) // 2


def attention_area(new: int, context: int) -> float:
    """The performance model's measure of a chunk's attention: `new` * (`context` + `new` / 2),
    the pairs to within `new` / 2 (what profiles are fitted to and every price uses)."""
    return new * (context + new / 2)


def num_prefill_steps(tokens: int, chunk_tokens: int) -> int:
    """Engine steps a prefill of `tokens` takes at `chunk_tokens` a step (at least one: the
    first token); one where the chunk size is not known (0)."""
    return max(1, -(-tokens // chunk_tokens)) if chunk_tokens > 0 else 1


def prefill_terms(steps: int, tokens: int, cached: int) -> tuple[float, float, float]:
    return float(steps), float(tokens), attention_area(tokens, cached) / KILO


def decode_terms(batch: int, context: float) -> tuple[float, float, float]:
    return 1.0, float(batch), batch * context / KILO


def transfer_terms(nbytes: int) -> tuple[float, float]:
    return (1.0, float(nbytes))


def _dot(coeffs: tuple[float, ...], terms: tuple[float, ...]) -> float:
    return sum(c * x for c, x in zip(coeffs, terms, strict=True))


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """Time of a prefill: per engine step, per new token, per thousand attention pairs."""

    per_step: float
    per_token: float
    per_kpair: float = 0.0
    chunk_tokens: int = 0

    def __call__(self, tokens: int, cached: int = 0) -> float:
        steps = num_prefill_steps(tokens, self.chunk_tokens)
        return _dot((self.per_step, self.per_token, self.per_kpair),
                    prefill_terms(steps, tokens, cached))  # fmt: skip

    def attention(self, tokens: int, cached: int = 0) -> float:
        """The attention part of the prefill (what an engine's step totals time apart)."""
        return self.per_kpair * attention_area(tokens, cached) / KILO


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """Time of one decode step: fixed, per running row, per thousand row-tokens of context."""

    per_step: float
    per_row: float
    per_krow_token: float = 0.0

    def __call__(self, batch: int, mean_context: float) -> float:
        return _dot((self.per_step, self.per_row, self.per_krow_token),
                    decode_terms(batch, mean_context))  # fmt: skip


@dataclass(frozen=True, slots=True)
class TransferCost:
    """Time to move KV between workers: a fixed latency, then per token at a sustained rate."""

    latency: float
    per_token: float

    @classmethod
    def at_rate(
        cls, kv_bytes_per_token: float, gbps: float, latency: float, *, unit_s: float = 1.0
    ) -> TransferCost:
        """At `gbps` GB/s for KV of `kv_bytes_per_token`, in units of `unit_s` seconds
        (1e-3: milliseconds); free per token where the rate is not known (0)."""
        per_token = kv_bytes_per_token / (gbps * 1e9) / unit_s if gbps > 0 else 0.0
        return cls(latency, per_token)

    def __call__(self, tokens: int) -> float:
        return self.latency + self.per_token * tokens
