"""Hedged attempts: when a straggling attempt gets a second one beside it (``hedge=``).

Pure decisions only: reading the setting at definition time, and turning a step's latency
history into a threshold. The worker (:mod:`konduit.worker.hedging`) loads the history and
claims the hedges; docs/hedging.md describes the whole protocol.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from konduit.core.durations import parse_duration
from konduit.errors import KonduitError

MIN_SAMPLES = 20
"""Successful (or outrun) primary attempts in :data:`HISTORY_SECONDS` that ``hedge="p95"`` needs
before it hedges at all: with less history a quantile is a guess, and the step runs unhedged."""
HISTORY_SECONDS = 86400.0
"""How far back ``hedge="pNN"`` reads the step's attempt durations."""
MIN_THRESHOLD = 0.05
"""No hedge starts earlier than this, whatever the history says (a step of a few milliseconds
would otherwise hedge on scheduling noise)."""

_QUANTILE = re.compile(r"^p(\d{2}(?:\.\d+)?)$")


@dataclass(frozen=True)
class Hedge:
    """A step's hedging setting: a fixed threshold (``seconds``) or a quantile of its history."""

    seconds: float | None = None
    quantile: float | None = None  # 0.5 <= quantile < 1, e.g. 0.95 for "p95"

    def to_spec(self) -> dict[str, Any]:
        if self.seconds is not None:
            return {"after": self.seconds}
        return {"quantile": self.quantile}

    def describe(self) -> str:
        if self.seconds is not None:
            return f"{self.seconds:g}s"
        assert self.quantile is not None
        return f"p{self.quantile * 100:g}"


def parse_hedge(value: object) -> Hedge:
    """Read ``hedge=``: a duration (``"2s"``, ``0.5``) greater than zero, or ``"pNN"`` (a
    quantile from 50 to 99.9 of the step's own attempt durations). Raises :class:`KonduitError`
    saying what is wrong."""
    if isinstance(value, Hedge):
        return value
    if isinstance(value, str):
        match = _QUANTILE.match(value.strip().lower())
        if match:
            percent = float(match.group(1))
            if not 50 <= percent < 100:
                raise KonduitError(f"hedge={value!r}: the quantile must be from p50 to p99.9")
            return Hedge(quantile=round(percent / 100, 6))
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise KonduitError(
            f"hedge= must be a duration such as '2s' or a quantile such as 'p95', got {value!r}")
    try:
        seconds = parse_duration(value, what="hedge")
    except KonduitError as exc:
        raise KonduitError(f"{exc} (or a quantile such as 'p95')") from exc
    if not seconds > 0 or not math.isfinite(seconds):
        raise KonduitError(f"hedge={value!r}: the threshold must be greater than zero")
    return Hedge(seconds=seconds)


def threshold(setting: Hedge, *, samples: int = 0, quantile_seconds: float | None = None
              ) -> float | None:
    """Seconds an attempt runs before it is hedged, or None for "do not hedge (yet)".

    A fixed setting is its own threshold. A quantile setting uses ``quantile_seconds``, the
    quantile of ``samples`` recent primary attempt durations, once there are at least
    :data:`MIN_SAMPLES` of them, and never less than :data:`MIN_THRESHOLD`."""
    if setting.seconds is not None:
        return setting.seconds
    if samples < MIN_SAMPLES or quantile_seconds is None or not math.isfinite(quantile_seconds):
        return None
    return max(quantile_seconds, MIN_THRESHOLD)
