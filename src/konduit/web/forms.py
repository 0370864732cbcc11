"""Forms from JSON Schemas: the fields of a workflow's declared input (what Pydantic's
``model_json_schema()`` writes, as stored at registration) for the dashboard's start form, and
the JSON value a submitted form stands for.

Pure: no page, no database. :func:`fields_of` reads an object schema's properties (``type``
string, integer, number or boolean; ``enum``, also behind a ``$ref`` to ``$defs``; ``default``,
``title``, ``description``, ``required``; ``X | None`` as an optional field) into
:class:`FormField` objects; a property of any other shape (a nested object, an array, a union)
becomes a JSON field, its value typed as JSON. A schema that is not an object with properties
gives None: the form offers raw JSON only.

:func:`value_of` turns the submitted texts back into the value: each text converted to its
field's type, an empty field left out (the workflow's default then applies, and a required one
is refused by the engine as ``field required``), a checkbox always a boolean. What cannot be
converted (``"abc"`` for a whole number) is named per field, and the engine's own check names
the rest (:class:`konduit.InputValidationError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["text", "integer", "number", "boolean", "choice", "json"]

class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""The default of a field whose schema gives none, and the value of a field left out."""

MAX_FIELDS = 200
"""Properties rendered at most: a larger schema is offered as raw JSON only."""

NULL = {"type": "null"}


@dataclass(frozen=True)
class FormField:
    """One property of the input, as a form field."""

    name: str
    kind: Kind
    label: str
    description: str = ""
    required: bool = False
    nullable: bool = False
    default: Any = MISSING
    choices: tuple[Any, ...] = field(default=())

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING

    @property
    def options(self) -> list[tuple[str, str]]:
        """A choice's ``(value, label)`` pairs: the value is the JSON of the choice."""
        return [(json.dumps(c), str(c)) for c in self.choices]

    def text_of(self, value: Any) -> str:
        """``value`` as this field's text (what :meth:`parse` turns back into ``value``)."""
        if self.kind == "choice" or self.kind == "json":
            return json.dumps(value) if self.kind == "choice" else json.dumps(value, indent=1)
        if self.kind == "boolean":
            return "" if value is None else "true" if value else "false"
        if self.kind == "number" and isinstance(value, float):
            return repr(value)
        return "" if value is None else str(value)

    def parse(self, text: str | None) -> Any:
        """The JSON value of the submitted ``text`` (None: the field was not sent), MISSING
        when the field is left out; raises ValueError saying what is wrong."""
        if self.kind == "boolean":
            if self.nullable:  # a select: (empty), true, false
                return MISSING if not text else text == "true"
            return text is not None and text in ("true", "on")
        if text is None or (self.kind != "text" and not text.strip()) or text == "":
            return MISSING
        if self.kind == "text":
            return text
        if self.kind == "integer":
            try:
                return int(text.strip())
            except ValueError:
                raise ValueError(f"{text.strip()!r} is not a whole number") from None
        if self.kind == "number":
            try:
                number = float(text.strip())
            except ValueError:
                raise ValueError(f"{text.strip()!r} is not a number") from None
            if not math.isfinite(number):
                raise ValueError(f"{text.strip()!r} is not a finite number")
            return int(number) if number.is_integer() and "." not in text and "e" not in \
                text.lower() else number
        if self.kind == "choice":
            for choice in self.choices:
                if json.dumps(choice) == text:
                    return choice
            raise ValueError(f"{text!r} is not one of the choices")
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column "
                             f"{exc.colno}") from None


def _resolve(schema: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/Name``) or a one-element ``allOf`` replaced
    by what it names, its own keywords (``default``, ``description``) kept over the target's."""
    if not isinstance(schema, dict) or depth > 8:
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        if isinstance(target, dict):
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return _resolve({**target, **rest}, root, depth + 1)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1:
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return _resolve({**_resolve(all_of[0], root, depth + 1), **rest}, root, depth + 1)
    return schema


