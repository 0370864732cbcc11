"""Workflows with a declared input, started by name from processes without this module
(tests/test_client_by_name.py): a Pydantic model, a JSON Schema dict, and one that holds until
it is cancelled."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

import konduit


class Line(BaseModel):
    sku: str
    count: int = Field(ge=1)


class Order(BaseModel):
    customer: str
    quantity: int = Field(ge=1, le=1000)
    note: str | None = None
    lines: list[Line] = []


order = konduit.Workflow("typed-order", version=1, input=Order)


# concurrency=: a code-less start must mark the task limited as the App's start does.
@order.step(concurrency=4, deadline="60s")
def price(ctx: konduit.Context) -> dict[str, object]:
    # ctx.input is the model, not the stored dict: attribute access, nested models.
    assert isinstance(ctx.input, Order), type(ctx.input)
    return {"model": type(ctx.input).__name__, "customer": ctx.input.customer,
            "quantity": ctx.input.quantity, "skus": [line.sku for line in ctx.input.lines]}


@order.step(after=[price])
def confirm(ctx: konduit.Context) -> dict[str, object]:
    return {"confirmed": ctx.upstream["price"], "input": type(ctx.input).__name__}


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}, "tags": {"type": "array",
                                                                    "items": {"type": "string"}}},
    "required": ["n"],
    "additionalProperties": False,
}
counted = konduit.Workflow("typed-schema", version=1, input=SCHEMA)


@counted.step()
def echo(ctx: konduit.Context) -> object:
    return {"type": type(ctx.input).__name__, "input": ctx.input}  # a dict: no model to build


hold = konduit.Workflow("typed-hold", version=1)


@hold.step()
async def held(ctx: konduit.Context) -> str:
    for _ in range(1200):  # until cancelled (a lost lease sets ctx.cancelled), at most 2 min
        if ctx.cancelled:
            break
        await asyncio.sleep(0.1)
    return "released"


fan = konduit.Workflow("typed-map", version=1)


@fan.step()
def items(ctx: konduit.Context) -> list[int]:
    return [1, 2, 3]


@fan.map(after=[items], over=lambda out: out)
def double(ctx: konduit.Context) -> int:
    return int(ctx.item) * 2


WORKFLOWS = [order, counted, hold]
app = konduit.App(WORKFLOWS)
