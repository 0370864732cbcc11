"""Find any execution through the faces (issue 18, item 6): ``konduit list`` in a subprocess
and ``GET /api/v1/executions`` over real HTTP, by tag, key, id start and end, input field,
status, workflow@version and time range; ``konduit start --tag --delay`` and the API's start body
``tags``/``delay``/``priority``; bad filters refused naming what is at fault."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import konduit
from tests.support.payloads import codec_on
from tests.support.workers import running_worker
from tests.test_api_v1 import api, refused
from tests.test_cli import assert_clean_error, konduit_cli

pytestmark = [pytest.mark.storage]


def show() -> konduit.Workflow:
    wf = konduit.Workflow("show", version=1)

    @wf.step()
    def air(ctx: Any) -> Any:
        return ctx.input

    return wf


def started(app: konduit.App) -> dict[str, str]:
    return {
        "acme": str(app.start("show", {"episode": 42}, tags={"customer": "acme"},
                              idempotency_key="nightly-42").id),
        "beta": str(app.start("show", {"episode": 7, "title": "x y"},
                              tags={"customer": "beta"}).id),
        "plain": str(app.start("show", {"episode": 8}).id),
    }


def listed(db_url: str, *args: str) -> list[str]:
    proc = konduit_cli("list", "--json", "--database-url", db_url, *args)
    assert proc.returncode == 0, proc.stderr
    return [row["id"] for row in json.loads(proc.stdout)]


def test_konduit_list_finds_by_each_filter(make_app: Callable[..., konduit.App],
                                          db_url: str) -> None:
    app = make_app(show())
    ids = started(app)
    assert listed(db_url, "--tag", "customer=acme") == [ids["acme"]]
    assert listed(db_url, "--key", "nightly-42") == [ids["acme"]]
    if codec_on():  # a sealed input cannot be searched: refused, naming the codec
        proc = konduit_cli("list", "--json", "--database-url", db_url, "--input", "episode=7")
        assert proc.returncode == 1 and "input: " in proc.stderr and "codec" in proc.stderr
    else:
        assert listed(db_url, "--input", "input.episode=7") == [ids["beta"]]
        assert listed(db_url, "--input", 'title="x y"', "--input", "episode=7") == [ids["beta"]]
    assert listed(db_url, "--id", ids["plain"][-12:]) == [ids["plain"]]
    assert ids["plain"] in listed(db_url, "--id", ids["plain"][:18])
    assert listed(db_url, "--workflow", "show@1", "--since", "10m") == [
        ids["plain"], ids["beta"], ids["acme"]]
    assert listed(db_url, "--workflow", "show@2") == []
    assert listed(db_url, "--until", "10m") == []
    assert listed(db_url, "--status", "running", "--tag", "customer=beta") == [ids["beta"]]
    proc = konduit_cli("list", "--json", "--database-url", db_url, "--tag", "customer=acme")
    [row] = json.loads(proc.stdout)
    assert row["tags"] == {"customer": "acme"} and row["idempotency_key"] == "nightly-42"
    # The table shows the tags too.
    proc = konduit_cli("list", "--database-url", db_url, "--tag", "customer=acme")
    assert proc.returncode == 0 and ids["acme"][-12:] in proc.stdout and "customer=acme" in proc.stdout

    for args, needle in ((["--tag", "customer"], "name=value"),
                         (["--id", "zz"], "hex digits"),
                         (["--workflow", "show@x"], "whole number"),
                         (["--since", "yesterday-ish"], "since")):
        assert_clean_error(konduit_cli("list", "--database-url", db_url, *args), needle)
    # A status not among the choices is a usage error (exit 2) that lists them.
    typo = konduit_cli("list", "--database-url", db_url, "--status", "runing")
    assert typo.returncode == 2 and typo.stderr.startswith("error: ")
    assert "'runing' is not one of" in typo.stderr and "'running'" in typo.stderr


def test_konduit_start_tags_and_delays(make_app: Callable[..., konduit.App], db_url: str,
                                       tmp_path: Any) -> None:
    (tmp_path / "show_app.py").write_text(
        "import konduit\n"
        "wf = konduit.Workflow('show', version=1)\n"
        "@wf.step()\n"
        "def air(ctx):\n"
        "    return ctx.input\n"
        "app = konduit.App([wf])\n")
    proc = konduit_cli("start", "show", "--app", "show_app:app", "--database-url", db_url,
                       "--tag", "customer=acme", "--tag", "tier=gold", "--delay", "1h",
                       "--priority", "-2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    eid = proc.stdout.strip()
    app = make_app(show())
    [found] = app.search(tags={"tier": "gold"})
    assert str(found.id) == eid and found.status == "scheduled" and found.priority == -2
    assert listed(db_url, "--status", "scheduled") == [eid]
    assert_clean_error(konduit_cli("start", "show", "--app", "show_app:app", "--database-url",
                                   db_url, "--delay", "soon", cwd=tmp_path), "delay")


def test_the_api_finds_by_each_filter_and_pages_with_them(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(show())
    ids = started(app)
    with api(app, db_url) as http:
        def found(**params: Any) -> list[str]:
            response = http.get("/api/v1/executions", params=params)
            assert response.status_code == 200, response.text
            return [item["id"] for item in response.json()["items"]]

        assert found(tag="customer=acme") == [ids["acme"]]
        assert found(key="nightly-42") == [ids["acme"]]
        if codec_on():  # a sealed input cannot be searched: refused, naming the codec
            problem = refused(http.get("/api/v1/executions", params={"input": "episode=42"}),
                              422, "query.input")
            assert "codec" in problem["detail"]
        else:
            assert found(input="episode=42") == [ids["acme"]]
        assert found(id=ids["beta"][-12:]) == [ids["beta"]]
        assert found(workflow="show@1", since="1h") == [ids["plain"], ids["beta"], ids["acme"]]
        refused(http.get("/api/v1/executions", params={"tag": ["customer=beta", "customer=acme"]}),
                422, "query.tag")
        body = http.get("/api/v1/executions", params={"tag": "customer=acme"}).json()
        assert body["items"][0]["tags"] == {"customer": "acme"}

        # Pages of two, the filter kept: the cursor goes on where the first page ended.
        page = http.get("/api/v1/executions", params={"since": "1h", "limit": 2}).json()
        assert [i["id"] for i in page["items"]] == [ids["plain"], ids["beta"]]
        rest = http.get("/api/v1/executions", params={"since": "1h", "limit": 2,
                                                     "cursor": page["next_cursor"]}).json()
        assert [i["id"] for i in rest["items"]] == [ids["acme"]] and rest["next_cursor"] is None

        for params in ({"tag": "nokey"}, {"id": "xyz"}, {"workflow": "show@0"},
                       {"since": "whenever"}, {"input": "a..b=1"}):
            # The parameter at fault is named.
            body = refused(http.get("/api/v1/executions", params=params), 422,
                           f"query.{next(iter(params))}")
            assert "Traceback" not in body["detail"]

        # The start body carries tags, a delay and a priority.
        response = http.post("/api/v1/executions", json={
            "workflow": "show", "input": {"episode": 9}, "tags": {"customer": "gamma"},
            "delay": "1h", "priority": 3})
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "scheduled"
        [item] = http.get("/api/v1/executions", params={"tag": "customer=gamma"}).json()["items"]
        assert item["status"] == "scheduled" and item["priority"] == 3 and item["run_at"]
        refused(http.post("/api/v1/executions", json={"workflow": "show", "tags": {"k": 1}}), 422)
        refused(http.post("/api/v1/executions", json={
            "workflow": "show", "tags": {"k" * 65: "v"}}), 422, "body.tags")
        refused(http.post("/api/v1/executions", json={
            "workflow": "show", "delay": "1m", "run_at": "2099-01-01T00:00:00Z"}), 422,
            "body.delay")
        # And a scheduled one can be cancelled through the API.
        gamma = item["id"]
        assert http.post(f"/api/v1/executions/{gamma}/cancel").status_code == 200
        assert http.get(f"/api/v1/executions/{gamma}").json()["status"] == "cancelled"


def test_a_worker_finishes_what_the_api_started_with_a_short_delay(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(show())
    with api(app, db_url) as http, running_worker(app, maintenance_interval=0.5):
        response = http.post("/api/v1/executions", json={"workflow": "show", "input": 1,
                                                          "delay": 0.5})
        assert response.status_code == 201, response.text
        assert app.wait(response.json()["id"], timeout=60).output == 1
