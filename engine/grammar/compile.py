"""A structured-output constraint compiled against the model's vocabulary (xgrammar).

The vocabulary comes from the model's own tokenizer files (`engine.tokenizer.Tokenizer`,
no transformers): every token's stored text, decoded by xgrammar according to the
pipeline's type (byte-level BPE, byte-fallback or raw), as xgrammar's `from_huggingface`
reads a fast tokenizer. Special tokens get an empty text, which xgrammar never lets a
grammar produce: their text is not part of the output (skip_special_tokens), so a grammar
must not count it. The stop tokens are the engine's EOS ids; rows of a padded LM head past
the tokenizer's vocabulary are empty too.

JSON never holds a raw control character (RFC 8259: they are escaped in strings and only
tab, LF and CR may appear, as whitespace), but xgrammar 0.2.8's length-bounded strings
(maxLength) admit any of them. `json_text_tokens` is the vocabulary without such tokens;
a JSON constraint's rows are ANDed with it, so every output parses with a strict parser.

Constraints compile as vLLM's xgrammar backend compiles them (same defaults, so a client
gets the same language): JSON schemas in strict mode (no properties or items the schema
does not name); json_object as the schema {"type": "object"}; choices as an EBNF
alternation of literals; a grammar with `::=` as EBNF (GBNF), otherwise as Lark.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch
import xgrammar as xgr

from core.structured import StructuredKind, StructuredOutput
from engine.tokenizer import Tokenizer

_EBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def tokenizer_info(
    tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Collection[int]
) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary: `vocab_size` rows (the LM head's width)."""
    encoded = [""] * vocab_size
    special = tokenizer.all_special_ids
    for text, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size and token_id not in special:
            encoded[token_id] = text
    # xgrammar's own reading of a tokenizer.json: the decoder tells byte-level from
    # byte-fallback and whether a space is prepended (what `from_huggingface` calls).
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.to_json())
    stops = [t for t in stop_token_ids if 0 <= t < vocab_size]
    return xgr.TokenizerInfo(
        encoded,
        metadata["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=stops or None,
        add_prefix_space=metadata["add_prefix_space"],
    )


def new_compiler(info: xgr.TokenizerInfo) -> xgr.GrammarCompiler:
    # Caching is ours (`GrammarCache`, bounded); xgrammar's own cache would grow unbounded.
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def compile_constraint(
    compiler: xgr.GrammarCompiler, constraint: StructuredOutput
) -> xgr.CompiledGrammar:
    """Compile; raises RuntimeError with xgrammar's reason for a schema, regex or grammar
    it cannot take."""
    kind = constraint.kind
    if kind in (StructuredKind.JSON, StructuredKind.JSON_OBJECT):
        schema = constraint.spec if kind == StructuredKind.JSON else '{"type": "object"}'
        compact = constraint.disable_any_whitespace
        return compiler.compile_json_schema(
            schema, any_whitespace=not compact, separators=(",", ":") if compact else None
        )
    if kind == StructuredKind.REGEX:
        return compiler.compile_regex(constraint.spec)
    if kind == StructuredKind.CHOICE:
        return compiler.compile_grammar(choice_grammar(constraint.choices))
    if "::=" in constraint.spec:
        return compiler.compile_grammar(constraint.spec)
    return compiler.compile_lark(constraint.spec)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose sentences are exactly `choices`."""

    def literal(text: str) -> str:
        escaped = "".join(
            _EBNF_ESCAPES.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
            for c in text
        )
        return f'"{escaped}"'

    return "root ::= " + " | ".join(literal(c) for c in choices)


_CONTROL_BYTES = frozenset(range(0x20)) - {0x09, 0x0A, 0x0D}
_WHITESPACE_BYTES = frozenset({0x09, 0x0A, 0x0D})


def json_text_tokens(info: xgr.TokenizerInfo, compact: bool) -> torch.Tensor:
    """Packed bitmask row (xgrammar's layout) of the tokens that may appear in JSON text:
    none with a raw control character, and (compact: no whitespace anywhere) none with a
    tab, LF or CR either."""
    banned = _CONTROL_BYTES | (_WHITESPACE_BYTES if compact else frozenset())
    allowed = np.ones(info.vocab_size, dtype=bool)
    for token_id, text in enumerate(info.decoded_vocab[: info.vocab_size]):
        if banned.intersection(text):
            allowed[token_id] = False
    words = -(-info.vocab_size // 32)
    bits = np.zeros(words * 32, dtype=np.uint64)
    bits[: info.vocab_size] = allowed
    packed = (bits.reshape(words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32))
