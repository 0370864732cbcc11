"""Flow limits in the database: registered with their workflow, read for stats and metrics.

The limits themselves are enforced by the claim (:func:`konduit.engine.transitions.claim`).
"""

from __future__ import annotations

from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx
from konduit.engine.registry import workflow_key


async def register_flow_limits(tx: Tx, spec: WorkflowSpec) -> None:
    """Store the limits of ``spec``'s steps for the whole fleet, and lift those of its steps
    that no longer have any (their rows stay, for the throttled time they recorded)."""
    limits = spec.flow_limits
    steps = sorted(limits)  # rows in one order: two registrations queue, never deadlock
    await tx.run(
        "flow_limit_upsert_for_workflow",
        workflow=workflow_key(spec.name, spec.version),
        steps=steps,
        concurrencies=[limits[s].concurrency for s in steps],
        rate_counts=[limits[s].rate_count for s in steps],
        rate_seconds=[limits[s].rate_seconds for s in steps],
        keyeds=[limits[s].keyed for s in steps],
    )


async def flow_limits(db: Database) -> list[Row]:
    """Every limited step: workflow, step, concurrency, rate_count, rate_seconds, running,
    ready, throttled_seconds (total, an open stretch up to now), throttled_now, throttled_claims."""
    return await db.all("flow_limit_list")
