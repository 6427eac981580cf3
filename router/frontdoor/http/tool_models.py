"""OpenAI's function-calling shapes: `tools` and `tool_choice` in a chat request, `tool_calls`
in assistant messages (request history, replies and streamed deltas)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FunctionName = str
_NAME = Field(pattern=r"^[a-zA-Z0-9_.:-]{1,64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: FunctionName = _NAME
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema object.")
    strict: bool | None = Field(None, description="Baton always enforces the schema.")


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Strict):
    name: FunctionName
    arguments: str = Field(description="The arguments as JSON text.")


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
