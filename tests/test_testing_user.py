"""konduit.testing as a user's test suite would use it: no conftest fixtures, only the package."""

from __future__ import annotations

import threading

import psycopg
import pytest

import konduit
import konduit.testing

pytestmark = [pytest.mark.storage]

wf = konduit.Workflow("word-lengths", version=1)


@wf.step()
def split(ctx: konduit.Context) -> list[str]:
    return str(ctx.input["text"]).split()


@wf.map(after=[split], over=lambda words: words)
def measure(ctx: konduit.Context) -> int:
    return len(ctx.item)


@wf.step(after=[split])
async def shout(ctx: konduit.Context) -> str:
    return " ".join(ctx.upstream["split"]).upper()


@wf.step(after=[measure, shout])
def report(ctx: konduit.Context) -> dict[str, object]:
    return {"lengths": ctx.upstream["measure"], "shout": ctx.upstream["shout"]}


def test_run_a_fan_out_fan_in_workflow() -> None:
    with konduit.testing.run([wf]) as app:
        result = app.start("word-lengths", input={"text": "a durable join"}).wait(timeout=30)
    assert result.output == {"lengths": [1, 7, 4], "shout": "A DURABLE JOIN"}


def test_run_takes_an_app_and_leaves_it_alone() -> None:
    mine = konduit.App([wf], database_url="postgresql://nobody@invalid.invalid/never")
    with konduit.testing.run(mine, concurrency=2) as app:
        assert app is not mine
        assert app.start("word-lengths", input={"text": "x yy"}).wait(timeout=30).output == {
            "lengths": [1, 2], "shout": "X YY"}


def test_each_run_gets_its_own_database_and_drops_it() -> None:
    with konduit.testing.run([wf]) as first, konduit.testing.run([wf]) as second:
        assert first.database_url != second.database_url
        first.start("word-lengths", input={"text": "one"}, idempotency_key="k").wait(timeout=30)
        assert second.list() == []
        url = first.database_url
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(url).close()


def test_a_failing_step_fails_the_execution_not_the_worker() -> None:
    broken = konduit.Workflow("broken", version=1)

    @broken.step(retry=konduit.Retry(max_attempts=1))
    def explode(ctx: konduit.Context) -> None:
        raise ValueError("boom")

    with konduit.testing.run([broken]) as app, pytest.raises(konduit.ExecutionFailed):
        app.start("broken").wait(timeout=30)


def test_a_worker_that_dies_is_reported_at_the_end_of_the_block() -> None:
    with pytest.raises(konduit.testing.TestWorkerError), konduit.testing.run(
        [wf], concurrency=0  # an invalid worker setting: the worker thread dies at once
    ):
        pass


def test_fresh_database_yields_a_migrated_database() -> None:
    with konduit.testing.fresh_database() as url, konduit.App([wf], database_url=url) as app:
        assert app.list() == []
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(url).close()


def test_many_threads_may_run_at_once() -> None:
    outputs: list[object] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def one(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            with konduit.testing.run([wf], concurrency=2) as app:
                result = app.start("word-lengths", input={"text": "w" * (i + 1)}).wait(timeout=60)
                outputs.append(result.output["lengths"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(outputs) == [[1], [2], [3], [4]]  # type: ignore[type-var]


@pytest.mark.storage
def test_a_database_of_its_own_another_build_migrated_is_made_again(
        admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """konduit demo's database (konduit_demo) outlives the konduit that made it: one a
    development build migrated with another migration (here 0049 recorded, 0048 never
    applied) refused every later run (konduit.SchemaGap) until dropped by hand. Being its own,
    it is dropped and made again, with a warning; a database the URL names itself is never
    dropped."""
    import uuid

    from konduit.databases import drop_own_database, own_database
    from konduit.db.migrate import latest_version

    name = f"konduit_own_{uuid.uuid4().hex[:8]}"
    url = own_database(name, admin_url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE konduit_left_by_another_build (x int)")
            conn.execute("DELETE FROM konduit_schema_version WHERE version = %s",
                         (latest_version() - 1,))
        with pytest.raises(konduit.SchemaGap), konduit.App([], database_url=url) as app:
            app.migrate()  # what every run met before
        with caplog.at_level("WARNING", logger="konduit.databases"):
            assert own_database(name, admin_url) == url
        assert "dropped and made again" in caplog.text
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('konduit_left_by_another_build')"
                                ).fetchone() == (None,)
            assert conn.execute("SELECT max(version) FROM konduit_schema_version"
                                ).fetchone() == (latest_version(),)
        # The database a URL names is the user's: refused as before, never dropped.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM konduit_schema_version WHERE version = %s",
                         (latest_version() - 1,))
        with pytest.raises(konduit.SchemaGap):
            own_database(name, url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM konduit_schema_version WHERE version = %s",
                                (latest_version() - 1,)).fetchone() == (0,)
    finally:
        drop_own_database(name, admin_url)
