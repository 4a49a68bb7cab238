"""Peer authentication against real agent processes on loopback: a prefill and a decode of one PDPair
(one pairing key) move verified rooms the whole time, while a stranger on the network tries what an
attacker on the pod network would — a third decode without the key or with another PDPair's, forged
registrations, transfer metadata and refusals naming the real peers, replays. Each attack is refused
and counted by reason on the agent it targets (``/status`` ``refusals``), gets no answer, and the
real pair keeps serving with every byte of every room verified.
"""

from __future__ import annotations

import hashlib
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq

from dataplane.agent.launch import AgentProcess, loopback_pair
from dataplane.codec import GUARD, Refused, Registration, TransferMetadata, encode_control, encode_metadata
from dataplane.codec.auth import SEAL_MAGIC, key_id, new_nonce, prove_registration
from dataplane.codec.registration import encode_registration
from dataplane.config import AgentConfig, AuthConfig, ModelConfig, SyntheticConfig, TransferConfig

pytestmark = [pytest.mark.nixl, pytest.mark.slow]

HB = 0.5
QUIET = 1.0
"""How long a stranger listens for an answer that must not come."""


def config(requests: int = 0) -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=128, max_requests=8),
        transfer=TransferConfig(timeout_seconds=5, heartbeat_interval_seconds=HB, heartbeat_misses=6),
        synthetic=SyntheticConfig(
            requests_per_second=20, requests=requests, tokens=(700, 0, 2048), max_inflight=3, verify=True
        ),
    )


