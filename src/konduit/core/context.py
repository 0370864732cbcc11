"""The context a handler receives: where the attempt stands and what came from upstream."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.attempt_logs import AttemptLogs
from konduit.core.streams import Stream, Streams
from konduit.errors import StreamError

_handler_log = logging.getLogger("konduit.handler")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


@dataclass
class Context:
    """Passed to every handler (and fallback) as its only argument."""

    execution_id: UUID
    workflow: str
    step: str
    map_index: int
    attempt: int
    input: Any
    upstream: dict[str, Any] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    item: Any = None
    deadline: float | None = None  # seconds of budget for this attempt, when the step has one
    hedged: bool = False  # True in a hedge: the second attempt beside a straggler (hedge=)
    started_at: float = field(default_factory=time.monotonic)
    scheduled_at: datetime | None = None  # the tick that started a scheduled execution (UTC)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _on_heartbeat: Callable[[], None] | None = field(default=None, repr=False)
    _logs: AttemptLogs | None = field(default=None, repr=False)
    _streams: Streams | None = field(default=None, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts of this task: hand it to payment APIs and the like."""
        return f"{self.execution_id}:{self.step}:{self.map_index}"

    @property
    def cancelled(self) -> bool:
        """True once the engine asked this attempt to stop (cancel, lost lease, shutdown)."""
        return self._cancelled.is_set()

    @property
    def remaining(self) -> float | None:
        """Seconds left of the deadline, or None without one."""
        if self.deadline is None:
            return None
        return self.deadline - (time.monotonic() - self.started_at)

    def request_cancel(self) -> None:
        """The engine asks this attempt to stop; ``ctx.cancelled`` turns True."""
        self._cancelled.set()

    def heartbeat(self) -> None:
        """Extend this attempt's lease now: the worker's next heartbeat comes at once (at most
        one a second however often this is called). Optional: the worker already extends the
        lease of every attempt it runs on each heartbeat (a hung handler is ended by its
        deadline). Does nothing in a handler a worker runs with ``--isolation process``."""
        if self._on_heartbeat is not None:
            self._on_heartbeat()

    def log(self, message: str, *args: Any, level: str = "info") -> None:
        """Keep a line with this attempt (shown on the execution page beside its error, and
        returned by ``Client.attempt_logs`` and ``GET /api/v1/executions/{id}/logs``), and write
        it to the worker's log too. ``args`` are %-formatted into ``message`` as ``logging``
        does; ``level`` is one of debug, info, warning, error, critical. Kept whatever level the
        worker logs at, within the attempt's bounds (200 records, 64 KiB); records that
        ``logging`` passes during the attempt are kept the same way."""
        number = _LEVELS.get(level.lower()) if isinstance(level, str) else None
        if number is None:
            raise ValueError(f"ctx.log: level must be one of {', '.join(_LEVELS)}, "
                             f"not {level!r}")
        try:
            text = str(message) % args if args else str(message)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ctx.log: the message {message!r} does not take the arguments "
                             f"given ({exc})") from None
        if self._logs is not None:
            self._logs.add(logging.getLevelName(number), text, logger="ctx.log")
        _handler_log.log(number, "%s", text)

    @property
    def stream(self) -> Stream:
        """This task's durable stream (docs/streams.md), named after its step (``step[i]`` for
        an item of a map step): ``ctx.stream.write(chunk)`` appends a chunk, kept in the
        database in order, which readers follow live (``client.stream(execution_id)``, the
        API's ``/streams/{name}`` events, the execution page). A retried attempt's first write
        is preceded by a restart record. Not available in a handler a worker runs with
        ``--isolation process``."""
        return self.streams()

    def streams(self, name: str | None = None) -> Stream:
        """The durable stream ``name`` of this task (its default stream, ``ctx.stream``, when
        None). A name belongs to the first task that writes it: another task's write to it is
        refused."""
        if self._streams is None:
            raise StreamError(f"step {self.step!r}: ctx.stream is only available in a handler a "
                              "worker runs on its own threads or loop (not with --isolation "
                              "process, nor outside a worker)", step=self.step)
        return self._streams.get(name)
