"""Direct control lanes (``dataplane.agent.lanes``): framing, the invitation handshake, fallbacks and
bounds, between real sockets on 127.0.0.1; and the ``Inbox`` / ``Pushers`` pair that reads and prefers
them."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from dataplane.agent import lanes as lanes_mod
from dataplane.agent.control_sockets import Inbox, Pushers
from dataplane.agent.lanes import LANE_HELLO, MAX_FRAMES, FrameReader, LaneError, Lanes, pack

MAX = 1 << 20
A_ADDR, B_ADDR = "tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"


@given(
    st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=6), min_size=1, max_size=8),
    st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=20),
)
def test_frames_survive_any_chunking(messages, cuts):
    stream = b"".join(pack(m) for m in messages)
    reader, got, at, i = FrameReader(MAX), [], 0, 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        got += reader.feed(stream[at : at + step])
        at, i = at + step, i + 1
    assert got == messages and not reader.buf


@pytest.mark.parametrize(
    ("head", "why"),
    [
        ((MAX + 1).to_bytes(4, "little") + (1).to_bytes(4, "little"), "bytes"),
        ((4 + 4 * (MAX_FRAMES + 1)).to_bytes(4, "little") + (MAX_FRAMES + 1).to_bytes(4, "little"), "frames"),
        ((12).to_bytes(4, "little") + (1).to_bytes(4, "little") + (99).to_bytes(4, "little"), "lengths"),
    ],
)
def test_bad_framing_is_refused(head, why):
    with pytest.raises(LaneError, match=why):
        FrameReader(MAX).feed(head + b"\0" * 16)


def pump(lanes: Lanes, want: int, timeout: float = 5.0) -> list[list[bytes]]:
    """Service ``lanes`` until ``want`` messages arrived (bounded in time)."""
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += lanes.service(set(lanes.fds()))
        time.sleep(0.001)
    return out


@pytest.fixture
def pair():
    a, b = Lanes("127.0.0.1", 0, MAX), Lanes("127.0.0.1", 0, MAX)
    yield a, b
    a.close()
    b.close()


def test_invited_lane_carries_both_ways_in_order(pair):
    a, b = pair
    token = a.invite(B_ADDR)
    b.dial(A_ADDR, "127.0.0.1", a.port, token, B_ADDR)
    for i in range(200):  # queued while connecting, then flushed in order
        assert b.send(A_ADDR, [b"m", str(i).encode()]) is True
    got = pump(a, 200)
    assert [int(m[1]) for m in got] == list(range(200))
    assert list(a.by_address) == [B_ADDR]
    assert a.send(B_ADDR, [b"status", b"ok"]) is True
    assert pump(b, 1) == [[b"status", b"ok"]]
    assert a.send("tcp://127.0.0.1:9", [b"x"]) is None  # no lane there: the caller uses ZMQ


def test_wrong_token_is_refused_and_the_dialer_falls_back(pair):
    a, b = pair
    a.invite(B_ADDR)
    b.dial(A_ADDR, "127.0.0.1", a.port, b"\0" * 16, B_ADDR)
    b.send(A_ADDR, [b"hi"])
    assert pump(a, 1, timeout=0.5) == []
    assert a.by_address == {} and a.unknown == {}
    deadline = time.monotonic() + 5
    while A_ADDR in b.by_address and time.monotonic() < deadline:
        b.service(set(b.fds()))
        time.sleep(0.01)
    assert b.send(A_ADDR, [b"again"]) is None and b.fallbacks == 1


def test_a_connection_without_hello_is_closed(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(lanes_mod, "HELLO_TIMEOUT", 0.05)
    silent = socket.create_connection(("127.0.0.1", a.port))
    deadline = time.monotonic() + 5
    while not a.unknown and time.monotonic() < deadline:
        a.service({a.lfd})
    assert a.unknown
    time.sleep(0.1)
    a.service(set())
    assert a.unknown == {}
    silent.close()


def test_a_hello_for_an_uninvited_address_is_refused(pair):
    a, _ = pair
    raw = socket.create_connection(("127.0.0.1", a.port))
    raw.sendall(pack([LANE_HELLO, b"t" * 16, B_ADDR.encode()]) + pack([b"sneaky"]))
    assert pump(a, 1, timeout=0.5) == []
    assert a.by_address == {}
    raw.close()


def test_a_peer_that_stops_reading_costs_dropped_messages_never_a_block(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(lanes_mod, "MAX_PENDING", 4 << 20)
    b.dial(A_ADDR, "127.0.0.1", a.port, a.invite(B_ADDR), B_ADDR)
    pump(a, 0, timeout=0.2)
    big = [b"x" * (1 << 20)]
    start = time.monotonic()
    results = [b.send(A_ADDR, big) for _ in range(64)]  # a never reads
    assert time.monotonic() - start < 5
    assert False in results and b.dropped == results.count(False)
    assert len(b.by_address[A_ADDR].out) <= 4 << 20


def test_a_closed_peer_breaks_the_lane(pair):
    a, b = pair
    b.dial(A_ADDR, "127.0.0.1", a.port, a.invite(B_ADDR), B_ADDR)
    b.send(A_ADDR, [b"one"])
    assert pump(a, 1) == [[b"one"]]
    a.close()
    deadline = time.monotonic() + 5
    while A_ADDR in b.by_address and time.monotonic() < deadline:
        b.service(set(b.fds()))
        b.send(A_ADDR, [b"more"])
        time.sleep(0.01)
    assert A_ADDR not in b.by_address and b.fallbacks == 1


@dataclass
class Side:
    lanes: Lanes
    inbox: Inbox
    push: Pushers
    address: str


@pytest.fixture
def two_inboxes():
    """Two agents' inboxes and pushers on 127.0.0.1, each with its lanes (none dialled yet)."""
    ctx = zmq.Context()
    sides = []
    for _ in range(2):
        lanes = Lanes("127.0.0.1", 0, MAX)
        inbox = Inbox(ctx, "127.0.0.1", 0, lanes)
        sides.append(Side(lanes, inbox, Pushers(ctx, lanes), f"tcp://127.0.0.1:{inbox.port}"))
    yield sides
    for side in sides:
        side.push.close()
        side.inbox.close()
    ctx.destroy(linger=0)


