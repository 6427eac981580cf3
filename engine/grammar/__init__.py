"""Structured outputs in the engine: a request's output held to a JSON schema, regex,
choice or grammar (`core.structured.StructuredOutput`), with xgrammar.

Why xgrammar: it compiles JSON Schema, regex and EBNF/Lark into token-level automata
against the model's vocabulary once (compiled grammars are reusable across requests, so
they are cached), and ships packed token-bitmask kernels for CPU and GPU; vLLM and SGLang
use it as their default structured-output backend.

A constrained request's life, in every role:

    1. admission (`LLMEngine._new_request`)  compile (LRU cache, `cache.py`), start a
       matcher, replay the output tokens it already has (a resumed request's)
    2. each step it samples in (`ModelRunner.execute`)   fill its row of one bitmask for
       the batch's constrained rows (`token_mask`); the sampler sets disallowed logits to
       -inf before penalties, temperature, top-k/top-p and the draw (greedy or random)
    3. each token it gets (`LLMEngine._process`)  advance the matcher; the matcher allows
       EOS only where the constraint is complete, and the request finishes when it
       terminates

In the disaggregated path the prefill engine samples the first token under the mask; the
decode engine's matcher replays resumed tokens at `reserve` and takes the first token at
`admit` (step 3), so both engines walk the same automaton.

xgrammar takes seconds to import (it loads transformers), so only the modules that need it
import it (`compile.py`, `matcher.py`), and only once a constrained request arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.grammar.matcher import TokenMask


def token_mask(grammars: Sequence[Any], vocab_size: int) -> TokenMask | None:
    """The batch's bitmask: a row for each non-None entry of `grammars` (each a
    `RequestGrammar`, one per logits row); None when no row is constrained."""
    if all(g is None for g in grammars):
        return None
    from engine.grammar.matcher import build_token_mask  # xgrammar is loaded by now

    return build_token_mask(grammars, vocab_size)
