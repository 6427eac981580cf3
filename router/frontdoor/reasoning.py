"""A reply's reasoning (`<think>...</think>`) apart from its content, streamed or whole
(`baton serve --reasoning-parser`; the reasoning goes out as `reasoning_content`).

    deepseek_r1   the template opens the block: everything up to `</think>` is reasoning
                  (a reply cut off before it is all reasoning)
    qwen3         the reply opens it: reasoning only if it starts with `<think>` (and, not
                  closed, up to the reply's end)

Text that may be the start of a tag being written is held back, so a tag never shows in
either part. The content then goes on to the tool-call reader.
"""

from __future__ import annotations

START, END = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3")


def _held_back(text: str, tag: str) -> int:
    """How much of `text` cannot be the start of `tag`: all of it but such a suffix."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return len(text) - length
    return len(text)


class ReasoningReader:
    def __init__(self, parser: str) -> None:
        if parser not in PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; one of {PARSERS}")
        self._parser = parser
        self._state = "inside" if parser == "deepseek_r1" else "opening"
        self._pending = ""
        self._closed_block = False
        self._content_started = False

    def feed(self, new_text: str) -> tuple[str, str]:
        """(reasoning, content) that may be shown now."""
        self._pending += new_text
        reasoning, content = "", ""
        if self._state == "opening":
            stripped = self._pending.lstrip()
            if stripped.startswith(START):
                self._state, self._pending = "inside", stripped[len(START) :]
            elif not START.startswith(stripped):
                self._state = "after"
        if self._state == "inside":
            end = self._pending.find(END)
            if end < 0:
                cut = _held_back(self._pending, END)
                reasoning, self._pending = self._pending[:cut], self._pending[cut:]
            else:
                reasoning = self._pending[:end]
                self._pending = self._pending[end + len(END) :]
                self._state, self._closed_block = "after", True
        if self._state == "after":
            if self._closed_block and not self._content_started:
                self._pending = self._pending.lstrip()  # the blank lines after </think>
            content, self._pending = self._pending, ""
            self._content_started = self._content_started or bool(content)
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """At the reply's end: what is left, as (reasoning, content)."""
        rest, self._pending = self._pending, ""
        if self._state == "inside":
            return rest, ""
        return "", rest

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole reply: (reasoning or None, content)."""
        reasoning, content = self.feed(text)
        more_reasoning, more_content = self.finish()
        return (reasoning + more_reasoning) or None, content + more_content
