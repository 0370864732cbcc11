"""OpenTelemetry tracing (the ``otel`` extra): one trace per execution, a span per attempt whose
parent is the span that called ``app.start``, and a handler's own spans nested under its attempt.

Spans go to a private ``TracerProvider`` with the SDK's in-memory exporter (``App(tracing=
provider)``), so no global provider leaks into the other tests of the session."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import psycopg
import pytest

import konduit

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

pytestmark = pytest.mark.storage


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _workflow(provider: TracerProvider) -> konduit.Workflow:
    wf = konduit.Workflow("traced", version=1)
    failed_once = threading.Event()
    handler_tracer = provider.get_tracer("user-code")

    @wf.step()
    def fetch(ctx):  # type: ignore[no-untyped-def]
        # The user's own span, on the handler's thread: it must nest under the attempt's span.
        with handler_tracer.start_as_current_span("user.fetch"):
            return {"n": 2}

    @wf.step(after=[fetch], retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.05s"))
    def flaky(ctx):  # type: ignore[no-untyped-def]
        if not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("first attempt fails")
        return "ok"

    @wf.map(after=[fetch], over=lambda out: list(range(out["n"])))
    async def item(ctx):  # type: ignore[no-untyped-def]
        return ctx.item

    @wf.step(after=[flaky, item])
    def publish(ctx):  # type: ignore[no-untyped-def]
        return "done"

    return wf


def _attempts(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("konduit.attempt ")]


def test_one_trace_a_span_per_attempt_parented_by_the_caller(make_app, worker, spans) -> None:
    provider, exporter = spans
    app = make_app(_workflow(provider), tracing=provider)
    caller = provider.get_tracer("caller")
    with worker(app, concurrency=4), caller.start_as_current_span("request") as request:
        handle = app.start("traced", {})
        result = handle.wait(timeout=60)
    assert result.status == "succeeded"
    parent = request.get_span_context()

    attempts = _attempts(exporter)
    by_step: dict[str, list[ReadableSpan]] = {}
    for span in attempts:
        by_step.setdefault(span.attributes["konduit.step"], []).append(span)  # type: ignore[index]
    # fetch once, flaky twice (a retry is a second attempt), two map items, publish once.
    assert {k: len(v) for k, v in by_step.items()} == {"fetch": 1, "flaky": 2, "item": 2, "publish": 1}
    for span in attempts:
        assert span.context.trace_id == parent.trace_id  # one trace: the caller's
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes["konduit.execution_id"] == str(handle.id)
        assert span.attributes["konduit.workflow"] == "traced"
        assert str(span.attributes["konduit.worker"])
    flaky = sorted(by_step["flaky"], key=lambda s: s.attributes["konduit.attempt"])  # type: ignore[arg-type,return-value]
    assert [s.attributes["konduit.attempt"] for s in flaky] == [1, 2]
    assert [s.attributes["konduit.outcome"] for s in flaky] == ["retry", "succeeded"]
    assert flaky[0].status.status_code is StatusCode.ERROR
    assert "first attempt fails" in (flaky[0].status.description or "")
    assert flaky[1].status.status_code is not StatusCode.ERROR
    assert sorted(s.attributes["konduit.map_index"] for s in by_step["item"]) == [0, 1]  # type: ignore[type-var]

    [user] = [s for s in exporter.get_finished_spans() if s.name == "user.fetch"]
    [fetch] = by_step["fetch"]
    assert user.parent is not None and user.parent.span_id == fetch.context.span_id
    assert user.context.trace_id == parent.trace_id


def test_a_failed_attempt_is_an_error_span(make_app, worker, spans) -> None:
    provider, exporter = spans
    wf = konduit.Workflow("doomed", version=1)

    @wf.step()
    def boom(ctx):  # type: ignore[no-untyped-def]
        raise konduit.NonRetryableError("no way")

    app = make_app(wf, tracing=provider)
    with worker(app), pytest.raises(konduit.ExecutionFailed):
        app.start("doomed").wait(timeout=60)
    [span] = _attempts(exporter)
    assert span.attributes["konduit.outcome"] == "failed"
    assert span.status.status_code is StatusCode.ERROR
    assert "no way" in (span.status.description or "")


def test_without_a_caller_span_the_start_is_the_root(make_app, worker, spans, db_url: str) -> None:
    provider, exporter = spans
    wf = konduit.Workflow("rooted", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    app = make_app(wf, tracing=provider)
    with worker(app):
        handle = app.start("rooted")
        handle.wait(timeout=60)
    [root] = [s for s in exporter.get_finished_spans() if s.name == "konduit.start rooted"]
    [attempt] = _attempts(exporter)
    assert root.parent is None
    assert attempt.parent is not None and attempt.parent.span_id == root.context.span_id
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT traceparent FROM konduit_executions WHERE id = %s",
                           (handle.id,)).fetchone()
    assert row is not None
    # The flags byte (sampled, random trace id) is the SDK's business.
    assert row[0].startswith(f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-")


def test_tracing_off_stores_nothing_and_emits_nothing(make_app, worker, spans, db_url: str) -> None:
    provider, exporter = spans
    wf = konduit.Workflow("quiet", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    app = make_app(wf, tracing=False)
    with worker(app), provider.get_tracer("caller").start_as_current_span("request"):
        handles = [app.start("quiet"), *app.start_many([{"workflow": "quiet"}] * 2)]
        for handle in handles:
            handle.wait(timeout=60)
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT traceparent, tracestate FROM konduit_executions").fetchall()
    assert rows == [(None, None)] * 3


def test_an_untraced_start_is_still_one_trace(make_app, worker, spans) -> None:
    """Started where tracing was off (or by a schedule): the attempts share one trace, whose id
    is the execution's."""
    provider, exporter = spans
    wf = konduit.Workflow("untraced", version=1)

    @wf.step()
    def first(ctx):  # type: ignore[no-untyped-def]
        return 1

    @wf.step(after=[first])
    def second(ctx):  # type: ignore[no-untyped-def]
        return 2

    starter = make_app(wf, tracing=False)
    handle = starter.start("untraced")
    with worker(make_app(wf, tracing=provider)):
        handle.wait(timeout=60)
    attempts = _attempts(exporter)
    assert sorted(s.attributes["konduit.step"] for s in attempts) == ["first", "second"]  # type: ignore[type-var]
    assert {s.context.trace_id for s in attempts} == {handle.id.int}
    assert len({s.parent.span_id for s in attempts if s.parent is not None}) == 1


