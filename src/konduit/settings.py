"""Every setting konduit reads from the environment, in one place.

Each field of :class:`Settings` is one ``KONDUIT_*`` variable (the field's name in capitals,
after the prefix): ``poll_interval`` is ``KONDUIT_POLL_INTERVAL``. An argument given in code or
on the command line wins over the variable, and the variable over the default declared here.
:class:`konduit.worker.config.WorkerConfig` and the ``konduit`` command's options take their
defaults from here; the documentation's tables come from the same descriptions.

Read them with :func:`settings` at the moment they are used, not once at import: it reads the
environment again whenever a ``KONDUIT_*`` variable changed (comparing them is all it costs
otherwise), so a variable set by a test or by the process itself takes effect. An empty
variable counts as unset. A variable that cannot be read (``KONDUIT_POLL_INTERVAL=soon``)
raises :class:`konduit.errors.SettingsError` naming it, from whatever read the settings.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from konduit.core.durations import parse_duration
from konduit.core.waits import DEFAULT_EVENT_RETENTION
from konduit.errors import KonduitError, SettingsError

ENV_PREFIX = "KONDUIT_"

_SECONDS = ("read_max_lag", "poll_interval", "lease_seconds", "heartbeat_interval",
            "maintenance_interval", "stall_grace", "fallback_timeout", "retention_interval",
            "alert_interval", "alert_version_unserved", "alert_queue_unserved", "leader_lease",
            "stop_stuck_after", "stream_keepalive")
_TRUE = {"1", "true", "yes", "on", "transaction"}
_FALSE = {"0", "false", "no", "off"}


class Settings(BaseSettings):
    """konduit's environment: one field per ``KONDUIT_*`` variable, with its default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True,
                                      extra="ignore", frozen=True)

    # -- the database ---------------------------------------------------------------------------
    database_url: str | None = Field(default=None, repr=False, description=(
        "PostgreSQL URL of konduit's database; without it, the embedded server (started on "
        "first use in the home folder)."))
    direct_database_url: str | None = Field(default=None, repr=False, description=(
        "The same server reached directly, for LISTEN and the heartbeat, when the database URL "
        "is a transaction pooler's (PgBouncer; docs/scaling.md)."))
    database_pooled: bool | None = Field(default=None, description=(
        "Whether the database URL is a transaction pooler's: 1 or 0 (true/false, on/off). "
        "Unset: yes exactly when a direct URL is given."))
    read_database_url: str | None = Field(default=None, repr=False, description=(
        "A streaming replica for the reads that may be a little stale (docs/read-replicas.md)."))
    read_max_lag: float = Field(default=10.0, description=(
        "Seconds the replica may trail the primary and still serve reads."))
    home: Path | None = Field(default=None, description=(
        "The folder of the embedded PostgreSQL server's data (default: the platform's user "
        "data folder for konduit)."))
    test_database_url: str | None = Field(default=None, repr=False, description=(
        "konduit.testing: a server on which tests may create databases (default: the embedded "
        "server)."))

    # -- workers (konduit worker; konduit.worker.config.WorkerConfig) ---------------------------
    poll_interval: float = Field(default=1.0, description=(
        "Seconds between claims when no notification arrives (LISTEN/NOTIFY wakes a worker "
        "sooner)."))
    lease_seconds: float = Field(default=15.0, description=(
        "How long a claim holds without a heartbeat; a dead worker's tasks are retaken after "
        "it."))
    heartbeat_interval: float = Field(default=3.0, description=(
        "Seconds between lease extensions of running tasks (shorter than the lease)."))
    maintenance_interval: float = Field(default=2.0, description=(
        "Seconds between the full maintenance passes of a deployment's leader: expired leases, "
        "deadlines, due timers and waits, due repairs and scheduled starts."))
    leader_lease: float = Field(default=6.0, description=(
        "Seconds the lease of a deployment's maintenance leader holds without renewal: the "
        "leader renews it every third of it, the other workers try to take it every half "
        "(at once when the leader stopped or its process died)."))
    stop_stuck_after: float = Field(default=20.0, description=(
        "Seconds past its shutdown grace a stopping worker is given before it writes every "
        "thread's and task's stack to stderr; `konduit worker` ends its process half that "
        "later (exit status 70)."))
    stall_grace: float = Field(default=60.0, description=(
        "Seconds a running execution in which nothing can run is left before the maintenance "
        "pass re-runs its fan-in decision and raises execution_stalled."))
    max_abandoned: int = Field(default=20, description=(
        "Abandoned threads of user code (handlers past their deadline, hung start-time code, "
        "trigger code or map over()) a worker tolerates before it drains and exits non-zero "
        "for its supervisor to restart it."))
    fallback_timeout: float = Field(default=5.0, description=(
        "Seconds a fallback may run; one that hangs or raises ends its task timed_out."))
    retention_interval: float = Field(default=300.0, description=(
        "Seconds between retention rounds when the App sets retention=."))
    history_interval: float = Field(default=60.0, description=(
        "Seconds between the leader's moves of finished executions into the history when the "
        "App sets history_after=."))
    alert_interval: float = Field(default=5.0, description=(
        "Seconds between evaluations of the alert rules; 0 turns them off in that worker."))
    alert_version_unserved: float = Field(default=300.0, description=(
        "Seconds a workflow version's running executions may go without a live worker serving "
        "it before a version_unserved alert."))
    alert_queue_unserved: float = Field(default=5.0, description=(
        "Seconds ready tasks may wait on a queue that no live worker serving their workflow "
        "version takes before a queue_unserved alert."))
    worker_metrics_port: int | None = Field(default=None, description=(
        "Serve a worker's histograms (attempt durations) on /metrics at this port (0: a free "
        "one); unset serves nothing."))
    log_format: str = Field(default="text", description=(
        "A worker's log lines: text, or json (one object per line with the worker and the "
        "attempt's execution, step, map index and attempt)."))

    # -- events ---------------------------------------------------------------------------------
    event_retention: float = Field(default=DEFAULT_EVENT_RETENTION, description=(
        "How long an event no step waits for yet is kept, when the step declares no "
        "retention= and the App no event_retention= (a duration: 90m, 24h, or seconds)."))

    # -- payloads (docs/payload-codecs.md) ------------------------------------------------------
    codec: str | None = Field(default=None, description=(
        "The payload codec of processes whose App or Client names none: none, zlib, "
        "encrypted (zlib then AES-GCM) or aesgcm. Unset: encrypted when keys are given, "
        "else none."))
    codec_keys: str | None = Field(default=None, repr=False, description=(
        "The key ring of an encrypting codec: key_id:BASE64 pairs separated by commas "
        "(16, 24 or 32 bytes each), or @/path/to/file holding them."))
    codec_current_key: str | None = Field(default=None, description=(
        "The key id new payloads are sealed with (default: the last of the ring)."))
    payload_limit: int = Field(default=16 * 1024 * 1024, description=(
        "Bytes of JSON a payload may have (16MB, 512KiB; default 16 MiB): a larger output fails its attempt "
        "at once, naming the step and the size; a larger input is refused."))
    payload_warn: int = Field(default=1024 * 1024, description=(
        "Bytes of JSON past which a payload is logged as a warning (default 1 MiB)."))
    payload_store: str | None = Field(default=None, description=(
        "Where payloads of executions larger than the threshold are kept instead of the "
        "database: file:///path or s3://bucket/prefix (?endpoint=URL for an S3-compatible "
        "server)."))
    payload_store_threshold: int = Field(default=256 * 1024, description=(
        "Bytes of JSON from which a payload goes to the payload store (default 256 KiB)."))
    payload_store_limit: int = Field(default=1024 * 1024 * 1024, description=(
        "Bytes of JSON a payload may have when a payload store is configured (default 1 GiB)."))
    # -- streams --------------------------------------------------------------------------------
    stream_max_chunks: int = Field(default=10_000, ge=1, description=(
        "Data chunks a durable stream (ctx.stream) keeps at most; a write past it raises "
        "StreamFull naming the step."))
    stream_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1, description=(
        "Bytes of chunk JSON a durable stream (ctx.stream) keeps at most; a write past it "
        "raises StreamFull naming the step."))
    stream_keepalive: float = Field(default=15.0, gt=0, description=(
        "Seconds a followed stream's server-sent events may go quiet before the answer carries "
        "a keep-alive comment, so a proxy or load balancer does not close it as idle (keep it "
        "below their idle timeout: nginx's is 60 s)."))

    # -- the command line, the dashboard and its API --------------------------------------------
    app: str | None = Field(default=None, description=(
        "module:attribute of the konduit.App that --app would name (konduit start, repair, "
        "plan, dashboard, migrate-executions, send-event)."))
    api_token: str = Field(default="", repr=False, description=(
        "The dashboard's and the API's tokens, separated by commas: ro:SECRET reads, op:SECRET "
        "(or a bare SECRET) also starts, cancels and repairs."))
    session_secret: str | None = Field(default=None, repr=False, description=(
        "The secret that signs the dashboard's sessions (at least 32 characters), so logins "
        "survive a restart and are shared by several servers; default: one per server."))
    trusted_proxies: str | None = Field(default=None, description=(
        "Reverse proxies (addresses or networks, separated by spaces) whose X-Forwarded-For "
        "names the dashboard's client."))

    # -- benchmarks -----------------------------------------------------------------------------
    bench_profile: str | None = Field(default=None, description=(
        "konduit bench --profile: the folder where each worker process of a benchmark writes "
        "its cProfile."))

    @field_validator(*_SECONDS, mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"must be a number of seconds, not {value!r}") from None
            if not math.isfinite(number):
                raise ValueError(f"must be a finite number of seconds, not {value!r}")
            return number
        return value

    @field_validator("payload_limit", "payload_warn", "payload_store_threshold",
                     "payload_store_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if isinstance(value, str):
            from konduit.core.payloads import parse_size

            try:
                return parse_size(value)
            except KonduitError:
                raise ValueError(f"must be a size in bytes, or with a unit (10MB, 512KiB), "
                                 f"not {value!r}") from None
        return value

    @field_validator("max_abandoned", "worker_metrics_port", "stream_max_chunks",
                     "stream_max_bytes", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                # "20.0" was read as 20 before: the number, then its whole part.
                number = float(value)
            except ValueError:
                raise ValueError(f"must be a whole number, not {value!r}") from None
            if not number.is_integer():
                raise ValueError(f"must be a whole number, not {value!r}")
            return int(number)
        return value

    @field_validator("database_pooled", mode="before")
    @classmethod
    def _pooled(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            if not word:
                return None
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
            raise ValueError(f"must be 1 or 0 (true/false, on/off), not {value!r}")
        return value

    @field_validator("codec", mode="before")
    @classmethod
    def _codec(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            if word not in ("none", "zlib", "encrypted", "aesgcm"):
                raise ValueError(f"must be none, zlib, encrypted or aesgcm, not {value!r}")
            return word
        return value

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format(cls, value: Any) -> Any:
        if isinstance(value, str):
            word = value.strip().lower()
            if word not in ("text", "json"):
                raise ValueError(f"must be text or json, not {value!r}")
            return word
        return value

    @field_validator("event_retention", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except KonduitError:
                raise ValueError(f"must be a duration (90m, 24h, or seconds), not {value!r}") \
                    from None
            if seconds <= 0:
                raise ValueError(f"must be a duration longer than zero, not {value!r}")
            return seconds
        return value

    @field_validator("home", mode="after")
    @classmethod
    def _home(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()


def variable(name: str) -> str:
    """The environment variable of the setting ``name``: ``KONDUIT_POLL_INTERVAL``."""
    return ENV_PREFIX + name.upper()


def default(name: str) -> Any:
    """The default of the setting ``name``, as declared here (the environment left aside)."""
    return Settings.model_fields[name].default


def described(name: str) -> str:
    """What a help text says of a setting's default: ``$KONDUIT_POLL_INTERVAL or 1``."""
    value = default(name)
    shown = "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
    return f"${variable(name)} or {shown}"


_lock = threading.Lock()
_cached: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def _environment() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.upper().startswith(ENV_PREFIX)))


def settings() -> Settings:
    """The settings as the environment says now (made again only when a ``KONDUIT_*``
    variable changed since the last call); raises :class:`~konduit.errors.SettingsError`
    naming each variable that cannot be read."""
    global _cached
    seen = _environment()
    cached = _cached
    if cached is not None and cached[0] == seen:
        return cached[1]
    with _lock:
        try:
            made = Settings()
        except ValidationError as exc:
            raise SettingsError("; ".join(_problem(e) for e in exc.errors())) from None
        _cached = (seen, made)
    return made


def _problem(error: Any) -> str:
    field = str(error["loc"][0]) if error.get("loc") else "?"
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        return f"{variable(field)} {cause}"
    return f"{variable(field)}: {error['msg']}, not {error.get('input')!r}"


__all__ = ["ENV_PREFIX", "Settings", "default", "described", "settings", "variable"]
