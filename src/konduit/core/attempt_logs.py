"""The log records of one attempt, kept with the attempt (docs/observability.md, "Logs of an
attempt").

While a handler runs, what it logs is collected in an :class:`AttemptLogs`: records logged
through the ``logging`` module (any logger but konduit's own, from the handler's task or thread,
or from its child process with ``--isolation process``), and lines given to
:meth:`konduit.Context.log`. The collection is bounded (:data:`MAX_RECORDS` records,
:data:`MAX_BYTES` bytes of messages; past either, records are counted as dropped, not kept) and
each message is masked like an error (database passwords) before it is kept. The worker stores
it with the attempt's end, in the same transaction as the outcome: no statement of its own per
record, and nothing at all for an attempt that logged nothing.

The capture (:func:`install`) wraps the ``logging`` record factory and finds the collection of
the attempt through a context variable, which threads started with a copy of the context (the
worker's handler threads) inherit; a record logged with no attempt current costs one context
variable read. Only records the logger lets through reach it: a record below the logger's level
(the worker logs INFO and up by default) is not kept.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from typing import Any

from konduit.masking import mask_password

MAX_RECORDS = 200
"""Records kept per attempt; later ones are counted in ``dropped``."""

MAX_BYTES = 64 * 1024
"""Bytes of messages kept per attempt (UTF-8); later records are counted in ``dropped``."""

MAX_MESSAGE = 8 * 1024
"""Characters kept of one message (its end is cut, marked with an ellipsis)."""

_current: contextvars.ContextVar[AttemptLogs | None] = contextvars.ContextVar(
    "konduit_attempt_logs", default=None)


class AttemptLogs:
    """The bounded, masked log records of one attempt. Thread-safe: a handler's threads and
    the worker's loop may add at once."""

    __slots__ = ("_bytes", "_lock", "dropped", "records")

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.records) or self.dropped > 0

    def add(self, level: str, message: str, *, logger: str = "", at: float | None = None) -> None:
        """Keep one record (``at``: seconds since the epoch, now when not given), or count it
        as dropped once the attempt's bounds are reached."""
        with self._lock:
            if len(self.records) >= MAX_RECORDS or self._bytes >= MAX_BYTES:
                self.dropped += 1
                return
        text = _clean(message)
        logger, level = _clean(logger)[:200], _clean(level)[:20]
        size = len(text.encode("utf-8"))
        with self._lock:
            if len(self.records) >= MAX_RECORDS or self._bytes + size > MAX_BYTES:
                self.dropped += 1
                return
            self._bytes += size
            self.records.append({"at": time.time() if at is None else at,
                                 "level": level, "logger": logger, "message": text})

    def extend(self, records: list[dict[str, Any]], dropped: int) -> None:
        """Add what another collection kept (a handler's child process) and its drop count."""
        for r in records:
            self.add(str(r.get("level", "INFO")), str(r.get("message", "")),
                     logger=str(r.get("logger", "")), at=float(r.get("at") or time.time()))
        with self._lock:
            self.dropped += max(0, int(dropped))

    def state(self) -> tuple[list[dict[str, Any]], int]:
        """(records, dropped), copied."""
        with self._lock:
            return list(self.records), self.dropped

    def records_json(self) -> str:
        """The records as JSON, as stored."""
        records, _ = self.state()
        return json.dumps(records, ensure_ascii=False)


def _clean(message: str) -> str:
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "…"
    # PostgreSQL text (and jsonb) cannot hold NUL nor a lone surrogate (a hostile message
    # must never make the round that records its attempt fail); masked as errors are.
    message = message.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")
    return mask_password(message)


def current() -> AttemptLogs | None:
    """The collection of the attempt running in this context, if any."""
    return _current.get()


def make_current(logs: AttemptLogs) -> None:
    """Make ``logs`` the current collection of this context from now on (a handler's child
    process, which ends with its handler)."""
    _current.set(logs)


def enter(logs: AttemptLogs) -> contextvars.Token[AttemptLogs | None]:
    """Make ``logs`` the current attempt's collection (here, and in threads started with a copy
    of this context) until :func:`leave`. A pair of calls rather than a context manager: it
    runs once per attempt on the worker's loop, and a ``with`` costs several times as much."""
    return _current.set(logs)


def leave(token: contextvars.Token[AttemptLogs | None]) -> None:
    """End what :func:`enter` began."""
    _current.reset(token)


class collecting:
    """``with collecting(logs):`` — :func:`enter` and :func:`leave` as a context manager."""

    __slots__ = ("_logs", "_token")

    def __init__(self, logs: AttemptLogs) -> None:
        self._logs = logs

    def __enter__(self) -> AttemptLogs:
        self._token = enter(self._logs)
        return self._logs

    def __exit__(self, *exc: object) -> None:
        leave(self._token)


def _capture(record: logging.LogRecord) -> None:
    """Add a record logged during an attempt to its collection; konduit's own records
    (``konduit.*``) are the worker's, not the handler's, and are left out."""
    logs = _current.get()
    if logs is None or record.name == "konduit" or record.name.startswith("konduit."):
        return
    try:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
    except Exception:  # a record whose arguments do not format: keep what can be read
        message = f"{record.msg!r} (its arguments could not be formatted)"
    logs.add(record.levelname, message, logger=record.name, at=record.created)


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Capture the records logged during attempts, once per process (workers call it).

    Through the record factory, not a handler on the root logger: a handler there would change
    how an application that configured no logging prints its warnings (Python's last-resort
    handler only speaks when no handler exists), and records of loggers that do not propagate
    would be missed."""
    global _installed
    with _install_lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _current.get() is not None:
                _capture(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True
