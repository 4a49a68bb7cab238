"""The local API server and client together, with a recording handler instead of an agent: handshake,
requests, pushes, bounds checks, malformed and oversized frames, a busy second engine, and the
client's clear errors and reconnect-with-re-registration when the agent goes away and comes back."""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import msgspec
import pytest

from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.config import AgentConfig, ModelConfig
from dataplane.errors import AgentUnavailable, DeadlineExceeded, LocalApiError
from dataplane.harness.waiting import wait_for
from dataplane.localapi import AgentClient, SharedPools
from dataplane.localapi.link import AbortCmd, ExpectCmd, SendCmd
from dataplane.localapi.messages import (
    Error,
    Hello,
    RoomState,
    decode_agent_message,
    encode_message,
)
from dataplane.localapi.server import LocalApiServer
from dataplane.localapi.sidecar import Sidecar
from dataplane.localapi.stream import FrameReader, send_frame
from dataplane.schema.profiles import schema_from_config

CFG = AgentConfig(model=ModelConfig(profile="qwen3-next", pool_pages=16, max_requests=4))
SCHEMA = schema_from_config(CFG)


def manifest(role="prefill", cfg=CFG):
    return encode_manifest(manifest_from_schema(schema_from_config(cfg), role=role))


class Recorder:
    """An EngineHandler that records what it is asked and answers like an agent would."""

    schema = SCHEMA

    def __init__(self):
        self.commands, self.registered, self.push, self.gone = [], [], None, []

    def hello(self, msg: Hello) -> str:
        if msg.role != "prefill":
            raise LocalApiError("role", f"engine is {msg.role}, this agent is prefill")
        return "recorder"

    def connected(self, push):
        self.push = push

    def register(self, regions, fds):
        self.registered.append((len(regions), len(fds)))
        for fd in fds:
            import os

            os.close(fd)

    def submit(self, cmd):
        self.commands.append(cmd)

    def state(self, room):
        return RoomState(room=room, state=3)

    def disconnected(self, reason):
        self.gone.append(reason)

    def lend(self, session):
        return False


@pytest.fixture
def served(tmp_path):
    handler = Recorder()
    server = LocalApiServer(str(tmp_path / "agent.sock"), handler, max_frame=64 * 1024).start()
    yield server, handler
    server.stop()


def client(server, role="prefill", **kw):
    return AgentClient(server.socket_path, role=role, manifest=manifest(role), timeout=2.0, **kw)


