"""Sync handlers in a child process each, killed at their deadline (``--isolation process``).

A sync handler on a thread that ignores its deadline cannot be stopped: the worker abandons the
thread and it runs on, holding memory, connections and locks, until it returns. In a child
process the same handler can be ended for real: :func:`call_in_process` forks, runs the handler
in the child, brings its result or exception back over a pipe, and SIGKILLs the child when the
time limit passes or the awaiting coroutine is cancelled (execution cancelled, lease lost,
worker shutdown).

Why fork (and not spawn): the child inherits the handler's code, so any handler works, closures
and functions of a test module included, with no re-import and no pickling of the handler. The
parent is a multi-threaded asyncio process, so the child touches nothing but the handler and its
pipe and leaves with ``os._exit``: it never runs the parent's event loop, its atexit handlers or
the finalizers of its database connections (a finalized libpq connection would tell the server
to close a socket the parent still uses).

What the handler sees in the child:

* ``ctx`` is the parent's, copied by the fork. ``ctx.remaining`` is right (the monotonic clock is
  shared). ``ctx.heartbeat()`` does nothing (the worker extends the lease of every task it runs
  anyway) and ``ctx.cancelled`` never turns True: cancellation is enforced by killing the child.
* The result and the exception cross the pipe pickled. A result that cannot be pickled cannot be
  stored either (outputs are JSON), so it fails the attempt with :class:`~konduit.PayloadError`.
  An exception comes back as itself, with the child's traceback as its ``__cause__``; one that
  cannot be pickled comes back as :class:`HandlerFailed`, whose text carries that traceback.
* SIGINT and SIGTERM are ignored (programs it runs get them back): the worker owns the child's
  lifetime (a supervisor's SIGTERM to every process must not kill a handler the worker is still
  draining). On Linux the child is SIGKILLed when the worker's thread that forked it exits, so
  a worker killed with SIGKILL leaves no handler running behind it.
* The child leads a process group of its own, and a kill (time limit, cancel) is sent to the
  group: programs the handler started die with it (unless they left the group, like daemons).
  A program that reads the terminal would be stopped there (a background group): handlers
  should not.
* What the handler logs (``logging`` and ``ctx.log``) is collected in the child and sent back
  with its answer, so it is kept with the attempt as in a thread; a child killed (time limit,
  cancel) takes its records with it.
* Memory is the parent's, copied on write: whatever the handler changes (module globals,
  counters, caches) stays in the child. A result that arrives after the deadline does not exist
  here (the child is dead), so there is no late result to keep as with threads.

Cost: a fork, a pickle each way and an exit, about 5 to 20 ms per call on a small VM (most of
it the kernel copying and tearing down the page tables of the worker's memory). The caller gets
the answer as soon as it is complete; the exiting child is reaped by a background thread, so
reaping never depends on the event loop staying open (a child killed on cancel is reaped the
same way).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import inspect
import os
import pickle
import queue
import signal
import struct
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from konduit.core import attempt_logs
from konduit.core.attempt_logs import AttemptLogs
from konduit.core.context import Context
from konduit.core.journal import RefusedJournal
from konduit.core.validation import readable_last_line
from konduit.errors import KonduitError, NonRetryableError, PayloadError

__all__ = [
    "HandlerFailed",
    "HandlerProcessDied",
    "HandlerTimedOut",
    "IsolationError",
    "NonRetryableHandlerFailed",
    "call_in_process",
]

# Python 3.12+ warns on every fork of a multi-threaded process; the child here runs nothing that
# could need a lock another thread held (see the module docstring), so the warning is noise.
warnings.filterwarnings(
    "ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning,
    module=__name__,
)

_HEADER = struct.Struct("!Q")
_READ_CHUNK = 1 << 20
_EX_SOFTWARE = 70  # the child failed before or after the handler, in this module's own code
_REAP_AFTER_KILL = 5.0  # seconds a timed-out call waits for its killed child to be reaped


class IsolationError(KonduitError, RuntimeError):
    """A handler run in a child process ended without a result that could be brought back."""


class HandlerFailed(IsolationError):
    """The handler raised an exception that could not be brought back as itself (it does not
    pickle). ``str()`` carries the type, the message and the traceback from the child."""

    def __init__(self, type_name: str, message: str, traceback_text: str):
        self.type_name = type_name
        self.traceback_text = traceback_text
        super().__init__(
            f"the handler raised {type_name}: {message}\n"
            f"traceback in the handler's process:\n{traceback_text.rstrip()}"
        )


class NonRetryableHandlerFailed(HandlerFailed, NonRetryableError):
    """A :class:`HandlerFailed` whose original exception was a :class:`~konduit.NonRetryableError`:
    the attempt must not be retried, as in a thread."""


class HandlerProcessDied(IsolationError):
    """The handler's process ended without returning or raising: ``SystemExit``, ``os._exit``,
    a crash or a signal. ``exitcode`` is its exit status, or minus the signal that killed it."""

    def __init__(self, message: str, exitcode: int | None):
        self.exitcode = exitcode
        super().__init__(message)


class HandlerTimedOut(KonduitError, TimeoutError):
    """The handler ran past its time limit; its process was killed."""


class ChildTraceback(KonduitError):
    """Carries the traceback text of an exception raised in the handler's process; set as the
    ``__cause__`` of that exception in the worker, so formatting it shows where it was raised."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]).rstrip() if self.args else ""


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved once in the parent: the child only calls it.
_prctl = _load_prctl()
_PR_SET_PDEATHSIG = 1
_pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)


