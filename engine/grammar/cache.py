"""The engine's compiled grammars: an LRU keyed by the constraint (`StructuredOutput.key`),
and the one place a constrained request gets its matcher.

Compiling is done on the engine's thread, when the request is admitted: a JSON schema
against a large vocabulary takes milliseconds to tens of milliseconds, and clients that
use structured outputs tend to send the same few schemas, so the cache makes the repeat
free. A constraint xgrammar refuses is the client's error: InvalidRequestError naming the
request field, raised before any output (the front doors answer 400). Failures are not
cached, so a bad schema costs its compile attempt each time (bounded by
`core.structured.MAX_SPEC_CHARS`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

from core.errors import InvalidRequestError
from core.structured import StructuredKind, StructuredOutput
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer

DEFAULT_MAX_ENTRIES = 256


class GrammarCache:
    """Not thread-safe: the engine's thread owns it."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        stop_token_ids: Collection[int],
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = model_config.vocab_size
        """The LM head's width: the masks' width."""
        self._stop_token_ids = tuple(stop_token_ids)
        self.max_entries = max_entries
        self._compiler: Any = None
        """xgrammar's compiler, made on the first constrained request (see __init__.py)."""
        self._json_text: dict[bool, Any] = {}
        """compact -> `compile.json_text_tokens` for this vocabulary."""
        self._compiled: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.num_hits = 0
        self.num_compiles = 0

    def __len__(self) -> int:
        return len(self._compiled)

    def compiled(self, constraint: StructuredOutput) -> Any:
        """The xgrammar CompiledGrammar for `constraint`, from the cache or compiled now."""
        from engine.grammar import compile as xgr_compile

        key = constraint.key
        hit = self._compiled.get(key)
        if hit is not None:
            self._compiled.move_to_end(key)
            self.num_hits += 1
            return hit
        if self._compiler is None:
            info = xgr_compile.tokenizer_info(
                self._tokenizer, self._vocab_size, self._stop_token_ids
            )
            self._compiler = xgr_compile.new_compiler(info)
        try:
            grammar = xgr_compile.compile_constraint(self._compiler, constraint)
        except (RuntimeError, ValueError) as e:
            raise InvalidRequestError(
                f"{constraint.field}: cannot be compiled: {_reason(e)}"
            ) from e
        self.num_compiles += 1
        self._compiled[key] = grammar
        if len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return grammar

    def start(self, constraint: StructuredOutput | None, replay: Sequence[int] = ()) -> Any:
        """A new request's matcher (`RequestGrammar`; None when it has no constraint),
        advanced past `replay`: the output tokens it already has (resumed from another
        worker). Raises InvalidRequestError if the constraint does not compile or the
        replayed tokens break it."""
        if constraint is None:
            return None
        from engine.grammar.matcher import RequestGrammar

        compiled = self.compiled(constraint)
        allowed = None
        if constraint.kind in (StructuredKind.JSON, StructuredKind.JSON_OBJECT):
            allowed = self._json_text_tokens(compiled, constraint.disable_any_whitespace)
        grammar = RequestGrammar(compiled, allowed)
        for i, token_id in enumerate(replay):
            if not grammar.accept(token_id):
                raise InvalidRequestError(
                    f"{constraint.field}: resumed output token {i} ({token_id}) does not fit "
                    f"the constraint"
                )
        return grammar

    def _json_text_tokens(self, compiled: Any, compact: bool) -> Any:
        from engine.grammar import compile as xgr_compile

        if compact not in self._json_text:
            info = compiled.tokenizer_info
            self._json_text[compact] = xgr_compile.json_text_tokens(info, compact)
        return self._json_text[compact]


def _reason(e: BaseException) -> str:
    """xgrammar's message without its C++ source location prefix ("[time] file.cc:12: ")."""
    text = str(e).strip()
    head, sep, rest = text.partition(".cc:")
    if sep and "] " in head:
        _, _, rest = rest.partition(": ")
        return rest.strip() or text
    return text
