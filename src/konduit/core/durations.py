"""Parse human durations such as ``"1s"``, ``"250ms"``, ``"7d"`` into seconds."""

from __future__ import annotations

import math
import re

from konduit.errors import KonduitError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

Duration = float | int | str


def parse_duration(value: Duration, *, what: str = "duration") -> float:
    """Return seconds for a number (seconds) or a string like ``"1m30s"``.

    Raises :class:`KonduitError` naming ``what`` when the value is not a duration.
    """
    if isinstance(value, bool):
        raise KonduitError(f"{what}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise KonduitError(f"{what}: duration must be finite, got {value!r}")
        if value < 0:
            raise KonduitError(f"{what}: duration must not be negative, got {value!r}")
        return float(value)
    text = str(value).strip().lower()
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise KonduitError(
            f"{what}: cannot read {value!r} as a duration (use e.g. '500ms', '30s', '5m', '7d')"
        )
    return total
