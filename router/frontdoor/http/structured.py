"""Structured-output request fields, under OpenAI's and vLLM's names, and the one
`core.structured.StructuredOutput` they ask for.

    response_format    {"type": "text" | "json_object" | "json_schema", "json_schema":
                        {"name", "description", "schema", "strict"}}          (OpenAI)
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object",
                        "disable_any_whitespace", "disable_additional_properties"}
                                                                            (vLLM >= 0.10)
    guided_json, guided_regex, guided_choice, guided_grammar                (older vLLM)

One constraint per request: two (say response_format json_schema and guided_regex) are a
400, as vLLM refuses them. What xgrammar cannot do is refused, never dropped: structural
tags and whitespace_pattern. `strict` is accepted whatever its value: the schema is always
enforced (xgrammar's strict mode: no properties or items the schema does not name), which
also makes `disable_additional_properties` hold. Whether a schema, regex or grammar
compiles is the worker's call (`engine.grammar.cache`): the front door is torch-free and
xgrammar is not, and the compiled form depends on the model's vocabulary.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import InvalidRequestError
from core.structured import StructuredKind, StructuredOutput

JSONSchema = dict[str, Any] | bool | str
"""A schema as a JSON object (or true / false), or as JSON text."""


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="Baton always enforces the schema.")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` (its StructuredOutputsParams): exactly one constraint."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: JSONSchema | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class StructuredOutputFields(BaseModel):
    """The structured-output fields chat and completions share."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: JSONSchema | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    def structured_output(self) -> StructuredOutput | None:
        """The request's constraint (None: free text). Raises InvalidRequestError naming
        the field for a malformed, unsupported or doubled constraint."""
        so = self.structured_outputs
        compact = bool(so and so.disable_any_whitespace)
        try:
            found = [c for c in self._candidates(compact) if c is not None]
        except ValueError as e:  # core.structured's shape checks name the field
            raise InvalidRequestError(str(e)) from e
        if len(found) > 1:
            fields = ", ".join(c.field for c in found)
            raise InvalidRequestError(f"{fields}: give one structured-output constraint")
        if so is not None and not found:
            raise InvalidRequestError(
                "structured_outputs: set one of json, regex, choice, grammar or json_object"
            )
        return found[0] if found else None

    def _candidates(self, compact: bool) -> list[StructuredOutput | None]:
        for name in ("guided_whitespace_pattern",):
            if getattr(self, name) is not None:
                raise InvalidRequestError(f"{name}: not supported (xgrammar has no such option)")
        return [
            self._from_response_format(compact),
            *self._from_structured_outputs(compact),
            _json(self.guided_json, "guided_json", compact),
            _text(StructuredKind.REGEX, self.guided_regex, "guided_regex"),
            _choice(self.guided_choice, "guided_choice"),
            _text(StructuredKind.GRAMMAR, self.guided_grammar, "guided_grammar"),
        ]

    def _from_response_format(self, compact: bool) -> StructuredOutput | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutput(StructuredKind.JSON_OBJECT, "", (), compact, "response_format")
        if fmt.type == "structural_tag":
            raise InvalidRequestError("response_format: type 'structural_tag' is not supported")
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise InvalidRequestError(
                "response_format.json_schema.schema: required when type is 'json_schema'"
            )
        return _json(fmt.json_schema.json_schema, "response_format.json_schema.schema", compact)

    def _from_structured_outputs(self, compact: bool) -> list[StructuredOutput | None]:
        so = self.structured_outputs
        if so is None:
            return []
        for name in ("whitespace_pattern", "structural_tag"):
            if getattr(so, name) is not None:
                raise InvalidRequestError(f"structured_outputs.{name}: not supported")
        json_object = None
        if so.json_object is not None:
            if not so.json_object:
                raise InvalidRequestError(
                    "structured_outputs.json_object: must be true if set; omit it otherwise"
                )
            json_object = StructuredOutput(
                StructuredKind.JSON_OBJECT, "", (), compact, "structured_outputs.json_object"
            )
        return [
            _json(so.json_, "structured_outputs.json", compact),
            _text(StructuredKind.REGEX, so.regex, "structured_outputs.regex"),
            _choice(so.choice, "structured_outputs.choice"),
            _text(StructuredKind.GRAMMAR, so.grammar, "structured_outputs.grammar"),
            json_object,
        ]


def _json(schema: JSONSchema | None, field: str, compact: bool) -> StructuredOutput | None:
    if schema is None:
        return None
    return StructuredOutput.json_schema(schema, field, compact)


def _text(kind: StructuredKind, spec: str | None, field: str) -> StructuredOutput | None:
    return None if spec is None else StructuredOutput(kind, spec, field=field)


def _choice(choices: list[str] | None, field: str) -> StructuredOutput | None:
    if choices is None:
        return None
    return StructuredOutput(StructuredKind.CHOICE, choices=tuple(choices), field=field)
