"""The README's main command, as a newcomer runs it: two real agents, real bytes, every byte checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nixl, pytest.mark.slow]
FIELDS = {"component", "state_type", "requests", "bytes", "verified", "gbps", "p50_ms", "p99_ms"}


@pytest.mark.parametrize(
    ("profile", "components"),
    [("qwen3-next", {"kv", "aux", "mamba"}), ("gpt-oss", {"kv", "aux", "swa"})],
)
def test_demo_json_reports_every_component_verified(profile: str, components: set[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dataplane.cli", "demo", "--profile", profile, "--requests", "30", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert {r["component"] for r in rows} == components
    for row in rows:
        assert set(row) == FIELDS
        assert row["verified"] is True and row["bytes"] > 0 and row["requests"] > 0
        assert row["p99_ms"] >= row["p50_ms"] > 0
        assert row["gbps"] > 0 or row["bytes"] < 1_000_000  # aux: a few KB round to 0.0000 GB/s
