"""Keys of per-key limits, computed when an execution starts (pure: no database).

``step(concurrency=Limit(2, key=f))`` and ``Workflow(max_running=N, key=g)`` name user
functions. They run once per start, in the starting process, before anything is written: a key
function that raises (anything, BaseException included) or returns a non-string refuses that
start with :class:`~konduit.errors.LimitKeyError`, naming the workflow, the step and the
function; nothing else fails with it. A key declared as a path (``key="input.customer"``,
:mod:`konduit.core.key_paths`) is read from the input as stored instead, the same from every
door; a function known by name only (a start without the code) refuses the start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from konduit.core.flow import KeyContext
from konduit.core.key_paths import KeyPath, key_of
from konduit.errors import LimitKeyError, WorkflowDefinitionError

AnyKey = Callable[..., Any] | KeyPath

MAX_KEY_CHARS = 200
"""A key's longest length: keys are stored on every task of their step and in its lock row."""


def check_max_running(max_running: object, key: object, *,
                      workflow: str) -> tuple[int | None, AnyKey | None]:
    """``Workflow(max_running=, key=)`` checked at definition time."""
    if max_running is None:
        if key is not None:
            raise WorkflowDefinitionError("key= needs max_running= (the running executions "
                                          "allowed per key)", workflow=workflow)
        return None, None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 1:
        raise WorkflowDefinitionError(
            f"max_running must be a positive integer, got {max_running!r}", workflow=workflow)
    try:
        return max_running, key_of(key, what="key")
    except ValueError as exc:
        raise WorkflowDefinitionError(str(exc), workflow=workflow) from None


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _call(fn: Callable[[Any], Any], arg: Any, *, where: str) -> str:
    """``fn(arg)``, a string of at most MAX_KEY_CHARS, or LimitKeyError naming ``where``."""
    try:
        value = fn(arg)
    except LimitKeyError:  # a stand-in's refusal (KeyNeedsCode) says what it means itself
        raise
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


def step_keys(workflow: str, flow_keys: dict[str, AnyKey], stored: Any,
              value: Callable[[], Any]) -> dict[str, str] | None:
    """The key of each step with per-key limits for an execution whose input as stored is
    ``stored`` (what a key path reads) and as handlers see it ``value()`` (what a key function
    gets, made only when one needs it); None when the workflow has none."""
    if not flow_keys:
        return None
    out: dict[str, str] = {}
    for step, fn in flow_keys.items():
        where = f"workflow {workflow!r}, step {step!r}"
        out[step] = (_checked(fn.of(stored, where=where), where=where, fn=fn)
                     if isinstance(fn, KeyPath)
                     else _call(fn, KeyContext(value(), workflow, step), where=where))
    return out


def run_key(workflow: str, max_running: int | None, fn: AnyKey | None, stored: Any,
            value: Callable[[], Any]) -> str | None:
    """The execution's key for ``max_running`` ('' when the workflow has no ``key=``), or None
    when the workflow has no ``max_running``."""
    if max_running is None:
        return None
    if fn is None:
        return ""
    where = f"workflow {workflow!r}, max_running key"
    if isinstance(fn, KeyPath):
        return _checked(fn.of(stored, where=where), where=where, fn=fn)
    return _call(fn, value(), where=where)


def _checked(value: str, *, where: str, fn: KeyPath) -> str:
    if len(value) > MAX_KEY_CHARS:
        raise LimitKeyError(f"{where}: the key path {fn.path!r} found a key of {len(value)} "
                            f"characters (at most {MAX_KEY_CHARS})")
    return value
