"""Typed inputs: ``Workflow(..., input=Model)`` checks what a start passes before anything is
written.

The rule is one JSON Schema, whoever starts: the App (which has the model), the code-less
:class:`konduit.Client` and the API of a dashboard without ``--app`` (which have only the schema
stored at registration, ``konduit_workflows.input_schema``). Checking through the schema in
every path keeps them alike: an input one of them accepts, the others accept too, and the same
input is stored (so an idempotency key means the same thing whichever door started it). The
model itself is used where the code is: a handler gets ``ctx.input`` as the model instance.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from konduit.errors import InputValidationError, WorkflowDefinitionError

MAX_LISTED = 20
"""Fields one error message lists; ``errors`` holds up to :data:`MAX_ERRORS`."""
MAX_ERRORS = 100
"""Faults collected at most: a hostile input (a million wrong items) is refused as fast, and
its refusal (an HTTP problem lists every one) stays small."""

_REQUIRED = re.compile(r"^'(?P<name>.+)' is a required property$")
_UNEXPECTED = re.compile(r"\('(?P<names>.+)' (?:was|were) unexpected\)")


def _is_model(declared: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return isinstance(declared, type) and issubclass(declared, BaseModel)


class InputType:
    """A workflow's declared input: a Pydantic model class, or a JSON Schema dict."""

    def __init__(self, declared: Any, *, workflow: str):
        self.workflow = workflow
        self.model: Any = None
        if _is_model(declared):
            self.model = declared
            try:
                schema = declared.model_json_schema()
            except Exception as exc:  # a model pydantic cannot describe (an arbitrary type)
                raise WorkflowDefinitionError(
                    f"input={declared.__name__} has no JSON Schema ({exc}); use JSON-friendly "
                    "field types", workflow=workflow) from exc
        elif isinstance(declared, dict):
            schema = declared
        else:
            raise WorkflowDefinitionError(
                f"input= must be a Pydantic model class or a JSON Schema dict, got {declared!r}",
                workflow=workflow)
        self.schema: dict[str, Any] = schema
        self.checker = SchemaChecker(schema, workflow=workflow)

    def check(self, value: Any) -> Any:
        """``value`` as the JSON to store (a model instance is dumped), or raise
        :class:`InputValidationError` naming each field at fault."""
        if _is_model(type(value)):  # the model itself, or (code-less) one of the caller's
            try:
                value = value.model_dump(mode="json")
            except BaseException as exc:  # its serializers are user code: KeyboardInterrupt too
                name = type(value).__qualname__
                raise InputValidationError(
                    f"input of workflow {self.workflow!r}: dumping the {name} given raised "
                    f"{type(exc).__name__}: {exc}",
                    {"(root)": f"{name}.model_dump raised {type(exc).__name__}: {exc}"},
                    workflow=self.workflow) from exc
        self.checker.check(value)
        return value

    def for_handler(self, value: Any) -> Any:
        """What a handler gets as ``ctx.input``: the model instance, or the JSON as stored."""
        if self.model is None:
            return value
        return self.model.model_validate(value)


def _where(error: Any) -> list[tuple[bool, Any]]:
    """A fault's path as a sort key: list items in index order (2 before 10), then fields."""
    return [(isinstance(p, str), p if isinstance(p, int) else str(p)) for p in error.path]


class SchemaChecker:
    """A JSON Schema (draft 2020-12, as Pydantic writes it) compiled once, with errors by field.

    Uses ``jsonschema`` (already a dependency: step ``output=`` schemas are checked with it)."""

    def __init__(self, schema: Any, *, workflow: str):
        import jsonschema

        self.workflow = workflow
        if not isinstance(schema, dict):
            raise WorkflowDefinitionError(f"input= schema must be a JSON object, got {schema!r}",
                                          workflow=workflow)
        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise WorkflowDefinitionError(f"input= is not a valid JSON Schema: {exc.message}",
                                          workflow=workflow) from exc
        self._validator = cls(schema)

    def errors(self, value: Any) -> dict[str, str]:
        """Each field at fault (dotted path, ``(root)`` for the input itself) and its problem,
        for the first :data:`MAX_ERRORS` faults."""
        found: dict[str, str] = {}
        faults = list(itertools.islice(self._validator.iter_errors(value), MAX_ERRORS))
        for error in sorted(faults, key=_where):
            path = [str(p) for p in error.absolute_path]
            if error.validator == "required" and (m := _REQUIRED.match(error.message)):
                found.setdefault(".".join([*path, m["name"]]), "field required")
                continue
            if error.validator == "additionalProperties" and (m := _UNEXPECTED.search(error.message)):
                for name in m["names"].split("', '"):
                    found.setdefault(".".join([*path, name]), "unexpected field")
                continue
            found.setdefault(".".join(path) or "(root)", error.message)
        return found

    def check(self, value: Any) -> None:
        errors = self.errors(value)
        if not errors:
            return
        listed = "; ".join(f"{field}: {message}" for field, message in
                           list(errors.items())[:MAX_LISTED])
        more = f"; and {len(errors) - MAX_LISTED} more" if len(errors) > MAX_LISTED else ""
        raise InputValidationError(
            f"input of workflow {self.workflow!r} is invalid: {listed}{more}", errors,
            workflow=self.workflow)
