"""Sending webhooks: the address guard (pure logic, and at connect time with a resolver stub at
the socket level), and at-least-once delivery across a worker SIGKILLed mid-call (a real worker
subprocess, a real receiver holding the request)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from konduit.core.webhooks import verify
from konduit.worker.webhook_http import Refused, forbidden_reason, post, resolve_checked
from tests.apps import webhook_app
from tests.support.waiting import until
from tests.support.webhooks import receiver
from tests.support.workers import kill_workers, running_worker, spawn_worker


def answers(*addresses: str) -> Any:
    """A resolver stub: getaddrinfo's shape, these addresses, and a count of its calls."""
    calls: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
        calls.append((host, port))
        found = addresses[min(len(calls) - 1, len(addresses) - 1)]
        family = socket.AF_INET6 if ":" in found else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (found, port))]

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"),
    ("192.168.0.10", "private"), ("172.16.5.4", "private"), ("fd00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("224.0.0.251", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"), ("100.64.0.1", "not globally routable"),
    ("93.184.216.34", None), ("2606:2800:220:1:248:1893:25c8:1946", None),
])
def test_internal_addresses_are_named_and_public_ones_pass(address: str, reason: str | None):
    assert forbidden_reason(address) == reason


def test_one_internal_answer_refuses_the_name_unless_allowed() -> None:
    hook = konduit.Webhook("https://hooks.example.com/x", secret="s")

    def mixed(host: str, port: int) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]

    with pytest.raises(Refused, match=r"10\.0\.0\.7 \(private\)"):
        resolve_checked(hook, mixed)
    allowed = konduit.Webhook("https://hooks.example.com/x", secret="s", allow_private=True)
    assert resolve_checked(allowed, mixed) == [(socket.AF_INET, "93.184.216.34"),
                                               (socket.AF_INET, "10.0.0.7")]


def test_the_name_is_resolved_once_at_connect_time_and_the_checked_address_is_used() -> None:
    """DNS rebinding: a name that answers a public address to the check and a loopback address
    to a second lookup. There is no second lookup: the connection goes to the address checked
    (here unreachable), never to the receiver on loopback."""
    with receiver() as hook_receiver:
        port = int(hook_receiver.url.split(":")[2].split("/")[0])
        hook = konduit.Webhook(f"http://rebind.example.com:{port}/hooks", secret="s", timeout=0.5)
        rebinding = answers("93.184.216.34", "127.0.0.1")
        with pytest.raises(OSError):
            post(hook, b"{}", {}, resolver=rebinding)
        assert rebinding.calls == [("rebind.example.com", port)]
        # Refused at connect time: the loopback answer of the one lookup stops it.
        loopback = answers("127.0.0.1")
        with pytest.raises(Refused, match="loopback"):
            post(hook, b"{}", {}, resolver=loopback)
        assert hook_receiver.requests == []
        # Allowed: the request reaches the address resolved, named by the URL's host.
        allowed = konduit.Webhook(f"http://rebind.example.com:{port}/hooks?x=1", secret="s",
                                  allow_private=True)
        answer = post(allowed, b'{"a":1}', {"X-Test": "1"}, resolver=answers("127.0.0.1"))
        assert answer.status == 200
        (request,) = hook_receiver.requests
        assert request.headers["Host"] == f"rebind.example.com:{port}"
        assert request.path == "/hooks?x=1" and request.body == b'{"a":1}'


@pytest.mark.storage
@pytest.mark.slow
def test_a_delivery_of_a_killed_worker_is_sent_again_with_the_same_id_and_one_outbox_row(db_url):
    with receiver(hold_first=True) as hook_receiver:
        victim = spawn_worker(
            "tests.apps.webhook_app:app", db_url, concurrency=None,
            env={"KONDUIT_TEST_WEBHOOK_URL": hook_receiver.url},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # The same webhook (url and secret) in this process: its worker may send the delivery.
        hook = konduit.Webhook(hook_receiver.url, secret=webhook_app.HOOK.secret,
                               allow_private=True, timeout=webhook_app.HOOK.timeout)
        app = konduit.App([webhook_app.wf], database_url=db_url, webhooks=[hook])
        try:
            handle = app.start("hooked")
            assert handle.wait(timeout=60).status == "succeeded"
            hook_receiver.wait_for(1, timeout=60)  # held: the victim waits for its answer
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            killed_at = time.monotonic()
            with running_worker(app, concurrency=2):
                first, second = hook_receiver.wait_for(2, timeout=60)
                until(lambda: app.webhook_deliveries(status="delivered"), 30, "a delivered webhook")
            # Not before the dead sender's lease ran out (3 x timeout + 5 s from its claim).
            assert time.monotonic() - killed_at > 2
        finally:
            kill_workers([victim])
            app.close()
    assert first.headers["Konduit-Delivery"] == second.headers["Konduit-Delivery"]
    assert first.body == second.body
    assert verify(hook.secret, second.headers["Konduit-Signature"], second.body, now=time.time())
    assert json.loads(second.body)["execution_id"] == str(handle.id)
    with psycopg.connect(db_url) as conn:
        found = conn.execute("SELECT status, attempts, worker_id FROM konduit_webhook_deliveries"
                             ).fetchall()
    assert len(found) == 1  # one outbox row for the one event
    assert found[0][:2] == ("delivered", 2)


def test_https_goes_to_the_checked_address_with_the_hosts_name_for_tls(tmp_path: Path) -> None:
    """TLS is verified against the URL's host name (SNI and certificate), not the address the
    connection was pinned to; a certificate for another name fails the call."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hooks.example.test", "-addext",
                    "subjectAltName=DNS:hooks.example.test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    seen: list[tuple[str | None, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers["Host"], self.path))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        trusting = ssl.create_default_context(cafile=str(cert))
        hook = konduit.Webhook(f"https://hooks.example.test:{port}/in", secret="s",
                               allow_private=True, timeout=5)
        assert post(hook, b"{}", {}, resolver=answers("127.0.0.1"), context=trusting).status == 204
        assert seen == [(f"hooks.example.test:{port}", "/in")]
        other = konduit.Webhook(f"https://other.example.test:{port}/in", secret="s",
                                allow_private=True, timeout=5)
        with pytest.raises(ssl.SSLCertVerificationError):
            post(other, b"{}", {}, resolver=answers("127.0.0.1"), context=trusting)
        assert len(seen) == 1
    finally:
        server.shutdown()
        server.server_close()
