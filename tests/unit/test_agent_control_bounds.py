"""The control plumbing's bounds (``agent.control_sockets``): outgoing sockets bounded by the paired peers,
sends that never raise, the message cap sized to the schema, throttled warnings."""

from __future__ import annotations

import logging

import pytest
import zmq

from dataplane.agent import control_sockets as control
from dataplane.agent.control_sockets import LogThrottle, Pushers, message_budget
from dataplane.harness.agent_processes import free_port


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_sockets_to_strangers_are_bounded_and_peers_keep_theirs(ctx):
    pushers = Pushers(ctx)
    peers = {f"tcp://127.0.0.1:{free_port()}" for _ in range(3)}
    pushers.keep = peers.__contains__
    for address in sorted(peers):
        assert pushers.send(address, [b"x"])
    for i in range(200):
        pushers.send(f"tcp://127.0.0.1:{20_000 + i}", [b"x"])
    assert pushers.open_sockets == len(peers) + control.STRANGER_SOCKETS
    assert pushers.evicted == 200 - control.STRANGER_SOCKETS
    assert peers <= set(pushers._socks)  # no peer's socket was closed to make room
    pushers.close()


def test_a_send_zmq_refuses_is_a_counted_drop_not_an_exception(ctx):
    ctx.set(zmq.MAX_SOCKETS, 4)  # ZMQ makes no more sockets than this: the rest must be dropped
    pushers = Pushers(ctx)
    pushers.keep = lambda address: True  # even for peers: the limit is ZMQ's
    results = [pushers.send(f"tcp://127.0.0.1:{21_000 + i}", [b"x"]) for i in range(10)]
    assert results.count(True) == pushers.open_sockets <= 4
    assert pushers.drops["no_socket"] == results.count(False) >= 6
    assert pushers.dropped == results.count(False)
    pushers.close()


def test_a_full_queue_is_counted_and_its_warnings_throttled(ctx, caplog):
    pushers = Pushers(ctx)
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody listens: sends queue up to the high-water mark
    with caplog.at_level(logging.WARNING, logger="dataplane.agent.control_sockets"):
        sent = sum(pushers.send(address, [b"x"]) for _ in range(control.HWM + 500))
    assert sent == control.HWM and pushers.drops["queue_full"] == 500
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1
    pushers.close()


def test_the_message_cap_is_the_larger_of_registration_and_metadata_within_its_limits():
    assert message_budget(10, 100) == control.MIN_MESSAGE  # small schemas: a Staged message decides
    regions = 4096
    assert message_budget(regions, 0) == control.REGISTRATION_BASE + 2 * regions * control.REGION_BYTES
    items = 1 << 20
    assert message_budget(0, items) == control.REGISTRATION_BASE + items * control.INDEX_BYTES
    assert message_budget(1 << 20, 1 << 30) == control.MAX_MESSAGE


def test_an_inbox_refuses_messages_over_its_cap_and_budgets_its_connections(ctx):
    cap = 1 << 20
    inbox = control.Inbox(ctx, "127.0.0.1", max_message=cap)
    assert inbox._sock.getsockopt(zmq.MAXMSGSIZE) == cap
    assert inbox._sock.getsockopt(zmq.RCVHWM) * cap <= control.CONNECTION_BUDGET
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{inbox.port}")
    push.send(b"x" * (cap + 1))
    push.send(b"small")
    got = [inbox.recv(2.0), inbox.recv(0.5)]
    assert got == [[b"small"], None]  # the one over the cap never reached the inbox
    push.close(linger=0)
    inbox.close()


def test_log_throttle_lets_one_warning_per_interval_per_key_and_counts_the_rest():
    throttle = LogThrottle(interval=3600.0, max_keys=2)
    assert throttle.allow("a") == 0
    assert [throttle.allow("a") for _ in range(5)] == [-1] * 5
    assert throttle.allow("b") == 0
    assert throttle.allow("c") == 0  # a third key: the table was full, forgotten at once
    assert throttle.allow("a") == 0
    expired = LogThrottle(interval=0.0)
    expired.allow("k")
    assert expired.allow("k") == 0  # the interval passed: logged again, nothing was held back
