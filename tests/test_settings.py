"""Every ``KONDUIT_*`` variable the package reads is a field of ``konduit.settings.Settings``,
and what restates a setting's default (the worker's config, the command line) takes it from
there."""

from __future__ import annotations

import os
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
import typer

import konduit
from konduit.errors import SettingsError
from konduit.settings import Settings, default, described, settings, variable
from konduit.worker.config import WorkerConfig

ROOT = Path(konduit.__file__).parent
VARIABLE = re.compile(r"\bKONDUIT_[A-Z][A-Z0-9_]*\b")


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``KONDUIT_*`` variable set: every setting at its declared default."""
    for name in list(os.environ):
        if name.upper().startswith("KONDUIT_"):
            monkeypatch.delenv(name)


def package_variables() -> dict[str, list[str]]:
    """Each ``KONDUIT_*`` name written anywhere in the package's source, with where."""
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*")):
        if path.suffix not in (".py", ".sql", ".html", ".js") or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in VARIABLE.findall(line):
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_every_variable_the_package_names_is_a_declared_setting() -> None:
    declared = {variable(name) for name in Settings.model_fields}
    named = package_variables()
    assert len(named) >= 10, sorted(named)  # the scan does find them
    missing = {name: where[:3] for name, where in named.items() if name not in declared}
    assert not missing, f"KONDUIT_* variables read but not declared in konduit.settings: {missing}"


def test_nothing_but_the_settings_reads_a_konduit_variable_from_the_environment() -> None:
    """``os.environ.get("KONDUIT_...")`` outside settings.py would be a second, unchecked
    reading of a variable: the settings are the one place (the command line's ``envvar=`` names
    come from :func:`konduit.settings.variable`)."""
    direct = re.compile(r"(environ(\.get)?[\[(]|getenv\()\s*[\"']KONDUIT_")
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "settings.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if direct.search(line) or re.search(r"envvar=\s*[\"']", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, found


def test_every_setting_is_described() -> None:
    for name, info in Settings.model_fields.items():
        assert info.description and len(info.description) > 20, name


def test_the_environment_is_read_at_the_moment_of_use(
        bare: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings().poll_interval == default("poll_interval") == 1.0
    monkeypatch.setenv("KONDUIT_POLL_INTERVAL", "0.25")
    monkeypatch.setenv("KONDUIT_DATABASE_POOLED", "off")
    monkeypatch.setenv("KONDUIT_EVENT_RETENTION", "90m")
    monkeypatch.setenv("KONDUIT_HOME", "~/konduit-home")
    now = settings()
    assert (now.poll_interval, now.database_pooled, now.event_retention) == (0.25, False, 5400)
    assert now.home == Path("~/konduit-home").expanduser()
    assert WorkerConfig().poll_interval == 0.25
    monkeypatch.setenv("KONDUIT_POLL_INTERVAL", "")  # empty is unset
    assert settings().poll_interval == 1.0
    assert settings() is settings()  # made again only when a variable changed


def test_a_variable_that_cannot_be_read_is_named(
        bare: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KONDUIT_LEASE_SECONDS", "soon")
    monkeypatch.setenv("KONDUIT_DATABASE_POOLED", "maybe")
    with pytest.raises(SettingsError) as raised:
        settings()
    message = str(raised.value)
    assert "KONDUIT_LEASE_SECONDS must be a number of seconds, not 'soon'" in message
    assert "KONDUIT_DATABASE_POOLED must be 1 or 0" in message
    assert isinstance(raised.value, konduit.KonduitError) and isinstance(raised.value, ValueError)
    with pytest.raises(SettingsError, match="KONDUIT_LEASE_SECONDS"):
        WorkerConfig()
    monkeypatch.delenv("KONDUIT_DATABASE_POOLED")
    monkeypatch.setenv("KONDUIT_LEASE_SECONDS", "30")
    assert WorkerConfig().lease_seconds == 30.0


def test_the_worker_configs_defaults_are_the_settings(bare: None) -> None:
    config = WorkerConfig()
    from_settings = [f.name for f in fields(WorkerConfig) if f.name in Settings.model_fields]
    assert len(from_settings) >= 10
    for name in from_settings:
        assert getattr(config, name) == default(name), name
    # None left with a fixed default that a variable sets.
    fixed = {f.name for f in fields(WorkerConfig) if f.default is not MISSING}
    assert not fixed & set(Settings.model_fields)


def _options(command_name: str) -> dict[str, Any]:
    from konduit.cli import command_tree

    tree = command_tree()
    ctx = typer.Context(tree, info_name="konduit")
    command = tree.get_command(ctx, command_name)
    return {p.name: p for p in command.params}


def test_the_worker_commands_defaults_are_the_configs_and_the_settings(bare: None) -> None:
    options = _options("worker")
    config = WorkerConfig()
    fields_of_config = {f.name for f in fields(WorkerConfig)}
    for name, option in options.items():
        if name in Settings.model_fields and name in fields_of_config and option.envvar is None:
            # Left unset, so WorkerConfig reads the setting; the help shows where it comes from.
            assert option.default is None, name
            assert described(name) in (option.help or ""), (name, option.help)
            assert getattr(config, name) == default(name)
        elif name in fields_of_config - {"queues", "shutdown_grace"}:
            assert option.default == getattr(config, name), name
    assert options["queue"].default is None and config.queues == ("default",)
    assert "(default: default)" in options["queue"].help
    assert "(default: 10)" in options["shutdown_grace"].help
    assert options["shutdown_grace"].default is None and config.shutdown_grace == 10.0


def test_every_variable_the_command_line_reads_is_a_setting_with_its_default() -> None:
    from konduit.cli import command_tree

    def walk(command: Any, ctx: Any) -> list[Any]:
        found = list(command.params)
        for name in getattr(command, "list_commands", lambda ctx: [])(ctx):
            child = command.get_command(ctx, name)
            found += walk(child, typer.Context(child, info_name=name, parent=ctx))
        return found

    tree = command_tree()
    seen = set()
    for param in walk(tree, typer.Context(tree, info_name="konduit")):
        if param.envvar is None:
            continue
        field = param.envvar.removeprefix("KONDUIT_").lower()
        assert field in Settings.model_fields, param.envvar
        # None: the setting decides when the option is used (read_max_lag, read_database_url).
        assert param.default in (None, default(field)), (param.name, param.default)
        seen.add(param.envvar)
    assert {"KONDUIT_APP", "KONDUIT_LOG_FORMAT", "KONDUIT_READ_MAX_LAG",
            "KONDUIT_WORKER_METRICS_PORT"} <= seen


def test_the_help_of_a_default_reads_the_settings() -> None:
    assert described("poll_interval") == "$KONDUIT_POLL_INTERVAL or 1"
    assert described("lease_seconds") == "$KONDUIT_LEASE_SECONDS or 15"
    assert described("worker_metrics_port") == "$KONDUIT_WORKER_METRICS_PORT or none"


def test_the_readmes_configuration_table_lists_every_setting() -> None:
    readme = (ROOT.parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Configuration"):]
    section = section[:section.index("\n## ", 1)]
    rows = {name for line in section.splitlines() if line.startswith("|")
            for name in VARIABLE.findall(line.split("|")[1])}
    assert rows == {variable(name) for name in Settings.model_fields}
