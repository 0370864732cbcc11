"""konduit.testing.DatabasePool: a database handed back is reset to what the migrations left
(no rows but theirs, sequences restarted, no planner statistics) and handed out again under a
new name; one whose schema a test changed is dropped instead."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import konduit.testing
from konduit.db.migrate import migrations
from tests.support.db import rows, value

pytestmark = [pytest.mark.storage]

EVENT = "INSERT INTO konduit_events (name, key) VALUES ('e', 'k') RETURNING id"


@pytest.fixture
def pool(admin_url: str) -> Iterator[konduit.testing.DatabasePool]:
    """A pool of its own (not the suite's), so the counts below are this test's."""
    pool = konduit.testing.DatabasePool(admin_url)
    yield pool
    pool.close()


def test_a_reused_database_is_empty_but_for_the_migrations_rows(pool) -> None:
    with pool.database() as first:
        assert value(first, EVENT) == 1
        rows(first, "DELETE FROM konduit_schema_version WHERE version = 1")
        rows(first, "ANALYZE konduit_events")
        assert value(first, "SELECT count(*) FROM pg_statistic WHERE starelid = "
                            "'konduit_events'::regclass") > 0
    with pool.database() as second:
        assert second != first  # the same database, under a new name
        assert value(second, "SELECT count(*) FROM konduit_events") == 0
        assert value(second, EVENT) == 1  # the identity starts over
        versions = rows(second, "SELECT version, name FROM konduit_schema_version ORDER BY 1")
        assert versions == [(m.version, m.name) for m in migrations()]
        assert value(second, "SELECT count(*) FROM pg_statistic WHERE starelid = "
                             "'konduit_events'::regclass") == 0
    assert (pool.reused, pool.created, pool.not_reset) == (1, 1, [])


FILE = "SELECT relfilenode FROM pg_class WHERE relname = %s"


def test_a_reset_truncates_the_tables_written_and_no_other(pool) -> None:
    """A deleted row still counts as written (its dead version is in the table's file); a
    table no one wrote keeps its file (truncating every table cost 800 ms a test)."""
    with pool.database() as first:
        assert value(first, EVENT) == 1
        rows(first, "DELETE FROM konduit_events")
        files = {t: value(first, FILE, t) for t in ("konduit_events", "konduit_steps")}
    with pool.database() as second:
        assert value(second, FILE, "konduit_events") != files["konduit_events"]
        assert value(second, "SELECT pg_relation_size('konduit_events')") == 0
        assert value(second, FILE, "konduit_steps") == files["konduit_steps"]
    assert (pool.reused, pool.not_reset) == (1, [])


def test_a_database_whose_schema_changed_is_dropped_not_reused(pool) -> None:
    with pool.database() as changed:
        rows(changed, "CREATE INDEX konduit_events_payload ON konduit_events (name, key)")
    with pool.database() as url:
        assert value(url, "SELECT count(*) FROM pg_indexes "
                          "WHERE indexname = 'konduit_events_payload'") == 0
    assert (pool.reused, pool.created) == (0, 2)
    assert [reason.split(": ")[1] for reason in pool.not_reset] == ["the schema changed"]
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(changed).close()


def test_a_connection_left_open_is_cut_and_the_old_name_refused(pool) -> None:
    with pool.database() as first:
        leaked = psycopg.connect(first, autocommit=True)
        leaked.execute("BEGIN")
        leaked.execute("LOCK konduit_events")  # would block the reset's TRUNCATE forever
    with pool.database() as second:
        assert value(second, "SELECT count(*) FROM konduit_events") == 0
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            psycopg.connect(first).close()  # a leaked worker reconnecting finds nothing
    leaked.close()
    assert pool.reused == 1


def test_a_fresh_database_is_new_and_dropped_after(pool) -> None:
    with pool.database() as reused:
        pass
    with pool.database(fresh=True) as fresh:
        assert value(fresh, "SELECT count(*) FROM konduit_schema_version") == len(migrations())
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(fresh).close()
    with pool.database() as again:
        assert again != reused
    assert (pool.reused, pool.created) == (1, 2)



def test_a_fresh_database_asked_first_is_not_the_one_the_pool_reads_its_image_from(pool) -> None:
    """The pool reads what a reset restores from a clone of its own, kept for the next block:
    no backend touched the fresh database (a test counting its commits relies on that)."""
    with pool.database(fresh=True):
        assert pool.created == 2
    with pool.database():
        pass
    assert (pool.created, pool.reused, pool.not_reset) == (2, 1, [])
