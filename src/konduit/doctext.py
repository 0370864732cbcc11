"""The docstrings as Markdown: they are written with reST roles (``:class:`konduit.App```),
double backticks and ``::`` literal blocks, which a Markdown reader shows verbatim. The API
reference (docs/_hooks/rest_roles.py, which loads this file) and the HTTP API's OpenAPI
document (its descriptions come from the endpoints' and the models' docstrings; OpenAPI reads
them as CommonMark) both turn them into Markdown here. Plain ``re``, no dependency."""

from __future__ import annotations

import html
import re

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)
LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.M)
DOUBLE_BACKTICK = re.compile(r"(?<!`)``([^`]+)``(?!`)")
PROMPT = re.compile(r"^>>>(?: |$)")
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


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
    """``text`` (a docstring, dedented) as Markdown: doctests fenced, a role as inline code, a
    paragraph's closing ``::`` as ``:`` (the indented block after it is code in Markdown too),
    double backticks as single ones."""
    text = fence_doctests(text)
    text = ROLE.sub(r"`\1`", text)
    text = LITERAL.sub(r"\1:", text)
    text = LONE_LITERAL.sub("", text)
    return DOUBLE_BACKTICK.sub(r"`\1`", text)


CODE_SPAN = re.compile(r"`([^`]+)`")
STRONG = re.compile(r"\*\*([^*]+)\*\*")


def to_html(text: str) -> str:
    """The little Markdown the descriptions use, as HTML (escaped): paragraphs, inline code,
    bold, fenced or indented code blocks. For the API's own docs page, which renders the
    OpenAPI document without a Markdown library."""
    blocks: list[str] = []
    for block in re.split(r"\n[ \t]*\n", text.strip()):
        lines = block.split("\n")
        if FENCE.match(lines[0]):
            body = lines[1:-1] if FENCE.match(lines[-1]) and len(lines) > 1 else lines[1:]
            blocks.append("<pre><code>" + html.escape("\n".join(body)) + "</code></pre>")
        elif all(line.startswith(("    ", "\t")) for line in lines if line.strip()):
            code = "\n".join(line[4:] if line.startswith("    ") else line[1:] for line in lines)
            blocks.append(f"<pre><code>{html.escape(code)}</code></pre>")
        elif block.strip():
            inline = html.escape(" ".join(line.strip() for line in lines), quote=False)
            inline = STRONG.sub(r"<b>\1</b>", CODE_SPAN.sub(r"<code>\1</code>", inline))
            blocks.append(f"<p>{inline}</p>")
    return "".join(blocks)
