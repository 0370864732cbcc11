"""Strategies the schemathesis run (tests/test_openapi_schemathesis.py) adds to its own, loaded
through ``SCHEMATHESIS_HOOKS``: besides what it generates from the schema, a body or a query
with one value replaced by text with a NUL character or a number out of every column's range,
which a schema cannot say it refuses (they must be answered 4xx, never 5xx)."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

HUGE = 10**20
BODY_VALUES = st.sampled_from(["a\x00b", "\x00", HUGE, -HUGE, 1e308, -1e308, str(HUGE),
                               f"api-flow@{HUGE}", {"k": "a\x00b"}, ["a\x00b"]])
QUERY_VALUES = st.sampled_from(["a\x00b", str(HUGE), str(-HUGE), "1e308", f"api-flow@{HUGE}",
                                "k=a\x00b", f"x={HUGE}"])


def spoiled(value: Any, bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value`` (a dict) with one entry's value replaced by one of ``bad`` (an entry of the
    first of a batch's requests too)."""
    if not isinstance(value, dict) or not value:
        return st.just(value)
    choices = st.tuples(st.sampled_from(sorted(value)), bad).map(
        lambda kv: {**value, kv[0]: kv[1]})
    inner = value.get("requests")
    if isinstance(inner, list) and inner and isinstance(inner[0], dict):
        choices = st.one_of(choices, spoiled(inner[0], bad).map(
            lambda first: {**value, "requests": [first, *inner[1:]]}))
    return choices


@schemathesis.hook
def before_generate_body(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy.flatmap(lambda body: spoiled(body, BODY_VALUES)))


@schemathesis.hook
def before_generate_query(context: Any,
                          strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy.flatmap(lambda query: spoiled(query, QUERY_VALUES)))
