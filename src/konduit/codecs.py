"""Payload codecs: what every payload becomes before it reaches the database.

A codec turns the bytes of a payload's JSON text into other bytes and back: compression,
encryption, or both in a :class:`Chain` (the first codec encodes first and decodes last). An
App, a Client, a worker and the dashboard configured with the same codec read and write the
same payloads; PostgreSQL only ever holds an envelope::

    {"$konduit": "sealed", "codec": "zlib+aesgcm", "key": "k2", "data": "<base64>"}

>>> app = konduit.App([wf], codec=konduit.codecs.Encrypted(keys={"k1": k1, "k2": k2},
...                                                          current="k2"))

:class:`Encrypted` seals with the ``current`` key and opens with any key of the ring: the key
id travels with each payload, so adding a key and making it current rotates keys without
rewriting history; a key is dropped from the ring only once no payload sealed with it is
kept. Payloads are AES-GCM encrypted (``cryptography``, the ``codecs`` extra), with the key id
as associated data. Content addresses (a step output's, an input's hash) become HMAC-SHA256
under a key of their own, so equal payloads stay equal to konduit without the hash telling
anyone else which payloads are equal. See docs/payload-codecs.md.

Any object with ``name`` and ``encode``/``decode`` (bytes to bytes) is a codec
(:class:`Codec`); one with a ``key_id`` names the key each payload was sealed with, one with
``digest(text)`` keys the content addresses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from konduit.errors import CodecError, KonduitError
from konduit.extras import require

__all__ = ["AesGcm", "Chain", "Codec", "Compressed", "Encrypted", "from_settings",
           "parse_keys"]

_NONCE = 12
_FRAME = 1  # the version byte of an AES-GCM frame: 1, key id length, key id, nonce, ciphertext


@runtime_checkable
class Codec(Protocol):
    """What a codec is: a ``name`` stored with each payload, and ``encode``/``decode`` of the
    payload's bytes. ``decode(encode(b)) == b`` for every ``b``."""

    name: str

    def encode(self, data: bytes) -> bytes:
        """The bytes to store for ``data``."""
        ...

    def decode(self, data: bytes) -> bytes:
        """The original bytes of what :meth:`encode` made; :class:`~konduit.CodecError` when
        they cannot be had back (a key missing, the data changed)."""
        ...


class Compressed:
    """zlib compression (level 1 to 9, default 6): large JSON shrinks several times over."""

    name = "zlib"

    def __init__(self, level: int = 6):
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 9:
            raise CodecError(f"Compressed(level={level!r}): a whole number from 1 to 9")
        self.level = level

    def encode(self, data: bytes) -> bytes:
        return zlib.compress(data, self.level)

    def decode(self, data: bytes) -> bytes:
        try:
            return zlib.decompress(data)
        except zlib.error as exc:
            raise CodecError(f"payload does not decompress: {exc}") from exc

    def __repr__(self) -> str:
        return f"Compressed(level={self.level})"


def _key_bytes(key_id: str, key: bytes | str) -> bytes:
    if isinstance(key, str):
        text = key.strip()
        try:
            raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_"
                                   if ("-" in text or "_" in text) else None, validate=True)
        except (binascii.Error, ValueError):
            raise CodecError(f"key {key_id!r}: not base64 (a key is 16, 24 or 32 bytes, given "
                             f"as bytes or base64 text)", key_id=key_id) from None
    elif isinstance(key, (bytes, bytearray)):
        raw = bytes(key)
    else:
        raise CodecError(f"key {key_id!r}: bytes or base64 text, not {type(key).__name__}",
                         key_id=key_id)
    if len(raw) not in (16, 24, 32):
        raise CodecError(f"key {key_id!r} is {len(raw)} bytes: an AES key is 16, 24 or 32 "
                         f"bytes", key_id=key_id)
    return raw


def _check_key_id(key_id: Any) -> str:
    if not isinstance(key_id, str) or not key_id or len(key_id.encode()) > 255 \
            or not key_id.isprintable() or any(c in key_id for c in ",: "):
        raise CodecError(f"key id {key_id!r}: a short printable name without spaces, commas "
                         f"or colons (k1, 2026-05)")
    return key_id


