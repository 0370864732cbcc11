"""Ids people can tell apart: the shortened id is the random tail, and any unique prefix or tail
of an id names its execution in the client, the API and the CLI (ambiguous: the candidates)."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

import httpx
import pytest

import konduit
from konduit.core.ids import id_pattern, matches, prefix_range, short_id, uuid7
from konduit.errors import AmbiguousExecutionId, ExecutionNotFound
from konduit.web import create_app, database_client
from tests.support.browser import serving
from tests.test_cli import assert_clean_error, konduit_cli

A = UUID("01a2337b-0000-7000-8000-0000aaaa1111")
B = UUID("01a2337b-0000-7000-8000-0000bbbb2222")
C = UUID("01a2337c-0000-7000-8000-0000bbbb3333")


def test_short_id_is_the_random_tail_of_ids_of_the_same_minute() -> None:
    first, second = uuid7(), uuid7()
    assert str(first)[:8] == str(second)[:8]  # the timestamp part reads the same
    assert short_id(first) != short_id(second)
    assert short_id(first) == str(first).rsplit("-", 1)[1] and len(short_id(first)) == 12
    assert short_id(str(first).upper()) == short_id(first)


def test_id_pattern_takes_prefixes_tails_and_whole_ids() -> None:
    assert id_pattern(str(A)).full == A
    assert id_pattern(A.hex).full == A
    tail = id_pattern("…" + short_id(A))  # as a page shows it, ellipsis and all
    assert tail.full is None and matches(tail, A) and not matches(tail, B)
    prefix = id_pattern("01a2337b-00")
    assert matches(prefix, A) and matches(prefix, B) and not matches(prefix, C)
    low, high = prefix_range(id_pattern("01a2337b"))
    assert low <= A <= high and low <= B <= high and not low <= C <= high


@pytest.mark.parametrize("bad", ["", "xyz", "abc", "01a2-zz", "0" * 33])
def test_id_pattern_refuses_what_cannot_be_a_piece_of_an_id(bad: str) -> None:
    with pytest.raises(ValueError, match=r"execution id|too short"):
        id_pattern(bad)


def insert(db_url: str, *ids: UUID) -> None:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO konduit_workflows (name, version, spec_hash, spec) "
                     "VALUES ('w', 1, 'h', '{\"steps\": []}') ON CONFLICT DO NOTHING")
        for eid in ids:
            conn.execute("INSERT INTO konduit_executions (id, workflow_name, workflow_version, "
                         "status, input, input_hash, steps_pending, finished_at) VALUES (%s, 'w', 1, "
                         "'succeeded', 'null', 'h', 0, now())", (eid,))


@pytest.mark.storage
def test_the_client_resolves_a_unique_prefix_or_tail_and_lists_candidates_otherwise(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    insert(db_url, A, B, C)
    app = make_app()

    def run(text: str) -> UUID:
        return app._do(lambda c: c.resolve(text))

    assert run(short_id(A)) == A
    assert run("…" + short_id(B)) == B
    assert run("01a2337c") == C  # a unique prefix
    assert run("bbbb3333") == C  # a unique tail
    assert run(str(A)) == A
    with pytest.raises(AmbiguousExecutionId) as ambiguous:
        run("01a2337b")
    assert set(ambiguous.value.candidates) == {str(A), str(B)}
    assert str(A) in str(ambiguous.value) and str(B) in str(ambiguous.value)
    with pytest.raises(ExecutionNotFound, match="starts or ends with 'dddd4444'"):
        run("dddd4444")
    with pytest.raises(ExecutionNotFound, match="too short"):
        run("01a")
    assert app.status(short_id(A)).id == A  # every Client entry point takes a piece too


@pytest.mark.storage
def test_the_api_and_pages_take_a_piece_of_an_id(make_app: Callable[..., konduit.App],
                                                  db_url: str) -> None:
    insert(db_url, A, B, C)
    with serving(create_app(database_client(db_url))) as base, \
            httpx.Client(base_url=base) as http:
        found = http.get(f"/api/v1/executions/{short_id(C)}")
        assert found.status_code == 200 and found.json()["id"] == str(C)
        ambiguous = http.get("/api/v1/executions/01a2337b")
        assert ambiguous.status_code == 409
        assert str(A) in ambiguous.json()["detail"] and str(B) in ambiguous.json()["detail"]
        assert http.get("/api/v1/executions/dddd4444").status_code == 404
        assert http.post("/api/v1/executions/01a2337b/cancel").status_code == 409
        page = http.get(f"/executions/{short_id(A)}")
        assert page.status_code == 200 and str(A) in page.text
        listed = http.get("/")
        assert short_id(A) in listed.text and short_id(B) in listed.text


@pytest.mark.storage
def test_the_cli_takes_a_piece_of_an_id(db_url: str) -> None:
    insert(db_url, A, B, C)
    shown = konduit_cli("status", "bbbb3333", "--database-url", db_url)
    assert shown.returncode == 0, shown.stderr
    assert str(C) in shown.stdout
    ambiguous = konduit_cli("status", "01a2337b", "--database-url", db_url)
    assert_clean_error(ambiguous, "matches several executions", str(A), str(B))
