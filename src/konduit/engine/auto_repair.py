"""The automatic repair of the 24-hour repair contract (``Workflow(..., repair_within="24h")``).

The repair is armed like a timer: the transaction that finishes an execution degraded sets when
its repair is due (``auto_repair_due_at``: ``repair_delay`` after the finish), and a worker's
maintenance loop wakes at the earliest one (:mod:`konduit.worker.wakeups`), besides looking at
every full pass. A look finds the executions of the workflows it serves that succeeded with a
degraded output ``repair_delay`` to ``repair_within`` ago and were not auto-repaired yet
(:mod:`konduit.core.repair_contract` says what that means), so any window longer than the delay
is honoured, not only those longer than a polling interval.
Each one is taken and repaired in **one transaction**: a guarded UPDATE sets ``auto_repair_at``
from NULL while re-checking that the execution is still due, then the manual repair
(:func:`konduit.engine.repairs.repair_in`) reopens it and starts the re-run steps. Workers that
race for the same execution queue on its row; the losers' UPDATE re-checks after the winner
commits, finds ``auto_repair_at`` set (and the execution running), and changes nothing. So an
execution is auto-repaired at most once, however many workers run, and a repair that cannot
start is recorded once (``auto_repair_error``) instead of being retried forever.
"""

from __future__ import annotations

import logging
from uuid import UUID

from konduit.core.repair_contract import RepairContract
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database
from konduit.engine.registry import Registry
from konduit.engine.repairs import repair_in
from konduit.errors import DatabaseError, KonduitError

log = logging.getLogger(__name__)

class AutoRepairer:
    """Takes and starts the due automatic repairs of the workflows in ``registry``."""

    def __init__(self, db: Database, registry: Registry, *, max_payload_bytes: int):
        self.db = db
        self.registry = registry
        self.max_payload_bytes = max_payload_bytes
        self.specs: dict[tuple[str, int], WorkflowSpec] = {
            (spec.name, spec.version): spec for spec in registry if spec.repair is not None
        }

    async def repair_due(self, *, limit: int = 100) -> list[UUID]:
        """Take and start every due automatic repair (up to ``limit``); returns their ids."""
        if not self.specs:
            return []
        keys = list(self.specs)
        contracts = [self._contract(key) for key in keys]
        rows = await self.db.all(
            "execution_list_auto_repair_due",
            names=[name for name, _ in keys], versions=[version for _, version in keys],
            within_seconds=[c.within for c in contracts], delay_seconds=[c.delay for c in contracts],
            max_within_seconds=max(c.within for c in contracts), limit=limit,
        )
        repaired = []
        for row in rows:
            eid = UUID(str(row["id"]))
            if await self.repair_one(eid, self.specs[(row["workflow_name"], row["workflow_version"])]):
                repaired.append(eid)
        return repaired

    def _contract(self, key: tuple[str, int]) -> RepairContract:
        contract = self.specs[key].repair
        assert contract is not None
        return contract

    async def repair_one(self, eid: UUID, spec: WorkflowSpec) -> bool:
        """Take the automatic repair of one execution and start it; False when another worker
        took it first, it is no longer due, or it cannot start (recorded on the execution)."""
        contract = spec.repair
        assert contract is not None
        try:
            async with self.db.transaction() as tx:
                taken = await tx.one("execution_claim_auto_repair_if_due", id=eid,
                                     within_seconds=contract.within, delay_seconds=contract.delay)
                if taken is None:
                    return False
                rerun = await repair_in(tx, self.registry, eid,
                                        max_payload_bytes=self.max_payload_bytes)
        except DatabaseError:
            raise  # the transaction rolled back: still due, the next look tries again
        except KonduitError as exc:
            # Deterministic (the plan cannot fire with the outcomes that stand): say so once.
            marked = await self.db.one("execution_mark_auto_repair_impossible_if_untaken",
                                       id=eid, error=str(exc))
            if marked is not None:
                log.warning("execution %s cannot be auto-repaired: %s", eid, exc)
            return False
        log.info("auto-repairing execution %s (%s v%s, repair_within %ss): re-running %s",
                 eid, spec.name, spec.version, f"{contract.within:g}", ", ".join(rerun))
        return True


