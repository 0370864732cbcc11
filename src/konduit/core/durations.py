"""Durations as people write and read them: :func:`parse_duration` reads ``"1s"``, ``"250ms"``,
``"7d"`` into seconds; :func:`format_duration` writes a configured duration back that way, and
:func:`format_elapsed` writes a measured one (``"0.412s"``, ``"4m05s"``) for tables and messages."""

from __future__ import annotations

import math
import re

from konduit.errors import KonduitError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

Duration = float | int | str


MAX_DURATION_SECONDS = 100 * 365 * 24 * 3600.0
"""The longest duration taken: a century. Longer ones are mistakes, and the moment they name
would overflow a timestamp (``1e308`` s, ``"999999999d"``) in the database, far from here."""


def parse_duration(value: Duration, *, what: str = "duration") -> float:
    """Return seconds for a number (seconds) or a string like ``"1m30s"``.

    Raises :class:`KonduitError` naming ``what`` when the value is not a duration, or is longer
    than :data:`MAX_DURATION_SECONDS`.
    """
    seconds = _seconds(value, what)
    if seconds > MAX_DURATION_SECONDS:
        raise KonduitError(f"{what}: at most 100 years ({MAX_DURATION_SECONDS:.0f} s), "
                           f"got {value!r}")
    return seconds


def _seconds(value: Duration, what: str) -> float:
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


def _trimmed(value: float) -> str:
    # At most three decimals and never an exponent ("1e+06s" would not parse back).
    return f"{value:.3f}".rstrip("0").rstrip(".")


def format_duration(seconds: float) -> str:
    """A configured duration as it was probably written, in a form :func:`parse_duration`
    reads back: ``86400`` -> ``24h``, ``172800`` -> ``2d``, ``300`` -> ``5m``, ``90`` -> ``90s``,
    ``1.5`` -> ``1.5s``, ``0.25`` -> ``250ms``, ``0`` -> ``0s``. Whole days from two days on (one
    day reads better as ``24h``)."""
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:.0f}d"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    if 0 < seconds < 1:
        return f"{_trimmed(seconds * 1000)}ms"
    return f"{_trimmed(seconds)}s"


def format_elapsed(seconds: float | None) -> str:
    """A measured duration, precise where it is short: ``0.412s``, ``12.3s``, ``4m05s``,
    ``2h07m``, ``7d``, ``1d12h``; ``—`` for None (nothing measured)."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.3f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes}m{secs:02d}s"
    if seconds < 2 * 86400:
        hours, rest = divmod(round(seconds), 3600)
        return f"{hours}h{rest // 60:02d}m"
    days, rest = divmod(round(seconds), 86400)
    return f"{days}d" + (f"{rest // 3600}h" if rest >= 3600 else "")
