"""Payload codecs and the payload store, on a real database and a real worker: what the
database holds is sealed, keys rotate, a worker without the key fails the attempt and goes on,
the size limit refuses a big output at once, and stored payloads round-trip and are pruned."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from konduit.codecs import AesGcm, Compressed, Encrypted, parse_keys
from konduit.core.payloads import canonical_json, is_sealed
from konduit.db.sealing import PayloadIO

MARK = "plaintext-marker-7f3a"
K1, K2 = os.urandom(32), os.urandom(32)

# Every column a payload reaches (the workflows below reach each one).
PAYLOAD_COLUMNS = [
    ("konduit_executions", "input"), ("konduit_executions", "output"),
    ("konduit_execution_outputs", "output"), ("konduit_outputs", "payload"),
    ("konduit_tasks", "item"), ("konduit_events", "payload"),
]


def flow(name: str = "sealed") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def first(ctx: konduit.Context) -> dict[str, Any]:
        return {"said": ctx.input["word"], "items": [f"{MARK}-{i}" for i in range(3)]}

    each = wf.map(name="each", after=[first], over=lambda out: out["items"])(
        lambda ctx: {"item": ctx.item, "upper": ctx.item.upper()})

    wait = wf.wait_for_event("go", name="go", after=[first],
                             key=lambda ctx: ctx.input["word"], deadline="60s")

    @wf.step(after=[each, wait])
    def last(ctx: konduit.Context) -> dict[str, Any]:
        return {"n": len(ctx.upstream["each"]), "go": ctx.upstream["go"],
                "first": ctx.upstream["each"][0]["item"]}

    return wf


def _rows(db_url: str) -> list[str]:
    texts = []
    with psycopg.connect(db_url) as conn:
        for table, column in PAYLOAD_COLUMNS:
            for (text,) in conn.execute(f"SELECT {column}::text FROM {table} "
                                        f"WHERE {column} IS NOT NULL"):
                texts.append(text)
    return texts


def _run(app: konduit.App, worker: Callable[..., Any], word: str) -> konduit.ExecutionResult:
    with worker(app):
        handle = app.start("sealed", input={"word": word})
        assert app.send_event("go", key=word, payload={"by": MARK}) in ("woke", "stored")
        return handle.wait(timeout=60)


def test_no_plaintext_in_any_payload_column(make_app: Callable[..., konduit.App],
                                            worker: Callable[..., Any], db_url: str) -> None:
    app = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    result = _run(app, worker, MARK)
    assert result.output == {"n": 3, "go": {"by": MARK}, "first": f"{MARK}-0"}
    texts = _rows(db_url)
    assert len(texts) >= 8
    assert not [t for t in texts if MARK in t], "plaintext in a payload column"
    assert all('"$konduit"' in t for t in texts)
    # The status and the stored payloads read back decoded through the codec.
    assert app.status(result.id).output == result.output
    assert any(p.payload == {"item": f"{MARK}-1", "upper": f"{MARK}-1".upper()}
               for p in app.payloads(result.id))
    # A Client without the codec sees envelopes: "encrypted", never the data.
    with konduit.Client(db_url) as plain:
        seen = plain.status(result.id).output
        assert is_sealed(seen) and seen["key"] == "k1" and MARK not in str(seen)


def test_keys_rotate_and_an_unknown_key_is_named(make_app: Callable[..., konduit.App],
                                                 worker: Callable[..., Any],
                                                 db_url: str) -> None:
    old = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    first = _run(old, worker, "one")
    rotated = make_app(flow(), codec=Encrypted(keys={"k1": K1, "k2": K2}, current="k2"))
    second = _run(rotated, worker, "two")
    # The old execution still reads after the current key changed; the new one is sealed
    # with k2.
    assert rotated.status(first.id).output == first.output
    assert rotated.status(second.id).output["n"] == 3
    with psycopg.connect(db_url) as conn:
        (key,) = conn.execute("SELECT output ->> 'key' FROM konduit_executions WHERE id = %s",
                              (second.id,)).fetchone()  # type: ignore[misc]
    assert key == "k2"
    # A process holding only k2 cannot open k1's payloads: the error names the key.
    only_new = PayloadIO(Encrypted(keys={"k2": K2}))
    with psycopg.connect(db_url) as conn:
        (text,) = conn.execute("SELECT input::text FROM konduit_executions WHERE id = %s",
                               (first.id,)).fetchone()  # type: ignore[misc]
    sealed = only_new.loads(text)
    assert is_sealed(sealed)
    error = only_new.why_sealed(sealed)
    assert isinstance(error, konduit.CodecError) and error.key_id == "k1"
    assert "'k1'" in str(error) and "k2" in str(error)


def test_a_worker_without_the_key_fails_the_attempt_and_goes_on(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any]) -> None:
    wf = konduit.Workflow("needs-key", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def only(ctx: konduit.Context) -> Any:
        return ctx.input

    writer = make_app(wf, codec=Encrypted(keys={"k1": K1}))
    handle = writer.start("needs-key", input={"x": MARK})
    keyless = make_app(wf, codec=Encrypted(keys={"k2": K2}))
    with worker(keyless):
        with pytest.raises(konduit.ExecutionFailed) as failed:
            keyless.wait(handle.id, timeout=60)
        # The worker lived on: the same worker runs what it has the key of.
        ok = keyless.start("needs-key", input={"x": 1})
        assert keyless.wait(ok.id, timeout=60).output == {"x": 1}
    error = failed.value.result.error or ""
    assert "CodecError" in error and "'k1'" in error and "input" in error


def test_search_by_input_is_refused_under_a_codec_and_tags_still_work(
        make_app: Callable[..., konduit.App]) -> None:
    app = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    handle = app.start("sealed", input={"word": "w"}, tags={"customer": "acme"})
    with pytest.raises(konduit.SearchError) as refused:
        app.list(input={"word": "w"})
    assert refused.value.field == "input" and "tags" in str(refused.value)
    assert [e.id for e in app.list(tags={"customer": "acme"})] == [handle.id]
    # A bulk action's filter is a search: by input it is refused too, not "none found".
    for dry_run in (True, False):
        with pytest.raises(konduit.SearchError, match="codec") as refused:
            app.bulk("cancel", konduit.ExecutionFilter(input={"word": "w"}), dry_run=dry_run)
        assert refused.value.field == "input"
    assert app.status(handle.id).status == "running"
    done = app.bulk("cancel", konduit.ExecutionFilter(tags={"customer": "acme"}))
    assert (done.matched, done.done) == (1, 1)


def test_a_bulk_action_by_input_is_refused_under_a_codec_at_every_door(
        make_app: Callable[..., konduit.App], db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The background job too: refused before it exists (422 naming the filter's field), not
    accepted and then failed as a job; the page's form and the command line say the same."""
    from urllib.parse import parse_qs, urlsplit

    from tests.test_api_v1 import api, refused
    from tests.test_cli import assert_clean_error, konduit_cli

    app = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    handle = app.start("sealed", input={"word": "w"}, tags={"customer": "acme"})
    by_input = {"input": ["word=w"]}
    with api(app, db_url) as http:
        for path in ("/api/v1/bulk-jobs", "/api/v1/executions:bulk"):
            for dry_run in (False, True):
                problem = refused(http.post(path, json={
                    "action": "cancel", "where": by_input, "dry_run": dry_run}),
                    422, "body.where.input")
                assert "codec" in problem["detail"] and "tags" in problem["detail"]
        # The dashboard's confirmation page and its form.
        page = http.get("/bulk", params={"action": "cancel", "scope": "all", "input": "word=w"})
        assert page.status_code == 200 and "cannot be found by input" in page.text
        posted = http.post("/bulk", data={"action": "redrive", "scope": "all", "confirm": "yes",
                                          "input": "word=w"}, follow_redirects=False)
        assert posted.status_code == 303
        (said,) = parse_qs(urlsplit(posted.headers["location"]).query)["error"]
        assert said.startswith("nothing redriven: input: ") and "codec" in said
        # By tags, the job runs.
        job = http.post("/api/v1/bulk-jobs", json={
            "action": "cancel", "where": {"tag": ["customer=acme"]}, "dry_run": True})
        assert job.status_code == 202, job.text
    # The command line, with the codec's key in its environment.
    monkeypatch.setenv("KONDUIT_CODEC_KEYS", "k1:" + base64.b64encode(K1).decode())
    for command in ("cancel", "redrive"):
        proc = konduit_cli(command, "--database-url", db_url, "--input", "word=w")
        assert_clean_error(proc, "input: ", "codec")
    assert app.status(handle.id).status == "running"


