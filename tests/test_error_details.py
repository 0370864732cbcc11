"""What failures leave behind: a validation error that says what is wrong, and dead letters that
leave the list once a repair re-ran them (the execution's history keeps them).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from pydantic import BaseModel

import konduit
from konduit.core.validation import OutputValidator
from konduit.web import create_app, database_client
from tests.support.browser import serving
from tests.support.workers import running_worker


class Caption(BaseModel):
    text: str
    language: str
    words: int


def test_a_pydantic_validation_error_keeps_every_error_line_and_drops_the_links() -> None:
    validator = OutputValidator(Caption, step="captions", workflow="wf")
    with pytest.raises(konduit.OutputInvalid) as caught:
        validator.validate({"text": "hi", "words": "many"})
    message = str(caught.value)
    assert message == (
        "output of step 'captions' does not match its declared type: 2 validation errors for "
        "Caption: language: Field required [type=missing, input_value={'text': 'hi', 'words': "
        "'many'}, input_type=dict]; words: Input should be a valid integer, unable to parse "
        "string as an integer [type=int_parsing, input_value='many', input_type=str]")
    assert "\n" not in message  # one line: every "last line" of the error is all of it
    with pytest.raises(konduit.OutputInvalid, match=r"for int: Input should be a valid integer"):
        OutputValidator(int, step="s", workflow="wf").validate("x")  # an error at the root
    many = OutputValidator(list[int], step="s", workflow="wf")
    with pytest.raises(konduit.OutputInvalid, match=r"; and 2 more$"):
        many.validate(["x"] * 12)


@pytest.mark.storage
def test_the_execution_error_names_the_invalid_fields(make_app: Callable[..., konduit.App]) -> None:
    wf = konduit.Workflow("validation-message", version=1)

    @wf.step(output=Caption)
    def captions(ctx: konduit.Context) -> dict[str, str]:
        return {"text": "hello"}

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed):
        handle.wait(timeout=15)
    error = app.status(handle.id).error or ""
    # Before: "... ended failed: For further information visit https://errors.pydantic.dev/..."
    assert "For further information" not in error and "errors.pydantic.dev" not in error
    assert "language: Field required" in error and "words: Field required" in error
    [letter] = app.dead_letters()
    assert "language: Field required" in letter.error


@pytest.mark.storage
def test_a_repaired_dead_letter_leaves_the_list_and_stays_in_the_history(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    broken = {"on": True}
    wf = konduit.Workflow("dead-letter-repair", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def charge(ctx: konduit.Context) -> str:
        if broken["on"]:
            raise RuntimeError("card declined")
        return "charged"

    @wf.step()
    def notify(ctx: konduit.Context) -> str:
        return "sent"

    @wf.step(after=[charge, notify])
    def receipt(ctx: konduit.Context) -> str:
        return ctx.upstream["charge"]

    app = make_app(wf)
    other = app.start(wf.name)  # a dead letter nobody repairs
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2):
        for h in (other, handle):
            with pytest.raises(konduit.ExecutionFailed):
                h.wait(timeout=15)
        assert sorted(str(d.execution_id) for d in app.dead_letters()) \
            == sorted([str(other.id), str(handle.id)])
        broken["on"] = False
        assert "charge" in app.repair(handle.id)
        assert handle.wait(timeout=15).output == "charged"
    [letter] = app.dead_letters()
    assert letter.execution_id == other.id
    # The history still has the failed try of the repaired execution.
    failed = [t for t in app.tasks(handle.id) if t.step == "charge"]
    assert [(t.generation, t.status) for t in failed] == [(1, "failed"), (2, "succeeded")]
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        assert [d["execution_id"] for d in http.get("/api/v1/dead-letters").json()] \
            == [str(other.id)]
        page = http.get("/dead-letters").text
        assert str(other.id) in page and str(handle.id) not in page
        detail = http.get(f"/api/v1/executions/{handle.id}").json()
        assert any(a["outcome"] == "failed" and "card declined" in (a["error"] or "")
                   for a in detail["attempts"])


@pytest.mark.storage
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_validation_error_raised_in_a_handler_names_the_fields(
        make_app: Callable[..., konduit.App], isolation: str) -> None:
    """Not the output check: the handler's own pydantic call fails (a reply it parses). The
    execution's error and the dead letter keep the last line of the traceback, which pydantic
    would fill with a documentation link."""
    wf = konduit.Workflow(f"handler-validation-{isolation}", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def parse_reply(ctx: konduit.Context) -> dict[str, str]:
        return Caption.model_validate({"text": "hi", "words": "many"}).model_dump()

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2, isolation=isolation), \
            pytest.raises(konduit.ExecutionFailed):
        handle.wait(timeout=30)
    error = app.status(handle.id).error or ""
    last = error.strip().splitlines()[-1]
    assert "language: Field required" in last and "words: Input should be a valid integer" in last
    assert "errors.pydantic.dev" not in last
    [letter] = app.dead_letters()
    assert "language: Field required" in letter.error.strip().splitlines()[-1]
