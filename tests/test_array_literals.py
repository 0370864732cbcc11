"""Array parameters written as PostgreSQL array literals (konduit.db.arrays) read back, through
the server's own array input, as exactly the lists they were made of."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from konduit.core.model import Outcome, StepStatus
from konduit.db.arrays import array_literal, with_array_literals

pytestmark = pytest.mark.storage

TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)
TIMES = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                     timezones=st.just(UTC))
CASES: list[tuple[str, Any]] = [
    ("text[]", TEXT),
    ("bigint[]", st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    ("float8[]", st.floats(allow_nan=False)),
    ("bool[]", st.booleans()),
    ("uuid[]", st.uuids()),
    ("timestamptz[]", TIMES),
]


@pytest.fixture(scope="module")
def conn(admin_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(admin_url, autocommit=True) as c:
        yield c


@pytest.mark.parametrize(("cast", "elements"), CASES, ids=[c for c, _ in CASES])
def test_every_list_reads_back_as_itself(conn: psycopg.Connection[Any], cast: str,
                                         elements: Any) -> None:
    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.one_of(st.none(), elements), max_size=12))
    def check(values: list[Any]) -> None:
        literal = array_literal(values)
        assert literal is not None
        row = conn.execute(f"SELECT %s::{cast}", (literal,)).fetchone()
        assert row is not None and row[0] == values

    check()


def test_text_that_looks_like_syntax_stays_text(conn: psycopg.Connection[Any]) -> None:
    values = ["NULL", "null", "", " ", "{a,b}", '"', "\\", "a,b", '{"x": "y\\"z"}', "\n\t", None]
    row = conn.execute("SELECT %s::text[]", (array_literal(values),)).fetchone()
    assert row is not None and row[0] == values


def test_mixed_or_unknown_lists_are_left_to_the_driver() -> None:
    assert array_literal([1, "a"]) is None
    assert array_literal([1, True]) is None  # bool is an int subclass: never mixed up
    assert array_literal([{"a": 1}]) is None
    assert array_literal([datetime.now(UTC), datetime.now(UTC) + timedelta(1)]) is not None
    params = with_array_literals({"ids": [1, 2], "nested": [[1]], "one": 3, "u": [uuid.uuid4()]})
    assert params["ids"] == "{1,2}" and params["nested"] == [[1]] and params["one"] == 3
    assert isinstance(params["u"], str)


def test_status_members_and_plain_strings_read_back_as_their_values(
        conn: psycopg.Connection[Any]) -> None:
    # A step row's status read as a plain string beside members that advance() set, and an
    # enum whose own __str__ is not its value: each element is written as its value.
    class Odd(enum.StrEnum):
        A = "a,b"

        def __str__(self) -> str:
            return "not the value"

    values: list[Any] = [StepStatus.ACTIVE, "waiting", None, Outcome.FAILED, Odd.A, '"q"']
    literal = array_literal(values)
    assert literal is not None
    row = conn.execute("SELECT %s::text[]", (literal,)).fetchone()
    assert row is not None and row[0] == ["active", "waiting", None, "failed", "a,b", '"q"']
    assert array_literal([Outcome.FAILED, 1]) is None  # a string beside a number: the driver's


def test_uuids_met_again_are_written_alike() -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    first = array_literal(ids + ids)
    assert first == "{" + ",".join(str(u) for u in ids + ids) + "}"
    assert array_literal(ids) == "{" + ",".join(str(u) for u in ids) + "}"
