"""A decode resends its registration until it hears prefill's Hello; a resend that crosses the Hello
(a slow prefill, a loaded host) must not cost the rooms decode has started meanwhile. Prefill answers
an identical registration with Hello again and keeps the pairing, its rooms and the lane; a registration
with other content (a new decode process at the same address, proving the pair's key) still re-pairs,
and the rooms of the old pairing fail *with* a status to that address, so a decode still waiting for
them learns at once.
Real agents in one process, real bytes over NIXL (``tests.inprocess``)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import zmq

from dataplane.agent import AgentRuntime
from dataplane.agent.peerauth import Pending
from dataplane.codec.auth import new_nonce, pair_id, prove_registration
from dataplane.codec.frames import int_frame
from dataplane.config import AgentConfig, ListenConfig, ModelConfig, SyntheticConfig, TransferConfig
from dataplane.harness.agent_processes import loopback_pair
from tests.inprocess import verified_run

pytestmark = pytest.mark.nixl
REQUESTS = 120


def config(lanes: bool = True) -> AgentConfig:
    """Pools for the rooms of both re-pairings too: each failed room's items wait out its 20 s deadline
    in decode's quarantine (the rooms decode sent under the old pairing fail with it)."""
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=1024, max_requests=64),
        transfer=TransferConfig(timeout_seconds=20, heartbeat_interval_seconds=0.2),
        listen=ListenConfig(lanes=lanes),
        synthetic=SyntheticConfig(
            requests_per_second=400, requests=REQUESTS, tokens=(64, 300, 17), max_inflight=6, verify=True
        ),
    )


def as_new_decode(decode: AgentRuntime, prefill: AgentRuntime, body: list[bytes]) -> list[bytes]:
    """``body`` proven with the pair's key, as a new decode process at decode's address sends it;
    decode then awaits its answer (it takes the new pairing's ``Hello``)."""
    w = decode.worker
    nonce = new_nonce()
    w.auth.pending[pair_id(nonce)] = Pending(nonce, w.me, prefill.instance, w.peers[0].address)
    return [*body, prove_registration(w.auth.key, body, prefill.instance, time.time_ns(), nonce)]


def test_a_registration_resent_while_rooms_run_keeps_the_pairing_and_every_room() -> None:
    (p_cfg,), (d_cfg,) = loopback_pair(config())
    prefill = AgentRuntime(p_cfg).start()
    decode = AgentRuntime(d_cfg).start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    try:
        deadline = time.monotonic() + 30
        while not prefill.worker.peers and time.monotonic() < deadline:
            time.sleep(0.01)
        ((address, paired),) = prefill.worker.peers.items()
        lane = prefill.worker.lanes.by_address.get(address) if prefill.worker.lanes else None
        push.connect(f"tcp://127.0.0.1:{prefill.worker.inbox.port}")
        frames = list(decode.worker._reg_frames)
        done = threading.Event()

        def resend() -> None:  # decode's own retry, replayed while its rooms are under way
            for _ in range(20):
                if done.wait(0.05):
                    return
                push.send_multipart(frames)

        sender = threading.Thread(target=resend, daemon=True)
        sender.start()
        verified_run(decode, REQUESTS, timeout=60)
        done.set()
        sender.join(5)
        assert prefill.worker.peers[address] is paired, "an identical registration re-paired"
        if lane is not None:
            assert prefill.worker.lanes.by_address.get(address) is lane, "the lane was replaced"
    finally:
        push.close()
        ctx.term()
        decode.stop()
        prefill.stop()


def test_a_different_registration_fails_the_old_pairings_rooms_with_a_status(caplog) -> None:
    """Registrations with other content (here the GPU id flips, as from a new decode runtime at the
    same address) re-pair each time; the rooms under way then fail at once with the reason, told to
    decode — none waits out its 20 s deadline — and the other rooms succeed. On ZMQ: a re-pairing
    also replaces the lane, and frames the *still running* decode wrote on the old one would be lost;
    a real re-registration comes from a new runtime, whose old lane went with it."""
    (p_cfg,), (d_cfg,) = loopback_pair(config(lanes=False))
    prefill = AgentRuntime(p_cfg).start()
    decode = AgentRuntime(d_cfg).start()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    caplog.set_level(logging.WARNING)
    try:
        deadline = time.monotonic() + 30
        while not prefill.worker.peers and time.monotonic() < deadline:
            time.sleep(0.01)
        push.connect(f"tcp://127.0.0.1:{prefill.worker.inbox.port}")
        frames = list(decode.worker._reg_frames)
        start = time.monotonic()
        for n in range(2):
            while not prefill.worker.rooms and time.monotonic() - start < 10:  # rooms under way
                time.sleep(0.0005)
            body = [*frames[:8], int_frame((n + 1) % 2, field="gpu_id"), *frames[9:]]
            push.send_multipart(as_new_decode(decode, prefill, body))
            time.sleep(0.05)
        while decode.worker.completed < REQUESTS and time.monotonic() - start < 15:
            time.sleep(0.02)
        assert decode.worker.completed == REQUESTS, "a room of an old pairing waited for its deadline"
        failed = [r.getMessage() for r in caplog.records if "decode room" in r.getMessage()]
        assert len(failed) == REQUESTS - decode.worker.succeeded
        assert all("decode re-registered" in m or "re-paired" in m for m in failed), failed
        assert failed, "no room was under way at either re-pairing"
    finally:
        push.close()
        ctx.term()
        decode.stop()
        prefill.stop()
