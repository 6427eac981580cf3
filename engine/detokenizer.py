"""Incremental detokenizer: turns a stream of token ids into text deltas.

Each step decodes only a short window of recent tokens (vLLM's prefix / read offsets):

    ids:   ... | prefix window         | pending tokens         |
               ^ prefix_offset         ^ read_offset            ^ end
    text:      prefix_text (emitted)   | pending text           |

    pending text = decode(ids[prefix_offset:])[len(prefix_text):]

The prefix window gives the decoder left context (SentencePiece-style decoders drop the leading
space of the first token they see; the window keeps it), and starts in the last few prompt
tokens so that the first output token is decoded in context too. When the pending text is
complete, the offsets move forward and tokens before the new prefix window are dropped, so the
cost per token stays O(window), not O(output).

Byte-level BPE pieces can split a UTF-8 character; `decode` then ends in U+FFFD for the
incomplete bytes. Trailing U+FFFD is never emitted: it is held back (and the offsets stay put)
until the character completes. A U+FFFD followed by more text is a real decode result (invalid
bytes) and is emitted like any other character.

Invariant (byte-level tokenizers): the concatenated deltas equal
`tokenizer.decode(output_ids, skip_special_tokens)` whenever that decode does not end in
U+FFFD. For SentencePiece-style tokenizers the text keeps the first output token's leading
space, as vLLM does, so a completion can be appended to its prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT_TOKENS = 5
"""Prompt tokens decoded as left context for the first output tokens (as vLLM)."""


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Per-request detokenizer; `append` each sampled token, read `text` for the whole output."""

    def __init__(
        self, tokenizer: Decoder, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # The window of ids still needed; ids before the prefix window are dropped, so the
        # prefix offset is always 0 and only the read offset is stored.
        self._ids: list[int] = [int(t) for t in prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        if self._prefix_text.endswith(_REPLACEMENT):
            # The prompt ends inside a character: as context it would swallow the output's
            # first bytes, so the output is decoded on its own.
            self._ids, self._read_offset, self._prefix_text = [], 0, ""
        self._num_emitted_pending = 0
        """Characters of the pending text already emitted (those before a held-back tail)."""
        self._text = ""

    @property
    def text(self) -> str:
        """All output text emitted so far (the concatenation of every delta)."""
        return self._text

    def append(self, token_id: int) -> str:
        """Add one output token; returns the new text it makes visible (may be "")."""
        self._ids.append(int(token_id))
        window_text = self._decode(self._ids)
        if len(window_text) <= len(self._prefix_text):
            return ""  # e.g. a skipped special token: nothing new, keep the window as it is
        pending = window_text[len(self._prefix_text) :]
        stable = pending.rstrip(_REPLACEMENT)
        delta = stable[self._num_emitted_pending :]
        if len(stable) == len(pending):
            # Complete: the pending tokens become the next prefix window.
            del self._ids[: self._read_offset]
            self._read_offset = len(self._ids)
            self._prefix_text = self._decode(self._ids)
            self._num_emitted_pending = 0
        else:
            self._num_emitted_pending = max(self._num_emitted_pending, len(stable))
        self._text += delta
        return delta

    def flush(self) -> str:
        """The request ended: emit the held-back tail too (an incomplete character decodes
        to U+FFFD, as a full decode of the output gives)."""
        pending = self._decode(self._ids)[len(self._prefix_text) :]
        delta = pending[self._num_emitted_pending :]
        self._num_emitted_pending += len(delta)
        self._text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
