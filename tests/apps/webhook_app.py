"""An App with a webhook to the receiver named by KONDUIT_TEST_WEBHOOK_URL, for the test that
kills a worker mid-delivery (tests/test_webhook_delivery.py)."""

from __future__ import annotations

import os

import konduit

wf = konduit.Workflow("hooked", version=1)


@wf.step()
def only(ctx: konduit.Context) -> str:
    return "done"


HOOK = konduit.Webhook(os.environ.get("KONDUIT_TEST_WEBHOOK_URL", "http://127.0.0.1:9/"),
                       secret="kill-test-secret", allow_private=True, timeout=1.0)

app = konduit.App([wf], webhooks=[HOOK])
