"""The tiny models' tokenizer: a byte-level BPE trained on `engine/data/corpus.txt`, its
special tokens and its (Llama 3 style) chat template."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|pad|>",
)
# Llama 3 style. `bos_token` comes first so the template matches what the tokenizer adds.
CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if tools %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools you can call:\\n' }}\n"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}\n"
    "{{- '<|eot|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}\n"
    "{{- raise_exception('unknown role: ' ~ message['role']) }}\n"
    "{%- endif %}\n"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' }}\n"
    "{{- (message['content'] or '') | trim }}{{ '<|eot|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
# engine/data/, shipped as package data of `engine` (pyproject.toml), beside this package.
CORPUS_PATH = Path(__file__).parent.parent / "data" / "corpus.txt"
# The Qwen2 pre-tokenizer: transformers 5 rebuilds Qwen2 tokenizers with exactly this pipeline
# (NFC, this split, byte-level) whatever tokenizer.json says, so using it for every arch keeps
# our folders' tokenizer.json and transformers in agreement. Digits split one by one.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKENIZER_RECIPE = "baton-bpe-v2"  # change when training changes: cached files then miss


def train_tokenizer(vocab_size: int, cache_dir: Path | None = None) -> Tokenizer:
    """A byte-level BPE (Llama 3 / Qwen2 style) with exactly `vocab_size` ids.

    Special tokens take ids 0..5; when the corpus runs out of merges before `vocab_size`,
    the rest is filled with `<|reserved_N|>` special tokens, as Llama 3 does. Training is
    single-threaded-deterministic in `tokenizers` (counts are summed, ties broken by pair),
    and the result is cached in `cache_dir`, keyed by corpus, size and recipe.
    """
    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be >= {floor} (special tokens + 256 bytes)")
    corpus = CORPUS_PATH.read_bytes()
    key = hashlib.sha256(corpus + f"|{vocab_size}|{_TOKENIZER_RECIPE}".encode()).hexdigest()
    cached = cache_dir / f"bpe-{vocab_size}-{key[:16]}.json" if cache_dir else None
    if cached is not None and cached.is_file():
        return Tokenizer.from_file(str(cached))

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus.decode("utf-8").splitlines(keepends=True), trainer)
    shortfall = vocab_size - tokenizer.get_vocab_size(with_added_tokens=True)
    reserved = [f"<|reserved_{i}|>" for i in range(shortfall)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    bos = SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B:1",
        special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(tokenizer.to_str(), encoding="utf-8")
    return tokenizer