def test_requests_reach_the_handler_and_states_come_back(served):
    server, handler = served
    with client(server) as c:
        with SharedPools([(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]) as pools:
            c.register_pools(pools.regions, pools.fds)
        assert handler.registered == [(len(SCHEMA.regions()), 1)]
        c.send(7, [1, 2], 0, [[3], [], [0]][: len(SCHEMA.components)])
        c.expect(8, [4], None, (), prefix_len=64)
        c.abort(7, "user cancelled", ack=True)
        send, expect, abort = handler.commands
        assert isinstance(send, SendCmd) and send.kv.tolist() == [1, 2] and send.aux == 0
        assert isinstance(expect, ExpectCmd) and expect.prefix_len == 64 and expect.aux is None
        assert abort == AbortCmd(7, "user cancelled")
        assert [st.state for st in c.poll_remote([7])] == [3]
        handler.push([RoomState(room=7, state=4)])
        assert c.wait(7, timeout=2) == (4, "")
        assert c.poll(8) == (1, "")


def test_indices_outside_a_pool_are_refused(served):
    server, handler = served
    with client(server) as c:
        with pytest.raises(LocalApiError, match=r"bad_request: kv: item index 16 outside the pool's 0\.\.15"):
            c.send(1, [16], ack=True)
        with pytest.raises(LocalApiError, match="state components given"):
            c.send(1, [0], None, [[0]] * (len(SCHEMA.components) + 1), ack=True)
        with pytest.raises(LocalApiError, match="aux"):
            c.send(1, [0], SCHEMA.aux.num_items, ack=True)
        c.expect(2, [99])
        state, reason = c.wait(2, timeout=2)
        assert state == 0 and reason.startswith("bad_request: kv: item index 99 outside")
    assert handler.commands == []


def test_requests_without_ack_cost_one_write_and_keep_their_order(served):
    server, handler = served
    with client(server) as c:
        for room in range(50):
            c.expect(room, [room % 16])
        c.poll_remote([0])
    assert [cmd.room for cmd in handler.commands] == list(range(50))


def test_wrong_role_is_refused_at_hello(served):
    server, _ = served
    with pytest.raises(LocalApiError, match="role: engine is decode"):
        client(server, role="decode").connect()


def raw(server):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(server.socket_path)
    return s, FrameReader(s)


def test_malformed_message_gets_an_error_and_the_connection_stays_usable(served):
    server, _ = served
    s, reader = raw(server)
    with s:
        send_frame(s, b"\xc1garbage")
        err = decode_agent_message(reader.read())
        assert isinstance(err, Error) and err.code == "malformed" and "local API message" in err.message
        send_frame(s, encode_message(Hello(version=1, role="prefill", engine_id="x", manifest=b"", seq=3)))
        assert type(decode_agent_message(reader.read())).__name__ == "Welcome"


def test_request_before_hello_is_refused(served):
    server, _ = served
    s, reader = raw(server)
    with s:
        send_frame(s, msgspec.msgpack.encode({"type": "poll", "rooms": [1], "seq": 9}))
        err = decode_agent_message(reader.read())
        assert isinstance(err, Error) and err.code == "no_hello" and err.seq == 9


def test_oversized_frame_gets_a_clear_error_then_the_connection_closes(served):
    server, _ = served
    s, reader = raw(server)
    with s:
        s.sendall((1 << 30).to_bytes(4, "big"))
        err = decode_agent_message(reader.read())
        assert err.code == "frame_too_large"
        assert "1073741824 bytes exceeds the maximum of 65536" in err.message
        assert s.recv(1) == b""


def test_second_engine_is_refused_as_busy(served):
    server, _ = served
    with client(server):
        s, reader = raw(server)
        with s:
            hello = Hello(version=1, role="prefill", engine_id="second", manifest=manifest())
            send_frame(s, encode_message(hello))
            err = decode_agent_message(reader.read())
            assert err.code == "busy"
            assert s.recv(1) == b""  # and the connection closes


def test_connections_beyond_the_limit_are_refused_at_once(tmp_path):
    server = LocalApiServer(str(tmp_path / "agent.sock"), Recorder(), max_connections=1).start()
    try:
        with raw(server)[0]:
            time.sleep(0.2)  # the first connection is open, and said nothing yet
            s, reader = raw(server)
            with s:
                err = decode_agent_message(reader.read())
                assert err.code == "busy" and "1 engine connections are open" in err.message
    finally:
        server.stop()


def test_client_without_agent_fails_fast_and_clearly(tmp_path):
    c = AgentClient(str(tmp_path / "none.sock"), role="prefill", manifest=b"", timeout=1.0)
    start = time.monotonic()
    with pytest.raises(AgentUnavailable, match="cannot connect"):
        c.send(1, [0])
    with pytest.raises(AgentUnavailable, match="unavailable"):
        c.send(1, [0])
    assert time.monotonic() - start < 0.5
    with pytest.raises(DeadlineExceeded):
        c.wait(1, timeout=0.05)


def test_client_fails_inflight_rooms_and_reregisters_after_an_agent_restart(tmp_path):
    path = str(tmp_path / "agent.sock")
    first, handler = LocalApiServer(path, Recorder()).start(), None
    c = AgentClient(path, role="prefill", manifest=manifest(), timeout=2.0, reconnect_interval=0.05)
    with SharedPools([(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]) as pools:
        c.connect()
        c.register_pools(pools.regions, pools.fds)
        c.send(3, [0])
        first.stop()
        assert c.wait(3, timeout=2)[0] == 0 and "agent disconnected" in c.poll(3)[1]
        with pytest.raises(AgentUnavailable):
            c.send(4, [0])
        handler = Recorder()
        second = LocalApiServer(path, handler).start()
        try:
            time.sleep(0.1)
            c.send(4, [1])
            c.poll_remote([4])
            assert handler.registered == [(len(SCHEMA.regions()), 1)]
            assert [cmd.room for cmd in handler.commands] == [4]
        finally:
            c.close()
            second.stop()


def test_client_times_out_on_a_frozen_agent(tmp_path):
    path = str(tmp_path / "frozen.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    accepted = []
    t = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    t.start()
    c = AgentClient(path, role="prefill", manifest=b"", timeout=0.3, register_timeout=0.5)
    start = time.monotonic()
    with pytest.raises(AgentUnavailable, match=r"no answer within 0\.5s"):
        c.connect()
    assert time.monotonic() - start < 1.5
    listener.close()


class SlowToMap(Recorder):
    """An agent whose registration takes ``delay`` (mapping a GPU pool's IPC handles starts a CUDA
    context: seconds)."""

    delay = 0.6

    def register(self, regions, fds):
        time.sleep(self.delay)
        super().register(regions, fds)


@pytest.mark.parametrize(("register_timeout", "registers"), [(3.0, True), (0.3, False)])
def test_registration_is_bounded_by_register_timeout(tmp_path, register_timeout, registers):
    handler = SlowToMap()
    server = LocalApiServer(str(tmp_path / "agent.sock"), handler).start()
    c = AgentClient(server.socket_path, role="prefill", manifest=manifest("prefill"), timeout=0.2,
                    register_timeout=register_timeout)
    try:
        with SharedPools([(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]) as pools:
            c.connect()
            if registers:
                c.register_pools(pools.regions, pools.fds)
                assert handler.registered == [(len(SCHEMA.regions()), 1)]
                c.send(7, [1], 0, [[3], [], [0]][: len(SCHEMA.components)], ack=True)  # per-call bound again
            else:
                with pytest.raises(AgentUnavailable, match=r"no answer within 0\.3s"):
                    c.register_pools(pools.regions, pools.fds)
    finally:
        c.close()
        server.stop()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"version": 2}, "version: engine speaks local API v2"),
        ({"role": "decode"}, "role: engine is decode"),
        ({"manifest": manifest(cfg=msgspec.structs.replace(
            CFG, model=ModelConfig(profile="qwen3-next", pool_pages=16, max_requests=8)))},
         "incompatible: engine schema differs"),
    ],
)
def test_sidecar_refuses_a_mismatched_engine(tmp_path, change, match):
    cfg = CFG.with_engine(mode="external", socket_path=str(tmp_path / "s.sock"))
    sidecar = Sidecar(cfg)
    hello = msgspec.structs.replace(
        Hello(version=1, role="prefill", engine_id="e", manifest=manifest()), **change
    )
    with pytest.raises(LocalApiError, match=match):
        sidecar.hello(hello)
    assert sidecar.hello(Hello(version=1, role="prefill", engine_id="e", manifest=manifest()))
    with pytest.raises(LocalApiError, match="not_registered"):
        sidecar.submit(AbortCmd(1, ""))


