"""What users read carries no words of how the project was organised: no "seed 004", "issue 8",
"round 3" or "session 5" in the README, the docs, the examples, or the package's source (which
is where the CLI's help, its messages and the API reference come from), and no pointer to a
DESIGN.md that is not in the repository."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

INTERNAL = re.compile(
    r"\bseed[- ]?\d{3}\b"             # seed 004, Seed-000
    r"|\bseed's\b|\bthe seed\b|\bseed seconds?\b"
    r"|\bissues? #?\d+"               # issue 8, issue #16
    r"|\bround[- ]\d+\b"              # round 3
    r"|\bsession[- ]\d+\b",           # session 5
    re.IGNORECASE)

TEXT = {".md", ".py", ".sql", ".html", ".js", ".css", ".toml", ".yml", ".yaml", ".txt"}


def readable_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml"]
    for folder in ("docs", "examples", "src/konduit"):
        files += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts]
    return files


def findings(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_the_scan_covers_what_users_read() -> None:
    names = {str(p.relative_to(ROOT)) for p in readable_files()}
    assert {"README.md", "docs/durable-waits.md", "src/konduit/cli/tools.py",
            "src/konduit/demo.py", "examples/human_approval.py"} <= names


def test_the_pattern_catches_the_words_and_spares_ordinary_ones() -> None:
    for internal in ("seed 004's rule", "the seed-004 incident", "Seed 000 asks", "issue 8",
                     "(issue 16)", "round 3", "the seed's night", "session 4"):
        assert INTERNAL.search(internal), internal
    for ordinary in ("seed -> map -> join", "the rows the migrations seeded", "a round of outcomes",
                     "a page session", "around 2.3 statements", "rounds 2 decimals"):
        assert not INTERNAL.search(ordinary), ordinary


def test_no_project_internal_words() -> None:
    found = findings(INTERNAL, readable_files())
    assert not found, "project-internal words where users read them:\n" + "\n".join(found)


def test_no_pointer_to_a_design_document_that_is_not_shipped() -> None:
    if (ROOT / "DESIGN.md").exists():
        return
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = findings(re.compile(r"DESIGN\.md"), docs)
    assert not found, "DESIGN.md is not in the repository:\n" + "\n".join(found)


def test_no_project_internal_words_in_the_cli_help() -> None:
    """The help of every command as the user sees it (rendered, so text from any source
    counts: docstrings, option help, choices)."""
    import typer
    from typer.testing import CliRunner

    from konduit.cli import cli

    def paths(command: Any, path: list[str], parent: Any) -> list[list[str]]:
        found = [path]
        if hasattr(command, "list_commands"):  # a group (Typer carries its own Click)
            ctx = typer.Context(command, info_name=path[-1] if path else "konduit", parent=parent)
            for name in command.list_commands(ctx):
                found += paths(command.get_command(ctx, name), [*path, name], ctx)
        return found

    runner = CliRunner()
    commands = paths(typer.main.get_command(cli), [], None)
    assert len(commands) >= 20
    bad = []
    for path in commands:
        done = runner.invoke(cli, [*path, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (path, done.output)
        found = INTERNAL.search(done.output)
        if found:
            bad.append(f"konduit {' '.join(path)} --help: {found.group(0)}")
    assert not bad, bad