def wait_for(pred: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Pair:
    def __init__(self, prefill: AgentProcess, decode: AgentProcess, workdir: Path):
        self.prefill, self.decode, self.workdir = prefill, decode, workdir
        self.key = Path(prefill.cfg.auth.key_file or "").read_bytes()

    def refusals(self, agent: AgentProcess) -> dict[str, int]:
        r = agent.status()["refusals"]
        return {k: v for k, v in r.items() if k != "recent"}

    def rooms(self) -> dict[str, int]:
        return dict(self.decode.status()["requests"])

    def keeps_serving(self, before: dict[str, int], more: int = 5) -> None:
        """Decode completes ``more`` rooms after ``before``, every one succeeded and verified."""
        want = before["succeeded"] + more
        wait_for(lambda: self.rooms()["succeeded"] >= want, what="rooms after the attack")
        after = self.rooms()
        assert after["verification_failures"] == 0, after
        failed = after["completed"] - after["succeeded"]
        assert failed == before["completed"] - before["succeeded"], (before, after, self.decode.log_tail())
        assert self.decode.status()["prefill"]["0"]["state"] == "paired"
        components = self.decode.status()["components"]
        for name, c in components.items():
            assert c["verified_bytes"] == c["bytes"] and c["mismatched_bytes"] == 0, name


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("security")
    (p_cfg,), (d_cfg,) = loopback_pair(config())
    prefill = AgentProcess(p_cfg, tmp, "prefill")
    decode = AgentProcess(d_cfg, tmp, "decode")
    try:
        prefill.wait_ready()
        decode.wait_ready()
        wait_for(lambda: decode.status()["requests"]["succeeded"] >= 3, what="the pair serving")
        yield Pair(prefill, decode, tmp)
    finally:
        decode.stop()
        prefill.stop()


@pytest.fixture
def stranger() -> Iterator[tuple[zmq.Socket, zmq.Socket, int, zmq.Context]]:
    """A PUSH socket to aim at agents and a PULL socket bound on loopback, its port the stranger's
    own return address."""
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.setsockopt(zmq.LINGER, 0)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield push, pull, port, ctx
    finally:
        push.close()
        pull.close()
        ctx.term()


def heard(pull: zmq.Socket, seconds: float = QUIET) -> list[list[bytes]]:
    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if pull.poll(int(left * 1000) + 1):
            out.append(pull.recv_multipart())
    return out


def registration(port: int) -> list[bytes]:
    """A plain registration (sglang's frames) naming ``127.0.0.1:port`` as the decode."""
    reg = Registration(
        endpoint="127.0.0.1",
        dst_port=port,
        engine_desc=msgspec.msgpack.encode(["stranger"]),
        dst_kv_mem_descs=(b"\x00" * 16,),
        dst_kv_item_len=4096,
    )
    return encode_registration(reg)


def control(agent: AgentProcess) -> str:
    return f"tcp://127.0.0.1:{agent.ports['control_port']}"


def increased(pair: Pair, agent: AgentProcess, before: dict[str, int], reason: str) -> bool:
    return pair.refusals(agent)[reason] > before[reason]


def test_a_decode_without_the_key_is_refused_counted_and_gets_no_bytes(pair: Pair, tmp_path: Path) -> None:
    before, rooms = pair.refusals(pair.prefill), pair.rooms()
    (_,), (d_cfg,) = loopback_pair(config(), bootstrap_port=pair.prefill.cfg.listen.bootstrap_port)
    third = AgentProcess(msgspec.structs.replace(d_cfg, auth=AuthConfig()), tmp_path, "keyless", keyless=True)
    try:
        third.wait_ready()
        wait_for(lambda: increased(pair, pair.prefill, before, "unauthenticated"), what="the refusal")
        time.sleep(QUIET)
        st = third.status()
        assert st["prefill"]["0"]["state"] == "registering", st["prefill"]
        assert st["requests"]["made"] == 0 and not st["components"]
        assert {k: v for k, v in st["refusals"].items() if k != "recent"} == dict.fromkeys(
            ("unauthenticated", "bad_mac", "replay", "foreign_pdpair"), 0
        ), "prefill answered the keyless decode"
    finally:
        third.stop()
    pair.keeps_serving(rooms)


def test_a_decode_of_another_pdpair_is_refused_as_foreign(pair: Pair, tmp_path: Path) -> None:
    before, rooms = pair.refusals(pair.prefill), pair.rooms()
    other_key = tmp_path / "other.key"
    other_key.write_bytes(b"o" * 32)
    (_,), (d_cfg,) = loopback_pair(config(), bootstrap_port=pair.prefill.cfg.listen.bootstrap_port)
    third = AgentProcess(
        msgspec.structs.replace(d_cfg, auth=AuthConfig(key_file=str(other_key))), tmp_path, "foreign"
    )
    try:
        third.wait_ready()
        wait_for(lambda: increased(pair, pair.prefill, before, "foreign_pdpair"), what="the refusal")
        st = third.status()
        assert st["prefill"]["0"]["state"] == "registering" and st["requests"]["made"] == 0
    finally:
        third.stop()
    pair.keeps_serving(rooms)


def test_stranger_registrations_get_no_answer_and_never_displace_decode(pair: Pair, stranger: Any) -> None:
    """Plain, forged (the PDPair's key id, a MAC made without the key) and replayed registrations,
    for the stranger's own address and for decode's: refused by reason, no answer, decode stays."""
    push, pull, port, _ = stranger
    push.connect(control(pair.prefill))
    instance = pair.prefill.ports["instance"]
    before, rooms = pair.refusals(pair.prefill), pair.rooms()
    for target in (port, pair.decode.ports["control_port"]):
        push.send_multipart(registration(target))
    want = before["unauthenticated"] + 2
    wait_for(lambda: pair.refusals(pair.prefill)["unauthenticated"] >= want, what="refusals")

    body = registration(port)
    forged = prove_registration(b"not the key" * 3, body, instance, time.time_ns(), new_nonce())
    tag = key_id(pair.key)
    forged = forged.replace(key_id(b"not the key" * 3), tag)  # the PDPair's public tag, a MAC without the key
    push.send_multipart([*body, forged])
    wait_for(lambda: increased(pair, pair.prefill, before, "bad_mac"), what="bad_mac")

    stale = prove_registration(pair.key, body, "an-old-instance", time.time_ns(), new_nonce())
    push.send_multipart([*body, stale])  # a registration meant for another prefill process
    wait_for(lambda: increased(pair, pair.prefill, before, "replay"), what="replay")
    assert heard(pull) == [], "prefill answered a stranger"
    pair.keeps_serving(rooms)


def test_a_proven_registration_replayed_is_refused(pair: Pair, stranger: Any) -> None:
    """The key holder's registration (its descriptors name no real memory, so prefill refuses it,
    sealed, to the address it proved), sent again: a replay, counted and unanswered."""
    push, pull, port, _ = stranger
    push.connect(control(pair.prefill))
    before = pair.refusals(pair.prefill)
    body = registration(port)
    proof = prove_registration(pair.key, body, pair.prefill.ports["instance"], time.time_ns(), new_nonce())
    frames = [*body, proof]
    push.send_multipart(frames)
    answer = heard(pull, 5.0)
    assert len(answer) == 1 and answer[0][-1].startswith(SEAL_MAGIC), answer  # the sealed Refused
    push.send_multipart(frames)
    wait_for(lambda: increased(pair, pair.prefill, before, "replay"), what="replay")
    assert heard(pull) == []


def test_metadata_naming_decode_is_refused_and_decode_pools_untouched(pair: Pair, stranger: Any) -> None:
    push, pull, port, _ = stranger
    push.connect(control(pair.prefill))
    before, rooms = pair.refusals(pair.prefill), pair.rooms()
    for room in range(20):
        md = TransferMetadata(
            room=room,
            endpoint="127.0.0.1",
            dst_port=pair.decode.ports["control_port"],
            engine_key="decode",
            dst_kv_indices=np.arange(8, dtype=np.int32),
        )
        frames = encode_metadata(md)
        push.send_multipart(frames)  # unsealed
        push.send_multipart([*frames, SEAL_MAGIC + new_nonce()[:8] + bytes(8) + bytes(16)])  # forged seal
    md = TransferMetadata(
        room=99,
        endpoint="127.0.0.1",
        dst_port=port,
        engine_key="x",
        dst_kv_indices=np.arange(4, dtype=np.int32),
    )
    push.send_multipart(encode_metadata(md))  # the stranger's own, unregistered address
    want = before["unauthenticated"] + 41
    wait_for(lambda: pair.refusals(pair.prefill)["unauthenticated"] >= want, what="refusals")
    assert heard(pull) == [], "prefill answered metadata for an unregistered address"
    pair.keeps_serving(rooms, more=10)


def test_spoofed_refusals_and_statuses_to_decode_change_nothing(pair: Pair, stranger: Any) -> None:
    push, _, _, _ = stranger
    push.connect(control(pair.decode))
    before, rooms = pair.refusals(pair.decode), pair.rooms()
    agent = pair.prefill.ports["agent"]
    refused = [encode_control(Refused(reason="go away", agent_id=agent))]
    push.send_multipart(refused)
    push.send_multipart([*refused, SEAL_MAGIC + new_nonce()[:8] + bytes(8) + bytes(16)])
    status = [GUARD, b"%d" % 12345, b"4", b"0", b"spoofed failure"]
    push.send_multipart(status)
    want = before["unauthenticated"] + 3
    wait_for(lambda: pair.refusals(pair.decode)["unauthenticated"] >= want, what="refusals")
    pair.keeps_serving(rooms)
    assert all(r["reason"] != "go away" for r in pair.decode.status()["refusals"]["recent"])


def test_refusals_reach_metrics(pair: Pair) -> None:
    with urllib.request.urlopen(pair.prefill.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'pdpair_peer_refusals_total{reason="unauthenticated",role="prefill"}' in text


def test_a_plain_peer_pairs_only_where_the_pdpair_allows_it(tmp_path: Path) -> None:
    """A decode without the key (a plain peer) pairs with a prefill that allows plain peers and
    moves verified rooms."""
    base = msgspec.structs.replace(config(requests=6), auth=AuthConfig(allow_plain_peers=True))
    (p_cfg,), (d_cfg,) = loopback_pair(base)
    plain_d = msgspec.structs.replace(d_cfg, auth=AuthConfig(allow_plain_peers=True))
    prefill = AgentProcess(p_cfg, tmp_path, "prefill")
    decode = AgentProcess(plain_d, tmp_path, "plain-decode", keyless=True)
    try:
        prefill.wait_ready()
        decode.wait_ready()
        wait_for(lambda: decode.status()["requests"]["completed"] >= 6, what="plain rooms")
        st = decode.status()
        assert st["requests"]["succeeded"] == 6 and st["requests"]["verification_failures"] == 0
    finally:
        decode.stop()
        prefill.stop()


def test_key_file_digest_is_not_on_the_wire() -> None:
    """The proof carries a one-way tag of the key, not the key or a plain hash of it."""
    key = b"k" * 32
    frame = prove_registration(key, [b"a"], "i", 1, new_nonce())
    assert key not in frame and hashlib.sha256(key).digest()[:8] not in frame


def test_a_decode_prefill_dropped_gets_no_answer_then_pairs_again(tmp_path: Path) -> None:
    """Frozen past its heartbeats, decode is dropped by prefill; thawed, it sees that it stalled past
    the heartbeat limit, takes the old pairing for lost (the beats prefill queued before dropping it do
    not revive it), registers again at once and serves verified rooms."""
    (p_cfg,), (d_cfg,) = loopback_pair(config())
    prefill = AgentProcess(p_cfg, tmp_path, "prefill")
    decode = AgentProcess(d_cfg, tmp_path, "decode")
    try:
        prefill.wait_ready()
        decode.wait_ready()
        pair = Pair(prefill, decode, tmp_path)
        wait_for(lambda: pair.rooms()["succeeded"] >= 3, what="the pair serving")
        decode.signal(signal.SIGSTOP)

        def dropped() -> bool:
            peers = prefill.status()["peers"]
            return bool(peers) and all(p["state"] == "down" for p in peers.values())

        wait_for(dropped, timeout=20, what="decode dropped by prefill")
        decode.signal(signal.SIGCONT)
        wait_for(lambda: "decode stalled" in decode.log_path.read_text(), what="decode's stall noticed")
        wait_for(lambda: decode.status()["prefill"]["0"]["state"] == "paired", what="paired again")
        rooms = pair.rooms()
        want = rooms["succeeded"] + 5
        wait_for(lambda: pair.rooms()["succeeded"] >= want, what="rooms of the new pairing")
        assert pair.rooms()["verification_failures"] == 0
        assert decode.status()["prefill"]["0"]["state"] == "paired"
    finally:
        decode.stop()
        prefill.stop()
