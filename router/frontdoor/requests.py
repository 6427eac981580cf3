"""What the HTTP and gRPC front doors share: turning validated input into a
`GenerateRequest`, and running it against the backend while recording its metrics.

Torch-free: imports only `core`, the `Backend` interface and the metrics.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Protocol

from core.errors import (
    CancelledError,
    DeadlineExceededError,
    InvalidRequestError,
    OverloadedError,
    WorkerFailedError,
)
from core.request import RequestOutput
from core.sampling import SamplingParams
from router.frontdoor.backend import Backend, GenerateRequest
from router.frontdoor.metrics import Metrics, RequestRecord

DEFAULT_TIMEOUT_S = 300.0


class TokenizerLike(Protocol):
    """What the front doors use of `engine.tokenizer.Tokenizer` (torch-free)."""

    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str: ...


def tokenizer_of(backend: Backend) -> TokenizerLike:
    """The backend's tokenizer (`Backend.tokenizer`; not yet in the protocol's text)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        raise TypeError(f"{type(backend).__name__} has no tokenizer attribute")
    return tokenizer  # type: ignore[no-any-return]


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def make_params(**fields: Any) -> SamplingParams:
    """SamplingParams from fields that are set (None means default); a bad value is an
    InvalidRequestError with the parameter named."""
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(str(e)) from e


def check_prompt(prompt_token_ids: list[int], max_model_len: int, vocab_size: int | None) -> None:
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty")
    if len(prompt_token_ids) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(prompt_token_ids)} tokens; this model's context holds "
            f"{max_model_len} tokens (prompt plus at least one generated token)"
        )
    if vocab_size is not None:
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
            )


def resolve_max_tokens(requested: int | None, num_prompt_tokens: int, max_model_len: int) -> int:
    """`requested` if the context has room for it; None means "up to the context"."""
    room = max_model_len - num_prompt_tokens
    if requested is None:
        return room
    if requested > room:
        raise InvalidRequestError(
            f"max_tokens={requested} is too large: the prompt has {num_prompt_tokens} tokens "
            f"and this model's context holds {max_model_len}, leaving room for {room}"
        )
    return requested


def vocab_size_of(backend: Backend) -> int | None:
    return getattr(getattr(backend, "tokenizer", None), "vocab_size", None)


def outcome_of(error: BaseException | None) -> str:
    if error is None:
        return "success"
    if isinstance(error, InvalidRequestError):
        return "invalid"
    if isinstance(error, OverloadedError):
        return "overloaded"
    if isinstance(error, DeadlineExceededError):
        return "deadline"
    if isinstance(error, CancelledError | asyncio.CancelledError | GeneratorExit):
        return "cancelled"
    if isinstance(error, WorkerFailedError):
        return "failed"
    return "failed"


async def run_tracked(
    backend: Backend, request: GenerateRequest, metrics: Metrics
) -> AsyncGenerator[RequestOutput]:
    """`backend.generate(request)`, recording TTFT, TPOT, latency and the outcome.

    Closing this iterator early closes the backend's, which aborts the request and frees
    its blocks; the outcome is then `cancelled`.
    """
    start = time.monotonic()
    first_token_at: float | None = None
    last: RequestOutput | None = None
    error: BaseException | None = None
    try:
        outputs_iter: AsyncGenerator[RequestOutput] = backend.generate(request)  # type: ignore[assignment]
        async with aclosing(outputs_iter) as outputs:
            async for out in outputs:
                if first_token_at is None and out.token_ids:
                    first_token_at = time.monotonic()
                last = out
                yield out
    except BaseException as e:
        error = e
        raise
    finally:
        if error is None and (last is None or not last.finished):
            error = CancelledError("the client went away")
        end = time.monotonic()
        metrics.observe_request(
            RequestRecord(
                outcome=outcome_of(error),
                ttft_s=None if first_token_at is None else first_token_at - start,
                e2e_s=end - start if error is None else None,
                queue_s=None if last is None else last.timings.queued_s,
                num_prompt_tokens=len(request.prompt_token_ids),
                num_output_tokens=0 if last is None else len(last.token_ids),
                num_cached_tokens=0 if last is None else last.num_cached_tokens,
            )
        )