def test_an_output_over_the_limit_fails_at_once_naming_step_and_size(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any]) -> None:
    wf = konduit.Workflow("huge", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=5, base="30s"))
    def render(ctx: konduit.Context) -> str:
        return "x" * 50_000_000

    app = make_app(wf, payload_limit="10MB")
    with worker(app):
        handle = app.start("huge", input=None)
        with pytest.raises(konduit.ExecutionFailed) as failed:
            app.wait(handle.id, timeout=60)
    error = failed.value.result.error or ""
    assert "output of step 'render'" in error and "50000002 bytes" in error
    [task] = app.tasks(handle.id)
    assert task.attempt == 1  # refused at once: no retry
    with pytest.raises(konduit.PayloadTooLarge) as too_big:
        canonical_json("x" * 2000, what="output of step 'render'", max_bytes=1000)
    assert (too_big.value.step, too_big.value.size, too_big.value.limit) == ("render", 2002, 1000)


def _big_flow(size: int) -> konduit.Workflow:
    wf = konduit.Workflow("big", version=1)

    @wf.step()
    def make(ctx: konduit.Context) -> str:
        return MARK + "y" * size

    @wf.step(after=[make])
    def measure(ctx: konduit.Context) -> int:
        return len(ctx.upstream["make"])

    return wf


