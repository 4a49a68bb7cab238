"""Heartbeat cadence and loss bound, and the forward thread's event-driven hand-off (its ``WAKE``
frame ends the worker's inbox wait at once instead of after the idle poll)."""

from __future__ import annotations

import threading
import time

import zmq

from dataplane.agent.control_sockets import WAKE, Inbox
from dataplane.agent.forward import ForwardThread
from dataplane.agent.liveness import Heartbeats
from dataplane.codec import Heartbeat, decode_control


def test_heartbeats_are_due_once_per_interval_and_numbered():
    hb = Heartbeats("tcp://127.0.0.1:5555", interval=0.5, misses=4)
    first = hb.due(10.0)
    assert first is not None and hb.due(10.2) is None
    second = hb.due(10.5)
    assert second is not None
    a, b = decode_control(first), decode_control(second)
    assert isinstance(a, Heartbeat) and isinstance(b, Heartbeat)
    assert (a.agent_id, a.seq, b.seq) == ("tcp://127.0.0.1:5555", 1, 2)


def test_peer_lost_only_after_the_misses_bound():
    hb = Heartbeats("a", interval=0.5, misses=4)
    assert not hb.lost(last_seen=10.0, now=12.0)
    assert hb.lost(last_seen=10.0, now=12.01)


def test_forward_thread_wakes_the_inbox_when_a_job_is_done():
    ctx = zmq.Context()
    inbox = Inbox(ctx, "127.0.0.1")
    stop = threading.Event()
    fwd = ForwardThread(lambda x: x * 2, inbox.waker())
    fwd.start(stop)
    try:
        fwd.submit(21)
        start = time.monotonic()
        assert inbox.recv(5.0) == [WAKE]
        assert time.monotonic() - start < 1.0
        assert fwd.done() == [42] and fwd.done() == []
    finally:
        stop.set()
        time.sleep(0.3)
        inbox.close()
        ctx.destroy(linger=0)
