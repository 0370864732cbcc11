"""OpenTelemetry tracing of executions, optional: ``pip install 'konduit-pg[otel]'``.

Konduit imports and runs without OpenTelemetry; this module only touches it when it is
installed and tracing is on. On means ``App(tracing=True)``, or ``App(tracing=None)`` (the
default) once the application has set an SDK ``TracerProvider``
(``opentelemetry.trace.set_tracer_provider``), or ``App(tracing=provider)`` (spans go to that
``TracerProvider`` instead of the global one); ``App(tracing=False)`` turns it off.

- :meth:`konduit.App.start` (and ``start_many``) capture the caller's current span as a W3C
  trace context (``traceparent``/``tracestate``), stored with the execution by the start's own
  INSERT. Without a current span a short ``konduit.start`` span is made the execution's root.
- A worker makes that context the parent of one span per attempt (:class:`AttemptTracer`),
  current while the handler runs, so spans the handler makes nest under its attempt.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any
from uuid import UUID

from konduit.core.model import Outcome
from konduit.errors import KonduitError
from konduit.extras import install_hint

if TYPE_CHECKING:
    from konduit.core.model import Completion, TaskAttempt

Tracing = Any
"""What ``App(tracing=...)`` takes: True, False, None (automatic) or a ``TracerProvider``."""

TraceContext = tuple[str, str | None]
"""A W3C trace context: the ``traceparent`` header and the ``tracestate`` one (or None)."""

INSTALL_HINT = install_hint("otel")
TRACER_NAME = "konduit"

_api: ModuleType | None = None
_api_checked = False


def _otel() -> ModuleType | None:
    """``opentelemetry.trace``, or None when OpenTelemetry is not installed (looked up once)."""
    global _api, _api_checked
    if not _api_checked:
        try:
            from opentelemetry import trace
        except ImportError:
            trace = None  # type: ignore[assignment]
        _api, _api_checked = trace, True
    return _api


def available() -> bool:
    """Whether the OpenTelemetry API can be imported."""
    return _otel() is not None


def _is_provider(mode: Tracing) -> bool:
    return mode not in (True, False, None) and callable(getattr(mode, "get_tracer", None))


def check_mode(mode: Tracing) -> Tracing:
    """``mode`` as given to :class:`konduit.App`; tracing asked for without OpenTelemetry is an
    error that says what to install."""
    if mode is not None and not isinstance(mode, bool) and not _is_provider(mode):
        raise KonduitError(
            f"tracing must be True, False, None (automatic) or an OpenTelemetry TracerProvider, "
            f"not {type(mode).__name__}")
    if mode is not None and mode is not False and not available():
        raise KonduitError(f"tracing needs OpenTelemetry: {INSTALL_HINT}")
    return mode


def _tracer(mode: Tracing) -> Any:
    if _is_provider(mode):
        return mode.get_tracer(TRACER_NAME)
    trace = _otel()
    assert trace is not None
    return trace.get_tracer(TRACER_NAME)


def active(mode: Tracing) -> bool:
    """Whether to trace now: always with ``True`` or a provider, never with ``False``; with
    ``None`` when the application configured a tracer provider (the API's default is a no-op
    proxy)."""
    if mode is False:
        return False
    trace = _otel()
    if trace is None:
        return False
    if mode is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def incoming(traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
    """A W3C trace context received from another system (HTTP headers), if it is a valid one;
    an invalid one is ignored, as the W3C spec asks. Needs no OpenTelemetry: the context is only
    stored, and the workers that trace make it the parent of each attempt."""
    if not traceparent:
        return None
    found = _TRACEPARENT.match(traceparent.strip())
    if found is None:
        return None
    version, trace_id, parent_id, _ = found.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    state = (tracestate or "").strip()
    keep = state if state and len(state) <= 512 and state.isprintable() else None
    return found.group(0), keep


def _inject() -> TraceContext | None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    parent = carrier.get("traceparent")
    return None if parent is None else (parent, carrier.get("tracestate"))


def capture(mode: Tracing, workflow: str) -> TraceContext | None:
    """The trace context a start stores with its execution: the caller's current span's, or,
    when the caller has none, that of a ``konduit.start`` span made the execution's root (so
    every execution is one trace). None when tracing is off."""
    if not active(mode):
        return None
    trace = _otel()
    assert trace is not None
    if trace.get_current_span().get_span_context().is_valid:
        return _inject()
    with _tracer(mode).start_as_current_span(
        f"konduit.start {workflow}", kind=trace.SpanKind.PRODUCER,
        attributes={"konduit.workflow": workflow},
    ):
        return _inject()


class AttemptTracer:
    """One span per attempt, child of the trace context its execution was started with.

    The contexts of the executions a worker runs are kept (the last ``keep``), so the column is
    read once per execution and worker, in the transaction that reads the task's upstream."""

    def __init__(self, worker_id: str, mode: Tracing = True, *, keep: int = 4096):
        trace = _otel()
        if trace is None:
            raise KonduitError(f"tracing needs OpenTelemetry: {INSTALL_HINT}")
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = _tracer(mode)
        self._propagator = TraceContextTextMapPropagator()
        self.worker_id = worker_id
        self._parents: OrderedDict[UUID, Any] = OrderedDict()
        self._keep = keep

    def knows(self, execution_id: UUID) -> bool:
        """Whether this execution's trace context was read already."""
        if execution_id in self._parents:
            self._parents.move_to_end(execution_id)
            return True
        return False

    def remember(self, execution_id: UUID, traceparent: str | None, tracestate: str | None) -> None:
        """Keep the parent context of an execution's attempts. A start that was not traced
        (tracing off in its process, a schedule's tick, a repair of an old execution) gets one
        made of its id: the trace id is the execution id's 128 bits, so its attempts are still
        one trace, under a parent span that nobody exported."""
        if traceparent:
            carrier = {"traceparent": traceparent}
            if tracestate:
                carrier["tracestate"] = tracestate
            parent = self._propagator.extract(carrier)
        else:
            trace = self._trace
            made = trace.SpanContext(
                trace_id=execution_id.int, span_id=(execution_id.int & (2**64 - 1)) or 1,
                is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
            parent = trace.set_span_in_context(trace.NonRecordingSpan(made))
        self._parents[execution_id] = parent
        if len(self._parents) > self._keep:
            self._parents.popitem(last=False)

    @contextlib.contextmanager
    def attempt(self, workflow: str, task: TaskAttempt) -> Iterator[Any]:
        """The current span for the duration of one attempt (the handler, output checks and the
        fallback). Its status and ``konduit.outcome`` are set by :meth:`ended`."""
        attributes: dict[str, Any] = {
            "konduit.execution_id": str(task.execution_id),
            "konduit.workflow": workflow,
            "konduit.step": task.step,
            "konduit.map_index": task.map_index,
            "konduit.attempt": task.attempt,
            "konduit.worker": self.worker_id,
        }
        if task.hedged:
            attributes["konduit.hedged"] = True
        with self._tracer.start_as_current_span(
            f"konduit.attempt {workflow}/{task.step}",
            context=self._parents.get(task.execution_id),
            kind=self._trace.SpanKind.CONSUMER,
            attributes=attributes,
            # An error is an outcome here, recorded by ended(); a CancelledError (worker stop)
            # is recorded as it passes.
            set_status_on_exception=True,
        ) as span:
            yield span

    def ended(self, span: Any, completion: Completion) -> None:
        """Record how the attempt ended: ``konduit.outcome`` (succeeded, retry, degraded,
        timed_out, failed) and an error status for anything but a success."""
        span.set_attribute("konduit.outcome", completion.word)
        if completion.outcome is Outcome.SUCCEEDED:
            return
        from opentelemetry.trace import Status, StatusCode

        error = (completion.error or completion.word).strip().splitlines()
        span.set_status(Status(StatusCode.ERROR, error[-1] if error else completion.word))
        if completion.error:
            span.set_attribute("konduit.error", completion.error[-2000:])
