"""Keys of per-key limits, computed when an execution starts (pure: no database).

``step(concurrency=Limit(2, key=f))`` and ``Workflow(max_running=N, key=g)`` name user
functions. They run once per start, in the starting process, before anything is written: a key
function that raises (anything, BaseException included) or returns a non-string refuses that
start with :class:`~konduit.errors.LimitKeyError`, naming the workflow, the step and the
function; nothing else fails with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from konduit.core.flow import KeyContext
from konduit.errors import LimitKeyError, WorkflowDefinitionError

MAX_KEY_CHARS = 200
"""A key's longest length: keys are stored on every task of their step and in its lock row."""


def check_max_running(max_running: object, key: object, *,
                      workflow: str) -> tuple[int | None, Callable[[Any], Any] | None]:
    """``Workflow(max_running=, key=)`` checked at definition time."""
    if max_running is None:
        if key is not None:
            raise WorkflowDefinitionError("key= needs max_running= (the running executions "
                                          "allowed per key)", workflow=workflow)
        return None, None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 1:
        raise WorkflowDefinitionError(
            f"max_running must be a positive integer, got {max_running!r}", workflow=workflow)
    if key is not None and not callable(key):
        raise WorkflowDefinitionError(f"key must be a function of the input, got {key!r}",
                                      workflow=workflow)
    return max_running, key


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _call(fn: Callable[[Any], Any], arg: Any, *, where: str) -> str:
    """``fn(arg)``, a string of at most MAX_KEY_CHARS, or LimitKeyError naming ``where``."""
    try:
        value = fn(arg)
    except BaseException as exc:  # user code: anything it raises refuses this start only
        raise LimitKeyError(f"{where}: the key function {_name(fn)} raised "
                            f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(value, str):
        raise LimitKeyError(f"{where}: the key function {_name(fn)} returned "
                            f"{type(value).__name__} {value!r}, not a string")
    if len(value) > MAX_KEY_CHARS:
        raise LimitKeyError(f"{where}: the key function {_name(fn)} returned a key of "
                            f"{len(value)} characters (at most {MAX_KEY_CHARS})")
    return value


def step_keys(workflow: str, flow_keys: dict[str, Callable[[KeyContext], str]],
              value: Any) -> dict[str, str] | None:
    """The key of each step with per-key limits for an execution whose input (as handlers see
    it) is ``value``; None when the workflow has none."""
    if not flow_keys:
        return None
    return {step: _call(fn, KeyContext(value, workflow, step),
                        where=f"workflow {workflow!r}, step {step!r}")
            for step, fn in flow_keys.items()}


def run_key(workflow: str, max_running: int | None, fn: Callable[[Any], Any] | None,
            value: Any) -> str | None:
    """The execution's key for ``max_running`` ('' when the workflow has no ``key=``), or None
    when the workflow has no ``max_running``."""
    if max_running is None:
        return None
    if fn is None:
        return ""
    return _call(fn, value, where=f"workflow {workflow!r}, max_running key")
