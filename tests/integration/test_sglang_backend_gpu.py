"""The sglang backend on a GPU: sglang's own pool classes on CUDA (``sglang_rank.build_pools``), each
rank's pools handed to its agent by CUDA IPC handle (``dataplane.sglang.memory.share``: the allocation
holding each pointer, plus the offset), sglang's ``MetadataBuffers`` moved to the device by the
plugin's hook, bytes GPU to GPU over the ``cuda-ipc`` transport, every byte verified per component.

Prints GB/s per case (a round's bytes over the wall time of ``move``: sglang's sender / receiver
calls, the local API, both agents, the transport; median of ``REPEATS`` rounds of ``ROOMS`` rooms, after
``WARM`` rooms that warm the agents' paths), for pages shuffled as a long-running allocator hands them
out and for pages in order as a fresh one does, and beside it, on the same two layouts (the schemas
each agent adopted from sglang's ``KVArgs``): the synthetic engine through a fresh pair of agents
(``synthetic_engine_gbps``), and the ``cuda-ipc`` transport alone writing the in-order rooms, planned
beforehand, between synthetic pools in one process, as ``bench/gpu_ipc.py`` measures it (median of 5,
every byte verified).

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
import threading
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

from dataplane.config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig  # noqa: E402
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
ALL_ROOMS = WARM + 2 * REPEATS * ROOMS
"""Warm-up rooms, then ``REPEATS`` rounds of ``ROOMS`` rooms with shuffled pages and as many with
pages in order."""


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


@dataclasses.dataclass
class Rounds:
    """Wall time of each timed round and the bytes one round moved, per component."""

    walls: list[float] = dataclasses.field(default_factory=list)
    moved: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return sum(self.moved.values()) / statistics.median(self.walls) / 1e9

    def ms(self) -> str:
        return " / ".join(f"{w * 1e3:.1f}" for w in self.walls)


@pytest.mark.parametrize("family", ["qwen3-next", "deepseek-v3.2", "gpt-oss"])
def test_sglang_cuda_pools_through_ipc_verified_with_rate(plugin, tmp_path: Path, family: str):
    fam = gpu_family(family)
    transfer = TransferConfig(timeout_seconds=60, heartbeat_interval_seconds=0.5, device="cuda",
                              backend="cuda-ipc")
    cfg = AgentConfig(model=ModelConfig(profile=None), transfer=transfer)
    (tmp_path / "sglang").mkdir()
    pair = SidecarPair(cfg, tmp_path / "sglang")
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
        ids = iter(range(5000, 5000 + ALL_ROOMS))

        def rounds(count: int, size: int) -> list[list[Room]]:
            p, d = ranks["prefill"], ranks["decode"]
            return [[plan_room(p, d, next(ids), TOKENS, rng) for _ in range(size)] for _ in range(count)]

        for rank in ranks.values():
            fresh_allocators(rank)
        in_order = rounds(REPEATS, ROOMS)  # pages as a fresh allocator hands them out: runs coalesce
        for rank in ranks.values():
            for free in rank.free.values():
                rng.shuffle(free)
        run_rounds(ranks, rounds(1, WARM), rng)  # warms up the agents' paths
        shuffled = run_rounds(ranks, rounds(REPEATS, ROOMS), rng)
        ordered = run_rounds(ranks, in_order, rng)
        schemas = {role: adopted_schema(rank) for role, rank in ranks.items()}
        transport, planned = synthetic_gbps(ranks["prefill"], ranks["decode"], in_order[-1])
    finally:
        for rank in ranks.values():
            rank.close()
        for agent in pair.agents.values():
            agent.stop()
    engine = synthetic_engine_gbps(schemas, transfer, tmp_path / "synthetic")
    parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(shuffled.moved.items()))
    print(f"\nsglang pdpair GPU {family}: rounds of {ROOMS} rooms x {TOKENS} tokens, "
          f"{sum(shuffled.moved.values()) / 1e6:.1f} MB ({parts}); "
          f"sglang shuffled pages {shuffled.gbps:.2f} GB/s ({shuffled.ms()} ms), "
          f"sglang pages in order {ordered.gbps:.2f} GB/s ({ordered.ms()} ms); "
          f"synthetic engine, same layout {engine:.2f} GB/s; "
          f"transport alone, pages in order {transport:.2f} GB/s ({planned / 1e6:.1f} MB planned)")


def fresh_allocators(rank: Rank) -> None:
    """Every pool's free list in ascending order, as sglang's allocators start out."""
    rank.free["kv"] = list(range(rank.family.kv_pages))
    for comp in rank.states:
        rank.free[comp.state_type] = list(range(comp.tensors[0].num_items))


def run_rounds(ranks: dict[str, Rank], rounds: list[list[Room]], rng: np.random.Generator) -> Rounds:
    """Each round: fill its sources, move it (timed), verify every byte of every room."""
    out = Rounds()
    for rooms in rounds:
        for r in rooms:
            fill_source(ranks["prefill"], r, rng)
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = move(ranks["prefill"], ranks["decode"], rooms, timeout=120)
        out.walls.append(time.perf_counter() - start)
        assert result == {r.room: (4, "") for r in rooms}, result
        out.moved = {}
        for r in rooms:
            for name, n in verify(ranks["prefill"], ranks["decode"], r).items():
                out.moved[name] = out.moved.get(name, 0) + n
    return out


def adopted_schema(rank: Rank) -> Any:
    """The schema the rank's agent adopted from its ``KVArgs``."""
    from dataplane.sglang.layout import layout_from_kvargs

    return layout_from_kvargs(rank.kv_args, model="m", tp_size=1, tp_rank=0,
                              is_mla=rank.family.pool == "dsa").schema


