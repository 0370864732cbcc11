"""Declared output types: a step's payload is checked before it is stored.

A step may declare ``output=`` a Pydantic model (or any type Pydantic's ``TypeAdapter`` takes:
dataclasses, TypedDicts, ``list[int]``...) or a JSON Schema as a dict. A payload that does not
validate fails its attempt at once with the validation message: never a silent wait.
"""

from __future__ import annotations

from typing import Any

from konduit.errors import OutputInvalid as OutputInvalid
from konduit.errors import WorkflowDefinitionError


class OutputValidator:
    def __init__(self, declared: Any, *, step: str, workflow: str):
        self.step = step
        self.declared = declared
        if isinstance(declared, dict):
            import jsonschema

            try:
                cls = jsonschema.validators.validator_for(declared)
                cls.check_schema(declared)
            except jsonschema.SchemaError as exc:
                raise WorkflowDefinitionError(
                    f"output= is not a valid JSON Schema: {exc.message}", workflow=workflow, step=step
                ) from exc
            self._schema = cls(declared)
            self._adapter = None
        else:
            from pydantic import TypeAdapter

            try:
                self._adapter = TypeAdapter(declared)
            except Exception as exc:
                raise WorkflowDefinitionError(
                    f"output= must be a Pydantic model, a type or a JSON Schema dict: {exc}",
                    workflow=workflow,
                    step=step,
                ) from exc
            self._schema = None

    def validate(self, payload: Any) -> Any:
        """Return the payload in its JSON form, or raise :class:`OutputInvalid`."""
        if self._adapter is not None:
            from pydantic import ValidationError

            try:
                value = self._adapter.validate_python(payload)
            except ValidationError as exc:
                raise OutputInvalid(
                    f"output of step {self.step!r} does not match its declared type: {exc}"
                ) from exc
            return self._adapter.dump_python(value, mode="json")
        assert self._schema is not None
        errors = sorted(self._schema.iter_errors(payload), key=lambda e: list(e.absolute_path))
        if errors:
            detail = "; ".join(
                f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
                for e in errors[:5]
            )
            raise OutputInvalid(
                f"output of step {self.step!r} does not match its JSON Schema: {detail}"
            )
        return payload
