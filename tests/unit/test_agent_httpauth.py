"""Signed HTTP requests (``agent.httpauth``) and what the endpoints give callers with and without
the pairing key, over a real loopback server: ``PUT /ranks`` refused unsigned, badly signed or
replayed; ``/topology`` and ``/status`` revealing no address, label, agent id or instance unsigned
(``/topology`` names the ranks where plain sglang peers, which cannot sign, are allowed)."""

import json
import urllib.error
import urllib.request

import pytest

from dataplane.agent import AgentMetrics, AgentStatus, BootstrapRegistry, RankInfo, fetch_topology
from dataplane.agent.bootstrap import announce_rank
from dataplane.agent.health import public_status
from dataplane.agent.http import AgentHttpServer
from dataplane.agent.httpauth import HEADER, Verifier, sign
from dataplane.agent.metrics import CONTENT_TYPE
from dataplane.errors import WireFormatError

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
NOW = 1_800_000_000.0


def test_a_signed_request_verifies_once_within_the_window():
    v = Verifier(KEY)
    header = sign(KEY, "PUT", "/ranks", b"{}", now=NOW)
    assert v.check("PUT", "/ranks", b"{}", header, now=NOW + 29) == ""
    assert "already used" in v.check("PUT", "/ranks", b"{}", header, now=NOW + 29)


@pytest.mark.parametrize(
    ("header", "method", "path", "body", "at", "why"),
    [
        (sign(OTHER, "PUT", "/ranks", b"{}", now=NOW), "PUT", "/ranks", b"{}", NOW, "does not verify"),
        (sign(KEY, "PUT", "/ranks", b"{}", now=NOW), "PUT", "/ranks", b"{ }", NOW, "does not verify"),
        (sign(KEY, "PUT", "/ranks", b"{}", now=NOW), "GET", "/ranks", b"{}", NOW, "does not verify"),
        (sign(KEY, "GET", "/status", now=NOW), "GET", "/topology", b"", NOW, "does not verify"),
        (sign(KEY, "GET", "/status", now=NOW), "GET", "/status", b"", NOW + 31, "off this agent's clock"),
        (sign(KEY, "GET", "/status", now=NOW), "GET", "/status", b"", NOW - 31, "off this agent's clock"),
        ("garbage", "GET", "/status", b"", NOW, "malformed"),
        ("x:y:z", "GET", "/status", b"", NOW, "malformed"),
        ("-5:00", "GET", "/status", b"", NOW, "malformed"),
        ("1" * 200 + ":00", "GET", "/status", b"", NOW, "malformed"),
    ],
)
def test_a_request_not_signed_for_exactly_this_is_refused(header, method, path, body, at, why):
    assert why in Verifier(KEY).check(method, path, body, header, now=at)


def test_replay_memory_is_bounded_and_forgets_what_left_the_window():
    v = Verifier(KEY, max_remembered=3)
    for i in range(3):
        assert v.check("GET", "/status", b"", sign(KEY, "GET", "/status", now=NOW + i), now=NOW + i) == ""
    assert "too many" in v.check("GET", "/status", b"", sign(KEY, "GET", "/status", now=NOW + 3), now=NOW + 3)
    later = NOW + 200  # every remembered MAC is out of the window: forgotten, room again
    assert v.check("GET", "/status", b"", sign(KEY, "GET", "/status", now=later), now=later) == ""