def _store_round_trip(app: konduit.App, worker: Callable[..., Any], db_url: str,
                      size: int) -> str:
    with worker(app):
        handle = app.start("big", input=None)
        result = app.wait(handle.id, timeout=120)
    assert result.output == size + len(MARK)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT payload ->> '$konduit', length(payload::text) "
                            "FROM konduit_outputs WHERE execution_id = %s AND step = 'make'",
                            (handle.id,)).fetchall()
    assert rows and rows[0][0] == "stored" and rows[0][1] < 1000  # a reference, not the data
    [made] = [p for p in app.payloads(handle.id) if p.step == "make"]
    assert made.payload.startswith(MARK) and len(made.payload) == size + len(MARK)
    return str(handle.id)


def test_a_50_mb_output_round_trips_through_a_directory_store_and_is_pruned(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str,
        tmp_path: Path) -> None:
    store = konduit.stores.Directory(tmp_path / "payloads", threshold=1024)
    app = make_app(_big_flow(50_000_000), payload_store=store)
    eid = _store_round_trip(app, worker, db_url, 50_000_000)
    assert list((tmp_path / "payloads" / eid).iterdir())
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE konduit_executions SET finished_at = finished_at - interval '2d'")
    assert app.prune(older_than="1d") == 1
    assert not (tmp_path / "payloads" / eid).exists()


def test_a_store_on_an_s3_compatible_server(make_app: Callable[..., konduit.App],
                                            worker: Callable[..., Any], db_url: str) -> None:
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        client.create_bucket(Bucket="konduit")
        store = konduit.stores.S3("konduit", "payloads", client=client, threshold=1024)
        app = make_app(_big_flow(200_000), payload_store=store,
                       codec=Encrypted(keys={"k1": K1}))
        eid = _store_round_trip(app, worker, db_url, 200_000)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="konduit")["Contents"]]
        assert any(k.startswith(f"payloads/{eid}/") for k in keys)
        body = client.get_object(Bucket="konduit", Key=keys[0])["Body"].read()
        assert MARK.encode() not in body  # stored sealed too
        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE konduit_executions SET finished_at = finished_at - interval '2d'")
        assert app.prune(older_than="1d") == 1
        left = client.list_objects_v2(Bucket="konduit").get("Contents", [])
        assert not [o for o in left if o["Key"].startswith(f"payloads/{eid}/")]
    finally:
        server.stop()


def test_codecs_alone() -> None:
    data = canonical_json({"a": [MARK] * 100}, what="x").encode()
    for codec in (Compressed(), AesGcm({"k1": K1}), Encrypted({"k1": K1, "k2": K2})):
        sealed = codec.encode(data)
        assert MARK.encode() not in sealed and codec.decode(sealed) == data
    assert len(Compressed().encode(data)) < len(data) / 5
    with pytest.raises(konduit.CodecError, match="'k3'"):
        AesGcm({"k1": K1}, current="k3")
    with pytest.raises(konduit.CodecError, match="is 5 bytes"):
        AesGcm({"k1": b"short"})
    tampered = bytearray(AesGcm({"k1": K1}).encode(data))
    tampered[-1] ^= 1
    with pytest.raises(konduit.CodecError, match="does not decrypt"):
        AesGcm({"k1": K1}).decode(bytes(tampered))
    # Equal payloads have equal keyed addresses; without the hash key they tell nothing.
    one, other = Encrypted({"k1": K1}), Encrypted({"k1": K2})
    assert one.digest("abc") == one.digest("abc") != other.digest("abc")
    ring = parse_keys(f"k1:{base64.b64encode(K1).decode()}, k2:{base64.b64encode(K2).decode()}")
    assert list(ring) == ["k1", "k2"]
    assert Encrypted(ring).cipher.current == "k2"


