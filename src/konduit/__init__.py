"""Konduit: durable DAG workflows on PostgreSQL with an exactly-once join."""

from konduit import codecs, stores
from konduit._blocking import ExecutionHandle
from konduit.app import App
from konduit.client import AsyncClient, AsyncExecutionHandle, Client
from konduit.core.context import Context
from konduit.core.fair import FairKeyError
from konduit.core.flow import KeyContext, Limit, Rate
from konduit.core.policies import Deadline, Join, Retry
from konduit.core.repair import NothingToRepair
from konduit.core.requests import StartRequest
from konduit.core.results import Route
from konduit.core.schedules import Schedule
from konduit.core.search import ExecutionFilter, SearchError
from konduit.core.triggers import Batch, TriggerCodeFailed
from konduit.core.validation import OutputInvalid
from konduit.core.webhooks import Webhook
from konduit.core.workflow import Workflow, parallel, step
from konduit.engine.client import ExecutionResult
from konduit.errors import (
    AlertError,
    CodecError,
    DatabaseError,
    DatabaseUnavailable,
    DefinitionWarning,
    DeterminismError,
    ExecutionFailed,
    ExecutionInHistory,
    ExecutionNotFound,
    IdempotencyConflict,
    InputValidationError,
    JournalUnavailable,
    KeyNeedsCode,
    KonduitError,
    LeaseLost,
    LimitKeyError,
    MigrationRefused,
    NonRetryableError,
    NotAnswerable,
    NotForkable,
    NotRedrivable,
    PayloadError,
    PayloadStoreError,
    PayloadTooLarge,
    ScheduleNotFound,
    SchemaConflict,
    SchemaGap,
    SchemaOutdated,
    StreamError,
    StreamFull,
    StreamLeaseLost,
    StreamNotFound,
    UserCodeInterrupted,
    UserCodeStuck,
    WorkerUnhealthy,
    WorkflowDefinitionError,
    WorkflowNotFound,
    WorkflowVersionConflict,
)
from konduit.extras import ExtraNotInstalled
from konduit.records import AlertRecord, StreamChunk

__version__ = "0.1.0"

__all__ = [
    "AlertError",
    "AlertRecord",
    "App",
    "AsyncClient",
    "AsyncExecutionHandle",
    "Batch",
    "Client",
    "CodecError",
    "Context",
    "DatabaseError",
    "DatabaseUnavailable",
    "Deadline",
    "DefinitionWarning",
    "DeterminismError",
    "ExecutionFailed",
    "ExecutionFilter",
    "ExecutionHandle",
    "ExecutionInHistory",
    "ExecutionNotFound",
    "ExecutionResult",
    "ExtraNotInstalled",
    "FairKeyError",
    "IdempotencyConflict",
    "InputValidationError",
    "Join",
    "JournalUnavailable",
    "KeyContext",
    "KeyNeedsCode",
    "KonduitError",
    "LeaseLost",
    "Limit",
    "LimitKeyError",
    "MigrationRefused",
    "NonRetryableError",
    "NotAnswerable",
    "NotForkable",
    "NotRedrivable",
    "NothingToRepair",
    "OutputInvalid",
    "PayloadError",
    "PayloadStoreError",
    "PayloadTooLarge",
    "Rate",
    "Retry",
    "Route",
    "Schedule",
    "ScheduleNotFound",
    "SchemaConflict",
    "SchemaGap",
    "SchemaOutdated",
    "SearchError",
    "StartRequest",
    "StreamChunk",
    "StreamError",
    "StreamFull",
    "StreamLeaseLost",
    "StreamNotFound",
    "TriggerCodeFailed",
    "UserCodeInterrupted",
    "UserCodeStuck",
    "Webhook",
    "WorkerUnhealthy",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowNotFound",
    "WorkflowVersionConflict",
    "codecs",
    "parallel",
    "step",
    "stores",
]
