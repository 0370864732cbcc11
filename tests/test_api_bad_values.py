"""Every bad value is a 4xx: NUL characters, lone surrogates, numbers out of range and values
that cannot be read, sent into every parameter of every ``/api/v1`` route (enumerated from the
OpenAPI document: a route added later is covered, or this test says what it lacks).

A value the database cannot hold used to reach it and come back ``503 try again``: a client
retried it forever. Each must be refused where it enters (``4xx``, a 422 naming the field at
fault), never answered 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import konduit
from konduit.web import create_app, database_client
from tests.apps import api_app
from tests.support.browser import serving

pytestmark = pytest.mark.storage

NUL = "a\x00b"
SURROGATE = "a\ud800b"  # sent as the JSON escape "\ud800": no UTF-8 text can hold it
HUGE = 10**20

# Bad values of a JSON body's field (json.dumps writes NaN and Infinity, which Python's JSON
# reader, and so the server's, accepts).
BODY_VALUES: list[Any] = [NUL, SURROGATE, HUGE, -HUGE, 1e308, -1e308, float("nan"),
                          float("inf"), str(HUGE), "1e308", f"x@{HUGE}", f"{HUGE}d",
                          "9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00"]
# Bad values of a query parameter or a path segment (text: surrogates cannot be sent in a URL,
# their UTF-8 bytes are read back as U+FFFD).
TEXT_VALUES = [NUL, str(HUGE), str(-HUGE), "1e308", "-1e308", "NaN", "inf", f"{HUGE}d",
               f"api-flow@{HUGE}", f"api-flow@-{HUGE}", f"k={NUL}", f"{NUL}=v", f"x={HUGE}",
               "x=1e999", f"x={NUL}", "x=\"\\u0000\"", "x=\"\\ud800\""]

# A body each operation accepts, the base every bad value is put into.
BODIES: dict[str, dict[str, Any]] = {
    "StartBody": {"workflow": "api-flow", "input": {"fail": False}},
    "BatchBody": {"requests": [{"workflow": "api-flow", "input": {"fail": False}}]},
    "CancelBody": {"reason": "testing"},
    "MigrateBody": {"to_version": 1},
    "ForkBody": {"from_step": "begin"},
    "AnswerBody": {"value": {"decision": "approve"}, "answered_by": "ada"},
    "EventBody": {"name": "evt", "key": "k-1"},
    "BulkBody": {"action": "cancel", "where": {"tag": ["k=v"]}, "dry_run": True},
}


def schema_name(op: dict[str, Any]) -> str | None:
    schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get(
        "schema")
    if schema is None:
        return None
    refs = [schema, *schema.get("anyOf", [])]
    return next(r["$ref"].rsplit("/", 1)[1] for r in refs if "$ref" in r)


def body_variants(spec: dict[str, Any], name: str) -> Iterator[tuple[str, Any]]:
    """(where, body): the base body with one field (or a key or value inside it) bad."""
    base = BODIES[name]
    props = spec["components"]["schemas"][name]["properties"]
    for field in props:
        if field == "requests":  # the batch: each field of its one start
            for where, inner in body_variants(spec, "StartBody"):
                yield f"requests.0.{where}", {"requests": [inner]}
            continue
        for bad in BODY_VALUES:
            yield field, {**base, field: bad}
            if not isinstance(bad, str) or bad in (NUL, SURROGATE):  # inside a mapping too
                yield field, {**base, field: {"k": bad}}
            if bad in (NUL, SURROGATE):  # a mapping's key, and a list's element
                yield field, {**base, field: {bad: "v"}}
                yield field, {**base, field: [bad]}


def send(http: httpx.Client, method: str, url: str, body: Any = None) -> httpx.Response:
    content = None if body is None else json.dumps(body).encode()  # \ud800 as its escape
    return http.request(method, url, content=content,
                        headers={"content-type": "application/json"} if body is not None else {})


@pytest.fixture
def api(make_app: Callable[..., konduit.App], db_url: str) -> Iterator[tuple[httpx.Client, str]]:
    app = make_app(*api_app.WORKFLOWS)
    eid = str(app.start("api-flow", {"fail": False}).id)  # no worker: it stays pending
    with serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        yield http, eid


def test_every_bad_value_is_refused_with_a_4xx(api: tuple[httpx.Client, str]) -> None:
    http, eid = api
    spec = http.get("/openapi.json").json()
    faults: list[str] = []
    sent = 0

    def check(method: str, url: str, where: str, value: Any, body: Any = None) -> None:
        nonlocal sent
        sent += 1
        answer = send(http, method, url, body)
        shown = f"{method} {url} [{where}: {value!r:.80}]"
        unstorable = any(bad in repr(value) for bad in (repr(NUL)[1:-1], repr(SURROGATE)[1:-1]))
        # Text no field can hold is refused; a number or text the field can hold may be taken.
        if answer.status_code >= 500 or (unstorable and answer.status_code < 400):
            faults.append(f"{shown}: {answer.status_code} {answer.text[:300]}")
        elif answer.status_code == 422:  # naming the field at fault (or a part of it)
            named = answer.json().get("field") or ""
            if named != where and not named.startswith(where + "."):
                faults.append(f"{shown}: 422 naming {named or 'no field'}, not {where}: "
                              f"{answer.text[:300]}")

    for path, methods in spec["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, op in methods.items():
            method = method.upper()
            params = [p for p in op.get("parameters", []) if p["in"] in ("path", "query")]
            url = path.replace("{execution_id}", eid)
            name = schema_name(op)
            assert name is None or name in BODIES, f"{method} {path}: add a body for {name}"
            body = None if name is None else BODIES[name]
            for param in params:
                for bad in TEXT_VALUES:
                    if param["in"] == "path":
                        bad_url = path.replace("{" + param["name"] + "}", quote(bad, safe=""))
                    else:
                        bad_url = f"{url}?{param['name']}={quote(bad, safe='')}"
                    check(method, bad_url, f"{param['in']}.{param['name']}", bad, body)
            if name is not None:
                for where, bad_body in body_variants(spec, name):
                    check(method, url, f"body.{where}", bad_body, bad_body)
    assert sent > 1000
    assert not faults, f"{len(faults)} of {sent} bad values not refused:\n" + "\n".join(faults)


LAST_DAY = datetime(9999, 12, 31, tzinfo=UTC)
LAST_HOUR = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))  # 10000 in UTC

PYTHON_CASES: list[tuple[str, Callable[[konduit.App, str], Any], str]] = [
    ("start: workflow NUL", lambda app, e: app.start(NUL), "workflow"),
    ("start: workflow surrogate", lambda app, e: app.start(SURROGATE), "workflow"),
    ("start: idempotency_key NUL",
     lambda app, e: app.start("api-flow", idempotency_key=NUL), "idempotency_key"),
    ("start: idempotency_key surrogate",
     lambda app, e: app.start("api-flow", idempotency_key=SURROGATE), "idempotency_key"),
    ("start: version huge", lambda app, e: app.start("api-flow", version=HUGE), "version"),
    ("start: run_at past 9999 in UTC",
     lambda app, e: app.start("api-flow", run_at=LAST_HOUR), "run_at"),
    ("start: deadline_at past 9999 in UTC",
     lambda app, e: app.start("api-flow", deadline_at=LAST_HOUR), "deadline_at"),
    ("start: timed out past 9999",
     lambda app, e: app.start("api-flow", run_at=LAST_DAY, timeout="2d"), "timeout"),
    ("start_many: workflow NUL",
     lambda app, e: app.start_many([{"workflow": "api-flow"}, {"workflow": NUL}]), "workflow"),
    ("cancel: reason NUL", lambda app, e: app.cancel(e, NUL), "reason"),
    ("cancel: reason surrogate", lambda app, e: app.cancel(e, SURROGATE), "reason"),
    ("send_event: key surrogate", lambda app, e: app.send_event("evt", key=SURROGATE), "key"),
    ("migrate: to_version huge", lambda app, e: app.migrate(e, to_version=HUGE), "to_version"),
    ("migrate_workflow: workflow NUL",
     lambda app, e: app.migrate_workflow(NUL, 1, 2), "workflow"),
    ("migrate_workflow: from_version huge",
     lambda app, e: app.migrate_workflow("api-flow", HUGE, 1), "from_version"),
    ("pause_schedule: name NUL", lambda app, e: app.pause_schedule(NUL), "name"),
    ("pause_schedule: name surrogate", lambda app, e: app.pause_schedule(SURROGATE), "name"),
    ("prune: batch_size huge",
     lambda app, e: app.prune("1d", batch_size=HUGE), "batch_size"),
    ("alerts: workflow NUL", lambda app, e: app.alerts(workflow=NUL), "workflow"),
    ("alerts: limit huge", lambda app, e: app.alerts(limit=HUGE), "limit"),
    ("dead_letters: limit huge", lambda app, e: app.dead_letters(HUGE), "limit"),
    ("webhook_deliveries: limit huge",
     lambda app, e: app.webhook_deliveries(limit=HUGE), "limit"),
    ("search: version huge",
     lambda app, e: app.search(workflow="api-flow", version=HUGE), "version"),
    ("versions: workflow NUL", lambda app, e: app.versions(NUL), "workflow"),
    ("triggers: workflow surrogate", lambda app, e: app.triggers(SURROGATE), "workflow"),
    ("workflow_served: name NUL", lambda app, e: app.workflow_served(NUL, 1), "name"),
]


@pytest.mark.parametrize(("call", "field"), [(c, f) for _, c, f in PYTHON_CASES],
                         ids=[name for name, _, _ in PYTHON_CASES])
def test_the_python_faces_refuse_bad_values_naming_the_field(
        make_app: Callable[..., konduit.App], call: Callable[[konduit.App, str], Any],
        field: str) -> None:
    """The App (and so the clients and the command line, which run the same operations)
    refuses each with a KonduitError naming the field, before the database sees it: never a
    DatabaseError (the API's 503) nor a UnicodeEncodeError."""
    app = make_app(*api_app.WORKFLOWS)
    eid = str(app.start("api-flow", {"fail": False}).id)
    with pytest.raises(konduit.KonduitError) as info:
        call(app, eid)
    assert not isinstance(info.value, konduit.DatabaseError), info.value
    assert info.value.field == field, (info.value, info.value.field)


def test_an_unmigrated_database_is_the_servers_fault_not_the_callers(empty_db_url: str) -> None:
    """The routes that refuse a caller's bad value as 422 leave the server's own faults to the
    app's handler: a database without konduit's schema is 503 on each of them, not 422."""
    app = konduit.App(list(api_app.WORKFLOWS), database_url=empty_db_url)
    try:
        with serving(create_app(database_client(empty_db_url, app), app)) as base, \
                httpx.Client(base_url=base, timeout=30) as http:
            for method, url, body in (
                    ("POST", "/api/v1/executions", BODIES["StartBody"]),
                    ("POST", "/api/v1/executions:batch", BODIES["BatchBody"]),
                    ("POST", "/api/v1/events", BODIES["EventBody"]),
                    ("GET", "/api/v1/alerts", None), ("GET", "/api/v1/stats", None)):
                answer = send(http, method, url, body)
                assert answer.status_code == 503, (url, answer.text)
    finally:
        app.close()