def test_the_codec_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from konduit.db.sealing import configured

    monkeypatch.setenv("KONDUIT_CODEC_KEYS", f"k1:{base64.b64encode(K1).decode()}")
    io = configured()
    assert io.codec is not None and io.codec.name == "zlib+aesgcm"
    monkeypatch.setenv("KONDUIT_CODEC", "zlib")
    assert configured().codec.name == "zlib"
    monkeypatch.setenv("KONDUIT_CODEC", "aesgcm")
    monkeypatch.delenv("KONDUIT_CODEC_KEYS")
    with pytest.raises(konduit.CodecError, match="KONDUIT_CODEC_KEYS"):
        configured()


def test_the_api_and_the_page_show_encrypted_without_the_keys_and_decoded_with_them(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str,
        browser: Any) -> None:
    import httpx

    from konduit.web import create_app, database_client
    from tests.support.browser import serving

    app = make_app(flow(), codec=Encrypted(keys={"k1": K1}))
    result = _run(app, worker, "shown")
    keyless = konduit.App([], database_url=db_url, codec=None)
    keyless.payload_io = PayloadIO()  # no codec: what a dashboard without the keys has
    for face, expect_plain in ((keyless, False), (app, True)):
        with serving(create_app(database_client(db_url, face), face)) as base:
            with httpx.Client(base_url=base, timeout=30) as http:
                body = http.get(f"/api/v1/executions/{result.id}").json()
            if expect_plain:
                assert body["output"] == result.output
            else:
                assert is_sealed(body["output"]) and body["output"]["key"] == "k1"
                assert MARK not in str(body)
            browser.get(f"{base}/executions/{result.id}")
            page = browser.page_source
            if expect_plain:
                assert f"{MARK}-0" in page and "encrypted (key k1)" not in page
            else:
                assert "encrypted (key k1)" in page and MARK not in page
    keyless.close()


def test_journal_records_are_sealed_and_replay_decoded(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str) -> None:
    """A durable call's recorded result goes through the codec like every payload: no
    plaintext in the journal's results, and a retry replays the decoded value."""
    calls: list[int] = []
    wf = konduit.Workflow("sealed-journal", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="50ms"))
    def step(ctx: konduit.Context) -> dict[str, Any]:
        got = ctx.call_sync("fetch", lambda: calls.append(1) or {"secret": MARK})
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt dies after its call")
        return {"replayed": got}

    app = make_app(wf, codec=Encrypted(keys={"k1": K1}))
    with worker(app):
        result = app.start("sealed-journal", input={}).wait(timeout=60)
    assert result.output == {"replayed": {"secret": MARK}}
    assert calls == [1]  # the retry replayed it
    with psycopg.connect(db_url) as conn:
        texts = [t for (t,) in conn.execute("SELECT result::text FROM konduit_journal_results")]
    assert texts and not [t for t in texts if MARK in t], "plaintext in the journal"
    assert all('"$konduit"' in t for t in texts)


def test_stream_chunks_are_sealed_and_read_decoded(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str) -> None:
    """A durable stream's chunks go through the codec: no plaintext in the chunks' rows, and a
    reader with the keys gets the chunks as written."""
    wf = konduit.Workflow("sealed-stream", version=1)

    @wf.step()
    def talk(ctx: konduit.Context) -> int:
        for n in range(3):
            ctx.stream.write({"n": n, "said": MARK})
        return 3

    app = make_app(wf, codec=Encrypted(keys={"k1": K1}))
    with worker(app):
        handle = app.start("sealed-stream", input={})
        assert handle.wait(timeout=60).output == 3
    chunks = [c for c in app.stream(handle.id, follow=False) if c.kind == "data"]
    assert [c.data for c in chunks] == [{"n": n, "said": MARK} for n in range(3)]
    with psycopg.connect(db_url) as conn:
        texts = [t for (t,) in conn.execute(
            "SELECT payload::text FROM konduit_stream_chunks WHERE payload IS NOT NULL")]
    assert len(texts) == 3 and not [t for t in texts if MARK in t], "plaintext in a stream"


