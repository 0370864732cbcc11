"""Events that start work: ``wf.on_event(...)`` declarations (docs/events.md).

A trigger says "start this workflow when event *name* arrives", either once per event, once per
burst (``debounce``: the burst's last event, once the events stopped for that long) or once per
batch (``batch=Batch(max, window)``: the events gathered as a list). Its ``input=`` and ``key=``
are user code: they run where the workflow's code is (the sender's process when it has it, else
a worker), never in a process that only knows the definition from the database. What the
database keeps of a trigger is :meth:`EventTrigger.to_spec`: which mode, whether it maps the
input and computes a key, and its timings.

Everything here is pure: the engine side is :mod:`konduit.engine.triggers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from konduit.core.durations import Duration, format_duration, parse_duration
from konduit.core.fair import function_name
from konduit.core.waits import check_event_name, payload_schema
from konduit.errors import KonduitError, WorkflowDefinitionError

MAX_BATCH = 10_000
"""The most events one batch may gather (its input is one JSON list of them)."""

MAX_GROUP_KEY_CHARS = 500
"""The longest key a trigger's ``key=`` may return."""


@dataclass(frozen=True)
class Batch:
    """Gather the events of a trigger into one execution whose input is their list (each
    event's payload, or what ``input=`` made of it, in the order they arrived): it starts when
    ``max`` events are gathered or ``window`` (``"2s"``, seconds) has passed since the first,
    whichever comes first. With ``key=`` each key gathers its own batches.

    >>> Batch(max=100, window="2s").window_seconds
    2.0
    """

    max: int = 100
    window: Duration = "1s"

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) \
                or not 1 <= self.max <= MAX_BATCH:
            raise KonduitError(f"Batch(max=...) must be an integer from 1 to {MAX_BATCH}, "
                               f"got {self.max!r}")
        if self.window_seconds <= 0:
            raise KonduitError(f"Batch(window=...) must be a positive duration, got {self.window!r}")

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window, what="Batch(window=...)")


MODES = ("start", "debounce", "batch")


@dataclass(frozen=True)
class EventTrigger:
    """One ``wf.on_event`` declaration of a workflow version."""

    workflow: str
    version: int
    event: str
    input: Callable[[Any], Any] | None = None
    key: Callable[[Any], Any] | None = None
    debounce_seconds: float | None = None
    batch: Batch | None = None
    payload: dict[str, Any] | None = None
    """The JSON Schema of the declared payload (``payload=``), or None: any JSON."""

    @property
    def mode(self) -> str:
        """``start`` (one execution per event), ``debounce`` or ``batch``."""
        if self.debounce_seconds is not None:
            return "debounce"
        return "batch" if self.batch is not None else "start"

    @property
    def needs_code(self) -> bool:
        """Whether applying it runs user code (``input=`` or ``key=``)."""
        return self.input is not None or self.key is not None

    def to_spec(self) -> dict[str, Any]:
        """What the database keeps of it (``konduit_event_triggers.spec``)."""
        spec = {
            "mode": self.mode,
            "input": self.input is not None,
            "keyed": self.key is not None,
            "debounce_seconds": self.debounce_seconds,
            "batch_max": None if self.batch is None else self.batch.max,
            "batch_window_seconds": None if self.batch is None else self.batch.window_seconds,
        }
        if self.payload is not None:  # only when declared: stored specs stay as they were
            spec["payload"] = self.payload
        return spec


def define(workflow: str, version: int, event: str, *, input: Callable[[Any], Any] | None,
           key: Callable[[Any], Any] | None, debounce: Duration | None,
           batch: Batch | None, payload: Any = None) -> EventTrigger:
    """A checked :class:`EventTrigger`; faults raise :class:`WorkflowDefinitionError` naming
    the workflow and the event."""

    def refuse(message: str) -> WorkflowDefinitionError:
        return WorkflowDefinitionError(f"on_event({event!r}): {message}", workflow=workflow)

    try:
        check_event_name(event)
    except KonduitError as exc:
        raise WorkflowDefinitionError(str(exc), workflow=workflow) from exc
    if input is not None and not callable(input):
        raise refuse(f"input= must be callable (payload -> execution input), got {input!r}")
    if key is not None and not callable(key):
        raise refuse(f"key= must be callable (payload -> text), got {key!r}")
    seconds = None
    if debounce is not None:
        try:
            seconds = parse_duration(debounce, what="debounce")
        except KonduitError as exc:
            raise refuse(str(exc)) from exc
        if seconds <= 0:
            raise refuse(f"debounce must be a positive duration, got {debounce!r}")
    if batch is not None and not isinstance(batch, Batch):
        raise refuse(f"batch= takes konduit.Batch(max=..., window=...), got {batch!r}")
    if seconds is not None and batch is not None:
        raise refuse("debounce= and batch= exclude each other: choose one")
    schema = None if payload is None else payload_schema(
        payload, workflow=workflow, what=f"on_event({event!r})")
    return EventTrigger(workflow, version, event, input=input, key=key,
                        debounce_seconds=seconds, batch=batch, payload=schema)


class TriggerCodeFailed(KonduitError):
    """A trigger's ``input=`` or ``key=`` raised, or returned what cannot be used."""


def apply_code(trigger: EventTrigger, payload: Any, sent_key: str | None) -> tuple[Any, str | None]:
    """The execution input and the key of one event: ``input(payload)`` (else the payload) and
    ``key(payload)`` (else the key it was sent with). User code raising anything, BaseException
    included, raises :class:`TriggerCodeFailed` naming the workflow, the event and the callable."""
    where = f"on_event({trigger.event!r}) of workflow {trigger.workflow!r}"
    mapped = payload
    if trigger.input is not None:
        try:
            mapped = trigger.input(payload)
        except BaseException as exc:  # KeyboardInterrupt too: it fails this event only
            raise TriggerCodeFailed(f"{where}: input= raised {type(exc).__name__}: {exc} "
                                    f"(in the function {function_name(trigger.input)})") from exc
    key = sent_key
    if trigger.key is not None:
        try:
            computed = trigger.key(payload)
        except BaseException as exc:
            raise TriggerCodeFailed(f"{where}: key= raised {type(exc).__name__}: {exc} "
                                    f"(in the function {function_name(trigger.key)})") from exc
        if isinstance(computed, bool) or not isinstance(computed, str | int):
            raise TriggerCodeFailed(f"{where}: key= must return text or an integer, got "
                                    f"{type(computed).__name__}")
        key = str(computed)
    if key is not None and (not key or len(key) > MAX_GROUP_KEY_CHARS or "\x00" in key):
        raise TriggerCodeFailed(f"{where}: the key must be 1-{MAX_GROUP_KEY_CHARS} characters "
                                f"without NUL, got {key[:80]!r}")
    return mapped, key


def describe(spec: Mapping[str, Any]) -> str:
    """A stored trigger (:meth:`EventTrigger.to_spec`) in words, for pages and tables."""
    mode = spec.get("mode")
    if mode == "debounce":
        text = f"debounced {format_duration(float(spec['debounce_seconds']))}"
    elif mode == "batch":
        text = (f"batched (at most {spec['batch_max']} events, "
                f"window {format_duration(float(spec['batch_window_seconds']))})")
    else:
        text = "one execution per event"
    extras = [w for w, on in (("input mapped", spec.get("input")),
                              ("keyed", spec.get("keyed"))) if on]
    return text + (f"; {', '.join(extras)}" if extras else "")
