"""A real HTTP receiver for webhook tests: a server on 127.0.0.1 in a thread that records every
request and answers from a script (status codes in order; a request may be held open)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    answers: list[int] = field(default_factory=list)  # status per request in order; then 200
    hold_first: threading.Event | None = None  # the first request waits for this before answering
    requests: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Wait (bounded) until ``count`` requests arrived; returns them all."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"{len(self.requests)} request(s) arrived, wanted {count}")
            return list(self.requests)


@contextmanager
def receiver(answers: list[int] | None = None, *, hold_first: bool = False) -> Iterator[Receiver]:
    state: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with state.arrived:
                index = len(state.requests)
                state.requests.append(Received(self.path, dict(self.headers.items()), body))
                state.arrived.notify_all()
            if index == 0 and state.hold_first is not None:
                state.hold_first.wait(60)
            code = state.answers[index] if index < len(state.answers) else 200
            try:
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:
                pass  # the sender is gone (killed): nothing to answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state = Receiver(f"http://127.0.0.1:{server.server_port}/hooks/konduit", list(answers or []),
                     threading.Event() if hold_first else None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hold_first is not None:
            state.hold_first.set()
        server.shutdown()
        server.server_close()
