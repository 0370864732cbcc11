"""A durable stream through every door (docs/streams.md): the API's server-sent events, which a
client that disconnects resumes with Last-Event-ID (every record once, in order), the API's
execution detail and list of streams, ``konduit stream`` (``--from``, ``--follow``, ``--json``),
and the execution page's live view in a real browser, which shows records as they are written."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from typer.testing import CliRunner

import konduit
from konduit.cli import cli
from konduit.web import create_app, database_client
from tests.support.browser import browser, csp_violations, css, eventually, screenshot, serving
from tests.support.waiting import until
from tests.support.workers import running_worker

__all__ = ["browser"]

pytestmark = [pytest.mark.storage]


def talker(gate: threading.Event, name: str = "stream-doors") -> konduit.Workflow:
    """Writes two chunks, waits for ``gate``, writes two more."""
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def talk(ctx):
        ctx.stream.write("hello")
        ctx.stream.write({"n": 1})
        assert gate.wait(60)
        ctx.stream.write("more")
        ctx.stream.write("bye")
        return "done"

    return wf


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streamed answer, as dicts of their fields."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        field, _, value = line.partition(": ")
        event[field] = value


def test_the_api_follows_a_stream_and_resumes_after_last_event_id(make_app, db_url):
    gate = threading.Event()
    app = make_app(talker(gate))
    with running_worker(app), \
            serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=60) as http:
        eid = str(app.start("stream-doors").id)
        until(lambda: len(list(app.stream(eid, "talk", follow=False))) == 2, 60, "two chunks")
        url = f"/api/v1/executions/{eid}/streams/talk"
        first: list[dict[str, Any]] = []
        with http.stream("GET", url) as answer:
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            for event in events(answer):
                first.append(event)
                if len(first) == 2:
                    break  # the client goes away in the middle of a live stream
        assert [(e["id"], e["event"], json.loads(e["data"])["data"]) for e in first] == [
            ("0", "data", "hello"), ("1", "data", {"n": 1})]
        gate.set()
        with http.stream("GET", url, headers={"Last-Event-ID": first[-1]["id"]}) as answer:
            rest = list(events(answer))
        assert [(e.get("id"), e["event"]) for e in rest] == [
            ("2", "data"), ("3", "data"), (None, "end")]
        assert [json.loads(e["data"])["data"] for e in rest[:2]] == ["more", "bye"]
        # from_offset without following: what is stored now, then the end.
        with http.stream("GET", url, params={"from_offset": 3, "follow": "false"}) as answer:
            assert [e["event"] for e in events(answer)] == ["data", "end"]
        detail = http.get(f"/api/v1/executions/{eid}").json()
        assert [(s["name"], s["step"], s["chunks"], s["next_offset"]) for s in detail["streams"]] \
            == [("talk", "talk", 4, 4)]
        assert http.get(f"/api/v1/executions/{eid}/streams").json()[0]["name"] == "talk"
        missing = http.get("/api/v1/executions/00000000-0000-0000-0000-000000000000/streams/x")
        assert missing.status_code == 404
        bad = http.get(url, headers={"Last-Event-ID": "soon"})
        assert bad.status_code == 400 and bad.json()["field"] == "header.last-event-id"


def test_konduit_stream_prints_resumes_and_follows(make_app, db_url):
    gate = threading.Event()
    app = make_app(talker(gate, "stream-cli"))
    runner = CliRunner()
    with running_worker(app):
        eid = str(app.start("stream-cli").id)
        until(lambda: len(list(app.stream(eid, "talk", follow=False))) == 2, 60, "two chunks")
        stored = runner.invoke(cli, ["stream", eid, "--database-url", db_url])
        assert stored.exit_code == 0, stored.output
        assert stored.output.splitlines() == ['0  "hello"', '1  {"n": 1}']
        gate.set()
        followed = runner.invoke(cli, ["stream", eid[-8:], "--name", "talk", "--from", "1",
                                       "--follow", "--json", "--database-url", db_url])
        assert followed.exit_code == 0, followed.output
        lines = [json.loads(line) for line in followed.output.splitlines()]
        assert [(r["offset"], r["data"]) for r in lines] == [(1, {"n": 1}), (2, "more"),
                                                             (3, "bye")]
        status = runner.invoke(cli, ["status", eid, "--database-url", db_url])
        assert "stream talk: 4 chunks" in status.output, status.output


def test_the_execution_page_shows_a_stream_live(make_app: Callable[..., konduit.App],
                                                db_url: str, browser: WebDriver) -> None:
    gate = threading.Event()
    app = make_app(talker(gate, "stream-page"))
    with running_worker(app), serving(create_app(database_client(db_url, app), app)) as base:
        eid = app.start("stream-page").id
        # Opened before anything was written: the page finds the stream when it appears.
        browser.get(f"{base}/executions/{eid}")
        eventually(browser, lambda d: len(css(d, "#streams .stream-record")) == 2, timeout=60)
        records = [e.text for e in css(browser, "#streams .stream-record")]
        assert records == ["0  hello", '1  {"n":1}']
        assert app.status(eid).status == "running"  # shown live, not after the end
        screenshot(browser, "stream-live")
        gate.set()
        eventually(browser, lambda d: css(d, "#streams section.stream[data-ended='1']"),
                   timeout=60)
        records = [e.text for e in css(browser, "#streams .stream-record")]
        assert records == ["0  hello", '1  {"n":1}', "2  more", "3  bye"]
        assert csp_violations(browser) == []
        # A finished execution's page replays its streams.
        browser.get(f"{base}/executions/{eid}")
        eventually(browser, lambda d: len(css(d, "#streams .stream-record")) == 4, timeout=60)
        screenshot(browser, "stream-ended")


def test_a_quiet_followed_stream_sends_keep_alive_comments(make_app, db_url, monkeypatch):
    """A proxy closes a connection idle past its timeout: while the stream is quiet the answer
    carries SSE comments (ignored by readers) every KONDUIT_STREAM_KEEPALIVE seconds, and the
    records still arrive once, in order. The client plays a proxy whose idle timeout (5 s) is
    shorter than the default interval (15 s) and far longer than the one set (0.2 s)."""
    monkeypatch.setenv("KONDUIT_STREAM_KEEPALIVE", "0.2")  # read by the server per request
    gate = threading.Event()
    app = make_app(talker(gate, "stream-quiet"))
    with running_worker(app), \
            serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=httpx.Timeout(60, read=5)) as http:
        eid = str(app.start("stream-quiet").id)
        until(lambda: len(list(app.stream(eid, "talk", follow=False))) == 2, 60, "two chunks")
        lines: list[str] = []
        with http.stream("GET", f"/api/v1/executions/{eid}/streams/talk") as answer:
            for line in answer.iter_lines():
                lines.append(line)
                if lines.count(": keep-alive") == 3:
                    gate.set()  # the rest of the records come after three quiet beats
                if line.startswith("event: end"):
                    break
    assert lines.count(": keep-alive") >= 3
    ids = [line for line in lines if line.startswith("id: ")]
    assert ids == ["id: 0", "id: 1", "id: 2", "id: 3"]