def _kind(schema: Mapping[str, Any]) -> tuple[Kind, bool, tuple[Any, ...]]:
    """The field kind of a resolved property schema, whether it may be null, its choices."""
    nullable = False
    kind_of = schema.get("type")
    if isinstance(kind_of, list):  # {"type": ["string", "null"]}
        nullable = "null" in kind_of
        rest = [t for t in kind_of if t != "null"]
        kind_of = rest[0] if len(rest) == 1 else None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        choices = tuple(c for c in enum if c is not None)
        nullable = nullable or len(choices) < len(enum)
        if choices and all(isinstance(c, str | int | float | bool) for c in choices):
            return "choice", nullable, choices
        return "json", nullable, ()
    if "const" in schema:
        return "json", nullable, ()
    if kind_of in ("string", "integer", "number", "boolean"):
        return ("text" if kind_of == "string" else kind_of), nullable, ()
    return "json", nullable, ()


def _field(name: str, raw: Any, root: Mapping[str, Any], required: bool) -> FormField:
    own = raw if isinstance(raw, dict) else {}
    schema = _resolve(raw, root)
    if not isinstance(schema, dict):
        schema = {}
    outer = schema
    for union in ("anyOf", "oneOf"):
        options = schema.get(union)
        if isinstance(options, list):
            real = [o for o in options if _resolve(o, root) != NULL]
            if len(real) == 1 and len(real) < len(options):  # X | None
                inner = _resolve(real[0], root)
                inner = inner if isinstance(inner, dict) else {}
                kind, _, choices = _kind(inner)
                return _made(name, kind, True, choices, own, outer, inner, required)
            return _made(name, "json", False, (), own, outer, {}, required)
    kind, nullable, choices = _kind(schema)
    return _made(name, kind, nullable, choices, own, outer, schema, required)


def _made(name: str, kind: Kind, nullable: bool, choices: tuple[Any, ...],
          own: Mapping[str, Any], outer: Mapping[str, Any], inner: Mapping[str, Any],
          required: bool) -> FormField:
    """The field; its label is the property's own title (a ``$ref``'d model's title names the
    type, not the field), else its name."""
    said = [s.get("description") for s in (own, outer, inner)]
    description = next((d for d in said if isinstance(d, str) and d), "")
    default = outer.get("default", inner.get("default", MISSING))
    if default is None:
        default = MISSING  # "X | None = None": the field starts empty (and is left out)
    title = own.get("title")
    label = title if isinstance(title, str) and title else name
    return FormField(name=name, kind=kind, label=label, description=description,
                     required=required, nullable=nullable, default=default, choices=choices)


def fields_of(schema: Any) -> list[FormField] | None:
    """The form fields of an object schema's properties, in the schema's order; None when the
    schema is not an object with properties (the form then offers raw JSON only)."""
    if not isinstance(schema, dict):
        return None
    root = _resolve(schema, schema)
    if not isinstance(root, dict):
        return None
    properties = root.get("properties")
    if root.get("type", "object") != "object" or not isinstance(properties, dict) \
            or not properties or len(properties) > MAX_FIELDS:
        return None
    required = root.get("required")
    needed = set(required) if isinstance(required, list) else set()
    return [_field(str(name), prop, schema, name in needed) for name, prop in properties.items()]


def initial_texts(fields: list[FormField]) -> dict[str, str]:
    """The texts a fresh form starts with: each field's default."""
    return {f.name: f.text_of(f.default) for f in fields if f.has_default}


def texts_of(fields: list[FormField], value: Mapping[str, Any]) -> dict[str, str]:
    """The texts a form submits for ``value`` (an unchecked checkbox submits nothing)."""
    texts = {}
    for f in fields:
        if f.name not in value:
            continue
        if f.kind == "boolean" and not f.nullable and not value[f.name]:
            continue
        texts[f.name] = f.text_of(value[f.name])
    return texts


def value_of(fields: list[FormField],
             texts: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The input a submitted form stands for, and what is wrong with each field that cannot be
    converted (empty when nothing is)."""
    value: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for f in fields:
        try:
            parsed = f.parse(texts.get(f.name))
        except ValueError as exc:
            errors[f.name] = str(exc)
            continue
        if parsed is not MISSING:
            value[f.name] = parsed
    return value, errors
