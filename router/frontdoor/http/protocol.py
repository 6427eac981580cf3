"""OpenAI-compatible request and response bodies (the subset Baton serves).

Bounds here are the API's contract: the OpenAPI document carries them, and a value outside
them is a 400 before anything is tokenized. Every request model forbids unknown fields (a 400
"Unrecognized request argument", as OpenAI answers); OpenAI's fields Baton does not honour
are declared here as `Unsupported` and refused by `refusals.py` unless their value asks for
nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from router.frontdoor.http.structured import StructuredOutputFields
from router.frontdoor.http.tool_models import ChatTool, DeltaToolCall, ToolCall, ToolChoice

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
MAX_BATCH = 16
MAX_N = 16
MAX_TIMEOUT_S = 3600.0
Unsupported = SkipJsonSchema[Annotated[Any, Field(description="Refused unless neutral.")]]
"""An OpenAI field Baton refuses (`refusals.py`): declared so that it is named in the 400,
and left out of the OpenAPI document, which describes what is served."""
LogitBias = Annotated[dict[str, float], Field(max_length=300)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class SamplingFields(StructuredOutputFields):
    """Fields chat and completions share, OpenAI's and Baton's extras (structured outputs:
    `structured.py`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = Field(None, description="Up to 16 stop strings.")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100]."
    )
    user: str | None = Field(None, description="A label; changes no output.")
    guided_decoding_backend: Unsupported = None
    # Baton (and vLLM) extras.
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1, description="0 or -1 disables.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = Field(None, max_length=64)
    min_tokens: int | None = Field(None, ge=0, description="No EOS or stop before this many.")
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(
        None, ge=0, le=20, description="vLLM's: each prompt token's logprob and top-n."
    )
    timeout: float | None = Field(
        None, gt=0.0, le=MAX_TIMEOUT_S, description="Baton: seconds before a 504."
    )
    priority: int = Field(
        0, ge=-(2**31), le=2**31 - 1,
        description="vLLM's: lower runs first (queued ahead of, and preempting, higher).",
    )  # fmt: skip


class CompletionRequest(SamplingFields):
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_BATCH)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]
    ) = Field(description="A text, a batch of texts, token ids, or a batch of token ids.")
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: Unsupported = None
    suffix: Unsupported = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant's calls.")
    tool_call_id: str | None = Field(None, description="The call a tool message answers.")
    reasoning_content: str | None = Field(None, description="An assistant's reasoning.")
    # A reply from OpenAI echoed back into the history carries these; only their empty
    # values are accepted (anything else would be dropped on the way to the template).
    refusal: None = Field(None, description="Accepted as null.")
    audio: None = Field(None, description="Accepted as null.")
    function_call: None = Field(None, description="Accepted as null.")
    annotations: Annotated[list[Any], Field(max_length=0)] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="Deprecated alias.")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ChatTool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    safety_identifier: str | None = Field(None, description="A label; changes no output.")
    prompt_cache_key: str | None = Field(None, description="A hint; prefixes are found anyway.")
    audio: Unsupported = None
    modalities: Unsupported = None
    prediction: Unsupported = None
    reasoning_effort: Unsupported = None
    verbosity: Unsupported = None
    web_search_options: Unsupported = None
    functions: Unsupported = None
    function_call: Unsupported = None
    store: Unsupported = None
    metadata: Unsupported = None
    service_tier: Unsupported = None


# -- responses ------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class PromptLogprob(BaseModel):
    """vLLM's shape: per prompt position, token id (a string in JSON) -> this."""

    logprob: float
    rank: int | None = None
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = []


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = Field(None, description="vLLM's place for them.")


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "baton"
    max_model_len: int
    root: str | None = None
    """Where it was loaded from (a LoRA adapter's folder); None for the base model."""
    parent: str | None = None
    """A LoRA adapter's base model; None for the base model."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
