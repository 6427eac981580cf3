"""Running one request against the backend while recording what the front door saw of it:
TTFT, TPOT, latency, tokens and the outcome (router.frontdoor.metrics)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from core.errors import (
    CancelledError,
    DeadlineExceededError,
    InvalidRequestError,
    OverloadedError,
)
from core.request import OutputDelta
from router.frontdoor.backend import Backend, GenerateRequest
from router.frontdoor.metrics import Metrics, RequestRecord

logger = logging.getLogger(__name__)
_LOG_LEVELS = {
    "success": logging.DEBUG, "cancelled": logging.DEBUG,
    "invalid": logging.INFO, "overloaded": logging.INFO,
}  # fmt: skip
"""Outcome -> the level of its log line (which names the request id, so the client's
X-Request-Id finds it); the rest (deadline, failed) are the server's to look at."""


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
    return "failed"  # WorkerFailedError, or anything unexpected


async def run_tracked(
    backend: Backend, request: GenerateRequest, metrics: Metrics
) -> AsyncGenerator[OutputDelta]:
    """`backend.generate(request)`, recording TTFT, TPOT, latency and the outcome.

    Closing this iterator early closes the backend's, which aborts the request and frees
    its blocks; the outcome is then `cancelled`.
    """
    start = time.monotonic()
    first_token_at: float | None = None
    prefilled_by = ""
    last: OutputDelta | None = None
    num_output_tokens = 0
    error: BaseException | None = None
    try:
        deltas_iter: AsyncGenerator[OutputDelta] = backend.generate(request)  # type: ignore[assignment]
        async with aclosing(deltas_iter) as deltas:
            async for delta in deltas:
                if first_token_at is None and delta.new_token_ids:
                    first_token_at = time.monotonic()
                    prefilled_by = delta.prefilled_by
                num_output_tokens += len(delta.new_token_ids)
                last = delta
                yield delta
    except BaseException as e:
        error = e
        raise
    finally:
        if error is None and (last is None or not last.finished):
            error = CancelledError("the client went away")
        end = time.monotonic()
        outcome = outcome_of(error)
        logger.log(
            _LOG_LEVELS.get(outcome, logging.WARNING),
            "request %s: %s after %.3f s, %d prompt + %d output tokens%s",
            request.request_id, outcome, end - start, len(request.prompt_token_ids),
            num_output_tokens, f" ({error})" if error and outcome != "cancelled" else "",
        )  # fmt: skip
        metrics.observe_request(
            RequestRecord(
                outcome=outcome,
                ttft_s=None if first_token_at is None else first_token_at - start,
                e2e_s=end - start if error is None else None,
                queue_s=None if last is None else last.timings.queued_s,
                num_prompt_tokens=len(request.prompt_token_ids),
                num_output_tokens=num_output_tokens,
                num_cached_tokens=0 if last is None else last.num_cached_tokens,
                num_draft_tokens=0 if last is None else last.num_draft_tokens,
                num_accepted_tokens=0 if last is None else last.num_accepted_tokens,
                tenant=request.tenant,
                prefilled_by=prefilled_by,
                request_id=request.request_id,
            )
        )
