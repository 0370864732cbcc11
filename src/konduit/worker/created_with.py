"""The policy a task was created with, when it is not the one this worker's code registered.

A policy-only change re-registers a version (docs/changing-workflows.md) and each task keeps the
policy its creating process applied: the task row stores its tries, budget, queue and priority,
and its policy revision (migration 0022). What decides its outcomes beyond those — the retry
backoff, ``fallback_on_failure`` — is read here from the revision's stored definition, so a
worker on revision 2 retries a task created under revision 1 as revision 1 said.

What is code stays the worker's own: the fallback function (a task whose creator's definition
has ``fallback_on_failure`` uses it only if this worker's code has a fallback), and
``Retry(non_retryable=...)``'s exception types, which cannot be rebuilt from their names.
"""

from __future__ import annotations

from typing import Any

from konduit.core.model import TaskAttempt
from konduit.core.outcome import StepPolicy, policy_of
from konduit.core.policies import Retry
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Database
from konduit.errors import KonduitError

_KEPT = 64
"""Revisions kept per worker: one per (workflow, version, revision) met, few in practice."""


class CreatedWith:
    """Reads (once per revision) the stored definitions of the policy revisions a worker's
    tasks were created under."""

    def __init__(self, db: Database):
        self.db = db
        self._steps: dict[tuple[str, int, int], dict[str, dict[str, Any]] | None] = {}

    async def policy(self, spec: WorkflowSpec, step: StepSpec, task: TaskAttempt) -> StepPolicy:
        """The policy that decides this task's outcomes: its creator's revision's, else (the
        same revision, an unknown one, or a task from before migration 0022) this worker's."""
        own = policy_of(step)
        revision = task.policy_revision
        if revision is None or revision == spec.policy_revision:
            return own
        stored = await self._stored(spec.name, spec.version, revision)
        entry = None if stored is None else stored.get(step.name)
        if entry is None:
            return own
        return created_policy(own, entry)

    async def _stored(self, name: str, version: int,
                      revision: int) -> dict[str, dict[str, Any]] | None:
        key = (name, version, revision)
        if key not in self._steps:
            row = await self.db.one("workflow_policy_get", name=name, version=version,
                                    revision=revision)
            if len(self._steps) >= _KEPT:
                self._steps.clear()
            steps = None if row is None else row["spec"].get("steps", [])
            self._steps[key] = None if steps is None else {s["name"]: s for s in steps}
        return self._steps[key]


def created_policy(own: StepPolicy, entry: dict[str, Any]) -> StepPolicy:
    """``own`` (this worker's policy of the step) with the retry backoff and
    ``fallback_on_failure`` of ``entry`` (the step in a stored definition); a stored retry this
    version cannot read leaves the worker's."""
    retry = own.retry
    stored = entry.get("retry")
    if isinstance(stored, dict):
        try:
            retry = Retry(max_attempts=int(stored["max_attempts"]), backoff=stored["backoff"],
                          base=float(stored["base"]), cap=float(stored["cap"]),
                          jitter=bool(stored["jitter"]), non_retryable=own.retry.non_retryable)
        except (KeyError, TypeError, ValueError, KonduitError):
            retry = own.retry
    return StepPolicy(retry, own.has_fallback,
                      own.has_fallback and bool(entry.get("fallback_on_failure", False)))
