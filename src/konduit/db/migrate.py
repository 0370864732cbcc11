"""Numbered plain-SQL migrations, tracked in ``konduit_schema_version``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from konduit.db.database import Database
from konduit.errors import SchemaOutdated

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


async def migrate(db: Database) -> list[Migration]:
    """Apply every migration newer than the database's, in one transaction, under an advisory
    lock so that concurrent migrators (several workers starting at once) apply each exactly once.
    Returns what was applied."""
    async with db.transaction() as tx:
        await tx.one("schema_version_lock")
        await tx.run("schema_version_table_create_if_absent")
        row = await tx.one("schema_version_get")
        current = int(row["version"]) if row else 0
        applied = []
        for migration in migrations():
            if migration.version <= current:
                continue
            await tx.script(migration.sql)
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
    """Refuse to run against an older schema, naming the command that fixes it."""
    current = await current_version(db)
    latest = latest_version()
    if current < latest:
        raise SchemaOutdated(
            f"the database schema is at version {current}, this konduit needs {latest}: "
            f"run `{command_hint}` first"
        )
