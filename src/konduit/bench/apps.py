"""The workflows ``konduit bench`` runs through real worker processes.

A worker is its own process (``python -m konduit.cli worker konduit.bench.apps:app``), so the
workflows it serves must be importable by name: they live here, in the package. ``app`` holds
the small ones; ``wide_app_{w}`` (e.g. ``wide_app_10000``) adds a ``w``-wide join, built only
when asked for (a 10,000-step workflow takes seconds to validate, which every other worker would
pay); ``soak_app_{s}`` serves the soak's workflow with ``App(retention=s seconds)``,
``soak_history_app_{s}_{h}`` with ``history_after=h seconds`` too.

Handlers are trivial on purpose: the benchmarks measure the engine, not the work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import konduit

#: Join widths of the ``bench-roots-{w}`` workflows in ``app``; ``wide_app_{w}`` adds one more.
WIDTHS = (10, 20, 500)
BACKLOG_BRANCHES = 7  # root -> 7 branches -> join: 9 tasks an execution
COLLIDE_WIDTHS = (8, 32)
LATENCY_BRANCHES = 4
SOAK_BRANCHES = 3
SOAK_ITEMS = 4  # root -> 3 branches -> join -> map of 4 items -> total: 10 tasks an execution


def _returning(value: int) -> Callable[[konduit.Context], Coroutine[Any, Any, int]]:
    """A fresh trivial handler (a function can back only one step)."""

    async def handler(ctx: konduit.Context) -> int:
        return value

    return handler


async def _count(ctx: konduit.Context) -> int:
    return len(ctx.upstream)


def roots_workflow(width: int) -> konduit.Workflow:
    """``width`` root branches, all ready at start, and one join: the shape of the headline
    comparison (executions x no-op branches + a join) and of a many-root start."""
    wf = konduit.Workflow(f"bench-roots-{width}", version=1)
    branches = [wf.step(name=f"b{i}")(_returning(1)) for i in range(width)]
    wf.step(name="join", after=branches)(_count)
    return wf


def chain_workflow(name: str, branches: int) -> konduit.Workflow:
    """root -> ``branches`` branches -> join: downstream work behind a root."""
    wf = konduit.Workflow(name, version=1)
    root = wf.step(name="root")(_returning(0))
    steps = [wf.step(name=f"b{i}", after=[root])(_returning(1)) for i in range(branches)]
    wf.step(name="join", after=steps)(_count)
    return wf


def _releasing() -> Callable[[konduit.Context], Coroutine[Any, Any, int]]:
    async def branch(ctx: konduit.Context) -> int:
        # Every branch of the trial sleeps until the same wall-clock instant, so their
        # completions reach the completer together and collide on the execution's join.
        await asyncio.sleep(max(0.0, float(ctx.input["release_at"]) - time.time()))
        return 1

    return branch


def collide_workflow(width: int) -> konduit.Workflow:
    """``width`` root branches that all finish at ``input["release_at"]`` (epoch seconds)."""
    wf = konduit.Workflow(f"bench-collide-{width}", version=1)
    branches = [wf.step(name=f"b{i}")(_releasing()) for i in range(width)]
    wf.step(name="join", after=branches)(_count)
    return wf


def one_workflow() -> konduit.Workflow:
    """A single step: what a start costs when the workflow is small."""
    wf = konduit.Workflow("bench-one", version=1)
    wf.step(name="only")(_returning(1))
    return wf


def small_workflows() -> list[konduit.Workflow]:
    return [one_workflow(), *(roots_workflow(w) for w in WIDTHS),
            chain_workflow("bench-backlog", BACKLOG_BRANCHES),
            chain_workflow("bench-latency", LATENCY_BRANCHES),
            *(collide_workflow(w) for w in COLLIDE_WIDTHS)]


app = konduit.App(small_workflows())


async def _input(ctx: konduit.Context) -> Any:
    return ctx.input


def fair_map_workflow() -> konduit.Workflow:
    """A seed, then one no-op task per item of ``range(input)``: the big map beside which a lone
    execution must still get its share (``konduit bench --only fair_share``)."""
    wf = konduit.Workflow("bench-fair-map", version=1)
    seed = wf.step(name="seed")(_input)
    wf.map(name="item", after=[seed], over=range, max_items=1_000_000)(_returning(1))
    return wf


def _customer(value: Any) -> str:
    return str(value["customer"])


def fair_key_workflow() -> konduit.Workflow:
    """One no-op step, fair by ``input["customer"]``: a customer's backlog beside which
    another customer's execution must still get its share (docs/fairness.md)."""
    wf = konduit.Workflow("bench-fair-key", version=1, fair_by=_customer)
    wf.step(name="only")(_returning(1))
    return wf


#: The small workflows, the big map and the keyed workflow (only the fair-share benchmark's
#: worker serves them).
fair_app = konduit.App([*small_workflows(), fair_map_workflow(), fair_key_workflow()])


def soak_workflow() -> konduit.Workflow:
    """root -> ``SOAK_BRANCHES`` branches -> join -> a map over ``range(SOAK_ITEMS)`` -> total:
    a static fan-out/fan-in and a run-time one in each execution (``konduit bench --only soak``)."""
    wf = konduit.Workflow("bench-soak", version=1)
    root = wf.step(name="root")(_returning(0))
    steps = [wf.step(name=f"b{i}", after=[root])(_returning(1)) for i in range(SOAK_BRANCHES)]
    join = wf.step(name="join", after=steps)(_returning(SOAK_ITEMS))

    async def item(ctx: konduit.Context) -> int:
        return int(ctx.item)

    wf.map(name="item", after=[join], over=range)(item)
    wf.step(name="total", after=["item"])(_count)
    return wf


def wide_workflows(width: int) -> list[konduit.Workflow]:
    """The small workflows, and ``bench-roots-{width}`` if it is not one of them."""
    return small_workflows() + ([] if width in WIDTHS else [roots_workflow(width)])


def __getattr__(name: str) -> Any:
    """``wide_app_{w}`` is built on first access (PEP 562), not at import."""
    prefix = "wide_app_"
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        wide = konduit.App(wide_workflows(int(name[len(prefix):])))
        globals()[name] = wide
        return wide
    prefix = "soak_app_"  # soak_app_120: bench-soak with App(retention=120 s)
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        soak = konduit.App([soak_workflow()], retention=int(name[len(prefix):]))
        globals()[name] = soak
        return soak
    prefix = "soak_history_app_"  # soak_history_app_120_60: retention=120 s, history_after=60 s
    retention, _, after = name[len(prefix):].partition("_")
    if name.startswith(prefix) and retention.isdigit() and after.isdigit():
        soak = konduit.App([soak_workflow()], retention=int(retention), history_after=int(after))
        globals()[name] = soak
        return soak
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def _all_items(ctx: konduit.Context) -> int:
    return len(ctx.upstream["item"])


def wide_map_workflow() -> konduit.Workflow:
    """seed -> one no-op task per item of ``range(input)`` -> a join that reads every item: the
    map at production width (``konduit bench --only wide_map`` / ``map_1m``)."""
    wf = konduit.Workflow("bench-wide-map", version=1)
    seed = wf.step(name="seed")(_input)
    item = wf.map(name="item", after=[seed], over=range, max_items=1_000_000)(_returning(1))
    wf.step(name="join", after=[item])(_all_items)
    return wf


#: The small workflows and the wide map with its join.
wide_map_app = konduit.App([*small_workflows(), wide_map_workflow()])
