"""Peer authentication's pieces: registration proofs, pairing keys, seals, the replay window, and the
agent's ``PeerAuth`` opening sealed messages (replays, forgeries with the real pair id) and reporting
refusals (counts, ``/status``, the ``pdpair.io/PeerRefusals`` condition)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dataplane.agent.health import AgentStatus
from dataplane.agent.metrics import AgentMetrics
from dataplane.agent.peerauth import Pairing, PeerAuth, Pending
from dataplane.codec import Heartbeat, Hello, encode_control
from dataplane.codec.auth import (
    REPLAY_WINDOW,
    AuthFailure,
    ReplayWindow,
    check_registration,
    new_nonce,
    pair_id,
    pairing_key,
    prove_registration,
    seal,
    seal_holds,
    split_proof,
)
from dataplane.podstatus import PEER_REFUSALS, PodStatusReporter

KEY = b"k" * 32
OTHER = b"o" * 32
BODY = [b"MoriMsgGuard", b"None", b"127.0.0.1", b"5000"]


def proof(key: bytes = KEY, instance: str = "inst", when: int | None = None) -> bytes:
    return prove_registration(key, BODY, instance, time.time_ns() if when is None else when, new_nonce())


def reason(fn: Any) -> str:
    with pytest.raises(AuthFailure) as info:
        fn()
    return info.value.reason


def test_a_registration_proof_holds_only_for_its_frames_instance_time_and_key() -> None:
    now = time.time_ns()
    assert check_registration(KEY, BODY, proof(), "inst", now).instance == "inst"
    assert split_proof([*BODY, proof()])[0] == BODY and split_proof(BODY) == (BODY, None)
    assert reason(lambda: check_registration(KEY, [*BODY[:3], b"5001"], proof(), "inst", now)) == "bad_mac"
    assert reason(lambda: check_registration(KEY, BODY, proof(OTHER), "inst", now)) == "foreign_pdpair"
    assert reason(lambda: check_registration(KEY, BODY, proof(instance="old"), "inst", now)) == "replay"
    assert reason(lambda: check_registration(KEY, BODY, proof(when=now - 10**12), "inst", now)) == "replay"
    assert reason(lambda: check_registration(KEY, BODY, b"PDPAIR-PROOF-1\xc1", "inst", now)) == "bad_mac"


def test_the_replay_window_takes_each_number_once_in_any_order() -> None:
    w = ReplayWindow()
    assert [w.accept(n) for n in (1, 3, 2, 3, 1)] == [True, True, True, False, False]
    assert w.accept(REPLAY_WINDOW + 10) and not w.accept(5) and w.accept(REPLAY_WINDOW + 9)


def test_a_seal_binds_the_frames_and_the_pairing_key() -> None:
    pk = pairing_key(KEY, b"d" * 16, b"p" * 16, "tcp://127.0.0.1:5000", "inst")
    assert pk != pairing_key(KEY, b"d" * 16, b"p" * 16, "tcp://127.0.0.1:5001", "inst")
    frames = [b"a", b"bc"]
    sealed = [*frames, seal(pk, b"12345678", 1, frames)]
    assert seal_holds(pk, sealed)
    assert not seal_holds(pk, [b"ab", b"c", sealed[-1]])
    assert not seal_holds(pairing_key(OTHER, b"d" * 16, b"p" * 16, "tcp://127.0.0.1:5000", "inst"), sealed)


def auth(key: bytes | None = KEY) -> tuple[PeerAuth, AgentStatus, list[tuple[bool, str, str]]]:
    """``PeerAuth`` reporting through ``PodStatusReporter``; the reports: the condition each patch
    of the pod's status carries, as (status == "True", reason, message)."""
    reports: list[tuple[bool, str, str]] = []

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        (cond,) = body["status"]["conditions"]
        assert (namespace, name, cond["type"]) == ("ns", "pod-0", PEER_REFUSALS)
        reports.append((cond["status"] == "True", cond["reason"], cond["message"]))

    reporter = PodStatusReporter("ns", "pod-0", patcher=patch).sibling(PEER_REFUSALS)
    status = AgentStatus("prefill", "p", "i", None, reporter)
    return PeerAuth(key, False, AgentMetrics("prefill", "p"), status), status, reports


