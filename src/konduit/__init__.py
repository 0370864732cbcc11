"""Konduit: durable DAG workflows on PostgreSQL with an exactly-once join."""

from konduit.app import App, ExecutionHandle
from konduit.client import ExecutionResult
from konduit.context import Context
from konduit.errors import (
    DatabaseError,
    DatabaseUnavailable,
    ExecutionFailed,
    ExecutionNotFound,
    IdempotencyConflict,
    KonduitError,
    NonRetryableError,
    PayloadError,
    SchemaOutdated,
    WorkflowDefinitionError,
    WorkflowNotFound,
    WorkflowVersionConflict,
)
from konduit.policies import Deadline, Join, Retry
from konduit.repair import NothingToRepair
from konduit.results import Route
from konduit.validation import OutputInvalid
from konduit.workflow import Workflow, parallel, step

__version__ = "0.1.0"

__all__ = [
    "App",
    "Context",
    "DatabaseError",
    "DatabaseUnavailable",
    "Deadline",
    "ExecutionFailed",
    "ExecutionHandle",
    "ExecutionNotFound",
    "ExecutionResult",
    "IdempotencyConflict",
    "Join",
    "KonduitError",
    "NonRetryableError",
    "NothingToRepair",
    "OutputInvalid",
    "PayloadError",
    "Retry",
    "Route",
    "SchemaOutdated",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowNotFound",
    "WorkflowVersionConflict",
    "parallel",
    "step",
]
