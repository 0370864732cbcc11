"""The public surface of DESIGN.md exists as written, is documented, and errors share one base."""

from __future__ import annotations

import inspect

import pytest

import konduit


def test_design_surface_exists():
    wf = konduit.Workflow("publish-content", version=1)
    assert callable(wf.step) and callable(wf.map) and callable(wf.sequence)
    konduit.Retry(max_attempts=3, backoff="exponential", base="1s", cap="30s", jitter=True)
    konduit.Deadline.adaptive(factor=1.5, quantile=0.99, window="7d", floor="10s", ceiling="45s")
    for policy in (konduit.Join.required(), konduit.Join.all_succeeded(), konduit.Join.all_done(),
                   konduit.Join.quorum(2)):
        assert isinstance(policy, konduit.Join)
    for method in ("start", "wait", "status", "cancel", "list", "run_worker", "repair", "outputs"):
        assert callable(getattr(konduit.App, method))
    for name in ("execution_id", "step", "map_index", "attempt", "input", "upstream", "outcomes",
                 "idempotency_key", "deadline", "cancelled", "heartbeat"):
        assert hasattr(konduit.Context, name) or name in konduit.Context.__dataclass_fields__
    assert {"status", "output", "outcomes", "error"} <= set(
        konduit.ExecutionResult.__dataclass_fields__
    )


@pytest.mark.parametrize("name", konduit.__all__)
def test_every_public_name_and_method_has_a_docstring(name):
    obj = getattr(konduit, name)
    assert inspect.getdoc(obj), name
    if inspect.isclass(obj):
        for member, value in vars(obj).items():
            if not member.startswith("_") and callable(value):
                assert (value.__doc__ or "").strip(), f"{name}.{member}"


def test_every_exception_derives_from_konduit_error():
    errors = [getattr(konduit, n) for n in konduit.__all__
              if inspect.isclass(getattr(konduit, n))
              and issubclass(getattr(konduit, n), BaseException)]
    assert len(errors) >= 10
    assert all(issubclass(e, konduit.KonduitError) for e in errors)
