"""The API's bodies are made of the request types (:mod:`konduit.core.requests`): each body has
exactly its request's fields (but those the URL carries), with the request's defaults and
descriptions, so the HTTP door cannot name, default or describe a field otherwise than the
other doors. Pure: no database."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from konduit.core.requests import (
    BulkRequest,
    CancelRequest,
    Doc,
    EventRequest,
    ForkRequest,
    MigrateRequest,
    StartRequest,
    doc,
)
from konduit.web import api_models as m

BODIES: list[tuple[type[BaseModel], type, tuple[str, ...]]] = [
    (m.StartBody, StartRequest, ()),
    (m.CancelBody, CancelRequest, ("execution_id",)),
    (m.EventBody, EventRequest, ()),
    (m.MigrateBody, MigrateRequest, ("execution_id",)),
    (m.ForkBody, ForkRequest, ("execution_id",)),
    (m.BulkBody, BulkRequest, ()),
]


@pytest.mark.parametrize(("body", "request_type", "in_path"), BODIES,
                         ids=[b.__name__ for b, _, _ in BODIES])
def test_each_body_has_its_requests_fields_defaults_and_descriptions(
        body: type[BaseModel], request_type: type, in_path: tuple[str, ...]) -> None:
    wanted = [f for f in fields(request_type) if f.name not in in_path]
    assert list(body.model_fields) == [f.name for f in wanted]
    for f in wanted:
        field = body.model_fields[f.name]
        assert field.description == doc(request_type, f.name) != "", f.name
        if f.default is MISSING:
            assert field.is_required(), f.name
        else:
            assert field.default == f.default, f.name
    schema = body.model_json_schema()
    assert schema["additionalProperties"] is False
    assert {p: s["description"] for p, s in schema["properties"].items()} == {
        f.name: doc(request_type, f.name) for f in wanted}


def test_a_body_that_misses_or_adds_a_field_fails_when_it_is_made() -> None:
    @dataclass(frozen=True)
    class Two:
        a: Annotated[str, Doc("A")]
        b: Annotated[int, Doc("B")] = 3

    made = m.request_body(Two, a=Annotated[str, Field(max_length=5)], b=int)
    assert made(a="x").b == 3 and made.model_fields["a"].description == "A"
    with pytest.raises(TypeError, match=r"no HTTP type for \['b'\]"):
        m.request_body(Two, a=str)
    with pytest.raises(TypeError, match=r"not a field of the request: \['c'\]"):
        m.request_body(Two, a=str, b=int, c=int)
    assert list(m.request_body(Two, path=("a",), b=int).model_fields) == ["b"]
