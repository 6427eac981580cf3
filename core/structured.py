"""A structured-output constraint: what shape the generated text must take (vLLM's
`StructuredOutputsParams`, one constraint per request).

    kind          spec                                  the output is
    json          a JSON Schema, as JSON text           a JSON value the schema accepts
    json_object   (none)                                a JSON object
    regex         a regular expression                  a full match of it
    choice        (none; `choices` holds the strings)   exactly one of `choices`
    grammar       an EBNF (GBNF) or Lark grammar        a sentence of the grammar

Plain, frozen, torch-free data: it travels inside `SamplingParams` from the front door to
the workers (pickled by Ray) and is the key of the workers' compiled-grammar cache. The
checks here are the shape of the constraint only; whether a schema, regex or grammar
compiles is decided by the worker's grammar compiler (`engine.grammar`), whose refusal is
an InvalidRequestError naming `field`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

MAX_SPEC_CHARS = 256 * 1024
"""A schema, regex or grammar longer than this is refused before anything compiles it."""
MAX_CHOICES = 1024


class StructuredKind(enum.StrEnum):
    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


@dataclass(frozen=True)
class StructuredOutput:
    kind: StructuredKind
    spec: str = ""
    """The schema (JSON text), regex or grammar; empty for json_object and choice."""
    choices: tuple[str, ...] = ()
    disable_any_whitespace: bool = False
    """JSON only: no optional whitespace between tokens (compact JSON, as vLLM's flag)."""
    field: str = field(default="structured_outputs", compare=False)
    """The request field the constraint came from, named in errors (not part of the key)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StructuredKind(self.kind))
        object.__setattr__(self, "choices", tuple(self.choices))
        self._validate()

    @classmethod
    def json_schema(
        cls, schema: object, field: str, disable_any_whitespace: bool = False
    ) -> StructuredOutput:
        """From a schema given as a JSON object (dict) or as JSON text."""
        if isinstance(schema, str):
            text = schema
        else:
            try:
                # Key order kept: properties are generated in the schema's order.
                text = json.dumps(schema, ensure_ascii=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{field}: the schema is not JSON ({e})") from e
        return cls(StructuredKind.JSON, text, (), disable_any_whitespace, field)

    @property
    def key(self) -> tuple[str, str, tuple[str, ...], bool]:
        """What the compiled grammar depends on (the cache key)."""
        return (self.kind.value, self.spec, self.choices, self.disable_any_whitespace)

    def _validate(self) -> None:
        where = self.field
        if len(self.spec) > MAX_SPEC_CHARS:
            raise ValueError(f"{where}: longer than {MAX_SPEC_CHARS} characters")
        if self.kind == StructuredKind.CHOICE:
            if not self.choices or len(self.choices) > MAX_CHOICES:
                raise ValueError(f"{where}: give between 1 and {MAX_CHOICES} choices")
            if any(not isinstance(c, str) or not c for c in self.choices):
                raise ValueError(f"{where}: every choice must be a non-empty string")
            if sum(len(c) for c in self.choices) > MAX_SPEC_CHARS:
                raise ValueError(f"{where}: the choices total over {MAX_SPEC_CHARS} characters")
        elif self.choices:
            raise ValueError(f"{where}: choices are only for kind 'choice'")
        if self.kind in (StructuredKind.JSON, StructuredKind.REGEX, StructuredKind.GRAMMAR):
            if not isinstance(self.spec, str) or not self.spec.strip():
                raise ValueError(f"{where}: must be a non-empty {self.kind.value}")
        elif self.spec:
            raise ValueError(f"{where}: kind {self.kind.value!r} takes no spec")
        if self.kind == StructuredKind.JSON:
            try:
                schema = json.loads(self.spec)
            except ValueError as e:
                raise ValueError(f"{where}: the schema is not valid JSON ({e})") from e
            if not isinstance(schema, dict | bool):
                raise ValueError(f"{where}: a JSON Schema is an object (or true / false)")
