"""MoriTransport's own logic, against the MoRI hardware test double: batching per region pair, transfer
uids, status polling with a deadline, peer-failure popping, and the double's wire layouts against
mori 1.2.4's real blobs (the golden vectors)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from codec_vectors import VECTORS

from dataplane.errors import DeadlineExceeded, PeerGone, TransferFailed, WireFormatError
from dataplane.transports import MemoryRegion, TransferState, Writes, mori_double
from dataplane.transports.blocks import block_indices, block_size, layout
from dataplane.transports.mori import MoriTransport


@pytest.fixture
def setup() -> Iterator[tuple[MoriTransport, Any, list[np.ndarray], list[np.ndarray], str]]:
    keys = [f"{r}-{uuid.uuid4().hex[:6]}" for r in ("a", "b")]
    me, far = (MoriTransport(k, "127.0.0.1", sdk=mori_double) for k in keys)
    src = [np.arange(n, dtype=np.uint32).view(np.uint8)[:n].copy() for n in (4096, 8192)]
    dst = [np.zeros(n, dtype=np.uint8) for n in (4096, 8192)]
    me.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in src])
    peer = me.connect("b", far.endpoint(), far.register([MemoryRegion(b.ctypes.data, b.nbytes) for b in dst]))
    yield me, peer, src, dst, keys[1]
    me.close()
    far.close()


def w(lr: list[int], lo: list[int], rr: list[int], ro: list[int], n: list[int]) -> Writes:
    return Writes(np.array(lr, np.int32), np.array(lo), np.array(rr, np.int32), np.array(ro), np.array(n))


def test_one_group_per_region_pair_with_its_own_uid(setup: Any) -> None:
    me, peer, src, dst, _ = setup
    t = me.write(peer, w([0, 1, 0, 0], [0, 0, 64, 128], [1, 0, 1, 0], [0, 0, 64, 256], [32, 16, 32, 8]))
    me.wait(t, time.monotonic() + 1)
    (ldescs, loffs, rdescs, roffs, sizes, uids), = mori_double.engine(me._engine.key).batch_calls
    local_ids, remote_ids = [d.id for d in me._descs], [d.id for d in peer.descs]
    assert [(d.id, r.id) for d, r in zip(ldescs, rdescs, strict=True)] == [
        (local_ids[0], remote_ids[0]), (local_ids[0], remote_ids[1]), (local_ids[1], remote_ids[0])]
    assert loffs == [[128], [0, 64], [0]] and roffs == [[256], [0, 64], [0]]
    assert sizes == [[8], [32, 32], [16]]
    assert len(set(uids)) == 3
    assert np.array_equal(dst[1][:96], np.r_[src[0][:32], np.zeros(32, np.uint8), src[0][64:96]])


def test_a_compact_plan_goes_as_each_pairs_offset_lists(setup: Any) -> None:
    """Entries standing for 4 and 3 writes (``Writes.repeat``), and a plain one: each region pair's
    group carries every write's offsets, worked out from the counts and strides, in entry order."""
    me, peer, src, dst, _ = setup
    rep = np.array([[4, 1, 3], [64, 0, 32], [16, 0, 128]], np.int64)
    compact = Writes(np.array([0, 1, 0], np.int32), np.array([0, 8, 512]), np.array([0, 1, 0], np.int32),
                     np.array([1024, 0, 2048]), np.array([16, 8, 32]), rep)
    assert me.takes_strided
    t = me.write(peer, compact)
    me.wait(t, time.monotonic() + 1)
    assert t.count == 8
    (_, loffs, _, roffs, sizes, _), = mori_double.engine(me._engine.key).batch_calls
    assert loffs == [[0, 64, 128, 192, 512, 544, 576], [8]]
    assert roffs == [[1024, 1040, 1056, 1072, 2048, 2176, 2304], [0]]
    assert sizes == [[16] * 4 + [32] * 3, [8]]
    for lo, ro, n in zip(loffs[0], roffs[0], sizes[0], strict=True):
        assert np.array_equal(dst[0][ro : ro + n], src[0][lo : lo + n])


def test_stuck_transfer_hits_the_deadline(setup: Any) -> None:
    me, peer, _, _, far_key = setup
    mori_double.engine(far_key).frozen = True
    t = me.write(peer, w([0], [0], [0], [0], [16]))
    assert me.poll(t) is TransferState.IN_PROGRESS
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        me.wait(t, t0 + 0.05)
    assert time.monotonic() - t0 < 0.5 and t.state is TransferState.FAILED and not t.statuses


