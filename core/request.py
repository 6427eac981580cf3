"""Request outcome types shared by the engine, the workers and the front doors."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(enum.StrEnum):
    STOP = "stop"
    """A stop token, EOS or a stop string."""
    LENGTH = "length"
    """max_tokens, or the model's context."""
    ABORT = "abort"
    """Cancelled by the client or the cluster."""
    ERROR = "error"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, logprob) of the top-n alternatives, best first."""


@dataclass
class RequestTimings:
    """Wall-clock stamps (time.monotonic seconds) of a request's life in one engine."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def queued_s(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def prefill_s(self) -> float | None:
        if self.first_token is None or self.first_scheduled is None:
            return None
        return self.first_token - self.first_scheduled

    @property
    def decode_s(self) -> float | None:
        if self.finished is None or self.first_token is None:
            return None
        return self.finished - self.first_token

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


@dataclass
class RequestOutput:
    """What a finished (or streaming) request has produced so far."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended the request, if any."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (or over the wire, in decode role)."""
    logprobs: list[TokenLogprob] | None = None
    timings: RequestTimings = field(default_factory=RequestTimings)
    error: str | None = None
