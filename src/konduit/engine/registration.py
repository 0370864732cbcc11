"""Record a workflow version in ``konduit_workflows`` inside the caller's transaction
(:meth:`konduit.engine.client.Client.register`): insert it, or compare it with the stored one
(the same shape re-registers its policy, another shape is refused naming what changed), then
store its input schema, start-time keys, flow limits and event triggers."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from konduit.core import shape
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Tx
from konduit.engine import triggers
from konduit.engine.flow import register_flow_limits
from konduit.errors import WorkflowVersionConflict


async def register_in(tx: Tx, spec: WorkflowSpec) -> int:
    """Register ``spec`` through ``tx``; returns the revision of its version's policy."""
    inserted = await tx.run(
        "workflow_insert_if_absent",
        name=spec.name,
        version=spec.version,
        spec_hash=spec.spec_hash,
        shape_hash=spec.shape_hash,
        spec=Jsonb(spec.spec_json),
    )
    row = await tx.one("workflow_get_for_update", name=spec.name, version=spec.version)
    if row is None:  # deleted between the two statements: nothing to compare with
        raise WorkflowVersionConflict(f"workflow {spec.name!r} version {spec.version} "
                                      "was removed while it was being registered")
    revision = int(row["policy_revision"])
    if row["spec_hash"] != spec.spec_hash:
        changes = shape.shape_diff(shape.shape_of(row["spec"] or {}),
                                   shape.shape_of(spec.spec_json))
        if changes:
            raise WorkflowVersionConflict(
                f"workflow {spec.name!r} version {spec.version} is already registered "
                f"with a different shape ({'; '.join(changes)}); a shape change needs "
                f"a new version number (a policy change does not)")
        updated = await tx.one("workflow_update_policy_same_shape", name=spec.name,
                               version=spec.version, spec_hash=spec.spec_hash,
                               shape_hash=spec.shape_hash, spec=Jsonb(spec.spec_json),
                               old_spec_hash=row["spec_hash"])
        if updated is None:  # the row is locked: only a stored shape_hash can differ
            raise WorkflowVersionConflict(
                f"workflow {spec.name!r} version {spec.version} is registered with "
                f"a different shape; a shape change needs a new version number")
        revision = int(updated["revision"])
    # The declared input's schema (migration 0023) and how its start-time keys are
    # computed (0030): what code-less starts check and compute. A new
    # row without one has nothing to set (a start's statements stay as they were). After
    # a policy update above, the stored hash is this definition's.
    schema, keys = spec.input_schema, spec.start_keys
    if schema is not None or keys is not None or not inserted:
        await tx.run("workflow_set_input_schema_if_same_hash", name=spec.name,
                     version=spec.version, spec_hash=spec.spec_hash,
                     input_schema=None if schema is None else Jsonb(schema),
                     start_keys=None if keys is None else Jsonb(keys))
    # Limits of a version registered before may have changed (they are not in its
    # hash); a version new here has none to lift.
    if spec.flow_limits or not inserted:
        await register_flow_limits(tx, spec)
    # Its event triggers (wf.on_event): policy too, replaced on re-registration.
    if spec.triggers or not inserted:
        await triggers.register(tx, spec)
    return revision
