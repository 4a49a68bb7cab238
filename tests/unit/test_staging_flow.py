"""The staged path's sender and receiver, end to end in host memory: a model plan, small slots,
back-pressure, every byte landing where the plan says, and bad notices refused."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.errors import WireFormatError
from dataplane.planner import PeerLayout, RequestIndices, WritePlan, plan_request
from dataplane.schema.profiles import profile
from dataplane.staging import (
    HostStager,
    SlotPool,
    StagedAck,
    StagedNotice,
    StagedReceiver,
    StagedSender,
    decode_staged,
    encode_staged,
    pieces_of,
)

ALIGN = 1 << 16


def arena_for(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    padded = (sizes + ALIGN - 1) // ALIGN * ALIGN
    return np.cumsum(padded) - padded, np.zeros(int(padded.sum()), dtype=np.uint8)


def model_plan() -> tuple[WritePlan, np.ndarray]:
    schema = profile("deepseek-v3.2").schema(pool_pages=32, max_requests=4, layers=3)
    rng = np.random.default_rng(3)
    src, dst = rng.permutation(32)[:9], rng.permutation(32)[:9]
    req = RequestIndices.of(src, dst, 1, 2, [src], [dst])
    plan = plan_request(schema, PeerLayout.from_schema(schema), req)
    return plan, np.array([r.size for r in schema.regions()], dtype=np.int64)


def run(
    plan: WritePlan, sizes: np.ndarray, slots: int, slot_bytes: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    bases, src_arena = arena_for(sizes)
    _, dst_arena = arena_for(sizes)
    src_arena[:] = np.random.default_rng(0).integers(0, 256, len(src_arena), dtype=np.uint8)
    staging = [np.zeros(slots * slot_bytes, np.uint8) for _ in range(2)]
    wire: list[bytes] = []
    acks: list[bytes] = []
    stats = {"posted": 0, "max_busy": 0}
    send_pool = SlotPool(slots, slot_bytes, staging[0])

    def post(slot: int, nbytes: int, notice: StagedNotice) -> int:
        off = send_pool.offset(slot)
        staging[1][off:off + nbytes] = staging[0][off:off + nbytes]
        stats["posted"] += 1
        stats["max_busy"] = max(stats["max_busy"], slots - send_pool.available)
        return 0

    sender = StagedSender(HostStager(src_arena, staging[0]), send_pool, post, lambda h: True,
                          lambda n: wire.append(encode_staged(n)))
    receiver = StagedReceiver(HostStager(dst_arena, staging[1]), SlotPool(slots, slot_bytes, staging[1]),
                              bases, sizes, lambda a: acks.append(encode_staged(a)))
    pieces = pieces_of(5, plan, bases, sizes, slot_bytes, align=ALIGN)
    sender.submit(pieces)
    for _ in range(10 * len(pieces) + 10):
        sender.step()
        while wire:
            msg = decode_staged(wire.pop(0))
            assert isinstance(msg, StagedNotice)
            receiver.on_notice(msg)
        receiver.step()
        while acks:
            ack = decode_staged(acks.pop(0))
            assert isinstance(ack, StagedAck)
            sender.on_ack(ack)
        if sender.idle:
            break
    assert sender.idle and receiver.completed() == [5]
    stats["pieces"] = len(pieces)
    return src_arena[:], dst_arena, stats | {"bases": bases}


def test_every_planned_byte_lands_where_the_plan_says() -> None:
    plan, sizes = model_plan()
    src, dst, stats = run(plan, sizes, slots=2, slot_bytes=1 << 14)
    bases = stats["bases"]
    expected = np.zeros_like(dst)
    for lr, lo, rr, ro, n, _ in plan.rows():
        expected[bases[rr] + ro:bases[rr] + ro + n] = src[bases[lr] + lo:bases[lr] + lo + n]
    assert np.array_equal(dst, expected)
    assert stats["pieces"] > 2 and stats["max_busy"] <= 2


def test_one_component_per_piece_so_tiny_items_keep_big_rows() -> None:
    plan, sizes = model_plan()
    bases, _ = arena_for(sizes)
    pieces = pieces_of(1, plan, bases, sizes, 1 << 20, align=ALIGN)
    assert len({p.seq for p in pieces}) == len(pieces) == pieces[0].pieces
    kv = [p for p in pieces if p.chunk * p.dst.rows > 64]
    assert all(p.chunk >= 256 for p in kv)


def test_receiver_refuses_runs_outside_its_regions() -> None:
    plan, sizes = model_plan()
    bases, arena = arena_for(sizes)
    staging = np.zeros(1 << 16, np.uint8)
    receiver = StagedReceiver(HostStager(arena, staging), SlotPool(1, 1 << 16, staging), bases, sizes,
                              lambda a: None)
    piece = pieces_of(1, plan.select(plan.component == -1), bases, sizes, 1 << 14, align=ALIGN)[0]
    good = StagedNotice.of(1, 0, 1, 0, piece.chunk, piece.dst)
    bad_region = StagedNotice(**{**_fields(good), "region": np.full(len(piece.dst), 999, "<i4").tobytes()})
    with pytest.raises(WireFormatError, match="region"):
        receiver.on_notice(bad_region)
    with pytest.raises(WireFormatError, match="slot"):
        receiver.on_notice(StagedNotice(**{**_fields(good), "slot": 3}))
    with pytest.raises(WireFormatError, match="bytes announced"):
        receiver.on_notice(StagedNotice(**{**_fields(good), "nbytes": good.nbytes + 1}))
    with pytest.raises(WireFormatError):
        decode_staged(b"\x93garbage")


def _fields(n: StagedNotice) -> dict:
    return {f: getattr(n, f) for f in n.__struct_fields__}
