"""A content pipeline with a publication window: a deadline per branch and a degraded fallback.

Each night an episode is transcribed, then summarised, captioned chapter by chapter and given a
cover image in parallel, and published. The execution has a publication window
(``deadline_at``): ``publish`` must go out inside it. The cover image comes from an image service
that sometimes slows down; its branch has a deadline of its own, and past it the branch degrades
to a plain cover (its ``fallback``), so ``publish`` still makes the window. Waiting for the slow
branch instead would have missed it. The deadline is ``Deadline.adaptive()``, computed from the
step's own history, clamped here to seconds so the example ends quickly.

The first night the image service is fast; the second it hangs (two minutes, past the window)
and the branch degrades.

Run it: ``python examples/content_pipeline.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import konduit
import konduit.testing
from konduit.databases import EXAMPLES_DATABASE, own_database

wf = konduit.Workflow("example-nightly-episode", version=1)


@wf.step()
def transcribe(ctx: konduit.Context) -> dict[str, Any]:
    time.sleep(0.2)  # the speech-to-text call
    return {"text": f"the transcript of episode {ctx.input['episode']}",
            "chapters": ["intro", "interview", "outro"]}


@wf.step(after=[transcribe], deadline="20s")
def summarise(ctx: konduit.Context) -> str:
    return str(ctx.upstream["transcribe"]["text"][:40])


@wf.map(after=[transcribe], over=lambda out: out["chapters"], deadline="20s")
def caption(ctx: konduit.Context) -> str:
    return f"captions for {ctx.item}"


def plain_cover(ctx: konduit.Context) -> dict[str, str]:
    """The fallback: what the cover branch gives when it does not answer in time."""
    return {"image": "plain-cover.png"}


@wf.step(after=[transcribe], required=False, fallback=plain_cover,
         deadline=konduit.Deadline.adaptive(floor="1s", ceiling="3s", default="2s"))
async def cover_image(ctx: konduit.Context) -> dict[str, str]:
    await asyncio.sleep(ctx.input["image_service_seconds"])  # cancelled at the deadline
    return {"image": f"cover-{ctx.input['episode']}.png"}


@wf.step(after=[summarise, caption, cover_image], join=konduit.Join.required())
def publish(ctx: konduit.Context) -> dict[str, Any]:
    return {"summary": ctx.upstream["summarise"], "captions": len(ctx.upstream["caption"]),
            "cover": ctx.upstream["cover_image"]["image"],
            "published_at": datetime.now(UTC).isoformat(timespec="seconds")}


# The examples' own database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([wf], database_url=own_database(EXAMPLES_DATABASE))


def main() -> None:
    nights = []
    with konduit.testing.worker_thread(app, concurrency=8):
        for episode, image_service_seconds in ((1, 0.2), (2, 120.0)):
            window = datetime.now(UTC) + timedelta(seconds=45)  # the publication window's end
            handle = app.start("example-nightly-episode",
                               input={"episode": episode, "image_service_seconds": image_service_seconds},
                               deadline_at=window)
            result = handle.wait(timeout=120)
            published = datetime.fromisoformat(result.output["published_at"])
            print(f"episode {episode}: {result.status}, cover {result.outcomes['cover_image']} "
                  f"({result.output['cover']}), published {'inside' if published <= window else 'AFTER'} "
                  f"the window")
            nights.append((result, published <= window))

    (fast, fast_in_window), (slow, slow_in_window) = nights
    assert fast.outcomes["cover_image"] == "succeeded" and fast.output["cover"] == "cover-1.png"
    assert slow.outcomes["cover_image"] == "degraded" and slow.output["cover"] == "plain-cover.png"
    assert fast_in_window and slow_in_window
    app.close()


if __name__ == "__main__":
    main()
