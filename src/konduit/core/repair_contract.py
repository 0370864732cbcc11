"""The 24-hour repair contract as pure decisions: "we agreed that a degraded output is
acceptable ... and that we would retry the full pipeline once within 24 hours to replace the
degraded version."

``Workflow(..., repair_within="24h", repair_delay="5m")``: an execution that *succeeded* with a
degraded output (some step ended ``degraded``, i.e. with its fallback's payload) is repaired
automatically, once, by a worker's maintenance loop, no earlier than ``repair_delay`` after it
finished (the degraded service gets time to recover) and no later than ``repair_within`` after
it. The I/O lives in :mod:`konduit.engine.auto_repair`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from konduit.core.durations import Duration, format_duration, parse_duration
from konduit.core.model import ExecutionStatus
from konduit.errors import KonduitError, WorkflowDefinitionError

DEFAULT_DELAY = 300.0
"""Seconds after the finish before the automatic repair is attempted, unless the workflow says
(or half its ``repair_within`` when that is shorter than ten minutes)."""


@dataclass(frozen=True)
class RepairContract:
    """When the automatic repair of a degraded execution may run: ``delay`` to ``within``
    seconds after it finished."""

    within: float
    delay: float

    @classmethod
    def of(cls, within: Duration | None, delay: Duration | None,
           *, workflow: str | None = None) -> RepairContract | None:
        """The contract of a workflow definition (None without ``repair_within``); a bad value is
        a :class:`WorkflowDefinitionError` naming the workflow."""
        if within is None:
            if delay is not None:
                raise WorkflowDefinitionError("repair_delay= needs repair_within=",
                                              workflow=workflow)
            return None
        try:
            within_s = parse_duration(within, what="repair_within")
            delay_s = (min(DEFAULT_DELAY, within_s / 2) if delay is None
                       else parse_duration(delay, what="repair_delay"))
        except KonduitError as exc:
            raise WorkflowDefinitionError(str(exc), workflow=workflow) from exc
        if within_s <= 0:
            raise WorkflowDefinitionError(f"repair_within must be longer than zero, got {within!r}",
                                          workflow=workflow)
        if delay_s >= within_s:
            raise WorkflowDefinitionError(
                f"repair_delay ({format_duration(delay_s)}) must be shorter than repair_within "
                f"({format_duration(within_s)}): the repair would never be due", workflow=workflow)
        return cls(within_s, delay_s)

    def to_spec(self) -> dict[str, float]:
        """The contract as JSON, part of the workflow's spec (and its hash)."""
        return {"within": self.within, "delay": self.delay}

    @classmethod
    def from_spec(cls, spec: Any) -> RepairContract | None:
        """The contract stored in a registered workflow's spec, if any."""
        if not isinstance(spec, dict) or not isinstance(spec.get("repair"), dict):
            return None
        return cls(float(spec["repair"]["within"]), float(spec["repair"]["delay"]))

    def due_at(self, finished_at: datetime) -> datetime:
        return finished_at + timedelta(seconds=self.delay)

    def expires_at(self, finished_at: datetime) -> datetime:
        return finished_at + timedelta(seconds=self.within)


def _at(value: datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class AutoRepairState:
    """What the database says about one execution's automatic repair."""

    status: str
    finished_at: datetime | None
    auto_repair_at: datetime | None
    auto_repair_error: str | None
    degraded: tuple[str, ...]  # steps the current output version went out degraded with
    contract: RepairContract | None


def describe(state: AutoRepairState, now: datetime) -> str | None:
    """One line for ``konduit status`` and the dashboard, or None when there is nothing to say
    (no contract, or an execution the contract does not cover: running, failed, not degraded)."""
    contract = state.contract
    within = f"repair_within={format_duration(contract.within)}" if contract else "repair_within"
    if state.auto_repair_at is not None:
        at = _at(state.auto_repair_at)
        if state.auto_repair_error:
            return f"auto-repair not possible (tried at {at}, {within}): {state.auto_repair_error}"
        if state.status in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING):
            return f"auto-repair running since {at} ({within})"
        return f"auto-repaired at {at} ({within})"
    if contract is None or state.status != ExecutionStatus.SUCCEEDED or not state.degraded \
            or state.finished_at is None:
        return None
    degraded = ", ".join(state.degraded)
    expires = contract.expires_at(state.finished_at)
    if now >= expires:
        return f"not auto-repaired: {within} ran out at {_at(expires)} (degraded: {degraded})"
    due = contract.due_at(state.finished_at)
    when = f"due at {_at(due)}" if now < due else "due now, waiting for a worker"
    return f"auto-repair pending: {when}, by {_at(expires)} ({within}; degraded: {degraded})"
