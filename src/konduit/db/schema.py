"""The current schema in one file: ``konduit/db/schema.sql``, written from a migrated database.

The migrations (``migrations/NNNN_*.sql``) are how a database gets its schema; what they add up
to is read here from the catalogs of a database that applied them all, and written as plain SQL
one can read (and apply to an empty database, to the same effect). ``scripts/schema_dump.py``
writes the file; tests/test_schema_file.py fails when it and the migrations disagree.

Two readings of a database's schema:

- :func:`render`: ``schema.sql``'s text. The same on PostgreSQL 15 and 18 (what the catalogs
  of one version say and the other's do not, such as PostgreSQL 18's NOT NULL constraints, is
  left out, and names are not qualified with the schema), so one file stands for both.
- :func:`catalog_facts`: every column of the catalog rows of the schema's objects, one line per
  object, for comparing two databases on the same server: what :func:`render` does not write
  (an option it does not know yet) shows there. Object ids, column numbers, statistics and
  parse trees (which hold positions in the SQL text that created them) are replaced by names
  and definitions.

Views are written as PostgreSQL deparses them, which changed between versions (PostgreSQL 16
stopped qualifying the columns of a one-table view): Konduit has none, the first one may need
its text normalized here for the file to be the same on 15 and 18.

Kinds of objects :func:`render` cannot write yet (enums, domains, policies, extensions, ...)
are refused by name: :class:`Unsupported`.

The file is neither a migration (not named ``NNNN_name.sql``) nor in ``sql/`` (the named
queries), so nothing loads it at run time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

SCHEMA_FILE = Path(__file__).with_name("schema.sql")
VERSION_TABLE = "konduit_schema_version"
REGENERATE = "python scripts/schema_dump.py"

_WIDTH = 100  # a rendered index or trigger longer than this is wrapped


class Unsupported(Exception):
    """The schema holds objects :func:`render` does not know how to write."""


# -- reading the catalogs ---------------------------------------------------------------------

_UNSUPPORTED = """
WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
SELECT what FROM (
    SELECT format('%s %s', CASE c.relkind WHEN 'm' THEN 'materialized view'
                                          WHEN 'f' THEN 'foreign table'
                                          WHEN 'c' THEN 'composite type' END, c.relname)
    FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('m', 'f', 'c')
    UNION ALL
    SELECT format('type %s (typtype %s)', t.typname, t.typtype) FROM pg_type t
    WHERE t.typnamespace = (SELECT oid FROM ns) AND t.typtype NOT IN ('c', 'b')
    UNION ALL
    SELECT format('row security on %s', c.relname) FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND (c.relrowsecurity OR c.relforcerowsecurity)
    UNION ALL
    SELECT format('replica identity %s of %s', c.relreplident, c.relname) FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind = 'r' AND c.relreplident NOT IN ('d', 'f', 'n')
    UNION ALL
    SELECT format('privileges on %s', c.relname) FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relacl IS NOT NULL
    UNION ALL
    SELECT format('privileges on %s', p.oid::regprocedure) FROM pg_proc p
    WHERE p.pronamespace = (SELECT oid FROM ns) AND p.proacl IS NOT NULL
    UNION ALL
    SELECT format('%s %s', CASE p.prokind WHEN 'a' THEN 'aggregate'
                                          ELSE 'routine kind ' || p.prokind::text END,
                  p.oid::regprocedure)
    FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns) AND p.prokind NOT IN ('f', 'p')
    UNION ALL
    SELECT format('rule %s on %s', r.rulename, c.relname)
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
    WHERE c.relnamespace = (SELECT oid FROM ns) AND r.rulename <> '_RETURN'
    UNION ALL
    SELECT format('trigger %s on %s (enabled %s)', t.tgname, c.relname, t.tgenabled)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT t.tgisinternal AND t.tgenabled <> 'O'
    UNION ALL
    SELECT format('policy %s', polname) FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
    WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT format('statistics object %s', stxname) FROM pg_statistic_ext
    WHERE stxnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT format('inheritance %s of %s', inhrelid::regclass, inhparent::regclass) FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT format('extension %s', extname) FROM pg_extension WHERE extname <> 'plpgsql'
    UNION ALL
    SELECT format('operator %s', oid::regoperator) FROM pg_operator WHERE oprnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT format('collation %s', collname) FROM pg_collation WHERE collnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT format('comment on %s', pg_describe_object(d.classoid, d.objoid, d.objsubid))
    FROM pg_description d
    WHERE (pg_identify_object(d.classoid, d.objoid, d.objsubid)).schema = current_schema()
      AND d.classoid NOT IN ('pg_class'::regclass, 'pg_proc'::regclass, 'pg_constraint'::regclass,
                             'pg_trigger'::regclass)
) found (what)
ORDER BY what
"""

_RELATIONS = """
SELECT c.oid, c.relname AS name, quote_ident(c.relname) AS q, c.relkind AS kind,
       c.relpersistence AS persistence, c.reloptions AS options, c.relreplident AS replident,
       obj_description(c.oid, 'pg_class') AS comment,
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partition_key
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'S', 'i', 'I')
ORDER BY c.relname
"""

# A column's options (ALTER TABLE ... ALTER COLUMN ... SET (n_distinct = ...)), without what a
# server keeps there of its own: a PostgreSQL 15 seen in testing stores pg_attver=<number>, a
# different one per table, in every column's.
_COLUMN_OPTIONS = "ARRAY(SELECT o FROM unnest({}) o WHERE o NOT LIKE 'pg\\_attver=%' ORDER BY o)"

_COLUMNS = """
SELECT a.attrelid AS rel, quote_ident(a.attname) AS q, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS notnull, pg_get_expr(d.adbin, d.adrelid) AS expr, a.attidentity AS identity,
       a.attgenerated AS generated,
       CASE WHEN a.attcollation <> t.typcollation THEN quote_ident(co.collname) END AS collation,
       CASE WHEN a.attstorage <> t.typstorage THEN a.attstorage END AS storage,
       NULLIF(a.attcompression, '') AS compression,
       CASE WHEN a.attstattarget >= 0 THEN a.attstattarget END AS stattarget,
       {options} AS options,
       col_description(a.attrelid, a.attnum) AS comment,
       s.seqrelid AS identity_sequence
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN LATERAL (
    SELECT dep.objid AS seqrelid FROM pg_depend dep
    WHERE dep.classid = 'pg_class'::regclass AND dep.refclassid = 'pg_class'::regclass
      AND dep.refobjid = a.attrelid AND dep.refobjsubid = a.attnum AND dep.deptype = 'i'
) s ON a.attidentity <> ''
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v') AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
""".replace("{options}", _COLUMN_OPTIONS.format("a.attoptions"))

# PostgreSQL 18 keeps NOT NULL as constraints too (contype 'n'); the columns say it for both.
_CONSTRAINTS = """
SELECT con.conrelid AS rel, con.conname AS name, quote_ident(con.conname) AS q,
       con.contype AS type, pg_get_constraintdef(con.oid) AS def, con.convalidated AS validated,
       con.confrelid AS references, obj_description(con.oid, 'pg_constraint') AS comment
