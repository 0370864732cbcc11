"""Calling Konduit from another service over HTTP: start an execution and wait for its result.

A service written in any language talks to Konduit through ``konduit dashboard``'s JSON API
(``/api/v1``, docs/api.md) with a bearer token; it needs neither this package nor the database.
This script plays all the parts on one machine: it starts a worker (``konduit worker``) and the
API server (``konduit dashboard --app ... --token op:SECRET``) as processes, as a deployment
would run them, then acts as the other service using nothing but ``urllib``:
``POST /api/v1/executions`` to start, ``GET /api/v1/executions/{id}`` until it has finished.

Run it: ``python examples/http_client.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import konduit
from konduit.databases import EXAMPLES_DATABASE, own_database

wf = konduit.Workflow("example-thumbnails", version=1)


@wf.step()
def plan(ctx: konduit.Context) -> list[int]:
    return [int(width) for width in ctx.input["widths"]]


@wf.map(after=[plan], over=lambda widths: widths)
def resize(ctx: konduit.Context) -> str:
    return f"{ctx.input['image']}@{ctx.item}w"


@wf.step(after=[resize])
def index(ctx: konduit.Context) -> dict[str, Any]:
    return {"image": ctx.input["image"], "thumbnails": ctx.upstream["resize"]}


# What the worker and the API server load (examples/http_client.py:app), on the examples' own
# database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([wf], database_url=own_database(EXAMPLES_DATABASE))

FINISHED = {"succeeded", "failed", "timed_out", "cancelled"}


def call(base: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One JSON call with the bearer token; (status, decoded body), errors included."""
    request = urllib.request.Request(
        base + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as refused:  # 4xx/5xx: a problem+json body says why
        return refused.code, json.loads(refused.read() or b"null")


def start_and_wait(base: str, token: str, workflow: str, input: Any, timeout: float = 60) -> Any:
    """What the other service does: start an execution, then poll until it has finished."""
    status, started = call(base, token, "POST", "/api/v1/executions",
                           {"workflow": workflow, "input": input, "idempotency_key": "thumbs-42"})
    assert status == 201, (status, started)
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        status, execution = call(base, token, "GET", f"/api/v1/executions/{started['id']}")
        assert status == 200, (status, execution)
        if execution["status"] in FINISHED:
            return execution
        time.sleep(0.2)
    raise TimeoutError(f"execution {started['id']} still running after {timeout} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    app.migrate()  # against a server of your own, `konduit db migrate` once per upgrade
    token, port = secrets.token_urlsafe(24), free_port()
    base = f"http://127.0.0.1:{port}"
    here, module = Path(__file__).resolve().parent, Path(__file__).stem
    # The konduit command of this Python's environment.
    konduit_cli = str(Path(sys.executable).with_name("konduit"))
    if not Path(konduit_cli).exists():
        konduit_cli = shutil.which("konduit") or "konduit"
    search_path = [str(here), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(search_path)}
    processes = [
        subprocess.Popen([konduit_cli, "worker", f"{module}:app", "--concurrency", "4"], cwd=here, env=env),
        subprocess.Popen([konduit_cli, "dashboard", "--app", f"{module}:app", "--port", str(port),
                          "--token", f"op:{token}"], cwd=here, env=env),
    ]
    try:
        until = time.monotonic() + 60
        while True:  # the API server is up when it answers
            try:
                if call(base, token, "GET", "/api/v1/workflows")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > until or any(p.poll() is not None for p in processes):
                raise RuntimeError("the API server did not start")
            time.sleep(0.2)

        print("without the token:", call(base, "wrong", "GET", "/api/v1/executions")[0])
        execution = start_and_wait(base, token, "example-thumbnails",
                                   {"image": "cover.png", "widths": [160, 320, 640]})
        print(execution["status"], execution["output"])
        assert execution["status"] == "succeeded"
        assert execution["output"] == {"image": "cover.png",
                                       "thumbnails": ["cover.png@160w", "cover.png@320w", "cover.png@640w"]}
    finally:
        for process in processes:  # SIGTERM: both stop gracefully
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        app.close()


if __name__ == "__main__":
    main()
