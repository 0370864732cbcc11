"""A durable stream survives its worker's death and its reader's disconnect (docs/streams.md),
with real ``konduit worker`` processes: the first is SIGKILLed mid-stream, a second rescues the
task and its retried attempt writes the stream again after a restart record; a reader that
disconnected in between resumes from its last offset and gets every record exactly once, in
order, the restart record included."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import konduit
from tests.apps import stream_app
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import kill_workers, reaped, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage]


def spawn(db_url: str, log: Path):
    return spawn_worker(
        "tests.apps.stream_app:app", db_url, "--lease-seconds", "2",
        "--heartbeat-interval", "0.5", "--maintenance-interval", "0.2", "--alert-interval", "0",
        concurrency=2, log_level="INFO", log=log)


def test_a_stream_survives_a_worker_kill_and_a_reader_reconnect(db_url, tmp_path):
    log = tmp_path / "workers.log"
    # The App registers the workflow; the Client, without its code, reads the stream.
    app = konduit.App([stream_app.wf], database_url=db_url)
    client = konduit.Client(db_url)
    try:
        with reaped([]) as procs:
            procs.append(spawn(db_url, log))
            handle = app.start("stream-kill")

            # A reader follows the stream live, and disconnects after three records.
            first: list[konduit.StreamChunk] = []
            got_three = threading.Event()

            def read_some() -> None:
                for chunk in client.stream(handle.id, "tokens"):
                    first.append(chunk)
                    if len(first) == 3:
                        got_three.set()
                        return  # leaving the loop closes the follower: a disconnect

            reader = threading.Thread(target=read_some, daemon=True)
            reader.start()
            assert got_three.wait(60), log.read_text()[-4000:]
            reader.join(30)
            assert not reader.is_alive()

            # The first attempt stalls after STALL_AT chunks: its worker is killed there.
            until(lambda: value(db_url, "SELECT count(*) FROM konduit_stream_chunks "
                                "WHERE execution_id = %s", handle.id) == stream_app.STALL_AT,
                  60, "the first attempt's chunks")
            kill_workers(procs)
            procs.append(spawn(db_url, log))

            # The reader comes back from its last offset, and follows to the end.
            rest = list(client.stream(handle.id, "tokens", from_offset=first[-1].offset + 1))
            assert client.wait(handle.id, timeout=60).output == stream_app.CHUNKS
            stop_workers(procs[1:])
    finally:
        client.close()
        app.close()

    seen = first + rest
    story = [(c.offset, c.kind, c.attempt, c.data) for c in seen]
    # Every offset once, in order, none missing.
    assert [c.offset for c in seen] == list(range(len(seen))), story
    stalled = stream_app.STALL_AT
    assert len(seen) == stalled + 1 + stream_app.CHUNKS, story
    # The first attempt's chunks, then where the second started again, then all of its own.
    assert [c.data for c in seen[:stalled]] == [{"i": i, "attempt": 1} for i in range(stalled)]
    marker = seen[stalled]
    assert (marker.kind, marker.restart, marker.attempt, marker.previous_attempt,
            marker.data) == ("restart", True, 2, 1, None), story
    assert [c.data for c in seen[stalled + 1:]] == [
        {"i": i, "attempt": 2} for i in range(stream_app.CHUNKS)], story
    # What the database keeps is what the reader got.
    stored = rows(db_url, "SELECT chunk_offset, kind FROM konduit_stream_chunks "
                  "WHERE execution_id = %s ORDER BY chunk_offset", handle.id)
    assert [(o, k) for o, k in stored] == [(c.offset, c.kind) for c in seen]
    assert rows(db_url, "SELECT chunks, restarts, writer_attempt FROM konduit_streams "
                "WHERE execution_id = %s", handle.id) == [
        (stalled + stream_app.CHUNKS, 1, 2)]
