"""The staged path through the agent glue and real NIXL, in host memory (runs anywhere, no GPU).

Prefill and decode each hold ``MemoryPools`` allocated as one arena plus a registered staging
buffer; a real model plan is split by the policy, the direct part written per component through
``NixlTransport``, the staged part gathered, written slot by slot, noticed, scattered and
acknowledged. Every planned byte must land, and nothing else may change.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from dataplane.agent.pools import MemoryPools
from dataplane.agent.staged import StagedLanding, StagedWriter
from dataplane.config import NixlConfig
from dataplane.planner import PeerLayout, RequestIndices, plan_request
from dataplane.schema.profiles import profile
from dataplane.staging import HostStager, SlotPool
from dataplane.transports import MemoryRegion, TransferState
from dataplane.transports.nixl import NixlTransport
from tests.integration.test_transport_conformance import ucx_env

pytestmark = pytest.mark.nixl

SLOTS, SLOT_BYTES = 3, 32 << 10


def side(name: str, schema):  # type: ignore[no-untyped-def]
    pools = MemoryPools.allocate(schema, arena=True)
    staging = np.zeros(SLOTS * SLOT_BYTES, np.uint8)
    with ucx_env(NixlConfig(ucx_net_devices="lo")):
        transport = NixlTransport(f"{name}-{uuid.uuid4().hex[:6]}", NixlConfig(ucx_net_devices="lo"))
    regions = [*pools.memory_regions(), MemoryRegion(staging.ctypes.data, staging.nbytes)]
    return pools, staging, transport, transport.register(regions)


def test_staged_and_direct_parts_deliver_every_planned_byte() -> None:
    schema = profile("qwen3-next").schema(pool_pages=32, max_requests=4, layers=8)
    p_pools, p_staging, p_tx, _ = side("prefill", schema)
    d_pools, d_staging, d_tx, d_blobs = side("decode", schema)
    try:
        rng = np.random.default_rng(5)
        p_pools.arena[:] = rng.integers(0, 256, p_pools.arena.nbytes, dtype=np.uint8)
        before = d_pools.arena.copy()
        peer = p_tx.connect("decode", d_tx.endpoint(), d_blobs)
        src, dst = rng.permutation(32)[:11], rng.permutation(32)[:11]
        req = RequestIndices.of(src, dst, 0, 3, [[1]], [[2]])
        plan = plan_request(schema, PeerLayout.from_schema(schema), req)
        sizes = np.array([r.size for r in schema.regions()], np.int64)
        to_decode: list[bytes] = []
        to_prefill: list[bytes] = []
        n = len(sizes)
        writer = StagedWriter(
            p_tx, peer, HostStager(p_pools.arena, p_staging), SlotPool(SLOTS, SLOT_BYTES, p_staging),
            staging_region=n, landing_region=n, bases=p_pools.bases, sizes=sizes, send=to_decode.append,
            threshold=256 << 10,
        )
        landing = StagedLanding(HostStager(d_pools.arena, d_staging), SlotPool(SLOTS, SLOT_BYTES, d_staging),
                                bases=d_pools.bases, sizes=sizes, send=to_prefill.append)
        direct = writer.route(9, plan)
        assert set(direct.component.tolist()) == {0}, "mamba slots (1 MiB mean) direct, KV pages staged"
        transfers = [p_tx.write(peer, direct)]
        deadline = time.monotonic() + 30
        while not writer.done(9) or any(p_tx.poll(t) is TransferState.IN_PROGRESS for t in transfers):
            assert time.monotonic() < deadline, "staged transfer did not finish"
            writer.step()
            while to_decode:
                landing.on_message(to_decode.pop(0))
            landing.step()
            while to_prefill:
                assert writer.on_message(to_prefill.pop(0)) == 9
        assert all(t.state is TransferState.DONE for t in transfers)
        assert landing.completed() == [9]
        expected = before.copy()
        for lr, lo, rr, ro, size, _ in plan.rows():
            a, b = p_pools.bases[lr] + lo, d_pools.bases[rr] + ro
            expected[b:b + size] = p_pools.arena[a:a + size]
        assert np.array_equal(d_pools.arena, expected)
        assert writer.sender.pool.available == SLOTS
        assert len(writer.sender.finished) > SLOTS, "more pieces than slots: slots were reused"
    finally:
        p_tx.close()
        d_tx.close()
