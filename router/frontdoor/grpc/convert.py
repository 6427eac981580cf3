"""Between `baton.v1` protobuf messages and Baton's own types: prompts to token ids,
sampling fields to `SamplingParams`, outputs to responses, cluster state to `ClusterState`.

Bad input raises `core.errors.InvalidRequestError`, which the servicer answers with
INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequestError
from core.request import FinishReason, OutputDelta, RequestOutput, TokenLogprob
from core.sampling import SamplingParams
from core.structured import StructuredOutput
from core.tracing import SpanName
from proto.baton.v1 import admin_pb2, generate_pb2
from router.frontdoor import door_trace
from router.frontdoor.admin_api import ClusterState
from router.frontdoor.grpc.tools import chat_messages, structured_output, tool_request
from router.frontdoor.requests import (
    SCALAR_SAMPLING_FIELDS,
    encode_chat,
    make_params,
    resolve_max_tokens,
)
from router.frontdoor.tools.prompt import template_messages, template_source

DEFAULT_MAX_TOKENS = 16
_FINISH = {
    FinishReason.STOP: generate_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: generate_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: generate_pb2.FINISH_REASON_ABORT,
}
_WORKER_STATES = {
    "starting": admin_pb2.WORKER_STATE_STARTING,
    "ready": admin_pb2.WORKER_STATE_READY,
    "draining": admin_pb2.WORKER_STATE_DRAINING,
    "dead": admin_pb2.WORKER_STATE_DEAD,
}


def prompt_token_ids(
    msg: generate_pb2.GenerateRequest | generate_pb2.TokenizeRequest, tokenizer: Any
) -> list[int]:
    kind = msg.WhichOneof("prompt")
    add_special = msg.add_special_tokens if msg.HasField("add_special_tokens") else True
    if kind == "text":
        with door_trace.stage(SpanName.TOKENIZE):
            return tokenizer.encode(msg.text, add_special_tokens=add_special)
    if kind == "token_ids":
        return list(msg.token_ids.ids)
    if kind == "chat":
        if not msg.chat.messages:
            raise InvalidRequestError("chat.messages: at least one message is required")
        tools = tool_request(msg.chat)
        shown = list(tools.tools) if tools is not None and tools.renders_tools else None
        source = template_source(tokenizer, shown is not None)
        messages, template_tools = template_messages(chat_messages(msg.chat), shown, source)
        return encode_chat(tokenizer, messages, "chat.messages", template_tools)
    raise InvalidRequestError("prompt: set one of text, token_ids or chat")


def sampling_params(
    msg: generate_pb2.SamplingParams,
    num_prompt_tokens: int,
    max_model_len: int,
    forced_call: StructuredOutput | None = None,
) -> SamplingParams:
    """`forced_call`: the constraint of a chat's forced tool call, which excludes any other."""
    constraint = structured_output(msg.structured_output)
    if forced_call is not None and constraint is not None:
        raise InvalidRequestError(
            "sampling.structured_output: cannot be combined with a forced tool call"
        )
    fields = {f: getattr(msg, f) for f in SCALAR_SAMPLING_FIELDS if msg.HasField(f)}
    requested = msg.max_tokens if msg.HasField("max_tokens") else None
    if requested == 0:
        raise InvalidRequestError("sampling.max_tokens: must be >= 1")
    room = max_model_len - num_prompt_tokens
    max_tokens = resolve_max_tokens(
        requested if requested is not None else min(DEFAULT_MAX_TOKENS, room),
        num_prompt_tokens,
        max_model_len,
    )
    return make_params(
        max_tokens=max_tokens,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        min_tokens=msg.min_tokens if msg.HasField("min_tokens") else None,
        logit_bias=dict(msg.logit_bias),
        include_stop_str_in_output=msg.include_stop_str_in_output,
        skip_special_tokens=msg.skip_special_tokens
        if msg.HasField("skip_special_tokens")
        else None,
        structured_outputs=forced_call or constraint,
        **fields,
    )


def _logprob(item: TokenLogprob) -> generate_pb2.TokenLogprob:
    return generate_pb2.TokenLogprob(
        token_id=item.token_id,
        logprob=item.logprob,
        top=[generate_pb2.TopLogprob(token_id=t, logprob=v) for t, v in item.top],
        rank=item.rank or 0,
    )


def response(
    out: OutputDelta | RequestOutput,
    request_id: str,
    num_prompt_tokens: int,
    num_output_tokens: int,
) -> generate_pb2.GenerateResponse:
    """A streamed delta as it is, or a whole output (the unary reply); the last one carries
    the finish reason and the usage (`num_output_tokens`: the request's, in all)."""
    if isinstance(out, OutputDelta):
        token_ids, text, logprobs = out.new_token_ids, out.new_text, out.new_logprobs
    else:
        token_ids, text, logprobs = out.token_ids, out.text, out.logprobs
    msg = generate_pb2.GenerateResponse(
        request_id=request_id,
        token_ids=token_ids,
        text=text,
        logprobs=[_logprob(x) for x in logprobs or ()],
        prompt_logprobs=[_logprob(x) for x in out.prompt_logprobs or () if x is not None],
        finished=out.finished,
    )
    if out.finished:
        msg.finish_reason = _FINISH.get(
            out.finish_reason or FinishReason.STOP, generate_pb2.FINISH_REASON_UNSPECIFIED
        )
        msg.usage.CopyFrom(
            generate_pb2.Usage(
                prompt_tokens=num_prompt_tokens,
                completion_tokens=num_output_tokens,
                cached_tokens=out.num_cached_tokens,
            )
        )
    return msg


def cluster_state(state: ClusterState) -> admin_pb2.ClusterState:
    return admin_pb2.ClusterState(
        pools=[
            admin_pb2.Pool(
                name=p.name,
                desired_size=p.desired_size,
                workers=[
                    admin_pb2.Worker(
                        worker_id=w.worker_id,
                        role=w.role,
                        state=_WORKER_STATES.get(w.state, admin_pb2.WORKER_STATE_UNSPECIFIED),
                        num_running=w.num_running,
                        num_waiting=w.num_waiting,
                        kv_usage=w.kv_usage,
                        prefix_hit_rate=w.prefix_hit_rate,
                        num_prompt_tokens=w.num_prompt_tokens,
                        num_cached_prompt_tokens=w.num_cached_prompt_tokens,
                        adapters=list(w.adapters),
                    )
                    for w in p.workers
                ],
            )
            for p in state.pools
        ],
        refused=list(state.refused),
    )
