"""Schedules as data, and the pure tick arithmetic: when a schedule ticks, and which of the ticks
due between the last one handled and now a round should start under its ``missed`` policy.

Nothing here reads a clock or the database: every function takes the times it needs, so tests
(and the DST cases) compute ticks instead of sleeping. :mod:`konduit.engine.schedules` loads a
schedule's state, asks :func:`plan_ticks`, and applies the answer.

Cron expressions are read by ``cronsim`` (healthchecks.io's evaluator): in a timezone with
daylight saving time, an expression at a fixed time of day (``"30 2 * * *"``) fires once a day
like Debian's cron: a time skipped by the spring change fires at the first minute after the gap
(03:00), a time repeated in autumn fires once (its first occurrence); an expression with ``*`` in
the minute or hour field (``"*/15 * * * *"``) follows real elapsed time through both changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from konduit.core.durations import Duration, parse_duration
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.errors import KonduitError, WorkflowDefinitionError

Missed = Literal["skip", "latest", "all"]
MISSED_POLICIES: tuple[str, ...] = ("skip", "latest", "all")

LATE_AFTER = 10.0
"""A tick less than this many seconds late counts as on time. Workers start a tick within a moment
of it; a tick that nobody started for longer than this was *missed* (no worker ran, the schedule
was paused, the database was down) and its schedule's ``missed`` policy decides its fate."""

