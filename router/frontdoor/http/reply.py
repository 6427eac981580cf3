"""One chat choice's reply read as reasoning, content and tool calls: the reasoning parser
(if the server has one) splits off `<think>` text first, then the tool-call reader reads the
content. Under a constraint (forced tool call, response_format) the reply is the
constrained text from its first token, so there is no reasoning to split off."""

from __future__ import annotations

from router.frontdoor.reasoning import ReasoningReader
from router.frontdoor.tools.calls import ParsedCall, ToolRequest
from router.frontdoor.tools.parsers import ToolCallParser
from router.frontdoor.tools.reader import ToolCallReader


class ReplyReader:
    def __init__(
        self, tools: ToolRequest | None, tool_parser: ToolCallParser, reasoning_parser: str | None
    ) -> None:
        self._tools = ToolCallReader(tools, tool_parser)
        self._thinking = ReasoningReader(reasoning_parser) if reasoning_parser else None

    def feed(self, new_text: str) -> tuple[str, str]:
        """(reasoning, content) that may be shown now."""
        reasoning, content = "", new_text
        if self._thinking is not None:
            reasoning, content = self._thinking.feed(new_text)
        return reasoning, self._tools.feed(content)

    def finish(self) -> tuple[str, str, list[ParsedCall]]:
        """At the reply's end: the reasoning and content not yet shown, and the calls."""
        reasoning, shown = "", ""
        if self._thinking is not None:
            reasoning, rest = self._thinking.finish()
            shown = self._tools.feed(rest)
        content, calls = self._tools.finish()
        return reasoning, shown + content, calls

    def whole(self, text: str) -> tuple[str | None, str | None, list[ParsedCall]]:
        """A whole reply (not streamed): (reasoning, content, calls); content is None when
        calls were made and there is none."""
        reasoning = None
        if self._thinking is not None:
            reasoning, text = self._thinking.split(text)
        content, calls = self._tools.content_of(text)
        return reasoning, content, calls
