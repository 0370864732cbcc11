"""A 100,000-item fan-out: one map step runs a task per item, and one join reads all the results.

A catalogue of 100,000 products is re-priced: ``list_products`` returns the ids, the map
``reprice`` runs one task per id (each its own durable task: retried, fenced, recorded), and
``total`` fires exactly once when every item ended, reading their results as one list in item
order. Workers claim and complete map items in batches, so the cost per item is a fraction of a
millisecond of database time.

Run it: ``python examples/fan_out_100k.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
``KONDUIT_EXAMPLE_ITEMS=10000`` runs a smaller catalogue. Measured: 100,000 items in 440 s on the
embedded PostgreSQL 18 of a loaded, shared 2-core machine (227 items/s); a quiet machine is faster.
"""

from __future__ import annotations

import os
import time

import konduit
import konduit.testing
from konduit.databases import EXAMPLES_DATABASE, own_database

ITEMS = int(os.environ.get("KONDUIT_EXAMPLE_ITEMS", "100000"))

wf = konduit.Workflow("example-reprice-catalogue", version=1)


@wf.step()
def list_products(ctx: konduit.Context) -> list[int]:
    return list(range(ctx.input["products"]))


@wf.map(after=[list_products], over=lambda ids: ids, max_items=1_000_000)
def reprice(ctx: konduit.Context) -> int:
    return int(ctx.item) % 7  # the new price's change in cents, say


@wf.step(after=[reprice])
def total(ctx: konduit.Context) -> dict[str, int]:
    changes = ctx.upstream["reprice"]  # one result per item, in item order
    return {"products": len(changes), "total_change": sum(changes)}


# The examples' own database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([wf], database_url=own_database(EXAMPLES_DATABASE))


def main() -> None:
    began = time.monotonic()
    with konduit.testing.worker_thread(app, concurrency=8):
        handle = app.start("example-reprice-catalogue", input={"products": ITEMS})
        result = handle.wait(timeout=3 * 3600)  # minutes on a quiet machine; a loaded one is slower
    seconds = time.monotonic() - began
    expected = sum(n % 7 for n in range(ITEMS))
    assert result.output == {"products": ITEMS, "total_change": expected}, result.output
    print(f"{ITEMS:,} items in {seconds:.1f} s ({ITEMS / seconds:,.0f} items/s): {result.output}")
    app.close()


if __name__ == "__main__":
    main()
