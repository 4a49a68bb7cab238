"""The decode agent's prefill pods by bootstrap address (``agent/prefills.py``): addresses checked and
normalised, pods bounded by ``peer.maxPrefills`` (an idle one makes room), ranks shared between two
addresses of one prefill, peers replaced or no longer named handed back, failed reads reported; and
``Expect.bootstrap_addr`` on the local API (default, bound, checked before the worker sees it)."""

from __future__ import annotations

import urllib.error

import msgspec
import pytest

from dataplane.agent.bootstrap import RankInfo, Topology
from dataplane.agent.prefills import PrefillTable, bootstrap_address, plan_ranks
from dataplane.config import AgentConfig, ModelConfig
from dataplane.errors import BadInput
from dataplane.localapi.messages import Expect, decode_engine_message, encode_message
from dataplane.localapi.server import to_command
from dataplane.schema.profiles import schema_from_config


@pytest.mark.parametrize(("text", "normal"), [
    ("10.0.0.7:8998", "10.0.0.7:8998"),
    ("Prefill-0.Pods.NS.svc:08998", "prefill-0.pods.ns.svc:8998"),
    ("[::1]:8998", "[::1]:8998"),
    ("[2001:db8:0:0::7]:1", "[2001:db8::7]:1"),
])
def test_bootstrap_addresses_are_normalised(text, normal):
    assert bootstrap_address(text) == normal


@pytest.mark.parametrize(("text", "why"), [
    ("", "expected host:port"),
    ("10.0.0.7", "no port"),
    ("10.0.0.7:0", "no port"),
    ("10.0.0.7:65536", "no port"),
    ("10.0.0.7:http", "no port"),
    ("::1:8998", "is no host name"),
    ("[fe80::zz]:80", "not an IPv6 address"),
    ("a b:80", "is no host name"),
    ("-a.b:80", "is no host name"),
    ("a..b:80", "is no host name"),
    ("x" * 300 + ":80", "expected host:port"),
])
def test_bad_bootstrap_addresses_are_refused_naming_the_form(text, why):
    with pytest.raises(BadInput, match=why) as err:
        bootstrap_address(text)
    assert "host:port or [ipv6]:port" in str(err.value)


def topo(instance: str, port: int, tp: int = 1) -> Topology:
    agent = f"prefill@{instance}"
    ranks = tuple(RankInfo(r, "127.0.0.1", port + r, f"{instance}-{r}", agent) for r in range(tp))
    return Topology(f"prefill@{instance}", instance, "g", "m", tp, ranks)


def test_pods_are_bounded_and_an_idle_one_makes_room():
    table = PrefillTable("127.0.0.1", 8998, limit=2, key=None, idle=10.0)
    assert table.pod("", 0.0) is table.configured
    assert table.pod("127.0.0.1:8998", 0.0) is table.configured, "the configured address: the same pod"
    a = table.pod("10.0.0.1:8998", 0.0)
    assert table.pod("10.0.0.1:8998", 5.0) is a
    with pytest.raises(BadInput, match=r"already pairs with 2 prefill pods.*peer.maxPrefills 2"):
        table.pod("10.0.0.2:8998", 14.0)
    b = table.pod("10.0.0.2:8998", 15.1)  # a's last room was 10.1 s ago: every room of it is over
    assert set(table.pods) == {"127.0.0.1:8998", "10.0.0.2:8998"} and b is not a


def test_a_prefill_named_by_two_addresses_is_one_peer_and_peers_are_dropped_when_replaced_or_unnamed():
    table = PrefillTable("svc", 8998, limit=4, key=None, idle=10.0)
    ip = table.pod("10.0.0.1:8998", 0.0)
    assert table.place(table.configured, topo("x", 5000), [0]) == []
    assert table.place(ip, topo("x", 5000), [0]) == []
    assert ip.ranks[0] is table.configured.ranks[0] and len(table.peers) == 1
    peer = ip.ranks[0]
    # The Service now reaches another prefill pod: the first stays, named by its pod IP.
    assert table.place(table.configured, topo("y", 6000), [0]) == []
    assert len(table.peers) == 2 and ip.ranks[0] is peer
    assert table.configured.ranks[0].label == "prefill-0@127.0.0.1:6000", "labels stay unique"
    # The prefill behind the pod IP is replaced: its old peer is handed back with the reason.
    dropped = table.place(ip, topo("z", 5000), [0])
    assert [(p, "replaced" in why) for p, why in dropped] == [(peer, True)]
    # The Service back on the new pod: the peer only it named is handed back.
    dropped = table.place(table.configured, topo("z", 5000), [0])
    gone = "prefill prefill-0@127.0.0.1:6000 no longer named by a bootstrap address"
    assert [why for _, why in dropped] == [gone]
    assert len(table.peers) == 1


