"""Pieces chat and completions share: sampling parameters from the request body, whole
outputs from deltas, usage, finish reasons, token strings for logprobs, server-sent events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from core.errors import InvalidRequestError
from core.request import FinishReason, OutputDelta, RequestOutput, TokenLogprob
from core.sampling import SamplingParams
from core.structured import StructuredOutput
from router.frontdoor.backend import Backend
from router.frontdoor.http.errors import APIError, sse_error
from router.frontdoor.http.fanout import Choice, Prefetched
from router.frontdoor.http.protocol import (
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    SamplingFields,
    Usage,
)
from router.frontdoor.requests import SCALAR_SAMPLING_FIELDS, make_params

DONE_EVENT = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def now_s() -> int:
    return int(time.time())


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    vocab_size: int | None = None,
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """`structured` is the request's constraint when the caller already resolved it (tool
    calls); otherwise the body's own structured-output fields give it."""
    stop = body.stop
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and len(stop) > 16:
        raise InvalidRequestError("stop: at most 16 stop strings")
    if body.prompt_logprobs is not None and body.stream:  # as vLLM answers
        raise APIError(400, "prompt_logprobs: not available with stream=true", "invalid_value",
                       "prompt_logprobs")  # fmt: skip
    return make_params(
        max_tokens=max_tokens,
        stop=tuple(stop or ()),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logit_bias=logit_bias(body.logit_bias, vocab_size),
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        logprobs=logprobs,
        prompt_logprobs=body.prompt_logprobs,
        structured_outputs=structured or body.structured_output(),
        **{f: getattr(body, f) for f in SCALAR_SAMPLING_FIELDS},  # None: not set
    )


def logit_bias(bias: dict[str, float] | None, vocab_size: int | None) -> dict[int, float]:
    """OpenAI's `logit_bias` (JSON keys are strings) as token id -> bias, checked: ids in
    the vocabulary (when it is known), biases in [-100, 100]."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            token_id = -1
        if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
            raise APIError(400, f"logit_bias: {key!r} is not a token id", "invalid_value",
                           "logit_bias")  # fmt: skip
        if not -100.0 <= value <= 100.0:
            raise APIError(400, f"logit_bias: the bias of {key} must be in [-100, 100]",
                           "invalid_value", "logit_bias")  # fmt: skip
        out[token_id] = value
    return out


def first_asks_prompt_logprobs(params: list[SamplingParams]) -> list[SamplingParams]:
    """The choices of one prompt share its prompt logprobs: only the first computes them
    (such a request skips the prefix cache, so asking once saves the rest a full prefill)."""
    return params[:1] + [replace(p, prompt_logprobs=None) for p in params[1:]]


def prompt_logprobs(
    items: list[TokenLogprob | None] | None, token_text: TokenText
) -> PromptLogprobs | None:
    """The engine's prompt logprobs in vLLM's shape: the prompt token, then its top-n."""
    if items is None:
        return None
    out: PromptLogprobs = []
    for lp in items:
        if lp is None:
            out.append(None)
            continue
        ranked = [(lp.token_id, lp.logprob, lp.rank)]
        ranked += [(t, v, rank) for rank, (t, v) in enumerate(lp.top, start=1)]
        entry: dict[str, PromptLogprob] = {}
        for token_id, value, rank in ranked:
            entry.setdefault(
                str(token_id),
                PromptLogprob(logprob=value, rank=rank, decoded_token=token_text(token_id)),
            )
        out.append(entry)
    return out


def vocab_size(backend: Backend) -> int | None:
    return getattr(getattr(backend, "tokenizer", None), "vocab_size", None)


def accumulators(choices: list[Choice]) -> dict[int, RequestOutput]:
    """One whole output per choice, to add its deltas to (what usage and replies need)."""
    return {c.index: RequestOutput(str(c.index), c.prompt_token_ids) for c in choices}


async def collect(stream: Prefetched, choices: list[Choice]) -> list[RequestOutput]:
    """Run every choice to its end (a non-streaming reply): the whole outputs, in choice
    order."""
    outputs = accumulators(choices)
    try:
        async for index, delta in stream:
            outputs[index].add(delta)
    finally:
        await stream.aclose()
    return [outputs[c.index] for c in choices]


def finish_reason(out: OutputDelta | RequestOutput) -> str | None:
    if not out.finished:
        return None
    if out.finish_reason is None:
        return "stop"
    return str(out.finish_reason) if out.finish_reason != FinishReason.ERROR else "error"


def usage(prompt_lens: list[int], outputs: list[RequestOutput], n: int) -> Usage:
    """`outputs` in choice order, `n` choices per prompt. Prompt tokens count once per
    prompt (not per choice), as OpenAI does; cached tokens take each prompt's best choice."""
    num_prompt = sum(prompt_lens)
    num_completion = sum(len(o.token_ids) for o in outputs)
    num_cached = sum(
        max(o.num_cached_tokens for o in outputs[i * n : (i + 1) * n])
        for i in range(len(prompt_lens))
    )
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=num_completion,
        total_tokens=num_prompt + num_completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=min(num_prompt, num_cached)),
    )


class TokenText:
    """Token id -> its text, decoded alone (what OpenAI puts in logprobs), memoized."""

    def __init__(self, backend: Backend) -> None:
        self._tokenizer: Any = getattr(backend, "tokenizer", None)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"<{token_id}>"
            else:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def sse(obj: BaseModel) -> str:
    return f"data: {obj.model_dump_json()}\n\n"


async def sse_stream(events: AsyncIterator[str], on_close: Callable[[], Any]) -> AsyncIterator[str]:
    """Events, an error event if the stream fails midway, then `[DONE]`; `on_close` runs
    however it ends (client gone included), so the backend requests are cancelled."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        yield sse_error(e)
    finally:
        await on_close()
    yield DONE_EVENT
