"""Workflow definitions: steps, their dependencies and policies, checked at definition time."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from konduit.core import fair, key_paths, shape
from konduit.core.definition_warnings import unbounded_branch_message, unbounded_optional_branches
from konduit.core.durations import Duration, parse_duration
from konduit.core.flow import FlowLimit, Limit, Rate, parse_flow_limit
from konduit.core.hedging import Hedge, parse_hedge
from konduit.core.inputs import InputType
from konduit.core.limit_keys import AnyKey, check_max_running
from konduit.core.policies import Deadline, Join, Retry
from konduit.core.repair_contract import RepairContract
from konduit.core.schedules import Schedule
from konduit.core.schedules import define as define_schedule
from konduit.core.shares import parse_share
from konduit.core.triggers import Batch, EventTrigger
from konduit.core.triggers import define as define_trigger
from konduit.core.validation import OutputValidator
from konduit.core.waits import StepRef as StepRef
from konduit.core.waits import WaitSpec, WaitSteps
from konduit.errors import DefinitionWarning, KonduitError, WorkflowDefinitionError

Handler = Callable[..., Any]
F = TypeVar("F", bound=Handler)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$")

DEFAULT_MAX_MAP_ITEMS = 1_000_000
"""Items one map step may fan out to unless it sets ``max_items``: past it the execution fails
naming the step and the limit, instead of a worker running out of memory creating tasks."""


@dataclass(frozen=True)
class StepSpec:
    """One node of the DAG, as compiled from a decorator or the sequence builder."""

    name: str
    handler: Handler
    after: tuple[str, ...]
    join: Join
    retry: Retry
    deadline: Deadline | None = None
    required: bool = True
    fallback: Callable[[Any], Any] | None = None
    map_over: Callable[[Any], Iterable[Any]] | None = None
    queue: str = "default"
    priority: int = 0
    output: Any = None
    fallback_on_failure: bool = False
    validator: OutputValidator | None = None
    max_items: int = DEFAULT_MAX_MAP_ITEMS
    # Fleet-wide limits (concurrency=, rate=). Operational, so not part of the spec hash: a
    # limit changes without a new version (the latest registration sets it for the fleet).
    flow: FlowLimit | None = None
    hedge: Hedge | None = None  # when a straggling attempt gets a second one beside it
    wait: WaitSpec | None = None  # a durable wait step (event, timer, child workflow)

    @property
    def is_map(self) -> bool:
        return self.map_over is not None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": self.name,
            "after": list(self.after),
            "join": self.join.to_spec(),
            "retry": self.retry.to_spec(),
            "deadline": self.deadline.to_spec() if self.deadline else None,
            "required": self.required,
            "fallback": self.fallback is not None,
            "fallback_on_failure": self.fallback_on_failure,
            "output": self.output is not None,
            "map": self.is_map,
            "queue": self.queue,
            "priority": self.priority,
        }
        if self.hedge is not None:  # only when set: the hash of unhedged workflows is unchanged
            spec["hedge"] = self.hedge.to_spec()
        if self.join.alert_fan_in_wait is not None:  # policy, only when set (docs/alerts.md)
            spec["alert_fan_in_wait"] = self.join.alert_fan_in_wait
        if self.wait is not None:
            spec["wait"] = self.wait.to_spec()
        if self.flow is not None and self.flow.keyed:
            # Per-key or per-step limits decide which claim takes the step's tasks: a change
            # between them is a change of shape (the limits' values stay out of the hash).
            spec["limit_key"] = True
        return spec


@dataclass(frozen=True)
class StepOptions:
    """A handler with step options, for use inside :meth:`Workflow.sequence` and :func:`parallel`."""

    handler: Handler
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parallel:
    """Branches that run side by side inside :meth:`Workflow.sequence`."""

    items: tuple[Any, ...]


def step(handler: Handler, **options: Any) -> StepOptions:
    """Wrap a handler with step options (``retry=``, ``join=``, ...) for the sequence builder."""
    return StepOptions(handler, options)


def parallel(*items: Any) -> Parallel:
    """Branches for :meth:`Workflow.sequence`: each item is a handler, a ``step(...)``,
    or a list/tuple meaning a nested sequence."""
    if not items:
        raise WorkflowDefinitionError("parallel() needs at least one branch")
    return Parallel(tuple(items))


def _check_signature(name: str, workflow: str, handler: Handler) -> None:
    if not callable(handler):
        raise WorkflowDefinitionError("handler is not callable", workflow=workflow, step=name)
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError) as exc:
        raise WorkflowDefinitionError(
            f"cannot read the handler's signature: {exc}", workflow=workflow, step=name
        ) from exc
    try:
        sig.bind(object())
    except TypeError as exc:
        raise WorkflowDefinitionError(
            f"handler must take exactly one positional argument (the context), "
            f"its signature is {name}{sig}",
            workflow=workflow,
            step=name,
        ) from exc


def _fan_in_threshold(value: Duration | None, *, workflow: str,
                      step: str | None = None) -> float | None:
    """An ``alert_fan_in_wait=`` in seconds (None stays None); a bad one is a definition error
    naming the workflow (and the step)."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value, what="alert_fan_in_wait")
    except KonduitError as exc:
        raise WorkflowDefinitionError(str(exc), workflow=workflow, step=step) from exc
    if seconds <= 0:
        raise WorkflowDefinitionError("alert_fan_in_wait must be a positive duration, e.g. '60s'",
                                      workflow=workflow, step=step)
    return seconds


