"""A Griffe extension for the API reference: the docstrings are written with reST roles
(``:class:`konduit.App```) and ``::`` literal blocks, which Markdown shows verbatim. This turns
a role into inline code and a paragraph's closing ``::`` into ``:`` (the indented block after it
is already a code block in Markdown), and a doctest block (``>>>`` lines, which Markdown reads
as nested quotes) into a fenced ``pycon`` block, so the pages read like the rest of the docs.

It also marks the members that are the engine's plumbing (``INTERNAL``: a policy's spec for the
stored definition, a record's constructor from a row, ...) as private, so the reference, which
shows public objects only (``filters: public`` in mkdocs.yml, with each module's ``__all__``),
leaves them out."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)
LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.M)
DOUBLE_BACKTICK = re.compile(r"(?<!`)``([^`]+)``(?!`)")
PROMPT = re.compile(r"^>>>(?: |$)")
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")

# Members of public classes that users never call: what the engine stores, reads back or
# compares (the names are public in Python because other modules of the package use them).
INTERNAL = frozenset({
    "to_spec", "from_row", "definition_hash", "subscription_id", "thin_history_budget",
    "client_async", "reads_async",
})


def fence_doctests(text: str) -> str:
    """Each doctest block (a ``>>>`` line at the docstring's margin, then every line up to the
    next blank one) in a ``pycon`` fence. An indented one is left alone: it is inside a literal
    block (already code in Markdown) or a section; so is one already inside a fence."""
    lines = text.split("\n")
    out: list[str] = []
    fenced = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence and (fenced is None or fence.group(1).startswith(fenced)):
            fenced = fence.group(1) if fenced is None else None
        prompt = PROMPT.match(line) if fenced is None else None
        if prompt is None:
            out.append(line)
            i += 1
            continue
        out.append("```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append("```")
    return "\n".join(out)


def markdown(text: str) -> str:
    text = fence_doctests(text)
    text = ROLE.sub(r"`\1`", text)
    text = LITERAL.sub(r"\1:", text)
    text = LONE_LITERAL.sub("", text)
    return DOUBLE_BACKTICK.sub(r"`\1`", text)


class RestRoles(griffe.Extension):
    """Rewrite each docstring once, as Griffe loads its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
        if obj.name in INTERNAL and obj.parent is not None and obj.parent.is_class:
            obj.public = False
