"""A Griffe extension for the API reference: the docstrings are written with reST roles
(``:class:`konduit.App```) and ``::`` literal blocks, which Markdown shows verbatim. This turns
a role into inline code and a paragraph's closing ``::`` into ``:`` (the indented block after it
is already a code block in Markdown), and a doctest block (``>>>`` lines, which Markdown reads
as nested quotes) into a fenced ``pycon`` block, so the pages read like the rest of the docs
(the conversion is src/konduit/doctext.py, which the HTTP API's OpenAPI document uses too).

It also marks the members that are the engine's plumbing (``INTERNAL``: a policy's spec for the
stored definition, a record's constructor from a row, ...) as private, for the pages that show
public objects only (``filters: public``: a public module's ``__all__``); mkdocs.yml's filters
leave the same names out of the other pages."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import griffe

# The conversion is the package's own (the HTTP API's OpenAPI uses it too), loaded from its file
# so that building the docs needs no import of the package.
_SPEC = importlib.util.spec_from_file_location(
    "konduit_doctext", Path(__file__).resolve().parents[2] / "src/konduit/doctext.py")
assert _SPEC is not None and _SPEC.loader is not None
doctext = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(doctext)
markdown = doctext.markdown
fence_doctests = doctext.fence_doctests

# Members of public classes that users never call: what the engine stores, reads back or
# compares (the names are public in Python because other modules of the package use them).
INTERNAL = frozenset({
    "to_spec", "from_row", "definition_hash", "subscription_id", "thin_history_budget",
    "client_async", "reads_async",
})


class RestRoles(griffe.Extension):
    """Rewrite each docstring once, as Griffe loads its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
        if obj.name in INTERNAL and obj.parent is not None and obj.parent.is_class:
            obj.public = False
