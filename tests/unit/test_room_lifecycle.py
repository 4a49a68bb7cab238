"""The room state machine: legal transitions and their actions, illegal events refused, deadlines,
peers lost, aborts from either side, late events ignored, the table bounded."""

import numpy as np
import pytest

from dataplane.codec import KVPoll
from dataplane.errors import BadInput
from dataplane.room import (
    SENT,
    WRITES_DONE,
    Act,
    Begin,
    DecodeRecord,
    Fail,
    IllegalEvent,
    Items,
    PrefillRecord,
    RoomTable,
    Status,
)

ITEMS = Items(np.arange(2, dtype=np.int32), 0, [None])


def prefill_room(t: RoomTable, key=("d", 1), timeout: float = 10.0):
    return t.open(
        key,
        key[1],
        "decode-0",
        PrefillRecord("peer", None),
        now=0.0,
        timeout=timeout,
        state=KVPoll.WaitingForInput,
    )


def decode_room(t: RoomTable, room: int = 1, ranks=(0,), timeout: float = 10.0):
    return t.open(room, room, "prefill-0", DecodeRecord(ITEMS, set(ranks)), now=0.0, timeout=timeout)


def test_prefill_begin_then_writes_done_succeeds_and_leaves_the_table():
    t = RoomTable("prefill")
    prefill_room(t)
    room, actions = t.handle(("d", 1), Begin(ITEMS), 1.0)
    assert room.state == KVPoll.Transferring and actions == (Act.REPORT, Act.POST)
    assert room.record.items is ITEMS
    room, actions = t.handle(("d", 1), WRITES_DONE, 2.0)
    assert room.state == KVPoll.Success and room.finished == 2.0
    assert actions == (Act.SEND_STATUS, Act.FREE, Act.COUNT, Act.REPORT)
    assert ("d", 1) not in t and t.outcomes["success"] == 1


def test_prefill_refuses_events_out_of_order():
    t = RoomTable("prefill")
    prefill_room(t)
    with pytest.raises(IllegalEvent, match="WritesDone in WaitingForInput"):
        t.handle(("d", 1), WRITES_DONE, 1.0)
    t.handle(("d", 1), Begin(ITEMS), 1.0)
    with pytest.raises(IllegalEvent, match="Begin in Transferring"):
        t.handle(("d", 1), Begin(ITEMS), 1.0)
    with pytest.raises(IllegalEvent, match="Status"):
        t.handle(("d", 1), Status(0, KVPoll.Success), 1.0)
    assert t.get(("d", 1)).state == KVPoll.Transferring  # a refused event leaves the room as it was


def test_abort_by_decode_fails_a_prefill_room_and_tells_decode():
    t = RoomTable("prefill")
    prefill_room(t)
    t.handle(("d", 1), Begin(ITEMS), 1.0)
    room, actions = t.handle(("d", 1), Fail("aborted by decode: user"), 1.5)
    assert room.state == KVPoll.Failed and room.reason == "aborted by decode: user"
    assert actions == (Act.RELEASE_WRITES, Act.SEND_STATUS, Act.FREE, Act.COUNT, Act.REPORT)
    assert t.outcomes["aborted"] == 1 and t.recent_failures[-1]["after_seconds"] == 1.5


def test_a_quiet_failure_does_not_tell_the_peer():
    t = RoomTable("prefill")
    prefill_room(t)
    _, actions = t.handle(("d", 1), Fail("decode lost", notify=False), 1.0)
    assert Act.SEND_STATUS not in actions and Act.RELEASE_WRITES in actions


def test_late_events_change_nothing_and_late_items_are_discarded():
    t = RoomTable("prefill")
    prefill_room(t)
    t.handle(("d", 1), Fail("boom"), 1.0)
    assert t.handle(("d", 1), WRITES_DONE, 2.0) == (None, ())
    assert t.handle(("d", 1), Fail("again"), 2.0) == (None, ())
    assert t.handle(("d", 1), Begin(ITEMS), 2.0) == (None, (Act.DISCARD,))
    assert t.outcomes == {"failed": 1}


