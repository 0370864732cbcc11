"""The house imports downward: ``core`` is pure (nothing of konduit but ``core`` and the two
modules under it, ``errors`` and ``masking``, which import nothing of konduit),
and the benchmarks never import a face (the command line, the web app, the demo), which start
them, not the other way round. Every import counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import konduit

ROOT = Path(konduit.__file__).parent


def konduit_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name == "konduit" or name.startswith("konduit.")}


def modules(folder: str) -> list[Path]:
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths, folder
    return paths


def test_core_imports_only_core_and_errors() -> None:
    for path in modules("core"):
        bad = {n for n in konduit_imports(path)
               if not n.startswith(("konduit.core.", "konduit.errors.", "konduit.masking."))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_errors_and_masking_import_nothing_of_konduit() -> None:
    """The floor under everything: every module may raise konduit's errors, whose messages are
    masked, so neither imports a module that could import them (types aside)."""
    for path in (ROOT / "errors.py", ROOT / "masking.py"):
        runtime = set()
        for node in ast.parse(path.read_text()).body:  # module level, not under TYPE_CHECKING
            if isinstance(node, ast.ImportFrom) and node.module:
                runtime.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                runtime.update(a.name for a in node.names)
        bad = {n for n in runtime if n.startswith("konduit.") and n != "konduit.masking.mask_password"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_read_layer_imports_no_worker_and_no_face() -> None:
    """reads/ and observe/ stand on the engine and under the faces (observe's exporter,
    observe/metrics.py, is a face and left out)."""
    faces = ("konduit.worker", "konduit.cli", "konduit.web", "konduit.demo", "konduit.app",
             "konduit.client", "konduit.bench", "konduit.testing", "konduit.observe.metrics")
    for path in [*modules("reads"), *modules("observe")]:
        if path.name == "metrics.py":
            continue
        bad = {n for n in konduit_imports(path) if n.startswith(faces) or n == "konduit"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_benchmarks_import_no_face() -> None:
    faces = ("konduit.cli", "konduit.web", "konduit.demo")
    for path in modules("bench"):
        bad = {n for n in konduit_imports(path) if n.startswith(faces)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


# Above the engine: the worker runtime, the read model and the analysis of stored data
# (reads/, observe/), and the faces that start them. The engine is what they call; it never
# calls back up.
ABOVE_THE_ENGINE = ("konduit.worker", "konduit.reads", "konduit.observe", "konduit.cli",
                    "konduit.web", "konduit.demo", "konduit.app", "konduit.client",
                    "konduit.bench", "konduit.testing")


def module_file(name: str) -> Path | None:
    """The file of an imported name: a module (``konduit.engine.round``), or the module an
    imported attribute lives in (``konduit.engine.round.Round``)."""
    parts = name.split(".")[1:]
    for n in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if n > 0 and candidate.is_file():
                return candidate
    return ROOT / "__init__.py"


def test_the_engine_imports_no_worker_no_read_model_and_no_face() -> None:
    for path in modules("engine"):
        bad = {n for n in konduit_imports(path) if n.startswith(ABOVE_THE_ENGINE)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_completion_round_reaches_no_worker_and_no_face() -> None:
    """The round (engine/round.py) and everything it imports, followed module by module: the
    hot path of every completion stays below the runtime that calls it."""
    start = ROOT / "engine" / "round.py"
    via: dict[Path, Path | None] = {start: None}
    todo = [start]
    while todo:
        path = todo.pop()
        for name in sorted(konduit_imports(path)):
            chain = [str(path.relative_to(ROOT))]
            step = via[path]
            while step is not None:
                chain.append(str(step.relative_to(ROOT)))
                step = via[step]
            assert not name.startswith(ABOVE_THE_ENGINE) and name != "konduit", \
                f"the round reaches {name} through {' <- '.join(chain)}"
            target = module_file(name)
            assert target != ROOT / "__init__.py", \
                f"the round reaches the package's top level ({name}) through {chain}"
            if target is not None and target not in via:
                via[target] = path
                todo.append(target)
    assert ROOT / "engine" / "advancer.py" in via  # the walk follows imports at all

FACES = ("web", "cli")
DATABASE_VERBS = {"one", "all", "run", "stream", "execute", "atomic", "transaction"}


def face_modules() -> list[Path]:
    return [*(p for folder in FACES for p in modules(folder)), ROOT / "app.py"]


def named_query_uses(path: Path) -> list[str]:
    """Where a module reaches the database past the client: a string naming a query of
    ``konduit/db/sql``, or a database verb (``db.all(...)``, ``tx.one(...)``) called on
    anything with a literal first argument."""
    from konduit.db.queries import all_queries

    names = set(all_queries())
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"line {node.lineno}: names the query {node.value!r}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in DATABASE_VERBS and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "db"):
            found.append(f"line {node.lineno}: calls .db.{node.func.attr}({node.args[0].value!r})")
    return found


def test_the_faces_go_through_the_client() -> None:
    """engine.Client is the one door (issue 17): the App, the command line, the pages and the
    API never import the query loader nor call a named query themselves, so every operation
    they offer is a Client coroutine that asyncio users have too."""
    for path in face_modules():
        bad = {n for n in konduit_imports(path)
               if n.startswith(("konduit.db.queries", "konduit.db.database.Tx"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        uses = named_query_uses(path)
        assert not uses, f"{path.relative_to(ROOT)} reaches the database itself: {uses}"


def test_the_fitness_check_sees_a_named_query(tmp_path: Path) -> None:
    """The check above can fail: a face calling a named query is caught."""
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("async def f(client):\n"
                      "    return await client.db.all('step_get_all', execution_id=1)\n")
    assert sorted(named_query_uses(sneaky)) == [
        "line 2: calls .db.all('step_get_all')",
        "line 2: names the query 'step_get_all'",
    ]
    sneaky.write_text("from konduit.db.queries import q\n")
    assert konduit_imports(sneaky) == {"konduit.db.queries.q"}
