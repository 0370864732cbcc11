"""Forms from JSON Schemas (konduit.web.forms): a Pydantic model's schema read into fields, and a
submitted form read back into the value the fields stand for, each field typed, an empty one
left out, a checkbox always a boolean; a value built from a schema round-trips through the
form (hypothesis)."""

from __future__ import annotations

import enum
import json
import string
from typing import Any, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from konduit.web.forms import MISSING, fields_of, initial_texts, texts_of, value_of


class Size(enum.StrEnum):
    small = "small"
    large = "large"


class Box(BaseModel):
    width: int


class Order(BaseModel):
    size: Size
    count: int = Field(2, ge=1, description="how many to make", title="How many")
    note: str | None = None
    gift: bool = False
    ratio: float = 0.5
    wrap: Size = Size.small
    level: Literal[1, 2, 3] = 1
    maybe: bool | None = None
    box: Box | None = None
    labels: list[str] = []


SCHEMA = Order.model_json_schema()


def by_name() -> dict[str, Any]:
    found = fields_of(SCHEMA)
    assert found is not None
    return {f.name: f for f in found}


def test_a_pydantic_schema_becomes_typed_fields() -> None:
    fields = by_name()
    assert list(fields) == list(Order.model_fields)  # the model's order
    size, count, note, gift = fields["size"], fields["count"], fields["note"], fields["gift"]
    assert (size.kind, size.required, size.choices, size.default) == (
        "choice", True, ("small", "large"), MISSING)  # an enum behind a $ref to $defs
    assert (count.kind, count.required, count.default) == ("integer", False, 2)
    assert (count.label, count.description) == ("How many", "how many to make")
    assert (note.kind, note.nullable, note.default, note.label) == ("text", True, MISSING, "Note")
    assert (gift.kind, gift.nullable, gift.default) == ("boolean", False, False)
    assert fields["ratio"].kind == "number"
    assert (fields["wrap"].kind, fields["wrap"].default, fields["wrap"].label) == (
        "choice", "small", "wrap")  # the $ref'd enum's title names the type, not the field
    assert (fields["level"].kind, fields["level"].choices) == ("choice", (1, 2, 3))
    assert (fields["maybe"].kind, fields["maybe"].nullable) == ("boolean", True)
    assert (fields["box"].kind, fields["box"].nullable) == ("json", True)  # nested: JSON
    assert (fields["labels"].kind, fields["labels"].default) == ("json", [])


def test_a_schema_that_is_no_object_with_properties_has_no_fields() -> None:
    for schema in (None, [], {}, {"type": "array", "items": {"type": "integer"}},
                   {"type": "object"}, {"type": "object", "properties": {}}, {"type": "string"}):
        assert fields_of(schema) is None, schema
    # A hand-written schema: type lists, an inline enum, no titles.
    fields = fields_of({"type": "object", "required": ["n"], "properties": {
        "n": {"type": ["integer", "null"]}, "mode": {"enum": ["a", "b", None]},
        "any": {}, "both": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}})
    assert fields is not None
    assert [(f.name, f.kind, f.nullable, f.required, f.label) for f in fields] == [
        ("n", "integer", True, True, "n"), ("mode", "choice", True, False, "mode"),
        ("any", "json", False, False, "any"), ("both", "json", False, False, "both")]


def test_a_form_becomes_the_value() -> None:
    fields = list(by_name().values())
    texts = initial_texts(fields)
    assert texts == {"count": "2", "gift": "false", "ratio": "0.5", "wrap": '"small"',
                     "level": "1", "labels": "[]"}
    # What the form starts with: the defaults; the required enum left to choose (and out).
    assert value_of(fields, texts) == ({"count": 2, "gift": False, "ratio": 0.5,
                                        "wrap": "small", "level": 1, "labels": []}, {})
    typed = {"size": '"large"', "count": " 7 ", "note": "rush", "gift": "true", "ratio": "2",
             "wrap": '"large"', "level": "3", "maybe": "false", "box": '{"width": 4}',
             "labels": '["a"]'}
    value, errors = value_of(fields, typed)
    assert errors == {}
    assert value == {"size": "large", "count": 7, "note": "rush", "gift": True, "ratio": 2,
                     "wrap": "large", "level": 3, "maybe": False, "box": {"width": 4},
                     "labels": ["a"]}
    Order.model_validate(value)
    jsonschema.validate(value, SCHEMA)
    # Empty fields are left out; an unchecked checkbox (not sent) is false.
    assert value_of(fields, {"size": '"small"', "count": "", "note": "", "maybe": "",
                             "box": "  "}) == ({"size": "small", "gift": False}, {})


