"""The server's CPU figure of ``konduit bench --only shapes``: read from /proc, and it grows
with work the server does."""

from __future__ import annotations

import psycopg
import pytest

from konduit.bench.shapes import server_cpu_seconds

pytestmark = [pytest.mark.storage]


def test_server_cpu_is_read_and_grows_with_the_servers_work(db_url):
    before = server_cpu_seconds(db_url)
    assert before is not None and before > 0  # the test servers run on this machine
    with psycopg.connect(db_url, autocommit=True) as conn:
        # About a second of server CPU, whatever the machine's load (CPU time, not wall time).
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000) g, LATERAL md5(g::text)")
    after = server_cpu_seconds(db_url)
    assert after is not None and after > before


def test_a_server_that_cannot_be_reached_has_no_figure():
    assert server_cpu_seconds("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1") is None
