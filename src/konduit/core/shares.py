"""Shares (``"2%"``) and the degraded budget: "we accept slightly worse outputs in
roughly 2% of runs in exchange for never missing the window".

``Workflow(..., degraded_budget="2%")``: the share of a workflow's finished executions over the
last day that went out degraded (some step ended with its fallback's payload) may be up to that
much; past it, a ``degraded_budget`` alert opens (docs/alerts.md), and it resolves when the share
falls back. Pure: parsing and the share itself.
"""

from __future__ import annotations

import math

from konduit.errors import KonduitError

DEGRADED_WINDOW = 86400.0
"""Seconds of history the degraded share counts: a day."""


def parse_share(value: object, *, what: str) -> float:
    """``"2%"`` -> 0.02, ``"0.5 %"`` -> 0.005; a number is taken as the fraction itself
    (``0.02``). Between 0 and 100 % inclusive; anything else is a :class:`KonduitError` that
    names ``what``."""
    if isinstance(value, bool):
        raise KonduitError(f"{what}: expected a share like '2%', got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not text.endswith("%"):
            raise KonduitError(f"{what}: expected a share like '2%', got {value!r}")
        try:
            share = float(text[:-1].strip()) / 100
        except ValueError:
            raise KonduitError(f"{what}: cannot read {value!r} as a share like '2%'") from None
    elif isinstance(value, int | float):
        share = float(value)
    else:
        raise KonduitError(f"{what}: expected a share like '2%', got {value!r}")
    if not math.isfinite(share) or not 0 <= share <= 1:
        raise KonduitError(f"{what} must be between 0% and 100%, got {value!r}")
    return share


def degraded_share(finished: int, degraded: int) -> float | None:
    """The share of ``finished`` executions that went out degraded; None when none finished."""
    return degraded / finished if finished > 0 else None


def format_share(share: float) -> str:
    """0.02 -> ``2%``, 0.0125 -> ``1.25%``."""
    return f"{round(share * 100, 2):g}%"
