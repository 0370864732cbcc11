"""Durable Pydantic AI agents: every model request and tool call of an agent's run is a durable
call of the step that runs it (``ctx.call``, docs/journal.md), so a run that dies halfway (its
worker killed, its attempt failed) resumes on the next attempt without repeating a model request
or a tool call that finished. Needs the ``pydantic-ai`` extra
(``pip install 'konduit-pg[pydantic-ai]'``); see docs/ai-agents.md.

.. code-block:: python

    from pydantic_ai import Agent
    from konduit.contrib.pydantic_ai import KonduitAgent

    agent = Agent("openai:gpt-5", instructions="Answer with the weather of a city.")

    @agent.tool_plain
    def weather(city: str) -> str: ...

    durable = KonduitAgent(agent)

    @wf.step()
    async def answer(ctx):
        result = await durable.run(ctx.input["question"], ctx=ctx)
        return result.output

How it works: the run gets one more capability (Pydantic AI's per-run extension point) that
wraps the model serving each request and the run's toolset. A model request becomes
``ctx.call("<name>:model-request", ...)``, its :class:`~pydantic_ai.messages.ModelResponse`
recorded as JSON; a tool call becomes ``ctx.call("<name>:tool:<tool name>", ...)``, its result
recorded as JSON (a tool's :class:`~pydantic_ai.ModelRetry` is recorded too, and raised again on
a replay, so the conversation replays as it happened). A replay hands the agent the recorded
responses and results in order; the first request or tool call without a record runs live.

What must hold, as for any durable call: the run is deterministic given the recorded responses
and results (the same prompt, instructions and tools on each attempt). Tool calls the model asks
for in one response run concurrently and take their places in the journal in the order they
start. Output tools (the run's final result) are not journaled: they only validate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from konduit.core.context import Context
from konduit.extras import require

require("pydantic-ai", "konduit.contrib.pydantic_ai")

from pydantic_ai import ModelRetry  # noqa: E402
from pydantic_ai.agent import AbstractAgent  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse  # noqa: E402
from pydantic_ai.models import (  # noqa: E402
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402
from pydantic_ai.tools import RunContext  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402


def _dump_response(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _load_response(data: Any) -> ModelResponse:
    message = ModelMessagesTypeAdapter.validate_python([data])[0]
    assert isinstance(message, ModelResponse), type(message)
    return message


class JournaledModel(WrapperModel):
    """A model whose every request is a durable call of the step's context: the response is
    recorded before the agent sees it, and replayed on a later attempt."""

    def __init__(self, wrapped: Model, ctx: Context, prefix: str):
        super().__init__(wrapped)
        self._ctx = ctx
        self._name = f"{prefix}:model-request"

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        async def live() -> Any:
            response = await self.wrapped.request(messages, model_settings,
                                                  model_request_parameters)
            return _dump_response(response)

        return _load_response(await self._ctx.call(self._name, live))

    @asynccontextmanager
    async def request_stream(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # A streamed request is drained live and recorded whole; the agent gets its events
        # from the complete response (the same live and replayed).
        async def live() -> Any:
            async with self.wrapped.request_stream(messages, model_settings,
                                                   model_request_parameters,
                                                   run_context) as stream:
                async for _ in stream:
                    pass
            return _dump_response(stream.get())

        response = _load_response(await self._ctx.call(self._name, live))
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=True)


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """A toolset whose every tool call is a durable call of the step's context: its result (or
    the :class:`~pydantic_ai.ModelRetry` it raised) is recorded and replayed."""

    step_context: Context | None = field(default=None, repr=False)
    prefix: str = "agent"

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        assert self.step_context is not None

        async def live() -> Any:
            try:
                result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            except ModelRetry as exc:
                return {"model_retry": exc.message}
            return {"result": to_jsonable_python(result)}

        recorded = await self.step_context.call(f"{self.prefix}:tool:{name}", live)
        if "model_retry" in recorded:
            raise ModelRetry(recorded["model_retry"])
        return recorded["result"]


@dataclass
class Journaled(AbstractCapability[Any]):
    """The capability :class:`KonduitAgent` adds to each run: it wraps the model serving each
    request (:class:`JournaledModel`) and the run's toolset (:class:`JournaledToolset`)."""

    step_context: Context | None = field(default=None, repr=False)
    prefix: str = "agent"

    def get_wrapper_model(self, model: Model) -> Model | None:
        assert self.step_context is not None
        return JournaledModel(model, self.step_context, self.prefix)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return JournaledToolset(toolset, step_context=self.step_context, prefix=self.prefix)


class KonduitAgent:
    """A Pydantic AI agent whose runs are durable inside a Konduit step: ``await
    durable.run(prompt, ctx=ctx)`` runs ``agent.run(prompt, ...)`` with every model request and
    tool call journaled under the step's task (see the module's documentation). ``name`` (the
    agent's own name, else ``"agent"``) prefixes the journal's call names; give two agents run in
    one step different names. Other keyword arguments go to ``agent.run`` as they are."""

    def __init__(self, agent: AbstractAgent[Any, Any], *, name: str | None = None):
        self.agent = agent
        self.name = name or agent.name or "agent"

    def _capabilities(self, ctx: Context, extra: Sequence[Any] | None) -> list[Any]:
        if not isinstance(ctx, Context):
            raise TypeError(f"KonduitAgent.run: ctx= must be the step's konduit.Context, "
                            f"not {type(ctx).__name__}")
        return [Journaled(step_context=ctx, prefix=self.name), *(extra or ())]

    async def run(self, user_prompt: Any = None, *, ctx: Context, **kwargs: Any) -> Any:
        """Run the agent inside an async step's handler, durably; returns what ``agent.run``
        returns (its ``output``, ``all_messages()``...)."""
        capabilities = self._capabilities(ctx, kwargs.pop("capabilities", None))
        return await self.agent.run(user_prompt, capabilities=capabilities, **kwargs)

    def run_sync(self, user_prompt: Any = None, *, ctx: Context, **kwargs: Any) -> Any:
        """Run the agent inside a sync step's handler, durably (``agent.run_sync``: the run has
        an event loop of its own on the handler's thread; its journal is the step's)."""
        capabilities = self._capabilities(ctx, kwargs.pop("capabilities", None))
        return self.agent.run_sync(user_prompt, capabilities=capabilities, **kwargs)


__all__ = ["Journaled", "JournaledModel", "JournaledToolset", "KonduitAgent"]
