"""Worker settings with their documented defaults. Those a ``KONDUIT_*`` variable can set take
their default from :mod:`konduit.settings` when the config is made; the ``konduit worker`` flags
mirror the fields."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from konduit.settings import settings


def _setting(name: str) -> Any:
    """A field's default: the setting ``name`` as the environment says now."""
    return field(default_factory=lambda: getattr(settings(), name))


@dataclass
class WorkerConfig:
    concurrency: int = 10
    """Tasks run at once; sync handlers get a thread pool of this size."""
    queues: tuple[str, ...] = ("default",)
    poll_interval: float = _setting("poll_interval")
    """Seconds between claims when no notification arrives (LISTEN/NOTIFY wakes it sooner)."""
    lease_seconds: float = _setting("lease_seconds")
    """How long a claim holds without a heartbeat; a dead worker's tasks are retaken after it."""
    heartbeat_interval: float = _setting("heartbeat_interval")
    """Seconds between lease extensions of running tasks."""
    maintenance_interval: float = _setting("maintenance_interval")
    """Seconds between full maintenance passes: expired leases, deadlines, due timers and waits,
    timed-out executions, due repairs, scheduled starts due (the leader of the deployment runs
    them: leadership.py; they are idempotent). Deadlines, timers and repairs that come due in
    between are acted on at their moment (wakeups.py); a scheduled start waits for the next
    pass."""
    leader_lease: float = _setting("leader_lease")
    """Seconds the maintenance leader's lease holds without renewal (leadership.py): it renews
    every third of it; the other workers try to take it every half, and take it at once when
    the leader stopped or its process is gone."""
    stall_grace: float = _setting("stall_grace")
    """Seconds a running execution in which nothing can run (no ready, running or waiting task)
    is left before the maintenance pass re-runs its fan-in decision and raises
    ``execution_stalled`` (docs/alerts.md)."""
    deadline_grace: float = 1.0
    """Seconds past a running task's deadline that the sweep leaves it to its worker, while that
    worker is alive (it cancels the task locally at the deadline); a dead worker's task, and a
    ready or waiting one, ends at the deadline itself (docs/deadlines.md)."""
    shutdown_grace: float = 10.0
    """Seconds running tasks get to finish after a stop request before they are released."""
    isolation: str = "thread"
    """How sync handlers run: ``thread`` (a thread each; one that ignores its deadline is
    abandoned, never reused) or ``process`` (a child process each, killed at the deadline)."""
    max_abandoned: int = _setting("max_abandoned")
    """Abandoned threads of user code this worker tolerates (handlers past their deadline, and
    the process's hung start-time code, trigger code and maps' ``over()``); past it, it stops
    claiming, drains and exits non-zero so that its supervisor restarts it (a thread cannot be
    killed)."""
    fallback_timeout: float = _setting("fallback_timeout")
    """Seconds a fallback may run; one that hangs or raises ends its task timed_out."""
    retention_interval: float = _setting("retention_interval")
    """Seconds between retention rounds when the App sets ``retention=`` (each deletes in batches)."""
    history_interval: float = _setting("history_interval")
    """Seconds between the leader's moves into the history when the App sets ``history_after=``."""
    auto_repair: bool = True
    """Whether this worker takes the automatic repairs (``repair_within=``) that come due: at
    their due time and at every maintenance pass. False leaves them to other workers."""
    alert_interval: float = _setting("alert_interval")
    """Seconds between evaluations of the alert rules (docs/alerts.md); 0 turns them off here."""
    alert_fan_in_wait: float = 20.0
    """The fan-in-wait rule: a join waiting longer than this (seconds) ..."""
    alert_fan_in_consecutive: int = 2
    """... in each of its last this many executions raises a ``fan_in_wait`` alert."""
    alert_version_unserved: float = _setting("alert_version_unserved")
    """Seconds a workflow version's running executions may go without a live worker serving it
    before a ``version_unserved`` alert (docs/changing-workflows.md)."""
    alert_queue_unserved: float = _setting("alert_queue_unserved")
    """Seconds ready tasks may wait on a queue that no live worker serving their workflow version
    takes before a ``queue_unserved`` alert (docs/alerts.md)."""
    metrics_port: int | None = None
    """Serve this worker's histograms (attempt durations) on ``/metrics`` at this port (0: a free
    one); None serves nothing and measures nothing (:mod:`konduit.worker.metrics`)."""
    metrics_host: str = "127.0.0.1"
    """The address the metrics endpoint listens on: loopback by default, as the dashboard's;
    ``"0.0.0.0"`` (every interface) for a Prometheus on another host or pod."""
    worker_id: str = field(default_factory=lambda: new_worker_id())

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', got {self.isolation!r}")
        if self.max_abandoned < 0:
            raise ValueError(f"max_abandoned must be >= 0, got {self.max_abandoned}")
        if self.fallback_timeout <= 0:
            raise ValueError(f"fallback_timeout must be > 0, got {self.fallback_timeout}")
        if self.maintenance_interval <= 0:
            raise ValueError(f"maintenance_interval must be > 0, got {self.maintenance_interval}")
        if self.leader_lease <= 0:
            raise ValueError(f"leader_lease must be > 0, got {self.leader_lease}")
        if self.stall_grace <= 0:
            raise ValueError(f"stall_grace must be > 0, got {self.stall_grace}")
        if self.retention_interval <= 0:
            raise ValueError("retention_interval must be > 0")
        if self.history_interval <= 0:
            raise ValueError("history_interval must be > 0")
        if self.alert_interval < 0 or self.alert_fan_in_wait <= 0 or self.alert_fan_in_consecutive < 1:
            raise ValueError("alert_interval must be >= 0, alert_fan_in_wait > 0 and "
                             "alert_fan_in_consecutive >= 1")
        if self.alert_version_unserved <= 0:
            raise ValueError(f"alert_version_unserved must be > 0, got "
                             f"{self.alert_version_unserved}")
        if self.alert_queue_unserved <= 0:
            raise ValueError(f"alert_queue_unserved must be > 0, got {self.alert_queue_unserved}")
        if self.heartbeat_interval >= self.lease_seconds:
            raise ValueError("heartbeat_interval must be shorter than lease_seconds")


def new_worker_id() -> str:
    """A worker's id: host, pid and a random suffix (a pid is reused across restarts)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