def test_start_many_carries_the_callers_context(make_app, spans, db_url: str) -> None:
    provider, _ = spans
    wf = konduit.Workflow("many", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    app = make_app(wf, tracing=provider)
    with provider.get_tracer("caller").start_as_current_span("batch") as batch:
        app.start_many([{"workflow": "many", "input": i} for i in range(3)])
    ctx = batch.get_span_context()
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT traceparent FROM konduit_executions").fetchall()
    assert len(rows) == 3
    assert all(r[0].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-") for r in rows)


def test_konduit_runs_without_opentelemetry() -> None:
    """Without the extra, konduit imports, tracing stays off, and asking for it says what to
    install (OpenTelemetry is hidden from a fresh interpreter)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # import opentelemetry raises ImportError
        import konduit
        from konduit import tracing
        assert not tracing.available() and not tracing.active(None)
        assert tracing.capture(None, "wf") is None
        konduit.App([])
        try:
            konduit.App([], tracing=True)
        except konduit.KonduitError as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'konduit-pg[otel]'" in proc.stdout


def test_a_bad_tracing_argument_is_named() -> None:
    with pytest.raises(konduit.KonduitError, match="tracing must be"):
        konduit.App([], tracing="yes")


def test_konduit_testing_run_keeps_the_apps_tracing(spans, admin_url: str) -> None:
    import konduit.testing

    provider, exporter = spans
    wf = konduit.Workflow("in-tests", version=1)

    @wf.step()
    def only(ctx):  # type: ignore[no-untyped-def]
        return 1

    with konduit.testing.run(konduit.App([wf], tracing=provider), admin_url) as app, \
            provider.get_tracer("test").start_as_current_span("test") as test_span:
        app.start("in-tests").wait(timeout=60)
    [attempt] = _attempts(exporter)
    assert attempt.parent is not None
    assert attempt.parent.span_id == test_span.get_span_context().span_id
