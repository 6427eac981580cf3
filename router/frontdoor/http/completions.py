"""`POST /v1/completions`: text (or token-id) prompts, `n` choices each, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from core.errors import InvalidRequestError
from core.request import RequestOutput, TokenLogprob
from router.frontdoor.http.common import (
    SSE_HEADERS,
    TokenText,
    finish_reason,
    now_s,
    sampling_params,
    sse,
    sse_stream,
    usage,
)
from router.frontdoor.http.context import ServerContext
from router.frontdoor.http.fanout import Choice, Prefetched, generate_choices, seeded
from router.frontdoor.http.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from router.frontdoor.requests import (
    check_prompt,
    new_request_id,
    resolve_max_tokens,
    tokenizer_of,
    vocab_size_of,
)


@dataclass(frozen=True)
class _Prompt:
    token_ids: list[int]
    text: str


def _prompts(body: CompletionRequest, ctx: ServerContext) -> list[_Prompt]:
    """The four prompt forms (text, texts, ids, batch of ids) as a list of prompts."""
    tok = tokenizer_of(ctx.backend)
    items: list[object] = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if all(isinstance(x, int) for x in items):  # one prompt of token ids
        return [_Prompt([int(x) for x in items if isinstance(x, int)], "")]
    prompts = []
    for x in items:
        if isinstance(x, str):
            prompts.append(_Prompt(tok.encode(x), x))
        elif isinstance(x, list):
            prompts.append(_Prompt([int(t) for t in x], ""))
    return prompts


def _logprobs(
    items: list[TokenLogprob], n_top: int, offset: int, token_text: TokenText
) -> tuple[CompletionLogprobs, int]:
    """OpenAI's legacy logprobs for `items`; `offset` is where their text starts."""
    lp = CompletionLogprobs()
    for item in items:
        text = token_text(item.token_id)
        lp.tokens.append(text)
        lp.token_logprobs.append(item.logprob)
        lp.top_logprobs.append({token_text(t): v for t, v in item.top[:n_top]})
        lp.text_offset.append(offset)
        offset += len(text)
    return lp, offset


async def create_completion(body: CompletionRequest, ctx: ServerContext) -> object:
    backend = ctx.backend
    if body.echo and body.logprobs is not None:
        raise InvalidRequestError("echo together with logprobs is not supported")
    prompts = _prompts(body, ctx)
    choices: list[Choice] = []
    for i, prompt in enumerate(prompts):
        check_prompt(prompt.token_ids, backend.max_model_len, vocab_size_of(backend))
        max_tokens = resolve_max_tokens(
            body.max_tokens, len(prompt.token_ids), backend.max_model_len
        )
        params = sampling_params(body, max_tokens, body.logprobs)
        for j, p in enumerate(seeded(params, body.n)):
            choices.append(Choice(i * body.n + j, prompt.token_ids, p))
    if body.echo:  # echo needs the prompt text; token prompts are decoded
        prompts = [
            pr if pr.text else _Prompt(pr.token_ids, tokenizer_of(backend).decode(pr.token_ids))
            for pr in prompts
        ]

    rid = new_request_id("cmpl")
    created = now_s()
    model = backend.model_name
    token_text = TokenText(backend)
    n_top = body.logprobs or 0
    want_logprobs = body.logprobs is not None

    def echo_of(index: int) -> str:
        return prompts[index // body.n].text if body.echo else ""

    stream = await Prefetched(
        generate_choices(backend, rid, choices, ctx.metrics, ctx.timeout_s(body.timeout))
    ).start()

    if not body.stream:
        finals: dict[int, RequestOutput] = {}
        try:
            async for index, out in stream:
                if out.finished:
                    finals[index] = out
        finally:
            await stream.aclose()
        outputs = [finals[c.index] for c in choices]
        response_choices = []
        for c, out in zip(choices, outputs, strict=True):
            lp = None
            if want_logprobs:
                lp, _ = _logprobs(out.logprobs or [], n_top, 0, token_text)
            response_choices.append(
                CompletionChoice(
                    index=c.index,
                    text=echo_of(c.index) + out.text,
                    logprobs=lp,
                    finish_reason=finish_reason(out),
                )
            )
        return CompletionResponse(
            id=rid, created=created, model=model, choices=response_choices,
            usage=usage([len(p.token_ids) for p in prompts], outputs, body.n),
        )  # fmt: skip

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        sent_text = {c.index: 0 for c in choices}
        sent_lp = {c.index: 0 for c in choices}
        offsets = {c.index: 0 for c in choices}
        finals: dict[int, RequestOutput] = {}
        echoed: set[int] = set()
        async for index, out in stream:
            delta = out.text[sent_text[index] :]
            if body.echo and index not in echoed:
                echoed.add(index)
                delta = echo_of(index) + delta
            sent_text[index] = len(out.text)
            lp = None
            if want_logprobs:
                new = (out.logprobs or [])[sent_lp[index] :]
                sent_lp[index] += len(new)
                lp, offsets[index] = _logprobs(new, n_top, offsets[index], token_text)
            if out.finished:
                finals[index] = out
            if not delta and not out.finished and not (lp and lp.tokens):
                continue
            choice = CompletionChoice(
                index=index, text=delta, logprobs=lp, finish_reason=finish_reason(out)
            )
            yield sse(CompletionResponse(id=rid, created=created, model=model, choices=[choice]))
        if include_usage:
            outputs = [finals[c.index] for c in choices]
            u = usage([len(p.token_ids) for p in prompts], outputs, body.n)
            yield sse(CompletionResponse(id=rid, created=created, model=model, choices=[], usage=u))

    return StreamingResponse(
        sse_stream(events(), stream.aclose), media_type="text/event-stream", headers=SSE_HEADERS
    )
