"""`POST /v1/chat/completions`: messages through the model's chat template, `n` choices,
streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from core.errors import InvalidRequestError
from core.request import TokenLogprob
from router.frontdoor.http import common
from router.frontdoor.http.common import TokenText, finish_reason, sse
from router.frontdoor.http.context import ServerContext
from router.frontdoor.http.fanout import Choice, Prefetched, generate_choices, seeded
from router.frontdoor.http.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    DeltaMessage,
    TopLogprob,
)
from router.frontdoor.requests import encode_chat, new_request_id, resolve_max_tokens, tokenizer_of


def chat_prompt_ids(body: ChatCompletionRequest, ctx: ServerContext) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    return encode_chat(tokenizer_of(ctx.backend), messages, "messages")


def _logprobs(items: list[TokenLogprob], n_top: int, token_text: TokenText) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = token_text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    content = []
    for item in items:
        text = token_text(item.token_id)
        content.append(
            ChatTokenLogprob(
                token=text,
                logprob=item.logprob,
                bytes=list(text.encode()),
                top_logprobs=[top(t, v) for t, v in item.top[:n_top]],
            )
        )
    return ChatLogprobs(content=content)


async def create_chat_completion(body: ChatCompletionRequest, ctx: ServerContext) -> object:
    backend = ctx.backend
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs=true")
    prompt_ids = chat_prompt_ids(body, ctx)
    requested = body.max_completion_tokens or body.max_tokens
    max_tokens = resolve_max_tokens(requested, len(prompt_ids), backend.max_model_len)
    n_top = body.top_logprobs or 0
    params = common.sampling_params(body, max_tokens, n_top if body.logprobs else None)
    choices = [Choice(i, prompt_ids, p) for i, p in enumerate(seeded(params, body.n))]

    rid = new_request_id("chatcmpl")
    created = common.now_s()
    model = backend.model_name
    token_text = TokenText(backend)
    stream = await Prefetched(
        generate_choices(backend, rid, choices, ctx.metrics, ctx.timeout_s(body.timeout))
    ).start()

    if not body.stream:
        outputs = await common.collect(stream, choices)
        return ChatCompletionResponse(
            id=rid,
            created=created,
            model=model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=AssistantMessage(content=out.text),
                    logprobs=_logprobs(out.logprobs or [], n_top, token_text)
                    if body.logprobs
                    else None,
                    finish_reason=finish_reason(out),
                )
                for c, out in zip(choices, outputs, strict=True)
            ],
            usage=common.usage([len(prompt_ids)], outputs, body.n),
        )

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choice: ChatChunkChoice) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice]))

    async def events() -> AsyncIterator[str]:
        for c in choices:  # OpenAI opens every choice with the role
            delta = DeltaMessage(role="assistant", content="")
            yield chunk(ChatChunkChoice(index=c.index, delta=delta))
        outputs = common.accumulators(choices)
        async for index, out in stream:
            outputs[index].add(out)
            lp = None
            if body.logprobs:
                lp = _logprobs(out.new_logprobs or [], n_top, token_text)
            if out.new_text or (lp and lp.content):
                message = DeltaMessage(content=out.new_text)
                yield chunk(ChatChunkChoice(index=index, delta=message, logprobs=lp))
            if out.finished:
                reason = finish_reason(out)
                yield chunk(
                    ChatChunkChoice(index=index, delta=DeltaMessage(), finish_reason=reason)
                )
        if include_usage:
            u = common.usage([len(prompt_ids)], [outputs[c.index] for c in choices], body.n)
            yield sse(
                ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=u)
            )

    return StreamingResponse(
        common.sse_stream(events(), stream.aclose),
        media_type="text/event-stream",
        headers=common.SSE_HEADERS,
    )
