"""Durable calls across a real worker crash: a journaled step (and a Pydantic AI agent's run)
whose worker process is SIGKILLed halfway resumes on another worker process without making
again a call that finished (docs/journal.md, docs/ai-agents.md)."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

import konduit
from tests.support.db import rows
from tests.support.waiting import until
from tests.support.workers import kill_workers, reaped, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

APP = "tests.apps.journal_app:app"
LEASE = ("--lease-seconds", "2", "--heartbeat-interval", "0.5")


def _table(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE journal_calls (kind text, n int, attempt int, pid int, "
                     "at timestamptz DEFAULT clock_timestamp())")


def _runs(db_url: str, kind: str) -> Counter[int]:
    """How many times each call of ``kind`` ran live, by its number."""
    return Counter({n: c for n, c in rows(
        db_url, "SELECT n, count(*) FROM journal_calls WHERE kind = %s GROUP BY n", kind)})


def _journal(db_url: str, eid: str) -> list[tuple[int, str, int, int]]:
    return [tuple(r) for r in rows(  # type: ignore[misc]
        db_url, "SELECT seq, name, attempt, replays FROM konduit_journal "
                "WHERE execution_id = %s ORDER BY seq", eid)]


def test_thirty_calls_killed_after_the_seventeenth_resume_at_the_eighteenth(db_url: str) -> None:
    _table(db_url)
    with reaped([]) as procs:
        first = spawn_worker(APP, db_url, *LEASE, concurrency=2)
        procs.append(first)
        with konduit.Client(db_url) as client:
            until(lambda: "journal-thirty" in {w.name for w in client.workflows()}, 60,
                  "the worker's registration")
            eid = str(client.start("journal-thirty", {"dsn": db_url, "stall_after": 17}).id)
            until(lambda: len(_journal(db_url, eid)) == 17, 60, "17 calls recorded")
            assert sum(_runs(db_url, "call").values()) == 17
            kill_workers([first])
            second = spawn_worker(APP, db_url, *LEASE, concurrency=2)
            procs.append(second)
            result = client.wait(eid, timeout=120)
            stop_workers([second])
    assert result.status == "succeeded"
    assert result.output == sum(n * n for n in range(1, 31))
    runs = _runs(db_url, "call")
    # Every call ran once: 1-17 on the killed worker, 18-30 on the second, none again.
    assert runs == Counter(dict.fromkeys(range(1, 31), 1)), runs
    attempts = dict(rows(db_url, "SELECT n, attempt FROM journal_calls WHERE kind = 'call'"))
    assert {n for n, a in attempts.items() if a == 1} == set(range(1, 18))
    assert {n for n, a in attempts.items() if a > 1} == set(range(18, 31))
    journal = _journal(db_url, eid)
    assert [(seq, name) for seq, name, _, _ in journal] == [(n, f"call-{n}") for n in range(1, 31)]
    assert all(replays == 1 for seq, _, _, replays in journal if seq <= 17), journal
    assert all(replays == 0 for seq, _, _, replays in journal if seq > 17), journal


def test_an_agent_run_killed_in_a_tool_call_makes_every_model_request_once(db_url: str) -> None:
    pytest.importorskip("pydantic_ai")
    _table(db_url)
    rounds, stall_at = 6, 4
    with reaped([]) as procs:
        first = spawn_worker(APP, db_url, *LEASE, concurrency=2)
        procs.append(first)
        with konduit.Client(db_url) as client:
            until(lambda: "journal-agent" in {w.name for w in client.workflows()}, 60,
                  "the worker's registration")
            eid = str(client.start("journal-agent", {"dsn": db_url, "rounds": rounds,
                                                     "stall_at": stall_at}).id)
            # Killed inside tool call 4: model requests 1-4 and tool calls 1-3 are recorded.
            until(lambda: _runs(db_url, "tool")[stall_at] == 1, 60, "the stalled tool call")
            assert len(_journal(db_url, eid)) == 2 * stall_at - 1
            kill_workers([first])
            second = spawn_worker(APP, db_url, *LEASE, concurrency=2)
            procs.append(second)
            result = client.wait(eid, timeout=120)
            stop_workers([second])
    assert result.status == "succeeded"
    assert result.output == f"answered after {rounds} lookups"
    models, tools = _runs(db_url, "model"), _runs(db_url, "tool")
    assert models == Counter(dict.fromkeys(range(1, rounds + 2), 1)), models  # each once
    # The tool call the worker died in ran again (it never finished); the others once.
    assert tools == Counter({**dict.fromkeys(range(1, rounds + 1), 1), stall_at: 2}), tools
    names = [name for _, name, _, _ in _journal(db_url, eid)]
    expected = [n for k in range(1, rounds + 1)
                for n in ("researcher:model-request", "researcher:tool:lookup")]
    assert names == [*expected, "researcher:model-request"], names
