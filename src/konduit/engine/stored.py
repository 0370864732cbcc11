"""Workflow definitions read back from the database, for processes without the workflow's code.

A worker or App registers each workflow version it knows (``konduit_workflows``: the spec as
JSON, the declared input's JSON Schema, and the flow limits beside it). What a *start* needs of
a definition is all there: the steps, their edges, queues, priorities, attempts, deadlines and
limits, and the input's schema. So :class:`StoredSpecs` rebuilds a :class:`WorkflowSpec` from
those rows whose handlers are stand-ins that refuse to run: a process that starts (or
repairs) by name never runs workflow code, the workers do.
"""

from __future__ import annotations

from typing import Any, Protocol

from konduit.core import key_paths
from konduit.core.flow import FlowLimit
from konduit.core.hedging import Hedge
from konduit.core.inputs import InputType
from konduit.core.model import WaitKind
from konduit.core.policies import Deadline, Join, Retry
from konduit.core.repair_contract import RepairContract
from konduit.core.waits import WaitSpec
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Database, Row
from konduit.engine.registry import Registry
from konduit.errors import KonduitError, WorkflowNotFound, blamed


class SpecSource(Protocol):
    """Where a start finds a workflow's definition by name and (optional) version."""

    def get(self, name: str, version: int | None = None) -> WorkflowSpec: ...


class NoCode(KonduitError):
    """A stored definition was asked to run workflow code this process does not have."""


def _no_code(workflow: str, step: str) -> Any:
    def stand_in(*_: Any) -> Any:
        raise NoCode(f"step {step!r} of workflow {workflow!r} needs the workflow's code, which "
                     "this process does not have (it knows the definition from the database "
                     "only); a worker serving the workflow runs it")
    stand_in.__name__ = step
    return stand_in


def _deadline(spec: Any) -> Deadline | None:
    if not isinstance(spec, dict):
        return None
    if not spec.get("adaptive"):
        return None if spec.get("seconds") is None else Deadline(seconds=float(spec["seconds"]))
    return Deadline(factor=spec["factor"], quantile=spec["quantile"], window=spec["window"],
                    floor=spec["floor"], ceiling=spec["ceiling"], default=spec["default"],
                    adaptive_=True)


def _retry(spec: Any) -> Retry:
    if not isinstance(spec, dict):
        return Retry()
    # Non-retryable exception types are names only here: only a worker (with the code) uses them.
    return Retry(max_attempts=int(spec.get("max_attempts", 3)),
                 backoff=spec.get("backoff", "exponential"), base=spec.get("base", 1.0),
                 cap=spec.get("cap", 30.0), jitter=bool(spec.get("jitter", True)))


def _wait(workflow: str, step: str, spec: Any) -> WaitSpec | None:
    if not isinstance(spec, dict):
        return None
    kind = WaitKind(spec["kind"])
    stub = _no_code(workflow, step)
    if kind == WaitKind.EVENT:
        return WaitSpec(kind, event=spec.get("event"), key=stub if spec.get("keyed") else None)
    if kind == WaitKind.TIMER:
        return WaitSpec(kind, duration=spec.get("duration"),
                        until=stub if spec.get("until") else None)
    return WaitSpec(kind, workflow=spec.get("workflow"), input=stub)


def _hedge(spec: Any) -> Hedge | None:
    if not isinstance(spec, dict):
        return None
    return Hedge(seconds=spec.get("after"), quantile=spec.get("quantile"))


def spec_from_rows(row: Row, limits: list[list[Any]]) -> WorkflowSpec:
    """The definition registered as ``row`` (``workflow_get_with_input_schema``) with the flow
    limits in force ``limits`` (``[step, concurrency, rate_count, rate_seconds]`` each), its
    code replaced by stand-ins. A definition this konduit cannot read raises
    :class:`KonduitError` naming the workflow version."""
    try:
        return _rebuild(row, limits)
    except (KeyError, TypeError, ValueError, KonduitError) as exc:
        raise KonduitError(
            f"the registered definition of workflow {row['name']!r} version {row['version']} "
            f"cannot be read by this konduit ({type(exc).__name__}: {exc}); start it from a "
            "process with its code, or upgrade konduit here") from exc