def test_decode_waits_for_every_rank_then_completes():
    t = RoomTable("decode")
    decode_room(t, ranks=(0, 1))
    room, actions = t.handle(1, SENT, 0.1)
    assert room.state == KVPoll.WaitingForInput and actions == (Act.REPORT,)
    room, actions = t.handle(1, Status(0, KVPoll.Transferring), 0.2)
    assert room.state == KVPoll.Transferring and actions == ()
    room, actions = t.handle(1, Status(0, KVPoll.Success), 0.3)
    assert room.state == KVPoll.Transferring and actions == () and room.record.ranks == {1}
    room, actions = t.handle(1, Status(1, KVPoll.WaitingForInput), 0.35)
    assert room.state == KVPoll.Transferring  # a status never moves a room back
    room, actions = t.handle(1, Status(1, KVPoll.Success), 0.4)
    assert room.state == KVPoll.Success and actions == (Act.COMPLETE, Act.REPORT)
    assert 1 not in t


def test_decode_refuses_a_status_before_its_metadata_left():
    t = RoomTable("decode")
    decode_room(t)
    with pytest.raises(IllegalEvent, match="Status in Bootstrapping"):
        t.handle(1, Status(0, KVPoll.Success), 0.1)
    with pytest.raises(IllegalEvent, match="Begin"):
        t.handle(1, Begin(ITEMS), 0.1)
    t.handle(1, SENT, 0.1)
    with pytest.raises(IllegalEvent, match="Sent in WaitingForInput"):
        t.handle(1, SENT, 0.2)


def test_prefill_failure_fails_decode_room_without_an_abort_back():
    t = RoomTable("decode")
    decode_room(t)
    t.handle(1, SENT, 0.1)
    room, actions = t.handle(1, Status(3, KVPoll.Failed, "pools exhausted"), 0.2)
    assert room.reason == "prefill rank 3: pools exhausted"
    assert actions == (Act.QUARANTINE, Act.COUNT, Act.REPORT)


def test_abort_by_engine_on_decode_tells_prefill_and_quarantines():
    t = RoomTable("decode")
    decode_room(t)
    t.handle(1, SENT, 0.1)
    _, actions = t.handle(1, Fail("aborted by engine: client gone"), 0.2)
    assert actions == (Act.SEND_ABORT, Act.QUARANTINE, Act.COUNT, Act.REPORT)
    assert t.outcomes["aborted"] == 1


def test_deadline_expires_only_late_rooms_with_the_time_given():
    t = RoomTable("decode")
    decode_room(t, 1, timeout=1.0)
    decode_room(t, 2, timeout=60.0)
    late = t.expire(1.0)
    assert [(r.room, a) for r, a in late] == [(1, (Act.SEND_ABORT, Act.QUARANTINE, Act.COUNT, Act.REPORT))]
    assert late[0][0].reason == "deadline exceeded: room 1 not done after 1.000s"
    assert 2 in t and t.expire(59.9) == []


def test_fail_peer_fails_only_that_peers_rooms():
    t = RoomTable("prefill")
    prefill_room(t, ("a", 1))
    t.open(
        ("b", 2),
        2,
        "decode-1",
        PrefillRecord("peer", None),
        now=0.0,
        timeout=10,
        state=KVPoll.WaitingForInput,
    )
    failed = t.fail_peer("decode-0", "heartbeat lost", 1.0)
    assert [r.key for r, _ in failed] == [("a", 1)] and ("b", 2) in t


def test_capacity_duplicates_and_terminal_opens_are_refused():
    t = RoomTable("decode", capacity=1)
    decode_room(t, 1)
    with pytest.raises(BadInput, match="already in progress"):
        decode_room(t, 1)
    with pytest.raises(BadInput, match="too many rooms"):
        decode_room(t, 2)
    with pytest.raises(IllegalEvent, match="cannot open Success"):
        RoomTable("prefill").open(
            1, 1, "p", PrefillRecord(None, None), now=0, timeout=1, state=KVPoll.Success
        )
    with pytest.raises(BadInput, match="expected prefill or decode"):
        RoomTable("router")


def test_snapshot_counts_states():
    t = RoomTable("prefill")
    prefill_room(t)
    t.handle(("d", 1), Begin(ITEMS), 1.0)
    snap = t.snapshot()
    assert snap["inflight"] == 1 and snap["states"] == {"Transferring": 1}