def test_inbox_reads_lanes_beside_zmq_and_pushers_prefer_the_lane(two_inboxes):
    a, b = two_inboxes
    b.push.send(a.address, [b"over zmq"])
    assert a.inbox.recv(2.0) == [b"over zmq"]
    b.lanes.dial(a.address, "127.0.0.1", a.lanes.port, a.lanes.invite(b.address), b.address)
    b.push.send(a.address, [b"over the lane", b"2"])
    start = time.monotonic()
    a.inbox.wait(2.0)
    got = a.inbox.recv(2.0)
    assert got == [b"over the lane", b"2"] and time.monotonic() - start < 2.0
    assert list(a.lanes.by_address) == [b.address]
    a.push.send(b.address, [b"reply"])
    assert b.inbox.recv(2.0) == [b"reply"]
    assert b.push.dropped == 0


def _full_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener that never accepts, its queue full: one more connect stays pending."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(srv.getsockname())
        fillers.append(s)
    time.sleep(0.1)
    return srv, fillers


@pytest.mark.parametrize("how", ["refused", "timed out"])
def test_messages_of_a_lane_that_never_connects_go_over_zmq_in_order(how, monkeypatch):
    monkeypatch.setattr(lanes_mod, "CONNECT_TIMEOUT", 0.3)
    ctx = zmq.Context()
    la, lb = Lanes("127.0.0.1", 0, MAX), Lanes("127.0.0.1", 0, MAX)
    inbox_a, push_b = Inbox(ctx, "127.0.0.1", 0, la), Pushers(ctx, lb)
    a_addr = f"tcp://127.0.0.1:{inbox_a.port}"
    srv, fillers = _full_listener() if how == "timed out" else (socket.socket(), [])
    if how == "refused":
        srv.bind(("127.0.0.1", 0))  # bound, never listening: connects are refused
    try:
        lb.dial(a_addr, "127.0.0.1", srv.getsockname()[1], b"t" * 16, "tcp://127.0.0.1:1")
        for i in range(5):
            assert push_b.send(a_addr, [b"m", str(i).encode()])
        got, deadline = [], time.monotonic() + 5
        while len(got) < 5 and time.monotonic() < deadline:
            lb.service(set())  # the dialler's loop: finishes (or gives up on) its connect
            msg = inbox_a.recv(0.05)
            if msg:
                got.append(msg)
        assert [int(m[1]) for m in got] == list(range(5))
        assert lb.by_address == {} and lb.fallbacks == 1
    finally:
        for s in (srv, *fillers):
            s.close()
        push_b.close()
        inbox_a.close()
        lb.close()
        ctx.destroy(linger=0)


