"""What the front doors (HTTP, gRPC) call: one `Backend` interface.

The cluster's orchestrator implements it (prefill -> KV transfer -> decode across Ray
workers); `LocalBackend` implements it with one in-process engine (tests, laptops). The
front doors know nothing else: they validate, tokenize, call `generate`, and map
`core.errors` exceptions to statuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from core.request import RequestOutput
from core.sampling import SamplingParams


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    timeout_s: float = 300.0
    """Deadline for the whole request, from now; past it: DeadlineExceededError."""


class Backend(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Any
    """engine.tokenizer.Tokenizer (torch-free): encode, decode, apply_chat_template."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs (all tokens so far, visible text so far), the last one with
        `finished=True`. Raises core.errors.* (InvalidRequestError, OverloadedError,
        DeadlineExceededError, WorkerFailedError). Closing the iterator early cancels the
        request and frees its blocks everywhere."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def is_ready(self) -> bool:
        """True when a request can be served now (both pools have a live worker)."""
        ...