def synthetic_engine_gbps(schemas: dict[str, Any], transfer: TransferConfig, workdir: Path) -> float:
    """The synthetic engine on the same two layouts, through a fresh pair of agents over the same
    transport: ``WARM`` rooms, then ``REPEATS * ROOMS`` rooms of ``TOKENS`` tokens, ``ROOMS`` in flight;
    decode's bytes over its window. Its allocators hand out pages in order; it neither fills nor
    verifies (its content is written from the host, which would be in the window)."""
    from dataplane.synthetic_engine.process import SyntheticEngineProcess

    requests = WARM + REPEATS * ROOMS
    cfg = AgentConfig(model=ModelConfig(profile=None), transfer=transfer,
                      synthetic=SyntheticConfig(requests_per_second=0, warmup=WARM, verify=False))
    workdir.mkdir()
    pair = SidecarPair(cfg, workdir)
    engines: dict[str, SyntheticEngineProcess] = {}
    stop = {role: threading.Event() for role in ("prefill", "decode")}
    threads = []
    try:
        for role in ("prefill", "decode"):
            pair.start_agent(role)
            sock = Path(pair.cfg[role].localapi.engine.socket_path)
            wait_for(f"{role} socket", lambda s=sock: s.exists(), timeout=60)
            engines[role] = SyntheticEngineProcess(pair.cfg[role], str(sock), schema=schemas[role],
                                                   room_base=1 << 30)
            engines[role].verify_rooms = False
        for role, engine in engines.items():
            threads.append(threading.Thread(target=engine.run, args=(stop[role],), daemon=True, kwargs={
                "requests": requests, "tokens": (TOKENS,), "max_inflight": ROOMS}))
            threads[-1].start()
        for agent in pair.agents.values():
            agent.wait_ready(120)
        threads[1].join(120)
        summary = engines["decode"].summary()
        assert summary["counts"].get("succeeded") == requests, summary
        return summary["bytes"] / summary["window_seconds"] / 1e9
    finally:
        for event in stop.values():
            event.set()
        for thread in threads:
            thread.join(30)
        for engine in engines.values():
            engine.close()
        for agent in pair.agents.values():
            agent.stop()


def synthetic_gbps(prefill: Rank, decode: Rank, rooms: list[Room], reps: int = 5) -> tuple[float, int]:
    """The same rooms through the ``cuda-ipc`` transport alone, between synthetic pools of the two
    schemas the agents adopted; GB/s (median of ``reps``: every room written, until the last is done)
    and the bytes per run. Verifies every byte of the last run."""
    from dataplane.planner import PeerLayout, RequestIndices, plan_request
    from dataplane.transports import MemoryRegion, TransferState, Writes
    from dataplane.transports.cuda_ipc import CudaIpcTransport

    local, peer = adopted_schema(prefill), adopted_schema(decode)
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
