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
