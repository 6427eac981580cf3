"""One choice's reply read as content and tool calls, streamed or whole.

    no tools / "none"   all content, as it comes
    "auto"              content up to where the parser sees a call start (held back while
                        a marker may be forming); the rest is parsed at the end
    forced              nothing as it comes: the constrained JSON is read at the end

Calls are sent once the reply ends, each whole (one delta per call with its name and all of
its arguments): a valid OpenAI stream, which clients accumulate the same way.
"""

from __future__ import annotations

from router.frontdoor.tools.calls import ParsedCall, ToolRequest
from router.frontdoor.tools.constraint import read_forced_calls
from router.frontdoor.tools.parsers import ToolCallParser


class ToolCallReader:
    def __init__(self, request: ToolRequest | None, parser: ToolCallParser) -> None:
        self._request = request if request is not None and request.renders_tools else None
        self._parser = parser
        self._text = ""
        self._num_shown = 0

    def feed(self, new_text: str) -> str:
        """Add the reply's new text; returns the content that may be shown now."""
        self._text += new_text
        if self._request is None:
            safe = len(self._text)
        elif self._request.is_forced:
            safe = 0
        else:
            safe = max(self._num_shown, self._parser.safe_len(self._text))
        shown = self._text[self._num_shown : safe]
        self._num_shown = safe
        return shown

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """At the reply's end: the content not yet shown, and the calls."""
        shown, self._num_shown = self._num_shown, len(self._text)
        _, calls = self._read()
        if not calls:
            return self._text[shown:], []
        if self._request is not None and self._request.is_forced:
            return "", calls
        # A call starts where safe_len stops: content is what lies before it.
        start = max(shown, self._parser.safe_len(self._text))
        return self._text[shown:start].rstrip(), calls

    def content_of(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """A whole reply (not streamed): its content (None when calls were made and there
        is none) and its calls."""
        self._text, self._num_shown = text, len(text)
        content, calls = self._read()
        return (content, calls) if calls else (text, [])

    def _read(self) -> tuple[str | None, list[ParsedCall]]:
        if self._request is None:
            return self._text, []
        if self._request.is_forced:
            calls = read_forced_calls(self._request, self._text)
            return (None, calls) if calls else (self._text, [])
        content, calls = self._parser.parse(self._text)
        if not self._request.parallel:
            calls = calls[:1]
        return content, calls
