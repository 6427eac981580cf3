"""Chat templates, rendered as transformers renders them, in a sandbox: templates are
untrusted code shipped with a model folder.

The environment mirrors transformers' (`utils/chat_template_utils.py`): an immutable sandbox
with `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block
(rendered as its body; we never track assistant masks), a `tojson` that doesn't HTML-escape,
and the globals `raise_exception`, `strftime_now`, `dict` and a `namespace` refusing
underscore names. Messages are copied down to plain JSON types first, so a template reaches
no Python object's methods. Torch-free, like the tokenizer that uses it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.nodes
import jinja2.utils
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning may come under; templates read the first (transformers aliases).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template is missing, does not compile, or failed (incl. its raise_exception)."""


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


def compile_template(source: str) -> jinja2.Template:
    """`source` compiled in the sandbox; ChatTemplateError if it does not compile."""
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


def render(
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
