"""The role worker's loop settings that do not need a peer."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest

from dataplane.agent.roles import tight_timers

PR_GET_TIMERSLACK = 30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux setting")
def test_the_worker_thread_sleeps_with_tight_timers_and_others_keep_theirs():
    prctl = ctypes.CDLL(None).prctl
    seen = {}

    def worker():
        seen["before"] = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
        tight_timers()
        seen["after"] = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)

    t = threading.Thread(target=worker)
    t.start()
    t.join(5)
    assert seen["after"] == 1 and seen["before"] > 1
    assert prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == seen["before"]  # per thread: this one is untouched


def test_worker_cpu_is_exported_for_the_worker_thread_only():
    from dataplane.agent.metrics import AgentMetrics

    metrics = AgentMetrics("prefill", "p@host")
    assert b"pdpair_agent_worker_cpu_seconds_total{" not in metrics.exposition()  # no worker yet
    stop, started = threading.Event(), threading.Event()

    def busy():
        started.set()
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        stop.wait(5)

    t = threading.Thread(target=busy)
    t.start()
    started.wait(5)
    metrics.worker_cpu.native_id = t.native_id
    deadline = time.monotonic() + 5
    while (metrics.worker_cpu.seconds() or 0) < 0.05 and time.monotonic() < deadline:
        time.sleep(0.01)
    line = next(ln for ln in metrics.exposition().decode().splitlines() if ln.startswith(
        'pdpair_agent_worker_cpu_seconds_total{role="prefill"}'))
    assert 0.05 <= float(line.split()[-1]) < 5  # this thread's CPU, not the process's
    stop.set()
    t.join(5)
    deadline = time.monotonic() + 5  # join returns a moment before the kernel reaps the thread
    while metrics.worker_cpu.seconds() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metrics.worker_cpu.seconds() is None  # the thread is gone: no stale figure


def test_messages_handled_together_nest_and_restore_the_turn():
    """``together`` marks how many messages a turn handles (prefill's hint to overlap large copies)
    and corks the lanes; a nested batch (the sidecar's engine requests inside a drained batch) keeps
    the larger count and leaves restoring both to the outer one."""
    from dataplane.agent import AgentRuntime
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.transports import mori_double

    (p_cfg,), _ = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    rt = AgentRuntime(p_cfg, transport_sdk=mori_double)
    worker = rt.worker
    try:
        assert worker.turn == 1 and worker.lanes is not None and not worker.lanes.corked
        with worker.together(1):
            assert worker.turn == 1 and not worker.lanes.corked  # one message: nothing to batch
        with worker.together(3):
            assert worker.turn == 3 and worker.lanes.corked
            with worker.together(2):
                assert worker.turn == 3 and worker.lanes.corked
            assert worker.turn == 3 and worker.lanes.corked
        assert worker.turn == 1 and not worker.lanes.corked
    finally:
        worker.shutdown()
        rt.transport.close()


def test_the_transport_wakes_its_worker_from_another_thread():
    """The worker hands its transport a ``waker``: an engine thread calling it (NIXL's posting
    thread, once a queued write is posted) ends the worker's blocked wait with a ``WAKE`` frame; a
    hand-off while the worker is awake sends none, and the worker's next wait does not block."""
    from dataplane.agent import AgentRuntime
    from dataplane.agent.control_sockets import WAKE
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.transports import mori_double

    (p_cfg,), _ = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    rt = AgentRuntime(p_cfg, transport_sdk=mori_double)
    worker = rt.worker
    try:
        waker = rt.transport.waker
        assert waker is not None
        inbox = worker.inbox
        assert inbox.recv(0) is None

        def wake_once_asleep() -> None:
            for _ in range(5000):
                if inbox.sleeping:
                    break
                time.sleep(0.001)
            waker()

        t = threading.Thread(target=wake_once_asleep)
        t.start()
        start = time.monotonic()
        assert inbox.recv(5.0) == [WAKE]
        assert time.monotonic() - start < 2.5
        t.join(5)
        waker()  # the worker is awake: no frame, but its next wait must not block
        start = time.monotonic()
        assert inbox.recv(5.0) is None
        waker()
        inbox.wait(5.0)  # the pause between polls of running transfers: the same
        assert time.monotonic() - start < 1.0
        assert inbox.recv(0) is None and not inbox.handed_over
    finally:
        worker.shutdown()
        rt.transport.close()


def test_an_engine_request_handed_to_an_awake_sidecar_worker_is_drained_in_its_next_turn():
    """The local API's connection thread submits to a worker that is awake: no ``WAKE`` frame goes out
    (``Waker``), so the worker must not depend on one — its next wait ends at once and its turn drains
    the link (``tick``; a request left queued would also keep every later one from waking it)."""
    import functools

    from dataplane.agent import AgentRuntime
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.localapi.link import AbortCmd, EngineLink
    from dataplane.localapi.sidecar import external_worker
    from dataplane.transports import mori_double

    _, (d_cfg,) = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    link = EngineLink()
    rt = AgentRuntime(
        d_cfg, transport_sdk=mori_double, worker_factory=functools.partial(external_worker, link=link)
    )
    worker = rt.worker
    try:
        assert worker.inbox.recv(0) is None
        link.submit(AbortCmd(7, "engine gave up"))
        assert link._commands and not worker.inbox.sleeping
        start = time.monotonic()
        assert worker.inbox.recv(5.0) is None  # no frame was sent, and the wait did not block
        assert time.monotonic() - start < 1.0
        worker.poll_transfers()
        worker.tick(time.monotonic())
        assert not link._commands
    finally:
        worker.shutdown()
        rt.transport.close()


def test_a_runtime_whose_worker_cannot_be_made_closes_its_transport(monkeypatch: pytest.MonkeyPatch):
    """A sidecar builds a runtime per engine connection: one that fails half-way (here the worker) must
    not leave the transport's threads behind, or an engine retrying every half second piles them up."""
    from dataplane.agent import AgentRuntime, runtime
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.transports import mori_double

    made = []
    real = runtime.make_transport

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(real(*args, **kwargs))
        return made[-1]

    def no_worker(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("worker refused")

    monkeypatch.setattr(runtime, "make_transport", recording)
    (p_cfg,), _ = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    with pytest.raises(RuntimeError, match="worker refused"):
        AgentRuntime(p_cfg, transport_sdk=mori_double, worker_factory=no_worker)
    assert len(made) == 1 and made[0]._closed


@pytest.mark.parametrize("reply_spin_us", [0, 100_000])
def test_a_sidecar_worker_polls_for_its_engines_answer_after_pushing_what_it_acts_on(reply_spin_us):
    """After pushing a state the engine acts on (here the Failed of an aborted room), the worker's
    loop polls without sleeping for ``replySpinMicroseconds`` (counted readiness checks), then sleeps."""
    import functools

    from dataplane.agent import AgentRuntime
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.localapi.link import AbortCmd, EngineLink
    from dataplane.localapi.sidecar import external_worker
    from dataplane.transports import mori_double

    base = AgentConfig(transfer=TransferConfig(backend="mori"))
    _, (d_cfg,) = loopback_pair(base.with_engine(reply_spin_microseconds=reply_spin_us))
    pushed: list = []
    link = EngineLink(pushed.append)
    rt = AgentRuntime(
        d_cfg, transport_sdk=mori_double, worker_factory=functools.partial(external_worker, link=link)
    )
    worker = rt.worker
    worker.start(rt.stop_event)
    try:
        time.sleep(0.2)  # start-up's own work done
        link.submit(AbortCmd(7, "engine gave up"))
        deadline = time.monotonic() + 5
        while not pushed and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [(st.room, st.state) for st in pushed[0]] == [(7, 0)]
        checks = worker.inbox.spin_checks
        time.sleep(0.3)
        spun = worker.inbox.spin_checks - checks
        time.sleep(0.2)
        assert (spun > 100) if reply_spin_us else (spun == 0), spun
        assert worker.inbox.spin_checks - checks == spun  # the spin ended: the loop sleeps again
    finally:
        rt.stop()  # its ZMQ context too: one left to the garbage collector can block in ``term``


def test_a_worker_loop_that_fails_still_runs_its_shutdown():
    """A bug that ends the loop must not leave the hooks undone (the sidecar's returns the engine's
    connection to its thread, which would otherwise wait for it for ever) or the sockets open."""
    from dataplane.agent import AgentRuntime
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.transports import mori_double

    (p_cfg,), _ = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    rt = AgentRuntime(p_cfg, transport_sdk=mori_double)
    worker, hooked = rt.worker, []
    worker.on_shutdown.append(lambda: hooked.append("shut down"))

    def broken(now: float) -> None:
        raise RuntimeError("a bug in a turn")

    worker.tick = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="a bug in a turn"):
            worker.run(threading.Event())
        assert hooked == ["shut down"]
    finally:
        rt.transport.close()


def test_prefill_takes_a_burst_of_messages_a_few_per_turn():
    """Decode's metadata arrives in bursts (one write per turn); prefill handles at most
    ``turn_messages`` of them per turn, so its replies leave while the rest are still to do — and every
    message is still handled."""
    import zmq

    from dataplane.agent import AgentRuntime
    from dataplane.codec import Heartbeat, encode_control
    from dataplane.config import AgentConfig, TransferConfig
    from dataplane.harness.agent_processes import loopback_pair
    from dataplane.transports import mori_double

    (p_cfg,), _ = loopback_pair(AgentConfig(transfer=TransferConfig(backend="mori")))
    rt = AgentRuntime(p_cfg, transport_sdk=mori_double)
    worker = rt.worker
    limit = worker.turn_messages
    assert 1 < limit < 10
    turns: list[int] = []
    together = worker.together

    def recording(n: int):  # type: ignore[no-untyped-def]
        if n:
            turns.append(n)
        return together(n)

    worker.together = recording  # type: ignore[method-assign]
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://{p_cfg.listen.host}:{worker.inbox.port}")
    stop = threading.Event()
    try:
        for seq in range(10):
            push.send(encode_control(Heartbeat(agent_id="decode-x", seq=seq, time_ns=seq)))
        for _ in range(500):  # the burst is queued on the inbox before the worker starts
            if worker.inbox._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                break
            time.sleep(0.001)
        time.sleep(0.1)
        worker.start(stop)
        for _ in range(500):
            if sum(turns) >= 10:
                break
            time.sleep(0.01)
        assert sum(turns) == 10
        assert max(turns) == limit and all(n <= limit for n in turns)
    finally:
        stop.set()
        if worker.thread is not None:
            worker.thread.join(5)
        push.close()
        worker.shutdown()
        rt.transport.close()


def test_the_agents_process_carries_the_engines_environment_and_no_transport_writes_it(
    monkeypatch: pytest.MonkeyPatch,
):
    """UCX and MoRI read their devices from the environment when their backend is made: the agent's
    runtime sets it for its process (``make_transport``); a transport made directly leaves it alone."""
    import os

    import msgspec

    from dataplane.agent import runtime
    from dataplane.config import AgentConfig, MoriConfig, TransferConfig
    from dataplane.transports import mori_double
    from dataplane.transports.mori import MoriTransport

    monkeypatch.delenv("MORI_RDMA_DEVICES", raising=False)
    mori = MoriConfig(rdma_devices=["mlx5_0", "mlx5_1"])
    MoriTransport("direct", "127.0.0.1", mori, sdk=mori_double).close()
    assert "MORI_RDMA_DEVICES" not in os.environ
    cfg = AgentConfig(transfer=TransferConfig(backend="mori", mori=mori))
    cfg = msgspec.structs.replace(cfg, listen=msgspec.structs.replace(cfg.listen, host="127.0.0.1"))
    runtime.make_transport(cfg, "made", sdk=mori_double).close()
    assert os.environ["MORI_RDMA_DEVICES"] == "mlx5_0,mlx5_1"
