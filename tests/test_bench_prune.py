"""``konduit bench --only prune_day``: the instrument that times pruning a day of history and
counts the dead tuples the prune leaves (small runs on real PostgreSQL; the figures themselves
are docs/benchmarks.md's)."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from konduit.bench.prune import HOT, prune_day
from konduit.bench.suite import BENCHMARKS
from konduit.cli import cli

pytestmark = [pytest.mark.storage]


def test_a_day_of_history_is_pruned_whole_and_its_dead_rows_are_counted(db_url: str) -> None:
    # No autovacuum in this scratch database's tables, so what the prune left is all there
    # when it is counted (300 executions: one batch, one DELETE).
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in HOT:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    found = prune_day(db_url, executions=300, width=4)
    results = found["results"]
    assert results["prune_seconds"] > 0 and results["executions_pruned_per_second"] > 0
    # Every row of the day went (the prune deleted what the fill wrote, cascades included) ...
    with psycopg.connect(db_url) as conn:
        for table in HOT:
            left = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            assert left == (0,), table
    # ... and a DELETE leaves each of them behind as a dead tuple until vacuum comes: the
    # figure a partition drop would bring to zero.
    assert results["dead_tuples_left"] == {
        "konduit_executions": 300, "konduit_steps": 1200, "konduit_tasks": 1200,
        "konduit_attempts": 1200, "konduit_outputs": 1200}
    assert results["dead_tuples_left_total"] == 300 + 4 * 1200


def test_the_benchmarks_help_names_every_benchmark() -> None:
    shown = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=400).output
    text = " ".join(shown.split())
    for name in BENCHMARKS:
        assert name in text, name
