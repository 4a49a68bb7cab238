"""The operator and agent images, built from the Dockerfile and run, with no Docker engine and no registry:
hack/images.sh builds them with buildah on a Debian base made by mmdebstrap, then runs
`pdpair-operator --version` and `pdpair-agent demo` inside them as uid 65532 (docs/images.md).

Cold (no cache under ~/.cache/pdpair/images) the build takes minutes; warm, an unchanged checkout reuses
every layer and an edited one reinstalls the project from pip's cache and recompiles the room path."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "images.sh"
BUILD_TIMEOUT = 2400
pytestmark = [pytest.mark.slow, pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 600)]


def images(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built() -> None:
    proc = images("build", "operator", "agent", timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-6000:]


def test_operator_image_runs_the_installed_operator(built: None) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = images("run", "operator", "--version", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"pdpair-operator {version}", proc.stdout


def test_agent_image_runs_the_demo_compiled_every_byte_verified(built: None) -> None:
    """Two agents in the image move a model's state over NIXL and check every byte, running the room
    path that the image compiled in place (mypyc) and NIXL from the wheel the image installed."""
    proc = images("run", "agent", "demo", "--requests", "30", timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = re.findall(r"^(kv|aux|mamba)\s+\S+\s+(\d+)\s+([\d,]+)\s+(yes|NO)\s", proc.stdout, re.M)
    assert {r[0] for r in rows} == {"kv", "aux", "mamba"}, proc.stdout
    for component, requests, moved, verified in rows:
        assert verified == "yes" and int(requests) > 0 and int(moved.replace(",", "")) > 0, component
    assert "30/30 requests succeeded" in proc.stdout, proc.stdout
    assert "Agents' room path: compiled (mypyc)." in proc.stdout, proc.stdout


def test_an_unknown_target_is_one_clear_line() -> None:
    proc = images("build", "agent-gpu", timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip().splitlines() == [
        "images: unknown target 'agent-gpu': one of operator agent agent-cuda "
        "(others build on CI: docs/images.md)"
    ], proc.stderr
