"""The executions list's search form: the search as typed, kept in the URL (so a search is a
link: shared, bookmarked, paged, refreshed), and the filter it stands for."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from konduit.core.search import ExecutionFilter, search_filter


@dataclass(frozen=True)
class SearchText:
    """The search fields as typed (empty ones dropped); ``tags`` and ``inputs`` repeat."""

    id: str = ""
    key: str = ""
    tags: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    since: str = ""
    until: str = ""
    fair_key: str = ""

    @classmethod
    def of(cls, *, id: str | None, key: str | None, tag: list[str] | None,
           input: list[str] | None, since: str | None, until: str | None,
           fair_key: str | None = None) -> SearchText:
        return cls(id=(id or "").strip(), key=key or "",
                   tags=tuple(t for t in tag or [] if t.strip()),
                   inputs=tuple(i for i in input or [] if i.strip()),
                   since=(since or "").strip(), until=(until or "").strip(),
                   fair_key=fair_key or "")

    def filter(self, *, status: str | None, workflow: str | None) -> ExecutionFilter:
        """The filter, with the list's own status and workflow (``name`` or ``name@version``);
        raises :class:`konduit.SearchError` naming a bad part."""
        return search_filter(id=self.id or None, key=self.key or None, tags=list(self.tags),
                             inputs=list(self.inputs), status=status, workflow=workflow,
                             since=self.since or None, until=self.until or None,
                             fair_key=self.fair_key or None)

    def more_args(self) -> str:
        """``&id=...&tag=...`` of the fields given (to follow a link's own arguments), or ""."""
        args = [("id", self.id), ("key", self.key), *(("tag", t) for t in self.tags),
                *(("input", i) for i in self.inputs), ("since", self.since),
                ("until", self.until), ("fair_key", self.fair_key)]
        kept = [(k, v) for k, v in args if v]
        return "&" + urlencode(kept) if kept else ""