def _rebuild(row: Row, limits: list[list[Any]]) -> WorkflowSpec:
    name, stored = row["name"], row["spec"] or {}
    keys = row.get("start_keys") or {}
    step_keys = keys.get("steps") or {}
    flows = {step: FlowLimit(concurrency, rate_count, rate_seconds,
                             key_paths.from_stored(step_keys.get(step), workflow=name, step=step))
             for step, concurrency, rate_count, rate_seconds in limits}
    steps: dict[str, StepSpec] = {}
    for s in stored.get("steps", []):
        step = s["name"]
        stub = _no_code(name, step)
        join = s.get("join") or {}
        steps[step] = StepSpec(
            name=step, handler=stub, after=tuple(s.get("after", ())),
            join=Join(join.get("kind", "all_succeeded"), join.get("k"),
                      alert_fan_in_wait=s.get("alert_fan_in_wait")),
            retry=_retry(s.get("retry")), deadline=_deadline(s.get("deadline")),
            required=bool(s.get("required", True)),
            fallback=stub if s.get("fallback") else None,
            fallback_on_failure=bool(s.get("fallback_on_failure", False)),
            map_over=stub if s.get("map") else None,
            queue=s.get("queue", "default"), priority=int(s.get("priority", 0)),
            flow=flows.get(step), hedge=_hedge(s.get("hedge")),
            wait=_wait(name, step, s.get("wait")),
        )
    schema = row.get("input_schema")
    spec = WorkflowSpec(name, row["version"], steps, repair=RepairContract.from_spec(stored),
                        alert_fan_in_wait=stored.get("alert_fan_in_wait"),
                        input_type=None if schema is None else InputType(schema, workflow=name))
    # The start-time keys (migration 0030): a path computes here as in the code; a function
    # is a stand-in that refuses the start (KeyNeedsCode) rather than leave the key out.
    running = keys.get("max_running")
    if isinstance(running, dict):
        spec.max_running = int(running["count"])
        spec.run_key = key_paths.from_stored(running.get("key"), workflow=name,
                                             role="max_running")
    spec.fair_by = key_paths.from_stored(keys.get("fair_by"), workflow=name, role="fair_by")
    # What was registered, not a re-encoding of the rebuilt steps (which leaves out what only
    # code has): the template cache and registration compare these.
    spec.__dict__["spec_json"] = stored
    spec.__dict__["stored_definition"] = True
    spec.__dict__["spec_hash"] = row["spec_hash"]
    return spec


class StoredSpecs:
    """A process's workflows: those of its own code (``registry``) first, else the definitions
    registered in the database, loaded by :meth:`load` and kept while their hash holds."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self._loaded: dict[tuple[str, int], WorkflowSpec] = {}
        # What each loaded spec was built from: (row version, limits), and the row itself.
        self._built_from: dict[tuple[str, int], tuple[str, Any]] = {}
        self._rows: dict[tuple[str, int], Row] = {}
        self._newest: dict[str, int] = {}

    def knows(self, name: str) -> bool:
        """Whether this process has the code of some version of ``name``."""
        return any(spec.name == name for spec in self.registry)

    def get(self, name: str, version: int | None = None) -> WorkflowSpec:
        """The code's definition when this process has it, else the one :meth:`load` read."""
        if self.knows(name):
            try:
                return self.registry.get(name, version)
            except WorkflowNotFound:
                if version is None:
                    raise
        key = (name, version if version is not None else self._newest.get(name, 0))
        found = self._loaded.get(key)
        if found is not None:
            return found
        return self.registry.get(name, version)  # raises WorkflowNotFound naming the known ones

    def is_stored(self, spec: WorkflowSpec) -> bool:
        """Whether ``spec`` was read from the database (it is registered already). Marked on
        the spec itself: concurrent starts each load the definition, and one start's spec may
        no longer be the one kept; registering it as if it were code replaced the stored
        event triggers with none."""
        return bool(spec.__dict__.get("stored_definition"))

    async def load(self, db: Database, name: str, version: int | None) -> None:
        """Read the registered definition of ``name`` (``version``, else the newest) unless
        this process has its code; a name nobody registered raises :class:`WorkflowNotFound`
        naming the registered ones (and a version, the versions there are)."""
        if self.knows(name) and (version is None or (name, version) in
                                 {(s.name, s.version) for s in self.registry}):
            return
        if version is None:
            head = await db.one("workflow_get_newest_head", name=name)
        else:
            head = await db.one("workflow_get_head", name=name, version=version)
        if head is None:
            await self._not_found(db, name, version)
            return
        key = (name, int(head["version"]))
        stamp = (head["row_version"], head["limits"])
        built = self._built_from.get(key)
        if built is None or built != stamp:
            row = self._rows.get(key)
            if row is None or built is None or built[0] != stamp[0]:
                row = await db.one("workflow_get_with_input_schema", name=name, version=key[1])
                if row is None:  # deleted between the two reads: as if never registered
                    await self._not_found(db, name, version)
                    return
            self._loaded[key] = spec_from_rows(row, head["limits"])
            self._rows[key], self._built_from[key] = row, stamp
        if version is None:
            self._newest[name] = key[1]

    async def _not_found(self, db: Database, name: str, version: int | None) -> None:
        names = sorted({r["name"] for r in await db.all("workflow_list_names")}
                       | {spec.name for spec in self.registry})
        if version is not None and name in names:
            raise blamed(WorkflowNotFound(f"workflow {name!r} has no version {version} "
                                          "registered"), "version")
        raise blamed(WorkflowNotFound(
            f"unknown workflow {name!r}; registered workflows: {', '.join(names) or 'none'} "
            "(a workflow is registered when a worker or App that has its code starts)"),
            "workflow")


def refuse_map_repair_without_code(specs: StoredSpecs, name: str, version: int) -> None:
    """Refuse to repair, from a stored definition, an execution of a workflow with map steps:
    a repair may have to expand one again, which runs its ``over=`` code in the repairing
    process, and a stand-in there would fail the step for good instead of refusing."""
    spec = specs.get(name, version)
    maps = [n for n in spec.order if spec[n].is_map]
    if specs.is_stored(spec) and maps:
        raise NoCode(f"repairing workflow {name!r} version {version} needs its code: its map "
                     f"step(s) {', '.join(maps)} may have to be expanded again; repair it from "
                     "a process that has the code (the App, or konduit repair --app)")
