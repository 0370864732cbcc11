"""The workflows scripts/commits_per_task.py measures: WIDTH no-op root branches + a join
(``measure-fan``), and a seed, a map of no-op items and a join reading them all
(``measure-map``, its input the number of items)."""

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


mapped = konduit.Workflow("measure-map", version=1)


@mapped.step()
async def seed(ctx: konduit.Context) -> list[int]:
    return list(range(int(ctx.input)))


@mapped.map(after=[seed], over=lambda items: items)
async def item(ctx: konduit.Context) -> int:
    return 1


@mapped.step(after=[item])
async def total(ctx: konduit.Context) -> int:
    return len(ctx.upstream["item"])


app = konduit.App([wf, mapped], database_url=os.environ["MEASURE_URL"])
