"""The operator's view of the fleet: the workers page (alive, stopped or dead, slots, the attempts
each one runs, abandoned handler threads, last heartbeat) and the status strip over the
executions list (running executions, live workers, queue depth and the oldest due task per queue
and workflow), each with the JSON its page's script polls; the stats, alerts and webhook
deliveries pages, and ``/metrics``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from konduit.errors import KonduitError, StatsError
from konduit.reads import ReadModel
from konduit.records import TriggerRecord
from konduit.web import views
from konduit.web.site import SiteDep

RECENT_WORKERS = 24 * 3600.0  # the workers page lists those heard from within a day
RUNNING_SHOWN = 500  # open attempts listed on the workers page
STOPPED_SHOWN = 600.0  # workers stopped longer ago are hidden unless "show all"
STATE_ORDER = {"alive": 0, "dead": 1, "stopped": 2}  # live workers first: who serves now
REFRESH_SECONDS = 2  # the alerts and webhooks pages refresh every 5 times this


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


router = APIRouter()


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request, site: SiteDep, all: bool = False) -> Response:
    model = await site.model()
    found, hidden = shown_workers(await load_workers(model), everything=all)
    return site.page(request, "workers.html", workers=found, strip=await load_strip(model),
                     live="/workers.json", poll_ms=2000, hidden=hidden, showing_all=all)


@router.get("/strip.json")
async def strip_live(site: SiteDep) -> Response:
    """The status strip alone, for the executions list's script."""
    return JSONResponse(jsonable_encoder((await load_strip(await site.model())).to_json()))


@router.get("/workers.json")
async def workers_live(site: SiteDep) -> Response:
    model = await site.model()
    found = await load_workers(model)
    return JSONResponse(jsonable_encoder({"workers": [worker_json(w) for w in found],
                                          "strip": (await load_strip(model)).to_json()}))


@router.get("/stats", response_class=HTMLResponse)
async def stats(request: Request, site: SiteDep, workflow: str | None = None,
                history: str = "24h", fan_in_alert: str = "20s",
                consecutive: int = 2) -> Response:
    model = await site.model()
    options = {"workflow": workflow or "", "history": history, "fan_in_alert": fan_in_alert,
               "consecutive": consecutive}
    try:
        result = await model.stats(workflow or None, history=history,
                                   fan_in_alert=fan_in_alert, consecutive=consecutive)
    except StatsError as exc:
        return site.page(request, "stats.html", 400, stats=None, options=options,
                         error=str(exc))
    alerting = {(a.workflow, a.join) for a in result.alerts}
    triggers_of: dict[str, list[TriggerRecord]] = {}
    for t in await model.triggers(workflow or None):
        triggers_of.setdefault(t.workflow_name, []).append(t)
    return site.page(request, "stats.html", stats=result, options=options, alerting=alerting,
                     triggers_of=triggers_of)


@router.get("/alerts", response_class=HTMLResponse)
async def alerts(request: Request, site: SiteDep, limit: int = 100) -> Response:
    found = await site.ops.alerts(include_resolved=True, limit=max(1, min(limit, 1000)))
    return site.page(request, "alerts.html", refresh=REFRESH_SECONDS * 5,
                     open=[a for a in found if a.open], resolved=[a for a in found if not a.open])


@router.get("/webhooks", response_class=HTMLResponse)
async def webhook_deliveries(request: Request, site: SiteDep, status: str | None = None,
                             limit: int = 100) -> Response:
    try:
        found = await site.ops.webhook_deliveries(status=status or None,
                                                  limit=max(1, min(limit, 1000)))
    except KonduitError as exc:
        return site.page(request, "webhooks.html", 400, deliveries=[], status=status,
                         error=str(exc))
    return site.page(request, "webhooks.html", refresh=REFRESH_SECONDS * 5, deliveries=found,
                     status=status, error=None)


@router.get("/metrics")
async def metrics(site: SiteDep) -> Response:
    body = await asyncio.to_thread(generate_latest, await site.clients.registry())
    return Response(body, media_type=CONTENT_TYPE_LATEST)
