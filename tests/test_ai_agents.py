"""Durable Pydantic AI agents (``konduit.contrib.pydantic_ai``, docs/ai-agents.md), offline on
Pydantic AI's test models: a step that runs an agent and fails after it (or in the middle of
it) runs again without asking the model again or calling a finished tool again. The worker-kill
case is in tests/test_journal_processes.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

import konduit
from tests.support.workers import running_worker

pydantic_ai = pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, ModelRetry  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402

from konduit.contrib.pydantic_ai import KonduitAgent  # noqa: E402

pytestmark = [pytest.mark.storage]

RETRY = konduit.Retry(max_attempts=3, backoff="fixed", base="50ms")


class Counting(WrapperModel):
    """A model that counts the requests that reach it."""

    def __init__(self, wrapped: Any, counts: Counter[str]):
        super().__init__(wrapped)
        self.counts = counts

    async def request(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.counts["requests"] += 1
        return await super().request(*args, **kwargs)

    @asynccontextmanager
    async def request_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.counts["streams"] += 1
        async with super().request_stream(*args, **kwargs) as stream:
            yield stream


def test_a_test_model_run_replayed_after_a_failed_attempt_asks_the_model_nothing_again(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    agent = Agent(Counting(TestModel(), counts), name="helper")

    @agent.tool_plain
    def weather(city: str) -> str:
        counts["weather"] += 1
        return f"sunny in {city}"

    @agent.tool_plain
    def population(city: str) -> int:
        counts["population"] += 1
        return 1000

    durable = KonduitAgent(agent)
    outputs: list[str] = []
    wf = konduit.Workflow("agent-test-model", version=1)

    @wf.step(retry=RETRY)
    async def ask(ctx: konduit.Context) -> str:
        result = await durable.run("weather and population?", ctx=ctx)
        outputs.append(result.output)
        if ctx.attempt == 1:
            raise RuntimeError("the step dies after its agent's run")
        return str(result.output)

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("agent-test-model", input={})
        result = handle.wait(timeout=60)
    assert result.status == "succeeded"
    assert outputs[0] == outputs[1]  # the replayed run ends as the live one did
    assert counts == Counter({"requests": 2, "weather": 1, "population": 1}), counts
    journal = app.journal(handle.id)
    assert sorted(e.name for e in journal) == sorted([
        "helper:model-request", "helper:model-request", "helper:tool:population",
        "helper:tool:weather"])
    assert {e.replays for e in journal} == {1} and {e.attempt for e in journal} == {1}


def test_a_tool_s_model_retry_is_recorded_and_replayed(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        counts["requests"] += 1
        # The tool's ModelRetry reaches the model as a part of the next request.
        retried = any("unknown code" in repr(p) for m in messages
                      if isinstance(m, ModelRequest) for p in m.parts)
        answered = sum(isinstance(m, ModelResponse) for m in messages)
        if answered == 0:
            return ModelResponse(parts=[ToolCallPart("lookup", {"code": "x"})])
        if answered == 1:
            assert retried
            return ModelResponse(parts=[ToolCallPart("lookup", {"code": "ok"})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="picky")

    @agent.tool_plain
    def lookup(code: str) -> str:
        counts[f"lookup-{code}"] += 1
        if code != "ok":
            raise ModelRetry("unknown code, try 'ok'")
        return "found"

    durable = KonduitAgent(agent)
    wf = konduit.Workflow("agent-model-retry", version=1)

    @wf.step(retry=RETRY)
    async def ask(ctx: konduit.Context) -> str:
        result = await durable.run("go", ctx=ctx)
        if ctx.attempt == 1:
            raise RuntimeError("dies after the run")
        return str(result.output)

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("agent-model-retry", input={})
        assert handle.wait(timeout=60).output == "done"
    # The refused lookup ran once: its ModelRetry was replayed from the journal, not re-raised
    # by calling the tool again.
    assert counts == Counter({"requests": 3, "lookup-x": 1, "lookup-ok": 1}), counts
    assert [e.name for e in app.journal(handle.id)] == [
        "picky:model-request", "picky:tool:lookup", "picky:model-request", "picky:tool:lookup",
        "picky:model-request"]


def test_run_sync_in_a_sync_handler_is_journaled_too(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    agent = Agent(Counting(TestModel(custom_output_text="fine"), counts), name="syncer")
    durable = KonduitAgent(agent)
    wf = konduit.Workflow("agent-sync", version=1)

    @wf.step(retry=RETRY)
    def ask(ctx: konduit.Context) -> str:
        output = durable.run_sync("hello", ctx=ctx).output
        if ctx.attempt == 1:
            raise RuntimeError("dies after the run")
        return str(output)

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("agent-sync", input={})
        assert handle.wait(timeout=60).output == "fine"
    assert counts == Counter({"requests": 1})
    assert [(e.name, e.replays) for e in app.journal(handle.id)] == [("syncer:model-request", 1)]


def test_run_needs_the_step_s_context() -> None:
    durable = KonduitAgent(Agent(TestModel()))
    with pytest.raises(TypeError, match=r"konduit\.Context"):
        durable.run_sync("hi", ctx=object())  # type: ignore[arg-type]


def test_a_streamed_run_is_journaled_whole_and_replayed(
        make_app: Callable[..., konduit.App]) -> None:
    counts: Counter[str] = Counter()
    events: Counter[int] = Counter()
    agent = Agent(Counting(TestModel(custom_output_text="streamed answer"), counts),
                  name="streamer")
    durable = KonduitAgent(agent)
    wf = konduit.Workflow("agent-stream", version=1)

    @wf.step(retry=RETRY)
    async def ask(ctx: konduit.Context) -> str:
        async def handler(run_ctx: Any, stream: Any) -> None:
            async for _ in stream:
                events[ctx.attempt] += 1

        result = await durable.run("hello", ctx=ctx, event_stream_handler=handler)
        if ctx.attempt == 1:
            raise RuntimeError("dies after the run")
        return str(result.output)

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("agent-stream", input={})
        assert handle.wait(timeout=60).output == "streamed answer"
    # The streamed request reached the model once; both attempts saw its events.
    assert counts == Counter({"streams": 1}), counts
    assert events[1] > 0 and events[1] == events[2], events
    assert [(e.name, e.replays) for e in app.journal(handle.id)] == [
        ("streamer:model-request", 1)]
