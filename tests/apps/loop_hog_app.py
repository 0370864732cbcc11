"""A worker app whose handler blocks the worker's event loop (tests/test_stop_watch.py): an
``async def`` that sleeps without awaiting, the hostile code a stop must survive."""

import time

import konduit

wf = konduit.Workflow("loop-hog", version=1)


@wf.step()
async def hog(ctx):
    time.sleep(600)  # blocks the loop: no await in ten minutes


app = konduit.App([wf])
