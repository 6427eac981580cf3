"""A GGUF file's vocabulary as a `tokenizers` tokenizer.json and its tokenizer_config.json.

Two kinds of vocabulary (`tokenizer.ggml.model`):
- `gpt2`: byte-level BPE (Llama 3, Qwen, SmolLM): tokens spelled in GPT-2's byte alphabet,
  the file's merges, GPT-2's split of the text (or the model family's own, `_SPLITS`).
- `llama`: SentencePiece BPE (Llama 2, Mistral): a space is "▁" (one before the text unless
  it starts with a space), unknown bytes fall back to <0xNN> tokens, and merges, when the
  file has none, ranked by the merged token's score.
Control tokens (type 3) are special added tokens, user-defined ones (type 4) plain added
tokens, as transformers builds them from the same file.
"""

from __future__ import annotations

from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from engine.gguf.config import GGUFError, field

CONTROL, USER_DEFINED = 3, 4
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
"""`tokenizer.ggml.pre` -> the text split its merges were learned on (else GPT-2's)."""


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    spelling, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _byte_level(tokens: list[str], merges: list[str], pre: str | None) -> Tokenizer:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))  # type: ignore[arg-type]
    split = _SPLITS.get(pre or "")
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _ranked_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges from the vocabulary: every split of a token into two tokens,
    ranked by the score of the token it makes (higher first), a token's splits with the
    longer left part first (the order transformers derives from the same file)."""
    known = set(tokens)
    found = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in known and right in known:
                found.append((-score, -len(left), -len(right), left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _sentencepiece(tokens: list[str], merges: list[str] | None, scores: list[float]) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges else _ranked_merges(tokens, scores)
    unk = "<unk>" if "<unk>" in vocab else None
    model = models.BPE(vocab, pairs, unk_token=unk, byte_fallback=True, fuse_unk=True)  # type: ignore[arg-type]
    tokenizer = Tokenizer(model)
    # A space is "▁", and one is put before the text unless it starts with one.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])  # fmt: skip
    return tokenizer


def hf_tokenizer(reader: GGUFReader) -> tuple[str, dict[str, Any]]:
    """(tokenizer.json text, tokenizer_config.json) of the file's vocabulary."""
    kind = field(reader, "tokenizer.ggml.model")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens") or []
    if not tokens:
        raise GGUFError("GGUF file has no vocabulary (tokenizer.ggml.tokens)")
    merges = field(reader, "tokenizer.ggml.merges")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tokenizer = _byte_level(tokens, merges or [], field(reader, "tokenizer.ggml.pre"))
        spelled = set(_byte_alphabet().values())
    elif kind == "llama":
        scores = field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        tokenizer = _sentencepiece(tokens, merges, scores)
        spelled = None
    else:
        raise GGUFError(f"GGUF tokenizer model {kind!r} is not handled (handled: gpt2, llama)")
    control = [t for t, k in zip(tokens, types, strict=True)
               if k == CONTROL and (spelled is None or set(t) <= spelled)]  # fmt: skip
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    user = [t for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def named(key: str) -> str | None:
        token_id = field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(token_id)] if token_id is not None and token_id < len(tokens) else None

    add_bos = field(reader, "tokenizer.ggml.add_bos_token", kind == "llama")
    bos = named("bos_token_id")
    if add_bos and bos is not None:
        bos_id = int(field(reader, "tokenizer.ggml.bos_token_id"))
        tokenizer.post_processor = TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": named("eos_token_id"),
        "unk_token": named("unknown_token_id"),
        "pad_token": named("padding_token_id"),
        "add_bos_token": bool(add_bos),
        "clean_up_tokenization_spaces": False,
    }
    template = field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tokenizer.to_str(), {k: v for k, v in config.items() if v is not None}