class Lender(Recorder):
    """Lends the connection to a thread of its own once the pools are registered, which reads it as the
    agent's worker does: waits on the socket, ``pump``s, and gives it back when ``pump`` says so."""

    def __init__(self):
        super().__init__()
        self.readers: list[int] = []
        self.returned = 0

    def lend(self, session):
        def worker():
            self.readers.append(threading.get_ident())
            while session.pump(self.commands.append):
                select.select([session.fd], [], [], 0.05)
            self.returned += 1
            session.returned.set()

        threading.Thread(target=worker, daemon=True).start()
        return True


def test_a_lent_connection_is_read_by_the_worker_and_comes_back_for_what_it_does_not_handle(tmp_path):
    handler = Lender()
    server = LocalApiServer(str(tmp_path / "agent.sock"), handler, max_frame=64 * 1024).start()
    regions = [(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]
    try:
        with client(server) as c, SharedPools(regions) as pools:
            c.register_pools(pools.regions, pools.fds)
            for room in range(50):
                c.expect(room, [room % 16])
            with pytest.raises(LocalApiError, match="bad_request: kv: item index 16"):
                c.send(99, [16], ack=True)  # refused on the worker, answered to the engine
            c._sock.sendall(len(b"\xc1junk").to_bytes(4, "big") + b"\xc1junk")
            err = c._read(2.0)
            assert isinstance(err, Error) and err.code == "malformed"  # answered; the connection stays
            assert [st.state for st in c.poll_remote([3])] == [3]  # Poll, answered by the worker
            assert [cmd.room for cmd in handler.commands] == list(range(50))
            assert len(handler.readers) == 1 and handler.returned == 0
            c.register_pools(pools.regions, pools.fds)  # back to the connection thread, then lent again
            assert handler.registered == [(len(regions), 1)] * 2
            wait_for("the reader lent again", lambda: handler.returned == 1 and len(handler.readers) == 2,
                     timeout=5, interval=0.01)
            c.abort(5, "cancelled", ack=True)
            assert handler.commands[-1] == AbortCmd(5, "cancelled")
        wait_for("the engine's disconnect handled",
                 lambda: handler.returned == 2 and handler.gone == ["engine disconnected"],
                 timeout=5, interval=0.01)
    finally:
        server.stop()


def test_wait_change_polls_first_then_sleeps_and_returns_on_a_push(served):
    server, handler = served
    with client(server) as c:
        with SharedPools([(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]) as pools:
            c.register_pools(pools.regions, pools.fds)
        c.expect(9, [1], None, ())
        since = c.version
        for poll in (0.05, 0.0):  # nothing comes: polls for ``poll`` s, then one wait sleeps the rest
            polls, waits, start = c.polls, c.blocking_waits, time.monotonic()
            c.wait_change(since, timeout=0.6, poll=poll)  # the rest outlasts a busy host's poll overrun
            assert c.version == since and 0.6 <= time.monotonic() - start < 2.0
            assert (c.polls - polls > 10) if poll else (c.polls == polls), (poll, c.polls - polls)
            assert c.blocking_waits - waits == 1, (poll, c.blocking_waits - waits)
        for poll in (0.5, 0.0):  # the push lands while polling, then while asleep
            since = c.version
            timer = threading.Timer(0.02, handler.push, [[RoomState(room=9, state=3 + (poll == 0))]])
            timer.start()
            start = time.monotonic()
            c.wait_change(since, timeout=2.0, poll=poll)
            timer.join()
            assert c.version > since and time.monotonic() - start < 1.0
        assert c.poll(9) == (4, "")


def test_socket_file_admits_only_its_owner(tmp_path):
    server = LocalApiServer(str(tmp_path / "agent.sock"), Recorder()).start()
    try:
        mode = os.stat(server.socket_path).st_mode & 0o777
        assert mode == 0o600, oct(mode)
        assert not list(tmp_path.glob("*.new"))  # bound under a private name, moved into place
    finally:
        server.stop()
    grouped = LocalApiServer(str(tmp_path / "g.sock"), Recorder(), group=os.getgid()).start()
    try:
        st = os.stat(grouped.socket_path)
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, os.getgid())
    finally:
        grouped.stop()
    longest = str(tmp_path / "s")
    longest += "x" * (107 - len(longest))  # no room for a suffix: bound in place, same mode
    assert len(os.fsencode(longest)) == 107
    server = LocalApiServer(longest, Recorder()).start()
    try:
        assert os.stat(longest).st_mode & 0o777 == 0o600
    finally:
        server.stop()


def test_a_process_of_another_uid_is_refused_clearly_and_the_engine_still_gets_in(tmp_path):
    """The first process on the socket is not the engine (its uid is not allowed): refused with one
    line naming its uid and the setting, counted, and it takes no slot the engine needs."""
    handler = Recorder()
    engine_uid = os.getuid() + 4242  # this test process is then "another uid"
    server = LocalApiServer(str(tmp_path / "agent.sock"), handler, allowed_uids=[engine_uid]).start()
    try:
        s, reader = raw(server)
        with s:
            err = decode_agent_message(reader.read())
            assert err.code == "forbidden"
            assert f"uid {os.getuid()} may not use" in err.message
            assert "localapi.engine.allowedUids" in err.message and "\n" not in err.message
            assert s.recv(1) == b""  # and the connection is closed
        assert server.refused == 1 and handler.registered == [] and not server._active
        server.allowed_uids = frozenset({os.getuid()})  # now this process is the engine
        regions = [(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]
        with client(server) as c, SharedPools(regions) as pools:
            c.register_pools(pools.regions, pools.fds)
        assert handler.registered == [(len(SCHEMA.regions()), 1)]
    finally:
        server.stop()


def test_registering_on_an_unconnected_client_registers_once(served):
    """Connecting registers the remembered pools; ``register_pools`` must not send them a second time
    (a second registration restarts the agent's runtime for nothing)."""
    server, handler = served
    c = client(server)
    try:
        with SharedPools([(r.name, r.component, r.tensor, r.size) for r in SCHEMA.regions()]) as pools:
            c.register_pools(pools.regions, pools.fds)
        assert handler.registered == [(len(SCHEMA.regions()), 1)]
    finally:
        c.close()