@pytest.mark.parametrize(("ptp", "dtp", "rank", "want"), [
    (1, 1, 0, ([0], 1)), (2, 1, 0, ([0, 1], 1)), (1, 2, 1, ([0], 2)), (4, 2, 1, ([2, 3], 1)),
])
def test_rank_plan_follows_sglang(ptp, dtp, rank, want):
    assert plan_ranks(ptp, dtp, rank) == want


def test_reads_report_topologies_once_and_failures_with_the_reason():
    answers: dict[int, object] = {
        1: topo("x", 5000),
        2: urllib.error.HTTPError("u", 401, "Unauthorized", {}, None),  # type: ignore[arg-type]
        3: ConnectionRefusedError(111, "Connection refused"),
        4: msgspec.structs.replace(topo("x", 5000), tp_size=3),
    }

    def fetch(host, port, timeout, key):
        got = answers[port]
        if isinstance(got, Exception):
            raise got
        return got

    table = PrefillTable("127.0.0.1", 1, limit=8, key=None, idle=10.0, fetch=fetch)
    for port in (2, 3, 4):
        table.pod(f"127.0.0.1:{port}", 0.0)
    table.refresh(0.0, 1.0, 0.1)
    got = {pod.address: (t, why) for pod, t, why in table.results()}
    assert got["127.0.0.1:1"] == (answers[1], "")
    assert got["127.0.0.1:2"] == (None, "bootstrap 127.0.0.1:2 answered 401: Unauthorized")
    assert "127.0.0.1:3: ConnectionRefusedError" in got["127.0.0.1:3"][1]
    assert "prefill TP size 3: not a power of two" in got["127.0.0.1:4"][1]
    assert table.results() == [], "a read is reported once"
    table.refresh(0.05, 1.0, 0.1)
    assert table.results() == [], "nothing is due before its time"


def test_expect_carries_a_checked_bootstrap_address():
    old = msgspec.msgpack.encode({"type": "expect", "room": 7})  # an engine that never names one
    assert decode_engine_message(old) == Expect(room=7, bootstrap_addr="")
    schema = schema_from_config(AgentConfig(model=ModelConfig(profile="qwen3-next", pool_pages=16)))
    msg = decode_engine_message(encode_message(Expect(room=7, bootstrap_addr="[::1]:8998")))
    assert to_command(msg, schema).bootstrap == "[::1]:8998"  # type: ignore[union-attr]
    assert to_command(Expect(room=7), schema).bootstrap == ""  # type: ignore[union-attr]
    with pytest.raises(BadInput, match=r"bootstrap address '10\.0\.0\.1'"):
        to_command(Expect(room=7, bootstrap_addr="10.0.0.1"), schema)
    with pytest.raises(Exception, match="length"):
        decode_engine_message(encode_message(Expect(room=7, bootstrap_addr="a" * 263)))


def test_a_forgotten_pods_peers_are_released_once():
    table = PrefillTable("127.0.0.1", 8998, limit=2, key=None, idle=1.0)
    a = table.pod("10.0.0.1:8998", 0.0)
    table.place(table.configured, topo("x", 5000), [0])
    table.place(a, topo("y", 6000), [0])
    assert len(table.peers) == 2
    table.pod("10.0.0.2:8998", 5.0)  # a is idle: forgotten, its peer released
    assert [peer.instance for peer, _ in table.take_released()] == ["y-0"]
    assert table.take_released() == [] and len(table.peers) == 1


def test_the_configured_address_is_found_as_an_engine_names_it():
    table = PrefillTable("Demo-Bootstrap.NS.svc", 8998, limit=2, key=None, idle=1.0)
    assert table.pod("demo-bootstrap.ns.svc:8998", 0.0) is table.configured
    assert PrefillTable("::1", 8998, 2, None, 1.0).configured.address == "[::1]:8998"
