"""Webhooks: what a user configures, and the pure rules of a delivery (payload, signature,
backoff, when to give up). The outbox and the senders are in :mod:`konduit.engine.webhooks` and
:mod:`konduit.worker.webhook_sender`; the guarded HTTP call in :mod:`konduit.worker.webhook_http`.
See docs/webhooks.md."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from konduit.errors import KonduitError

EXECUTION_EVENTS = ("execution.finished", "execution.degraded")
ALERT_EVENTS = ("alert.raised", "alert.resolved")
EVENTS = (*EXECUTION_EVENTS, *ALERT_EVENTS)
"""Every event a webhook may subscribe to:

- ``execution.finished``: an execution reached a terminal status (succeeded, failed, timed_out
  or cancelled), once per finish (a repaired execution finishes again: a new event);
- ``execution.degraded``: an execution *succeeded* while at least one of its steps ended
  ``degraded`` (its fallback's payload), ``timed_out`` or ``failed`` (a branch its join policy
  tolerated): the result went out, but not the one every branch would have given;
- ``alert.raised`` / ``alert.resolved``: a stored alert opened or closed (docs/alerts.md)."""

SIGNATURE_HEADER = "Konduit-Signature"
DELIVERY_HEADER = "Konduit-Delivery"
EVENT_HEADER = "Konduit-Event"

FIRST_RETRY = 2.0
"""Seconds before the first retry of a failed delivery; each later one waits twice as long ..."""
MAX_RETRY = 3600.0
"""... up to this (an hour)."""
MAX_ATTEMPTS = 30
"""A delivery is marked failed after this many attempts ..."""
MAX_AGE = 24 * 3600.0
"""... or once a retry would start more than this long (a day) after the event."""

DEFAULT_TIMEOUT = 10.0
"""Seconds each phase of the HTTP call (resolve, connect, send, each read) may take."""


class Webhook:
    """A receiver of signed event notifications.

    ``konduit.App(..., webhooks=[konduit.Webhook("https://hooks.example.com/konduit",
    events=("execution.finished",), secret="...")])``: every event in ``events`` (see
    :data:`EVENTS`) is written to an outbox in the transaction that commits it and POSTed as JSON
    by the workers of the App, signed with ``secret`` (HMAC-SHA256, header ``Konduit-Signature``),
    retried with backoff until the receiver answers 2xx. ``url`` must be http or https; a host
    that resolves to a loopback, private, link-local or multicast address is refused (checked on
    the address connected to) unless ``allow_private`` is set. ``timeout`` bounds each phase of
    one call, in seconds.
    """

    __slots__ = ("allow_private", "events", "host", "port", "scheme", "secret", "timeout", "url")

    def __init__(
        self,
        url: str,
        events: Iterable[str] = ("execution.finished",),
        *,
        secret: str,
        allow_private: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        if not isinstance(url, str):
            raise KonduitError(f"Webhook url must be a string, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise KonduitError(f"Webhook url {url!r}: only http and https URLs are allowed")
        if not parts.hostname:
            raise KonduitError(f"Webhook url {url!r} has no host")
        if parts.username is not None or parts.password is not None:
            raise KonduitError(
                f"Webhook url for host {parts.hostname!r} carries credentials: they would be "
                "stored and listed in clear; authenticate receivers with the signature instead")
        try:
            port = parts.port
        except ValueError:
            raise KonduitError(f"Webhook url {url!r} has an invalid port") from None
        if isinstance(events, str):
            raise KonduitError(f"Webhook events must be a list of event names, not the string "
                               f"{events!r}")
        chosen = tuple(dict.fromkeys(events))
        if not chosen:
            raise KonduitError(f"Webhook {url!r}: events is empty; choose from {', '.join(EVENTS)}")
        unknown = [e for e in chosen if e not in EVENTS]
        if unknown:
            raise KonduitError(f"Webhook {url!r}: unknown event {unknown[0]!r}; choose from "
                               f"{', '.join(EVENTS)}")
        if not isinstance(secret, str) or not secret:
            raise KonduitError(f"Webhook {url!r}: secret must be a non-empty string")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not math.isfinite(timeout) or not 0 < timeout <= 120:
            raise KonduitError(f"Webhook {url!r}: timeout must be between 0 and 120 seconds, "
                               f"got {timeout!r}")
        self.url = url
        self.events = chosen
        self.secret = secret
        self.allow_private = bool(allow_private)
        self.timeout = float(timeout)
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)

    @property
    def subscription_id(self) -> str:
        """A fingerprint of (url, secret): the webhook's key in the database, which never holds
        the secret itself."""
        return hashlib.sha256(f"{self.url}\n{self.secret}".encode()).hexdigest()[:32]

    def __repr__(self) -> str:  # never the secret
        return (f"Webhook({self.url!r}, events={self.events!r}, "
                f"allow_private={self.allow_private!r})")


def check_unique(webhooks: Iterable[Webhook]) -> list[Webhook]:
    """The webhooks of an App; the same url with the same secret twice is refused."""
    found: dict[str, Webhook] = {}
    for hook in webhooks:
        if not isinstance(hook, Webhook):
            raise KonduitError(f"webhooks: expected konduit.Webhook, got {type(hook).__name__}")
        if hook.subscription_id in found:
            raise KonduitError(f"webhooks: {hook.url!r} is configured twice with the same "
                               "secret; list all its events in one Webhook")
        found[hook.subscription_id] = hook
    return list(found.values())


def encode_body(event: str, delivery_id: str, fields: Mapping[str, Any]) -> bytes:
    """The JSON body of a delivery: the stored fields plus ``event`` and ``delivery_id``, in a
    canonical form (every attempt of a delivery sends the same bytes)."""
    payload = {**fields, "event": event, "delivery_id": delivery_id}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Konduit-Signature`` header value: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>.<body>" keyed with the secret>``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance: float = 300.0) -> bool:
    """What a receiver does (and the tests): the header's MAC matches and its time is within
    ``tolerance`` seconds of ``now`` (a replayed old request is refused)."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, body).split(",v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


def retry_delay(attempts: int, *, jitter: float | None = None) -> float:
    """Seconds to wait after the ``attempts``-th attempt failed: 2 s, 4 s, 8 s ... up to an
    hour, each within ±10 % so that deliveries failed together do not retry together."""
    base = min(MAX_RETRY, FIRST_RETRY * 2 ** max(0, min(attempts - 1, 20)))
    spread = random.uniform(-0.1, 0.1) if jitter is None else jitter
    return float(min(MAX_RETRY, base * (1 + spread)))


def gives_up(attempts: int, age_seconds: float, delay: float) -> bool:
    """Whether a delivery that failed its ``attempts``-th attempt is marked failed instead of
    retried: the attempts are used up, or the retry would start past :data:`MAX_AGE`."""
    return attempts >= MAX_ATTEMPTS or age_seconds + delay > MAX_AGE
