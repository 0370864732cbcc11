"""Durable waits: event, timer and child-workflow steps (docs/durable-waits.md).

A wait step runs no user handler of its own. Its task is created ready like any other; a worker
claims it and runs the *arming attempt*: the step's lambdas (``key=``, ``until=``, ``input=``,
user code that may read ``ctx.upstream``) run there, under the usual hostile-code rules (a raising
lambda fails that attempt, never the worker), and return an :class:`Armed`. Recording it moves
the task running -> ``waiting`` instead of to a terminal status; from then on it holds no worker
slot, and the engine ends it: the event's arrival, the timer's firing or the child's end wakes
it (``succeeded``), its deadline expires it (``degraded`` with the fallback, else ``timed_out``).

This module is the pure part: the step builders, the arming handlers and the matching rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from konduit.core.durations import Duration, parse_duration
from konduit.core.model import WaitKind
from konduit.errors import KonduitError, NonRetryableError, WorkflowDefinitionError

if TYPE_CHECKING:
    from konduit.core.policies import Deadline, Retry

StepRef = str | Callable[..., Any]
"""A step named, or given by its handler (core.workflow, which imports this module, uses it)."""

WAIT_KINDS = tuple(WaitKind)
_EVENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$")
MAX_KEY_CHARS = 500


@dataclass(frozen=True)
class WaitSpec:
    """What a wait step waits for; part of the workflow's spec (and its hash)."""

    kind: WaitKind
    event: str | None = None
    key: Callable[[Any], Any] | None = None
    duration: float | None = None
    until: Callable[[Any], Any] | None = None
    workflow: str | None = None
    input: Callable[[Any], Any] | None = None
    retention: float | None = None  # events: how long one sent before the step waits is kept
    answer: dict[str, Any] | None = None  # wait_for_input: {"schema": ..., "who": ...}
    payload: dict[str, Any] | None = None  # wait_for_event(payload=...): the JSON Schema

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": self.kind}
        if self.kind == WaitKind.EVENT:
            spec.update(event=self.event, keyed=self.key is not None)
            if self.retention is not None:  # only when declared: older specs hash the same
                spec.update(retention=self.retention)
            if self.answer is not None:  # likewise: only a wait_for_input step has it
                spec.update(input=self.answer)
            if self.payload is not None:  # likewise: only when a payload model is declared
                spec.update(payload=self.payload)
        elif self.kind == WaitKind.TIMER:
            spec.update(duration=self.duration, until=self.until is not None)
        else:
            spec.update(workflow=self.workflow)
        return spec


@dataclass(frozen=True)
class Armed:
    """What the arming attempt computed: the engine stores it on the task and waits."""

    kind: WaitKind
    event: str | None = None
    key: str | None = None
    delay: float | None = None  # timers: seconds from the arming's record
    until: datetime | None = None  # timers: an absolute time (UTC)
    workflow: str | None = None
    input: Any = None

    def describe(self) -> str:
        if self.kind == WaitKind.EVENT:
            return f"event {self.event!r}" + (f" key {self.key!r}" if self.key is not None else "")
        if self.kind == WaitKind.TIMER:
            return f"timer until {self.until.isoformat()}" if self.until else \
                f"timer of {self.delay:g} s"
        return f"child workflow {self.workflow!r}"


def event_matches(event_name: str, event_key: str | None, event_execution: UUID | None,
                  task_event: str, task_key: str | None, task_execution: UUID) -> bool:
    """Whether an event (name, key, execution id) is the one a waiting task waits for: same
    name; the key, when the event names one, equal to the key the task computed (a task without
    a key= is reached by execution id only); the execution, when the event names one, the task's.
    An event names a key or an execution, or both. (task_find_waiting_for_event and
    event_find_pending_for_task say the same in SQL.)"""
    if event_key is None and event_execution is None:
        return False
    if event_name != task_event:
        return False
    if event_key is not None and event_key != task_key:
        return False
    return event_execution is None or event_execution == task_execution


INPUT_EVENT_PREFIX = "konduit-input:"
"""The event a ``wait_for_input`` step waits for is this prefix and the step's name; only
:meth:`konduit.App.answer` sends it (``send_event`` refuses the prefix)."""


