"""An app with seed 004's repair contract, for `konduit worker tests.apps.auto_repair_app:app`.

cover_image's resize service is down (it hangs past the branch's deadline, so the branch degrades
to its fallback) until the file named by KONDUIT_TEST_HEALED exists. Executions are auto-repaired
4 s after they finish (repair_delay), within 1 h (repair_within).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import konduit

wf = konduit.Workflow("auto-repair", version=1, repair_within="1h", repair_delay="4s")


def healed() -> bool:
    return Path(os.environ.get("KONDUIT_TEST_HEALED", "/nonexistent")).exists()


@wf.step()
def transcribe(ctx: konduit.Context) -> str:
    return f"episode {ctx.input}"


@wf.step(after=[transcribe], deadline="300ms", retry=konduit.Retry(max_attempts=1),
         required=False, fallback=lambda ctx: "fallback.png")
async def cover_image(ctx: konduit.Context) -> str:
    if not healed():
        await asyncio.sleep(30)
    return "real.png"


@wf.step(after=[transcribe])
def captions(ctx: konduit.Context) -> str:
    return "captions"


@wf.step(after=[cover_image, captions], join=konduit.Join.required())
def publish(ctx: konduit.Context) -> dict[str, str]:
    return {"image": ctx.upstream["cover_image"], "captions": ctx.upstream["captions"]}


app = konduit.App([wf])
