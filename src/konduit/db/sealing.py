"""The one seam between payloads and the database: sealing on the way in, opening on the way
out (docs/payload-codecs.md).

:class:`PayloadIO` holds a process's codec and payload store. A :class:`~konduit.db.database.
Database` carries one, and:

- every statement parameter that is a :class:`~konduit.core.payloads.Payload` (what
  ``canonical_json`` returns), or a list of them, is sealed by :meth:`PayloadIO.seal` before it
  is sent: encoded by the codec into an envelope, or written to the store with a reference
  left in its place when it is large; a :class:`~konduit.core.payloads.Digest` is keyed;
- every ``jsonb`` value read on its connections goes through :meth:`PayloadIO.loads`, which
  opens each envelope in it (at any depth: an execution's output gathers its steps' payloads).

An envelope this process cannot open (no codec, a key it lacks, a store it cannot reach) is
returned as it is, and :func:`~konduit.core.payloads.is_sealed` tells so: a worker fails the
attempt that needs it with :class:`~konduit.CodecError` (:meth:`PayloadIO.why_sealed`), the
dashboard shows "encrypted". A loader never raises: a fetch never fails because of a payload.

New code that stores a payload calls ``canonical_json`` and passes the result as a parameter;
code that reads JSON text (``payload::text``) decodes it with :meth:`PayloadIO.loads`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from typing import Any
from uuid import UUID

from konduit.core.payloads import DEFAULT_MAX_BYTES, MARK, Digest, Payload, is_sealed, parse_size
from konduit.errors import CodecError, KonduitError, PayloadStoreError

log = logging.getLogger("konduit.payloads")

_MARK_BYTES = f'"{MARK}"'.encode()
_MARK_TEXT = f'"{MARK}"'

OFF_LOOP_BYTES = 64 * 1024
"""A codec's work on more than this many bytes of payload at once (a start_many's inputs, a
round's outputs) is done off the event loop, as a write to the payload store is: compressing
and encrypting it holds the loop about a millisecond per 64 KiB on a 2-core machine, and the
loop beats the worker's heartbeats and wakes its other slots meanwhile."""


SEALED_TEXT_PREFIX = f'{{"{MARK}":"sealed"'
"""How a sealed text (:meth:`PayloadIO.seal_text`) read from a ``text`` column begins."""


def sealed_words(env: dict[str, Any]) -> str:
    """What a door shows for an envelope this process could not open: ``encrypted (key k1)``
    (``kept in the payload store (N bytes)`` for a stored one without a codec), never its
    bytes."""
    if env.get(MARK) == "stored" and not env.get("codec"):
        return f"kept in the payload store ({env.get('size')} bytes)"
    key = env.get("key")
    return "encrypted" + (f" (key {key})" if key else "")


class SealedText(str):
    """A sealed text this process read and could not open (it lacks the codec or the key): it
    reads ``encrypted (key k1)``, as the dashboard shows a payload it cannot open, and
    ``envelope`` keeps what was read, so that a statement that writes it back (sealed as a text,
    :meth:`PayloadIO.seal_text`) writes the envelope, not these words."""

    envelope: str

    def __new__(cls, shown: str, *, envelope: str) -> SealedText:
        made = super().__new__(cls, shown)
        made.envelope = envelope
        return made


