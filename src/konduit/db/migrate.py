"""Numbered plain-SQL migrations, tracked in ``konduit_schema_version``."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

from konduit.db.database import Database
from konduit.errors import DatabaseError, SchemaOutdated

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    folder = resources.files("konduit.db") / "migrations"
    found = []
    for entry in folder.iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group("version")), m.group("name"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    return found


def latest_version() -> int:
    return migrations()[-1].version


async def current_version(db: Database) -> int:
    present = await db.one("schema_version_table_exists")
    if not present or not present["present"]:
        return 0
    row = await db.one("schema_version_get")
    return int(row["version"]) if row else 0


async def missing_versions(db: Database) -> list[Migration]:
    """The migrations this konduit has that the database never applied, newest recorded or not
    (a database migrated by a build that had a later migration and not an earlier one)."""
    present = await db.one("schema_version_table_exists")
    if not present or not present["present"]:
        return migrations()
    applied = {int(r["version"]) for r in await db.all("schema_version_list")}
    return [m for m in migrations() if m.version not in applied]


async def migrate(db: Database) -> list[Migration]:
    """Apply every migration the database has not applied, in order, in one transaction, under
    an advisory lock so that concurrent migrators (several workers starting at once) apply each
    exactly once. Returns what was applied.

    A migration older than the newest one applied (a database a development build migrated
    past it) is applied too, with a warning: skipping it, as comparing with the newest version
    alone would, left its tables or functions missing. If it cannot apply there, the error's
    note names it and the transaction takes nothing."""
    async with db.transaction() as tx:
        await tx.one("schema_version_lock")
        await tx.run("schema_version_table_create_if_absent")
        applied_before = {int(r["version"]) for r in await tx.all("schema_version_list")}
        current = max(applied_before, default=0)
        applied = []
        for migration in migrations():
            if migration.version in applied_before:
                continue
            if migration.version < current:
                log.warning("migration %04d_%s was never applied to this database, which has "
                            "migration %04d: applying it now, out of order", migration.version,
                            migration.name, current)
            try:
                await tx.script(migration.sql)
            except DatabaseError as exc:
                exc.add_note(f"in migration {migration.version:04d}_{migration.name}")
                raise
            await tx.run("schema_version_insert", version=migration.version, name=migration.name)
            applied.append(migration)
        return applied


async def reset(db: Database) -> list[Migration]:
    """Drop every konduit table and function and migrate afresh, in one transaction (a
    development database's ``konduit db reset``): all executions and history are gone."""
    async with db.transaction() as tx:
        await tx.one("schema_version_lock")
        await tx.run("schema_version_drop_everything")
    return await migrate(db)


async def ensure_current(db: Database, *, command_hint: str = "konduit db migrate") -> None:
    """Refuse to run against an older schema, or one that lacks a migration this konduit has,
    naming the command that fixes it."""
    current = await current_version(db)
    latest = latest_version()
    if current < latest:
        raise SchemaOutdated(
            f"the database schema is at version {current}, this konduit needs {latest}: "
            f"run `{command_hint}` first"
        )
    missing = [m for m in await missing_versions(db) if m.version <= latest]
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise SchemaOutdated(
            f"the database schema is at version {current} but never applied {names}: "
            f"run `{command_hint}` first (it applies them)"
        )
