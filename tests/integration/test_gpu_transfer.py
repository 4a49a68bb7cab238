"""GPU state transfer on a real CUDA device: prefill → decode between two processes on one GPU.

Runs ``bench/gpu_transfer.py --quick`` (NIXL VRAM registration, the agent's pools and transport,
the staged path with both kernels, CUDA IPC; a Qwen3-Next room from prefill TP 1 to decode TP 2
beside its equal-TP room) and checks that every path delivered every byte of every component, and
that staging beats per-page writes on 4 KiB pages. Needs a CUDA GPU: on CPU-only CI
this is the one test that skips, with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs a CUDA GPU")

pytestmark = [
    pytest.mark.nixl,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_every_path_delivers_every_byte_and_staging_beats_per_page_writes(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_transfer.py"), "--quick", "--json", str(out),
         "--min-seconds", "0.05", "--max-reps", "5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {
        "4KiB x 2048", "64MiB x 4", "qwen3-next 1k tok", "deepseek-v3.2 1k tok", "qwen3-next TP1->1 64p",
        "qwen3-next TP1->2 64p",
    }
    for case, row in rows.items():
        paths = {k: v for k, v in row.items() if isinstance(v, dict) and "verified" in v}
        assert len(paths) >= 5, (case, sorted(row))
        for name, result in paths.items():
            assert result["verified"], (case, name, result)
    room = rows["qwen3-next TP1->2 64p"]  # prefill TP 1 -> decode TP 2: compact rows to cuda-ipc
    assert room["equal"] == "qwen3-next TP1->1 64p" and room["writes"] > 10 * room["rows"], room
    assert room["ipc"]["changed_bytes"] == room["bytes"] == sum(room["components"].values())
    small = rows["4KiB x 2048"]
    best_staged = max(v["gbps"] for k, v in small.items() if k.startswith("staged-"))
    assert best_staged > 2 * small["direct"]["gbps"], small
    assert rows["qwen3-next 1k tok"]["policy"] == {"-2": "staged", "-1": "staged", "0": "direct"}
