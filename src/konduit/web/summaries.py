"""Pure helpers of the operator pages: page cursors, a map step's distribution (one row instead of
one per item), the steps a repair would re-run, and the live state of an execution as JSON.

No I/O here: the routes in :mod:`konduit.web.ops` and :mod:`konduit.web.actions` load rows and
hand them over.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from konduit.web.views import REDRIVABLE, REPAIRABLE

MAP_STATUSES = ("ready", "running", "succeeded", "degraded", "failed", "timed_out", "cancelled",
                "skipped")


class BadCursor(ValueError):
    """A page cursor that this dashboard did not make (edited, truncated or stale format)."""


def encode_cursor(at: datetime, key: object) -> str:
    """An opaque cursor for keyset paging: the sort time and the tie-breaking key of the last row
    shown; the next page starts after it."""
    raw = f"{at.isoformat()}|{key}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (time, key) of :func:`encode_cursor`; :class:`BadCursor` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, key = raw.split("|", 1)
        moment = datetime.fromisoformat(at)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadCursor(f"cursor {cursor[:40]!r} is not one this dashboard made; "
                        "start again from the first page") from None
    if moment.tzinfo is None or not key:
        raise BadCursor(f"cursor {cursor[:40]!r} is incomplete; start again from the first page")
    return moment, key


@dataclass(frozen=True)
class MapSummary:
    """A map step's items in the latest generation, as one row: counts by status and the spread
    of the finished items' durations."""

    step: str
    generation: int
    tasks: int
    tries: int
    counts: dict[str, int]  # status -> items, only the statuses that occur
    p50: float | None
    p95: float | None
    longest: float | None
    first_started_at: datetime | None
    last_finished_at: datetime | None
    creating: int = 0  # items still in chunks, not yet tasks (a big map being fanned out)

    @property
    def finished(self) -> int:
        return self.tasks - self.counts.get("ready", 0) - self.counts.get("running", 0)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "tasks": self.tasks, "tries": self.tries, "counts": self.counts,
                "p50": self.p50, "p95": self.p95, "max": self.longest, "creating": self.creating}


def map_summaries(rows: Sequence[Mapping[str, Any]]) -> dict[str, MapSummary]:
    """The latest generation of each step in ``task_summarize_by_step``'s rows (a repair re-runs
    a map step as a new generation; the page shows the one that counts)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row["step"] not in latest or row["generation"] > latest[row["step"]]["generation"]:
            latest[row["step"]] = row
    out = {}
    for step, row in latest.items():
        counts = {s: int(row[s]) for s in MAP_STATUSES if row.get(s)}
        out[step] = MapSummary(
            step, int(row["generation"]), int(row["tasks"]), int(row["tries"] or 0), counts,
            _float(row["p50"]), _float(row["p95"]), _float(row["longest"]),
            row["first_started_at"], row["last_finished_at"], int(row.get("creating") or 0))
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def map_bars(summaries: Mapping[str, MapSummary], statuses: Mapping[str, str],
             now: datetime) -> list[dict[str, Any]]:
    """One timeline row per map step, shaped like an attempt row for :func:`views.gantt`: from
    its first item's start to its last item's end (or now), labelled with its item count."""
    rows = []
    for s in summaries.values():
        if s.first_started_at is None:
            continue
        running = s.counts.get("running", 0) + s.counts.get("ready", 0)
        status = statuses.get(s.step, "active")
        rows.append({"step": s.step, "map_index": 0, "attempt": s.tries, "started_at": s.first_started_at,
                     "finished_at": None if running else (s.last_finished_at or now),
                     "outcome": None if running else ("succeeded" if status == "active" else status),
                     "error": None, "label": f"{s.step} ({s.tasks} items)",
                     "what": f"{s.step}: {s.tasks} items, {s.tries} tries"})
    return rows


def rerun_steps(spec_steps: Sequence[Mapping[str, Any]], statuses: Mapping[str, str], *,
                redrive: bool = False) -> list[str]:
    """The steps a repair re-runs, in the stored spec's (topological) order: every degraded,
    failed, timed-out or cancelled step and everything downstream of one (a redrive: the same
    but the degraded ones, which it keeps). The engine decides for real
    (:func:`konduit.core.repair.plan_repair`); this is what the confirmation page announces."""
    rerun: list[str] = []
    bad = REDRIVABLE if redrive else REPAIRABLE
    for step in spec_steps:
        if statuses.get(step["name"]) in bad or any(u in rerun for u in step["after"]):
            rerun.append(step["name"])
    return rerun


def live_state(result: Any, steps: Sequence[Mapping[str, Any]],
               summaries: Mapping[str, MapSummary], dag_details: Mapping[str, str]) -> dict[str, Any]:
    """What the execution page's script needs to update its status cells and DAG nodes in place."""
    return {
        "id": str(result.id), "status": result.status, "finished": result.finished,
        # "word": the word the page shows (konduit.core.words), when the caller worked it out.
        "steps": {s["step"]: {"status": s.get("word") or s["status"],
                              "detail": dag_details.get(s["step"], s["status"]),
                              "map": summaries[s["step"]].to_json() if s["step"] in summaries else None}
                  for s in steps},
    }
