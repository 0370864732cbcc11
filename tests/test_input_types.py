"""``Workflow(input=...)``: the checker every start uses, on the schemas Pydantic writes (no
database: tests/test_client_by_name.py starts through App, Client and API)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

import konduit
from konduit.core.inputs import MAX_ERRORS, InputType


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false
    city: str
    zip: str = Field(min_length=4, max_length=5)


class Customer(BaseModel):
    name: str
    tier: Literal["free", "pro"]  # enum
    score: float = Field(ge=0, le=1)
    address: Address | None = None  # anyOf [$ref, null]
    tags: list[str] = []


def errors_of(declared: object, value: object) -> dict[str, str]:
    with pytest.raises(konduit.InputValidationError) as bad:
        InputType(declared, workflow="w").check(value)
    assert bad.value.workflow == "w"
    return bad.value.errors


def test_the_subset_pydantic_writes() -> None:
    good = {"name": "a", "tier": "pro", "score": 0.5, "address": {"city": "x", "zip": "1234"}}
    assert InputType(Customer, workflow="w").check(good) == good
    assert InputType(Customer, workflow="w").check(Customer.model_validate(good)) == {
        **good, "tags": []}  # a model instance is stored as its JSON
    errors = errors_of(Customer, {"tier": "gold", "score": 2, "tags": ["a", 3],
                                  "address": {"city": "x", "zip": "1", "street": "y"}})
    assert errors == {
        "name": "field required",
        "tier": "'gold' is not one of ['free', 'pro']",
        "score": "2 is greater than the maximum of 1",
        "tags.1": "3 is not of type 'string'",
        "address": errors["address"],  # anyOf: neither the model nor null
    }
    assert "is not valid under any of the given schemas" in errors["address"]
    assert errors_of(Address, {"city": "x", "zip": "12", "street": "y"}) == {
        "street": "unexpected field", "zip": "'12' is too short"}
    assert errors_of(Customer, None) == {"(root)": "None is not of type 'object'"}


def test_a_hostile_input_is_refused_fast_with_bounded_errors() -> None:
    errors = errors_of({"type": "array", "items": {"type": "integer"}}, ["x"] * 200_000)
    assert len(errors) == MAX_ERRORS
    assert list(errors)[:3] == ["0", "1", "2"]  # in item order, not text order


def test_a_bad_declaration_is_a_definition_error() -> None:
    with pytest.raises(konduit.WorkflowDefinitionError, match="input= must be a Pydantic model"):
        konduit.Workflow("w", input=int)
    with pytest.raises(konduit.WorkflowDefinitionError, match="not a valid JSON Schema"):
        konduit.Workflow("w", input={"type": "no-such-type"})


def test_ctx_input_is_the_model_and_the_schema_is_not_in_the_hash() -> None:
    typed = konduit.Workflow("w", input=Customer)
    plain = konduit.Workflow("w")
    for wf in (typed, plain):
        wf.step(name="s")(lambda ctx: None)
    assert typed.spec.spec_hash == plain.spec.spec_hash  # input= is policy, not shape
    value = {"name": "a", "tier": "free", "score": 0}
    assert isinstance(typed.spec.handler_input(value), Customer)
    assert plain.spec.handler_input(value) is value
    assert typed.spec.input_schema == Customer.model_json_schema()
    assert plain.spec.input_schema is None


def test_a_schedules_input_is_checked_when_it_is_defined() -> None:
    wf = konduit.Workflow("w", input=Customer)
    with pytest.raises(konduit.WorkflowDefinitionError, match=r"schedule input: .*score"):
        wf.schedule(every="1h", input={"name": "a", "tier": "free", "score": 9})
    wf.schedule(every="1h", input=Customer(name="a", tier="free", score=1))  # stored as JSON
    assert wf.schedules[0].input == {"name": "a", "tier": "free", "score": 1.0, "address": None,
                                     "tags": []}
