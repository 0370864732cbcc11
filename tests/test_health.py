"""``konduit health``: the container image's HEALTHCHECK and a Kubernetes probe's command. Exit 0
when the configured database answers with the schema this konduit needs, and with ``--worker``
when a worker of this host is live too; otherwise exit 1 with one line saying why."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

import konduit
from tests.support.workers import running_worker
from tests.test_cli_faces import assert_clean_error, konduit_cli


def test_without_a_database_url_it_says_which_to_set() -> None:
    # Not the embedded server: a probe checks the database the container was given.
    assert_clean_error(konduit_cli("health"), "KONDUIT_DATABASE_URL", "--database-url")


def test_a_database_that_does_not_answer_is_unhealthy() -> None:
    assert_clean_error(konduit_cli("health", "--database-url", "postgresql://nobody@127.0.0.1:1/x"),
                       "cannot connect")


@pytest.mark.storage
def test_a_database_without_the_schema_is_unhealthy(empty_db_url: str) -> None:
    assert_clean_error(konduit_cli("health", "--database-url", empty_db_url), "konduit db migrate")


@pytest.mark.storage
def test_healthy_database_and_a_live_worker_of_this_host(make_app: Callable[..., konduit.App],
                                                         db_url: str) -> None:
    done = konduit_cli("health", "--database-url", db_url)
    assert done.returncode == 0 and done.stdout.startswith("ok: "), (done.stdout, done.stderr)

    host = socket.gethostname()
    assert_clean_error(konduit_cli("health", "--worker", "--database-url", db_url),
                       f"no live worker on {host}")

    wf = konduit.Workflow("health-check", version=1)

    @wf.step()
    def noop(ctx: konduit.Context) -> None:
        return None

    with running_worker(make_app(wf)):
        done = konduit_cli("health", "--worker", "--database-url", db_url)
    assert done.returncode == 0, done.stderr
    assert f"a live worker on {host}" in done.stdout
