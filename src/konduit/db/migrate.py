"""Numbered plain-SQL migrations, tracked in ``konduit_schema_version``."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

from konduit.db.database import Database
from konduit.errors import DatabaseError, SchemaConflict, SchemaGap, SchemaOutdated

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


def schema_conflict(recorded: dict[int, str]) -> SchemaConflict | None:
    """The refusal of a database that recorded, under a number this konduit has, a migration of
    another name, else None. A file renamed since the database applied it and another build's
    migration under the same number (a development branch's) look alike in the record: in the
    second case this konduit's migration was never applied, and taking the number as applied
    would leave it out for good. So konduit refuses, naming both, and says how to go on."""
    known = migrations()
    numbered = {m.name: m.version for m in known}
    clashes = [(m, recorded[m.version]) for m in known
               if m.version in recorded and recorded[m.version] != m.name]
    if not clashes:
        return None
    files = tuple(f"{m.version:04d}_{m.name}.sql" for m, _ in clashes)
    parts = []
    for m, name in clashes:
        part = (f"the database recorded migration {m.version:04d} as {name}, where this konduit "
                f"has {m.version:04d}_{m.name}.sql")
        if name in numbered:
            part += (f" (and {name} is this konduit's {numbered[name]:04d}: another migration, "
                     f"not a renamed file)")
        parts.append(part)
    message = "; ".join(parts) + (
        ": konduit applies no migration to it, since under that number this konduit's "
        "migration may never have been applied.")
    renamed = [(m, name) for m, name in clashes if name not in numbered]
    if renamed:
        updates = "; ".join(f"UPDATE konduit_schema_version SET name = '{m.name}' WHERE "
                            f"version = {m.version}" for m, _ in renamed)
        message += (f" If the file was renamed and is the same migration, rename its record "
                    f"({updates}) and run `konduit db migrate` again.")
    message += (
        " If it is another build's migration (a development branch's): on a development "
        "database `konduit db reset --yes` rebuilds the schema (deleting everything konduit "
        "stored there); otherwise restore a backup from before it, or check "
        f"{', '.join(files)} against the database, apply it yourself and rename its record as "
        "above.")
    return SchemaConflict(message, versions=tuple(m.version for m, _ in clashes),
                          recorded=tuple(name for _, name in clashes), files=files)


def unknown_migrations(recorded: dict[int, str]) -> dict[int, str]:
    """The recorded migrations this konduit does not have (a newer konduit's), number to name."""
    known = {m.version for m in migrations()}
    return {v: name for v, name in sorted(recorded.items()) if v not in known}


def describe_unknown(unknown: dict[int, str]) -> str:
    """One line saying that the database has migrations this konduit does not know."""
    names = ", ".join(f"{v:04d}_{name}" for v, name in unknown.items())
    return (f"the database has migrations this konduit does not know: {names} (a newer konduit "
            f"migrated it); this konduit's schema is {latest_version():04d}, and its workers run "
            f"on the newer one (as during a rolling upgrade): upgrade them to the release with "
            f"these migrations")


def _refusal(recorded: dict[int, str]) -> SchemaOutdated | None:
    return schema_gap(recorded) or schema_conflict(recorded)


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
        refused = _refusal(recorded)
        if refused is not None:
            raise refused
        unknown = unknown_migrations(recorded)
        if unknown:
            log.warning("%s", describe_unknown(unknown))
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


async def ensure_current(db: Database, *,
                         command_hint: str = "konduit db migrate") -> dict[int, str]:
    """Refuse to run against an older schema, naming the command that fixes it, or against one
    with a gap (:class:`~konduit.errors.SchemaGap`: a migration never applied below the newest
    recorded) or another migration under one of this konduit's numbers
    (:class:`~konduit.errors.SchemaConflict`), which ``konduit db migrate`` refuses too. A
    schema newer than this konduit's is accepted: returns the migrations it has that this
    konduit does not know (:func:`unknown_migrations`), for the caller to say."""
    recorded = await recorded_versions(db)
    refused = _refusal(recorded)
    if refused is not None:
        raise refused
    current = max(recorded, default=0)
    latest = latest_version()
    if current < latest:
        raise SchemaOutdated(
            f"the database schema is at version {current}, this konduit needs {latest}: "
            f"run `{command_hint}` first"
        )
    return unknown_migrations(recorded)
