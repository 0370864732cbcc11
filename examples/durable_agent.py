"""A durable AI agent: a Pydantic AI agent whose model requests and tool calls survive a crash.

The ``research`` step runs an agent that looks up three topics with a tool, one model request
at a time, then writes its answer. ``KonduitAgent`` journals every model request and every tool
call under the step's task: the first attempt crashes in its second lookup (the search service
"hangs up"), and the retry replays the first model requests and lookup from the journal instead
of paying for them again, then goes on live. The script counts how often the model was really
asked: once per request, whatever the crash.

It runs offline: the model is Pydantic AI's ``FunctionModel`` (a Python function that plays the
model; swap in ``"openai:gpt-5"`` or any other model for the real thing). Needs the
``pydantic-ai`` extra: ``pip install 'konduit-pg[pydantic-ai]'``.

Run it: ``python examples/durable_agent.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
"""

from __future__ import annotations

from collections import Counter

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import konduit
import konduit.testing
from konduit.contrib.pydantic_ai import KonduitAgent
from konduit.databases import EXAMPLES_DATABASE, own_database

TOPICS = ["tides", "moon phases", "spring tides"]
asked: Counter[int] = Counter()  # model request number -> times the "model" was really asked
searched: Counter[str] = Counter()  # topic -> times the search service was really called


def play_the_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: one lookup per request, then the answer (what an LLM would decide)."""
    done = sum(isinstance(m, ModelResponse) for m in messages)
    asked[done + 1] += 1
    if done < len(TOPICS):
        return ModelResponse(parts=[ToolCallPart("search", {"topic": TOPICS[done]})])
    return ModelResponse(parts=[TextPart(f"Researched {len(TOPICS)} topics: "
                                         + "; ".join(TOPICS) + ".")])


agent = Agent(FunctionModel(play_the_model), name="researcher",
              instructions="Look up each topic, then answer.")


@agent.tool_plain
def search(topic: str) -> str:
    """Search the (pretend) knowledge base."""
    searched[topic] += 1
    if topic == "moon phases" and searched[topic] == 1:
        raise ConnectionError("the search service hung up")  # the first attempt crashes here
    return f"{topic}: found 3 sources"


durable = KonduitAgent(agent)
wf = konduit.Workflow("example-durable-agent", version=1)


@wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="200ms"))
async def research(ctx: konduit.Context) -> str:
    result = await durable.run(ctx.input["question"], ctx=ctx)
    return str(result.output)


# The examples' own database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([wf], database_url=own_database(EXAMPLES_DATABASE))


def main() -> None:
    with konduit.testing.worker_thread(app, concurrency=2):
        handle = app.start("example-durable-agent", input={"question": "Why are tides high?"})
        result = handle.wait(timeout=60)
    print(result.output)
    [task] = app.tasks(handle.id)
    print(f"the step took {task.attempt} attempts; the journal of its calls:")
    for call in app.journal(handle.id):
        how = f"replayed {call.replays}x" if call.replays else "not replayed"
        print(f"  {call.seq}. {call.name:<30} live in attempt {call.attempt}, {how}")
    print(f"model requests made: {dict(asked)}; searches made: {dict(searched)}")
    assert task.attempt == 2
    assert asked == Counter({1: 1, 2: 1, 3: 1, 4: 1}), asked  # each request once, crash or not
    assert searched == Counter({"tides": 1, "moon phases": 2, "spring tides": 1}), searched
    app.close()


if __name__ == "__main__":
    main()