class AesGcm:
    """AES-GCM encryption under a key ring: ``keys`` maps key ids to keys (16, 24 or 32 bytes,
    or their base64 text), ``current`` names the key new payloads are sealed with (default:
    the last of the ring). Each sealed payload carries its key id, so any key of the ring
    opens it; ``hash_key`` keys the content addresses (default: derived from the first key of
    the ring, so keep that one, or pass ``hash_key=`` and rotate the rest freely)."""

    name = "aesgcm"

    def __init__(self, keys: Mapping[str, bytes | str], current: str | None = None, *,
                 hash_key: bytes | str | None = None):
        require("codecs", "an encrypting payload codec")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not isinstance(keys, Mapping) or not keys:
            raise CodecError("keys: a non-empty dict of key id -> key")
        self._ciphers = {_check_key_id(k): AESGCM(_key_bytes(k, v)) for k, v in keys.items()}
        ids = list(self._ciphers)
        self.current = ids[-1] if current is None else current
        if self.current not in self._ciphers:
            raise CodecError(f"current key {self.current!r} is not in the key ring "
                             f"({', '.join(ids)})", key_id=self.current)
        first = ids[0]
        self._hash_key = (
            _key_bytes("hash_key", hash_key) if hash_key is not None else
            hmac.new(_key_bytes(first, keys[first]), b"konduit content address",
                     hashlib.sha256).digest())

    @property
    def key_ids(self) -> list[str]:
        """The ids of the ring's keys."""
        return list(self._ciphers)

    @property
    def key_id(self) -> str:
        """The key new payloads are sealed with."""
        return self.current

    def encode(self, data: bytes) -> bytes:
        kid = self.current.encode()
        nonce = os.urandom(_NONCE)
        sealed = self._ciphers[self.current].encrypt(nonce, data, kid)
        return bytes((_FRAME, len(kid))) + kid + nonce + sealed

    @staticmethod
    def key_of(data: bytes) -> str | None:
        """The key id a frame was sealed with (None when ``data`` is no frame)."""
        if len(data) < 2 or data[0] != _FRAME:
            return None
        return data[2:2 + data[1]].decode(errors="replace")

    def decode(self, data: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        kid = self.key_of(data)
        if kid is None:
            raise CodecError("payload is not an AES-GCM frame of konduit's")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise CodecError(f"payload sealed with key {kid!r}, which is not in this key ring "
                             f"({', '.join(self._ciphers)})", key_id=kid)
        start = 2 + data[1]
        try:
            return cipher.decrypt(data[start:start + _NONCE], data[start + _NONCE:], kid.encode())
        except InvalidTag:
            raise CodecError(f"payload sealed with key {kid!r} does not decrypt: the key of "
                             f"that id is not the one it was sealed with, or the stored bytes "
                             f"changed", key_id=kid) from None

    def digest(self, text: str) -> str:
        """The keyed content address of a payload's plain SHA-256 hex digest."""
        return hmac.new(self._hash_key, text.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never the keys
        return f"AesGcm(keys=[{', '.join(self._ciphers)}], current={self.current!r})"


class Chain:
    """Codecs applied in turn: ``Chain(Compressed(), AesGcm(...))`` compresses, then encrypts
    (and decrypts, then decompresses). Its name joins theirs with ``+``."""

    def __init__(self, *codecs: Any):
        if not codecs:
            raise CodecError("Chain(): at least one codec")
        for c in codecs:
            if not isinstance(c, Codec):
                raise CodecError(f"{c!r} is not a codec (it needs name, encode and decode)")
        self.codecs = codecs
        self.name = "+".join(c.name for c in codecs)

    @property
    def key_id(self) -> str | None:
        """The key id of the last codec that has one (None when none encrypts)."""
        for c in reversed(self.codecs):
            kid = getattr(c, "key_id", None)
            if kid is not None:
                return str(kid)
        return None

    def encode(self, data: bytes) -> bytes:
        for c in self.codecs:
            data = c.encode(data)
        return data

    def decode(self, data: bytes) -> bytes:
        for c in reversed(self.codecs):
            data = c.decode(data)
        return data

    def digest(self, text: str) -> str:
        """The content address of the first codec that keys them, else ``text`` itself."""
        for c in self.codecs:
            if hasattr(c, "digest"):
                return str(c.digest(text))
        return text

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.codecs))})"


class Encrypted(Chain):
    """Compression then AES-GCM under a key ring, the codec for payloads nobody but the holders
    of the keys may read: ``Encrypted(keys={"k1": key1, "k2": key2}, current="k2")``. See
    :class:`AesGcm` for the keys and ``hash_key``; ``compress=False`` encrypts only."""

    def __init__(self, keys: Mapping[str, bytes | str], current: str | None = None, *,
                 compress: bool = True, hash_key: bytes | str | None = None):
        cipher = AesGcm(keys, current, hash_key=hash_key)
        super().__init__(*((Compressed(), cipher) if compress else (cipher,)))
        self.cipher = cipher

    def __repr__(self) -> str:
        return f"Encrypted(keys=[{', '.join(self.cipher.key_ids)}], " \
               f"current={self.cipher.current!r})"


def parse_keys(text: str, *, what: str = "KONDUIT_CODEC_KEYS") -> dict[str, str]:
    """``"k1:BASE64,k2:BASE64"`` (or ``@/path/to/file`` holding that text, one key a line or
    comma-separated) as a key ring, in the given order."""
    text = text.strip()
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise CodecError(f"{what}: cannot read the key file {str(path)!r}: "
                             f"{exc.strerror or exc}") from None
    ring: dict[str, str] = {}
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part or part.startswith("#"):
            continue
        kid, sep, key = part.partition(":")
        if not sep:
            raise CodecError(f"{what}: {kid!r:.20} is not key_id:base64-key")
        kid = _check_key_id(kid.strip())
        if kid in ring:
            raise CodecError(f"{what}: key {kid!r} is given twice", key_id=kid)
        ring[kid] = key.strip()
    if not ring:
        raise CodecError(f"{what}: no key given")
    return ring


def from_settings() -> Any | None:
    """The codec the environment configures (``KONDUIT_CODEC``, ``KONDUIT_CODEC_KEYS``,
    ``KONDUIT_CODEC_CURRENT_KEY``), or None."""
    from konduit.settings import settings

    conf = settings()
    kind = (conf.codec or ("encrypted" if conf.codec_keys else "none")).strip().lower()
    if kind == "none":
        return None
    if kind == "zlib":
        return Compressed()
    if kind in ("encrypted", "aesgcm"):
        if not conf.codec_keys:
            raise CodecError(f"KONDUIT_CODEC={kind} needs KONDUIT_CODEC_KEYS (k1:BASE64,...)")
        ring = parse_keys(conf.codec_keys)
        return Encrypted(ring, conf.codec_current_key, compress=kind == "encrypted")
    raise KonduitError(f"KONDUIT_CODEC={kind!r}: none, zlib, encrypted or aesgcm")
