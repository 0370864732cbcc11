"""Log lines that carry where they come from: the worker, and inside an attempt its execution,
step, map index and attempt number (context variables, so a handler's own ``logging`` calls
carry them too, on its thread as on the event loop).

``konduit worker --log-format json`` (or ``KONDUIT_LOG_FORMAT=json``) writes one JSON object per
line through :class:`JsonFormatter`; plain text stays the default.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from konduit.core.model import Completion, Recorded, TaskAttempt

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

_attempt: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "konduit_attempt", default=None)
_worker: contextvars.ContextVar[str | None] = contextvars.ContextVar("konduit_worker", default=None)
# The process's worker, for lines logged where the context variable was not inherited (threads
# started by libraries): a process normally runs one worker.
_process_worker: str | None = None

log = logging.getLogger(__name__)


def bind_worker(worker_id: str) -> contextvars.Token[str | None]:
    """Mark what the current task (and every task and handler thread started from it) logs as
    this worker's."""
    global _process_worker
    _process_worker = worker_id
    return _worker.set(worker_id)


def attempt_fields(task: TaskAttempt) -> dict[str, Any]:
    return {
        "execution_id": str(task.execution_id),
        "step": task.step,
        "map_index": task.map_index,
        "attempt": task.attempt,
    }


@contextlib.contextmanager
def attempt_scope(task: TaskAttempt) -> Iterator[None]:
    """Lines logged inside carry the attempt's fields."""
    token = enter_attempt(task)
    try:
        yield
    finally:
        leave_attempt(token)


def enter_attempt(task: TaskAttempt) -> contextvars.Token[dict[str, Any] | None]:
    """:func:`attempt_scope` as a pair of calls (the executor's, once per attempt: a ``with``
    of a generator costs several times as much); end it with :func:`leave_attempt`."""
    return _attempt.set(attempt_fields(task))


def leave_attempt(token: contextvars.Token[dict[str, Any] | None]) -> None:
    """End what :func:`enter_attempt` began."""
    _attempt.reset(token)


def current_fields() -> dict[str, Any]:
    """The context fields of a line logged now: ``worker`` and, inside an attempt, its fields."""
    fields: dict[str, Any] = {}
    worker = _worker.get() or _process_worker
    if worker is not None:
        fields["worker"] = worker
    attempt = _attempt.get()
    if attempt is not None:
        fields.update(attempt)
    return fields


def log_recorded(task: TaskAttempt, completion: Completion, outcome: Recorded, *,
                 by: str | None = None) -> None:
    """Log a retry or a degradation once, by the worker that recorded it (after the record, so
    an attempt whose lease was lost, or whose hedge decided the task, logs neither)."""
    # Compared by value: called for every recorded outcome, most of which log nothing.
    retrying = outcome.value == "retrying"
    if not retrying and not (outcome.value == "ended" and completion.outcome == "degraded"):
        return
    why = (completion.error or "").strip().splitlines()
    reason = why[-1] if why else "no error recorded"
    suffix = f" ({by})" if by else ""
    with attempt_scope(task):
        if retrying:  # routine: what the retry policy is for
            log.info("task %s (%s) attempt %s failed; retrying in %.1f s%s: %s", task.id,
                        task.step, task.attempt, completion.retry_delay or 0.0, suffix, reason)
        else:
            log.warning("task %s (%s) degraded to its fallback%s: %s", task.id, task.step,
                        suffix, reason)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the context fields (``worker``; ``execution_id``, ``step``, ``map_index``,
    ``attempt`` inside an attempt) and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "konduit", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


class ContextFilter(logging.Filter):
    """Copies the context fields onto each record (as ``record.konduit``) when it is logged,
    on the thread that logged it: a handler may format it later, elsewhere."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "konduit"):
            setattr(record, "konduit", current_fields())  # noqa: B010 (not a declared attribute)
        return True


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Set up the root logger for a konduit process: ``text`` (the default) or ``json``."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    if log_format == "text":
        logging.basicConfig(level=level.upper(), format=TEXT_FORMAT)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
