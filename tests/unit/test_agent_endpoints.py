"""Metrics labels and the HTTP endpoints (bootstrap, health, readiness, status) over real loopback."""

import json
import urllib.error
import urllib.request

import pytest

from dataplane.agent import AgentMetrics, AgentStatus, BootstrapRegistry, RankInfo, fetch_topology
from dataplane.agent.bootstrap import announce_rank
from dataplane.agent.http import AgentHttpServer
from dataplane.agent.metrics import CONTENT_TYPE
from dataplane.agent.roles import refusal_reason_label


def test_metric_names_and_bounded_labels():
    m = AgentMetrics("prefill", "prefill-0")
    m.record_component("mamba", "mamba", "decode-0@127.0.0.1", 4096, 8, 0.002)
    m.record_outcome("decode-0@127.0.0.1", "failed", "deadline exceeded")
    m.record_refusal("decode-0@127.0.0.1", "generation_mismatch")
    text = m.exposition().decode()
    assert (
        'pdpair_agent_transfer_bytes_total{component="mamba",peer="decode-0@127.0.0.1",'
        'role="prefill",state_type="mamba"} 4096.0' in text
    )
    assert "pdpair_agent_transfer_writes_total" in text
    assert "pdpair_agent_transfer_seconds_bucket" in text
    assert (
        'pdpair_agent_handshake_refusals_total{peer="decode-0@127.0.0.1",reason="generation_mismatch"' in text
    )
    assert "pdpair_agent_inflight_rooms" in text
    assert "room" not in text.replace("inflight_rooms", "").replace("Rooms", "")


def test_two_agents_in_one_process_do_not_clash():
    a, b = AgentMetrics("prefill", "a"), AgentMetrics("decode", "b")
    a.record_transfer_error("transfer")
    assert b'transfer_errors_total{kind="transfer"' not in b.exposition()


def test_refusal_labels_are_categories():
    assert refusal_reason_label("prefill generation g1 ≠ decode generation g2") == "generation_mismatch"
    assert (
        refusal_reason_label("component 0 is `mamba` on prefill but `swa` on decode") == "component_mismatch"
    )


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def server():
    me = RankInfo(0, "127.0.0.1", 5555, "inst0", "prefill-0@inst0", "g1")
    reg = BootstrapRegistry(me, 2, "qwen3-next", (("mamba", "mamba"),))
    status = AgentStatus("prefill", "prefill-0", "inst0")
    metrics = AgentMetrics("prefill", "prefill-0")
    routes = {**status.routes(metrics.exposition, CONTENT_TYPE), **reg.routes()}
    srv = AgentHttpServer("127.0.0.1", 0, routes).start()
    yield srv, status
    srv.stop()


def test_topology_ranks_and_readiness(server):
    srv, status = server
    topo = fetch_topology("127.0.0.1", srv.port)
    assert topo.tp_size == 2 and not topo.complete and topo.instance == "inst0"
    announce_rank("127.0.0.1", srv.port, RankInfo(1, "127.0.0.1", 5556, "inst1", "prefill-1@inst1", "g1"))
    topo = fetch_topology("127.0.0.1", srv.port)
    assert topo.complete and topo.rank(1).control_port == 5556
    with pytest.raises(urllib.error.HTTPError):
        announce_rank("127.0.0.1", srv.port, RankInfo(1, "127.0.0.1", 1, "x", "y", "other-generation"))
    assert _get(srv.url + "/readyz")[0] == 503
    status.peer_refused("decode-0@127.0.0.1", "kv dtype bfloat16 on prefill vs float16 on decode", by="self")
    code, body = _get(srv.url + "/status")
    snap = json.loads(body)
    assert code == 200 and snap["refusals"]["recent"][0]["reason"].startswith("kv dtype")
    status.peer_paired("decode-0@127.0.0.1")
    assert _get(srv.url + "/readyz")[0] == 200
    assert _get(srv.url + "/healthz")[0] == 200
    assert b"pdpair_agent_info" in _get(srv.url + "/metrics")[1]
    assert _get(srv.url + "/nope")[0] == 404


def test_reporter_sees_transitions():
    seen = []

    class Reporter:
        def report(self, ready, reason, message):
            seen.append((ready, reason))

    st = AgentStatus("decode", "d", "i", Reporter())
    st.peer_refused("p", "model a on prefill vs b on decode", by="peer")
    st.peer_paired("p")
    st.peer_down("p", "heartbeat lost")
    assert seen == [(False, "HandshakeRefused"), (True, "Paired"), (False, "NoPeer")]
