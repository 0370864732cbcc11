"""``POST /api/v1/events`` over real HTTP, on a real database with a real worker."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import konduit
from tests.support.workers import running_worker
from tests.test_api_v1 import api, refused
from tests.test_waits_events import FAST, review_workflow, wait_status

pytestmark = pytest.mark.storage


def test_post_events_wakes_a_waiting_step_and_refuses_bad_bodies(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(review_workflow(), max_payload_bytes=2_000)
    with running_worker(app, **FAST), api(app, db_url) as http:
        handle = app.start("review-flow", input={"episode": 3})
        wait_status(db_url, handle.id, "review", "waiting")
        sent = http.post("/api/v1/events", json={"name": "translation-approved",
                                                 "key": "episode-3", "payload": {"by": "api"}})
        assert sent.status_code == 200, sent.text
        assert sent.json() == {"result": "woke"}
        assert handle.wait(timeout=20).output == {"text": {"by": "api"}, "outcome": "succeeded"}
        again = http.post("/api/v1/events", json={"name": "translation-approved",
                                                  "execution_id": str(handle.id)})
        assert again.json() == {"result": "no match"}
        refused(http.post("/api/v1/events", json={"name": "translation-approved"}), 422,
                "body.key")
        refused(http.post("/api/v1/events", json={"name": "", "key": "k"}), 422)
        refused(http.post("/api/v1/events", json={"name": "x", "key": "k", "extra": 1}), 422)
        refused(http.post("/api/v1/events", json={"name": "x", "execution_id": "nope"}), 422)
        refused(http.post("/api/v1/events", json={"name": "translation-approved", "key": "k",
                                                  "payload": "x" * 5_000}), 422, "body.payload")
        refused(http.post("/api/v1/events", json={"name": "translation-approved",
                                                  "key": "a\u0000b"}), 422, "body.key")
