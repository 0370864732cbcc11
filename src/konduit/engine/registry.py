"""Which workflows a process knows, by (name, version)."""

from __future__ import annotations

from collections.abc import Iterable

from konduit.core.schedules import Schedule
from konduit.core.workflow import Workflow, WorkflowSpec
from konduit.errors import KonduitError, WorkflowDefinitionError, WorkflowNotFound, blamed


def workflow_key(name: str, version: int) -> str:
    return f"{name}@{version}"


class Registry:
    def __init__(self, workflows: Iterable[Workflow] = ()):
        self._specs: dict[tuple[str, int], WorkflowSpec] = {}
        self.schedules: dict[str, Schedule] = {}
        """Every workflow's schedules by name: a name is unique across the App."""
        for wf in workflows:
            self.add(wf)

    def add(self, workflow: Workflow) -> WorkflowSpec:
        if not isinstance(workflow, Workflow):
            raise KonduitError(f"App(workflows=...) takes konduit.Workflow objects, got {workflow!r}")
        spec = workflow.compile()
        key = (spec.name, spec.version)
        existing = self._specs.get(key)
        if existing is not None and existing.spec_hash != spec.spec_hash:
            raise KonduitError(
                f"two different definitions of workflow {spec.name!r} version {spec.version}"
            )
        for schedule in workflow.schedules:
            other = self.schedules.get(schedule.name)
            if other is not None and other is not schedule:
                raise WorkflowDefinitionError(
                    f"schedule {schedule.name!r} is defined twice: on workflow {other.workflow!r} "
                    f"version {other.version} and on workflow {schedule.workflow!r} version "
                    f"{schedule.version}; schedule names are unique across an App (name= sets one)"
                )
        self._specs[key] = spec
        self.schedules.update((s.name, s) for s in workflow.schedules)
        return spec

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._specs.values())

    def keys(self) -> list[str]:
        return [workflow_key(n, v) for (n, v) in self._specs]

    def has(self, name: str, version: int) -> bool:
        """Whether this version of the workflow is registered."""
        return (name, version) in self._specs

    def get(self, name: str, version: int | None = None) -> WorkflowSpec:
        if version is None:
            versions = [v for (n, v) in self._specs if n == name]
            if versions:
                return self._specs[(name, max(versions))]
        elif (name, version) in self._specs:
            return self._specs[(name, version)]
        known = ", ".join(sorted({n for n, _ in self._specs})) or "none"
        what = f"{name!r}" + (f" version {version}" if version is not None else "")
        field = "version" if version is not None and any(n == name for n, _ in self._specs) \
            else "workflow"
        raise blamed(WorkflowNotFound(f"unknown workflow {what}; registered workflows: {known}"),
                     field)
