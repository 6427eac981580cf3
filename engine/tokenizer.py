"""The tokenizer and chat template of a Hugging Face model folder, without transformers.

`Tokenizer.from_dir` wraps the `tokenizers` library and reproduces what transformers 5.23's
`AutoTokenizer` does for a folder with a `tokenizer.json` (`TokenizersBackend`): the
serialized pipeline is used as is (its post-processor decides whether BOS is added; with a
`tokenizer.json`, transformers ignores `add_bos_token` in the config), named special tokens
missing from the vocab are added as special tokens, and decoding skips the WordPiece-only
space clean-up for BPE models.

Chat templates render in engine/chat_template.py's sandbox; `encode_chat` is the one way
from chat messages to the prompt ids a model generates from. Torch-free: the router imports
this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend

from engine.chat_template import ChatTemplateError, compile_template, render
from engine.json_files import read_optional_json_object

__all__ = ["ChatTemplateError", "Tokenizer", "TokenizerError"]

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens templates see as variables.
_NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# transformers' clean_up_tokenization, applied only to non-BPE models when configured.
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class TokenizerError(ValueError):
    """A tokenizer folder is missing files or has malformed ones."""


class Tokenizer:
    """Encode, decode and chat-format text exactly as transformers' AutoTokenizer would."""

    def __init__(
        self,
        backend: _Backend,
        *,
        special_tokens: Mapping[str, str],
        extra_special_tokens: Iterable[str] = (),
        chat_template: str | dict[str, str] | None = None,
        clean_up_tokenization_spaces: bool = False,
        generation_eos_ids: Iterable[int] = (),
        source: str = "<memory>",
    ) -> None:
        self._backend = backend
        self._source = source
        self.special_tokens_map: dict[str, str] = dict(special_tokens)
        # transformers adds named special tokens the vocab lacks, as special added tokens.
        named_texts = list(dict.fromkeys([*special_tokens.values(), *extra_special_tokens]))
        missing = [t for t in named_texts if backend.token_to_id(t) is None]
        if missing:
            new = [AddedToken(t, special=True, normalized=False) for t in missing]
            backend.add_special_tokens(new)
        self._cleanup = clean_up_tokenization_spaces and _model_kind(backend) != "BPE"

        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = self._id_of("bos_token")
        self.pad_token_id: int | None = self._id_of("pad_token")
        eos = self._id_of("eos_token")
        eos_ids = ([] if eos is None else [eos]) + list(generation_eos_ids)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        named = {backend.token_to_id(t) for t in named_texts}
        added = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
        self.all_special_ids: frozenset[int] = frozenset((named | added) - {None})

        self.chat_template = chat_template
        self._compiled: dict[str, jinja2.Template] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        folder = Path(model_dir)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(
                f"{folder}: no tokenizer.json (only fast-tokenizer folders are supported)"
            )
        try:
            backend = _Backend.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises a plain Exception
            raise TokenizerError(f"{tokenizer_file}: cannot be loaded ({exc})") from exc
        config = read_optional_json_object(folder / "tokenizer_config.json", TokenizerError)
        legacy_map = read_optional_json_object(folder / "special_tokens_map.json", TokenizerError)

        special: dict[str, str] = {}
        for key in _NAMED_TOKENS:
            value = _token_text(config.get(key, legacy_map.get(key)))
            if value is not None:
                special[key] = value
        # transformers 5 treats any other "<name>_token" string in the config as a special token.
        for key, value in config.items():
            text = _token_text(value) if key.endswith("_token") else None
            if key not in special and text is not None:
                special[key] = text
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
        extra = legacy_map.get("additional_special_tokens") if extra is None else extra
        if isinstance(extra, dict):
            special.update({k: t for k, v in extra.items() if (t := _token_text(v))})
            extra = []
        extra_texts = [t for v in (extra or []) if (t := _token_text(v)) is not None]

        if config.get("split_special_tokens"):
            backend.encode_special_tokens = True
        generation = read_optional_json_object(folder / "generation_config.json", TokenizerError)
        gen_eos = generation.get("eos_token_id")
        gen_eos_ids = gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
        return cls(
            backend,
            special_tokens=special,
            extra_special_tokens=extra_texts,
            chat_template=_read_chat_template(folder, config),
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
            generation_eos_ids=[i for i in gen_eos_ids if isinstance(i, int)],
            source=str(folder),
        )

    # -- text <-> ids --------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self._cleanup:
            for before, after in _CLEANUPS:
                text = text.replace(before, after)
        return text

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        ids = list(ids)
        tokens = [self._backend.id_to_token(i) for i in ids]
        bad = [i for i, t in zip(ids, tokens) if t is None]
        if bad:
            raise ValueError(f"token ids out of range for {self._source}: {bad[:5]}")
        return tokens  # type: ignore[return-value]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        """Stored token text (byte-level pieces as stored, e.g. "Ġthe") -> id, added
        tokens included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def to_json(self) -> str:
        """The pipeline as tokenizer.json holds it (what grammar libraries read)."""
        return self._backend.to_str()

    # -- chat ----------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt string for `messages` (transformers' `tokenize=False` result).

        Extra kwargs become template variables (e.g. `enable_thinking=False` for Qwen3) and
        override the special-token variables of the same name, as in transformers.
        """
        if kwargs.pop("continue_final_message", False):
            raise ChatTemplateError("continue_final_message is not supported")
        source = self._select_template(chat_template, tools)
        template = self._compiled.get(source)
        if template is None:
            template = self._compiled[source] = compile_template(source)
        variables = {**self.special_tokens_map, **kwargs}
        return render(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            variables=variables,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> list[int]:
        """The prompt ids for `messages`, ready for the model to write the assistant's turn.

        The template is rendered with the generation prompt and encoded without adding
        special tokens, as transformers' `apply_chat_template(tokenize=True)` does: a template
        writes the BOS its model wants, and the post-processor would add a second one.
        Raises ChatTemplateError where `apply_chat_template` does; kwargs are its template
        variables.
        """
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tools=tools,
            documents=documents,
            chat_template=chat_template,
            **kwargs,
        )
        return self.encode(text, add_special_tokens=False)

    def _select_template(self, chosen: str | None, tools: list[Any] | None) -> str:
        templates = self.chat_template
        if isinstance(templates, dict):
            if chosen is not None and chosen in templates:
                return templates[chosen]
            if chosen is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise ChatTemplateError(
                    f"{self._source} has several chat templates {sorted(templates)} and no "
                    "'default'; pass chat_template=<name>"
                )
        if chosen is not None:
            return chosen
        if templates is None:
            raise ChatTemplateError(f"{self._source} has no chat template")
        return templates

    def _id_of(self, name: str) -> int | None:
        text = self.special_tokens_map.get(name)
        return None if text is None else self._backend.token_to_id(text)


def _model_kind(backend: _Backend) -> str:
    return json.loads(backend.to_str())["model"]["type"]


def _token_text(value: Any) -> str | None:
    """A token as written in tokenizer_config: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_chat_template(folder: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """chat_template.jinja (and additional_chat_templates/) win over the config's entry."""
    templates: dict[str, str] = {}
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    extra_dir = folder / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            templates[path.stem] = path.read_text(encoding="utf-8")
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    entry = config.get("chat_template")
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, list):
        # The older multi-template form: [{"name": ..., "template": ...}, ...].
        try:
            return {item["name"]: item["template"] for item in entry}
        except (KeyError, TypeError) as exc:
            raise TokenizerError(
                f"{folder / 'tokenizer_config.json'}: malformed 'chat_template' list"
            ) from exc
    raise TokenizerError(f"{folder / 'tokenizer_config.json'}: 'chat_template' must be a string")