class PayloadIO:
    """A codec and a payload store, as the database boundary applies them. ``active`` is
    false when there is neither: then nothing is sealed and nothing costs anything."""

    def __init__(self, codec: Any = None, store: Any = None):
        self.codec = codec
        self.store = store
        self.active = codec is not None or store is not None
        self.keyed = codec is not None and hasattr(codec, "digest")

    def __repr__(self) -> str:
        return f"PayloadIO(codec={self.codec!r}, store={self.store!r})"

    # -- in ---------------------------------------------------------------------------------

    def goes_to_store(self, text: str) -> bool:
        return self.store is not None and len(text) > self.store.threshold

    def seal(self, text: str, *, scope: Any = None) -> str:
        """The JSON text to store for a payload's JSON ``text``: an envelope of the codec's
        output, or a reference to the store (for a payload of an execution, ``scope``, larger
        than the store's threshold), else ``text`` itself."""
        if not self.active:
            return text
        data = text.encode()
        codec = self.codec
        name = None if codec is None else codec.name
        key = None if codec is None else getattr(codec, "key_id", None)
        if codec is not None:
            data = codec.encode(data)
        if scope is not None and self.goes_to_store(text):
            ref = f"{scope}/{hashlib.sha256(data).hexdigest()}"
            self.store.put(ref, data)
            env: dict[str, Any] = {MARK: "stored", "store": self.store.name, "ref": ref,
                                   "size": len(text)}
            if name is not None:
                env["codec"] = name
                if key is not None:
                    env["key"] = key
            return json.dumps(env, separators=(",", ":"))
        if codec is None:
            return text
        env = {MARK: "sealed", "codec": name, "data": base64.b64encode(data).decode()}
        if key is not None:
            env["key"] = key
        return json.dumps(env, separators=(",", ":"))

    def digest(self, plain: str) -> str:
        """A content address as stored: keyed by the codec when it encrypts."""
        return str(self.codec.digest(plain)) if self.keyed else str(plain)

    def seal_text(self, text: str) -> str:
        """The text to store in a ``text`` column for an error text or a message that may
        carry payload data (a handler's exception, a traceback): the JSON text of an envelope
        of the codec's output when the codec is set, else ``text`` itself. A
        :class:`SealedText` (one this process read and could not open) goes back as it was read.
        Never to the payload store: such texts are bounded, and a text column keeps them."""
        if type(text) is SealedText:
            return text.envelope
        if self.codec is None or not isinstance(text, str):
            return text
        return self.seal(json.dumps(text, ensure_ascii=False))

    def open_text(self, text: str) -> str:
        """A text read from a ``text`` column, opened when it is a sealed envelope
        (:meth:`seal_text`): the text itself, or a :class:`SealedText` that reads
        ``encrypted (key k1)`` when this process cannot open it. Never raises."""
        if not text.startswith(SEALED_TEXT_PREFIX):
            return text
        try:
            value = self.loads(text)
        except ValueError:  # a text that only starts like an envelope
            return text
        if type(value) is str:
            return value
        if is_sealed(value):
            return SealedText(sealed_words(value), envelope=text)
        return text

    def sealed_params(self, params: dict[str, Any],
                      texts: frozenset[str] = frozenset()) -> dict[str, Any]:
        """``params`` with every Payload sealed (scoped by the statement's ``execution_id`` or,
        for a list, the matching item of ``execution_ids``) and every Digest keyed."""
        for name, value in params.items():
            kind = type(value)
            if name in texts:
                if kind is list:
                    params[name] = [None if v is None else self.seal_text(v) for v in value]
                elif value is not None:
                    params[name] = self.seal_text(value)
            elif kind is Payload:
                params[name] = self.seal(value, scope=_scope(params.get("execution_id")
                                                             or params.get("id")))
            elif kind is Digest:
                params[name] = self.digest(value)
            elif kind is list and value:
                first = next((v for v in value if v is not None), None)
                if type(first) is Payload:
                    scopes = params.get("execution_ids")
                    if not isinstance(scopes, list) or len(scopes) != len(value):
                        one = _scope(params.get("execution_id"))
                        scopes = [one] * len(value)
                    params[name] = [None if v is None else self.seal(v, scope=_scope(s))
                                    for v, s in zip(value, scopes, strict=True)]
                elif type(first) is Digest:
                    params[name] = [None if v is None else self.digest(v) for v in value]
        return params

    async def seal_many(self, texts: list[str], scopes: list[Any]) -> list[str]:
        """Each text sealed in the name of its scope (off the event loop when one of them goes
        to the store)."""
        def sealed() -> list[str]:
            return [self.seal(t, scope=_scope(s)) for t, s in zip(texts, scopes, strict=True)]

        if (self.codec is not None and sum(map(len, texts)) > OFF_LOOP_BYTES) or (
                self.store is not None and any(self.goes_to_store(t) for t in texts)):
            return await asyncio.to_thread(sealed)
        return sealed()

    def heavy(self, params: dict[str, Any]) -> bool:
        """Whether sealing ``params`` writes to the store, or puts more than
        :data:`OFF_LOOP_BYTES` through the codec (then it is done off the loop)."""
        size = 0
        for value in params.values():
            if type(value) is Payload:
                if self.goes_to_store(value):
                    return True
                size += len(value)
            elif type(value) is list:
                for v in value:
                    if type(v) is Payload:
                        if self.goes_to_store(v):
                            return True
                        size += len(v)
        return self.codec is not None and size > OFF_LOOP_BYTES

    # -- out --------------------------------------------------------------------------------

    def loads(self, data: bytes | bytearray | memoryview | str) -> Any:
        """Decode JSON read from the database, opening every envelope in it that this process
        can open (the others are left as they are)."""
        if isinstance(data, str):
            if _MARK_TEXT not in data:
                return json.loads(data)
        else:
            if not isinstance(data, bytes):
                data = bytes(data)
            if _MARK_BYTES not in data:
                return json.loads(data)
        return json.loads(data, object_hook=self._open_quietly)

    def _open_quietly(self, obj: dict[str, Any]) -> Any:
        if MARK not in obj:
            return obj
        try:
            return self.open(obj)
        except KonduitError:
            return obj
        except Exception:  # a store's client, a codec of the user's: never fail the read
            log.exception("a payload envelope could not be opened")
            return obj

    def open(self, env: dict[str, Any]) -> Any:
        """The value an envelope holds; :class:`CodecError` or :class:`PayloadStoreError` when
        this process cannot have it."""
        kind = env.get(MARK)
        if kind == "sealed":
            data = _b64(env.get("data"))
        elif kind == "stored":
            if self.store is None:
                raise PayloadStoreError(
                    f"payload {env.get('ref')} ({env.get('size')} bytes) is kept in a payload "
                    f"store ({env.get('store')}), and none is configured here "
                    f"(payload_store=, KONDUIT_PAYLOAD_STORE)", ref=env.get("ref"))
            data = self.store.get(str(env.get("ref")))
            if not env.get("codec"):
                return json.loads(data)
        else:
            return env  # not an envelope of ours: a user's dict with such a key
        name = env.get("codec")
        if self.codec is None:
            raise CodecError(
                f"payload is encoded with {name}" + (f" (key {env['key']!r})" if env.get("key")
                                                     else "")
                + ", and no codec is configured here (codec=, KONDUIT_CODEC)",
                key_id=env.get("key"))
        if name != self.codec.name:
            raise CodecError(f"payload is encoded with {name}, and the codec here is "
                             f"{self.codec.name}", key_id=env.get("key"))
        return json.loads(self.codec.decode(data))

    def plain_size(self, text: str) -> int | None:
        """The size in bytes of the payload that JSON ``text`` read from the database
        (``payload::text``) holds, as PostgreSQL writes a plain one out (``octet_length(
        payload::text)``): ``text``'s own when it is no envelope, the size a payload store's
        reference records (its canonical JSON, not fetched), else the opened value's; None when
        this process cannot open it. An envelope's own size tells nothing of its payload's."""
        if _MARK_TEXT not in text:
            return len(text.encode())
        outer = json.loads(text)
        if (type(outer) is dict and outer.get(MARK) == "stored"
                and type(outer.get("size")) is int):
            return int(outer["size"])
        value = self.loads(text)
        if is_sealed(value):
            return None
        return len(json.dumps(value, ensure_ascii=False).encode())

    def why_sealed(self, value: Any) -> KonduitError:
        """The error that says why ``value`` (an envelope left sealed) cannot be opened."""
        try:
            self.open(value)
        except KonduitError as exc:
            return exc
        except Exception as exc:
            return PayloadStoreError(f"payload could not be read: {type(exc).__name__}: {exc}")
        return CodecError("payload was sealed when it was read and opens now: try again")


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise CodecError("payload envelope without data")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise CodecError("payload envelope whose data is not base64") from None