def test_peer_failure_is_popped_into_peer_gone(setup: Any) -> None:
    me, peer, _, _, far_key = setup
    mori_double.engine(far_key).kill()
    t = me.write(peer, w([0], [0], [0], [0], [16]))
    assert me.poll(t) is TransferState.FAILED and isinstance(t.error, PeerGone)
    with pytest.raises(PeerGone):
        me.write(peer, w([0], [0], [0], [0], [16]))


def test_engine_error_status_is_transfer_failed(setup: Any) -> None:
    me, peer, *_ = setup
    mori_double.engine(me._engine.key).deregister_remote_engine(peer.engine)
    t = me.write(peer, w([0], [0], [0], [0], [16]))
    with pytest.raises(TransferFailed, match="unreachable"):
        me.wait(t, time.monotonic() + 1)


def test_memory_of_another_engine_is_refused(setup: Any) -> None:
    me, _, _, _, _ = setup
    other = MoriTransport(f"c-{uuid.uuid4().hex[:6]}", "127.0.0.1", sdk=mori_double)
    buf = np.zeros(64, np.uint8)
    blobs = other.register([MemoryRegion(buf.ctypes.data, 64)])
    with pytest.raises(WireFormatError):
        me.connect("x", me.endpoint(), blobs)
    other.close()


def _vectors() -> list[tuple[str, bytes]]:
    regs = VECTORS["registration"]
    out = []
    for r in regs:
        i = r["inputs"]
        out.append(("engine", bytes.fromhex(i["engine_desc"])))
        for h in i["kv_mem_descs"] + i["aux_mem_descs"] + [x for comp in i["state_mem_descs"] for x in comp]:
            out.append(("memory", bytes.fromhex(h)))
    return out


@pytest.mark.parametrize(("kind", "blob"), _vectors())
def test_double_packs_mori_1_2_4_layouts_byte_for_byte(kind: str, blob: bytes) -> None:
    cls = mori_double.EngineDesc if kind == "engine" else mori_double.MemoryDesc
    desc = cls.unpack(blob)
    assert desc.pack() == blob


def test_double_registers_with_mori_field_values() -> None:
    eng = mori_double.IOEngine(f"d-{uuid.uuid4().hex[:6]}", mori_double.IOEngineConfig("127.0.0.1", 1))
    cpu = eng.register_memory(4096, 64, -1, mori_double.MemoryLocationType.CPU)
    gpu = eng.register_memory(8192, 64, 0, mori_double.MemoryLocationType.GPU)
    assert (cpu.device_id, cpu.device_bus_id, cpu.loc) == (-1, "", 0)
    assert (gpu.device_id, gpu.loc, len(gpu.ipc_handle), gpu.vpod_id) == (0, 1, 64, -1)


def test_block_plan_indices() -> None:
    writes = w([0, 1], [8192, 0], [1, 0], [0, 4096], [8192, 4096])
    sizes = np.array([16384, 8192])
    g = block_size(writes, sizes, sizes, 1 << 20)
    assert g == 4096
    bases = layout(sizes, np.array([True, True]), g)
    assert bases.tolist() == [0, 4]
    local = block_indices(writes.local_region, writes.local_offset, writes.size, bases, g)
    remote = block_indices(writes.remote_region, writes.remote_offset, writes.size, bases, g)
    assert local.tolist() == [2, 3, 4] and remote.tolist() == [4, 5, 1]
    assert block_size(w([0], [1], [0], [0], [1]), sizes, sizes, 1000) is None


def test_a_shared_transfer_is_aborted_only_by_its_last_holder(setup: Any) -> None:
    """Rooms carried by one engine request (the prefill's coalescing) let go one by one: the
    request keeps running for the others until the last one releases it."""
    me, peer, _, _, far_key = setup
    mori_double.engine(far_key).frozen = True
    t = me.write(peer, w([0, 1], [0, 0], [0, 1], [0, 0], [16, 16]))
    t.holders = 2
    me.release(t)
    assert t.state is TransferState.IN_PROGRESS and t.error is None
    me.release(t)
    assert t.state is TransferState.FAILED and "aborted" in str(t.error)
