"""schemathesis against ``/openapi.json`` of a served dashboard with tokens, on a real database.

Every ``/api/v1`` operation gets generated requests, valid and invalid (bodies, queries, path
ids): no answer may be a 5xx, every answer must be one the OpenAPI describes, with its content
type and schema. Besides what schemathesis generates from the schema, bodies and queries with
one value replaced by text with a NUL character or a number out of range
(tests/support/schemathesis_hooks.py): each must be refused 4xx. A fixed seed, deterministic
generation and no example database keep it from flaking; a small number of examples per
operation keeps it near a minute.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import konduit
from konduit.web import create_app, database_client
from konduit.web.security import Security, parse_tokens
from tests.apps import api_app
from tests.support.browser import serving

OP = "op-" + "s" * 24
HOOKS = Path(__file__).parent / "support" / "schemathesis_hooks.py"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")


@pytest.mark.storage
@pytest.mark.slow
def test_schemathesis_finds_nothing(make_app: Callable[..., konduit.App], db_url: str,
                                    tmp_path: Path) -> None:
    local = Path(sys.executable).with_name("schemathesis")
    tool = str(local) if local.exists() else shutil.which("schemathesis")
    assert tool, "schemathesis is a test dependency: pip install -e '.[test]'"
    app = make_app(*api_app.WORKFLOWS)
    # Some history, so reads return real rows (and their schemas are checked).
    handle = app.start("api-flow", {"fail": True}, idempotency_key="seed", timeout="1h")
    security = Security(parse_tokens([f"op:{OP}"]))
    with serving(create_app(database_client(db_url, app), app, security=security)) as base:
        assert handle.id
        run = subprocess.run(
            [tool, "run", f"{base}/openapi.json",
             "--header", f"Authorization: Bearer {OP}", "--checks", CHECKS,
             "--max-examples", "15", "--seed", "20261201", "--generation-deterministic",
             "--phases", "examples,coverage,fuzzing",
             # A stream's server-sent events answer for as long as its execution runs (an id
             # prefix as short as "0" names the seed execution, which runs for an hour): a fuzzer
             # would only see its request time out. tests/test_stream_doors.py covers the route.
             "--exclude-path-regex", r"/streams/\{name\}$",
             "--workers", "1", "--request-timeout", "20", "--no-color",
             "--suppress-health-check", "all", "--report", "junit",
             "--report-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path,
            env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    # 17: with POST /executions/{id}/migrate, GET /executions/{id}/logs (attempt logs),
    # POST /executions/{id}/redrive, POST /executions:bulk and the bulk jobs (POST, GET),
    # POST /executions/{id}/fork; 22 with POST /executions/{id}/steps/{step}/answer and GET
    # /inbox; 24 with GET /executions/{id}/journal (durable calls) and GET
    # /executions/{id}/streams (its server-sent events are left out, above).
    assert "24 selected / 25 total" in output and "Tested: 24" in output, output[-3000:]
