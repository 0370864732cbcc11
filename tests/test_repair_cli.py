"""`konduit repair` through the real CLI and a real worker process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.workers import ROOT, spawn_worker, stop_workers, worker_environment

pytestmark = [pytest.mark.storage, pytest.mark.slow]

CLI = [sys.executable, "-m", "konduit.cli"]


def test_repair_replaces_the_degraded_output_and_status_shows_both_versions(db_url, tmp_path):
    healed = tmp_path / "healed"
    env = worker_environment(KONDUIT_TEST_HEALED=str(healed))
    common = ["--app", "tests.apps.repair_app:app", "--database-url", db_url]
    worker = spawn_worker("tests.apps.repair_app:app", db_url, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = subprocess.run([*CLI, "start", "repair-cli", *common, "--wait", "--timeout", "30"],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
        execution_id = started.stdout.split()[0]
        assert "fallback.png" in started.stdout
        healed.write_text("ok")
        repaired = subprocess.run([*CLI, "repair", execution_id, *common, "--wait",
                                   "--timeout", "30"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert "re-running cover_image, publish" in repaired.stdout
        assert "real.png" in repaired.stdout
        status = subprocess.run([*CLI, "status", execution_id, "--json", "--database-url", db_url],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        data = json.loads(status.stdout)
        assert data["output"] == {"image": "real.png"}
        versions = data["output_versions"]
        assert [v["output"]["image"] for v in versions] == ["fallback.png", "real.png"]
        assert versions[0]["degraded"] == ["cover_image"]
    finally:
        stop_workers([worker], timeout=30)