def input_event(step: str) -> str:
    """The internal event name of the ``wait_for_input`` step ``step``."""
    return f"{INPUT_EVENT_PREFIX}{step}"


def is_input_event(name: str | None) -> bool:
    """Whether ``name`` is the internal event of a ``wait_for_input`` step."""
    return name is not None and name.startswith(INPUT_EVENT_PREFIX)


def payload_schema(declared: Any, *, workflow: str, what: str) -> dict[str, Any]:
    """The JSON Schema of a declared event payload (``payload=``: a Pydantic model class or a
    JSON Schema dict); a bad one raises :class:`WorkflowDefinitionError` naming ``what``."""
    from konduit.core.inputs import InputType  # pydantic and jsonschema, lazily

    try:
        return InputType(declared, workflow=workflow).schema
    except WorkflowDefinitionError as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise WorkflowDefinitionError(f"{what}: " + str(message).replace("input=", "payload="),
                                      workflow=workflow) from exc
    except KonduitError as exc:
        raise WorkflowDefinitionError(f"{what}: {exc}", workflow=workflow) from exc


def answer_of(step_spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored step spec's ``wait_for_input`` part (``{"schema": ..., "who": ...}``), or None
    when the step is no such wait."""
    if not isinstance(step_spec, dict):
        return None
    wait = step_spec.get("wait")
    if not isinstance(wait, dict) or wait.get("kind") != WaitKind.EVENT:
        return None
    answer = wait.get("input")
    return answer if isinstance(answer, dict) else None


CHILD_KEY_PREFIX = "konduit-child:"
_CHILD_KEY = re.compile(r"^konduit-child:([0-9]{1,18})$")


def child_idempotency_key(task_id: int) -> str:
    """A child execution's idempotency key: one child per parent task, whatever crashes."""
    return f"{CHILD_KEY_PREFIX}{task_id}"


def parent_task_of(idempotency_key: str | None) -> int | None:
    """The parent task an execution's idempotency key names, if it is a child's key. Read back
    from the row its finish updates, so telling a child from any other execution costs the
    finish no statement. A user key that merely looks like one names a task that does not wait
    for this execution: the wake that follows finds nothing and changes nothing."""
    if idempotency_key is None:
        return None
    found = _CHILD_KEY.match(idempotency_key)
    return int(found.group(1)) if found else None


def check_event_name(name: object, what: str = "event name") -> str:
    if not isinstance(name, str) or not _EVENT_NAME.match(name):
        raise KonduitError(f"invalid {what} {name!r}: 1-200 characters of letters, digits and "
                           "_ . : / - (starting with a letter or digit)")
    return name


DEFAULT_EVENT_RETENTION = 24 * 3600.0
"""Seconds a stored event is kept when neither its step's ``retention=`` nor the App's
``event_retention`` (or ``KONDUIT_EVENT_RETENTION``) says otherwise."""


def positive_duration(value: Duration, what: str) -> float:
    """A duration in seconds, longer than zero; else an error naming ``what``."""
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise KonduitError(f"{what}: must be longer than zero, got {value!r}")
    return seconds


def check_key(key: object) -> str:
    """Keys are strings (an int is accepted and turned into one); anything else is refused."""
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise NonRetryableError(f"the event key must be a string, got {type(key).__name__}")
    text = str(key)
    if not text or len(text) > MAX_KEY_CHARS or "\x00" in text:
        raise NonRetryableError(f"the event key must be 1-{MAX_KEY_CHARS} characters, "
                                "without NUL")
    return text


def _arm_event(spec: WaitSpec) -> Callable[[Any], Armed]:
    def arm(ctx: Any) -> Armed:
        key = None if spec.key is None else check_key(spec.key(ctx))
        return Armed(WaitKind.EVENT, event=spec.event, key=key)
    return arm


def _arm_timer(spec: WaitSpec) -> Callable[[Any], Armed]:
    def arm(ctx: Any) -> Armed:
        if spec.until is None:
            return Armed(WaitKind.TIMER, delay=spec.duration)
        when = spec.until(ctx)
        if not isinstance(when, datetime):
            raise NonRetryableError(f"until= must return a datetime, got {type(when).__name__}")
        if when.tzinfo is None:
            raise NonRetryableError("until= returned a naive datetime: give it a timezone "
                                    "(datetime.now(timezone.utc) + ...)")
        return Armed(WaitKind.TIMER, until=when.astimezone(UTC))
    return arm


def _arm_child(spec: WaitSpec) -> Callable[[Any], Armed]:
    def arm(ctx: Any) -> Armed:
        child_input = None if spec.input is None else spec.input(ctx)
        return Armed(WaitKind.CHILD, workflow=spec.workflow, input=child_input)
    return arm


class WaitSteps:
    """The wait-step builders of :class:`konduit.Workflow` (mixed in)."""

    name: str
    _add: Callable[..., str]

    def _add_wait(self, spec: WaitSpec, arm: Callable[[Any], Armed], *, name: str,
                  after: Sequence[StepRef], deadline: Deadline | Duration | None,
                  fallback: Callable[[Any], Any] | None, required: bool,
                  fallback_on_failure: bool, queue: str, retry: Retry | None) -> str:
        arm.__name__ = name
        arm.__qualname__ = name
        return self._add(arm, map_over=None, name=name, after=after, deadline=deadline,
                         fallback=fallback, required=required,
                         fallback_on_failure=fallback_on_failure, queue=queue, retry=retry,
                         wait=spec)

    def wait_for_event(
        self, event: str, *, name: str | None = None, after: Sequence[StepRef] = (),
        key: Callable[[Any], Any] | None = None, deadline: Deadline | Duration | None = None,
        fallback: Callable[[Any], Any] | None = None, required: bool = True,
        queue: str = "default", retry: Retry | None = None, retention: Duration | None = None,
        payload: Any = None,
    ) -> str:
        """A step that waits, holding no worker slot, for the event ``event`` sent by
        :meth:`konduit.App.send_event`; it succeeds with the event's payload. ``key(ctx)``
        (run on a worker, may read ``ctx.upstream``) names which event of that name this
        execution waits for; without it only ``send_event(..., execution_id=...)`` reaches it.
        An event sent before the step waits (even before its execution exists, when sent by
        key) is kept for ``retention`` (``"2h"``; default: the App's ``event_retention``, 24 h)
        and the oldest one not expired is consumed when the step waits. Past ``deadline`` the
        step degrades to ``fallback(ctx)``'s payload (else times out); a later event changes
        nothing for it. ``payload`` (a Pydantic model class, or a JSON Schema dict) declares
        what the event carries: every door that sends it checks the payload first (refusing a
        bad one with :class:`~konduit.InputValidationError` naming each field), and the
        dashboard's "Send event" form shows its fields. Returns the step's name, for
        ``after=``."""
        step_name = name or event.replace("-", "_")
        schema = None if payload is None else payload_schema(
            payload, workflow=self.name, what=f"wait_for_event({event!r}) step {step_name!r}")
        try:
            check_event_name(event)
            if is_input_event(event):
                raise KonduitError(f"event names starting {INPUT_EVENT_PREFIX!r} are kept for "
                                   "wait_for_input")
            kept = None if retention is None else positive_duration(retention, "retention")
        except KonduitError as exc:
            raise WorkflowDefinitionError(str(exc), workflow=self.name, step=name) from exc
        spec = WaitSpec(WaitKind.EVENT, event=event, key=key, retention=kept, payload=schema)
        return self._add_wait(spec, _arm_event(spec), name=step_name,
                              after=after, deadline=deadline, fallback=fallback,
                              required=required, fallback_on_failure=False, queue=queue,
                              retry=retry)

    def wait_for_input(
        self, name: str, *, model: Any, after: Sequence[StepRef] = (),
        who: str | None = None, deadline: Deadline | Duration | None = None,
        fallback: Callable[[Any], Any] | None = None, required: bool = True,
        queue: str = "default",
    ) -> str:
        """A step that waits, holding no worker slot, for a person's answer: ``model`` (a
        Pydantic model class, or a JSON Schema dict) says what an answer holds. The dashboard's
        inbox lists the step while it waits and renders its form from the model's JSON Schema;
        :meth:`konduit.App.answer` (the API's ``POST .../steps/{step}/answer``, ``konduit
        answer``) checks an answer against that schema, refusing a bad one with
        :class:`~konduit.InputValidationError` naming each field, and wakes the step: its output
        is the answer (a dict), and who answered and when are kept beside it. ``who`` is text
        shown in the inbox (who may answer); it grants nothing. It is an event wait (on the
        internal event ``konduit-input:<name>``, addressed by execution id): past ``deadline``
        the step degrades to ``fallback(ctx)``'s payload, else times out, exactly as
        :meth:`wait_for_event`. Returns the step's name, for ``after=``."""
        from konduit.core.inputs import InputType  # pydantic and jsonschema, lazily

        try:
            event = check_event_name(input_event(name), "step name of wait_for_input")
            schema = InputType(model, workflow=self.name).schema
        except WorkflowDefinitionError as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise WorkflowDefinitionError(str(message).replace("input=", "model="),
                                          workflow=self.name, step=name) from exc
        except KonduitError as exc:
            raise WorkflowDefinitionError(str(exc), workflow=self.name, step=name) from exc
        if who is not None and not isinstance(who, str):
            raise WorkflowDefinitionError(f"who= must be text, got {who!r}", workflow=self.name,
                                          step=name)
        answer: dict[str, Any] = {"schema": schema}
        if who:
            answer["who"] = who
        spec = WaitSpec(WaitKind.EVENT, event=event, answer=answer)
        return self._add_wait(spec, _arm_event(spec), name=name, after=after,
                              deadline=deadline, fallback=fallback, required=required,
                              fallback_on_failure=False, queue=queue, retry=None)

    def sleep(
        self, *, name: str, after: Sequence[StepRef] = (), duration: Duration | None = None,
        until: Callable[[Any], datetime] | None = None,
        deadline: Deadline | Duration | None = None, fallback: Callable[[Any], Any] | None = None,
        required: bool = True, queue: str = "default",
    ) -> str:
        """A timer step: it waits ``duration`` (``"10m"``) from when it starts waiting, or until
        ``until(ctx)`` (a timezone-aware datetime), holding no worker slot, then succeeds with
        None. It fires within the workers' maintenance interval of its time, even if every
        worker restarted meanwhile. Returns the step's name, for ``after=``."""
        if (duration is None) == (until is None):
            raise WorkflowDefinitionError("sleep() takes exactly one of duration= and until=",
                                          workflow=self.name, step=name)
        seconds = None
        if duration is not None:
            try:
                seconds = parse_duration(duration, what="duration")
            except KonduitError as exc:
                raise WorkflowDefinitionError(str(exc), workflow=self.name, step=name) from exc
        spec = WaitSpec(WaitKind.TIMER, duration=seconds, until=until)
        return self._add_wait(spec, _arm_timer(spec), name=name, after=after, deadline=deadline,
                              fallback=fallback, required=required, fallback_on_failure=False,
                              queue=queue, retry=None)

    def subworkflow(
        self, *, name: str | None = None, after: Sequence[StepRef] = (), workflow: str,
        input: Callable[[Any], Any] | None = None, deadline: Deadline | Duration | None = None,
        fallback: Callable[[Any], Any] | None = None, fallback_on_failure: bool = False,
        required: bool = True, queue: str = "default",
    ) -> str:
        """A step that starts one execution of ``workflow`` (registered in the same App) with
        ``input(ctx)`` and waits for it, holding no worker slot: it succeeds with the child's
        output; a child that fails, times out or is cancelled fails the step (or degrades it to
        ``fallback`` with ``fallback_on_failure=True``). One child per task, whatever crashes
        (its idempotency key is derived from the task). Cancelling this execution cancels the
        child. Returns the step's name, for ``after=``."""
        if not isinstance(workflow, str) or not workflow:
            raise WorkflowDefinitionError("subworkflow() needs workflow= (a workflow name)",
                                          workflow=self.name, step=name)
        spec = WaitSpec(WaitKind.CHILD, workflow=workflow, input=input)
        return self._add_wait(spec, _arm_child(spec), name=name or workflow.replace("-", "_"),
                              after=after, deadline=deadline, fallback=fallback,
                              required=required, fallback_on_failure=fallback_on_failure,
                              queue=queue, retry=None)
