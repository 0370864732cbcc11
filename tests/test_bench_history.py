"""The history's benchmarks (issue 30 point 4) in small shapes: ``prune_day``'s history side
drops the day's partitions and leaves nothing in the hot tables, ``history_load`` runs the load on
its three databases, and the soak with ``history_after`` reports the hot tables' dead tuples.
The figures themselves are docs/benchmarks.md's."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from konduit.bench.history_load import VARIANTS, history_load
from konduit.bench.prune import HOT, history_partitions, prune_day
from konduit.bench.soak import SoakSettings, dead_tuple_trend, slope_per_minute
from konduit.bench.suite import Server, run_bench
from konduit.cli import cli
from konduit.errors import BenchError

pytestmark = [pytest.mark.storage]


def test_the_history_side_of_prune_day_drops_partitions_and_leaves_no_dead_tuples(
        db_url: str) -> None:
    # No autovacuum here: what the move and the prune leave is all there when it is counted.
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in HOT:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    found = prune_day(db_url, executions=300, width=4)
    rows = 300 + 4 * 1200
    # The row deletes: every row of the day a dead tuple.
    assert found["results"]["dead_tuples_left_total"] == rows
    assert found["results"]["rows_deleted_in_hot_tables"] == rows
    history = found["results"]["history"]
    # The move deletes what it copies: the same dead tuples, left by the move instead ...
    assert history["move_dead_tuples_left_total"] == rows
    assert history["move_rows_deleted_in_hot_tables"] == rows
    assert history["move_seconds"] > 0 and history["vacuum_after_move_seconds"] > 0
    # ... and the prune drops the day's partitions, one per history table, deleting no row
    # of the hot tables: no dead tuple left there.
    assert history["partitions_dropped"] == 12
    assert history["rows_deleted_in_hot_tables"] == 0
    assert history["dead_tuples_left"] == {table: 0 for table in HOT}
    assert history["dead_tuples_left_total"] == 0
    assert history_partitions(db_url) == []
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_executions_all").fetchone() == (0,)
    assert set(found["ratios"]) == {"row_deletes_over_partition_drop",
                                    "partition_drop_over_row_deletes", "move_over_row_deletes"}
    assert found["ratios"]["row_deletes_over_partition_drop"] > 0


@pytest.mark.timeout(300)
def test_history_load_runs_the_load_beside_a_history_and_beside_the_same_rows_hot(
        admin_url: str) -> None:
    server = Server(admin_url)
    found = history_load(server.fresh_database, server.copy_of, history=300, executions=4,
                         fill_width=2, days=3, repeats=1, warm=1)
    results = found["results"]
    # The three databases as intended: the history in three days' partitions, the same
    # executions hot in the other, nothing in the empty one.
    assert results["databases"]["history"]["executions_history"] == 300
    assert results["databases"]["history"]["executions_hot"] == 0
    assert results["databases"]["history"]["tasks_hot"] == 0
    assert results["databases"]["history"]["tasks_history"] == 600
    assert results["databases"]["history"]["history_days"] == 3
    assert results["databases"]["hot"]["executions_hot"] == 300
    assert results["databases"]["hot"]["executions_history"] == 0
    assert results["databases"]["empty"]["executions_hot"] == 0
    for name in VARIANTS:
        assert results[f"{name}_tasks_per_second"] > 0
        assert len(results["runs_tasks_per_second"][name]) == 1
        assert results["runs_failed"][name] == []
    assert set(found["ratios"]) == {"history_over_empty", "hot_over_empty", "history_over_hot"}
    assert all(v is not None and v > 0 for v in found["ratios"].values())
    assert found["parameters"]["history_rows"] == 300 * 9
    # Every scratch database went with the run (the copy too).
    with psycopg.connect(admin_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s",
                            (f"konduit_bench_{__import__('os').getpid()}_%",)).fetchone()
    assert left == (0,)


@pytest.mark.timeout(300)
def test_the_soak_with_history_after_moves_and_reports_the_dead_tuple_series(
        admin_url: str) -> None:
    settings = SoakSettings(duration=6, window=2, rate=5, retention=30, burst=0,
                            history_after=4)
    report = run_bench(admin_url, only=["soak"], soak=settings)
    soak = report["benchmarks"]["soak"]
    params, results = soak["parameters"], soak["results"]
    assert (params["history_after"], params["history_interval"]) == (4, 1.0)
    assert "soak_history_app_30_4" in params["worker"]
    # Executions moved into the history while the load ran.
    assert results["executions_moved"] > 0
    assert results["executions_not_succeeded"] == 0
    trend = results["dead_tuples"]
    assert len(trend["series"]) == 3
    for point in trend["series"]:
        assert point["dead"] >= 0 and point["live"] > 0 and 0 <= point["dead_fraction"] <= 1
        assert set(point["by_table"]) == {t.removeprefix("konduit_") for t in HOT}
    assert isinstance(trend["grows"], bool) and trend["slope_per_minute"] is not None
    for w in results["windows"]:
        assert w["executions_moved_so_far"] == w["state"]["executions_in_history"]


def test_the_dead_tuple_trend_tells_growth_from_a_sawtooth() -> None:
    def windows(dead: list[int]) -> list[dict[str, object]]:
        return [{"from_s": 30.0 * i, "state": {"dead_rows": d, "live_rows": 1000,
                                               "dead_tuples": {"tasks": d}}}
                for i, d in enumerate(dead)]

    assert slope_per_minute([(0.0, 0.0), (30.0, 10.0), (60.0, 20.0)]) == 20.0
    growing = dead_tuple_trend(windows([100, 400, 800, 1200, 1600, 2000]), 2)
    assert growing["grows"] is True and growing["last_over_first"] == 7.2
    assert growing["slope_per_minute"] > 0
    # Vacuum's sawtooth: up and down again, the last windows no higher than the first.
    sawtooth = dead_tuple_trend(windows([500, 2000, 100, 1500, 300, 2100]), 2)
    assert sawtooth["grows"] is False and sawtooth["max"] == 2100
    assert dead_tuple_trend(windows([0, 0, 3, 0]), 1)["grows"] is False
    # A sawtooth that starts from an empty database: the first span's mean is low, but the
    # peaks do not rise.
    ramp = dead_tuple_trend(windows([6000, 30000, 172000, 73000, 157000, 32000]), 2)
    assert ramp["last_over_first"] > 1.1 and ramp["grows"] is False
    assert (ramp["first_half_max"], ramp["second_half_max"]) == (172000, 157000)


def test_the_soak_refuses_a_history_after_shorter_than_two_windows() -> None:
    with pytest.raises(BenchError, match="--history-after"):
        SoakSettings(window=30, history_after=45).resolved().validate()
    with pytest.raises(BenchError, match="shorter than the retention"):
        SoakSettings(window=30, history_after=120).resolved().validate()
    resolved = SoakSettings(history_after=60).resolved()
    assert resolved.history_interval == 15 and resolved.history_after == 60
    resolved.validate()
    assert SoakSettings().resolved().history_interval is None


def test_the_benchmarks_help_names_the_history_options() -> None:
    shown = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=400).output
    text = " ".join(shown.split())
    for option in ("--history-after", "--history-executions", "--prune-executions",
                   "history_load"):
        assert option in text, option


def test_the_search_bench_finds_executions_in_the_history_too(db_url: str) -> None:
    """``konduit bench --only search_history``: the older half of the filled executions moved
    into the history; every kind of search still finds what it looks for (the bench checks it)
    and reads each side through its index."""
    from konduit.bench import search

    report = search.search(db_url, executions=4_000, repeats=3, history_fraction=0.5)
    found = report["results"]
    assert 1_500 <= found["history_executions"] <= 2_500, found["history_executions"]
    assert found["history_days"] >= 1
    for kind in ("tag", "key", "input"):
        indexes = found["server"][kind]["indexes"]
        assert any(i.startswith("konduit_history_executions_p") for i in indexes), (kind, indexes)
        assert any(i.startswith("konduit_executions_") for i in indexes), (kind, indexes)