def test_sealed_messages_open_once_and_only_under_their_pairing() -> None:
    pa, status, _ = auth()
    nonce = new_nonce()
    pk = pairing_key(KEY, nonce, b"p" * 16, "tcp://127.0.0.1:5000", "inst")
    pa.add(Pairing(pair_id(nonce), "tcp://127.0.0.1:5000", pk))
    msg = [encode_control(Heartbeat(agent_id="d", seq=1, time_ns=1))]
    sealed = PeerAuth(KEY, False, AgentMetrics("decode", "d"), status)
    sealed.add(Pairing(pair_id(nonce), "tcp://127.0.0.1:9", pk))
    frames = sealed.seal("tcp://127.0.0.1:9", msg)
    assert pa.open(frames).address == "tcp://127.0.0.1:5000"
    assert reason(lambda: pa.open(frames)) == "replay"
    forged = [*msg, seal(b"x" * 32, pair_id(nonce), 2, msg)]  # the public pair id, a key without the PDPair's
    assert reason(lambda: pa.open(forged)) == "bad_mac"
    stranger = [*msg, seal(pk, b"87654321", 3, msg)]
    assert reason(lambda: pa.open(stranger)) == "unauthenticated"


def test_decode_opens_only_the_answer_its_registration_asked_for() -> None:
    pa, _, _ = auth()
    nonce, p_nonce = new_nonce(), new_nonce()
    pa.pending[pair_id(nonce)] = Pending(nonce, "tcp://127.0.0.1:5000", "inst", "tcp://127.0.0.1:6000")
    hello = [encode_control(Hello(agent_id="p", role="prefill", nonce=p_nonce))]
    pk = pairing_key(KEY, nonce, p_nonce, "tcp://127.0.0.1:5000", "inst")
    opened = pa.open([*hello, seal(pk, pair_id(nonce), 1, hello)])
    assert opened.fresh and opened.address == "tcp://127.0.0.1:6000" and opened.key == pk
    wrong = pairing_key(OTHER, nonce, p_nonce, "tcp://127.0.0.1:5000", "inst")
    assert reason(lambda: pa.open([*hello, seal(wrong, pair_id(nonce), 1, hello)])) == "bad_mac"
    beat = [encode_control(Heartbeat(agent_id="p", seq=1, time_ns=1))]
    assert reason(lambda: pa.open([*beat, seal(pk, pair_id(nonce), 2, beat)])) == "unauthenticated"


def test_refusals_are_counted_shown_and_reported_as_the_pod_condition() -> None:
    pa, status, reports = auth()
    assert reports == [(False, "None", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=0")]
    pa.refused("bad_mac", "x")
    pa.refused("bad_mac", "x")
    pa.refused("replay", "x")
    refusals = status.snapshot()["refusals"]
    assert {k: refusals[k] for k in ("unauthenticated", "bad_mac", "replay", "foreign_pdpair")} == {
        "unauthenticated": 0, "bad_mac": 2, "replay": 1, "foreign_pdpair": 0,
    }
    assert reports[-1] == (True, "BadMac", "unauthenticated=0 bad_mac=1 replay=0 foreign_pdpair=0")
    status._auth_reported = 0.0  # the throttle's interval has passed
    status.flush_refusals()
    assert reports[-1] == (True, "BadMac", "unauthenticated=0 bad_mac=2 replay=1 foreign_pdpair=0")
    text = pa.metrics.exposition().decode()
    assert 'pdpair_peer_refusals_total{reason="bad_mac",role="prefill"} 2.0' in text
