"""What every part of the read model shares: the two ways to the database and how an execution
is named (:class:`konduit.reads.model.ReadModel`)."""

from __future__ import annotations

from uuid import UUID

from konduit.db.database import Database
from konduit.db.replica import Reads
from konduit.engine.ids import resolve_execution_id


class ReadBase:
    """``reads``: where the reads that may be a little stale go (a read replica within its lag
    bound, else the primary); ``db``: the primary itself, for the few reads that must see the
    latest write (an id's resolution, what registration and the live workers say)."""

    def __init__(self, reads: Reads):
        self.reads = reads
        self.db: Database = reads.primary

    async def resolve(self, execution_id: UUID | str) -> UUID:
        """The execution an id names: the whole id, or any unique prefix or tail of it (read on
        the primary, as :meth:`konduit.engine.client.Client.resolve`)."""
        return await resolve_execution_id(self.db, execution_id)