def test_the_journal_shows_the_size_of_a_result_not_of_its_envelope(
        make_app: Callable[..., konduit.App], worker: Callable[..., Any], db_url: str,
        tmp_path: Path) -> None:
    """``result_bytes`` (the journal's API, page and command line) is the size of the result
    as JSON: under a codec, not the size of the envelope the row holds; with a payload store,
    the size its reference records, the object left unfetched."""
    small, big = {"secret": MARK, "n": [1, 2.5, "é"]}, "x" * 5000
    wf = konduit.Workflow("sized-journal", version=1)

    @wf.step()
    def step(ctx: konduit.Context) -> int:
        ctx.call_sync("small", lambda: small)
        ctx.call_sync("big", lambda: big)
        return 1

    store = konduit.stores.Directory(tmp_path / "payloads", threshold=1024)
    app = make_app(wf, codec=Encrypted(keys={"k1": K1}), payload_store=store)
    with worker(app):
        eid = app.start("sized-journal", input={}).wait(timeout=60).id
    with psycopg.connect(db_url) as conn:  # what PostgreSQL says of the plain values
        plain = {name: conn.execute("SELECT octet_length(%s::jsonb::text)",
                                    (canonical_json(v, what=name),)).fetchone()[0]
                 for name, v in (("small", small), ("big", big))}
        stored = {t for (t,) in conn.execute("SELECT result::text FROM konduit_journal_results")}
    assert all('"$konduit"' in t for t in stored) and any('"stored"' in t for t in stored)
    shown = {e.name: e.result_bytes for e in app.journal(eid)}
    assert shown == plain and plain["big"] == 5002
    # A process without the key shows the size of what is stored, the store's size still.
    with konduit.Client(db_url, codec=Compressed(), payload_store=store) as keyless:
        sizes = {e.name: e.result_bytes for e in keyless.journal(eid)}
    assert sizes["big"] == 5002 and sizes["small"] == min(len(t.encode()) for t in stored)


class _WhereEncoded:
    """zlib, noting the thread each encode ran on."""

    name = "zlib"

    def __init__(self) -> None:
        import threading

        self.threads: list[int] = []
        self._ident = threading.get_ident

    def encode(self, data: bytes) -> bytes:
        import zlib

        self.threads.append(self._ident())
        return zlib.compress(data)

    def decode(self, data: bytes) -> bytes:
        import zlib

        return zlib.decompress(data)


def test_a_big_batch_is_sealed_off_the_event_loop(db_url: str) -> None:
    """start_many's inputs (and a statement's payloads) of more than OFF_LOOP_BYTES in all go
    through the codec on a thread of their own, not on the event loop that beats the worker's
    heartbeats; a small batch stays on the loop (a thread hop would cost more than it)."""
    import asyncio
    import threading

    from konduit.db.sealing import OFF_LOOP_BYTES, PayloadIO

    wf = konduit.Workflow("sealed-batch", version=1)
    wf.step(name="only")(lambda ctx: None)
    codec = _WhereEncoded()
    with konduit.App([wf], database_url=db_url, codec=codec) as app:
        app.migrate()
        loop_thread = app._run(_current_thread())
        app.start_many([{"workflow": "sealed-batch", "input": {"n": i}} for i in range(10)])
        assert codec.threads and set(codec.threads) == {loop_thread}
        codec.threads.clear()
        pad = "x" * (OFF_LOOP_BYTES // 50)
        app.start_many([{"workflow": "sealed-batch", "input": {"n": i, "pad": pad}}
                        for i in range(100)])
        assert codec.threads and loop_thread not in set(codec.threads)

    io = PayloadIO(codec=codec)
    from konduit.core.payloads import Payload
    assert not io.heavy({"payload": Payload("{}")})
    assert io.heavy({"payloads": [Payload("x" * OFF_LOOP_BYTES), Payload("{}")]})
    assert not PayloadIO().heavy({"payloads": [Payload("x" * OFF_LOOP_BYTES)]})
    codec.threads.clear()
    asyncio.run(io.seal_many(["x" * (OFF_LOOP_BYTES + 1)], [None]))
    assert codec.threads and codec.threads[0] != threading.get_ident()


async def _current_thread() -> int:
    import threading

    return threading.get_ident()
