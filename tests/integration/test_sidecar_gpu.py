"""Sidecar mode on a GPU: each engine process allocates its pools in CUDA memory (torch) and hands the
agent CUDA IPC handles; each agent opens them (``cudaIpcOpenMemHandle``) and registers the device memory
with its transport — NIXL (VRAM), or ``cuda-ipc``, which hands the peer agent the engine's own handles
(memory a process opened from a handle has none of its own) — and the bytes move GPU to GPU between the
two agents; the decode engine verifies every component by reading its own device memory.

Runs where torch sees a CUDA device (the H200 machine); elsewhere there is no device memory to share.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig
from dataplane.harness.sidecar_pair import SidecarPair
from dataplane.harness.waiting import wait_for

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("backend", [pytest.param("nixl", marks=pytest.mark.nixl), "cuda-ipc"])
@pytest.mark.parametrize(
    ("profile", "components"),
    [("qwen3-next", {"kv", "aux", "mamba"}), ("deepseek-v3.2", {"kv", "aux", "dsa"})],
)
def test_engine_cuda_pools_imported_by_ipc_and_transferred(tmp_path, profile, components, backend):
    cfg = AgentConfig(
        model=ModelConfig(profile=profile, pool_pages=128, max_requests=8),
        transfer=TransferConfig(timeout_seconds=20, heartbeat_interval_seconds=0.5, device="cuda",
                                backend=backend),
        synthetic=SyntheticConfig(requests_per_second=0, requests=12, tokens=(700, 0, 2048), max_inflight=3),
    )
    with SidecarPair(cfg, tmp_path) as pair:
        decode = pair.engines["decode"]
        assert decode.wait(120) == 0, decode.log_tail() + pair.agents["decode"].log_tail()
        report = decode.report()
        assert report["counts"].get("verified") == 12, report
        assert set(report["components"]) == components
        for name, c in report["components"].items():
            assert c["bytes"] > 0 and c["bad"] == 0, name
        maps = Path(f"/proc/{pair.agents['decode'].proc.pid}/maps").read_text()
        assert "memfd:pdpair" not in maps, "device pools must not fall back to host memory"
        wait_for("prefill done", lambda: pair.engines["prefill"].count("succeeded") == 12, timeout=10)
