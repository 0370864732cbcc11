"""The house imports downward: ``core`` is pure (nothing of konduit but ``core`` and ``errors``),
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
               if not n.startswith(("konduit.core.", "konduit.errors."))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_benchmarks_import_no_face() -> None:
    faces = ("konduit.cli", "konduit.web", "konduit.demo")
    for path in modules("bench"):
        bad = {n for n in konduit_imports(path) if n.startswith(faces)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


# Above the engine: the worker runtime and the faces that start it. The engine is what they
# call; it never calls back up.
ABOVE_THE_ENGINE = ("konduit.worker", "konduit.cli", "konduit.web", "konduit.demo",
                    "konduit.app", "konduit.bench", "konduit.testing")


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


def test_the_engine_imports_no_worker_and_no_face() -> None:
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
