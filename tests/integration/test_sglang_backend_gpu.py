"""The sglang backend on a GPU: each sglang rank's pools in CUDA memory, handed to its agent by CUDA IPC
handle (``dataplane.sglang.memory.share``: the allocation holding each pointer, plus the offset), sglang's
``MetadataBuffers`` moved to the device by the plugin's hook, bytes GPU to GPU over NIXL, every byte
verified per component. Prints GB/s per case (rooms' bytes over the wall time of ``move``).

Runs where torch sees a CUDA device (the H200 machine):
``python -m pytest -q -s --noconftest tests/integration/test_sglang_backend_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.disaggregation.base.conn")
pytestmark = [
    pytest.mark.nixl,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from dataplane.config import AgentConfig, ModelConfig, TransferConfig  # noqa: E402
from dataplane.localapi.launch import SidecarPair, wait_for  # noqa: E402
from tests.integration.sglang_rank import FAMILIES, Rank, fill_source, move, plan_room, verify  # noqa: E402

ROOMS, TOKENS = 16, 4096


@pytest.fixture(scope="module")
def plugin():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from dataplane.sglang import hooks

    hooks.force_host_arenas(True)  # no published server args here: the hook acts as with the backend
    yield
    hooks.force_host_arenas(False)


@pytest.mark.parametrize("family", ["qwen3-next", "deepseek-v3.2", "gpt-oss"])
def test_sglang_cuda_pools_through_ipc_verified_with_rate(plugin, tmp_path: Path, family: str):
    fam = dataclasses.replace(FAMILIES[family], kv_pages=ROOMS * TOKENS // 16 + 64)
    transfer = TransferConfig(timeout_seconds=30, heartbeat_interval_seconds=0.5, device="cuda")
    cfg = AgentConfig(model=ModelConfig(profile=None), transfer=transfer)
    pair = SidecarPair(cfg, tmp_path)
    ranks: dict[str, Rank] = {}
    try:
        for role in ("prefill", "decode"):
            pair.start_agent(role)
            sock = Path(pair.cfg[role].localapi.engine.socket_path)
            wait_for(lambda s=sock: s.exists(), timeout=60, what=f"{role} socket")
        for role in ("prefill", "decode"):
            os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg[role].localapi.engine.socket_path
            listen = pair.cfg["prefill"].listen  # the request's bootstrap address: prefill's agent
            ranks[role] = Rank(role, fam, device="cuda", aux_slots=ROOMS + 1,
                               bootstrap_addr=f"{listen.host}:{listen.bootstrap_port}")
        for agent in pair.agents.values():
            agent.wait_ready(120)
        assert all(r.kind == "cuda_ipc" for r in ranks["prefill"].manager.regions)
        rng = np.random.default_rng(1)
        rooms = [plan_room(ranks["prefill"], ranks["decode"], 5000 + i, TOKENS, rng) for i in range(ROOMS)]
        for r in rooms:
            fill_source(ranks["prefill"], r, rng)
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = move(ranks["prefill"], ranks["decode"], rooms, timeout=120)
        wall = time.perf_counter() - start
        assert result == {r.room: (4, "") for r in rooms}, result
        moved: dict[str, int] = {}
        for r in rooms:
            for name, n in verify(ranks["prefill"], ranks["decode"], r).items():
                moved[name] = moved.get(name, 0) + n
        total = sum(moved.values())
        parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(moved.items()))
        print(f"\nsglang pdpair GPU {family}: {ROOMS} rooms x {TOKENS} tokens, "
              f"{total / 1e6:.1f} MB ({parts}) in {wall * 1e3:.1f} ms: {total / wall / 1e9:.2f} GB/s")
    finally:
        for rank in ranks.values():
            rank.close()
        for agent in pair.agents.values():
            agent.stop()
