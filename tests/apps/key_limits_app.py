"""The app that the per-key limit tests run in real worker processes
(``konduit worker tests.apps.key_limits_app:app``).

``keyed``'s handler writes its key, start and end time (wall clock; the workers share the
machine) into the table ``key_spans`` of the database named by the execution's input, so the
test can compute how many ran at once per key.
"""

from __future__ import annotations

import time

import psycopg

import konduit

HOLD = 0.15  # seconds each task of the keyed step runs


def customer(ctx: konduit.KeyContext) -> str:
    return str(ctx.input["customer"])


wf = konduit.Workflow("key-limits", version=1)


@wf.step(concurrency=konduit.Limit(2, key=customer))
def keyed(ctx: konduit.Context) -> str:
    began = time.time()
    time.sleep(HOLD)
    ended = time.time()
    with psycopg.connect(ctx.input["dsn"], autocommit=True) as conn:
        conn.execute("INSERT INTO key_spans (key, began, ended) VALUES (%s, %s, %s)",
                     (ctx.input["customer"], began, ended))
    return str(ctx.input["customer"])


rated = konduit.Workflow("key-rates", version=1)


@rated.step(rate=konduit.Rate("2/s", key=customer))
def call_api(ctx: konduit.Context) -> str:
    return str(ctx.input["customer"])


app = konduit.App([wf, rated])
