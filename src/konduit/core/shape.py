"""A workflow definition split in two: its *shape* and its *policy*.

The shape is what an execution's plan is made of: the steps, the edges between them, each
join's policy and which branches it requires, which steps fan out (map) and what each wait step
waits for (its kind). An execution's rows (``konduit_steps``, its join counters) are built from
it, so a running execution is only valid under the shape it started with: a shape change needs a
new version.

The policy is how each task is run: retries, deadlines, fallbacks, queue, priority, concurrency,
rate, hedging, output validation, map limits, the repair contract. It may change under the same
version: the new policy applies to tasks created from then on, each task keeping the one it was
created with.

Everything here works on the JSON a :class:`~konduit.core.workflow.WorkflowSpec` stores
(``spec_json``), so a definition in code compares with one read back from the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

_SHAPE_KEYS = ("after", "join", "required", "map")
"""A step's keys in ``spec_json`` that belong to the shape (its wait kind too)."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def step_shape(step: Mapping[str, Any]) -> dict[str, Any]:
    """One step's part of the shape, from its ``spec_json`` entry."""
    wait = step.get("wait")
    return {
        "after": sorted(step.get("after") or ()),
        # A join policy means something only with two upstreams or more (the definition refuses
        # one otherwise); a single-upstream step carries the default, which is no choice.
        "join": dict(step.get("join") or {"kind": "all_succeeded", "k": None}),
        "required": bool(step.get("required", True)),
        "map": bool(step.get("map", False)),
        "wait": None if not wait else str(wait.get("kind")),
    }


def shape_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The shape of a definition (its ``spec_json``): every step by name."""
    return {"steps": {s["name"]: step_shape(s) for s in spec.get("steps", ())}}


def policy_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The policy of a definition (its ``spec_json``): each step's settings outside the shape
    (a join's ``alert_fan_in_wait`` too), and the workflow's own (the repair contract, the
    fan-in wait threshold)."""
    steps = {}
    for s in spec.get("steps", ()):
        own = {k: v for k, v in s.items() if k not in (*_SHAPE_KEYS, "name", "wait")}
        wait = s.get("wait")
        if wait:  # what a wait waits on beyond its kind (event name, timer length, child) is policy
            own["wait"] = {k: v for k, v in wait.items() if k != "kind"}
        steps[s["name"]] = own
    policy: dict[str, Any] = {"steps": steps}
    if spec.get("repair") is not None:
        policy["repair"] = spec["repair"]
    if spec.get("alert_fan_in_wait") is not None:
        policy["alert_fan_in_wait"] = spec["alert_fan_in_wait"]
    return policy


def shape_hash(spec: Mapping[str, Any]) -> str:
    """A digest of the shape alone: equal for two definitions that differ only in policy."""
    return hashlib.sha256(_canonical(shape_of(spec)).encode()).hexdigest()


def policy_hash(spec: Mapping[str, Any]) -> str:
    """A digest of the policy alone."""
    return hashlib.sha256(_canonical(policy_of(spec)).encode()).hexdigest()


def describe_join(join: Mapping[str, Any]) -> str:
    """A join policy as a person writes it: ``all_succeeded``, ``quorum(2)``."""
    kind = str(join.get("kind"))
    return f"{kind}({join.get('k')})" if kind == "quorum" else kind


def shape_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What changed from shape ``old`` to shape ``new`` (both from :func:`shape_of`), one
    sentence each, in a stable order: steps added, removed, then edges, joins, maps, waits.
    Empty exactly when the two shapes are equal."""
    before: Mapping[str, Mapping[str, Any]] = old.get("steps", {})
    after: Mapping[str, Mapping[str, Any]] = new.get("steps", {})
    changes = [f"step {n!r} added" for n in sorted(set(after) - set(before))]
    changes += [f"step {n!r} removed" for n in sorted(set(before) - set(after))]
    edges_before = {(u, n) for n, s in before.items() for u in s.get("after", ())}
    edges_after = {(u, n) for n, s in after.items() for u in s.get("after", ())}
    changes += [f"edge {u}->{n} added" for u, n in sorted(edges_after - edges_before)]
    changes += [f"edge {u}->{n} removed" for u, n in sorted(edges_before - edges_after)]
    for name in sorted(set(before) & set(after)):
        b, a = before[name], after[name]
        if _canonical(b.get("join")) != _canonical(a.get("join")):
            changes.append(f"join policy of {name!r} changed from {describe_join(b['join'])} "
                           f"to {describe_join(a['join'])}")
        if b.get("required") != a.get("required"):
            changes.append(f"step {name!r} changed from "
                           f"{'required' if b.get('required') else 'optional'} to "
                           f"{'required' if a.get('required') else 'optional'}")
        if b.get("map") != a.get("map"):
            changes.append(f"step {name!r} changed from {'a map' if b.get('map') else 'a task'} "
                           f"to {'a map' if a.get('map') else 'a task'}")
        if b.get("wait") != a.get("wait"):
            changes.append(f"wait kind of {name!r} changed from {b.get('wait') or 'none'} to "
                           f"{a.get('wait') or 'none'}")
    return changes
