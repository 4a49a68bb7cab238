"""Peer authentication against real agent processes on loopback: a prefill and a decode of one PDPair
(one pairing key) move verified rooms the whole time, while a stranger on the network tries what an
attacker on the pod network would — a third decode without the key or with another PDPair's (no
address from ``/topology``, its registration sent straight to the control port), forged
registrations, transfer metadata and refusals naming the real peers, replays. Each attack is a function
of ``dataplane.harness.bench.attacks`` (a row of ``pdpair-agent bench attacks``' table in docs/security.md):
it is refused and counted by reason on the agent it targets (``/status`` ``refusals``), gets no
answer, and the real pair keeps serving, paired, with every byte of every room verified.
"""

from __future__ import annotations

import hashlib
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest

from dataplane.codec.auth import new_nonce, prove_registration
from dataplane.harness.bench import attacks as a
from dataplane.harness.waiting import wait_for

pytestmark = [pytest.mark.nixl, pytest.mark.slow]



@pytest.fixture(scope="module")
def pair() -> Iterator[a.Pair]:
    with a.running_pair() as running:
        running.wait_served(3)
        yield running


def kept_serving(f: a.Finding) -> None:
    """More rooms succeeded after the attack, none failed, every byte verified, decode still paired."""
    after = f.figures["served_after"]
    assert after["verification_failures"] == 0 and not after["unverified_components"], after
    assert after["paired"], "decode was displaced"
    assert f.figures["kept_serving"], f.figures


def test_a_decode_without_the_key_is_refused_counted_and_gets_no_bytes(pair: a.Pair) -> None:
    f = a.keyless_decode(pair)
    assert "gave only its public topology" in f.figures["third_bootstrap_error"], f.outcome
    assert f.figures["third_state"] == "without a prefill address", f.outcome
    assert f.figures["refused"] and f.figures["refusals"]["unauthenticated"] >= 1, f.outcome
    assert f.figures["answers"] == 0, "prefill answered the keyless registration"
    assert f.figures["third_rooms_made"] == 0 and f.figures["third_components"] == 0, f.outcome
    assert f.figures["third_refusals"] == dict.fromkeys(a.REASONS, 0), "prefill answered the keyless decode"
    kept_serving(f)
    assert f.passed


def test_a_decode_of_another_pdpair_is_refused_as_foreign(pair: a.Pair) -> None:
    f = a.foreign_decode(pair)
    assert "401" in f.figures["third_bootstrap_error"], f.outcome
    assert f.figures["third_state"] == "without a prefill address", f.outcome
    assert f.figures["third_rooms_made"] == 0 and f.figures["third_components"] == 0, f.outcome
    assert f.figures["refused"] and f.figures["refusals"]["foreign_pdpair"] >= 1, f.outcome
    assert f.figures["answers"] == 0, "prefill answered a registration proven with another key"
    kept_serving(f)
    assert f.passed


def test_stranger_registrations_get_no_answer_and_never_displace_decode(pair: a.Pair) -> None:
    """Plain, forged (the PDPair's key id, a MAC made without the key) and replayed registrations,
    for the stranger's own address and for decode's: refused by reason, no answer, decode stays."""
    f = a.registrations(pair)
    assert f.figures["refused"] == {"unauthenticated": True, "bad_mac": True, "replay": True}, f.outcome
    assert f.figures["refusals"]["unauthenticated"] >= 2, f.outcome
    assert f.figures["answers"] == 0, "prefill answered a stranger"
    kept_serving(f)
    assert f.passed


def test_a_proven_registration_replayed_is_refused(pair: a.Pair) -> None:
    """The key holder's registration is answered once, sealed; the same frames again are a replay,
    counted and unanswered."""
    f = a.replayed_registration(pair)
    assert f.figures["first_answers"] == 1 and f.figures["first_sealed"], f.outcome
    assert f.figures["replay_refused"] and f.figures["answers"] == 0, f.outcome
    assert f.passed


def test_metadata_naming_decode_is_refused_and_decode_pools_untouched(pair: a.Pair) -> None:
    f = a.metadata_as_decode(pair)
    assert f.figures["refused"] and f.figures["refusals"]["unauthenticated"] >= 41, f.outcome
    assert f.figures["answers"] == 0, "prefill answered metadata for an unregistered address"
    kept_serving(f)
    assert f.passed


def test_spoofed_refusals_and_statuses_to_decode_change_nothing(pair: a.Pair) -> None:
    f = a.spoofed_refusals(pair)
    assert f.figures["refused"] and f.figures["refusals"]["unauthenticated"] >= 3, f.outcome
    assert not f.figures["believed"], "decode recorded the spoofed refusal"
    kept_serving(f)
    assert f.passed


def test_refusals_reach_metrics(pair: a.Pair) -> None:
    with urllib.request.urlopen(pair.prefill.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'pdpair_peer_refusals_total{reason="unauthenticated",role="prefill",tp_rank="0"}' in text


def test_a_plain_peer_pairs_only_where_the_pdpair_allows_it(pair: a.Pair) -> None:
    """A decode without the key (a plain peer) pairs with a prefill that allows plain peers and
    moves verified rooms (refused without the setting: the first test)."""
    f = a.allowed_plain_peer(pair)
    assert f.figures["succeeded"] == 6 and f.figures["verified"], f.outcome
    assert f.passed


def test_key_file_digest_is_not_on_the_wire() -> None:
    """The proof carries a one-way tag of the key, not the key or a plain hash of it."""
    key = b"k" * 32
    frame = prove_registration(key, [b"a"], "i", 1, new_nonce())
    assert key not in frame and hashlib.sha256(key).digest()[:8] not in frame


def test_a_decode_prefill_dropped_gets_no_answer_then_pairs_again() -> None:
    """Frozen past its heartbeats, decode is dropped by prefill; thawed, it sees that it stalled past
    the heartbeat limit, takes the old pairing for lost (the beats prefill queued before dropping it do
    not revive it), registers again at once and serves verified rooms."""
    with a.running_pair() as pair:
        prefill, decode = pair.prefill, pair.decode
        assert pair.wait_served(3), "the pair is not serving"
        decode.signal(signal.SIGSTOP)

        def dropped() -> bool:
            peers = prefill.status()["peers"]
            return bool(peers) and all(p["state"] == "down" for p in peers.values())

        wait_for("decode dropped by prefill", dropped, timeout=20)
        # Prefill drops decode a heartbeat limit after decode's last beat, and decode's last turn may have
        # come up to a beat later: frozen one limit more, decode's stall is past the limit in any phase.
        tr = decode.cfg.transfer
        time.sleep(tr.heartbeat_interval_seconds * tr.heartbeat_misses)
        decode.signal(signal.SIGCONT)
        wait_for("decode's stall noticed", lambda: "decode stalled" in decode.log_path.read_text())
        wait_for("paired again", lambda: decode.status()["prefill"]["0"]["state"] == "paired")
        rooms = pair.served()
        assert pair.wait_served(5, since=rooms), "no rooms of the new pairing"
        assert pair.served()["verification_failures"] == 0
        assert decode.status()["prefill"]["0"]["state"] == "paired"