def _outside_this_module() -> int:
    """The ``stacklevel`` that points a warning issued in this module at the user's line (the
    decorator or the ``sequence`` call), however deep the definition helpers nest."""
    frame = sys._getframe(1)  # the frame that calls warnings.warn
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
        level += 1
    return level


class Workflow(WaitSteps):
    """A named, versioned DAG of steps.

    >>> wf = Workflow("publish-content", version=1)
    >>> @wf.step()
    ... def transcribe(ctx): ...

    ``repair_within="24h"`` (the 24-hour repair contract): an execution that succeeded with a degraded
    output is repaired automatically, once, by a worker, ``repair_delay`` (default 5 minutes, or
    half of ``repair_within`` when that is shorter) to ``repair_within`` after it finished; see
    docs/retention.md.

    ``input=Model`` (a Pydantic model class, or a JSON Schema dict) declares what a start must
    pass: every start (the App, :class:`konduit.Client`, the HTTP API) checks the input against
    its JSON Schema, stored at registration, and refuses a bad one with
    :class:`konduit.InputValidationError` naming each field, before anything is written.
    Handlers then get ``ctx.input`` as the model instance.

    ``degraded_budget="2%"`` ("roughly 2% of runs"): a ``degraded_budget`` alert opens
    while more than that share of the workflow's executions finished in the last day went out
    degraded, and resolves when the share falls back; see docs/alerts.md.

    ``alert_fan_in_wait="60s"``: the fan-in wait past which a join of this workflow raises a
    ``fan_in_wait`` alert, instead of the worker's ``alert_fan_in_wait`` (a join may set its own:
    ``Join.all_succeeded(alert_fan_in_wait=...)``). A wait on a durable wait (an event, a timer,
    a child workflow, or a step behind one) never counts; see docs/alerts.md.

    ``fair_by="input.customer"``: ready work is claimed round-robin across the keys it gives
    (a string, from the input, at each start), so one customer's backlog does not hold
    another's execution back; see docs/fairness.md. A path into the input (text) is data that
    every door computes, from the App or by name without the code; a function
    (``lambda input: input["customer"]``) is code, and a start by name without the code then
    needs ``fair_key=``.

    ``max_running=N`` (with ``key="input.customer"``, optional; a function of the input is
    code, as for ``fair_by``): at most N running executions
    per key (without ``key``: of the workflow in all); a start past it leaves the execution
    ``pending`` until a slot frees, oldest first; see docs/many-customers.md.
    """

    def __init__(self, name: str, version: int = 1, *, repair_within: Duration | None = None,
                 repair_delay: Duration | None = None,
                 alert_after_no_success: Duration | None = None,
                 degraded_budget: str | float | None = None, input: Any = None,
                 alert_fan_in_wait: Duration | None = None,
                 fair_by: Callable[[Any], str] | str | None = None,
                 max_running: int | None = None,
                 key: Callable[[Any], Any] | str | None = None):
        if not isinstance(name, str) or not _NAME.match(name):
            raise WorkflowDefinitionError(
                f"workflow name {name!r} must be 1-100 letters, digits, '_', '-' or '.'"
            )
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise WorkflowDefinitionError(f"version must be a positive integer, got {version!r}",
                                          workflow=name)
        self.name = name
        self.version = version
        self.repair = RepairContract.of(repair_within, repair_delay, workflow=name)
        # Alert when no execution succeeded for this long (docs/alerts.md); None: never.
        self.alert_after_no_success: float | None = None
        if alert_after_no_success is not None:
            try:
                self.alert_after_no_success = parse_duration(
                    alert_after_no_success, what="alert_after_no_success")
            except KonduitError as exc:
                raise WorkflowDefinitionError(str(exc), workflow=name) from exc
            if self.alert_after_no_success <= 0:
                raise WorkflowDefinitionError("alert_after_no_success must be a positive "
                                              "duration, e.g. '26h'", workflow=name)
        # The degraded share (a fraction) past which the degraded_budget alert opens; None: never.
        self.degraded_budget: float | None = None
        if degraded_budget is not None:
            try:
                self.degraded_budget = parse_share(degraded_budget, what="degraded_budget")
            except KonduitError as exc:
                raise WorkflowDefinitionError(str(exc), workflow=name) from exc
        # The fan-in wait past which its joins alert (None: the worker's); policy, stored.
        self.alert_fan_in_wait = _fan_in_threshold(alert_fan_in_wait, workflow=name)
        # The declared input (None: any JSON); checked at every start (konduit.core.inputs).
        self.input_type = None if input is None else InputType(input, workflow=name)
        self.fair_by = fair.check_fair_by(fair_by, workflow=name)  # docs/fairness.md
        self._steps: dict[str, StepSpec] = {}
        self._by_handler: dict[int, str] = {}
        self._frozen_spec: WorkflowSpec | None = None
        self._schedules: dict[str, Schedule] = {}
        # At most max_running running executions per key(input) (docs/many-customers.md).
        self.max_running, self.run_key = check_max_running(max_running, key, workflow=name)
        self._triggers: dict[str, EventTrigger] = {}

    # -- definition ---------------------------------------------------------------------------

    def step(
        self,
        *,
        name: str | None = None,
        after: Sequence[StepRef] = (),
        join: Join | None = None,
        retry: Retry | None = None,
        deadline: Deadline | Duration | None = None,
        required: bool = True,
        fallback: Callable[[Any], Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        output: Any = None,
        fallback_on_failure: bool = False,
        concurrency: int | Limit | None = None,
        rate: str | Rate | None = None,
        hedge: Duration | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as a step running after the steps in ``after``.

        ``deadline`` is the task's time budget (``"30s"`` or :meth:`Deadline.adaptive`); past it
        the task ends ``degraded`` with ``fallback(ctx)``'s payload, or ``timed_out`` without a
        fallback. ``fallback_on_failure`` also degrades a task whose retries are exhausted.
        ``required=False`` makes this step an optional branch for ``Join.required()``.
        ``output`` declares the payload's type (Pydantic model or JSON Schema dict).
        ``concurrency=N`` runs at most N tasks of this step at once and ``rate="N/s"`` (or
        ``/m``, ``/h``) starts at most N in any such interval, across all workers;
        ``konduit.Limit(N, key=...)`` and ``konduit.Rate("N/s", key=...)`` apply them to each
        key instead (docs/many-customers.md).
        ``hedge`` (``"2s"``, or ``"p95"`` of the step's own history) starts a second attempt of a
        task whose attempt has run that long; the first to finish counts (docs/hedging.md)."""

        def decorate(handler: F) -> F:
            self._add(
                handler,
                name=name,
                after=after,
                join=join,
                retry=retry,
                deadline=deadline,
                required=required,
                fallback=fallback,
                queue=queue,
                priority=priority,
                output=output,
                fallback_on_failure=fallback_on_failure,
                map_over=None,
                concurrency=concurrency,
                rate=rate,
                hedge=hedge,
            )
            return handler

        return decorate

    def map(
        self,
        *,
        after: Sequence[StepRef],
        over: Callable[[Any], Iterable[Any]],
        name: str | None = None,
        retry: Retry | None = None,
        deadline: Deadline | Duration | None = None,
        required: bool = True,
        fallback: Callable[[Any], Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        output: Any = None,
        fallback_on_failure: bool = False,
        max_items: int = DEFAULT_MAX_MAP_ITEMS,
        concurrency: int | Limit | None = None,
        rate: str | Rate | None = None,
        hedge: Duration | None = None,
    ) -> Callable[[F], F]:
        """Register a run-time fan-out: one task per item of ``over(upstream_output)``.

        With one upstream, ``over`` receives its payload; with several, a dict of step -> payload.
        Each task sees its item as ``ctx.item``; downstream steps receive the results as a list in
        item order. ``over`` producing more than ``max_items`` items fails the execution, and
        so does ``over`` (with the encoding of its items) taking more than 60 seconds: it runs
        when the map's join fires, inside the worker's completion round, so keep it to shaping
        what upstream returned.
        """
        if not callable(over):
            raise WorkflowDefinitionError("map(over=...) must be callable", workflow=self.name)

        def decorate(handler: F) -> F:
            self._add(
                handler,
                name=name,
                after=after,
                join=None,
                retry=retry,
                deadline=deadline,
                required=required,
                fallback=fallback,
                queue=queue,
                priority=priority,
                output=output,
                fallback_on_failure=fallback_on_failure,
                map_over=over,
                max_items=max_items,
                concurrency=concurrency,
                rate=rate,
                hedge=hedge,
            )
            return handler

        return decorate

    def schedule(
        self,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        timezone: str | None = None,
        input: Any = None,
        window: Duration | None = None,
        name: str | None = None,
        missed: str = "latest",
    ) -> Schedule:
        """Start an execution of this workflow on a schedule: at each tick of ``cron`` (a
        cron expression read in ``timezone``, an IANA name, default UTC) or ``every`` (``"10s"``,
        ``"1h"``: ticks on multiples of it since the Unix epoch), with ``input``.

        Each tick starts exactly one execution however many workers run (its idempotency key is
        ``schedule:<name>:<tick in UTC, ISO 8601>``); handlers see the tick as
        ``ctx.scheduled_at``. ``window`` sets the execution's ``deadline_at`` to the tick plus
        the window. ``missed`` decides what happens to ticks missed while no worker ran or the
        schedule was paused: ``"skip"`` (none of them), ``"latest"`` (the most recent one) or
        ``"all"`` (each of them, at most 100).
        ``name`` defaults to the workflow's name and is unique across an App. Faults raise
        :class:`~konduit.WorkflowDefinitionError` naming the schedule."""
        if self._frozen_spec is not None:
            raise WorkflowDefinitionError(
                "cannot add a schedule after the workflow was compiled (by wf.spec, wf.compile() "
                "or an App): define schedules before creating the App", workflow=self.name)
        if self.input_type is not None:  # a tick would be refused at every start: say it now
            try:
                input = self.input_type.check(input)
            except KonduitError as exc:
                raise WorkflowDefinitionError(f"schedule input: {exc}", workflow=self.name) from exc
        made = define_schedule(self.name, self.version, cron=cron, every=every,
                               timezone=timezone, input=input, window=window, name=name,
                               missed=missed)
        if made.name in self._schedules:
            raise WorkflowDefinitionError(
                f"schedule {made.name!r} is defined twice"
                + ("" if name is not None else ": give each schedule of a workflow a name="),
                workflow=self.name)
        self._schedules[made.name] = made
        return made

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules defined with :meth:`schedule`, in definition order."""
        return tuple(self._schedules.values())

    def on_event(self, event: str, *, input: Callable[[Any], Any] | None = None,
                 key: Callable[[Any], Any] | None = None, debounce: Duration | None = None,
                 batch: Batch | None = None, payload: Any = None) -> EventTrigger:
        """Start an execution of this workflow when the event ``event`` is sent
        (``app.send_event``, ``POST /api/v1/events``, ``konduit send-event``); docs/events.md.

        ``input(payload)`` makes the execution's input (default: the payload). ``key(payload)``
        (default: the key the event was sent with) names the event: one key starts one
        execution, so an event sent again starts nothing new. ``debounce="5s"``: a burst of
        events of one key starts one execution, with the burst's last event, once no event of
        that key came for 5 s. ``batch=konduit.Batch(max=100, window="2s")``: the events (of one
        key) are gathered into one execution whose input is their list. ``input=`` and ``key=``
        run where the workflow's code is: in the sender when it has it, else in a worker.
        ``payload`` (a Pydantic model class, or a JSON Schema dict) declares what the event
        carries: every door that sends it checks the payload first, refusing a bad one with
        :class:`~konduit.InputValidationError` naming each field."""
        if self._frozen_spec is not None:
            raise WorkflowDefinitionError(
                "cannot add an event trigger after the workflow was compiled (by wf.spec, "
                "wf.compile() or an App): call on_event before creating the App",
                workflow=self.name)
        made = define_trigger(self.name, self.version, event, input=input, key=key,
                              debounce=debounce, batch=batch, payload=payload)
        if event in self._triggers:
            raise WorkflowDefinitionError(f"on_event({event!r}) is declared twice",
                                          workflow=self.name)
        self._triggers[event] = made
        return made

    @property
    def triggers(self) -> tuple[EventTrigger, ...]:
        """The event triggers declared with :meth:`on_event`, in definition order."""
        return tuple(self._triggers.values())

    def sequence(self, *items: Any, after: Sequence[StepRef] = ()) -> list[str]:
        """Add steps that run one after another; a :func:`parallel` item fans out and the
        next item joins its branches. Returns the names of the last item's steps."""
        tails = [self._resolve(r, "sequence") for r in after]
        for item in items:
            tails = self._add_item(item, tails)
        return tails

    def _add_item(self, item: Any, after: list[str]) -> list[str]:
        if isinstance(item, Parallel):
            ends: list[str] = []
            for branch in item.items:
                ends.extend(self._add_item(branch, after))
            return ends
        if isinstance(item, list | tuple):
            tails = after
            for sub in item:
                tails = self._add_item(sub, tails)
            return tails
        opts = item if isinstance(item, StepOptions) else StepOptions(item)
        options = dict(opts.options)
        options.setdefault("after", after)
        if "over" in options:
            over = options.pop("over")
            return [self._add(opts.handler, map_over=over, **options)]
        return [self._add(opts.handler, map_over=None, **options)]

    def _resolve(self, ref: StepRef, owner: str) -> str:
        if isinstance(ref, str):
            return ref
        found = self._by_handler.get(id(ref))
        if found == "":
            raise WorkflowDefinitionError(
                f"{getattr(ref, '__name__', ref)!r} is the handler of several steps: "
                "name the upstream by its step name instead",
                workflow=self.name,
                step=owner,
            )
        if found is None:
            raise WorkflowDefinitionError(
                f"upstream {getattr(ref, '__name__', ref)!r} is not a step of this workflow",
                workflow=self.name,
                step=owner,
            )
        return found

    def _add(
        self,
        handler: Handler,
        *,
        map_over: Callable[[Any], Iterable[Any]] | None,
        name: str | None = None,
        after: Sequence[StepRef] = (),
        join: Join | None = None,
        retry: Retry | None = None,
        deadline: Deadline | Duration | None = None,
        required: bool = True,
        fallback: Callable[[Any], Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        output: Any = None,
        fallback_on_failure: bool = False,
        max_items: int | None = None,
        concurrency: int | Limit | None = None,
        rate: str | Rate | None = None,
        hedge: Duration | None = None,
        wait: WaitSpec | None = None,
    ) -> str:
        if self._frozen_spec is not None:
            raise WorkflowDefinitionError(
                "cannot add steps after the workflow was compiled (by wf.spec, wf.compile() or an App)",
                workflow=self.name,
            )
        step_name = name or getattr(handler, "__name__", None)
        if not isinstance(step_name, str) or not _NAME.match(step_name):
            raise WorkflowDefinitionError(f"invalid step name {step_name!r}", workflow=self.name)
        if step_name in self._steps:
            raise WorkflowDefinitionError("duplicate step name", workflow=self.name, step=step_name)
        _check_signature(step_name, self.name, handler)
        if isinstance(after, str | bytes) or not isinstance(after, Sequence):
            raise WorkflowDefinitionError(
                "after= must be a list of steps", workflow=self.name, step=step_name
            )
        upstream = tuple(self._resolve(r, step_name) for r in after)
        if len(set(upstream)) != len(upstream):
            raise WorkflowDefinitionError("an upstream is listed twice", workflow=self.name,
                                          step=step_name)
        if step_name in upstream:
            raise WorkflowDefinitionError("a step cannot run after itself (cycle)",
                                          workflow=self.name, step=step_name)
        if join is not None and not isinstance(join, Join):
            raise WorkflowDefinitionError(f"join= must be a konduit.Join, got {join!r}",
                                          workflow=self.name, step=step_name)
        if join is not None and len(upstream) < 2:
            raise WorkflowDefinitionError(
                f"a join policy needs at least two upstream steps, this step has {len(upstream)}",
                workflow=self.name,
                step=step_name,
            )
        if join is not None and join.kind == "quorum" and (join.k or 0) > len(upstream):
            raise WorkflowDefinitionError(
                f"Join.quorum({join.k}) can never fire with {len(upstream)} upstream steps",
                workflow=self.name,
                step=step_name,
            )
        if map_over is not None and not upstream:
            raise WorkflowDefinitionError("a map step needs an upstream to map over",
                                          workflow=self.name, step=step_name)
        if max_items is not None and map_over is None:
            raise WorkflowDefinitionError("max_items= applies to map steps only",
                                          workflow=self.name, step=step_name)
        if max_items is not None and (
            not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1
        ):
            raise WorkflowDefinitionError(f"max_items must be a positive integer, got {max_items!r}",
                                          workflow=self.name, step=step_name)
        if retry is not None and not isinstance(retry, Retry):
            raise WorkflowDefinitionError(f"retry= must be a konduit.Retry, got {retry!r}",
                                          workflow=self.name, step=step_name)
        if fallback is not None:
            _check_signature(step_name, self.name, fallback)
        if fallback_on_failure and fallback is None:
            raise WorkflowDefinitionError("fallback_on_failure=True needs a fallback=",
                                          workflow=self.name, step=step_name)
        if deadline is not None and not isinstance(deadline, Deadline):
            try:
                seconds = parse_duration(deadline, what="deadline")
            except KonduitError as exc:
                raise WorkflowDefinitionError(str(exc), workflow=self.name, step=step_name) from exc
            deadline = Deadline(seconds=seconds)
        if join is not None and join.alert_fan_in_wait is not None:
            join = dataclasses.replace(join, alert_fan_in_wait=_fan_in_threshold(
                join.alert_fan_in_wait, workflow=self.name, step=step_name))
        hedging = None
        if hedge is not None:
            try:
                hedging = parse_hedge(hedge)
            except KonduitError as exc:
                raise WorkflowDefinitionError(str(exc), workflow=self.name, step=step_name) from exc
        if not isinstance(queue, str) or not queue:
            raise WorkflowDefinitionError("queue must be a non-empty string", workflow=self.name,
                                          step=step_name)
        try:
            flow = parse_flow_limit(concurrency, rate)
        except ValueError as exc:
            raise WorkflowDefinitionError(str(exc), workflow=self.name, step=step_name) from exc
        if flow is not None and hedging is not None:
            # A hedge starts beside the claim, not through it: it would run a second handler
            # past the step's concurrency and rate limits, the very thing they protect.
            raise WorkflowDefinitionError(
                "hedge= cannot be combined with concurrency= or rate=: a hedged attempt would "
                "run past the step's flow limit", workflow=self.name, step=step_name)
        spec = StepSpec(
            name=step_name,
            handler=handler,
            after=upstream,
            join=join or Join.all_succeeded(),
            retry=retry or Retry(),
            deadline=deadline,
            required=bool(required),
            fallback=fallback,
            map_over=map_over,
            queue=queue,
            priority=int(priority),
            output=output,
            fallback_on_failure=bool(fallback_on_failure),
            validator=None if output is None
            else OutputValidator(output, step=step_name, workflow=self.name),
            max_items=DEFAULT_MAX_MAP_ITEMS if max_items is None else max_items,
            flow=flow,
            hedge=hedging,
            wait=wait,
        )
        self._steps[step_name] = spec
        # A handler shared by several steps cannot name an upstream unambiguously ("" marks it).
        self._by_handler[id(handler)] = "" if id(handler) in self._by_handler else step_name
        for join_step, branch in unbounded_optional_branches(self._steps, step_name):
            warnings.warn(unbounded_branch_message(self.name, join_step, branch),
                          DefinitionWarning, stacklevel=_outside_this_module())
        return step_name

    # -- compiled view ------------------------------------------------------------------------

    def compile(self) -> WorkflowSpec:
        """Check the whole DAG (unknown upstreams, cycles) and freeze it."""
        if self._frozen_spec is None:
            self._frozen_spec = WorkflowSpec(self.name, self.version, dict(self._steps),
                                             repair=self.repair,
                                             alert_after_no_success=self.alert_after_no_success,
                                             degraded_budget=self.degraded_budget,
                                             alert_fan_in_wait=self.alert_fan_in_wait,
                                             input_type=self.input_type,
                                             triggers=self.triggers)
            self._frozen_spec.fair_by = self.fair_by
            self._frozen_spec.max_running = self.max_running
            self._frozen_spec.run_key = self.run_key
        return self._frozen_spec

    @property
    def spec(self) -> WorkflowSpec:
        return self.compile()

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version}, steps={list(self._steps)})"


class WorkflowSpec:
    """The frozen, validated DAG of a workflow: what the engine and the pure advance function use."""

    def __init__(self, name: str, version: int, steps: dict[str, StepSpec], *,
                 repair: RepairContract | None = None,
                 alert_after_no_success: float | None = None,
                 degraded_budget: float | None = None,
                 alert_fan_in_wait: float | None = None,
                 input_type: InputType | None = None,
                 triggers: tuple[EventTrigger, ...] = ()):
        self.name = name
        # Events that start it (wf.on_event): stored in their own table at registration, out
        # of spec_json and spec_hash like the settings below.
        self.triggers = triggers
        self.version = version
        self.steps = steps
        # The declared input: policy, like the settings below, so out of spec_json and spec_hash
        # (stored in its own column at registration).
        self.input_type = input_type
        self.repair = repair  # the automatic repair contract (repair_within), if any
        # An operating setting, not part of the DAG: kept out of spec_json and spec_hash.
        self.alert_after_no_success = alert_after_no_success
        self.degraded_budget = degraded_budget  # likewise (a fraction; docs/alerts.md)
        # Workflow(alert_fan_in_wait=): policy in spec_json (only when set), so a reader without
        # the code knows it (konduit.core.fan_in.fan_in_threshold).
        self.alert_fan_in_wait = alert_fan_in_wait
        # The start's fair key from its input (docs/fairness.md): code, so never stored; a
        # definition read back from the database has none.
        self.fair_by: fair.FairBy | None = None
        # The revision of this version's policy that this definition is, once registered
        # (engine.client.Client.register): stamped on the tasks this process creates.
        self.policy_revision: int | None = None
        # Workflow(max_running=, key=): an operating setting, out of the spec hash like the above.
        self.max_running: int | None = None
        self.run_key: AnyKey | None = None
        if not steps:
            raise WorkflowDefinitionError("a workflow needs at least one step", workflow=name)
        for s in steps.values():
            for up in s.after:
                if up not in steps:
                    raise WorkflowDefinitionError(f"unknown upstream step {up!r}", workflow=name,
                                                  step=s.name)
        # One pass over the edges: a join of 10,000 branches made this quadratic (seconds at
        # every worker start). Each step's downstream keeps definition order.
        below: dict[str, list[str]] = {n: [] for n in steps}
        for d in steps.values():
            for up in dict.fromkeys(d.after):
                below[up].append(d.name)
        self.downstream: dict[str, tuple[str, ...]] = {n: tuple(v) for n, v in below.items()}
        self.order = self._topological_order()
        self.roots = tuple(n for n in self.order if not steps[n].after)
        self.sinks = tuple(n for n in self.order if not self.downstream[n])

    def _topological_order(self) -> tuple[str, ...]:
        indegree = {n: len(s.after) for n, s in self.steps.items()}
        ready = deque(n for n, d in indegree.items() if d == 0)
        order: list[str] = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for d in self.downstream[n]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    ready.append(d)
        if len(order) != len(self.steps):
            cycle = self._find_cycle({n for n, d in indegree.items() if d > 0})
            raise WorkflowDefinitionError(
                f"the steps {' -> '.join([*cycle, cycle[0]])} form a cycle",
                workflow=self.name,
                step=cycle[0],
            )
        return tuple(order)

    def _find_cycle(self, stuck: set[str]) -> list[str]:
        """Walk upstream from a stuck step until a step repeats: what lies between is a cycle
        (steps merely downstream of a cycle are stuck too, but never repeat)."""
        path: list[str] = []
        seen: dict[str, int] = {}
        node = min(stuck)
        while node not in seen:
            seen[node] = len(path)
            path.append(node)
            node = min(up for up in self.steps[node].after if up in stuck)
        cycle = path[seen[node]:]
        start = cycle.index(min(cycle))
        return cycle[start:] + cycle[:start]

    def __getitem__(self, step: str) -> StepSpec:
        return self.steps[step]

    @cached_property
    def flow_limits(self) -> dict[str, FlowLimit]:
        """The steps with fleet-wide limits (``concurrency=``/``rate=``), by name."""
        return {n: s.flow for n, s in self.steps.items() if s.flow is not None}

    @cached_property
    def flow_keys(self) -> dict[str, AnyKey]:
        """The keys (paths or functions) of the steps with per-key limits, by step name."""
        return {n: f.key for n, f in self.flow_limits.items() if f.key is not None}

    @property
    def start_keys(self) -> dict[str, Any] | None:
        """How each start-time key is computed, as registered (``konduit_workflows.start_keys``,
        migration 0030): a path any door can read, or the name of a function only the code
        has; and ``max_running``, which a start by name must hold to as well. None when the
        workflow has none of them."""
        keys: dict[str, Any] = {}
        steps = {n: key_paths.describe(k) for n, k in self.flow_keys.items()}
        if steps:
            keys["steps"] = steps
        if self.max_running is not None:
            keys["max_running"] = {"count": self.max_running,
                                   "key": key_paths.describe(self.run_key)}
        if self.fair_by is not None:
            keys["fair_by"] = key_paths.describe(self.fair_by)
        return keys or None

    @cached_property
    def spec_json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "steps": [self.steps[n].to_spec() for n in self.order],
        }
        if self.repair is not None:  # only when set: the hashes of other workflows stay as they were
            spec["repair"] = self.repair.to_spec()
        if self.alert_fan_in_wait is not None:  # likewise; policy (core/shape.py)
            spec["alert_fan_in_wait"] = self.alert_fan_in_wait
        return spec

    @property
    def input_schema(self) -> dict[str, Any] | None:
        """The JSON Schema of the declared input, or None (any JSON)."""
        return None if self.input_type is None else self.input_type.schema

    def check_input(self, value: Any) -> Any:
        """The input to store, or :class:`~konduit.InputValidationError` naming each field."""
        return value if self.input_type is None else self.input_type.check(value)

    def handler_input(self, value: Any) -> Any:
        """``ctx.input``: the declared model's instance, else the stored JSON."""
        return value if self.input_type is None else self.input_type.for_handler(value)

    @cached_property
    def spec_hash(self) -> str:
        canonical = json.dumps(self.spec_json, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @cached_property
    def shape_hash(self) -> str:
        """The digest of the shape alone (core/shape.py): a policy-only change keeps it."""
        return shape.shape_hash(self.spec_json)

    @cached_property
    def policy_json(self) -> dict[str, Any]:
        """The policy alone (core/shape.py): what may change under the same version."""
        return shape.policy_of(self.spec_json)
