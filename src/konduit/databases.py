"""A database of its own on the same server, for what should not write into yours.

``konduit demo`` runs in ``konduit_demo`` and the scripts of ``examples/`` in
``konduit_examples``: on the server of ``KONDUIT_DATABASE_URL`` (or ``--database-url``), else on
the embedded server, never in the database those name. Their executions, schedules, workers and
workflow versions stay out of your dashboard and ``konduit versions``, and go with one
``DROP DATABASE`` (``konduit demo --clean``)::

    import konduit
    from konduit.databases import own_database

    app = konduit.App([wf], database_url=own_database("konduit_examples"))
"""

from __future__ import annotations

import logging
import re

from konduit.errors import DatabaseError, KonduitError, SchemaConflict, SchemaGap
from konduit.settings import settings

log = logging.getLogger(__name__)

DEMO_DATABASE = "konduit_demo"
"""Where ``konduit demo`` runs."""
EXAMPLES_DATABASE = "konduit_examples"
"""Where the scripts of ``examples/`` run."""

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise KonduitError(f"database name {name!r}: lowercase letters, digits and underscores, "
                           f"at most 63, not starting with a digit")
    return name


def _server(url: str | None) -> str | None:
    """The URL that names the server (the argument, else ``KONDUIT_DATABASE_URL``); None for
    the embedded server."""
    return url or settings().database_url or None


def _database_of(url: str) -> str | None:
    from psycopg.conninfo import conninfo_to_dict

    name = conninfo_to_dict(url).get("dbname")
    return None if name is None else str(name)


def own_database(name: str, url: str | None = None, *, migrate: bool = True,
                 _remade: bool = False) -> str:
    """The URL of database ``name`` on the server of ``url`` (default: ``KONDUIT_DATABASE_URL``,
    else the embedded server), created when it does not exist and, with ``migrate``, given
    konduit's schema. The user of ``url`` needs the right to create databases the first time
    (``CREATEDB``); the error says so otherwise. A database of its own that another konduit
    build migrated past what this one can migrate (a migration missing below its newest, or
    another migration under one of this konduit's numbers: :class:`~konduit.SchemaGap`,
    :class:`~konduit.SchemaConflict`) is dropped and made again, with a warning."""
    import psycopg

    from konduit.db.embedded import server_url, with_database

    _checked(name)
    server = _server(url)
    if server is None:
        target = server_url(name)  # created when missing; migrated on first use
    else:
        target = with_database(server, name)
        if _database_of(server) != name:
            try:
                with psycopg.connect(server, autocommit=True, connect_timeout=10) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                          (name,)).fetchone()
                    if not exists:
                        try:
                            conn.execute(f'CREATE DATABASE "{name}"')
                        except psycopg.errors.DuplicateDatabase:
                            pass  # another process made it just now
                        except psycopg.errors.UniqueViolation:
                            pass  # the same race, reported by the catalog
            except psycopg.errors.InsufficientPrivilege as exc:
                raise DatabaseError(
                    f"cannot create database {name} on the server of KONDUIT_DATABASE_URL "
                    f"(--database-url): {exc}; create it once as a user who may "
                    f"(CREATE DATABASE {name}) and run again") from None
            except psycopg.Error as exc:
                raise DatabaseError(f"cannot reach the server to create database {name}: "
                                    f"{' '.join(str(exc).split())}") from None
    if migrate:
        from konduit.app import App

        try:
            with App([], database_url=target) as app:
                app.migrate()
        except (SchemaGap, SchemaConflict) as exc:
            if _remade or (server is not None and _database_of(server) == name):
                raise  # the database the URL names is not one of its own: never dropped
            # Another konduit build (a development branch's, with other migrations) made this
            # database of its own, which holds only what its runs put there: made again, rather
            # than refusing every run until someone drops it by hand.
            log.warning("database %s was migrated by another konduit build and cannot be "
                        "migrated by this one (%s): dropped and made again", name,
                        " ".join(str(exc).split())[:200])
            drop_own_database(name, url)
            return own_database(name, url, migrate=True, _remade=True)
    return target


def drop_own_database(name: str, url: str | None = None) -> bool:
    """Drop database ``name`` on the server of ``url`` (as :func:`own_database` finds it),
    closing its connections; False when there was none. Refuses to drop the database ``url``
    (or ``KONDUIT_DATABASE_URL``, or the embedded server's default) names itself."""
    import psycopg

    from konduit.db import embedded

    _checked(name)
    server = _server(url)
    if server is None:
        if name == embedded.DEFAULT_DATABASE:
            raise KonduitError(f"{name} is the embedded server's default database: not dropped "
                               f"(konduit db reset empties it)")
        admin = embedded.server_url("postgres")
    else:
        if _database_of(server) == name:
            raise KonduitError(f"{name} is the database KONDUIT_DATABASE_URL (--database-url) "
                               f"names: not dropped (konduit db reset empties it)")
        admin = server
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        existed = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if existed:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if server is None:
        embedded.forget_database(name)
    return existed is not None


__all__ = ["DEMO_DATABASE", "EXAMPLES_DATABASE", "drop_own_database", "own_database"]
