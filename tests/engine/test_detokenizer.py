"""Incremental detokenizer tests on a small byte-level BPE trained in-test."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.detokenizer import IncrementalDetokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = [
    "the", "model", "serves", "tokens", "café", "naïve", "über", "señor", "日本語", "テキスト",
    "中文", "Привет", "мир", "Ελληνικά", "🙂", "👍🏽", "🚀", "€", "ñandú", "", "x=1;", "\n",
]  # fmt: skip


def training_sentences() -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]


class TokenizerAdapter:
    """The duck-typed interface the engine's tokenizer offers, over a raw `tokenizers` model.
    Counts decoded ids so tests can check the cost per token."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.all_special_ids = frozenset(tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
        self.eos_token_ids = (tokenizer.token_to_id("<|endoftext|>"),)
        self.vocab_size = tokenizer.get_vocab_size()
        self.num_decoded_ids = 0

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        self.num_decoded_ids += len(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._tokenizer.id_to_token(i) for i in ids]


def build_tokenizer() -> TokenizerAdapter:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_sentences(), trainer)
    return TokenizerAdapter(tokenizer)


TOKENIZER = build_tokenizer()
REPLACEMENT = "\ufffd"


def stream(
    ids: list[int], prompt: list[int] | None = None, skip_special_tokens: bool = True
) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(TOKENIZER, prompt or [], skip_special_tokens)
    return [detok.append(t) for t in ids], detok


MULTIBYTE_TEXTS = [
    "café naïve über 日本語のテキスト 🙂👍🏽🚀 Ελληνικά",
    "ñandú€€€ 中文中文 мир",
    "👍🏽👍🏽👍🏽",
    "plain ascii only",
]


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
@pytest.mark.parametrize("prompt_text", ["", "Say: ", "日本"])
def test_real_text_round_trips_without_replacement_chars(text: str, prompt_text: str) -> None:
    ids = TOKENIZER.encode(text)
    deltas, detok = stream(ids, TOKENIZER.encode(prompt_text))
    assert "".join(deltas) == detok.text == text
    assert all(REPLACEMENT not in d for d in deltas)


def single_byte_ids(text: str) -> list[int]:
    """One token per UTF-8 byte (the byte-level alphabet is in the vocabulary)."""
    ids = []
    for token in TOKENIZER._tokenizer.pre_tokenizer.pre_tokenize_str(text):
        ids.extend(TOKENIZER._tokenizer.token_to_id(ch) for ch in token[0])
    return ids


def test_split_character_is_held_back_until_complete() -> None:
    ids = single_byte_ids("a🚀a")  # a, 4 byte tokens of the rocket, a
    assert len(ids) == 6 and all(REPLACEMENT in TOKENIZER.decode([t]) for t in ids[1:5])
    deltas, _ = stream(ids)
    assert deltas == ["a", "", "", "", "🚀", "a"]


def test_merged_tokens_that_split_characters() -> None:
    # Real BPE merges that cut a character in two (e.g. a space merged with a lead byte).
    text = "x日本語のテキスト👍🏽 ñ"
    ids = TOKENIZER.encode(text)
    assert any(REPLACEMENT in TOKENIZER.decode([t]) for t in ids)
    deltas, detok = stream(ids)
    assert detok.text == text and all(REPLACEMENT not in d for d in deltas)


def test_one_token_per_byte() -> None:
    text = "é🚀 日本"
    deltas, detok = stream(single_byte_ids(text))
    assert detok.text == text
    assert deltas.count("") == len(text.encode()) - len(text)  # one delta per character
    assert [d for d in deltas if d] == list(text)


def test_special_tokens_skipped_or_kept() -> None:
    special = TOKENIZER._tokenizer.token_to_id("<|im_end|>")
    ids = [*TOKENIZER.encode("hi 🙂"), special, *TOKENIZER.encode(" bye")]
    _, detok = stream(ids, skip_special_tokens=True)
    assert detok.text == "hi 🙂 bye" == TOKENIZER.decode(ids, skip_special_tokens=True)
    _, detok = stream(ids, skip_special_tokens=False)
    assert detok.text == TOKENIZER.decode(ids, skip_special_tokens=False)
    assert "<|im_end|>" in detok.text


def test_prompt_ending_inside_a_character_does_not_garble_output() -> None:
    ids = single_byte_ids("日")
    _, detok = stream(TOKENIZER.encode("ok"), prompt=ids[:2])
    assert detok.text == "ok"


def test_cost_per_token_is_bounded() -> None:
    text = " ".join(MULTIBYTE_TEXTS) * 20
    ids = TOKENIZER.encode(text)
    TOKENIZER.num_decoded_ids = 0
    _, detok = stream(ids, prompt=TOKENIZER.encode("a long prompt " * 50))
    assert detok.text == text
    assert TOKENIZER.num_decoded_ids / len(ids) < 25, "each step must decode a small window"


token_ids = st.integers(min_value=0, max_value=TOKENIZER.vocab_size - 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ids=st.lists(token_ids, max_size=40),
    prompt=st.lists(token_ids, max_size=8),
    skip=st.booleans(),
)
def test_deltas_concatenate_to_full_decode(ids: list[int], prompt: list[int], skip: bool) -> None:
    deltas, detok = stream(ids, prompt, skip)
    full = TOKENIZER.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == detok.text
    assert full.startswith(detok.text)
    if not full.endswith(REPLACEMENT):
        assert detok.text == full
    # Emitted text is final: every later complete decode extends it (so no U+FFFD was ever
    # emitted for a character still in flight).
    emitted = ""
    for i, delta in enumerate(deltas):
        emitted += delta
        later = TOKENIZER.decode(ids[: i + 1], skip_special_tokens=skip)
        assert later.startswith(emitted)
        assert full.startswith(emitted)
