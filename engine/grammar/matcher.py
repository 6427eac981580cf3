"""One request's place in its grammar (xgrammar's GrammarMatcher), and the batch's token
bitmask built from the constrained rows.

    bitmask: int32 [rows in the batch, ceil(vocab / 32)], bit t of row i = token t allowed
             (xgrammar's packed layout; only the constrained rows are filled and read)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xgrammar as xgr

from core.request import FinishReason
from engine.stop_checker import StopDecision

logger = logging.getLogger(__name__)


class RequestGrammar:
    """Per request; lives on the engine's thread."""

    def __init__(self, compiled: xgr.CompiledGrammar, allowed: torch.Tensor | None = None) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._allowed = allowed
        """A packed bitmask row ANDed into every mask (tokens the grammar must not
        produce although xgrammar would allow them: `compile.json_text_tokens`)."""

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted where the grammar is complete: nothing may follow."""
        return bool(self._matcher.is_terminated())

    def accept(self, token_id: int) -> bool:
        """Advance past `token_id`; False (state unchanged) if the grammar does not allow it."""
        return bool(self._matcher.accept_token(int(token_id)))

    def after_token(self, token_id: int) -> StopDecision | None:
        """Advance past a token sampled under this grammar's mask: the request ends with
        STOP once the matcher has terminated (a stop token where the grammar is complete),
        or None, it goes on. A refusal cannot happen unless the mask was not applied (a
        bug): the request then ends with ERROR, never continues off its grammar."""
        if not self.accept(token_id):
            logger.error("grammar refused token %d sampled under its own mask", token_id)
            return StopDecision(True, FinishReason.ERROR)
        if self.is_terminated:
            return StopDecision(True, FinishReason.STOP)
        return None

    def fill_row(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self._allowed is not None:
            bitmask[row] &= self._allowed


@dataclass
class TokenMask:
    """Which tokens each constrained row of a batch may sample next."""

    bitmask: torch.Tensor
    """int32 [num_rows, ceil(vocab / 32)], on the CPU (rows not in `rows` are not read)."""
    rows: list[int]
    vocab_size: int

    def apply_(self, logits: torch.Tensor) -> None:
        """Set the disallowed logits of the constrained rows to -inf, in place (xgrammar's
        CPU or GPU kernel, on the logits' device)."""
        bitmask = self.bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=self.vocab_size, indices=self.rows
        )


def build_token_mask(grammars: Sequence[RequestGrammar | None], vocab_size: int) -> TokenMask:
    """One bitmask for the batch; row i filled from grammars[i] where that is not None."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
    for i in rows:
        grammars[i].fill_row(bitmask, i)  # type: ignore[union-attr]
    return TokenMask(bitmask, rows, vocab_size)
