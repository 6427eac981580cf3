"""`POST /v1/chat/completions`: messages (and tools) through the model's chat template, `n`
choices, streamed or not; each reply read as content and tool calls (`chat_tools.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi.responses import StreamingResponse

from core.request import OutputDelta, RequestOutput, TokenLogprob
from router.frontdoor import door_trace
from router.frontdoor.http import common, request_ids
from router.frontdoor.http.chat_tools import chat_inputs, tool_constraint, tool_request
from router.frontdoor.http.common import TokenText, finish_reason, sse
from router.frontdoor.http.context import ServerContext
from router.frontdoor.http.errors import APIError
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
from router.frontdoor.http.refusals import CHAT, refuse_unsupported
from router.frontdoor.http.reply import ReplyReader
from router.frontdoor.http.tool_models import (
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from router.frontdoor.requests import encode_chat, resolve_max_tokens, tokenizer_of
from router.frontdoor.tools.calls import ParsedCall, ToolRequest


def chat_prompt_ids(
    body: ChatCompletionRequest, ctx: ServerContext, tools: ToolRequest | None = None
) -> list[int]:
    tokenizer = tokenizer_of(ctx.backend)
    messages, template_tools = chat_inputs(body.messages, tools, tokenizer)
    return encode_chat(tokenizer, messages, "messages", template_tools)


def _reason(out: OutputDelta | RequestOutput, calls: list[ParsedCall]) -> str | None:
    reason = finish_reason(out)
    return "tool_calls" if calls and reason == "stop" else reason


def _tool_calls(calls: list[ParsedCall]) -> list[ToolCall]:
    return [
        ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ]


def _tool_call_deltas(calls: list[ParsedCall]) -> list[DeltaToolCall]:
    return [
        DeltaToolCall(index=i, id=c.id, type="function",
                      function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
        for i, c in enumerate(calls)
    ]  # fmt: skip


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


async def create_chat_completion(
    body: ChatCompletionRequest, ctx: ServerContext, tenant: str = ""
) -> object:
    door_trace.parsed()
    backend = ctx.backend
    refuse_unsupported(body, CHAT)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs=true", "invalid_value", "top_logprobs")
    tools = tool_request(body)
    constraint = tool_constraint(body, tools)
    prompt_ids = chat_prompt_ids(body, ctx, tools)
    requested = body.max_completion_tokens or body.max_tokens
    max_tokens = resolve_max_tokens(requested, len(prompt_ids), backend.max_model_len)
    n_top = body.top_logprobs or 0
    params = common.sampling_params(
        body, max_tokens, n_top if body.logprobs else None, common.vocab_size(backend), constraint
    )
    if tools is not None and tools.choice == "auto" and ctx.tool_parser.keeps_special_tokens:
        params = replace(params, skip_special_tokens=False)  # its call marker is one

    thinking = ctx.reasoning_parser if params.structured_outputs is None else None

    def reader() -> ReplyReader:
        return ReplyReader(tools, ctx.tool_parser, thinking)

    per_choice = common.first_asks_prompt_logprobs(seeded(params, body.n))
    choices = [Choice(i, prompt_ids, p) for i, p in enumerate(per_choice)]

    rid, backend_rid = request_ids.for_api("chatcmpl")
    created = common.now_s()
    model = body.model  # the base model's name or an adapter's
    token_text = TokenText(backend)
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
        replies = []
        for c, out in zip(choices, outputs, strict=True):
            reasoning, content, calls = reader().whole(out.text)
            lp = _logprobs(out.logprobs or [], n_top, token_text) if body.logprobs else None
            message = AssistantMessage(
                content=content, reasoning_content=reasoning, tool_calls=_tool_calls(calls)
            )
            replies.append(
                ChatChoice(
                    index=c.index, message=message, logprobs=lp, finish_reason=_reason(out, calls)
                )
            )
        return ChatCompletionResponse(
            id=rid,
            created=created,
            model=model,
            choices=replies,
            usage=common.usage([len(prompt_ids)], outputs, body.n),
            prompt_logprobs=common.prompt_logprobs(outputs[0].prompt_logprobs, token_text),
        )

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choice: ChatChunkChoice) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice]))

    async def events() -> AsyncIterator[str]:
        for c in choices:  # OpenAI opens every choice with the role
            delta = DeltaMessage(role="assistant", content="")
            yield chunk(ChatChunkChoice(index=c.index, delta=delta))
        outputs = common.accumulators(choices)
        readers = {c.index: reader() for c in choices}
        async for index, out in stream:
            outputs[index].add(out)
            lp = None
            if body.logprobs:
                lp = _logprobs(out.new_logprobs or [], n_top, token_text)
            reasoning, shown = readers[index].feed(out.new_text)
            if shown or reasoning or (lp and lp.content):
                message = DeltaMessage(
                    content=shown if shown or not reasoning else None,
                    reasoning_content=reasoning or None,
                )
                yield chunk(ChatChunkChoice(index=index, delta=message, logprobs=lp))
            if out.finished:
                reasoning, rest, calls = readers[index].finish()
                if reasoning or rest or calls:
                    delta = DeltaMessage(
                        content=rest or None,
                        reasoning_content=reasoning or None,
                        tool_calls=_tool_call_deltas(calls) or None,
                    )
                    yield chunk(ChatChunkChoice(index=index, delta=delta))
                reason = _reason(out, calls)
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
