"""Per-step policies: retries, deadlines and join policies.

All are frozen dataclasses so that they can be part of a workflow's spec hash.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from konduit.core.durations import Duration, parse_duration
from konduit.errors import KonduitError, WorkflowDefinitionError


def definition_duration(value: Duration, what: str) -> float:
    """Parse a duration that is part of a definition: a bad one is a definition error."""
    try:
        return parse_duration(value, what=what)
    except WorkflowDefinitionError:
        raise
    except KonduitError as exc:
        raise WorkflowDefinitionError(str(exc)) from exc


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

BackoffKind = Literal["fixed", "linear", "exponential"]


@dataclass(frozen=True)
class Retry:
    """How many attempts a task gets and how long to wait between them.

    Defaults: 3 attempts, exponential backoff from 1 s capped at 30 s, with full jitter.
    ``non_retryable`` exception types fail the task at once.
    """

    max_attempts: int = 3
    backoff: BackoffKind = "exponential"
    base: Duration = "1s"
    cap: Duration = "30s"
    jitter: bool = True
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if not _is_count(self.max_attempts) or self.max_attempts < 1:
            raise WorkflowDefinitionError(f"Retry.max_attempts must be >= 1, got {self.max_attempts!r}")
        if self.backoff not in ("fixed", "linear", "exponential"):
            raise WorkflowDefinitionError(
                f"Retry.backoff must be fixed, linear or exponential, got {self.backoff!r}"
            )
        object.__setattr__(self, "base", definition_duration(self.base, "Retry.base"))
        object.__setattr__(self, "cap", definition_duration(self.cap, "Retry.cap"))
        types = tuple(self.non_retryable)
        for t in types:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise WorkflowDefinitionError(f"Retry.non_retryable: {t!r} is not an exception type")
        object.__setattr__(self, "non_retryable", types)

    def delay(self, failed_attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait before the attempt after ``failed_attempt`` (which counts from 1)."""
        base, cap = float(self.base), float(self.cap)
        if self.backoff == "fixed":
            raw = base
        elif self.backoff == "linear":
            raw = base * failed_attempt
        else:
            # Capped exponent: 2**1100 does not fit a float, and anything past 2**60 is the cap.
            raw = base * (2.0 ** min(failed_attempt - 1, 60))
        raw = min(raw, cap)
        if self.jitter:
            # Full jitter (uniform in [0, raw]) spreads retries of tasks that failed together.
            raw = (rng or random).uniform(0.0, raw)
        return raw

    def to_spec(self) -> dict[str, Any]:
        """The policy as JSON, part of the workflow's spec hash."""
        return {
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "base": self.base,
            "cap": self.cap,
            "jitter": self.jitter,
            "non_retryable": sorted(f"{t.__module__}.{t.__qualname__}" for t in self.non_retryable),
        }


JoinKind = Literal["all_succeeded", "all_done", "required", "quorum"]


@dataclass(frozen=True)
class Join:
    """When a step with several upstream branches may fire.

    - ``all_succeeded()``: every branch succeeded (or degraded); a failed branch fails the execution.
    - ``all_done()``: every branch ended, whatever its outcome; the join gets the successes.
    - ``required()``: branches declared ``required=True`` must succeed; optional ones may end any way.
    - ``quorum(k)``: fires on the k-th successful branch.

    ``alert_fan_in_wait="60s"`` (any of them): the fan-in wait past which this join raises a
    ``fan_in_wait`` alert (docs/alerts.md), instead of its workflow's or the worker's. It is
    policy, not shape: it is no part of the join's spec (:meth:`to_spec`) and compares equal;
    the step stores it beside (checked, in seconds, when the step is defined).
    """

    kind: JoinKind = "all_succeeded"
    k: int | None = None
    alert_fan_in_wait: Duration | None = field(default=None, compare=False)

    @classmethod
    def all_succeeded(cls, *, alert_fan_in_wait: Duration | None = None) -> Join:
        return cls("all_succeeded", alert_fan_in_wait=alert_fan_in_wait)

    @classmethod
    def all_done(cls, *, alert_fan_in_wait: Duration | None = None) -> Join:
        return cls("all_done", alert_fan_in_wait=alert_fan_in_wait)

    @classmethod
    def required(cls, *, alert_fan_in_wait: Duration | None = None) -> Join:
        return cls("required", alert_fan_in_wait=alert_fan_in_wait)

    @classmethod
    def quorum(cls, k: int, *, alert_fan_in_wait: Duration | None = None) -> Join:
        if not _is_count(k) or k < 1:
            raise WorkflowDefinitionError(f"Join.quorum(k) needs k >= 1, got {k!r}")
        return cls("quorum", k, alert_fan_in_wait=alert_fan_in_wait)

    def to_spec(self) -> dict[str, Any]:
        """The join policy as JSON (part of the shape): ``alert_fan_in_wait`` is not in it."""
        return {"kind": self.kind, "k": self.k}


