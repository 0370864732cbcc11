"""A one-step workflow for the worker processes of tests/test_worker_wait.py."""

import konduit

wf = konduit.Workflow("after-outage", version=1)


@wf.step()
def greet(ctx: konduit.Context) -> str:
    return f"hello {ctx.input['name']}"


app = konduit.App([wf])