def test_unknown_connections_are_capped(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(lanes_mod, "MAX_UNKNOWN", 3)
    clients = [socket.create_connection(("127.0.0.1", a.port)) for _ in range(6)]
    time.sleep(0.05)
    a.service({a.lfd})
    assert len(a.unknown) == 3
    for c in clients:
        c.close()


def test_inbox_wait_copes_with_descriptors_select_cannot_watch(monkeypatch):
    from dataplane.agent import control_sockets as control

    ctx = zmq.Context()
    la = Lanes("127.0.0.1", 0, MAX)
    inbox, push = Inbox(ctx, "127.0.0.1", 0, la), Pushers(ctx)
    monkeypatch.setattr(control, "FD_SETSIZE", 0)  # as if every descriptor were above 1023
    try:
        start = time.monotonic()
        inbox.wait(0.05)
        assert 0.04 < time.monotonic() - start < 1.0
        push.send(f"tcp://127.0.0.1:{inbox.port}", [b"x"])
        inbox.wait(2.0)
        assert inbox.recv(2.0) == [b"x"]
    finally:
        push.close()
        inbox.close()
        ctx.destroy(linger=0)


def test_an_unknown_peer_cannot_open_with_a_large_message(pair):
    a, _ = pair
    raw = socket.create_connection(("127.0.0.1", a.port))
    raw.sendall(pack([b"x" * 4096]))
    assert pump(a, 1, timeout=0.5) == []
    assert a.unknown == {} and a.by_address == {}
    raw.close()
    reader = FrameReader(MAX, first_max=64)
    assert reader.feed(pack([b"h" * 32]) + pack([b"y" * 4096])) == [[b"h" * 32], [b"y" * 4096]]



def test_corked_sends_leave_together_in_order_on_uncork(pair):
    """Replies to messages handled together go out in one write per lane: nothing is written while
    corked (the whole batch waits in the lane's buffer), everything in order once uncorked; nested
    corks leave it to the outermost."""
    a, b = pair
    b.dial(A_ADDR, "127.0.0.1", a.port, a.invite(B_ADDR), B_ADDR)
    b.send(A_ADDR, [b"first"])
    assert pump(a, 1) == [[b"first"]]
    pushers, lane = Pushers(zmq.Context.instance(), a), a.by_address[B_ADDR]
    messages = [[b"status", str(i).encode()] for i in range(5)]
    with pushers.corked():
        with pushers.corked():
            for m in messages:
                assert pushers.send(B_ADDR, m) is True
        assert bytes(lane.out) == b"".join(pack(m) for m in messages)
        time.sleep(0.05)
        assert b.service(set(b.fds())) == []
    assert not lane.out and not a.corked
    assert pump(b, 5) == messages
    assert pushers.send(B_ADDR, [b"after"]) is True and not lane.out  # uncorked: written at once
    assert pump(b, 1) == [[b"after"]]


@pytest.mark.parametrize("setsize", [1024, 0], ids=["select", "poll"])
def test_inbox_spin_ends_at_its_deadline_or_when_a_message_is_there(monkeypatch, setsize, two_inboxes):
    from dataplane.agent import control_sockets as control

    monkeypatch.setattr(control, "FD_SETSIZE", setsize)
    a, b = two_inboxes
    start = time.monotonic()
    a.inbox.spin(start + 0.02)
    assert 0.02 <= time.monotonic() - start < 1.0
    b.push.send(a.address, [b"over zmq"])
    start = time.monotonic()
    a.inbox.spin(start + 5.0)  # may end on ZMQ's own traffic (a connect) before the message
    assert a.inbox.recv(2.0) == [b"over zmq"] and time.monotonic() - start < 4.0
    b.lanes.dial(a.address, "127.0.0.1", a.lanes.port, a.lanes.invite(b.address), b.address)
    b.push.send(a.address, [b"lane up"])
    assert a.inbox.recv(2.0) == [b"lane up"] and list(a.lanes.by_address) == [b.address]
    a.push.send(b.address, [b"over the lane"])
    start = time.monotonic()
    b.inbox.spin(start + 5.0)
    assert b.inbox.recv(2.0) == [b"over the lane"] and time.monotonic() - start < 4.0


def test_inbox_spin_ends_at_a_helpers_hand_off(two_inboxes):
    """A spinning worker is not asleep, so a hand-off sends no frame: the spin must see the flag."""
    a, _ = two_inboxes
    wake = a.inbox.waker()
    timer = threading.Timer(0.05, wake)
    start = time.monotonic()
    timer.start()
    try:
        a.inbox.spin(start + 5.0)
    finally:
        timer.cancel()
    assert 0.04 < time.monotonic() - start < 4.0 and a.inbox.handed_over
    assert a.inbox.recv(0) is None and not a.inbox.handed_over


def test_a_zmq_flood_does_not_starve_the_lanes(two_inboxes):
    """With hundreds of ZMQ messages queued, a lane's message is read within ``ZMQ_RUN`` + 1 messages:
    the ZMQ socket faces the pod network, the lane a paired peer."""
    from dataplane.agent.control_sockets import ZMQ_RUN

    a, b = two_inboxes
    b.lanes.dial(a.address, "127.0.0.1", a.lanes.port, a.lanes.invite(b.address), b.address)
    b.push.send(a.address, [b"lane up"])
    assert a.inbox.recv(2.0) == [b"lane up"] and list(a.lanes.by_address) == [b.address]
    flood = a.inbox._ctx.socket(zmq.PUSH)
    flood.connect(a.address)
    for i in range(500):
        flood.send_multipart([b"junk", str(i).encode()])
    deadline = time.monotonic() + 5
    while not a.inbox._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the whole flood has reached a's socket
    b.push.send(a.address, [b"heartbeat"])
    time.sleep(0.2)  # and the lane's message its kernel buffer
    got = [a.inbox.recv(1.0) for _ in range(ZMQ_RUN + 2)]
    flood.close(linger=0)
    assert [b"heartbeat"] in got[: ZMQ_RUN + 2], [m[:1] for m in got if m]
