"""The README's main command, as a newcomer runs it: two real agents, real bytes, every byte checked."""

from __future__ import annotations

import json
import re
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


def test_demo_table_shows_the_aggregate_rate_beside_the_machines_memcpy() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dataplane.cli", "demo", "--requests", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    aggregate = re.search(r"^Aggregate: ([\d,.]+) MB in ([\d.]+) s = ([\d.]+) GB/s", proc.stdout, re.M)
    memcpy = re.search(r"^memcpy on this machine: ([\d.]+) GB/s \(numpy, ([\d,.]+) MB", proc.stdout, re.M)
    assert aggregate and memcpy, proc.stdout
    moved, seconds, rate = (float(g.replace(",", "")) for g in aggregate.groups())
    assert moved > 0 and seconds > 0 and abs(moved / seconds / 1e3 - rate) <= 0.01 + 0.01 * rate
    # Two processes on one host move bytes no faster than one process copies them.
    assert 0 < rate < float(memcpy.group(1))
    assert float(memcpy.group(2).replace(",", "")) >= 67.1  # 64 MiB at least: out of the CPU caches
