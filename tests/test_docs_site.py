"""The documentation site builds (``mkdocs build --strict``, as .ci/run does) and its API reference
shows the public surface only, with examples that render as code: no doctest read as nested
quotes, no documented name that is private (``_name``), internal to the engine (the hook's
INTERNAL members) or outside ``konduit.__all__`` and the public modules' ``__all__``."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import konduit
import konduit.errors
import konduit.records
import konduit.testing

ROOT = Path(__file__).resolve().parent.parent

# Where the engine lives: a reference page names none of these modules.
INTERNAL_MODULE = re.compile(
    r"konduit\.(?:_blocking|operations|core|engine|reads|db|worker|web|observe|cli)\b")
HEADING = re.compile(r'<h\d id="([^"]+)" class="doc doc-heading"')
BLOCKQUOTE = re.compile(r"<blockquote>.*?</blockquote>", re.S)


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rest_roles", ROOT / "docs/_hooks/rest_roles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def public_objects() -> dict[str, object]:
    """Every documented top-level name: ``konduit.__all__`` and the public modules' ``__all__``."""
    found: dict[str, object] = {"konduit.records": konduit.records,
                                "konduit.errors": konduit.errors,
                                "konduit.testing": konduit.testing}
    for module in (konduit, konduit.records, konduit.errors, konduit.testing):
        for name in module.__all__:
            found[f"{module.__name__}.{name}"] = getattr(module, name)
    return found


def test_the_hook_fences_doctests_and_turns_roles_into_code() -> None:
    pytest.importorskip("griffe")
    roles = hook()
    text = ("Start one.\n\n>>> app.start('x')\n... # more\n\nSee :class:`~konduit.App` and "
            "``x``::\n\n    code\n")
    out = roles.markdown(text)
    assert "```pycon\n>>> app.start('x')\n... # more\n```" in out
    assert "`konduit.App`" in out and "``" not in out.replace("```", "") and "::" not in out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def reference_pages(site: Path) -> dict[str, str]:
    pages = {p.parent.name: p.read_text(encoding="utf-8")
             for p in sorted((site / "reference").glob("*/index.html"))}
    assert {"app", "client", "async-client", "workflow", "context", "policies", "records",
            "testing", "errors"} <= set(pages)
    return pages


@pytest.mark.slow
def test_reference_examples_render_as_code(site: Path) -> None:
    pages = reference_pages(site)
    for name, page in pages.items():
        quoted = [b for b in BLOCKQUOTE.findall(page) if "&gt;&gt;&gt;" in b]
        assert not quoted, f"{name}: a doctest rendered as nested quotes: {quoted[0][:200]}"
    # The doctests are there, as highlighted code (prompts in a code block).
    prompt = '<span class="gp">&gt;&gt;&gt; </span>'
    assert prompt in pages["workflow"] and prompt in pages["client"]


@pytest.mark.slow
def test_reference_documents_the_public_surface_only(site: Path) -> None:
    public = public_objects()
    internal = hook().INTERNAL
    documented = set()
    for name, page in reference_pages(site).items():
        for ident in HEADING.findall(page):
            ident = html.unescape(ident)
            documented.add(ident)
            parts = ident.split(".")
            assert not any(p.startswith("_") for p in parts), f"{name}: private {ident}"
            if ident in public:
                continue
            owner, member = ident.rsplit(".", 1)
            assert owner in public, f"{name}: {ident} is not part of the public surface"
            assert member not in internal, f"{name}: {ident} is the engine's, not the API's"
            fields = getattr(public[owner], "__dataclass_fields__", {})
            assert hasattr(public[owner], member) or member in fields, f"{name}: no {ident}"
        text = re.sub(r"<[^>]+>", "", page)
        leaked = sorted(set(INTERNAL_MODULE.findall(text)))
        assert not leaked, f"{name}: names internal modules {leaked}"
    # Everything public has a place in the reference (the records and errors by their module).
    missing = [n for n in public if n not in documented and not isinstance(public[n], ModuleType)
               and not any(d.endswith("." + n.rsplit(".", 1)[1]) for d in documented)]
    assert not missing, f"public names the reference leaves out: {missing}"