def test_what_cannot_be_converted_is_named_per_field() -> None:
    fields = list(by_name().values())
    value, errors = value_of(fields, {"size": '"huge"', "count": "two", "ratio": "nan",
                                      "box": "{width: 4}", "level": "1"})
    assert set(errors) == {"size", "count", "ratio", "box"}
    assert errors["count"] == "'two' is not a whole number"
    assert "not one of the choices" in errors["size"]
    assert "not a finite number" in errors["ratio"]
    assert errors["box"].startswith("not JSON: ")
    assert value == {"gift": False, "level": 1}  # what could be read, for nothing: not started
    # 3.5 is not a whole number either (the engine would say "not of type integer").
    assert value_of(fields, {"count": "3.5"})[1] == {"count": "'3.5' is not a whole number"}


# -- the round trip ----------------------------------------------------------------------------

LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
               min_size=1, max_size=20)
NUMBER = st.floats(allow_nan=False, allow_infinity=False, width=64)


def order_values() -> st.SearchStrategy[dict[str, Any]]:
    """Orders as a form can express them: every boolean given (a checkbox always is), a string
    not empty and on one line (an empty field is left out; an input holds one line)."""
    optional = {
        "count": st.integers(min_value=1, max_value=10**15), "note": LINE, "ratio": NUMBER,
        "wrap": st.sampled_from(["small", "large"]), "level": st.sampled_from([1, 2, 3]),
        "maybe": st.booleans(), "box": st.builds(lambda w: {"width": w}, st.integers()),
        "labels": st.lists(st.text(max_size=5), max_size=3)}
    return st.fixed_dictionaries({"size": st.sampled_from(["small", "large"]),
                                  "gift": st.booleans()}, optional=optional)


@settings(max_examples=200, deadline=None)
@given(order_values())
def test_a_value_round_trips_through_the_form(value: dict[str, Any]) -> None:
    fields = list(by_name().values())
    back, errors = value_of(fields, texts_of(fields, value))
    assert errors == {}
    assert json.dumps(back, sort_keys=True) == json.dumps(value, sort_keys=True)
    Order.model_validate(back)


PROPERTY = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "number"},
                            {"type": "boolean"}, {"enum": ["x", "y", 3]},
                            {"type": "array", "items": {"type": "integer"}}])
NAMES = st.text(string.ascii_letters + "_", min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(NAMES, PROPERTY, min_size=1, max_size=6), st.data())
def test_any_flat_schema_round_trips(properties: dict[str, Any], data: st.DataObject) -> None:
    """Any flat object schema: a value drawn to match it (each boolean given) comes back."""
    schema = {"type": "object", "properties": properties}
    fields = fields_of(schema)
    assert fields is not None and [f.name for f in fields] == list(properties)
    drawn = {"string": LINE, "integer": st.integers(), "number": NUMBER,
             "boolean": st.booleans()}
    value: dict[str, Any] = {}
    for name, prop in properties.items():
        if prop.get("type") == "boolean" or data.draw(st.booleans()):
            value[name] = data.draw(st.sampled_from(prop["enum"]) if "enum" in prop
                                    else st.lists(st.integers()) if prop["type"] == "array"
                                    else drawn[prop["type"]])
    jsonschema.validate(value, schema)
    back, errors = value_of(fields, texts_of(fields, value))
    assert errors == {} and json.dumps(back, sort_keys=True) == json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("text", ["1e3", "-0.25", "10"])
def test_numbers_keep_their_type(text: str) -> None:
    [ratio] = [f for f in fields_of(SCHEMA) or [] if f.name == "ratio"]
    parsed = ratio.parse(text)
    assert parsed == float(text) and isinstance(parsed, int) == (text == "10")
