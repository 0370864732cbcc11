"""The context a handler receives: where the attempt stands and what came from upstream."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core import clock
from konduit.core.attempt_logs import AttemptLogs
from konduit.core.journal import Journal, call_directly, check_name
from konduit.core.streams import Stream, Streams
from konduit.errors import JournalUnavailable, StreamError

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
    started_at: float = field(default_factory=clock.monotonic)
    scheduled_at: datetime | None = None  # the tick that started a scheduled execution (UTC)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _on_heartbeat: Callable[[], None] | None = field(default=None, repr=False)
    _logs: AttemptLogs | None = field(default=None, repr=False)
    _journal: Journal | None = field(default=None, repr=False)
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
        return self.deadline - (clock.monotonic() - self.started_at)

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

    def call(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """A durable call, in an async handler: ``result = await ctx.call("fetch-page-3",
        fetch, url)`` calls ``fn(*args, **kwargs)`` (awaiting what it returns when that is
        awaitable) and records the result under this task before handing it back. A later
        attempt of the task (a retry, a rescue after its worker died, a redrive or a repair)
        replays the recorded results in order instead of calling again, and calls live from the
        first call that has no record (docs/journal.md).

        ``name`` names the call on the execution page and keys it with its position among the
        handler's calls: on a replay, a call whose name is not the one recorded at its position
        raises :class:`konduit.DeterminismError`. Results must be JSON (as step outputs); the
        value handed back is the recorded one (a tuple comes back as a list, live or replayed).
        A result that cannot be recorded because the attempt lost its lease raises
        :class:`konduit.LeaseLost`. Use :meth:`call_sync` in a sync handler."""
        check_name(name)
        if self._journal is None:  # a context built by hand (a unit test): unrecorded
            return call_directly(fn, args, kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise JournalUnavailable(
                f"ctx.call({name!r}, ...) was called outside an event loop (a sync handler of "
                f"step {self.step!r}?): use ctx.call_sync(...) there") from None
        return self._journal.call(name, fn, args, kwargs)

    def call_sync(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A durable call, in a sync handler: ``result = ctx.call_sync("charge", charge,
        order)``. The same as :meth:`call` (recorded before it returns, replayed on a later
        attempt, :class:`konduit.DeterminismError` when the order changed), for handlers that
        run on a thread; ``fn`` runs on the handler's thread. Not available in a handler a
        worker runs with ``--isolation process`` (:class:`konduit.JournalUnavailable`)."""
        check_name(name)
        if self._journal is None:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise JournalUnavailable(
                    f"ctx.call_sync({name!r}, ...) was handed a function that returns an "
                    f"awaitable: use `await ctx.call(...)`")
            return value
        return self._journal.call_sync(name, fn, args, kwargs)
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
