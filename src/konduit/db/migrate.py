"""Numbered plain-SQL migrations, tracked in ``konduit_schema_version``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from konduit.db.database import Database
from konduit.errors import DatabaseError, SchemaGap, SchemaOutdated

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


async def recorded_versions(db: Database) -> dict[int, str]:
    """The migrations the database recorded, number to name (none when it was never
    migrated)."""
    present = await db.one("schema_version_table_exists")
    if not present or not present["present"]:
        return {}
    return {int(r["version"]): str(r["name"]) for r in await db.all("schema_version_list")}


def schema_gap(recorded: dict[int, str]) -> SchemaGap | None:
    """The refusal of a database that recorded a migration newer than one of this konduit's it
    never applied (a build with other migrations, a development branch's, migrated it), else
    None. Recorded numbers this konduit does not have (a newer konduit's) are no gap."""
    newest = max(recorded, default=0)
    known = migrations()
    missing = [m for m in known if m.version < newest and m.version not in recorded]
    if not missing:
        return None
    files = tuple(f"{m.version:04d}_{m.name}.sql" for m in missing)
    later = min(v for v in recorded if v > missing[0].version)
    # A migration renumbered since the database was migrated (a branch's migration moved to a
    # free number): the database has it, under its old number.
    numbered = {name: v for v, name in recorded.items()}
    moved = [(m, numbered[m.name]) for m in missing if m.name in numbered]
    unmoved = [m for m in missing if m.name not in numbered]
    message = (
        f"the database recorded migration {newest:04d} but never applied {', '.join(files)}: "
        f"konduit applies no migration to it, since one applied after later ones could undo "
        f"them."
    )
    for m, old in moved:
        message += (
            f" It recorded {m.name} as {old:04d}, which this konduit numbers {m.version:04d}: if "
            f"it is the same migration, renumber its record (UPDATE konduit_schema_version SET "
            f"version = {m.version} WHERE version = {old}) and run `konduit db migrate` again."
        )
    message += (
        f" A development database: `konduit db reset --yes` rebuilds the schema (deleting "
        f"everything konduit stored there). Otherwise restore a backup from before migration "
        f"{later:04d}"
    )
    if unmoved:
        names = ", ".join(f"{m.version:04d}_{m.name}.sql" for m in unmoved)
        records = ", ".join(f"({m.version}, '{m.name}')" for m in unmoved)
        message += (
            f", or check {names} against the migrations after it, apply it yourself and record "
            f"it (INSERT INTO konduit_schema_version (version, name) VALUES {records}), then "
            f"run `konduit db migrate` again"
        )
    return SchemaGap(message, versions=tuple(m.version for m in missing), files=files,
                     newest=newest)


async def migrate(db: Database) -> list[Migration]:
    """Apply every migration the database has not applied, in order, in one transaction, under
    an advisory lock so that concurrent migrators (several workers starting at once) apply each
    exactly once. Returns what was applied.

    A database that recorded a migration newer than one it never applied (a build with other
    migrations migrated it) is refused with :class:`~konduit.errors.SchemaGap` naming the
    missing ones, and nothing is applied: applied now, after the later ones, a missing migration
    could undo what they did (an older definition of a function replacing a newer one). Recorded
    migrations this konduit does not have (a newer konduit's) are left alone, as before. A
    migration that cannot apply has its name in the error's note, and the transaction takes
    nothing."""
    async with db.transaction() as tx:
        await tx.one("schema_version_lock")
        await tx.run("schema_version_table_create_if_absent")
        recorded = {int(r["version"]): str(r["name"])
                    for r in await tx.all("schema_version_list")}
        gap = schema_gap(recorded)
        if gap is not None:
            raise gap
        applied = []
        for migration in migrations():
            if migration.version in recorded:
                continue
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
    """Refuse to run against an older schema, naming the command that fixes it, or against one
    with a gap (:class:`~konduit.errors.SchemaGap`: a migration never applied below the newest
    recorded, which ``konduit db migrate`` refuses too). A schema newer than this konduit's is
    accepted."""
    recorded = await recorded_versions(db)
    gap = schema_gap(recorded)
    if gap is not None:
        raise gap
    current = max(recorded, default=0)
    latest = latest_version()
    if current < latest:
        raise SchemaOutdated(
            f"the database schema is at version {current}, this konduit needs {latest}: "
            f"run `{command_hint}` first"
        )
