"""The metrics to scale workers on: per queue and workflow, the tasks ready to run now, those
delayed (a backoff, a start time), those running, and the age of the oldest ready one
(docs/scaling.md, "Autoscaling workers").

A queue that emptied is still reported, at 0, for as long as the exporter runs: an autoscaler
(KEDA, an HPA on an external metric) reads a series that vanished as "no data", not as "no
work", and would not scale down.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from konduit.db.database import Row

LABELS = ("queue", "workflow")
COLUMNS = ("ready", "delayed", "running", "oldest_ready_age")


class QueueSeries:
    """The (queue, workflow) pairs seen since the exporter started, so that an emptied queue
    reads 0 instead of disappearing."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def families(self, rows: Sequence[Row]) -> list[Metric]:
        """The families of one scrape from the rows of ``task_count_live_by_queue``."""
        now = {(r["queue"], r["workflow"]): r for r in rows}
        self.seen |= set(now)
        zero = dict.fromkeys(COLUMNS, 0)
        return queue_families([{"queue": q, "workflow": w, **(now.get((q, w)) or zero)}
                               for q, w in sorted(self.seen)])


def queue_families(rows: Sequence[Row]) -> list[Metric]:
    """``konduit_queue_ready_tasks``, ``konduit_queue_delayed_tasks``,
    ``konduit_queue_running_tasks`` and ``konduit_queue_oldest_ready_age_seconds``, labelled by
    queue and workflow (sum or max them over workflows for a whole queue)."""
    specs = (
        ("konduit_queue_ready_tasks", "ready",
         "Tasks of a queue ready to run now (due, not claimed): the backlog to scale workers on."),
        ("konduit_queue_delayed_tasks", "delayed",
         "Ready tasks of a queue not due yet (waiting out a retry backoff or a start time)."),
        ("konduit_queue_running_tasks", "running", "Tasks of a queue running now (claimed)."),
        ("konduit_queue_oldest_ready_age_seconds", "oldest_ready_age",
         "Seconds the oldest task ready to run has waited to be claimed (0 when none)."),
    )
    families: list[Metric] = []
    for name, column, doc in specs:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        for r in rows:
            family.add_metric((r["queue"], r["workflow"]), float(r[column] or 0))
        families.append(family)
    return families
