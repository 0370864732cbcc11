"""The operator's view of the fleet: the workers page (alive, stopped or dead, slots, the attempts
each one runs, abandoned handler threads, last heartbeat) and the status strip over the
executions list (running executions, live workers, queue depth and the oldest due task per queue
and workflow), each with the JSON its page's script polls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse, Response

from konduit.reads import ReadModel
from konduit.web import views
from konduit.web.site import Site

RECENT_WORKERS = 24 * 3600.0  # the workers page lists those heard from within a day
RUNNING_SHOWN = 500  # open attempts listed on the workers page
STOPPED_SHOWN = 600.0  # workers stopped longer ago are hidden unless "show all"
STATE_ORDER = {"alive": 0, "dead": 1, "stopped": 2}  # live workers first: who serves now


def shown_workers(found: list[dict[str, Any]], *, everything: bool) -> tuple[list[dict[str, Any]], int]:
    """The workers the page lists, live ones first (then dead, then stopped, each newest heard
    from first), without those stopped more than :data:`STOPPED_SHOWN` ago unless
    ``everything``; and how many were hidden."""
    ordered = sorted(found, key=lambda w: (STATE_ORDER.get(str(w["state"]), 3),
                                           float(w["heartbeat_age"] or 0.0)))
    if everything:
        return ordered, 0
    kept = [w for w in ordered if w["state"] != "stopped"
            or float(w["heartbeat_age"] or 0.0) <= STOPPED_SHOWN]
    return kept, len(ordered) - len(kept)


@dataclass
class Strip:
    """The line over the executions list."""

    running: int
    workers_alive: int
    queues: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "workers_alive": self.workers_alive,
                "queues": [{"queue": q["queue"], "workflow": q["workflow"], "ready": q["ready"],
                            "due": q["due"], "oldest_age": q["oldest_age"],
                            "oldest": views.secs(q["oldest_age"]) if q["oldest_age"] is not None
                            else None} for q in self.queues]}


async def load_strip(model: ReadModel) -> Strip:
    running = await model.running_count()
    live = await model.workers()
    queues = [q.to_dict() for q in await model.queues()]
    return Strip(running, len(live), queues)


async def load_workers(model: ReadModel, since_seconds: float = RECENT_WORKERS) -> list[dict[str, Any]]:
    """Every worker heard from recently, each with the attempts it runs now."""
    workers = await model.recent_workers(since_seconds)
    running = await model.running_attempts(RUNNING_SHOWN)
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for a in running:
        by_worker.setdefault(str(a.worker_id), []).append(a.to_dict())
    return [w.to_dict() | {"attempts": by_worker.get(str(w.id), [])} for w in workers]


def worker_json(w: dict[str, Any]) -> dict[str, Any]:
    return {"id": w["id"], "state": w["state"], "running": w["running"],
            "concurrency": w["concurrency"], "abandoned": w["abandoned"],
            "heartbeat_age": w["heartbeat_age"], "heartbeat": f"{views.secs(w['heartbeat_age'])} ago",
            "attempts": [{"execution_id": str(a["execution_id"]), "step": a["step"],
                          "map_index": a["map_index"], "attempt": a["attempt"], "hedge": a["hedge"],
                          "running_for": a["running_for"]} for a in w["attempts"]]}


def register(web: FastAPI, site: Site) -> None:
    """Add the workers page and its JSON to ``web``."""

    @web.get("/workers", response_class=HTMLResponse)
    async def workers(request: Request, all: bool = False) -> Response:
        model = await site.clients.model()
        found, hidden = shown_workers(await load_workers(model), everything=all)
        return site.page(request, "workers.html", workers=found, strip=await load_strip(model),
                         live="/workers.json", poll_ms=2000, hidden=hidden, showing_all=all)

    @web.get("/strip.json")
    async def strip_live() -> Response:
        """The status strip alone, for the executions list's script."""
        return JSONResponse(jsonable_encoder((await load_strip(await site.clients.model())).to_json()))

    @web.get("/workers.json")
    async def workers_live() -> Response:
        model = await site.clients.model()
        found = await load_workers(model)
        return JSONResponse(jsonable_encoder({"workers": [worker_json(w) for w in found],
                                              "strip": (await load_strip(model)).to_json()}))
