"""`POST /tokenize`, `POST /detokenize`, `GET /version`: the tokenizer the server runs, as
vLLM serves them (same paths and bodies), so a client counts tokens the way the server will.

`/tokenize` takes a `prompt` (text) or chat `messages` (rendered by the model's template,
exactly as `/v1/chat/completions` renders them); its `count` is the prompt length a
completion of the same input would be charged.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.frontdoor.backend import Backend
from router.frontdoor.http.chat_tools import chat_inputs
from router.frontdoor.http.errors import APIError
from router.frontdoor.http.protocol import ChatMessage, TokenId
from router.frontdoor.requests import encode_chat, tokenizer_of


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = Field(True, description="Prompts only: add BOS and the like.")
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[TokenId] = Field(max_length=1 << 20)


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


def token_router(backend: Backend, check_model: Callable[[str], None], **route: Any) -> APIRouter:
    """`route`: what every route takes (the API-key dependency, error responses)."""
    router = APIRouter()
    tokenizer = tokenizer_of(backend)

    def model_ok(model: str | None) -> None:
        if model is not None:
            check_model(model)

    @router.post("/tokenize", response_model=TokenizeResponse, **route)
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        model_ok(body.model)
        if body.messages is not None:
            messages, _ = chat_inputs(body.messages, None, tokenizer)
            ids = encode_chat(tokenizer, messages, "messages")
        else:
            ids = tokenizer.encode(body.prompt or "", add_special_tokens=body.add_special_tokens)
        strs = None
        if body.return_token_strs:
            strs = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        return TokenizeResponse(
            count=len(ids), max_model_len=backend.max_model_len, tokens=ids, token_strs=strs
        )

    @router.post("/detokenize", response_model=DetokenizeResponse, **route)
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        model_ok(body.model)
        vocab = getattr(tokenizer, "vocab_size", None)
        bad = next((t for t in body.tokens if vocab is not None and t >= vocab), None)
        if bad is not None:
            raise APIError(400, f"tokens: {bad} is not a token id of this model's vocabulary "
                           f"(size {vocab})", "invalid_value", "tokens")  # fmt: skip
        return DetokenizeResponse(prompt=tokenizer.decode(body.tokens, skip_special_tokens=False))

    @router.get("/version", response_model=VersionResponse)
    async def version() -> VersionResponse:
        return VersionResponse(version=importlib.metadata.version("baton"))

    return router
