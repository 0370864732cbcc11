"""Every code block of the README and of docs/ runs, or says it is a fragment.

A block is a *fragment* when the line before its fence is ``<!-- fragment -->`` (invisible on
GitHub and on the documentation site) or its info string carries the word ``fragment``. Every
other block must be Python and is run as written, each in a fresh process against a real, empty,
migrated database (``KONDUIT_DATABASE_URL``; ``KONDUIT_TEST_DATABASE_URL`` names the server for
``konduit.testing``). A block that defines ``test_`` functions is run by pytest instead.

So an example in the docs cannot silently stop working: an undefined name, a missing import, a
wrong step name in ``ctx.upstream`` all fail here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.storage]

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT_MARK = "<!-- fragment -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file, with their indentation removed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        previous = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and not lines[j].strip().strip(fence[0])):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: a code block is never closed"
        found.append(Block(path, i + 1, info, "\n".join(body) + "\n",
                           previous == FRAGMENT_MARK or "fragment" in info.split()))
        i = j + 1
    return found


ALL_BLOCKS = [block for path in documents() for block in blocks(path)]
RUNNABLE = [block for block in ALL_BLOCKS if not block.fragment]


def test_the_extraction_sees_the_documents() -> None:
    """A parser that found nothing would make every other test here pass vacuously."""
    assert len(documents()) >= 10
    assert len(RUNNABLE) >= 10
    assert any(block.where.startswith("docs/durable-waits.md") for block in RUNNABLE)


def test_a_block_is_python_or_marked_as_a_fragment() -> None:
    unmarked = [f"{block.where} ({block.language or 'no language'})" for block in RUNNABLE
                if block.language not in ("python", "py")]
    assert not unmarked, (
        "code blocks that are neither Python (run by this test) nor marked as fragments "
        f"(put '{FRAGMENT_MARK}' on the line before the fence): {unmarked}")


def test_the_fence_parser_on_a_sample(tmp_path: Path) -> None:
    sample = tmp_path / "sample.md"
    sample.write_text(
        "text\n\n<!-- fragment -->\n```bash\nkonduit demo\n```\n\n"
        "- item\n\n  ```python\n  print(1)\n  ```\n\n"
        "````python fragment\n```\n````\n")
    found = [(b.language, b.code, b.fragment) for b in blocks(sample)]
    assert found == [("bash", "konduit demo\n", True), ("python", "print(1)\n", False),
                     ("python", "```\n", True)]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_TEST_DATABASE_URL", "PYTEST_ADDOPTS")}
    env.update(extra)
    return env


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.language in ("python", "py")],
                         ids=lambda block: block.where)
def test_the_block_runs(block: Block, db_url: str, admin_url: str, tmp_path: Path) -> None:
    env = environment(KONDUIT_DATABASE_URL=db_url, KONDUIT_TEST_DATABASE_URL=admin_url)
    if re.search(r"^def test_", block.code, re.M):
        script = tmp_path / "test_docs_block.py"
        script.write_text(block.code)
        args = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", script.name]
    else:
        script = tmp_path / "docs_block.py"
        script.write_text(block.code)
        args = [sys.executable, script.name]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (
        f"{block.where} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}")
