"""Two versions of one workflow side by side, for ``konduit worker tests.apps.versions_app:app``
(tests/test_versions_drain.py): version 1 is kept until its executions drain, version 2 is the
new shape (a step added) that new starts take."""

from __future__ import annotations

import konduit


def _version(version: int) -> konduit.Workflow:
    wf = konduit.Workflow("drain", version=version)

    @wf.step()
    def fetch(ctx: konduit.Context) -> int:
        return int(ctx.input or 0)

    @wf.step(after=[fetch])
    def publish(ctx: konduit.Context) -> dict[str, int]:
        return {"value": ctx.upstream["fetch"], "version": version}

    if version >= 2:
        @wf.step(after=[publish])
        def announce(ctx: konduit.Context) -> dict[str, int]:
            return {**ctx.upstream["publish"], "announced": 1}

    return wf


V1 = _version(1)
V2 = _version(2)
app = konduit.App([V1, V2])
