"""The structured-output constraint as plain data: its shape checks, its cache key, and
that it travels (pickled, inside SamplingParams) unchanged."""

from __future__ import annotations

import json
import pickle

import pytest

from core.sampling import SamplingParams
from core.structured import MAX_SPEC_CHARS, StructuredKind, StructuredOutput


def test_a_schema_keeps_its_property_order() -> None:
    so = StructuredOutput.json_schema({"properties": {"b": {}, "a": {}}}, "f")
    assert list(json.loads(so.spec)["properties"]) == ["b", "a"]
    assert so.kind == StructuredKind.JSON and so.field == "f"


def test_the_key_ignores_the_field_name() -> None:
    a = StructuredOutput(StructuredKind.REGEX, "a+", field="guided_regex")
    b = StructuredOutput(StructuredKind.REGEX, "a+", field="structured_outputs.regex")
    assert a == b and a.key == b.key and hash(a) == hash(b)
    assert a.key != StructuredOutput(StructuredKind.REGEX, "a+", disable_any_whitespace=True).key


def test_it_travels_inside_sampling_params() -> None:
    so = StructuredOutput(StructuredKind.CHOICE, choices=["x", "y"])  # type: ignore[arg-type]
    params = SamplingParams(structured_outputs=so)
    assert so.choices == ("x", "y")
    assert pickle.loads(pickle.dumps(params)) == params


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "json", "spec": "{"}, "not valid JSON"),
        ({"kind": "json", "spec": "[1]"}, "is an object"),
        ({"kind": "json", "spec": " "}, "non-empty"),
        ({"kind": "regex", "spec": ""}, "non-empty"),
        ({"kind": "regex", "spec": "a" * (MAX_SPEC_CHARS + 1)}, "longer than"),
        ({"kind": "choice"}, "between 1 and"),
        ({"kind": "choice", "choices": ("a", "")}, "non-empty string"),
        ({"kind": "regex", "spec": "a", "choices": ("a",)}, "only for kind"),
        ({"kind": "json_object", "spec": "{}"}, "takes no spec"),
    ],
)
def test_shape_checks_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        StructuredOutput(field="the.field", **kwargs)
    assert str(e.value).startswith("the.field: ")


def test_unknown_kind_and_wrong_type_are_refused() -> None:
    with pytest.raises(ValueError):
        StructuredOutput("xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})  # type: ignore[arg-type]