def _call(url, method="GET", body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def keyed():
    me = RankInfo(0, "127.0.0.1", 5555, "inst0", "prefill-0@inst0", "g1")
    reg = BootstrapRegistry(me, 2, "qwen3-next", (("mamba", "mamba"),))
    status = AgentStatus("prefill", "prefill-0", "inst0")
    status.set_probes(lambda: True, lambda: {"lanes": {"up": ["tcp://127.0.0.1:5999"], "fallbacks": 0}})
    status.peer_paired("decode-0@127.0.0.1", "dinst")
    status.peer_refused("decode-1@127.0.0.9", "generation g2 on decode-1@127.0.0.9", by="self")
    metrics = AgentMetrics("prefill", "prefill-0")
    routes = {**status.routes(metrics.exposition, CONTENT_TYPE), **reg.routes()}
    srv = AgentHttpServer("127.0.0.1", 0, routes, verifier=Verifier(KEY)).start()
    yield srv, reg
    srv.stop()


RANK1 = RankInfo(1, "127.0.0.1", 5556, "inst1", "prefill-1@inst1", "g1")


def test_put_ranks_needs_the_key(keyed):
    srv, reg = keyed
    body = json.dumps({"rank": 1, "host": "127.0.0.66", "control_port": 1, "instance": "evil",
                       "agent": "x", "generation": "g1"}).encode()
    assert _call(srv.url + "/ranks", "PUT", body)[0] == 401
    bad = {HEADER: sign(OTHER, "PUT", "/ranks", body)}
    code, answer = _call(srv.url + "/ranks", "PUT", body, bad)
    assert code == 401 and "does not verify" in answer["error"]
    assert [r.rank for r in reg.topology().ranks] == [0]  # nothing was overwritten
    announce_rank("127.0.0.1", srv.port, RANK1, key=KEY)
    assert reg.topology().rank(1) == RANK1
    good = {HEADER: sign(KEY, "PUT", "/ranks", body)}
    assert _call(srv.url + "/ranks", "PUT", body, good)[0] == 200
    assert _call(srv.url + "/ranks", "PUT", body, good)[0] == 401  # the same signed request again


def test_strangers_learn_no_address_or_id(keyed):
    srv, _ = keyed
    announce_rank("127.0.0.1", srv.port, RANK1, key=KEY)
    for path in ("/topology", "/status"):
        code, answer = _call(srv.url + path)
        text = json.dumps(answer)
        assert code == 200
        for secret in ("127.0.0", "5555", "5556", "5999", "inst0", "inst1", "dinst", "prefill-0@", "decode-"):
            assert secret not in text, (path, secret, text)
    _, public = _call(srv.url + "/status")
    assert public["peers"] == {"paired": 1, "refused": 1} and public["lanes"]["up"] == 1
    assert public["ready"] is True and public["role"] == "prefill"
    _, topo = _call(srv.url + "/topology")
    assert topo == {"model": "qwen3-next", "generation": "g1", "tp_size": 2, "complete": True,
                    "components": [["mamba", "mamba"]]}
    with pytest.raises(WireFormatError, match=r"auth\.keyFile"):
        fetch_topology("127.0.0.1", srv.port)


def test_key_holders_see_everything(keyed):
    srv, _ = keyed
    announce_rank("127.0.0.1", srv.port, RANK1, key=KEY)
    topo = fetch_topology("127.0.0.1", srv.port, key=KEY)
    assert topo.instance == "inst0" and topo.rank(1).control_port == 5556
    code, full = _call(srv.url + "/status", headers={HEADER: sign(KEY, "GET", "/status")})
    assert code == 200 and "decode-0@127.0.0.1" in full["peers"] and full["agent"] == "prefill-0"


def test_public_status_keeps_counts_of_refusal_tallies():
    snap = {"role": "decode", "agent": "d@i", "instance": "i", "peers": {}, "bootstrap_error": "x 10.0.0.1",
            "refusals": {"unauthenticated": 3, "bad_mac": 1, "last": "decode-0@10.0.0.1"},
            "prefill": {"0": {"label": "prefill-0@10.0.0.2", "state": "paired", "instance": "p"}}}
    out = public_status(snap)
    assert out == {"role": "decode", "peers": {}, "refusals": {"unauthenticated": 3, "bad_mac": 1},
                   "prefill": {"paired": 1}}


def test_where_plain_peers_are_allowed_an_unsigned_topology_names_the_ranks():
    """Plain sglang peers cannot sign: a prefill admitting them gives them the ranks' addresses (the
    status stays public) and still takes ``PUT /ranks`` from key holders only."""
    me = RankInfo(0, "127.0.0.1", 5555, "inst0", "prefill-0@inst0", "g1")
    reg = BootstrapRegistry(me, 1, "qwen3-next", (("mamba", "mamba"),))
    status = AgentStatus("prefill", "prefill-0", "inst0")
    routes = {**status.routes(AgentMetrics("prefill", "prefill-0").exposition, CONTENT_TYPE),
              **reg.routes(plain_peers=True)}
    srv = AgentHttpServer("127.0.0.1", 0, routes, verifier=Verifier(KEY)).start()
    try:
        assert fetch_topology("127.0.0.1", srv.port).rank(0) == me
        assert "inst0" not in json.dumps(_call(srv.url + "/status")[1])
        assert _call(srv.url + "/ranks", "PUT", b"{}")[0] == 401
    finally:
        srv.stop()