# --- the child -------------------------------------------------------------------------------


def _ignore_signal(signum: int, frame: object) -> None:
    pass


def _child_setup(parent_pid: int) -> None:
    # The parent's event loop wakes up on signals through a socket this process shares: a
    # signal delivered here must not be reported there as the parent's own.
    try:
        signal.set_wakeup_fd(-1)
        # A handler, not SIG_IGN: an ignored signal stays ignored across exec, and a program the
        # handler runs (subprocess) must still stop on SIGTERM.
        signal.signal(signal.SIGINT, _ignore_signal)
        signal.signal(signal.SIGTERM, _ignore_signal)
    except ValueError:  # not the main thread: cannot happen after fork, but never fatal
        pass
    try:
        # A group of its own, so that a kill reaches the programs the handler started too.
        os.setpgid(0, 0)
    except OSError:
        pass
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the line above took effect
            os._exit(_EX_SOFTWARE)
    # Everything inherited is the parent's: never collect (and finalize) it here. Objects the
    # handler creates are collected as usual.
    gc.freeze()


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "(unprintable message)"


def _safe_traceback(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        return f"{_type_name(exc)} (the traceback could not be formatted)\n"
    tail = readable_last_line(exc)  # the worker keeps the last line of what comes back
    return text if tail is None else f"{text}{tail}\n"


def _result_message(result: Any) -> bytes:
    try:
        return pickle.dumps(("ok", pickle.dumps(result, pickle.HIGHEST_PROTOCOL)), pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return pickle.dumps(("unsendable", type(result).__qualname__, _safe_str(exc)))


def _error_message(exc: Exception) -> bytes:
    try:
        exc_bytes: bytes | None = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
    except Exception:
        exc_bytes = None
    return pickle.dumps((
        "raised", exc_bytes, _type_name(exc), _safe_str(exc), _safe_traceback(exc),
        isinstance(exc, NonRetryableError),
    ))


def _exit_status(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        # What the process will report: os._exit keeps the low 8 bits, as exit() does.
        return exc.code & 0xFF if isinstance(exc.code, int) else 1
    return 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _child_main(fn: Callable[[Context], Any], ctx: Context, wfd: int, parent_pid: int) -> NoReturn:
    status = _EX_SOFTWARE
    try:
        _child_setup(parent_pid)
        # The callback belongs to the parent's worker: calling it here would touch its loop.
        ctx._on_heartbeat = None
        # The child has no database connection of its own: durable calls say so.
        ctx._journal = RefusedJournal(
            f"step {ctx.step!r} runs in a child process (--isolation process), where no "
            f"journal can be written; run it in a worker with --isolation thread")
        ctx._streams = None  # a stream's writes go through the parent's loop: not from here
        # What the handler logs here is the parent's attempt's: collected afresh in this
        # process and sent back beside the answer (konduit.core.attempt_logs).
        logs = AttemptLogs() if attempt_logs.current() is not None else None
        if logs is not None:
            attempt_logs.make_current(logs)  # for good: this process ends with the handler
            ctx._logs = logs
        try:
            result = fn(ctx)
        except Exception as exc:
            message, status = _error_message(exc), 0
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the process ends as Python's would
            status = _exit_status(exc)
            message = pickle.dumps(("exited", status, f"{_type_name(exc)}({_safe_str(exc)})",
                                    _safe_traceback(exc)))
        else:
            message, status = _result_message(result), 0
        # Before the answer: once it is complete the parent stops waiting for this process.
        _flush_std_streams()
        if logs:
            records, dropped = logs.state()
            message = pickle.dumps(("logs", records, dropped, message))
        _write_all(wfd, message)
    except BaseException:
        status = _EX_SOFTWARE
    finally:
        os._exit(status)


# --- the parent ------------------------------------------------------------------------------


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "ended (its exit status is unknown: something else reaped it)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-exitcode} ({name})"
    return f"exited with status {exitcode}"


class _Child:
    """One forked handler: its pipe, its exit, and reaping it exactly once.

    ``answered`` resolves when the handler's answer is complete or the process ended without
    one; the process exits right after its answer, so it is reaped in the background from then
    on (:func:`_reap_later`) instead of making the caller wait for its teardown."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[Context], Any], ctx: Context):
        self.loop = loop
        self.buffer = bytearray()
        self.answered: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.exitcode: int | None = None
        self.reaped = False  # waited for: from then on its pid may belong to another process
        self.released = False  # handed to the background reaper (or its waiting thread)
        self.killed = False
        rfd, wfd = os.pipe()
        parent_pid = os.getpid()
        # Output buffered in this process would be copied into the child and written twice.
        _flush_std_streams()
        try:
            pid = os.fork()
        except BaseException as exc:
            os.close(rfd)
            os.close(wfd)
            raise IsolationError(f"could not start a process for the handler: {exc}") from exc
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            try:
                os.close(rfd)
                _child_main(fn, ctx, wfd, parent_pid)
            finally:
                os._exit(_EX_SOFTWARE)
        self.pid = pid
        try:
            os.setpgid(pid, pid)  # as the child does: whichever runs first, a kill finds the group
        except OSError:
            pass
        os.close(wfd)
        self.rfd: int | None = rfd
        os.set_blocking(rfd, False)
        # Read as the child writes: a result larger than the pipe's buffer would block it.
        loop.add_reader(rfd, self._read)
        self.pidfd: int | None = None
        if _pidfd_open is not None:
            try:
                self.pidfd = _pidfd_open(pid)
            except OSError:
                self.pidfd = None
        if self.pidfd is not None:
            loop.add_reader(self.pidfd, self._on_exit)
        else:
            threading.Thread(target=self._wait_in_thread, name=f"konduit-reap-{pid}", daemon=True).start()

    def _read(self) -> None:
        if self.rfd is None:
            return
        while True:
            try:
                chunk = os.read(self.rfd, _READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:  # EOF: nothing more will come (the exit still says how it ended)
                self._close_pipe()
                break
            self.buffer += chunk
        if not self.answered.done() and self._complete():
            self.answered.set_result(None)

    def _complete(self) -> bool:
        if len(self.buffer) < _HEADER.size:
            return False
        size: int = _HEADER.unpack_from(self.buffer)[0]
        return len(self.buffer) >= _HEADER.size + size

    def _close_pipe(self) -> None:
        if self.rfd is not None:
            self.loop.remove_reader(self.rfd)
            os.close(self.rfd)
            self.rfd = None

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None

    def _on_exit(self) -> None:
        # The pidfd turned readable: the child is a zombie now, so this reaps it at once.
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # someone else reaped it
            pid, status = self.pid, -1
        if pid != 0:
            self._finish(None if status == -1 else os.waitstatus_to_exitcode(status))

    def _finish(self, exitcode: int | None) -> None:
        self.reaped = True
        self.exitcode = exitcode
        self._close_pidfd()
        # Everything the child wrote before it exited is in the pipe now: take the rest.
        self._read()
        self._close_pipe()
        for future in (self.answered, self.exited):
            if not future.done():
                future.set_result(None)

    def _wait_in_thread(self) -> None:
        # Without pidfds (not Linux): a thread blocks in waitpid for this one child.
        try:
            _, status = os.waitpid(self.pid, 0)
            exitcode: int | None = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            exitcode = None
        self.reaped = True  # before the loop hears of it: never signal this pid again
        try:
            self.loop.call_soon_threadsafe(self._finish, exitcode)
        except RuntimeError:  # the loop closed meanwhile; the child is reaped all the same
            pass

    def kill(self) -> None:
        if self.reaped or self.released or self.killed:
            return
        self.killed = True
        # Unreaped, the child holds its pid and so its group id: neither can name another process.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:  # not (yet) a group of its own
            pass
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def release(self) -> None:
        """Stop watching a child that answered or was killed: it is reaped in the background."""
        if self.released:
            return
        self.released = True
        self._close_pipe()
        if self.pidfd is not None:  # without a pidfd its waiting thread reaps it
            self._close_pidfd()
            if not self.reaped:
                _reap_later(self.pid)

    def outcome(self) -> Any:
        """The handler's result, or raise what it raised (or how its process ended)."""
        message = self._message()
        if message is None:
            how = f"the handler's process {_how_it_ended(self.exitcode)}"
            raise HandlerProcessDied(f"{how} before returning a result", self.exitcode)
        kind = message[0]
        if kind == "ok":
            try:
                return pickle.loads(message[1])
            except BaseException as exc:  # unpickling runs the result's own code: anything
                raise PayloadError(f"the handler's result could not be brought back from its "
                                   f"process: {type(exc).__name__}: {exc}") from exc
        if kind == "unsendable":
            raise PayloadError(f"the handler returned a {message[1]}, which cannot be brought back "
                               f"from its process (it does not pickle: {message[2]})")
        if kind == "raised":
            _, exc_bytes, type_name, text, tb_text, non_retryable = message
            raised: object = None
            if exc_bytes is not None:
                try:
                    raised = pickle.loads(exc_bytes)
                except BaseException:  # an exception class whose __init__ wants other arguments
                    raised = None
            if not isinstance(raised, BaseException):
                cls = NonRetryableHandlerFailed if non_retryable else HandlerFailed
                raise cls(type_name, text, tb_text)
            raise raised from ChildTraceback(tb_text)
        _, status, description, tb_text = message  # "exited": its status is the one it exits with
        raise HandlerProcessDied(
            f"the handler's process {_how_it_ended(status)}: the handler raised {description}\n"
            f"traceback in the handler's process:\n{tb_text.rstrip()}",
            status,
        )

    def _message(self) -> tuple[Any, ...] | None:
        if not self._complete():  # nothing, or killed while writing
            return None
        (size,) = _HEADER.unpack_from(self.buffer)
        try:
            message = pickle.loads(bytes(self.buffer[_HEADER.size:_HEADER.size + size]))
            if isinstance(message, tuple) and message and message[0] == "logs":
                # The handler's log records, then its answer (read on the attempt's context).
                _, records, dropped, inner = message
                if (logs := attempt_logs.current()) is not None:
                    logs.extend(records, dropped)
                message = pickle.loads(inner)
        except BaseException:  # what the records carry is the handler's: anything may raise
            return None
        return message if isinstance(message, tuple) and message else None


# --- reaping in the background ---------------------------------------------------------------

_reap_queue: queue.SimpleQueue[int] = queue.SimpleQueue()
_reaper_lock = threading.Lock()
_reaper_of: int | None = None  # the pid of the process whose reaper thread runs


def _reap_later(pid: int) -> None:
    """Have a thread wait for a child that answered or was killed: it is gone within
    milliseconds, and no event loop needs to stay open for that."""
    global _reaper_of
    with _reaper_lock:
        if _reaper_of != os.getpid():  # first use, or a forked copy of this process
            threading.Thread(target=_reaper, name="konduit-reaper", daemon=True).start()
            _reaper_of = os.getpid()
    _reap_queue.put(pid)


def _reaper() -> None:
    pending: set[int] = set()
    while True:
        if not pending:
            pending.add(_reap_queue.get())
        while not _reap_queue.empty():
            pending.add(_reap_queue.get())
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                pending.discard(pid)
        if pending:  # one that does not die (stopped, stuck in the kernel) must not hold others
            time.sleep(0.005)


async def call_in_process(fn: Callable[[Context], Any], ctx: Context, *, timeout: float | None) -> Any:
    """Run the sync handler ``fn(ctx)`` in a forked child process and return its result.

    Raises what the handler raised (the child's traceback as its ``__cause__``), or
    :class:`HandlerFailed` when that exception does not pickle, :class:`HandlerProcessDied` when
    the process ended without an answer (``SystemExit``, ``os._exit``, a crash, a signal), or
    :class:`HandlerTimedOut` (a ``TimeoutError``) once ``timeout`` seconds passed: the child is
    then SIGKILLed and reaped before it is raised. If the awaiting coroutine is cancelled, the
    child is killed too (and reaped in the background) and the cancellation propagates. Call it
    from the event loop's thread.
    """
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"call_in_process runs sync handlers; {fn!r} is async")
    loop = asyncio.get_running_loop()
    child = _Child(loop, fn, ctx)
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(child.answered)
    except TimeoutError:
        child.kill()
        try:
            await asyncio.wait_for(asyncio.shield(child.exited), _REAP_AFTER_KILL)
        except TimeoutError:  # stuck in the kernel: the reaper thread waits for it
            pass
        finally:
            child.release()
        raise HandlerTimedOut(
            f"the handler ran past its time limit of {timeout:g} s; its process (pid {child.pid}) "
            f"was killed"
        ) from None
    except BaseException:  # cancelled: execution cancel, lost lease, deadline, worker shutdown
        child.kill()
        child.release()
        raise
    child.release()
    return child.outcome()
