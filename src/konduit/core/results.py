"""What a handler may return besides a plain payload."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


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
