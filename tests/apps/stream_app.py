"""A step that writes a durable stream, for the tests that kill its worker mid-stream
(tests/test_stream_processes.py).

Its first attempt writes ``STALL_AT`` chunks and then hangs (the test SIGKILLs its worker
process there); any later attempt writes all ``CHUNKS`` chunks and returns how many it wrote."""

from __future__ import annotations

import time

import konduit

CHUNKS = 12
STALL_AT = 5

wf = konduit.Workflow("stream-kill", version=1)


@wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.1s"),
         deadline="120s")
def tokens(ctx: konduit.Context) -> int:
    for i in range(CHUNKS):
        if ctx.attempt == 1 and i == STALL_AT:
            while True:  # the test kills this process now
                time.sleep(0.1)
        ctx.stream.write({"i": i, "attempt": ctx.attempt})
    return CHUNKS


app = konduit.App([wf])
