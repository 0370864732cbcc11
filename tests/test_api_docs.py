"""The HTTP API describes itself in clean Markdown with resolved schemas: ``/openapi.json``'s
descriptions (the endpoints' and models' docstrings, written in reST) carry no double backticks
and no roles, and ``/api/v1/docs`` renders them as HTML and shows each body, answer and field
by its type or a link to its schema, never a raw ``$ref``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from konduit.doctext import markdown, to_html
from konduit.web import create_app, database_client
from tests.support.browser import serving

REST = re.compile(r"``|:(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`|::\s*$", re.M)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    # No database is reached: the description and its page are built from the routes.
    web = create_app(database_client("postgresql://unused@127.0.0.1:1/none", None), None)
    with serving(web) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client


def descriptions(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "summary") and isinstance(value, str):
                yield f"{where}/{key}", value
            else:
                yield from descriptions(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from descriptions(value, f"{where}/{i}")


def test_markdown_turns_rest_into_markdown() -> None:
    assert markdown("pass ``next_cursor`` to :meth:`~konduit.App.list`") == (
        "pass `next_cursor` to `konduit.App.list`")
    assert markdown("Like this::\n\n    code") == "Like this:\n\n    code"
    assert markdown(">>> 1 + 1\n2") == "```pycon\n>>> 1 + 1\n2\n```"


def test_to_html_renders_the_little_markdown_escaped() -> None:
    assert to_html("a `x<y>` and **b**\nmore\n\nnext") == (
        "<p>a <code>x&lt;y&gt;</code> and <b>b</b> more</p><p>next</p>")
    assert to_html("<script>\n\n    if a < b:") == (
        "<p>&lt;script&gt;</p><pre><code>if a &lt; b:</code></pre>")


def test_the_openapi_descriptions_are_markdown(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    found = list(descriptions(spec))
    assert len(found) > 100
    rest = [f"{where}: {text[:80]!r}" for where, text in found if REST.search(text)]
    assert not rest, "reST in the OpenAPI descriptions:\n" + "\n".join(rest)
    # The conversion kept the code: backticks of Markdown where reST had double ones.
    listing = spec["paths"]["/api/v1/executions"]["get"]["description"]
    assert "`next_cursor`" in listing


def test_the_docs_page_renders_markdown_and_resolved_schemas(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    page = http.get("/api/v1/docs")
    assert page.status_code == 200
    text = page.text
    assert "$ref" not in text and "#/components/schemas" not in text
    assert not REST.search(text)
    assert "<code>next_cursor</code>" in text  # a description's code, rendered
    links = set(re.findall(r'href="#schema-([A-Za-z0-9_]+)"', text))
    targets = set(re.findall(r'id="schema-([A-Za-z0-9_]+)"', text))
    assert targets == set(spec["components"]["schemas"])
    assert links and links <= targets, links - targets
    # A body and an answer are the schema's name, linked: POST /api/v1/executions.
    start = text[text.index("<code>/api/v1/executions</code>"):][:2000]
    assert 'body:</span> <a href="#schema-StartBody">StartBody</a>' in start
    assert 'answer:</span> <a href="#schema-Started">Started</a>' in start
