"""`POST /v1/completions`: text (or token-id) prompts, `n` choices each, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from core.errors import InvalidRequestError
from core.request import TokenLogprob
from core.tracing import SpanName
from router.frontdoor import door_trace
from router.frontdoor.http import common, request_ids
from router.frontdoor.http.common import TokenText, finish_reason, sse
from router.frontdoor.http.context import ServerContext
from router.frontdoor.http.fanout import Choice, Prefetched, generate_choices, seeded
from router.frontdoor.http.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from router.frontdoor.http.refusals import COMPLETIONS, refuse_unsupported
from router.frontdoor.requests import resolve_max_tokens, tokenizer_of


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
            with door_trace.stage(SpanName.TOKENIZE):
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


async def create_completion(
    body: CompletionRequest, ctx: ServerContext, tenant: str = ""
) -> object:
    door_trace.parsed()
    backend = ctx.backend
    refuse_unsupported(body, COMPLETIONS)
    if body.echo and body.logprobs is not None:
        raise InvalidRequestError("echo together with logprobs is not supported")
    prompts = _prompts(body, ctx)
    choices: list[Choice] = []
    for i, prompt in enumerate(prompts):
        max_tokens = resolve_max_tokens(
            body.max_tokens, len(prompt.token_ids), backend.max_model_len
        )
        params = common.sampling_params(body, max_tokens, body.logprobs, common.vocab_size(backend))
        for j, p in enumerate(common.first_asks_prompt_logprobs(seeded(params, body.n))):
            choices.append(Choice(i * body.n + j, prompt.token_ids, p))
    if body.echo:  # echo needs the prompt text; token prompts are decoded
        prompts = [
            pr if pr.text else _Prompt(pr.token_ids, tokenizer_of(backend).decode(pr.token_ids))
            for pr in prompts
        ]

    rid, backend_rid = request_ids.for_api("cmpl")
    created = common.now_s()
    model = body.model  # the base model's name or an adapter's
    token_text = TokenText(backend)
    n_top = body.logprobs or 0
    want_logprobs = body.logprobs is not None

    def echo_of(index: int) -> str:
        return prompts[index // body.n].text if body.echo else ""

    stream = await Prefetched(
        generate_choices(
            backend,
            backend_rid,
            choices,
            ctx.metrics,
            ctx.timeout_s(body.timeout),
            body.priority,
            tenant,
            ctx.adapters.resolve(body.model),
        )
    ).start()

    if not body.stream:
        outputs = await common.collect(stream, choices)
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
                    prompt_logprobs=common.prompt_logprobs(
                        outputs[c.index - c.index % body.n].prompt_logprobs, token_text
                    ),
                )
            )
        return CompletionResponse(
            id=rid, created=created, model=model, choices=response_choices,
            usage=common.usage([len(p.token_ids) for p in prompts], outputs, body.n),
        )  # fmt: skip

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events() -> AsyncIterator[str]:
        offsets = {c.index: 0 for c in choices}
        outputs = common.accumulators(choices)
        echoed: set[int] = set()
        async for index, out in stream:
            outputs[index].add(out)
            text = out.new_text
            if body.echo and index not in echoed:
                echoed.add(index)
                text = echo_of(index) + text
            lp = None
            if want_logprobs:
                lp, offsets[index] = _logprobs(
                    out.new_logprobs or [], n_top, offsets[index], token_text
                )
            if not text and not out.finished and not (lp and lp.tokens):
                continue
            choice = CompletionChoice(
                index=index, text=text, logprobs=lp, finish_reason=finish_reason(out)
            )
            yield sse(CompletionResponse(id=rid, created=created, model=model, choices=[choice]))
        if include_usage:
            finals = [outputs[c.index] for c in choices]
            u = common.usage([len(p.token_ids) for p in prompts], finals, body.n)
            yield sse(CompletionResponse(id=rid, created=created, model=model, choices=[], usage=u))

    return StreamingResponse(
        common.sse_stream(events(), stream.aclose),
        media_type="text/event-stream",
        headers=common.SSE_HEADERS,
    )
