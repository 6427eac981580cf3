"""What the HTTP and gRPC front doors share on the way in: chat messages to token ids,
sampling parameters from request fields, the output budget, request ids.

The prompt itself is checked once, by the backend (`core.request.check_prompt` at the
cluster's entry); a bad one raises InvalidRequestError before any output, which each door
answers with its own status (HTTP 400, gRPC INVALID_ARGUMENT). Torch-free.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from core.errors import InvalidRequestError
from core.sampling import SamplingParams
from core.tracing import SpanName
from router.frontdoor import door_trace
from router.frontdoor.backend import Backend


class TokenizerLike(Protocol):
    """What the front doors use of `engine.tokenizer.Tokenizer` (torch-free)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str: ...


def tokenizer_of(backend: Backend) -> TokenizerLike:
    """The backend's tokenizer (`Backend.tokenizer`; not yet in the protocol's text)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        raise TypeError(f"{type(backend).__name__} has no tokenizer attribute")
    return tokenizer  # type: ignore[no-any-return]


def encode_chat(
    tokenizer: TokenizerLike,
    messages: list[dict[str, Any]],
    field: str,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The chat (and its tools, OpenAI-shaped) through the model's template, as token ids; a
    template that rejects the messages is the client's error, named by `field`."""
    # Tokenizer.encode_chat's two steps, apart, so the trace shows each (door_trace.stage).
    try:
        with door_trace.stage(SpanName.CHAT_TEMPLATE):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except ValueError as e:  # engine.tokenizer.ChatTemplateError
        raise InvalidRequestError(f"{field}: {e}") from e
    with door_trace.stage(SpanName.TOKENIZE):
        return tokenizer.encode(text, add_special_tokens=False)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


SCALAR_SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
    "frequency_penalty", "repetition_penalty",
)  # fmt: skip
"""SamplingParams fields every door copies as they are when the client set them."""


def make_params(**fields: Any) -> SamplingParams:
    """SamplingParams from fields that are set (None means default); a bad value is an
    InvalidRequestError with the parameter named."""
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(str(e)) from e


def resolve_max_tokens(requested: int | None, num_prompt_tokens: int, max_model_len: int) -> int:
    """`requested` if the context has room for it; None means "up to the context". A prompt
    that leaves no room at all is refused by the backend's prompt check, with its message."""
    room = max_model_len - num_prompt_tokens
    if room < 1:
        return requested or 1
    if requested is None:
        return room
    if requested > room:
        raise InvalidRequestError(
            f"max_tokens={requested} is too large: the prompt has {num_prompt_tokens} tokens "
            f"and this model's context holds {max_model_len}, leaving room for {room}"
        )
    return requested
