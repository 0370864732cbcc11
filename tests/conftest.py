"""Shared fixtures, built on ``konduit.testing``: every storage test gets a real PostgreSQL
database of its own.

``db_url`` is a migrated, empty database from a :class:`konduit.testing.DatabasePool`: reset
(truncated) after each test and handed to the next, instead of cloned and dropped, which costs
a second or more per test on a busy machine. A test that changes the schema gets its database
dropped (the pool notices); one marked ``fresh_database`` gets a new one. The server is the
embedded one by default, or the one named by ``KONDUIT_TEST_DATABASE_URL`` (a URL whose
database is used only to create and drop the test databases).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

# An environment with PYTHONDONTWRITEBYTECODE set makes every process of a run compile what it
# imports: each pytest worker rewrote the assertions of every test module (13 s of CPU to
# collect instead of 4.5 s) and each worker process a test spawns compiled the package
# (+0.2 s). The suite keeps its bytecode outside the tree instead (a cache per user in the
# temporary directory), for this process and the processes it starts; the tree stays clean.
if sys.dont_write_bytecode:
    _cache = os.path.join(tempfile.gettempdir(), f"konduit-tests-pycache-{os.getuid()}")
    sys.pycache_prefix = _cache
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = _cache
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest  # after the bytecode settings: the imports below use them
from hypothesis import settings

import konduit
import konduit.db.embedded
import konduit.testing
from konduit.db.embedded import server_url

# Re-exported: tests import ``running_worker`` from here.
from tests.support.workers import running_worker

__all__ = ["running_worker"]

# Hypothesis fails an example that takes more than 200 ms, or that took more the first time than
# when replayed ("Unreliable test timings"): on a machine other processes overload, an example
# that waited for a core fails a property test that checks arithmetic, not speed
# (test_fair_turns failed so at load 15-22 on 2 cores, issue 29). No property test here is about
# speed: the deadline is off for all of them; pytest's timeout still bounds a hang.
settings.register_profile("konduit", deadline=None)
settings.load_profile("konduit")

pytest_plugins = ["tests.support.browser"]  # the browser fixture of the dashboard tests

# What the database fixtures cost, for the summary at the end of the run.
_pools: list[konduit.testing.DatabasePool] = []
_fixture_seconds: list[float] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test whose handlers log hostile text (a lone surrogate) has it in its captured output:
    an xdist worker cannot send such a report (it must be UTF-8) and dies with the whole run.
    The report keeps the text, escaped, before xdist sends it."""
    report.sections = [(title, _utf8(content)) for title, content in report.sections]


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (the order is otherwise kept): under ``--dist loadgroup`` each
    worker takes tests as it finishes others, so a 60-90 s test begun last would run alone
    at the end while the other workers idle; begun first, the short tests fill in around it.
    Every worker sorts the same collection the same way, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--payload-codec", action="store_true", help=(
        "run the tests with every App, Client and worker encrypting payloads (an Encrypted "
        "codec from KONDUIT_CODEC_KEYS, a key made for the run); tests that SELECT payload "
        "columns themselves see envelopes then (docs/payload-codecs.md)"))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--payload-codec", default=False):
        import base64
        import os

        os.environ["KONDUIT_CODEC_KEYS"] = "k1:" + base64.b64encode(os.urandom(32)).decode()
    config.addinivalue_line(
        "markers", "fresh_database: db_url is a new database, not a reset one from the pool"
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The test processes (``-n`` in pyproject) need more than PostgreSQL's default 100
    connections: an embedded server started before Konduit raised its setting runs with the
    old one until it restarts. Said up front, so "too many clients" has its explanation."""
    if os.environ.get("KONDUIT_TEST_DATABASE_URL") or konduit.db.embedded.MAX_CONNECTIONS is None:
        return []
    status = konduit.db.embedded.server_status()
    if not status["running"] or not status["url"]:
        return []
    import psycopg

    try:
        with psycopg.connect(str(status["url"]), connect_timeout=5) as conn:
            row = conn.execute("SELECT setting::int FROM pg_settings"
                               " WHERE name = 'max_connections'").fetchone()
    except psycopg.Error:
        return []
    if row is None or int(row[0]) >= konduit.db.embedded.MAX_CONNECTIONS:
        return []
    return [f"the embedded PostgreSQL server runs with max_connections = {row[0]}, fewer than "
            f"the test processes may need: it takes {konduit.db.embedded.MAX_CONNECTIONS} from "
            f"its next start (`konduit embedded stop` when nothing else uses it)"]


@pytest.fixture(scope="session")
def admin_url() -> str:
    return os.environ.get("KONDUIT_TEST_DATABASE_URL") or server_url("postgres")


@pytest.fixture(scope="session")
def database_pool(admin_url: str) -> Iterator[konduit.testing.DatabasePool]:
    pool = konduit.testing.DatabasePool(admin_url)
    _pools.append(pool)
    yield pool
    pool.close()


@pytest.fixture
def db_url(request: pytest.FixtureRequest,
           database_pool: konduit.testing.DatabasePool) -> Iterator[str]:
    """A migrated database for this test, empty: reset from the pool, or new when the test is
    marked ``fresh_database``."""
    fresh = request.node.get_closest_marker("fresh_database") is not None
    began = time.perf_counter()
    with database_pool.database(fresh=fresh) as url:
        _fixture_seconds.append(time.perf_counter() - began)
        yield url
        began = time.perf_counter()
    _fixture_seconds.append(time.perf_counter() - began)


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """A database on the test server that was never migrated."""
    with konduit.testing.fresh_database(admin_url, migrate=False) as url:
        yield url


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., konduit.App]]:
    """Build Apps on this test's database; all are closed after the test."""
    apps: list[konduit.App] = []

    def make(*workflows: konduit.Workflow, **kwargs: object) -> konduit.App:
        app = konduit.App(list(workflows), database_url=db_url, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def worker() -> Callable[..., object]:
    return running_worker


# Under xdist the pools live in the workers: each sends its figures to the controller at its end
# (xdist's workeroutput), which sums them in the summary.
_figures: list[dict[str, Any]] = []


def _own_figures() -> dict[str, Any]:
    return {"reused": sum(p.reused for p in _pools), "created": sum(p.created for p in _pools),
            "seconds": sum(_fixture_seconds), "uses": len(_fixture_seconds) // 2,
            "not_reset": [reason for p in _pools for reason in p.not_reset]}


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker
        output["konduit_database_pool"] = _own_figures()


def pytest_testnodedown(node: object, error: object) -> None:  # an xdist hook, controller side
    figures = getattr(node, "workeroutput", {}).get("konduit_database_pool")
    if figures:
        _figures.append(figures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = [*_figures, *([_own_figures()] if _pools else [])]
    if not figures:
        return
    seconds = sum(float(f["seconds"]) for f in figures)
    uses = sum(int(f["uses"]) for f in figures)
    terminalreporter.write_line(
        f"database pool: {sum(int(f['reused']) for f in figures)} tests on a reset database, "
        f"{sum(int(f['created']) for f in figures)} on a new one; "
        f"db_url set-up and tear-down {seconds:.1f} s in all"
        f" ({seconds / max(uses, 1) * 1000:.0f} ms a test)"
    )
    for f in figures:
        for reason in f["not_reset"]:
            terminalreporter.write_line(f"  not reset: {reason}")
