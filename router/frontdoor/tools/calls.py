"""A tool call as the front doors hand it to a client, and the request's choice of tools."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call (OpenAI's `tools[i].function`)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema object; None: no parameters (OpenAI's meaning of leaving it out)."""

    def as_openai(self) -> dict[str, Any]:
        """`{"type": "function", "function": {...}}`: what HF chat templates take as a tool."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks: its tools, and `choice` "none", "auto", "required" or "named"
    (OpenAI's `{"type": "function", "function": {"name": ...}}`: `function` is the name)."""

    tools: tuple[ToolSpec, ...]
    choice: str
    function: str | None = None
    parallel: bool = True
    """False: at most one call."""

    @property
    def is_forced(self) -> bool:
        """A call must be made ("required" or a named function): the grammar enforces it."""
        return self.choice not in ("none", "auto")

    @property
    def renders_tools(self) -> bool:
        """With "none" the prompt does not show the tools and the output is plain text."""
        return self.choice != "none"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """The arguments as JSON text (an object)."""
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