FROM pg_constraint con JOIN pg_namespace n ON n.oid = con.connamespace
WHERE n.nspname = current_schema() AND con.conrelid <> 0 AND con.contype <> 'n'
ORDER BY con.conrelid, position(con.contype IN 'puxcft'), con.conname
"""

_INDEXES = """
SELECT i.indrelid AS rel, ic.relname AS name, quote_ident(ic.relname) AS q,
       pg_get_indexdef(i.indexrelid) AS def,
       format('%I.%I', n.nspname, tc.relname) AS qualified_table,
       obj_description(i.indexrelid, 'pg_class') AS comment
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_class tc ON tc.oid = i.indrelid
JOIN pg_namespace n ON n.oid = ic.relnamespace
WHERE n.nspname = current_schema()
  AND NOT EXISTS (SELECT 1 FROM pg_constraint con
                  WHERE con.conindid = i.indexrelid AND con.contype IN ('p', 'u', 'x'))
ORDER BY ic.relname
"""

_TRIGGERS = """
SELECT t.tgrelid AS rel, quote_ident(t.tgname) AS q, pg_get_triggerdef(t.oid) AS def,
       format('%I.%I', n.nspname, c.relname) AS qualified_table,
       obj_description(t.oid, 'pg_trigger') AS comment
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND NOT t.tgisinternal
ORDER BY t.tgname
"""

_FUNCTIONS = """
SELECT quote_ident(p.proname) AS q, p.prokind AS kind,
       pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_identity_arguments(p.oid) AS identity_arguments,
       pg_get_function_result(p.oid) AS result, l.lanname AS language,
       p.provolatile AS volatility, p.proisstrict AS strict, p.prosecdef AS security_definer,
       p.proleakproof AS leakproof, p.proparallel AS parallel, p.procost AS cost,
       p.proretset AS returns_set, p.prorows AS rows, p.proconfig AS config,
       p.prosrc AS source,
       CASE WHEN p.prosqlbody IS NOT NULL THEN pg_get_function_sqlbody(p.oid) END AS sql_body,
       obj_description(p.oid, 'pg_proc') AS comment
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
JOIN pg_language l ON l.oid = p.prolang
WHERE n.nspname = current_schema()
ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)
"""

_SEQUENCES = """
SELECT s.seqrelid AS rel, format_type(s.seqtypid, NULL) AS type, s.seqstart AS start,
       s.seqincrement AS increment, s.seqmin AS min, s.seqmax AS max, s.seqcache AS cache,
       s.seqcycle AS cycle, owner.q AS owned_by
