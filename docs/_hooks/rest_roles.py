"""A Griffe extension for the API reference: the docstrings are written with reST roles
(``:class:`konduit.App```) and ``::`` literal blocks, which Markdown shows verbatim. This turns
a role into inline code and a paragraph's closing ``::`` into ``:`` (the indented block after it
is already a code block in Markdown), so the pages read like the rest of the docs."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)
LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.M)
DOUBLE_BACKTICK = re.compile(r"``([^`]+)``")


def markdown(text: str) -> str:
    text = ROLE.sub(r"`\1`", text)
    text = LITERAL.sub(r"\1:", text)
    text = LONE_LITERAL.sub("", text)
    return DOUBLE_BACKTICK.sub(r"`\1`", text)


class RestRoles(griffe.Extension):
    """Rewrite each docstring once, as Griffe loads its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