ADAPTIVE_FLOOR = 10.0
"""Seconds: ``Deadline.adaptive()``'s default floor ("clamped between 10s and 45s")."""
ADAPTIVE_CEILING = 45.0
"""Seconds: ``Deadline.adaptive()``'s default ceiling, and its budget while history is thin."""


@dataclass(frozen=True)
class Deadline:
    """A task's time budget: static (``Deadline.static("30s")``) or adaptive from its history.

    An adaptive deadline always yields a budget (never "no deadline"): factor x quantile of the
    step's successful attempt durations over ``window``, clamped to [floor, ceiling], and
    ``default`` (else the ceiling) while the history is thin."""

    seconds: float | None = None
    factor: float = 1.5
    quantile: float = 0.99
    window: float = 7 * 86400.0
    floor: float = ADAPTIVE_FLOOR
    ceiling: float | None = ADAPTIVE_CEILING
    default: float | None = None
    adaptive_: bool = False

    def __post_init__(self) -> None:
        if not self.adaptive_:
            return
        # Checked here too, not only in adaptive(): Deadline(adaptive_=True, ...) built by hand
        # must not be a deadline that may resolve to nothing.
        if not self.floor > 0:
            raise WorkflowDefinitionError(
                f"Deadline.adaptive floor must be > 0 (an adaptive deadline always has a "
                f"budget), got {self.floor!r}")
        if self.ceiling is not None and self.ceiling < self.floor:
            raise WorkflowDefinitionError(
                f"Deadline.adaptive ceiling ({self.ceiling:g} s) is below its floor "
                f"({self.floor:g} s; the default floor is {ADAPTIVE_FLOOR:g} s): set floor= too")
        if self.default is not None and not self.default > 0:
            raise WorkflowDefinitionError(
                f"Deadline.adaptive default must be > 0, got {self.default!r}")
        if self.ceiling is None and self.default is None:
            raise WorkflowDefinitionError(
                "Deadline.adaptive(ceiling=None) needs a default=: the budget while the history "
                "is thin (an adaptive deadline is never \"no deadline\")")

    @classmethod
    def static(cls, value: Duration) -> Deadline:
        """A fixed budget, counted from the task's first attempt."""
        return cls(seconds=definition_duration(value, "deadline"))

    @classmethod
    def adaptive(
        cls,
        *,
        factor: float = 1.5,
        quantile: float = 0.99,
        window: Duration = "7d",
        floor: Duration = ADAPTIVE_FLOOR,
        ceiling: Duration | None = ADAPTIVE_CEILING,
        default: Duration | None = None,
    ) -> Deadline:
        """By default: 1.5 x the p99 of the step's successful runs over the last
        7 days, clamped to [10 s, 45 s]; 45 s (``default``, else the ceiling) while the history
        is thin (fewer than 20 runs in the window).

        ``floor`` must be > 0; ``ceiling=None`` means no upper clamp and then needs a
        ``default``. There is no way to get "no deadline" from an adaptive policy: leave out
        ``deadline=`` for that."""
        if factor <= 0:
            raise WorkflowDefinitionError(f"Deadline.adaptive factor must be > 0, got {factor!r}")
        if not 0 < quantile <= 1:
            raise WorkflowDefinitionError(f"Deadline.adaptive quantile must be in (0, 1], got {quantile!r}")
        return cls(
            factor=float(factor),
            quantile=float(quantile),
            window=definition_duration(window, "Deadline.window"),
            floor=definition_duration(floor, "Deadline.floor"),
            ceiling=None if ceiling is None else definition_duration(ceiling, "Deadline.ceiling"),
            default=None if default is None else definition_duration(default, "Deadline.default"),
            adaptive_=True,
        )

    @property
    def thin_history_budget(self) -> float:
        """An adaptive deadline's budget while history is thin: ``default``, else the ceiling."""
        value = self.default if self.default is not None else self.ceiling
        assert value is not None  # __post_init__: one of them is set
        return value

    def to_spec(self) -> dict[str, Any]:
        """The policy as JSON, part of the workflow's spec hash."""
        if not self.adaptive_:
            return {"seconds": self.seconds}
        return {
            "adaptive": True,
            "factor": self.factor,
            "quantile": self.quantile,
            "window": self.window,
            "floor": self.floor,
            "ceiling": self.ceiling,
            "default": self.default,
        }
