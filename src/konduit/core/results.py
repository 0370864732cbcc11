"""What a handler may return besides a plain payload, and what an execution comes to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.model import ExecutionStatus


@dataclass(frozen=True)
class Route:
    """Return ``Route(payload, to=[...])`` from a handler to run only the named downstream steps;
    the others end ``skipped`` (and joins treat skipped branches per their policy).

    >>> @wf.step(after=[classify])
    ... def triage(ctx):
    ...     return konduit.Route({"kind": "video"}, to=["transcode"])
    """

    output: Any
    to: tuple[str, ...]

    def __init__(self, output: Any = None, *, to: Iterable[str]):
        if isinstance(to, str):
            to = [to]
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "to", tuple(to))


FINISHED = frozenset(ExecutionStatus) - {ExecutionStatus.PENDING, ExecutionStatus.SCHEDULED,
                                         ExecutionStatus.RUNNING}


@dataclass
class ExecutionResult:
    """How an execution stands (or ended)."""

    id: UUID
    workflow: str
    version: int
    status: str
    output: Any = None
    error: str | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED
