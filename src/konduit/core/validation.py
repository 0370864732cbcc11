"""Declared output types: a step's payload is checked before it is stored.

A step may declare ``output=`` a Pydantic model (or any type Pydantic's ``TypeAdapter`` takes:
dataclasses, TypedDicts, ``list[int]``...) or a JSON Schema as a dict. A payload that does not
validate fails its attempt at once with the validation message: never a silent wait.

The message is one line holding every error (up to :data:`MAX_ERRORS`): pages, logs and the
execution's error keep the last line of an error, and pydantic's own text ends with a "For
further information visit <url>" line that says nothing about the payload.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from konduit.errors import OutputInvalid as OutputInvalid
from konduit.errors import WorkflowDefinitionError

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_ERRORS = 10
"""Validation errors one message lists; it counts the rest."""
URL_LINE = "For further information visit"


def pydantic_message(exc: ValidationError) -> str:
    """Pydantic's message on one line, without its documentation links: ``2 validation errors
    for Out: count: Input should be a valid integer, ... [type=int_parsing, input_value='x',
    input_type=str]; name: Field required [...]``."""
    lines = [line for line in str(exc).splitlines()
             if line.strip() and not line.strip().startswith(URL_LINE)]
    if not lines:
        return type(exc).__name__
    title, errors, where = lines[0].strip(), [], None
    for line in lines[1:]:
        if line.startswith(" "):  # an error's text, under the location it is about
            errors.append(line.strip() if where is None else f"{where}: {line.strip()}")
            where = None
        else:
            where = line.strip()
    shown = "; ".join(errors[:MAX_ERRORS])
    if len(errors) > MAX_ERRORS:
        shown += f"; and {len(errors) - MAX_ERRORS} more"
    return f"{title}: {shown}" if shown else title


def readable_last_line(exc: BaseException) -> str | None:
    """The line to end the recorded traceback of ``exc`` with, when its own text ends in noise:
    a pydantic ``ValidationError`` raised anywhere in a handler (a model it builds, an API reply
    it parses) ends with a documentation link, and the execution's error, the logs and the pages
    keep the last line. None for every other exception (its last line already says it)."""
    pydantic_core = sys.modules.get("pydantic_core")  # never imported just to look
    if pydantic_core is None or not isinstance(exc, pydantic_core.ValidationError):
        return None
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {pydantic_message(exc)}"


def _type_name(declared: Any) -> str:
    name = getattr(declared, "__qualname__", None)
    return name if isinstance(name, str) else repr(declared)


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
                return self._adapter.dump_python(value, mode="json")
            except ValidationError as exc:
                raise OutputInvalid(
                    f"output of step {self.step!r} does not match its declared type: "
                    f"{pydantic_message(exc)}"
                ) from exc
            except BaseException as exc:  # a validator or serializer is user code: anything
                raise OutputInvalid(
                    f"output of step {self.step!r}: checking it against its declared type "
                    f"{_type_name(self.declared)} raised {type(exc).__name__}: {exc}"
                ) from exc
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
