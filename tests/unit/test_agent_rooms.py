"""Rooms: KVPoll only moves forward, Failed is terminal, deadlines and dead peers fail rooms."""

import time

import pytest

from dataplane.agent.rooms import RoomTable
from dataplane.codec import KVPoll
from dataplane.errors import BadInput


def test_monotonic_and_success_leaves_table():
    t = RoomTable()
    t.add(1, 1, "p", timeout=10)
    assert t.advance(1, KVPoll.Transferring) is None
    assert t.advance(1, KVPoll.WaitingForInput) is None
    assert t.get(1).state == KVPoll.Transferring
    done = t.advance(1, KVPoll.Success)
    assert done is not None and done.state == KVPoll.Success
    assert 1 not in t and t.outcomes["success"] == 1


def test_failed_is_terminal_and_keeps_reason():
    t = RoomTable()
    t.add(1, 1, "p", timeout=10)
    room = t.fail(1, "boom")
    assert room.state == KVPoll.Failed and room.reason == "boom"
    assert t.advance(1, KVPoll.Success) is None
    assert t.outcomes["failed"] == 1


def test_aborted_outcome():
    t = RoomTable()
    t.add(1, 1, "p", timeout=10)
    t.fail(1, "aborted by decode: user")
    assert t.outcomes["aborted"] == 1


def test_deadline_expires_rooms():
    t = RoomTable()
    t.add(1, 1, "p", timeout=0.0)
    t.add(2, 2, "p", timeout=60)
    late = t.expire(time.monotonic() + 0.001)
    assert [r.room for r in late] == [1]
    assert "deadline exceeded" in late[0].reason
    assert 2 in t


def test_fail_peer_only_that_peer():
    t = RoomTable()
    t.add(1, 1, "a", timeout=60)
    t.add(2, 2, "b", timeout=60)
    assert [r.room for r in t.fail_peer("a", "heartbeat lost")] == [1]
    assert 2 in t and 1 not in t


def test_capacity_and_duplicates_refused():
    t = RoomTable(capacity=1)
    t.add(1, 1, "p", timeout=60)
    with pytest.raises(BadInput, match="already in progress"):
        t.add(1, 1, "p", timeout=60)
    with pytest.raises(BadInput, match="too many rooms"):
        t.add(2, 2, "p", timeout=60)


def test_snapshot_counts_states():
    t = RoomTable()
    t.add(1, 1, "p", timeout=60)
    t.advance(1, KVPoll.Transferring)
    snap = t.snapshot()
    assert snap["inflight"] == 1 and snap["states"] == {"Transferring": 1}
