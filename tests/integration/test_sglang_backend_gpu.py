"""The sglang backend on a GPU: sglang's own pool classes on CUDA (``sglang_rank.build_pools``), each
rank's pools handed to its agent by CUDA IPC handle (``dataplane.sglang.memory.share``: the allocation
holding each pointer, plus the offset), sglang's ``MetadataBuffers`` moved to the device by the
plugin's hook, bytes GPU to GPU over the ``cuda-ipc`` transport, every byte verified per component.

Prints GB/s per case: the rooms' bytes over the wall time of ``move`` (sglang's sender / receiver calls,
the local API, both agents, the transport; after ``WARM`` rooms that warm the agents' paths, median of
``REPEATS`` rounds of ``ROOMS`` rooms), and beside it the transport's figure for the same layout: the same
schemas (what each agent adopted from sglang's ``KVArgs``) and the same rooms planned by the
planner and written by the ``cuda-ipc`` transport alone between synthetic pools in one process, as
``bench/gpu_ipc.py`` measures it (median of 5, every byte verified).

sglang imports ``sgl_kernel`` (sglang-kernel, compiled for sglang's own torch) at module level wherever
its ``is_cuda()`` holds; where that package cannot be installed (the H200 device: torch 2.11, and the
wheel is 373 MB), ``PDPAIR_SGLANG_CPU_KERNELS=1`` makes sglang's modules load as on a host without
CUDA (``torch.version.cuda`` reads None while this module runs, so ``is_cuda()`` is false and sglang
picks its portable code, exactly the modules the CPU suite imports); the pools are still sglang's own
classes, built with ``device="cuda"``, and nothing here calls a kernel of theirs.

Runs where torch sees a CUDA device (the H200 machine):
``python -m pytest -q -s --noconftest tests/integration/test_sglang_backend_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
CUDA_BUILD = torch.version.cuda
if os.environ.get("PDPAIR_SGLANG_CPU_KERNELS") == "1":
    torch.version.cuda = None  # restored by ``cuda_build`` when the module's tests end
pytest.importorskip("sglang.srt.disaggregation.base.conn")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from dataplane.config import AgentConfig, ModelConfig, TransferConfig  # noqa: E402
from dataplane.harness.sidecar_pair import SidecarPair  # noqa: E402
from dataplane.harness.waiting import wait_for  # noqa: E402
from tests.integration.sglang_rank import (  # noqa: E402
    FAMILIES,
    Rank,
    Room,
    fill_source,
    move,
    plan_room,
    verify,
)

ROOMS, TOKENS, WARM, REPEATS = 16, 4096, 4, 3
ALL_ROOMS = WARM + REPEATS * ROOMS


@pytest.fixture(scope="module", autouse=True)
def cuda_build():
    yield
    torch.version.cuda = CUDA_BUILD


@pytest.fixture(scope="module")
def plugin():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from dataplane.sglang import hooks

    hooks.force_host_arenas(True)  # no published server args here: the hook acts as with the backend
    yield
    hooks.force_host_arenas(False)


def gpu_family(name: str) -> Any:
    """The family with pools for every room of the test (``ALL_ROOMS`` of ``TOKENS`` tokens)."""
    f = FAMILIES[name]
    return dataclasses.replace(f, kv_tokens=ALL_ROOMS * TOKENS + 16 * f.page_size,
                               mamba_slots=ALL_ROOMS + 2 if f.mamba_slots else 0,
                               swa_tokens=(ALL_ROOMS * 4 + 8) * f.page_size if f.swa_tokens else 0)


@pytest.mark.parametrize("family", ["qwen3-next", "deepseek-v3.2", "gpt-oss"])
def test_sglang_cuda_pools_through_ipc_verified_with_rate(plugin, tmp_path: Path, family: str):
    fam = gpu_family(family)
    transfer = TransferConfig(timeout_seconds=60, heartbeat_interval_seconds=0.5, device="cuda",
                              backend="cuda-ipc")
    cfg = AgentConfig(model=ModelConfig(profile=None), transfer=transfer)
    pair = SidecarPair(cfg, tmp_path)
    ranks: dict[str, Rank] = {}
    try:
        for role in ("prefill", "decode"):
            pair.start_agent(role)
            sock = Path(pair.cfg[role].localapi.engine.socket_path)
            wait_for(f"{role} socket", lambda s=sock: s.exists(), timeout=60)
        for role in ("prefill", "decode"):
            os.environ["PDPAIR_AGENT_SOCKET"] = pair.cfg[role].localapi.engine.socket_path
            listen = pair.cfg["prefill"].listen  # the request's bootstrap address: prefill's agent
            ranks[role] = Rank(role, fam, device="cuda", aux_slots=ALL_ROOMS + 1,
                               bootstrap_addr=f"{listen.host}:{listen.bootstrap_port}")
        for agent in pair.agents.values():
            agent.wait_ready(120)
        assert all(r.kind == "cuda_ipc" for r in ranks["prefill"].manager.regions)
        rng = np.random.default_rng(1)
        rounds = [[plan_room(ranks["prefill"], ranks["decode"], 5000 + k * ROOMS + i, TOKENS, rng)
                   for i in range(WARM if k == 0 else ROOMS)] for k in range(REPEATS + 1)]
        walls, moved = [], {}
        for k, rooms in enumerate(rounds):
            for r in rooms:
                fill_source(ranks["prefill"], r, rng)
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = move(ranks["prefill"], ranks["decode"], rooms, timeout=120)
            wall = time.perf_counter() - start
            assert result == {r.room: (4, "") for r in rooms}, result
            per_round: dict[str, int] = {}
            for r in rooms:
                for name, n in verify(ranks["prefill"], ranks["decode"], r).items():
                    per_round[name] = per_round.get(name, 0) + n
            if k:  # round 0 warms up
                walls.append(wall)
                moved = per_round
        wall = statistics.median(walls)
        total = sum(moved.values())
        rooms = rounds[-1]
        synthetic, planned = synthetic_gbps(ranks["prefill"], ranks["decode"], rooms)
        parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(moved.items()))
        rounds_ms = " / ".join(f"{w * 1e3:.1f}" for w in walls)
        print(f"\nsglang pdpair GPU {family}: {ROOMS} rooms x {TOKENS} tokens, "
              f"{total / 1e6:.1f} MB ({parts}) in {wall * 1e3:.1f} ms (rounds {rounds_ms} ms): "
              f"{total / wall / 1e9:.2f} GB/s; "
              f"transport alone, same layout {synthetic:.2f} GB/s ({planned / 1e6:.1f} MB planned)")
    finally:
        for rank in ranks.values():
            rank.close()
        for agent in pair.agents.values():
            agent.stop()


def synthetic_gbps(prefill: Rank, decode: Rank, rooms: list[Room], reps: int = 5) -> tuple[float, int]:
    """The same rooms through the ``cuda-ipc`` transport alone, between synthetic pools of the two
    schemas the agents adopted; GB/s (median of ``reps``: every room written, until the last is done)
    and the bytes per run. Verifies every byte of the last run."""
    from dataplane.planner import PeerLayout, RequestIndices, plan_request
    from dataplane.sglang.layout import layout_from_kvargs
    from dataplane.transports import MemoryRegion, TransferState, Writes
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    mla = prefill.family.pool == "dsa"
    local, peer = (layout_from_kvargs(r.kv_args, model="m", tp_size=1, tp_rank=0, is_mla=mla).schema
                   for r in (prefill, decode))
    lsizes, rsizes = [r.size for r in local.regions()], [r.size for r in peer.regions()]
    loffs, roffs = _offsets(lsizes), _offsets([*rsizes, 0])
    src = torch.randint(0, 256, (_offsets([*lsizes, 0])[-1],), dtype=torch.uint8, device="cuda")
    dst = torch.zeros(roffs[-1], dtype=torch.uint8, device="cuda")
    transport = CudaIpcTransport(0)
    blobs = transport.register(
        [MemoryRegion(src.data_ptr() + o, s, "cuda", 0) for o, s in zip(loffs, lsizes, strict=False)]
        + [MemoryRegion(dst.data_ptr() + o, s, "cuda", 0) for o, s in zip(roffs, rsizes, strict=False)]
    )
    conn = transport.connect("self", transport.endpoint(), blobs)
    nl, writes = len(lsizes), []
    for r in rooms:
        req = RequestIndices.of(r.src_pages, r.dst_pages, r.src_aux, r.dst_aux, r.src_state, r.dst_state)
        p = Writes.of(plan_request(local, PeerLayout.from_schema(peer), req))
        writes.append(Writes(p.local_region, p.local_offset, p.remote_region + nl, p.remote_offset, p.size,
                             p.repeat))
    rates = []
    for _ in range(reps):
        dst.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        transfers = [transport.write(conn, w) for w in writes]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(transport.poll(t) is TransferState.IN_PROGRESS for t in transfers):
                break
        assert all(transport.poll(t) is TransferState.DONE for t in transfers)
        rates.append(sum(w.nbytes for w in writes) / (time.perf_counter() - t0) / 1e9)
    torch.cuda.synchronize()
    for w in writes:
        e = w.expanded()
        for k in range(len(e)):
            a = int(loffs[int(e.local_region[k])] + int(e.local_offset[k]))
            b = int(roffs[int(e.remote_region[k]) - nl] + int(e.remote_offset[k]))
            n = int(e.size[k])
            assert torch.equal(src[a:a + n], dst[b:b + n]), f"synthetic write {k} differs"
    transport.close()
    return statistics.median(rates), sum(w.nbytes for w in writes)


def _offsets(sizes: list[int]) -> list[int]:
    """Each region's offset in one allocation, 256-byte aligned (the last entry: the total with a
    trailing zero size)."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += -(-size // 256) * 256
    return out