def _scope(value: Any) -> str | None:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, str) and len(value) == 36:
        try:
            return str(UUID(value))
        except ValueError:
            return None
    return None


PLAIN = PayloadIO()
"""No codec, no store."""


_configured: tuple[Any, PayloadIO] | None = None


def configured() -> PayloadIO:
    """The codec and store the environment configures (KONDUIT_CODEC..., KONDUIT_PAYLOAD_STORE),
    built once per change of the settings."""
    global _configured
    from konduit import codecs, stores
    from konduit.settings import settings

    conf = settings()
    key = (conf.codec, conf.codec_keys, conf.codec_current_key, conf.payload_store,
           conf.payload_store_threshold)
    if _configured is None or _configured[0] != key:
        _configured = (key, PayloadIO(codecs.from_settings(), stores.from_settings()))
    return _configured[1]


def payload_io(codec: Any = None, store: Any = None) -> PayloadIO:
    """A PayloadIO of ``codec`` and ``store``, each taken from the environment when None."""
    if codec is None and store is None:
        return configured()
    env = configured()
    return PayloadIO(env.codec if codec is None else codec,
                     env.store if store is None else store)


def payload_settings(codec: Any, payload_store: Any) -> PayloadIO:
    """The codec and store of an App or a Client (each from the environment when None)."""
    from konduit.codecs import Codec
    from konduit.stores import PayloadStore

    if codec is not None and not isinstance(codec, Codec):
        raise KonduitError(f"codec={codec!r:.60}: a konduit.codecs codec (Encrypted(...), "
                           f"Compressed(), or an object with name, encode and decode)")
    if payload_store is not None and not isinstance(payload_store, PayloadStore):
        raise KonduitError(f"payload_store={payload_store!r:.60}: konduit.stores.Directory("
                           f"path), konduit.stores.S3(bucket), or an object with put, get, copy "
                           f"and delete_prefix")
    return payload_io(codec, payload_store)


def payload_limits(io: PayloadIO, max_payload_bytes: int, limit: int | str | None,
                   warn: int | str | None) -> int:
    """The size limit of one payload: ``limit``, else ``max_payload_bytes`` when it is not the
    default, else ``KONDUIT_PAYLOAD_LIMIT`` (``KONDUIT_PAYLOAD_STORE_LIMIT`` with a store). Sets
    the process's warning size from ``warn`` (else ``KONDUIT_PAYLOAD_WARN``)."""
    from konduit.core import payloads as payloads_module
    from konduit.settings import settings

    conf = settings()
    if limit is not None:
        chosen = parse_size(limit, what="payload_limit")
    elif max_payload_bytes != DEFAULT_MAX_BYTES:
        chosen = parse_size(max_payload_bytes, what="max_payload_bytes")
    elif io.store is not None:
        chosen = max(conf.payload_limit, conf.payload_store_limit)
    else:
        chosen = conf.payload_limit
    payloads_module.warn_bytes = (conf.payload_warn if warn is None
                                  else parse_size(warn, what="payload_warn"))
    return chosen


__all__ = ["PLAIN", "SEALED_TEXT_PREFIX", "PayloadIO", "SealedText", "configured", "is_sealed",
           "payload_io", "payload_limits", "payload_settings", "sealed_words"]
