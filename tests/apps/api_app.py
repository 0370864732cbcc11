"""Workflows the HTTP API tests start, inspect, cancel and repair (tests/test_api_v1.py,
tests/test_web_security.py, tests/test_openapi_schemathesis.py)."""

from __future__ import annotations

import threading

import konduit

HEALED = threading.Event()  # `flaky` fails (non-retryably) on {"fail": true} until this is set
RELEASE = threading.Event()  # `hold` waits for this (or its deadline), so it can be cancelled

flow = konduit.Workflow("api-flow", version=1)


@flow.step()
def begin(ctx: konduit.Context) -> dict[str, object]:
    return {"input": ctx.input}


@flow.step(after=[begin])
def fine(ctx: konduit.Context) -> str:
    return "fine"


@flow.step(after=[begin], required=False, retry=konduit.Retry(max_attempts=1))
def flaky(ctx: konduit.Context) -> str:
    if isinstance(ctx.input, dict) and ctx.input.get("fail") and not HEALED.is_set():
        raise konduit.NonRetryableError("flaky <b>broke</b> on purpose")
    return "healed"


@flow.step(after=[fine, flaky], join=konduit.Join.all_done())
def end(ctx: konduit.Context) -> list[str]:
    return sorted(ctx.upstream)


hold = konduit.Workflow("api-hold", version=1)


@hold.step()
async def wait_here(ctx: konduit.Context) -> str:
    import asyncio

    for _ in range(600):
        if RELEASE.is_set():
            break
        await asyncio.sleep(0.05)
    return "released"


hold.schedule(every="1h", name="api-hourly", input={"from": "schedule"})

WORKFLOWS = [flow, hold]
