"""Workflows for the journal's process tests (tests/test_journal_processes.py). Every call a
handler makes live records itself in the ``journal_calls`` table of the execution's database
(the input's ``dsn``): what ran, in which attempt and process, so the test counts how many
times each call really ran across worker processes.

- ``journal-thirty``: one sync step makes 30 durable calls (``ctx.call_sync``); its first
  attempt stops after call 17 and sleeps (the worker is SIGKILLed there).
- ``journal-agent``: one async step runs a Pydantic AI agent (``KonduitAgent``) on a
  ``FunctionModel`` that asks for a tool call per model request, ``rounds`` times, then
  answers; the first call of tool call number ``stall_at`` sleeps (the worker is killed in it).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import konduit
from konduit.contrib.pydantic_ai import KonduitAgent

thirty = konduit.Workflow("journal-thirty", version=1)
agent_wf = konduit.Workflow("journal-agent", version=1)

RUN: dict[str, Any] = {"dsn": "", "rounds": 6, "stall_at": 4}
"""The agent step's input, for the model function and the tool (one such step per worker)."""


def ran(dsn: str, kind: str, n: int, attempt: int) -> int:
    """Record that call ``kind`` number ``n`` ran live; how many times it ran so far."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO journal_calls (kind, n, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (kind, n, attempt, os.getpid()))
        row = conn.execute("SELECT count(*) FROM journal_calls WHERE kind = %s AND n = %s",
                           (kind, n)).fetchone()
    assert row is not None
    return int(row[0])


def _work(dsn: str, n: int, attempt: int) -> dict[str, int]:
    ran(dsn, "call", n, attempt)
    return {"n": n, "square": n * n}


@thirty.step(retry=konduit.Retry(max_attempts=5, backoff="fixed", base="0.1s"))
def calls(ctx: konduit.Context) -> int:
    total = 0
    for n in range(1, 31):
        total += ctx.call_sync(f"call-{n}", _work, ctx.input["dsn"], n, ctx.attempt)["square"]
        if n == ctx.input.get("stall_after") and ctx.attempt == 1:
            time.sleep(300)  # the worker running this is killed here
    return total


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(1 for m in messages if isinstance(m, ModelResponse))
    ran(RUN["dsn"], "model", done + 1, 0)
    if done < RUN["rounds"]:
        return ModelResponse(parts=[ToolCallPart("lookup", {"k": done + 1})])
    return ModelResponse(parts=[TextPart(f"answered after {done} lookups")])


agent = Agent(FunctionModel(_model), name="researcher")


@agent.tool_plain
def lookup(k: int) -> str:
    if ran(RUN["dsn"], "tool", k, 0) == 1 and k == RUN["stall_at"]:
        time.sleep(300)  # the first run of this tool call: the worker is killed in it
    return f"fact {k}"


durable = KonduitAgent(agent)


@agent_wf.step(retry=konduit.Retry(max_attempts=5, backoff="fixed", base="0.1s"))
async def research(ctx: konduit.Context) -> Any:
    RUN.update(dsn=ctx.input["dsn"], rounds=ctx.input["rounds"], stall_at=ctx.input["stall_at"])
    result = await durable.run("find the facts", ctx=ctx)
    return result.output


app = konduit.App(workflows=[thirty, agent_wf])
