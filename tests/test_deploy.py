"""The systemd units of deploy/systemd: ``systemd-analyze verify`` accepts them (no warning either),
with their ExecStart pointed at this environment's real ``konduit``; the options they pass exist
in the CLI; they keep their hardening; and systemd waits out the worker's drain before it kills.

Skipped, saying so, where ``systemd-analyze`` is missing; ``.ci/run`` sets
``KONDUIT_REQUIRE_SYSTEMD=1``, so there a missing tool fails instead."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from konduit.settings import Settings, variable

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/konduit/venv/bin/konduit"  # where the units expect konduit
WORKER, DASHBOARD = "konduit-worker@.service", "konduit-dashboard.service"
HARDENING = ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "DynamicUser=yes",
             "ProtectHome=yes", "CapabilityBoundingSet=", "RestrictAddressFamilies=",
             "SystemCallFilter=@system-service", "KillSignal=SIGTERM", "RestartSec=")


def konduit_binary() -> Path:
    found = Path(sys.executable).parent / "konduit"
    if not found.exists():
        which = shutil.which("konduit")
        assert which is not None, "the konduit entry point is not installed"
        found = Path(which)
    return found


def analyzer() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("KONDUIT_REQUIRE_SYSTEMD") == "1":
            pytest.fail("systemd-analyze is missing (KONDUIT_REQUIRE_SYSTEMD=1)")
        pytest.skip("systemd-analyze is missing: the units cannot be verified here")
    return tool


def copies(tmp_path: Path, binary: Path) -> Path:
    """The units with ExecStart's konduit replaced by ``binary`` (verify needs it to exist)."""
    for unit in (WORKER, DASHBOARD):
        text = (UNITS / unit).read_text()
        assert INSTALLED in text, unit
        (tmp_path / unit).write_text(text.replace(INSTALLED, str(binary)))
    return tmp_path


def verify(tool: str, folder: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, "verify", "--man=no", *(str(folder / u) for u in units)],
                          capture_output=True, text=True, timeout=120, cwd=folder)


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    tool = analyzer()
    folder = copies(tmp_path, konduit_binary())
    # Two instances of the template (several workers per host) and the dashboard.
    done = verify(tool, folder, "konduit-worker@default.service", "konduit-worker@bulk.service",
                  DASHBOARD)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    tool = analyzer()
    folder = copies(tmp_path, tmp_path / "no-such-konduit")
    done = verify(tool, folder, "konduit-worker@default.service", DASHBOARD)
    assert done.returncode != 0 and "no-such-konduit" in done.stderr, done.stderr
    folder = copies(tmp_path, konduit_binary())
    unit = folder / DASHBOARD
    unit.write_text(unit.read_text().replace("KillSignal=SIGTERM", "KillSignal=SIGTERM\nBogus=1"))
    done = verify(tool, folder, DASHBOARD)
    assert "Unknown key 'Bogus'" in done.stderr, done.stderr


def settings(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


@pytest.mark.parametrize("unit", [WORKER, DASHBOARD])
def test_the_units_are_hardened(unit: str) -> None:
    text = (UNITS / unit).read_text()
    for option in HARDENING:
        assert re.search(rf"^{re.escape(option)}", text, re.MULTILINE), (unit, option)


def test_systemd_waits_out_the_workers_drain() -> None:
    worker = settings(WORKER)
    [exec_start] = worker["ExecStart"]
    args = shlex.split(exec_start)
    grace = float(args[args.index("--shutdown-grace") + 1])
    [stop] = worker["TimeoutStopSec"]
    # The drain, then recording what finished and handing the rest back, before any SIGKILL.
    assert float(stop) >= grace + 10, (stop, grace)
    assert worker["KillMode"] == ["mixed"]  # SIGTERM to the worker, not to its handlers
    assert "KONDUIT_QUEUE=%i" in worker["Environment"]  # the instance name picks the queue


def test_the_options_the_units_pass_exist() -> None:
    for unit, command in ((WORKER, "worker"), (DASHBOARD, "dashboard")):
        [exec_start] = settings(unit)["ExecStart"]
        used = [a for a in shlex.split(exec_start) if a.startswith("--")]
        assert used, unit
        shown = subprocess.run([str(konduit_binary()), command, "--help"], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        for option in used:
            assert option in shown.stdout, (unit, option)


def test_the_environment_example_names_only_real_settings() -> None:
    example = (UNITS / "konduit.env.example").read_text()
    names = set(re.findall(r"^#?(KONDUIT_[A-Z_]+)=", example, re.MULTILINE))
    assert {"KONDUIT_DATABASE_URL", "KONDUIT_APP", "KONDUIT_API_TOKEN"} <= names
    settings = {variable(field) for field in Settings.model_fields}
    units = "".join((UNITS / u).read_text() for u in (WORKER, DASHBOARD))
    for name in names:
        # Read by konduit itself (a declared setting), or used by the units' ExecStart lines.
        assert name in settings or name in units.replace(f"{name}=", ""), name


@pytest.mark.parametrize("unit", ["konduit-worker@.service", "konduit-dashboard.service"])
def test_the_units_document_the_project(unit: str) -> None:
    """Documentation= is the project's page on the package index (the distribution every
    install line names), not a placeholder repository."""
    from konduit.extras import DISTRIBUTION

    assert settings(unit)["Documentation"] == [f"https://pypi.org/project/{DISTRIBUTION}/"]
