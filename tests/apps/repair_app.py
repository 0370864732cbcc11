"""An app whose cover_image degrades until the KONDUIT_TEST_HEALED file exists (CLI repair)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import konduit

wf = konduit.Workflow("repair-cli", version=1)


@wf.step()
def transcribe(ctx: konduit.Context) -> str:
    return "words"


@wf.step(after=[transcribe], deadline="300ms", retry=konduit.Retry(max_attempts=1),
         fallback=lambda ctx: "fallback.png")
async def cover_image(ctx: konduit.Context) -> str:
    if not Path(os.environ.get("KONDUIT_TEST_HEALED", "/nonexistent")).exists():
        await asyncio.sleep(30)
    return "real.png"


@wf.step(after=[cover_image])
def publish(ctx: konduit.Context) -> dict[str, str]:
    return {"image": ctx.upstream["cover_image"]}


app = konduit.App([wf])
