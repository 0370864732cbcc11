"""Definitions that are valid but can misbehave at run time, found when the step is added.

``Join.required()`` fires once every branch has *ended*: required ones succeeded, optional ones
any way at all. An optional branch with no deadline may never end: a call
that hangs while its worker keeps heartbeating holds the lease forever, and with it the join.
The deadline belongs on the branch, not on the join; without one, "optional" only means "may
fail", not "may be late".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class _Step(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def after(self) -> tuple[str, ...]: ...
    @property
    def required(self) -> bool: ...
    @property
    def deadline(self) -> object | None: ...
    @property
    def join(self) -> object: ...


def _requires(step: _Step) -> bool:
    return getattr(step.join, "kind", None) == "required" and len(step.after) > 1


def _unbounded(step: _Step) -> bool:
    return not step.required and step.deadline is None


def unbounded_optional_branches(steps: Mapping[str, _Step], added: str) -> list[tuple[str, str]]:
    """The (join, branch) pairs that adding step ``added`` completes in which ``branch`` is an
    optional branch with no deadline of ``join``, a ``Join.required()`` join: each pair is found
    once, when its second step is added, whichever order the steps are defined in."""
    new = steps[added]
    pairs: list[tuple[str, str]] = []
    if _requires(new):
        pairs += [(added, up) for up in new.after if up in steps and _unbounded(steps[up])]
    if _unbounded(new):
        pairs += [(name, added) for name, step in steps.items()
                  if name != added and added in step.after and _requires(step)]
    return pairs


def unbounded_branch_message(workflow: str, join: str, branch: str) -> str:
    return (
        f"workflow {workflow!r}: step {join!r} waits with Join.required() for every branch to "
        f"end, and its optional branch {branch!r} has no deadline, so a hung {branch!r} holds "
        f"{join!r} forever. Give {branch!r} a deadline (e.g. deadline="
        f"konduit.Deadline.adaptive(), 1.5 x p99 clamped to [10 s, 45 s], "
        f"with a fallback=) or make it required."
    )
