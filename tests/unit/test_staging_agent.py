"""The staged path's failure handling and the agent glue, in host memory without an engine: failed
posts and writes fail their room and give the slot back, dropped rooms and lost peers free every slot,
decode refuses bad notices (acknowledging them, so no slot is lost) and never scatters for a room it
no longer has, and pieces stay small enough for one control message."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.agent.pools import MemoryPools
from dataplane.agent.staged import _padded
from dataplane.agent.staged_roles import DecodeStaging
from dataplane.agent.staging_memory import StagingMemory
from dataplane.codec.control import MAX_CONTROL_BYTES, Staged, StagedOffer, decode_control, encode_control
from dataplane.config import StagedConfig
from dataplane.errors import BadInput, TransferFailed
from dataplane.planner import PeerLayout, RequestIndices, plan_request
from dataplane.schema.profiles import profile
from dataplane.staging import (
    HostStager,
    SlotPool,
    StagedAck,
    StagedNotice,
    StagedSender,
    decode_staged,
    encode_staged,
    pieces_of,
)
from dataplane.staging.flow import MAX_RUNS
from dataplane.staging.rows import Runs

SCHEMA = profile("qwen3-next").schema(pool_pages=64, max_requests=4, layers=4)


def pools() -> MemoryPools:
    p = MemoryPools.allocate(SCHEMA, arena=True)
    p.arena[:] = np.random.default_rng(1).integers(0, 256, p.arena.nbytes, dtype=np.uint8)
    return p


def plan_of(n: int = 20):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    src, dst = rng.permutation(64)[:n], rng.permutation(64)[:n]
    return plan_request(
        SCHEMA, PeerLayout.from_schema(SCHEMA), RequestIndices.of(src, dst, 0, 1, [[1]], [[2]])
    )


def sender(p: MemoryPools, post, done, slots: int = 2, slot_bytes: int = 1 << 14):  # type: ignore[no-untyped-def]
    staging = np.zeros(slots * slot_bytes, np.uint8)
    return StagedSender(
        HostStager(p.arena, staging), SlotPool(slots, slot_bytes, staging), post, done, lambda n: None
    )


def pieces(p: MemoryPools, room: int = 7, slot_bytes: int = 1 << 14):  # type: ignore[no-untyped-def]
    sizes = np.array([r.size for r in p.regions], np.int64)
    return pieces_of(room, plan_of(), p.bases, sizes, slot_bytes, align=slot_bytes)


def test_a_failed_write_fails_its_room_once_and_frees_every_slot() -> None:
    p = pools()

    def done(handle: int) -> bool:
        raise TransferFailed("nixl: write to 'decode' failed")

    s = sender(p, lambda slot, n, notice: slot, done)
    s.submit(pieces(p))
    for _ in range(5):
        s.step()
    failed = s.take_failed()
    assert [room for room, _ in failed] == [7] and "write to 'decode' failed" in str(failed[0][1])
    assert s.pool.available == 2 and s.idle and not s.dropped


def test_a_failed_post_fails_the_room_and_keeps_other_rooms_going() -> None:
    p = pools()
    posted: list[int] = []

    def post(slot: int, nbytes: int, notice: StagedNotice) -> int:
        if notice.room == 7:
            raise BadInput("post refused")
        posted.append(notice.room)
        return slot

    s = sender(p, post, lambda h: True)
    s.submit(pieces(p, 7) + pieces(p, 8))
    for _ in range(4 * len(pieces(p, 8))):  # two slots: a piece per slot per step at worst
        s.step()
        for piece in list(s.landed.values()):
            s.on_ack(StagedAck(piece.room, piece.seq, piece.slot))
        if s.idle:
            break
    assert [room for room, _ in s.take_failed()] == [7]
    assert set(posted) == {8} and len(posted) == len(pieces(p, 8)) and s.pool.available == 2


def test_dropped_room_gives_back_slots_once_its_writes_are_over_and_close_frees_the_rest() -> None:
    p = pools()
    finished = {"yes": False}
    s = sender(p, lambda slot, n, notice: slot, lambda h: finished["yes"])
    s.submit(pieces(p))
    s.step()
    s.step()
    assert s.pool.available == 0 and len(s.writing) == 2
    s.drop(7)
    assert not s.queue and s.dropped == {7}
    s.step()
    assert s.pool.available == 0, "a write may still land in the slot: not free yet"
    finished["yes"] = True
    s.step()
    assert s.pool.available == 2 and not s.dropped and not s.landed and s.take_failed() == []
    s.submit(pieces(p, 9))
    s.step()
    s.step()
    assert len(s.landed) == 2
    assert s.on_ack(StagedAck(123, 0, 0)) is None, "an ack for a forgotten piece is ignored"
    s.close()
    assert s.pool.available == 2 and s.idle


def test_pieces_carry_at_most_max_runs_and_notices_fit_a_control_message() -> None:
    p = pools()
    sizes = np.array([r.size for r in p.regions], np.int64)
    capped = pieces_of(3, plan_of(40), p.bases, sizes, 1 << 20, align=1 << 12, max_runs=7)
    assert all(len(x.dst) <= 7 for x in capped) and sum(x.dst.rows for x in capped) == sum(
        x.dst.rows for x in pieces_of(3, plan_of(40), p.bases, sizes, 1 << 20, align=1 << 12)
    )
    assert all(len(x.src_rows) == x.dst.rows for x in capped)
    n = MAX_RUNS
    runs = Runs(np.zeros(n, np.int32), np.arange(n, dtype=np.int64) * 2, np.ones(n, np.int64))
    notice = StagedNotice.of(2**40, 10**6, 10**6 + 1, 1023, 4096, runs)
    frame = encode_control(Staged(agent_id="tcp://127.0.0.1:65535", payload=encode_staged(notice)))
    assert len(frame) < MAX_CONTROL_BYTES
    assert isinstance(decode_control(frame), Staged)


def test_padded_sizes_are_few_and_fit_the_slot() -> None:
    align = 1 << 20
    sizes = {_padded(n, align) for n in range(1, 64 << 20, 4093)}
    assert len(sizes) <= 64 + 21
    assert all(_padded(n, align) >= n for n in (1, 64, 4097, (1 << 20) + 1, 63 << 20))
    assert _padded(64 << 20, align) == 64 << 20 and _padded(3000, 4096) == 4096


def test_decode_refuses_bad_notices_acks_them_and_never_scatters_for_a_gone_room() -> None:
    p = pools()
    before = p.arena.copy()
    cfg = StagedConfig(mode="on", slot_bytes=1 << 14, slots=2)
    memory = StagingMemory(p, cfg, sets=1)
    sent: list[tuple[str, bytes]] = []
    blobs = [b"r"] * (len(p.regions) + 1)
    stg = DecodeStaging(memory, blobs, "tcp://127.0.0.1:2", lambda a, f: sent.append((a, f[0])))
    offer = decode_control(stg.offer(0, "tcp://127.0.0.1:1") or b"")
    assert isinstance(offer, StagedOffer) and offer.slots == 2 and offer.slot_bytes == 1 << 14
    assert stg.offer(1, "tcp://127.0.0.1:9") is None, "one landing set for a decode of one prefill rank"
    good = pieces(p)[0]
    notice = StagedNotice.of(7, 0, 3, 1, good.chunk, good.dst)
    wrap = Staged(agent_id="prefill", payload=encode_staged(notice))

    assert stg.on_message(0, wrap, live=lambda room: False, address="tcp://127.0.0.1:1") is None
    bad = Staged(agent_id="prefill", payload=encode_staged(StagedNotice.of(7, 0, 3, 5, good.chunk, good.dst)))
    room, reason = stg.on_message(0, bad, live=lambda room: True, address="tcp://127.0.0.1:1") or (0, "")
    assert room == 7 and "bad staged notice" in reason and "outside the landing slots" in reason
    acks = [decode_staged(decode_control(f).payload) for _, f in sent]  # type: ignore[union-attr]
    assert acks == [StagedAck(7, 0, 1), StagedAck(7, 0, 5)] and {a for a, _ in sent} == {"tcp://127.0.0.1:1"}
    assert np.array_equal(p.arena, before), "nothing scattered"
    assert stg.on_message(0, wrap, live=lambda room: True, address="tcp://127.0.0.1:1") is None
    assert stg.step() == 0 and len(sent) == 3
    room, reason = stg.on_message(4, wrap, live=lambda room: True, address="tcp://127.0.0.1:7") or (0, "")
    assert room == 7 and "no landing set" in reason and sent[-1][0] == "tcp://127.0.0.1:7"


def test_staging_memory_checks_its_settings() -> None:
    with pytest.raises(BadInput, match="slotBytes"):
        StagingMemory(pools(), StagedConfig(slot_bytes=1000), sets=1)
    with pytest.raises(BadInput, match="slots"):
        StagingMemory(pools(), StagedConfig(slots=0), sets=1)
    with pytest.raises(BadInput, match="arena"):
        StagingMemory(MemoryPools.allocate(SCHEMA), StagedConfig(), sets=1)
