"""User code that raises ``KeyboardInterrupt`` (and its kin) at every place the engine runs it,
for tests/test_user_code_interrupts.py: in the test process (an App) and in real worker
processes (``konduit worker tests.apps.interrupts_app:app``; ``:ticking`` adds a schedule whose
``fair_by`` raises at every tick).

Each piece of code raises only for an input (or payload) that asks for it (``{"boom": true}``),
so the same workflows also show that the process serves the next start, event or task."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, field_validator, model_validator

import konduit


def interrupting(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("boom"))


def fair_customer(value: Any) -> str:
    if interrupting(value):
        raise KeyboardInterrupt("fair_by gave up")
    return str(value.get("who", "anyone")) if isinstance(value, dict) else "anyone"


fair = konduit.Workflow("ki-fair", version=1, fair_by=fair_customer)


@fair.step()
def fair_step(ctx: konduit.Context) -> str:
    return "fair"


fair.on_event("ki.fair")  # an event whose payload asks for it interrupts fair_by


def limit_key(ctx: konduit.KeyContext) -> str:
    if interrupting(ctx.input):
        raise KeyboardInterrupt("the limit key gave up")
    return "k"


limited = konduit.Workflow("ki-limit", version=1)


@limited.step(concurrency=konduit.Limit(2, key=limit_key))
def limited_step(ctx: konduit.Context) -> str:
    return "limited"


def running_key(value: Any) -> str:
    if interrupting(value):
        raise SystemExit("the max_running key gave up")
    return "k"


capped = konduit.Workflow("ki-capped", version=1, max_running=2, key=running_key)


@capped.step()
def capped_step(ctx: konduit.Context) -> str:
    return "capped"


class Order(BaseModel):
    """An input model whose validator interrupts for ``boom``."""

    boom: bool = False
    who: str = "anyone"

    @field_validator("boom")
    @classmethod
    def no_boom(cls, value: bool) -> bool:
        if value:
            raise KeyboardInterrupt("the input model's validator gave up")
        return value


def order_key(ctx: konduit.KeyContext) -> str:
    return str(ctx.input.who)


typed = konduit.Workflow("ki-typed", version=1, input=Order)


@typed.step()
def typed_step(ctx: konduit.Context) -> Any:
    return ctx.input if isinstance(ctx.input, dict) else ctx.input.model_dump()


typed_keyed = konduit.Workflow("ki-typed-keyed", version=1, input=Order)


@typed_keyed.step(concurrency=konduit.Limit(2, key=order_key))
def typed_keyed_step(ctx: konduit.Context) -> str:
    return "typed"


class Checked(BaseModel):
    """An output model whose validator interrupts for ``boom``."""

    boom: bool = False

    @model_validator(mode="after")
    def no_boom(self) -> Checked:
        if self.boom:
            raise KeyboardInterrupt("the output model's validator gave up")
        return self


checked = konduit.Workflow("ki-output", version=1)


@checked.step(output=Checked)
def checked_step(ctx: konduit.Context) -> dict[str, bool]:
    return {"boom": interrupting(ctx.input)}


handled = konduit.Workflow("ki-handler", version=1)


@handled.step(retry=konduit.Retry(max_attempts=1))
def handler_step(ctx: konduit.Context) -> str:
    if interrupting(ctx.input):
        raise KeyboardInterrupt("the handler gave up")
    return "handled"


def interrupting_fallback(ctx: konduit.Context) -> str:
    raise KeyboardInterrupt("the fallback gave up")


fell = konduit.Workflow("ki-fallback", version=1)


@fell.step(deadline="300ms", fallback=interrupting_fallback)
async def fell_step(ctx: konduit.Context) -> str:
    import asyncio

    await asyncio.sleep(30)
    return "late"


def items(source: Any) -> list[int]:
    if interrupting(source):
        raise KeyboardInterrupt("over() gave up")
    return [1, 2, 3]


mapped = konduit.Workflow("ki-map", version=1)


@mapped.step()
def source(ctx: konduit.Context) -> Any:
    return ctx.input


@mapped.map(after=[source], over=items)
def double(ctx: konduit.Context) -> int:
    return int(ctx.item) * 2


def event_input(payload: Any) -> Any:
    if interrupting(payload):
        raise KeyboardInterrupt("the trigger's input= gave up")
    return payload


def event_key(payload: Any) -> str:
    if isinstance(payload, dict) and payload.get("key_boom"):
        raise KeyboardInterrupt("the trigger's key= gave up")
    return str(payload.get("id", "0")) if isinstance(payload, dict) else "0"


triggered = konduit.Workflow("ki-event", version=1)


@triggered.step()
def triggered_step(ctx: konduit.Context) -> Any:
    return ctx.input


triggered.on_event("ki.event", input=event_input, key=event_key)

def wait_key(ctx: konduit.Context) -> str:
    if interrupting(ctx.input):
        raise KeyboardInterrupt("the wait's key= gave up")
    return "k"


waiting = konduit.Workflow("ki-wait", version=1)
waiting.wait_for_event("ki.wake", name="wake", key=wait_key, retry=konduit.Retry(max_attempts=1))


def wake_at(ctx: konduit.Context) -> Any:
    raise KeyboardInterrupt("the timer's until= gave up")


timer = konduit.Workflow("ki-timer", version=1)
timer.sleep(name="nap", until=wake_at)

WORKFLOWS = [fair, limited, capped, typed, typed_keyed, checked, handled, fell, mapped,
             triggered, waiting, timer]

app = konduit.App(WORKFLOWS)

ticked = konduit.Workflow("ki-tick", version=1, fair_by=fair_customer)


@ticked.step()
def tick_step(ctx: konduit.Context) -> str:
    return "ticked"


ticked.schedule(every="1s", name="ki-tick", input={"boom": True})

ticking = konduit.App([*WORKFLOWS, ticked])
