"""The app the every-door tests run in a real worker process
(``konduit worker tests.apps.doors_app:app``): an order workflow whose ``reserve_stock`` step is
limited to one running task per customer, with the key declared as data (a path into the input)
so that every door computes it, and its twin keyed by a function (code), which a door without
the code must refuse rather than start keyless.

``reserve_stock`` writes its customer, door, start and end time (wall clock; one machine) into
the table ``door_spans`` of the database named by the input, so the test can compute how many
ran at once per customer.
"""

from __future__ import annotations

import time

import psycopg

import konduit

HOLD = 1.0  # seconds each reservation takes (the shape: 3 customers x 2 tasks of 1 s)

orders = konduit.Workflow("orders", version=1)


@orders.step(concurrency=konduit.Limit(1, key="input.customer"))
def reserve_stock(ctx: konduit.Context) -> str:
    began = time.time()
    time.sleep(HOLD)
    ended = time.time()
    with psycopg.connect(ctx.input["dsn"], autocommit=True) as conn:
        conn.execute("INSERT INTO door_spans (customer, door, began, ended) "
                     "VALUES (%s, %s, %s, %s)",
                     (ctx.input["customer"], ctx.input["door"], began, ended))
    return str(ctx.input["customer"])


# Started by an event: the trigger's start runs in the worker, which has the code.
orders.on_event("order-placed")


# Started by a schedule: the tick's start runs in the worker, and computes the same key.
nightly = konduit.Workflow("nightly-orders", version=1)
nightly.step(name="reserve", concurrency=konduit.Limit(1, key="input.customer"))(
    lambda ctx: "reserved")
nightly.schedule(every="1s", input={"customer": "nightly"})


def customer_of(ctx: konduit.KeyContext) -> str:
    return str(ctx.input["customer"])


by_function = konduit.Workflow("orders-by-function", version=1, max_running=5,
                               key=lambda i: i["customer"])
by_function.step(name="reserve", concurrency=konduit.Limit(1, key=customer_of))(
    lambda ctx: "reserved")

app = konduit.App([orders, nightly, by_function])
