"""Write src/konduit/db/schema.sql, the current schema in one file, from a database that applied
every migration (see konduit.db.schema)::

    python scripts/schema_dump.py            # write the file
    python scripts/schema_dump.py --check    # exit 1 with the difference if it is out of date

The database is a new one on the test server (``KONDUIT_TEST_DATABASE_URL``, else the embedded
server; ``--url`` names another), migrated and dropped at the end. The file written is the one
beside the migrations of the konduit imported (run with ``PYTHONPATH=src`` from a checkout
other than the installed one).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

import psycopg

import konduit
import konduit.testing
from konduit.db.schema import SCHEMA_FILE, render


def migrated_schema(admin_url: str | None) -> str:
    """schema.sql's text, rendered from a new database that applied every migration."""
    with konduit.testing.fresh_database(admin_url, migrate=False) as url:
        with konduit.App([], database_url=url) as app:
            app.migrate()
        with psycopg.connect(url) as conn:
            return render(conn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 showing the difference if the file is stale")
    parser.add_argument("--url", default=os.environ.get("KONDUIT_TEST_DATABASE_URL"),
                        help="a server URL whose user may create databases "
                             "(default: KONDUIT_TEST_DATABASE_URL, else the embedded server)")
    args = parser.parse_args(argv)
    text = migrated_schema(args.url)
    current = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if args.check:
        if text == current:
            print(f"{SCHEMA_FILE} is up to date")
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(keepends=True), text.splitlines(keepends=True),
            f"{SCHEMA_FILE} (as it is)", "(as the migrations give it)"))
        return 1
    if text == current:
        print(f"{SCHEMA_FILE} is up to date")
    else:
        SCHEMA_FILE.write_text(text)
        print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
