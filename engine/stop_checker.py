"""Stop checking: after each new token, does the request end, and what may the client see?

Rules, in order of precedence (the first that applies decides the finish reason):

1. The new token is an EOS token (unless `ignore_eos`) -> STOP, stop_reason None; or it is in
   `stop_token_ids` -> STOP, stop_reason = that id. As in vLLM the token stays in the output
   token ids but its text is not part of the output text (unless include_stop_str_in_output).
2. A stop string appears in the text -> STOP, stop_reason = the string; the text is cut
   before it (or after it, with include_stop_str_in_output). If several appear, the one
   starting earliest wins (then the shortest). Only the newly added text plus
   `max(len(stop)) - 1` characters before it are searched, so a step costs O(1) in the
   output length.
Before `min_tokens` output tokens, rules 1 and 2 do not apply (the sampler also masks EOS and
`stop_token_ids` until then: `banned_token_ids`).

3. `len(output) >= max_tokens`, or `prompt + output >= max_model_len` -> LENGTH.

A stop condition beats LENGTH on the same token: the answer did end naturally.

Usage, once per new token, after appending it to the detokenizer:

    decision = checker.check(output_token_ids, detokenizer.text)
    visible = detokenizer.text[: checker.visible_len(detokenizer.text, decision.finished)]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from core.request import FinishReason
from core.sampling import SamplingParams


@dataclass(frozen=True)
class StopDecision:
    finished: bool
    finish_reason: FinishReason | None = None
    """STOP or LENGTH once finished."""
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended the request (None for EOS and LENGTH)."""


_RUNNING = StopDecision(finished=False)


class StopChecker:
    """Per-request stop state. `check` must see the text grow append-only, one token at a time."""

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: Collection[int],
        max_model_len: int,
        num_prompt_tokens: int,
    ) -> None:
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        self._params = params
        self._eos_token_ids = frozenset(() if params.ignore_eos else eos_token_ids)
        self._stop_token_ids = frozenset(params.stop_token_ids)
        self._stop_strings = params.stop
        self._max_stop_len = max((len(s) for s in params.stop), default=0)
        self._max_output_tokens = min(params.max_tokens, max_model_len - num_prompt_tokens)
        self._num_searched_chars = 0
        """Length of the text at the previous `check`: what came before the newest token."""
        self._cut: int | None = None
        """Where the client-visible text ends once finished by a stop token or string."""
        self._decision = _RUNNING

    @property
    def decision(self) -> StopDecision:
        return self._decision

    def check(self, token_ids: Sequence[int], text: str) -> StopDecision:
        """Decide after a new token; `token_ids` and `text` are all output so far. Once
        finished, the same decision is returned again."""
        if self._decision.finished:
            return self._decision
        text_before = min(self._num_searched_chars, len(text))
        self._num_searched_chars = len(text)
        if not token_ids:
            return self._decision
        stop = None
        if len(token_ids) >= self._params.min_tokens:
            stop = self._check_stop_token(token_ids[-1], text_before) or self._check_stop_strings(
                text, text_before
            )
        self._decision = stop or self._check_length(len(token_ids)) or _RUNNING
        return self._decision

    def ends_by_length(self, num_output_tokens: int) -> bool:
        """Whether a request with this many output tokens has finished by length (its
        next token will not be asked for, whatever it is)."""
        return num_output_tokens >= self._max_output_tokens

    def banned_token_ids(self, num_output_tokens: int) -> frozenset[int]:
        """Tokens the sampler must not pick for output position `num_output_tokens`: the
        stop tokens, while `min_tokens` is not reached (else none)."""
        if num_output_tokens >= self._params.min_tokens:
            return frozenset()
        return self._eos_token_ids | self._stop_token_ids

    def visible_len(self, text: str, finished: bool) -> int:
        """How much of `text` the client may see now (a prefix: this many characters).

        Finished by a stop token or string: the text up to the cut. Finished otherwise: all
        of it. Running: all but the longest suffix that could still grow into a stop string
        (a suffix that is a prefix of one), so streamed text never shows part of a stop string
        that is later cut. It never shrinks from one step to the next, so outputs can carry
        it as deltas.
        """
        if finished:
            return len(text) if self._cut is None else self._cut
        if not self._stop_strings:
            return len(text)
        for length in range(min(self._max_stop_len, len(text)), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self._stop_strings):
                return len(text) - length
        return len(text)

    def _check_stop_token(self, token_id: int, text_before: int) -> StopDecision | None:
        if token_id in self._eos_token_ids:
            reason: int | None = None
        elif token_id in self._stop_token_ids:
            reason = int(token_id)
        else:
            return None
        # The stop token's own text (non-empty when special tokens are kept, or for a stop id
        # that is an ordinary token) is what this step added.
        if not self._params.include_stop_str_in_output:
            self._cut = text_before
        return StopDecision(True, FinishReason.STOP, reason)

    def _check_stop_strings(self, text: str, text_before: int) -> StopDecision | None:
        if not self._stop_strings or len(text) == text_before:
            return None
        # A stop string completed by this step ends in the new text, so it starts at most
        # max_len - 1 characters before it.
        start = max(0, text_before - self._max_stop_len + 1)
        best: tuple[int, int, str] | None = None
        for stop in self._stop_strings:
            found = text.find(stop, start)
            if found >= 0 and (best is None or (found, len(stop)) < best[:2]):
                best = (found, len(stop), stop)
        if best is None:
            return None
        found, length, stop = best
        self._cut = found + length if self._params.include_stop_str_in_output else found
        return StopDecision(True, FinishReason.STOP, stop)

    def _check_length(self, num_output_tokens: int) -> StopDecision | None:
        if num_output_tokens >= self._max_output_tokens:
            return StopDecision(True, FinishReason.LENGTH, None)
        return None
