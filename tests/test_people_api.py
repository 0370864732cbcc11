"""``POST /api/v1/executions/{id}/steps/{step}/answer`` and ``GET /api/v1/inbox`` over real
HTTP, with real tokens, on a real database with a real worker (docs/people-in-the-loop.md)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

import konduit
from konduit.web.security import parse_tokens
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_api_v1 import refused
from tests.test_people_waits import FAST, approval_workflow
from tests.test_web_security import OP, RO, bearer, guarded

pytestmark = pytest.mark.storage


def test_the_api_lists_the_inbox_checks_answers_and_records_the_token(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(approval_workflow())
    [op_token] = [t for t in parse_tokens([f"op:{OP}"])]
    with running_worker(app, **FAST), guarded(app, db_url) as (base, _), \
            httpx.Client(base_url=base, timeout=30) as http:
        other = app.start("expense", input={"claim": 10})
        handle = app.start("expense", input={"claim": 9})
        eid = str(handle.id)
        inbox = until(lambda: [i for i in http.get("/api/v1/inbox", headers=bearer(RO)).json()
                               if i["execution_id"] == eid], what="the inbox row")
        until(lambda: [i for i in http.get("/api/v1/inbox", headers=bearer(RO)).json()
                       if i["execution_id"] == str(other.id)], what="the other's inbox row")
        # One execution's waits, by its id or a piece of it, as every other face takes it.
        for piece in (eid, eid[-8:]):
            mine = http.get("/api/v1/inbox", params={"execution_id": piece},
                            headers=bearer(RO)).json()
            assert [i["execution_id"] for i in mine] == [eid], piece
        assert http.get("/api/v1/inbox", params={"execution_id": "0" * 32},
                        headers=bearer(RO)).json() == app.inbox(execution_id="0" * 32) == []
        refused(http.get("/api/v1/inbox", params={"execution_id": "0000"},
                         headers=bearer(RO)), 404)  # a piece that names none, as for a read
        assert inbox[0]["step"] == "approve" and inbox[0]["who"] == "finance team"
        assert inbox[0]["answer_schema"]["required"] == ["decision"]
        url = f"/api/v1/executions/{eid}/steps/approve/answer"
        bad = refused(http.post(url, json={"value": {"decision": "maybe"}}, headers=bearer(OP)),
                      422, "body.value.decision")
        assert bad["errors"][0]["field"] == "body.value.decision"
        refused(http.post(url, json={"value": {"decision": "approve"}}, headers=bearer(RO)), 403)
        refused(http.post(f"/api/v1/executions/{eid}/steps/submit/answer",
                          json={"value": {}}, headers=bearer(OP)), 409)
        ok = http.post(url, json={"value": {"decision": "approve", "amount": 5},
                                  "answered_by": "grace"}, headers=bearer(OP))
        assert ok.status_code == 200, ok.text
        assert ok.json()["answered_by"] == f"grace via {op_token.label}"
        assert ok.json()["value"] == {"decision": "approve", "amount": 5}
        refused(http.post(url, json={"value": {"decision": "approve"}}, headers=bearer(OP)), 409)
        assert handle.wait(timeout=30).output["booked"]["amount"] == 5
        # The execution's detail carries its answers, as app.answers and konduit status do.
        detail = http.get(f"/api/v1/executions/{eid}", headers=bearer(RO)).json()
        assert [(a["step"], a["answered_by"], a["value"]) for a in detail["answers"]] == [
            ("approve", f"grace via {op_token.label}", {"decision": "approve", "amount": 5})]
        assert detail["auto_repair"] is None
        refused(http.post(f"/api/v1/executions/{'0' * 32}/steps/approve/answer",
                          json={"value": {}}, headers=bearer(OP)), 404)
    assert app.answers(handle.id)[0].answered_by == f"grace via {op_token.label}"
    assert OP not in op_token.label
