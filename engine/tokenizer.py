"""The tokenizer and chat template of a Hugging Face model folder, without transformers.

`Tokenizer.from_dir` wraps the `tokenizers` library and reproduces what transformers 5.23's
`AutoTokenizer` does for a folder with a `tokenizer.json` (`TokenizersBackend`): the
serialized pipeline is used as is (its post-processor decides whether BOS is added; with a
`tokenizer.json`, transformers ignores `add_bos_token` in the config), named special tokens
missing from the vocab are added as special tokens, and decoding skips the WordPiece-only
space clean-up for BPE models.

Chat templates render in an environment that mirrors transformers'
(`utils/chat_template_utils.py`): an immutable sandbox with `trim_blocks`/`lstrip_blocks`,
the `loopcontrols` extension, a `{% generation %}` block (rendered as its body; we never track
assistant masks), a `tojson` that doesn't HTML-escape, and the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` refusing underscore names. Messages are copied down
to plain JSON types first: templates are untrusted code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
import jinja2.utils
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend

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
# Names a message's reasoning may come under; templates read the first (transformers aliases).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
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


class ChatTemplateError(ValueError):
    """The template is missing, does not compile, or failed (incl. its raise_exception)."""


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
        config = _read_json(folder / "tokenizer_config.json")
        legacy_map = _read_json(folder / "special_tokens_map.json")

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
        generation = _read_json(folder / "generation_config.json")
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
            template = self._compiled[source] = _compile_template(source)
        variables = {**self.special_tokens_map, **kwargs}
        return _render(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            variables=variables,
        )

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


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object at the top level")
    return data


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


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; we just render it."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension API uses a class attribute

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore names (no route to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"chat templates cannot set attribute {name!r}")


class _DictFactory:
    """`dict(...)` inside templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def _plain_data(value: Any) -> Any:
    """A deep copy made only of JSON-like types; anything else becomes '<TypeName>'."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # Subclasses (enums, numpy scalars) may carry methods: reduce them to the base type.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain_data(k): _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain_data(v) for v in value)
    return f"<{type(value).__name__}>"


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _render(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
    documents: list[dict[str, Any]] | None,
    variables: dict[str, Any],
) -> str:
    """Renders one conversation. `variables` holds special tokens and caller kwargs."""
    chat = _plain_data(list(messages))
    for message in chat:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {message!r}")
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise ChatTemplateError("tools must be JSON schema dicts (callables are not supported)")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise ChatTemplateError("documents must be dicts with 'title' and 'text' keys")
    try:
        return template.render(
            messages=[_alias_reasoning(m) for m in chat],
            tools=_plain_data(tools),
            documents=_plain_data(documents),
            add_generation_prompt=add_generation_prompt,
            **_plain_data(variables),
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
