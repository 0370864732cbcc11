"""Finding executions: the typed filter every face builds (App, CLI, API, pages), and the checks
of what a start may carry to be found by (tags). Pure: no database here.

The filter's parts each map onto one index of ``konduit_executions`` (migration 0024): the id's
start is a range of the primary key, its end a prefix of the reversed text, a tag or an input
field a containment on a GIN index, the key a btree, the time range ``created_at``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from konduit.core.model import ExecutionStatus
from konduit.core.values import MAX_INT
from konduit.core.values import storable as _storable
from konduit.errors import KonduitError, blame, blamed

MAX_TAGS = 32
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 256
MAX_LIMIT = 1000


class SearchError(KonduitError):
    """A search filter (or a start's tags) that cannot mean anything: says which part is at fault."""


def check_tags(tags: Mapping[str, str] | None) -> dict[str, str] | None:
    """The tags of a start, checked: text keys and text values, at most :data:`MAX_TAGS` of
    them, keys up to :data:`MAX_TAG_KEY` characters and values up to :data:`MAX_TAG_VALUE`.
    None (or an empty mapping) is no tags."""
    if tags is None:
        return None
    if not isinstance(tags, Mapping):
        raise SearchError(f"tags are a dict of text to text, not {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise SearchError(f"{len(tags)} tags: at most {MAX_TAGS} per execution")
    out: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not key:
            raise SearchError(f"tag key {key!r}: a tag key is non-empty text")
        if len(key) > MAX_TAG_KEY:
            raise SearchError(f"tag key {key[:20]!r}...: longer than {MAX_TAG_KEY} characters")
        if not isinstance(value, str):
            raise SearchError(
                f"tag {key!r}: its value is text, not {type(value).__name__} ({value!r:.40})")
        if len(value) > MAX_TAG_VALUE:
            raise SearchError(f"tag {key!r}: its value is longer than {MAX_TAG_VALUE} characters")
        if not (_storable(key) and _storable(value)):
            raise SearchError(f"tag {key!r}: text with a NUL character or a lone surrogate "
                              f"cannot be stored")
        out[key] = value
    return out or None


@dataclass(frozen=True)
class ExecutionFilter:
    """What to find. Every part is optional; the parts given must all hold.

    ``id_prefix``: the start of an execution id's text, or its end (UUIDv7 ids made close
    together share their first, time, digits: a pasted tail finds its execution too); hex
    digits with or without the dashes, at least 4. ``idempotency_key``: the exact key.
    ``tags``: each of these tags (``{"customer": "acme"}``). ``input``: the input contains this
    JSON (``{"episode": 42}``: a field; nested objects for nested fields). ``status``: one
    execution status. ``workflow`` and ``version``: of this workflow (and version).
    ``since``/``until``: created at or after / before these moments. ``fair_key``: started
    with this key of its workflow's ``fair_by`` (docs/fairness.md).
    """

    id_prefix: str | None = None
    idempotency_key: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    input: Mapping[str, Any] = field(default_factory=dict)
    status: str | None = None
    workflow: str | None = None
    version: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    fair_key: str | None = None

    def __post_init__(self) -> None:
        # Each fault names its field (KonduitError.field): the faces say which part is wrong.
        if self.status is not None and self.status not in set(ExecutionStatus):
            raise blamed(SearchError(
                f"status {self.status!r}: one of {', '.join(s.value for s in ExecutionStatus)}"),
                "status")
        if self.version is not None and self.workflow is None:
            raise blamed(SearchError("a version is searched with its workflow "
                                     "(workflow@version)"), "version")
        if self.version is not None and (isinstance(self.version, bool)
                                         or not isinstance(self.version, int)
                                         or not 1 <= self.version <= MAX_INT):
            raise blamed(SearchError(f"version {self.version!r}: a whole number from 1 to "
                                     f"{MAX_INT}"), "version")
        with blame("tags"):
            if not isinstance(self.tags, Mapping):
                raise SearchError(
                    f"tags are a dict of text to text, not {type(self.tags).__name__}")
            if self.tags:
                check_tags(self.tags)
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise blamed(SearchError(f"since ({self.since}) is not before until "
                                     f"({self.until})"), "until")
        for name in ("since", "until"):
            moment = getattr(self, name)
            if moment is not None and moment.tzinfo is None:
                raise blamed(SearchError(f"{name} {moment}: give a time zone (an aware "
                                         f"datetime)"), name)
        if self.id_prefix is not None:
            with blame("id_prefix"):
                id_bounds(self.id_prefix)
        for name in ("idempotency_key", "workflow", "fair_key"):
            text = getattr(self, name)
            if text is not None and (not isinstance(text, str) or not _storable(text)):
                raise blamed(SearchError(f"{name} {text!r:.60}: text without NUL characters "
                                         f"or lone surrogates"), name)
        with blame("input"):
            if not isinstance(self.input, Mapping):
                raise SearchError(
                    f"input is a dict of fields to values, not {type(self.input).__name__}")
            try:
                encoded = json.dumps(self.input, allow_nan=False, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise SearchError(f"input: not JSON ({exc})") from None
            if "\\u0000" in encoded or not _storable(encoded):
                raise SearchError("input: a value with a NUL character or a lone surrogate "
                                  "cannot be stored, nor found")

    def params(self) -> dict[str, Any]:
        """The parameters of ``execution_search`` (without the page)."""
        low = high = tail = None
        if self.id_prefix is not None:
            low, high, tail = id_bounds(self.id_prefix)
        return {
            "id_low": low, "id_high": high, "id_tail": tail,
            "idempotency_key": self.idempotency_key,
            "tags": json.dumps(dict(self.tags), separators=(",", ":")) if self.tags else None,
            "input": (json.dumps(self.input, separators=(",", ":"), allow_nan=False)
                      if self.input else None),
            "status": self.status,
            "workflow_name": self.workflow,
            "workflow_version": self.version,
            "since": self.since,
            "until": self.until,
            "fair_key": self.fair_key,
        }

    def query_args(self) -> list[tuple[str, str]]:
        """The filter as URL query arguments (the API's and the pages' names), for links."""
        args: list[tuple[str, str]] = []
        if self.id_prefix:
            args.append(("id", self.id_prefix))
        if self.idempotency_key is not None:
            args.append(("key", self.idempotency_key))
        args += [("tag", f"{k}={v}") for k, v in self.tags.items()]
        args += [("input", f"{path}={json.dumps(v)}") for path, v in _flatten(self.input)]
        if self.status:
            args.append(("status", self.status))
        if self.workflow:
            args.append(("workflow", self.workflow if self.version is None
                         else f"{self.workflow}@{self.version}"))
        if self.since:
            args.append(("since", self.since.isoformat()))
        if self.until:
            args.append(("until", self.until.isoformat()))
        if self.fair_key is not None:
            args.append(("fair_key", self.fair_key))
        return args


_HEX = re.compile(r"^[0-9a-f]+$")
_GROUPS = (8, 4, 4, 4, 12)


def _tail_text(digits: str) -> str:
    """The last ``len(digits)`` hex digits of a uuid's text, with its dashes where they fall."""
    full = digits.rjust(32, "0")
    text = "-".join(full[sum(_GROUPS[:i]):sum(_GROUPS[:i + 1])] for i in range(len(_GROUPS)))
    taken = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] != "-":
            taken += 1
            if taken == len(digits):
                return text[i:]
    return text


def id_bounds(part: str) -> tuple[str, str, str]:
    """For the start or end of an id's text: the lowest and highest ids starting with it (a
    range of the primary key) and the pattern its end matches on the reversed text."""
    digits = part.strip().lower().replace("-", "") if isinstance(part, str) else ""
    if not _HEX.match(digits) or len(digits) > 32:
        raise SearchError(
            f"id {part!r}: the start or end of an execution id (hex digits, dashes optional)")
    if len(digits) < 4:
        raise SearchError(f"id {part!r}: give at least 4 hex digits of the id")
    low = digits.ljust(32, "0")
    high = digits.ljust(32, "f")
    tail = _tail_text(digits)[::-1] + "%"
    return low, high, tail


def _flatten(value: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in value.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out += _flatten(v, path)
        else:
            out.append((path, v))
    return out


def parse_pair(text: str, *, what: str) -> tuple[str, str]:
    """``name=value`` split at its first ``=``; a missing ``=`` or name is an error."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise SearchError(f"{what} {text!r}: write it as name=value")
    return name.strip(), value


def parse_tags(pairs: Sequence[str]) -> dict[str, str]:
    """``["customer=acme", ...]`` as a tags filter."""
    tags: dict[str, str] = {}
    for pair in pairs:
        key, value = parse_pair(pair, what="tag")
        if tags.get(key, value) != value:
            raise SearchError(f"tag {key!r} is given two values ({tags[key]!r}, {value!r}): an "
                              f"execution has one")
        tags[key] = value
    return tags


def parse_input(pairs: Sequence[str]) -> dict[str, Any]:
    """``["episode=42", "input.show.name=x"]`` as an input containment: a dotted path makes
    nested objects (a leading ``input.`` is allowed); the value is JSON when it parses as JSON
    (``42``, ``true``, ``"42"``), else the text itself."""
    out: dict[str, Any] = {}
    for pair in pairs:
        path, raw = parse_pair(pair, what="input field")
        path = path.removeprefix("input.")
        keys = path.split(".")
        if any(not k for k in keys):
            raise SearchError(f"input field {pair!r}: an empty name in the path {path!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise SearchError(f"input field {pair!r}: {k!r} is given a value too")
            node = child
        if isinstance(node.get(keys[-1]), dict):
            raise SearchError(f"input field {pair!r}: {keys[-1]!r} has fields given too")
        node[keys[-1]] = value
    return out


def parse_workflow(text: str) -> tuple[str, int | None]:
    """``name`` or ``name@version``."""
    name, sep, version = text.partition("@")
    if not name:
        raise SearchError(f"workflow {text!r}: write it as name or name@version")
    if not sep:
        return name, None
    if not version.isascii() or not version.isdigit() or not 1 <= int(version) <= MAX_INT:
        raise blamed(SearchError(f"workflow {text!r}: the version after @ is a whole number "
                                 f"from 1 to {MAX_INT}"), "workflow")
    return name, int(version)


def parse_moment(text: str, *, what: str, now: datetime | None = None) -> datetime:
    """A moment for ``since``/``until``: a duration ago (``"1h"``, ``"30m"``, ``"2d"``) or an
    ISO 8601 date-time (naive means local time)."""
    from konduit.core.durations import parse_duration

    value = text.strip()
    try:
        return datetime.fromisoformat(value).astimezone()
    except (ValueError, OverflowError):
        pass
    try:
        ago = parse_duration(value, what=what)
    except KonduitError:
        raise SearchError(f"{what} {text!r}: a duration ago (1h, 30m, 2d) or a date-time "
                          f"(2026-11-30T06:00)") from None
    return (now or datetime.now().astimezone()) - timedelta(seconds=ago)


def search_filter(*, id: str | None = None, key: str | None = None,
                  tags: list[str] | None = None, inputs: list[str] | None = None,
                  status: str | None = None, workflow: str | None = None,
                  since: str | None = None, until: str | None = None,
                  fair_key: str | None = None) -> ExecutionFilter:
    """The filter the text forms of the CLI and the API's query stand for. A fault names the
    parameter at fault (``KonduitError.field``: ``workflow``, ``tag``, ``since``...)."""
    with blame("workflow"):
        name, version = parse_workflow(workflow) if workflow else (None, None)
    with blame("tag"):
        tag_filter = parse_tags(tags or [])
    with blame("input"):
        input_filter = parse_input(inputs or [])
    with blame("since"):
        since_at = None if not since else parse_moment(since, what="since")
    with blame("until"):
        until_at = None if not until else parse_moment(until, what="until")
    try:
        return ExecutionFilter(
            id_prefix=id or None, idempotency_key=key, tags=tag_filter, input=input_filter,
            status=status or None, workflow=name, version=version, since=since_at,
            until=until_at, fair_key=fair_key,
        )
    except KonduitError as exc:  # the filter's field, as the text forms call it
        exc.field = _TEXT_NAMES.get(exc.field or "", exc.field)
        raise


_TEXT_NAMES = {"id_prefix": "id", "idempotency_key": "key", "tags": "tag", "version": "workflow"}
"""The parameters of the text forms (the API's query, the CLI's options) that carry each field
of :class:`ExecutionFilter` under another name."""
