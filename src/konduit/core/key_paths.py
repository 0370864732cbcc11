"""Keys declared as data: ``key="input.customer"``, a path into an execution's input.

A start-time key (a step's per-key limit, ``Workflow(max_running=, key=)``, ``fair_by=``) given
as a function is code: only a process that has the workflow's code can compute it. Given as a
path it is data, stored with the workflow's registration (``konduit_workflows.start_keys``), so
every door computes the same key from the same input: the App, ``konduit.Client``, the CLI
and the HTTP API without the code, event triggers and schedules. A path is evaluated on the
input as stored (the JSON a declared ``input=`` model dumps to), never on a model instance, so
its answer cannot depend on which door started the execution.

A start-time key given as a function and started from a process without the code is refused
(:class:`~konduit.errors.KeyNeedsCode`, naming the workflow, the step and the fix) instead of
being left out, which made a per-customer limit one limit for everybody.

Pure: no database here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from konduit.errors import KeyNeedsCode, LimitKeyError

_SEGMENT = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_\-]*|\d+)$")
ROOT = "input"


@dataclass(frozen=True)
class KeyPath:
    """``"input.customer"`` (or ``"input.order.region"``, ``"input.items.0"``): the text at
    that place in the input. Each part after ``input`` is a field of an object, or a whole
    number indexing a list. The value found must be text or a whole number (written as text);
    anything else, or a part that is not there, refuses the start naming the path."""

    path: str

    def __post_init__(self) -> None:
        parts = self.path.split(".") if isinstance(self.path, str) else []
        if not parts or parts[0] != ROOT or not all(_SEGMENT.match(p) for p in parts[1:]):
            raise ValueError(f"a key path looks like 'input.customer' (fields after 'input', "
                             f"separated by dots), not {self.path!r}")

    @property
    def parts(self) -> tuple[str, ...]:
        """The path's parts after ``input``."""
        return tuple(self.path.split(".")[1:])

    def of(self, value: Any, *, where: str) -> str:
        """The key in ``value`` (an input as stored), or :class:`LimitKeyError` naming
        ``where`` and the path."""
        at = value
        walked = ROOT
        for part in self.parts:
            if isinstance(at, dict) and part in at:
                at = at[part]
            elif isinstance(at, list) and part.isdigit() and int(part) < len(at):
                at = at[int(part)]
            else:
                raise LimitKeyError(f"{where}: the key path {self.path!r} finds nothing: "
                                    f"{walked} has no {part!r}")
            walked = f"{walked}.{part}"
        if isinstance(at, bool) or not isinstance(at, str | int):
            raise LimitKeyError(f"{where}: the key path {self.path!r} finds "
                                f"{type(at).__name__} {at!r:.60}, not text or a whole number")
        return str(at)

    def __str__(self) -> str:
        return self.path


def key_of(key: object, *, what: str) -> KeyPath | Callable[..., Any] | None:
    """A key as declared: None, a path (text becomes a :class:`KeyPath`) or a function.
    Anything else raises ValueError naming ``what``."""
    if key is None or isinstance(key, KeyPath) or callable(key):
        return key
    if isinstance(key, str):
        return KeyPath(key)
    raise ValueError(f"{what} is a path into the input such as 'input.customer', or a "
                     f"function, not {type(key).__name__} {key!r:.40}")


def describe(key: object) -> dict[str, str] | None:
    """How a key is stored with the registration: ``{"path": ...}`` (any door computes it) or
    ``{"code": <the function's name>}`` (only a process with the code can)."""
    if key is None:
        return None
    if isinstance(key, KeyPath):
        return {"path": key.path}
    if isinstance(key, CodeKey):
        return {"code": key.function}
    name = getattr(key, "__qualname__", None) or type(key).__name__
    module = getattr(key, "__module__", None)
    return {"code": f"{module}.{name}" if module else name}


@dataclass(frozen=True)
class CodeKey:
    """A key function known by name only (a definition read from the database): calling it
    refuses the start with :class:`KeyNeedsCode` naming the workflow, the step and the fix."""

    function: str
    workflow: str
    step: str | None = None  # None: the workflow's own key (max_running's or fair_by's)
    role: str = "per-key limit"

    def __call__(self, *_: Any) -> Any:
        raise self.error()

    def error(self) -> KeyNeedsCode:
        where = (f"step {self.step!r} of workflow {self.workflow!r}" if self.step is not None
                 else f"workflow {self.workflow!r}")
        example = {"fair_by": "fair_by='input.customer' (or give fair_key=)",
                   "max_running": "Workflow(max_running=N, key='input.customer')"}.get(
                       self.role, "concurrency=konduit.Limit(N, key='input.customer')")
        return KeyNeedsCode(
            f"{where} computes its {self.role} key with the function {self.function}, which "
            f"this process does not have (it knows the workflow from the database only): the "
            f"key would be missing and the limit would hold for everybody at once. Declare "
            f"the key as a path into the input, e.g. {example}, so every door computes it; "
            f"or start it from a process with the workflow's code (the App, or --app)",
            workflow=self.workflow, step=self.step, function=self.function, role=self.role)


def from_stored(stored: object, *, workflow: str, step: str | None = None,
                role: str = "per-key limit") -> KeyPath | CodeKey | None:
    """The key a registration stored (:func:`describe`) back as a path or a code stand-in."""
    if not isinstance(stored, dict):
        return None
    if "path" in stored:
        return KeyPath(str(stored["path"]))
    return CodeKey(str(stored.get("code", "?")), workflow, step, role)
