"""The read model: everything the pages, the API, the command line and the metrics show, read
above the engine (:class:`ReadModel`).

The engine's :class:`~konduit.engine.client.Client` keeps the commands and the reads a caller
acts on (the status :meth:`~konduit.engine.client.Client.get` and
:meth:`~konduit.engine.client.Client.wait` read, an id's resolution). What is only shown is read
here, through the same :class:`~konduit.db.replica.Reads` the client holds: ``reads`` for the
lists, details and stats, which may trail the primary by at most the read replica's lag bound
(:mod:`konduit.db.replica`; without a replica ``reads`` runs on the primary too), and the
primary for what must be current (what is registered, which live workers serve a version, an
execution's automatic repair). Every method returns the typed records of
:mod:`konduit.records` (or the stats, plan or alert types) and renders nothing.
"""

from __future__ import annotations

from konduit.db.replica import Reads
from konduit.reads.alerts import AlertReads
from konduit.reads.analytics import AnalyticsReads
from konduit.reads.executions import ExecutionReads
from konduit.reads.queues import QueueReads
from konduit.reads.workflows import WorkflowReads


class ReadModel(ExecutionReads, WorkflowReads, QueueReads, AlertReads, AnalyticsReads):
    """Every read a face shows, as coroutines, on ``reads`` (see the module docstring).

    Made beside an engine client on the same connections: ``ReadModel(client.reads)``. It owns
    no connection: closing the client closes them."""

    def on_primary(self) -> ReadModel:
        """This read model with every read on the primary: for what a command answers right
        after writing (the status of executions just started), which a replica may not have
        yet."""
        return ReadModel(Reads(self.db))
