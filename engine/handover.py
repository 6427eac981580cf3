"""What an engine hands across the prefill / decode boundary: a prefilled prompt on the
prefill side, reserved blocks on the decode side (engine.engine makes both)."""

from __future__ import annotations

from dataclasses import dataclass

from core.request import OutputDelta, TokenLogprob


@dataclass(frozen=True)
class PrefillResult:
    """Prefill role: a prompt's KV is in `block_ids` and its first token is sampled."""

    request_id: str
    first_token: int
    logprob: TokenLogprob | None
    block_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    output: OutputDelta
    """`finished` when the first token already ends the request (nothing left to decode;
    the blocks are still held until `release`)."""
    backlog: tuple[int, int, int]
    """(arrived, ended, tokens): a load report taken after n engine steps counted `tokens`
    of it in its prefill backlog iff arrived <= n < ended (its steps when it arrived and
    when its prefill ended), at most `tokens` once it had started. The router uses this to
    correct a report that reaches it after the prefill's reply (router.routing.load)."""


@dataclass(frozen=True)
class Reservation:
    """Decode role: blocks reserved for a prompt (and any resumed output tokens: all of them
    `num_tokens`); the sender writes tokens [num_cached_tokens, num_tokens) into
    block_ids[num_cached_tokens // block_size:]."""

    request_id: str
    block_ids: list[int]
    num_cached_tokens: int
