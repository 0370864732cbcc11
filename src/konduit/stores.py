"""Payload stores: where payloads too big for the hot tables are kept.

With ``App(payload_store=konduit.stores.Directory("/var/lib/konduit/payloads"))`` (or
:class:`S3`), a payload of an execution larger than the store's ``threshold`` is written to the
store (after the codec, so an encrypted payload is stored encrypted) and PostgreSQL keeps a
reference::

    {"$konduit": "stored", "ref": "<execution id>/<sha256>", "size": 52428800, ...}

Objects are named by their execution, so pruning an execution (``App(retention=)``,
``konduit prune``) removes its objects with it. Every process that reads such payloads (the
workers, the dashboard, a Client) needs the same store. See docs/payload-codecs.md.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

from konduit.errors import KonduitError, PayloadStoreError
from konduit.extras import require

__all__ = ["DEFAULT_THRESHOLD", "S3", "Directory", "PayloadStore", "from_settings", "from_url"]

DEFAULT_THRESHOLD = 256 * 1024
"""Payloads of more bytes than this go to the store (``threshold=`` changes it)."""


@runtime_checkable
class PayloadStore(Protocol):
    """What a payload store does: ``put``/``get`` an object by name, ``delete_prefix`` every
    object of an execution (names start ``<execution id>/``), ``copy`` one object. ``name``
    is shown with references; ``threshold`` is the size from which payloads go there."""

    name: str
    threshold: int

    def put(self, ref: str, data: bytes) -> None: ...

    def get(self, ref: str) -> bytes: ...

    def copy(self, ref: str, to: str) -> None: ...

    def delete_prefix(self, prefix: str) -> int: ...


def _threshold(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KonduitError(f"threshold={value!r}: a whole number of bytes, 0 or more")
    return value


def _check_ref(ref: str) -> str:
    parts = ref.split("/")
    if len(parts) != 2 or not all(p and p not in (".", "..") and p.isprintable()
                                   for p in parts):
        raise PayloadStoreError(f"payload reference {ref!r:.80} is not <scope>/<name>", ref=ref)
    return ref


class Directory:
    """A filesystem directory (local, or a shared mount every worker sees). Objects are files
    ``<path>/<execution id>/<name>``, written to a temporary file and renamed, so a reader never
    sees half an object."""

    name = "directory"

    def __init__(self, path: str | os.PathLike[str], *, threshold: int = DEFAULT_THRESHOLD):
        self.path = Path(path).expanduser()
        self.threshold = _threshold(threshold)

    def _file(self, ref: str) -> Path:
        return self.path / _check_ref(ref)

    def put(self, ref: str, data: bytes) -> None:
        target = self._file(ref)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".put-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise PayloadStoreError(f"cannot write payload {ref} to {self.path}: "
                                    f"{exc.strerror or exc}", ref=ref) from exc

    def get(self, ref: str) -> bytes:
        try:
            return self._file(ref).read_bytes()
        except OSError as exc:
            raise PayloadStoreError(f"cannot read payload {ref} from {self.path}: "
                                    f"{exc.strerror or exc}", ref=ref) from exc

    def copy(self, ref: str, to: str) -> None:
        self.put(to, self.get(ref))

    def delete_prefix(self, prefix: str) -> int:
        folder = self.path / prefix.strip("/")
        if not folder.is_dir() or folder.resolve().parent != self.path.resolve():
            return 0
        removed = 0
        for f in folder.iterdir():
            f.unlink(missing_ok=True)
            removed += 1
        try:
            folder.rmdir()
        except OSError:
            pass  # a put raced in: its object stays for the next prune
        return removed

    def __repr__(self) -> str:
        return f"Directory({str(self.path)!r}, threshold={self.threshold})"


class S3:
    """A bucket of S3 or of an S3-compatible server (MinIO, Ceph, ...), through boto3 (the
    ``s3`` extra): objects ``<prefix><execution id>/<name>``. ``endpoint_url`` reaches a server
    other than AWS; credentials and region come from boto3's usual places (environment,
    config files, instance roles) unless ``client=`` is a boto3 S3 client of your own."""

    name = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 client: Any = None, threshold: int = DEFAULT_THRESHOLD,
                 **client_args: Any):
        if not isinstance(bucket, str) or not bucket:
            raise KonduitError(f"S3 bucket {bucket!r}: a bucket name")
        self.bucket = bucket
        self.prefix = prefix.lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        self.threshold = _threshold(threshold)
        if client is None:
            require("s3", "a payload store on S3")
            import boto3  # type: ignore[import-untyped]

            client = boto3.client("s3", endpoint_url=endpoint_url, **client_args)
        self.client = client

    def _key(self, ref: str) -> str:
        return self.prefix + _check_ref(ref)

    def put(self, ref: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(ref), Body=data)
        except Exception as exc:
            raise PayloadStoreError(f"cannot write payload {ref} to s3://{self.bucket}/"
                                    f"{self.prefix}: {exc}", ref=ref) from exc

    def get(self, ref: str) -> bytes:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(ref))
            return bytes(answer["Body"].read())
        except Exception as exc:
            raise PayloadStoreError(f"cannot read payload {ref} from s3://{self.bucket}/"
                                    f"{self.prefix}: {exc}", ref=ref) from exc

    def copy(self, ref: str, to: str) -> None:
        try:
            self.client.copy_object(Bucket=self.bucket, Key=self._key(to),
                                    CopySource={"Bucket": self.bucket, "Key": self._key(ref)})
        except Exception as exc:
            raise PayloadStoreError(f"cannot copy payload {ref} in s3://{self.bucket}: {exc}",
                                    ref=ref) from exc

    def delete_prefix(self, prefix: str) -> int:
        key_prefix = self.prefix + prefix.strip("/") + "/"
        removed = 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=key_prefix)
            for page in pages:
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
                    removed += len(keys)
        except Exception as exc:
            raise PayloadStoreError(f"cannot remove the payloads {key_prefix}* of "
                                    f"s3://{self.bucket}: {exc}") from exc
        return removed

    def __repr__(self) -> str:
        return f"S3({self.bucket!r}, {self.prefix!r}, threshold={self.threshold})"


def from_url(url: str, *, threshold: int = DEFAULT_THRESHOLD) -> Directory | S3:
    """A store from ``file:///path`` (or a plain path) or ``s3://bucket/prefix`` (with
    ``?endpoint=http://host:port`` for an S3-compatible server)."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else url
        if not path:
            raise KonduitError(f"payload store {url!r}: no directory")
        return Directory(path, threshold=threshold)
    if parts.scheme == "s3":
        endpoint = parse_qs(parts.query).get("endpoint", [None])[0]
        return S3(parts.netloc, parts.path.lstrip("/"), endpoint_url=endpoint,
                  threshold=threshold)
    raise KonduitError(f"payload store {url!r}: file:///path or s3://bucket/prefix")


def from_settings() -> Directory | S3 | None:
    """The store ``KONDUIT_PAYLOAD_STORE`` names (with ``KONDUIT_PAYLOAD_STORE_THRESHOLD``), or
    None."""
    from konduit.settings import settings

    conf = settings()
    if not conf.payload_store:
        return None
    return from_url(conf.payload_store, threshold=conf.payload_store_threshold)
