"""The workflow scripts/commits_per_task.py measures: WIDTH no-op root branches + a join."""

import os

import konduit

WIDTH = int(os.environ.get("MEASURE_WIDTH", "20"))

wf = konduit.Workflow("measure-fan", version=1)
branches = []
for i in range(WIDTH):

    async def branch(ctx: konduit.Context) -> int:
        return 1

    branches.append(wf.step(name=f"b{i}")(branch))


@wf.step(after=branches)
async def join(ctx: konduit.Context) -> int:
    return len(ctx.upstream)


app = konduit.App([wf], database_url=os.environ["MEASURE_URL"])
