"""src/konduit/db/schema.sql, the current schema in one file, is what the migrations give: the
file is what a migrated database's catalogs render to (on PostgreSQL 15 as on 18), and applied
to an empty database it gives the same catalogs as the migrations, down to every column of
their rows (konduit.db.schema)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from importlib import resources

import psycopg
import pytest

import konduit
import konduit.testing
from konduit.db.migrate import _FILE as _MIGRATION_FILE
from konduit.db.migrate import latest_version, migrations
from konduit.db.queries import _HEADER as _QUERY_HEADER
from konduit.db.schema import REGENERATE, SCHEMA_FILE, VERSION_TABLE, Unsupported, catalog_facts, render

pytestmark = pytest.mark.storage


@pytest.fixture(scope="module")
def migrated_url(admin_url: str) -> Iterator[str]:
    """A new database that applied every migration, as `konduit db migrate` does."""
    with konduit.testing.fresh_database(admin_url, migrate=False) as url:
        with konduit.App([], database_url=url) as app:
            assert len(app.migrate()) == len(migrations())
        yield url


def _differences(expected: list[str], found: list[str], expected_name: str,
                 found_name: str, *, context: int = 3, limit: int = 120) -> str:
    lines = list(difflib.unified_diff(expected, found, expected_name, found_name,
                                      n=context, lineterm=""))
    more = f"\n... and {len(lines) - limit} lines more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def test_the_file_is_what_the_migrations_give(migrated_url: str) -> None:
    with psycopg.connect(migrated_url) as conn:
        rendered = render(conn)
    written = SCHEMA_FILE.read_text()
    if rendered != written:
        pytest.fail(
            f"{SCHEMA_FILE.name} is not what the migrations give: run `{REGENERATE}` and "
            f"commit the file.\n"
            + _differences(written.splitlines(), rendered.splitlines(),
                           f"{SCHEMA_FILE.name} as written", "as the migrations give it"),
            pytrace=False)


def test_the_file_applied_to_an_empty_database_gives_the_migrated_schema(
        migrated_url: str, empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(SCHEMA_FILE.read_bytes())
    with psycopg.connect(migrated_url) as migrated, psycopg.connect(empty_db_url) as applied:
        expected, found = catalog_facts(migrated), catalog_facts(applied)
        if found != expected:
            pytest.fail(
                f"{SCHEMA_FILE.name} applied to an empty database gives another schema than "
                f"the migrations (catalog rows, one an object):\n"
                + _differences(expected, found, "migrated", f"from {SCHEMA_FILE.name}",
                               context=0),
                pytrace=False)
        assert render(applied) == render(migrated)
        versions = f"SELECT version, name FROM {VERSION_TABLE} ORDER BY version"
        assert applied.execute(versions).fetchall() == migrated.execute(versions).fetchall()
    with konduit.App([], database_url=empty_db_url) as app:
        assert app.migrate() == []  # every migration is recorded as applied


def test_what_the_file_cannot_say_is_refused(empty_db_url: str) -> None:
    """An object the renderer cannot write fails the rendering by name: it is not left out."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("CREATE TYPE konduit_mood AS ENUM ('calm', 'busy')")
        with pytest.raises(Unsupported, match="type konduit_mood"):
            render(conn)


def test_the_file_is_shipped_and_read_by_nothing_at_run_time() -> None:
    """Beside migrations/ and sql/, not in them: neither a migration (``NNNN_name.sql`` in
    migrations/) nor a file of named queries (sql/schema.sql is one, about the version table)."""
    shipped = resources.files("konduit.db") / "schema.sql"
    assert shipped.is_file()
    text = shipped.read_text()
    assert f"migration {latest_version():04d} ({migrations()[-1].name})" in text.splitlines()[0]
    assert not _MIGRATION_FILE.match("schema.sql")
    assert not _QUERY_HEADER.search(text)
