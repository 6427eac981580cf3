"""Tool calls out of a model's free text, one parser per model family's format (chosen with
`baton serve --tool-call-parser`):

    hermes       content <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...
                 (Hermes, Qwen 2.5 / 3; the closing tag may be cut off by EOS)
    llama3_json  [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]
                 (Llama 3.1+: the whole reply is the call, or it is content)
    mistral      content [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]

A reply whose call text does not parse is returned as content, never dropped. `safe_len`
says how much of a streamed reply can already be shown as content: everything before where a
call starts (or may yet start).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any

from router.frontdoor.tools.calls import ParsedCall

Parsed = tuple[str | None, list[ParsedCall]]
"""(content, calls); content None when there is none."""


class ToolCallParser(ABC):
    keeps_special_tokens = False
    """The format's markers are special tokens: detokenize with skip_special_tokens=False."""

    @abstractmethod
    def parse(self, text: str) -> Parsed: ...

    @abstractmethod
    def safe_len(self, text: str) -> int:
        """How many leading characters of `text` (a reply so far) are content for sure."""


def _held_back(text: str, marker: str) -> int:
    """`text` up to `marker`, or, marker absent, all but a suffix that could start it."""
    found = text.find(marker)
    if found >= 0:
        return found
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return len(text) - length
    return len(text)


def _call(obj: Any, *argument_keys: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = next((obj[k] for k in argument_keys if k in obj), {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _content(text: str) -> str | None:
    return text.strip() or None


class HermesParser(ToolCallParser):
    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> Parsed:
        start = text.find(self.START)
        if start < 0:
            return _content(text), []
        calls = []
        for body in self._CALL.findall(text, start):
            try:
                call = _call(json.loads(body), "arguments", "parameters")
            except ValueError:
                call = None
            if call is None:
                return _content(text), []
            calls.append(call)
        return _content(text[:start]), calls

    def safe_len(self, text: str) -> int:
        return _held_back(text, self.START)


class Llama3JsonParser(ToolCallParser):
    TAG = "<|python_tag|>"
    keeps_special_tokens = True

    def parse(self, text: str) -> Parsed:
        body = text.strip().removeprefix(self.TAG).strip()
        if not body.startswith("{"):
            return _content(text), []
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except ValueError:
                return _content(text), []
            call = _call(obj, "parameters", "arguments")
            if call is None:
                return _content(text), []
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        return None, calls

    def safe_len(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or stripped.startswith("{") or self.TAG.startswith(stripped[:14]):
            return 0
        return len(text)


class MistralParser(ToolCallParser):
    MARKER = "[TOOL_CALLS]"
    keeps_special_tokens = True

    def parse(self, text: str) -> Parsed:
        start = text.find(self.MARKER)
        if start < 0:
            return _content(text), []
        try:
            items = json.loads(text[start + len(self.MARKER) :].strip())
        except ValueError:
            return _content(text), []
        items = items if isinstance(items, list) else [items]
        calls = [_call(item, "arguments", "parameters") for item in items]
        if not calls or any(c is None for c in calls):
            return _content(text), []
        return _content(text[:start]), [c for c in calls if c is not None]

    def safe_len(self, text: str) -> int:
        return _held_back(text, self.MARKER)


PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
DEFAULT_PARSER = "hermes"
_BY_MODEL_TYPE = {"llama": "llama3_json", "mistral": "mistral", "mixtral": "mistral"}
"""A checkpoint's `model_type` -> its family's format (Qwen and the rest: hermes)."""


def parser_for_model_type(model_type: str | None) -> str:
    """The default parser for a model family, when `--tool-call-parser` is not given."""
    return _BY_MODEL_TYPE.get(model_type or "", DEFAULT_PARSER)


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; one of {sorted(PARSERS)}") from None
