"""One word, one meaning (konduit.core.words) and what the execution page says about each
unfinished task (konduit.web.why), without a database; the workers page's order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from konduit.core.words import step_word
from konduit.records import OpenTask
from konduit.web.ops import STOPPED_SHOWN, shown_workers
from konduit.web.why import explain, step_words, wait_spans

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CHILD = UUID("01a2337b-0000-7000-8000-0000aaaa1111")


def task(step: str, status: str, **fields: Any) -> OpenTask:
    row = {"id": 1, "step": step, "map_index": 0, "generation": 1, "status": status,
           "attempt": 1, "max_attempts": 3, "worker_id": None, "run_at": None,
           "deadline_at": None, "started_at": None, "finished_at": None, "wait_kind": None,
           "wait_event": None, "wait_key": None, "wait_until": None, "wait_child": None,
           "waiting_since": None, "worker_hostname": None, "worker_pid": None,
           "heartbeat_age": None, "in_backoff": False} | fields
    return OpenTask.from_row(row)


def test_a_step_not_reached_is_pending_and_a_started_one_says_what_it_does() -> None:
    assert step_word("waiting") == "pending"  # stored 'waiting': not reached yet
    assert step_word("active", [("waiting", False)]) == "waiting"
    assert step_word("active", [("ready", True)]) == "retrying"
    assert step_word("active", [("ready", False)]) == "ready"
    assert step_word("active", [("waiting", False), ("running", False)]) == "running"
    assert step_word("active") == "running"
    assert step_word("succeeded") == "succeeded"


def test_each_kind_of_wait_and_a_running_task_are_explained() -> None:
    tasks = [
        task("review", "waiting", wait_kind="event", wait_event="doc-approved", wait_key="doc-1",
             deadline_at=NOW + timedelta(hours=1), waiting_since=NOW - timedelta(minutes=3)),
        task("pause", "waiting", wait_kind="timer", wait_until=NOW + timedelta(seconds=30),
             waiting_since=NOW - timedelta(seconds=5)),
        task("thumbs", "waiting", wait_kind="child", wait_child=CHILD, waiting_since=NOW),
        task("render", "running", attempt=2, worker_hostname="host-a", worker_pid=42,
             heartbeat_age=1.5, started_at=NOW - timedelta(seconds=12)),
        task("fetch", "ready", attempt=1, in_backoff=True, run_at=NOW + timedelta(minutes=2)),
        task("done", "succeeded", wait_kind="timer", waiting_since=NOW - timedelta(minutes=1),
             finished_at=NOW - timedelta(seconds=20)),
    ]
    whys = {w.step: w for w in explain(tasks, {"render": 4.0}, NOW)}
    assert set(whys) == {"review", "pause", "thumbs", "render", "fetch"}
    review = whys["review"]
    assert (review.word, review.event, review.key) == ("waiting", "doc-approved", "doc-1")
    assert review.deadline_at == NOW + timedelta(hours=1) and not review.received
    assert whys["pause"].until == NOW + timedelta(seconds=30)
    assert whys["thumbs"].child == CHILD and whys["thumbs"].until is None
    render = whys["render"]
    assert (render.word, render.worker, render.attempt) == ("running", "host-a:42", 2)
    assert render.elapsed == 12.0 and render.usual_p95 == 4.0 and render.heartbeat_age == 1.5
    assert whys["fetch"].word == "retrying" and whys["fetch"].retry_at == NOW + timedelta(minutes=2)
    steps = [{"step": s, "status": "active"} for s in whys] + [{"step": "later", "status": "waiting"}]
    words = step_words(steps, tasks)
    assert words == {"review": "waiting", "pause": "waiting", "thumbs": "waiting",
                     "render": "running", "fetch": "retrying", "later": "pending"}
    spans = {s.step: s for s in wait_spans(tasks)}
    assert spans["review"].ended_at is None and "'doc-1'" in spans["review"].what
    assert spans["done"].ended_at == NOW - timedelta(seconds=20)


def test_the_workers_page_lists_live_workers_first_and_hides_long_stopped_ones() -> None:
    workers = [{"id": "old", "state": "stopped", "heartbeat_age": STOPPED_SHOWN + 60},
               {"id": "recent", "state": "stopped", "heartbeat_age": 30.0},
               {"id": "dead", "state": "dead", "heartbeat_age": 90.0},
               {"id": "live-2", "state": "alive", "heartbeat_age": 2.0},
               {"id": "live-1", "state": "alive", "heartbeat_age": 0.5}]
    shown, hidden = shown_workers(workers, everything=False)
    assert [w["id"] for w in shown] == ["live-1", "live-2", "dead", "recent"] and hidden == 1
    everything, none_hidden = shown_workers(workers, everything=True)
    assert [w["id"] for w in everything][-1] == "old" and none_hidden == 0


def test_the_attempts_of_a_repair_are_marked_on_the_timeline() -> None:
    from konduit.web.views import gantt

    def attempt(generation: int, at: int) -> dict[str, Any]:
        return {"step": "flaky", "map_index": 0, "attempt": 1, "generation": generation,
                "started_at": NOW + timedelta(seconds=at), "outcome": "succeeded",
                "finished_at": NOW + timedelta(seconds=at + 1), "error": None}

    chart = gantt([attempt(1, 0), attempt(2, 5)], [], NOW, NOW + timedelta(seconds=10))
    first, repaired = chart.bars
    assert (first.generation, first.label) == (1, "flaky #1")
    # A repair's or a redrive's run: the second generation of the step's task.
    assert (repaired.generation, repaired.label) == (2, "flaky #1 gen 2")
    assert "gen 2" in repaired.title