MAX_CATCH_UP = 100
"""The most missed ticks ``missed="all"`` starts in one go: the most recent ones. Older missed
ticks are passed over (and logged), so a schedule that was paused for a year does not flood the
queue with a year of executions."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST_HORIZON = timedelta(minutes=1)
_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)  # a cron expression must fire after it


class ScheduleSpecError(KonduitError):
    """A schedule's timing cannot be used (internal: re-raised as a definition error naming
    the schedule)."""


def _aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got {value!r}")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression read in ``timezone``, or every ``every``
    seconds counted from the Unix epoch (so every worker computes the same ticks: ``every=60``
    ticks on each whole minute)."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"

    @classmethod
    def of(cls, cron: str | None = None, every: Duration | None = None,
           timezone: str | None = None) -> Timing:
        """A checked timing; raises :class:`ScheduleSpecError` saying what is wrong."""
        if (cron is None) == (every is None):
            raise ScheduleSpecError("give exactly one of cron= or every=")
        if every is not None:
            if timezone is not None:
                raise ScheduleSpecError(
                    "timezone= applies to cron= schedules only (every= counts real seconds); "
                    "use cron= for a time of day in a timezone")
            try:
                seconds = parse_duration(every, what="every")
            except KonduitError as exc:
                raise ScheduleSpecError(str(exc)) from None
            if seconds < 1 or seconds != int(seconds):
                raise ScheduleSpecError(
                    f"every= must be a whole number of seconds, at least 1, got {every!r}")
            return cls(every=int(seconds))
        if not isinstance(cron, str):
            raise ScheduleSpecError(f"cron= must be a string, got {cron!r}")
        zone = "UTC" if timezone is None else timezone
        if not isinstance(zone, str) or not zone:
            raise ScheduleSpecError(f"timezone= must be an IANA name such as 'Europe/Berlin', "
                                    f"got {timezone!r}")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ScheduleSpecError(
                f"unknown timezone {zone!r} (use an IANA name such as 'Europe/Berlin')"
            ) from None
        timing = cls(cron=" ".join(cron.split()), timezone=zone)
        try:
            first = timing.next_after(_REFERENCE)
        except CronSimError as exc:
            raise ScheduleSpecError(f"bad cron expression {cron!r}: {exc}") from None
        if first is None:
            raise ScheduleSpecError(f"cron expression {cron!r} never fires")
        return timing

    def describe(self) -> str:
        """How a person reads it: ``every 1h30m`` or ``0 5 * * * (Europe/Berlin)``."""
        if self.every is not None:
            parts, rest = [], self.every
            for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
                if rest >= size:
                    parts.append(f"{rest // size}{unit}")
                    rest %= size
            return f"every {''.join(parts)}"
        return f"{self.cron} ({self.timezone})"

    def _zone(self) -> ZoneInfo | None:
        return None if self.timezone == "UTC" else ZoneInfo(self.timezone)

    def _after(self, after: datetime) -> Iterator[datetime]:
        """Every tick strictly after ``after``, increasing, in UTC (unbounded)."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            k = (after - _EPOCH) // step + 1
            while True:
                yield _EPOCH + k * step
                k += 1
        assert self.cron is not None
        zone = self._zone()
        start = after.astimezone(zone) if zone is not None else after
        previous = after
        # cronsim's Debian-style fix-up for fixed-time expressions works on local wall time: a
        # start inside the repeated autumn hour may yield a tick at or before it. Ticks are kept
        # strictly increasing in UTC, so each tick is seen once whatever the start.
        for local in CronSim(self.cron, start):
            tick = local.astimezone(UTC)
            if tick > previous:
                previous = tick
                yield tick

    def ticks(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """The ticks ``t`` with ``after < t <= until``, oldest first, in UTC."""
        after, until = _aware(after, "after"), _aware(until, "until")
        if until <= after:
            return
        for tick in self._after(after):
            if tick > until:
                return
            yield tick

    def next_after(self, after: datetime) -> datetime | None:
        """The first tick strictly after ``after`` (None: a cron expression that matches no
        time within cronsim's 50-year search)."""
        return next(self._after(_aware(after, "after")), None)

    def recent(self, after: datetime, until: datetime, count: int) -> list[datetime]:
        """The most recent ``count`` ticks in ``(after, until]``, oldest first (fewer when there
        are fewer). Cost follows ``count``, not the length of the gap: a year-long gap in a
        per-minute schedule is not walked tick by tick."""
        after, until = _aware(after, "after"), _aware(until, "until")
        if count <= 0 or until <= after:
            return []
        if self.every is not None:
            step = timedelta(seconds=self.every)
            high = (until - _EPOCH) // step
            low = max((after - _EPOCH) // step + 1, high - count + 1)
            return [_EPOCH + k * step for k in range(low, high + 1)]
        horizon = _FIRST_HORIZON
        while True:
            start = max(after, until - horizon)
            found = list(self.ticks(start, until))
            if len(found) >= count or start == after:
                return found[-count:]
            horizon *= 8

    def to_spec(self) -> dict[str, Any]:
        """The timing as plain data."""
        return {"cron": self.cron, "every": self.every, "timezone": self.timezone}


@dataclass(frozen=True)
class Schedule:
    """A schedule defined in code with :meth:`konduit.Workflow.schedule`: each tick starts one
    execution of ``workflow`` at ``version`` with ``input``; ``window`` (seconds) sets the
    execution's ``deadline_at`` to the tick plus the window; ``missed`` says what happens to the
    ticks missed while no worker ran or while the schedule was paused."""

    name: str
    workflow: str
    version: int
    timing: Timing
    input: Any = None
    window: float | None = None
    missed: Missed = "latest"

    def key(self, tick: datetime) -> str:
        """The idempotency key of the execution ``tick`` starts: the database lets one
        execution have it, however many workers try."""
        return tick_key(self.name, tick)

    def to_spec(self) -> dict[str, Any]:
        """The definition as plain data (what :attr:`definition_hash` covers)."""
        return {
            "name": self.name, "workflow": self.workflow, "version": self.version,
            **self.timing.to_spec(), "input": self.input, "window": self.window,
            "missed": self.missed,
        }

    @property
    def definition_hash(self) -> str:
        """Changes whenever the definition does (stored to notice a changed schedule)."""
        canonical = json.dumps(self.to_spec(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def tick_key(name: str, tick: datetime) -> str:
    """``schedule:<name>:<tick in UTC, ISO 8601>``, e.g. ``schedule:nightly:2026-11-30T04:00:00Z``
    (ticks fall on whole seconds)."""
    return f"schedule:{name}:{_aware(tick, 'tick').strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True)
class TickPlan:
    """What one round does with a schedule: start ``start`` (oldest first), then record every
    tick up to ``advance_to`` as handled (None: nothing was due). ``passed_over`` is True when
    some due tick was missed and will never start."""

    start: tuple[datetime, ...]
    advance_to: datetime | None
    passed_over: bool


NOTHING_DUE = TickPlan((), None, False)


def plan_ticks(
    timing: Timing,
    missed: str,
    last: datetime,
    now: datetime,
    *,
    late_after: float = LATE_AFTER,
    max_catch_up: int = MAX_CATCH_UP,
) -> TickPlan:
    """Which ticks to start now, for a schedule whose ticks up to ``last`` are handled.

    The due ticks are those in ``(last, now]``. Those less than ``late_after`` seconds old are
    on time and always start. The older ones were missed, and ``missed`` decides:

    * ``"skip"``: none of them starts;
    * ``"latest"``: the most recent of them starts, unless an on-time tick starts now (it is
      more recent still);
    * ``"all"``: they all start, oldest first, but at most ``max_catch_up`` of them (the most
      recent ones).
    """
    if missed not in MISSED_POLICIES:
        raise ValueError(f"missed must be one of {', '.join(MISSED_POLICIES)}, got {missed!r}")
    last, now = _aware(last, "last"), _aware(now, "now")
    if now <= last:
        return NOTHING_DUE
    cutoff = max(last, now - timedelta(seconds=late_after))
    on_time = list(timing.ticks(cutoff, now))
    newest_missed = timing.recent(last, cutoff, 1)
    if missed == "all":
        late = timing.recent(last, cutoff, max_catch_up)
    elif missed == "latest" and not on_time:
        late = newest_missed
    else:
        late = []
    start = (*late, *on_time)
    newest = on_time[-1:] or newest_missed
    if not newest:
        return NOTHING_DUE
    first_due = timing.next_after(last)
    passed_over = first_due is not None and first_due <= cutoff and first_due not in start
    return TickPlan(start, newest[0], passed_over)


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,99}$")  # the rule for workflow names


def define(
    workflow: str,
    version: int,
    *,
    cron: str | None,
    every: Duration | None,
    timezone: str | None,
    input: Any,
    window: Duration | None,
    name: str | None,
    missed: str,
) -> Schedule:
    """A checked :class:`Schedule` of ``workflow``; every fault raises
    :class:`~konduit.WorkflowDefinitionError` naming the schedule."""
    label = workflow if name is None else name

    def fault(message: str) -> WorkflowDefinitionError:
        return WorkflowDefinitionError(f"schedule {label!r}: {message}", workflow=workflow)

    if not isinstance(label, str) or not _NAME.match(label):
        raise fault("a schedule name is 1-100 letters, digits, '_', '-' or '.'")
    try:
        timing = Timing.of(cron, every, timezone)
    except ScheduleSpecError as exc:
        raise fault(str(exc)) from None
    if missed not in MISSED_POLICIES:
        raise fault(f"missed= must be one of {', '.join(map(repr, MISSED_POLICIES))}, "
                    f"got {missed!r}")
    seconds = None
    if window is not None:
        try:
            seconds = parse_duration(window, what="window")
        except KonduitError as exc:
            raise fault(str(exc)) from None
        if seconds <= 0:
            raise fault(f"window= must be longer than zero, got {window!r}")
    try:
        canonical_json(input, what="input", max_bytes=DEFAULT_MAX_BYTES)
    except KonduitError as exc:
        raise fault(str(exc)) from None
    return Schedule(label, workflow, version, timing, input, seconds, cast(Missed, missed))
