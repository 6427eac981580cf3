"""Prompt-lookup drafts (n-gram speculation, as vLLM's `ngram` method and the "prompt lookup
decoding" it comes from): find the latest earlier place where the request's last n tokens
occurred, and guess that what followed them there follows them again."""

from __future__ import annotations

from collections.abc import Sequence

MAX_LOOKBACK = 4096
"""Tokens searched back from the end: a bound on a step's host time for long contexts."""


def propose_ngram(
    tokens: Sequence[int], num_tokens: int, max_n: int = 3, min_n: int = 1
) -> list[int]:
    """Up to `num_tokens` guesses for what follows `tokens`: the longest suffix of length
    max_n..min_n that occurred before (the latest occurrence wins) and what came after it
    there. Empty when no suffix recurs."""
    if num_tokens <= 0:
        return []
    window = list(tokens[-MAX_LOOKBACK:])
    size = len(window)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = window[size - n :]
        first = suffix[0]
        # Latest start first; a match must end before the suffix itself does.
        for start in range(size - n - 1, -1, -1):
            if window[start] == first and window[start : start + n] == suffix:
                follow = window[start + n : start + n + num_tokens]
                if follow:
                    return follow
    return []