FROM pg_sequence s
JOIN pg_class c ON c.oid = s.seqrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL (
    SELECT format('%I.%I', tc.relname, a.attname) AS q
    FROM pg_depend d
    JOIN pg_class tc ON tc.oid = d.refobjid
    JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
      AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'a'
) owner ON true
WHERE n.nspname = current_schema()
"""

_VIEWS = """
SELECT c.oid AS rel, pg_get_viewdef(c.oid, true) AS def,
       ARRAY(SELECT DISTINCT d.refobjid FROM pg_rewrite r
             JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
             WHERE r.ev_class = c.oid AND d.refclassid = 'pg_class'::regclass
               AND d.refobjid <> c.oid) AS uses
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'v'
"""


@dataclass
class _Relation:
    oid: int
    name: str
    q: str
    kind: str
    persistence: str
    options: list[str] | None
    replident: str
    comment: str | None
    partition_key: str | None
    columns: list[dict[str, Any]] = field(default_factory=list)
    constraints: list[dict[str, Any]] = field(default_factory=list)
    indexes: list[dict[str, Any]] = field(default_factory=list)
    triggers: list[dict[str, Any]] = field(default_factory=list)


def _rows(conn: psycopg.Connection[Any], sql: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.encode()).fetchall()


def unsupported(conn: psycopg.Connection[Any]) -> list[str]:
    """The objects of the current schema that :func:`render` does not know how to write."""
    return [str(row[0]) for row in conn.execute(_UNSUPPORTED.encode()).fetchall()]


# -- writing SQL ------------------------------------------------------------------------------

def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _dollar_quoted(body: str) -> str:
    tag = "$$"
    n = 0
    while tag in body:
        n += 1
        tag = f"$body{n if n > 1 else ''}$"
    return f"{tag}{body}{tag}"


def _options(options: Iterable[str]) -> str:
    """``fillfactor=80`` -> ``fillfactor = 80``, as a ``WITH (...)`` list."""
    parts = []
    for option in options:
        name, _, value = option.partition("=")
        parts.append(f"{name} = {value if re.fullmatch(r'[A-Za-z0-9_.]+', value) else _literal(value)}")
    return ", ".join(parts)


def _unqualified(definition: str, qualified: str, unqualified: str) -> str:
    """A catalog definition (``CREATE INDEX ... ON public.t USING ...``) without the schema."""
    return definition.replace(f" ON ONLY {qualified} ", f" ON ONLY {unqualified} ", 1) \
        .replace(f" ON {qualified} ", f" ON {unqualified} ", 1)


def _wrapped(statement: str, *breaks: str) -> str:
    """A long one-line definition broken before its clauses."""
    if len(statement) <= _WIDTH:
        return statement
    for word in breaks:
        statement = statement.replace(word, "\n    " + word.lstrip(), 1)
    return statement


def _sequence_options(seq: dict[str, Any], type_name: str, *, defaults: bool) -> str:
    """A sequence's options; with ``defaults=False``, only those differing from the defaults of
    an ascending sequence of ``type_name`` (as an identity column's are usually left)."""
    maxima = {"smallint": 32767, "integer": 2147483647, "bigint": 9223372036854775807}
    ascending = seq["increment"] > 0
    default = {
        "type": type_name,
        "increment": 1,
        "min": 1 if ascending else -maxima.get(seq["type"], 0) - 1,
        "max": maxima.get(seq["type"]) if ascending else -1,
        "cache": 1,
        "cycle": False,
    }
    default["start"] = default["min"] if ascending else default["max"]
    words = []
    if defaults or seq["type"] != default["type"]:
        words.append(f"AS {seq['type']}")
    for key, word in (("start", "START WITH"), ("increment", "INCREMENT BY"), ("min", "MINVALUE"),
                      ("max", "MAXVALUE"), ("cache", "CACHE")):
        if defaults or seq[key] != default[key]:
            words.append(f"{word} {seq[key]}")
    if seq["cycle"]:
        words.append("CYCLE")
    return " ".join(words)


def _column(column: dict[str, Any], sequences: dict[int, dict[str, Any]],
            relations: dict[int, _Relation], table: str) -> list[str]:
    """A column's definition after its name and type, as words."""
    words = []
    if column["collation"]:
        words.append(f"COLLATE {column['collation']}")
    if column["notnull"]:
        words.append("NOT NULL")
    if column["generated"]:
        kind = {"s": "STORED", "v": "VIRTUAL"}[column["generated"]]
        words.append(f"GENERATED ALWAYS AS ({column['expr']}) {kind}")
    elif column["expr"] is not None:
        words.append(f"DEFAULT {column['expr']}")
    if column["identity"]:
        words.append(f"GENERATED {'ALWAYS' if column['identity'] == 'a' else 'BY DEFAULT'} AS IDENTITY")
        seq = sequences.get(column["identity_sequence"])
        if seq is not None:
            options = _sequence_options(seq, column["type"], defaults=False)
            name = relations[seq["rel"]]
            bare = column["q"].strip('"')
            if name.name != f"{table}_{bare}_seq":
                options = f"SEQUENCE NAME {name.q} {options}".strip()
            if options:
                words.append(f"({options})")
    return words


def _in_creation_order(tables: list[_Relation]) -> tuple[list[_Relation], set[tuple[int, str]]]:
    """Tables in the order they were created (as the migrations read; in a database made from
    schema.sql, its order), and the foreign keys that reference a table created later, which
    ALTER TABLE adds after all tables."""
    ordered = sorted(tables, key=lambda t: t.oid)
    by_oid = {t.oid for t in tables}
    deferred = set()
    seen: set[int] = set()
    for table in ordered:
        seen.add(table.oid)
        for c in table.constraints:
            if c["type"] == "f" and c["references"] not in seen and c["references"] in by_oid:
                deferred.add((table.oid, c["name"]))
    return ordered, deferred


def _heading(title: str) -> str:
    return f"-- {title} " + "-" * max(3, _WIDTH - len(title) - 4)


_HEADER = """\
-- Konduit's schema as the migrations leave it, in one file: migration {version:04d} ({name}).
--
-- Generated by `{command}` from a database that applied every migration in
-- src/konduit/db/migrations/; tests/test_schema_file.py fails when the two disagree. Not to be
-- edited: a schema change is a new migration, then this file generated again.
-- Nothing reads it at run time: the migrations make a database's schema. Applied to an empty
-- database (`psql -1 -f schema.sql`) it gives the schema they give, and records them as applied
-- in {table}, so `konduit db migrate` has nothing left to do.
-- Functions first, then the tables in the order the migrations created them, each with its
-- indexes and triggers, then the views and the functions that return a table's rows.
"""


def render(conn: psycopg.Connection[Any]) -> str:
    """The current schema of ``conn``'s database as SQL, ``schema.sql``'s text."""
    problems = unsupported(conn)
    if problems:
        raise Unsupported("konduit.db.schema cannot write these yet: " + "; ".join(problems))
    relations = {r["oid"]: _Relation(**r) for r in _rows(conn, _RELATIONS)}
    for column in _rows(conn, _COLUMNS):
        column["type"] = column["type"].replace("timestamp with time zone", "timestamptz")
        relations[column["rel"]].columns.append(column)
    for constraint in _rows(conn, _CONSTRAINTS):
        relations[constraint["rel"]].constraints.append(constraint)
    for index in _rows(conn, _INDEXES):
        relations[index["rel"]].indexes.append(index)
    for trigger in _rows(conn, _TRIGGERS):
        relations[trigger["rel"]].triggers.append(trigger)
    sequences = {s["rel"]: s for s in _rows(conn, _SEQUENCES)}
    identity_sequences = {c["identity_sequence"] for r in relations.values() for c in r.columns
                          if c["identity_sequence"] is not None}
    views = {v["rel"]: v for v in _rows(conn, _VIEWS)}
    functions = _rows(conn, _FUNCTIONS)

    tables, deferred = _in_creation_order([r for r in relations.values() if r.kind in ("r", "p")])
    versions = [t for t in tables if t.name == VERSION_TABLE]
    version_rows = [(int(v), str(n)) for v, n in conn.execute(
        f"SELECT version, name FROM {versions[0].q} ORDER BY version".encode()).fetchall()
    ] if versions else []
    out: list[str] = []
    if version_rows:
        out += [_HEADER.format(version=version_rows[-1][0], name=version_rows[-1][1],
                               command=REGENERATE, table=VERSION_TABLE)]
    out += ["-- Function bodies are not checked here but when called: a function may read tables",
            "-- defined further down, and the triggers need the functions first.",
            "SET check_function_bodies = false;", ""]

    # A function returning a table's rows (RETURNS SETOF konduit_tasks) needs the table's
    # type: it comes after the tables and views.
    names = {r.name for r in relations.values()}
    of_rows = [f for f in functions
               if f["returns_set"] and f["result"].removeprefix("SETOF ") in names]
    functions = [f for f in functions if f not in of_rows]
    if functions:
        out += [_heading("functions"), ""]
        for f in functions:
            out += [_function(f), ""]

    standalone = sorted((s for s in sequences.values() if s["rel"] not in identity_sequences),
                        key=lambda s: relations[s["rel"]].name)
    if standalone:
        out += [_heading("sequences"), ""]
        for s in standalone:
            rel = relations[s["rel"]]
            out.append(f"CREATE SEQUENCE {rel.q} {_sequence_options(s, s['type'], defaults=True)};")
            if rel.comment is not None:
                out.append(f"COMMENT ON SEQUENCE {rel.q} IS {_literal(rel.comment)};")
        out.append("")

    for table in tables:
        out += [_heading(table.name), ""]
        out += _table(table, sequences, relations, deferred)
        if table.name == VERSION_TABLE and version_rows:
            values = ",\n".join(f"    ({v}, {_literal(n)})" for v, n in version_rows)
            out += ["", "-- The migrations this file stands for, as applied.",
                    f"INSERT INTO {table.q} (version, name) VALUES", values + ";"]
        out.append("")

    owned = [s for s in standalone if s["owned_by"]]
    for s in owned:
        out.append(f"ALTER SEQUENCE {relations[s['rel']].q} OWNED BY {s['owned_by']};")
    if owned:
        out.append("")
    if deferred:
        out += [_heading("foreign keys between tables that reference each other"), ""]
        for table in tables:
            for c in table.constraints:
                if (table.oid, c["name"]) in deferred:
                    out.append(f"ALTER TABLE {table.q} ADD CONSTRAINT {c['q']} {c['def']};")
                    if c["comment"] is not None:
                        out.append(_constraint_comment(table, c))
        out.append("")

    view_list = _order_views(views, relations)
    if view_list:
        out += [_heading("views"), ""]
        for view in view_list:
            out += _view(view, views[view.oid])
    if of_rows:
        out += [_heading("functions returning a table's rows"), ""]
        for f in of_rows:
            out += [_function(f), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _function(f: dict[str, Any]) -> str:
    kind = "PROCEDURE" if f["kind"] == "p" else "FUNCTION"
    lines = [f"CREATE {kind} {f['q']}({f['arguments']})"]
    if f["kind"] != "p":
        lines.append(f"RETURNS {f['result']}")
    words = [f"LANGUAGE {f['language']}"]
    if f["kind"] != "p":
        words.append({"i": "IMMUTABLE", "s": "STABLE", "v": "VOLATILE"}[f["volatility"]])
        if f["strict"]:
            words.append("STRICT")
        if f["leakproof"]:
            words.append("LEAKPROOF")
        if f["parallel"] != "u":
            words.append({"s": "PARALLEL SAFE", "r": "PARALLEL RESTRICTED"}[f["parallel"]])
        if f["cost"] != 100:
            words.append(f"COST {f['cost']:g}")
        if f["returns_set"] and f["rows"] != 1000:
            words.append(f"ROWS {f['rows']:g}")
    if f["security_definer"]:
        words.append("SECURITY DEFINER")
    lines.append(" ".join(words))
    for setting in f["config"] or []:
        name, _, value = setting.partition("=")
        values = value.split(", ") if name == "search_path" else [value]
        lines.append(f"SET {name} TO {', '.join(_literal(v) for v in values)}")
    if f["sql_body"] is not None:
        lines.append(f"{f['sql_body']};")
    else:
        lines.append(f"AS {_dollar_quoted(f['source'])};")
    if f["comment"] is not None:
        lines.append(f"COMMENT ON {kind} {f['q']}({f['identity_arguments']}) IS {_literal(f['comment'])};")
    return "\n".join(lines)


def _table(table: _Relation, sequences: dict[int, dict[str, Any]],
           relations: dict[int, _Relation], deferred: set[tuple[int, str]]) -> list[str]:
    name_width = max((len(c["q"]) for c in table.columns), default=0)
    type_width = max((len(c["type"]) for c in table.columns), default=0)
    items = []
    for c in table.columns:
        rest = " ".join(_column(c, sequences, relations, table.name))
        items.append(f"    {c['q']:<{name_width}}  {c['type']:<{type_width}}  {rest}".rstrip())
    later = []
    for c in table.constraints:
        if (table.oid, c["name"]) in deferred:
            continue
        if c["validated"]:
            items.append(f"    CONSTRAINT {c['q']} {c['def']}")
        else:  # NOT VALID: only ALTER TABLE can say it
            later.append(f"ALTER TABLE {table.q} ADD CONSTRAINT {c['q']} {c['def']};")
    unlogged = "UNLOGGED " if table.persistence == "u" else ""
    partitioned = f" PARTITION BY {table.partition_key}" if table.partition_key else ""
    lines = [f"CREATE {unlogged}TABLE {table.q} (", ",\n".join(items),
             f"){partitioned}{f' WITH ({_options(table.options)})' if table.options else ''};"]
    lines += later
    if table.replident != "d":
        lines.append(f"ALTER TABLE {table.q} REPLICA IDENTITY "
                     f"{ {'f': 'FULL', 'n': 'NOTHING'}[table.replident] };")
    for c in table.columns:
        if c["storage"]:
            storage = {"p": "PLAIN", "e": "EXTERNAL", "m": "MAIN", "x": "EXTENDED"}[c["storage"]]
            lines.append(f"ALTER TABLE {table.q} ALTER COLUMN {c['q']} SET STORAGE {storage};")
        if c["compression"]:
            method = {"p": "pglz", "l": "lz4"}[c["compression"]]
            lines.append(f"ALTER TABLE {table.q} ALTER COLUMN {c['q']} SET COMPRESSION {method};")
        if c["options"]:
            lines.append(f"ALTER TABLE {table.q} ALTER COLUMN {c['q']} "
                         f"SET ({_options(c['options'])});")
        if c["stattarget"] is not None:
            lines.append(f"ALTER TABLE {table.q} ALTER COLUMN {c['q']} "
                         f"SET STATISTICS {c['stattarget']};")
    if table.comment is not None:
        lines.append(f"COMMENT ON TABLE {table.q} IS {_literal(table.comment)};")
    for c in table.columns:
        if c["comment"] is not None:
            lines.append(f"COMMENT ON COLUMN {table.q}.{c['q']} IS {_literal(c['comment'])};")
    for c in table.constraints:
        if c["comment"] is not None and (table.oid, c["name"]) not in deferred:
            lines.append(_constraint_comment(table, c))
    if table.indexes:
        lines.append("")
    for index in table.indexes:
        statement = _unqualified(index["def"], index["qualified_table"], table.q)
        # A partitioned table's index reads ON ONLY (made on the parent alone); made with the
        # table, before any partition, it is the same index.
        statement = statement.replace(f" ON ONLY {table.q} ", f" ON {table.q} ")
        lines.append(_wrapped(statement, " WHERE ", " INCLUDE ") + ";")
        if index["comment"] is not None:
            lines.append(f"COMMENT ON INDEX {index['q']} IS {_literal(index['comment'])};")
    if table.triggers:
        lines.append("")
    for trigger in table.triggers:
        statement = _unqualified(trigger["def"], trigger["qualified_table"], table.q)
        lines.append(_wrapped(statement, " REFERENCING ", " FOR EACH ", " WHEN ",
                              " EXECUTE FUNCTION ") + ";")
        if trigger["comment"] is not None:
            lines.append(f"COMMENT ON TRIGGER {trigger['q']} ON {table.q} "
                         f"IS {_literal(trigger['comment'])};")
    return lines


def _constraint_comment(table: _Relation, constraint: dict[str, Any]) -> str:
    return (f"COMMENT ON CONSTRAINT {constraint['q']} ON {table.q} "
            f"IS {_literal(constraint['comment'])};")


def _order_views(views: dict[int, dict[str, Any]], relations: dict[int, _Relation]) -> list[_Relation]:
    """Views by name, each after the views it reads."""
    ordered: list[_Relation] = []
    done: set[int] = set()
    while len(done) < len(views):
        ready = sorted((relations[o].name, o) for o in views
                       if o not in done and set(views[o]["uses"]) & set(views) <= done)
        if not ready:
            raise Unsupported("views that read each other in a cycle")
        ordered.append(relations[ready[0][1]])
        done.add(ready[0][1])
    return ordered


def _view(view: _Relation, found: dict[str, Any]) -> list[str]:
    options = f" WITH ({_options(view.options)})" if view.options else ""
    lines = [f"CREATE VIEW {view.q}{options} AS", found["def"].rstrip().rstrip(";") + ";"]
    if view.comment is not None:
        lines.append(f"COMMENT ON VIEW {view.q} IS {_literal(view.comment)};")
    for c in view.columns:
        if c["comment"] is not None:
            lines.append(f"COMMENT ON COLUMN {view.q}.{c['q']} IS {_literal(c['comment'])};")
    return [*lines, ""]


# -- comparing two databases of one server ----------------------------------------------------

# Catalog columns left out of catalog_facts: object ids (the names and definitions added
# instead say what they point at), column numbers, parse trees, transaction ids.
_ID_TYPES = ("oid", "oid[]", "regproc", "regproc[]", "oidvector", "int2vector", "int2[]",
             "pg_node_tree", "xid", "xid8", "anyarray", "pg_lsn")
# ... and what differs between two databases of one schema: the planner's statistics, the
# number of attributes ever added (dropped ones included), and whether a column has a value
# stored for the rows that existed when it was added (ALTER TABLE ... ADD COLUMN ... DEFAULT).
_SKIPPED = {
    "pg_class": {"relpages", "reltuples", "relallvisible", "relallfrozen", "relnatts"},
    "pg_attribute": {"attnum", "atthasmissing", "attoptions"},
}


# catalog -> (FROM and WHERE, the object's name, names and definitions in place of ids)
_FACT_SOURCES: dict[str, tuple[str, str, str]] = {
    "pg_class": (
        "pg_class x JOIN pg_namespace n ON n.oid = x.relnamespace"
        " LEFT JOIN pg_am am ON am.oid = x.relam WHERE n.nspname = current_schema()",
        "x.relname",
        "am.amname AS access_method, x.reloftype::regtype::text AS of_type"),
    "pg_attribute": (
        "pg_attribute x JOIN pg_class c ON c.oid = x.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_attrdef d ON d.adrelid = x.attrelid AND d.adnum = x.attnum"
        " WHERE n.nspname = current_schema() AND x.attnum > 0 AND NOT x.attisdropped",
        "c.relname || '.' || x.attname",
        "format_type(x.atttypid, x.atttypmod) AS type, x.attcollation::regcollation::text AS coll,"
        " pg_get_expr(d.adbin, d.adrelid) AS default_or_generated,"
        f" {_COLUMN_OPTIONS.format('x.attoptions')} AS options,"
        " (SELECT count(*) FROM pg_attribute o WHERE o.attrelid = x.attrelid AND o.attnum > 0"
        "  AND NOT o.attisdropped AND o.attnum <= x.attnum) AS position"),
    "pg_constraint": (
        "pg_constraint x JOIN pg_namespace n ON n.oid = x.connamespace"
        " WHERE n.nspname = current_schema()",
        "x.conrelid::regclass::text || '.' || x.conname",
        "pg_get_constraintdef(x.oid) AS def, x.conindid::regclass::text AS index,"
        " x.contypid::regtype::text AS domain"),
    "pg_index": (
        "pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()",
        "c.relname",
        "pg_get_indexdef(x.indexrelid) AS def"),
    "pg_proc": (
        "pg_proc x JOIN pg_namespace n ON n.oid = x.pronamespace"
        " JOIN pg_language l ON l.oid = x.prolang WHERE n.nspname = current_schema()",
        "x.oid::regprocedure::text",
        "l.lanname AS language, pg_get_function_result(x.oid) AS result,"
        " pg_get_function_arguments(x.oid) AS arguments,"
        " CASE WHEN x.prosqlbody IS NOT NULL THEN pg_get_function_sqlbody(x.oid) END AS sql_body"),
    "pg_trigger": (
        "pg_trigger x JOIN pg_class c ON c.oid = x.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND NOT x.tgisinternal",
        "c.relname || '.' || x.tgname",
        "pg_get_triggerdef(x.oid) AS def"),
    "pg_sequence": (
        "pg_sequence x JOIN pg_class c ON c.oid = x.seqrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()",
        "c.relname",
        "x.seqtypid::regtype::text AS type,"
        " (SELECT string_agg(format('%s %s.%s', d.deptype, d.refobjid::regclass, a.attname), ',')"
        "  FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid"
        "   AND a.attnum = d.refobjsubid"
        "  WHERE d.classid = 'pg_class'::regclass AND d.objid = x.seqrelid"
        "   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) AS owned_by"),
    "pg_rewrite": (
        "pg_rewrite x JOIN pg_class c ON c.oid = x.ev_class"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()",
        "c.relname || '.' || x.rulename",
        "pg_get_ruledef(x.oid) AS def"),
    "pg_type": (
        "pg_type x JOIN pg_namespace n ON n.oid = x.typnamespace"
        " WHERE n.nspname = current_schema()",
        "x.typname",
        "x.typrelid::regclass::text AS relation, x.typelem::regtype::text AS element"),
    "pg_description": (
        "pg_description x WHERE (pg_identify_object(x.classoid, x.objoid, x.objsubid)).schema"
        " = current_schema()",
        "pg_describe_object(x.classoid, x.objoid, x.objsubid)",
        "x.description AS text"),
    "pg_extension": (
        "pg_extension x WHERE true",
        "x.extname",
        "x.extnamespace::regnamespace::text AS schema"),
}


def catalog_facts(conn: psycopg.Connection[Any]) -> list[str]:
    """The current schema of ``conn``'s database as sorted lines, one an object: its catalog
    row (every column but ids, statistics and parse trees) with names and definitions. Two
    databases of one server with the same schema give the same lines."""
    lines = []
    for catalog, (source, key, extra) in _FACT_SOURCES.items():
        columns = [name for name, type_name in conn.execute(
            "SELECT attname::text, atttypid::regtype::text FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (catalog,)).fetchall()
            if type_name not in _ID_TYPES and name not in _SKIPPED.get(catalog, set())]
        selected = ", ".join([*(f"x.{c}" for c in columns), extra])
        sql = (f"SELECT key, (to_jsonb(r) - 'key')::text FROM (SELECT {key} AS key, {selected}"
               f" FROM {source}) r")
        lines += [f"{catalog} {name}: {row}" for name, row in conn.execute(sql.encode()).fetchall()]
    return sorted(lines)
