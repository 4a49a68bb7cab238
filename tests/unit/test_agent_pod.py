"""The pod's endpoints over its ranks (``agent.pod``), with in-process ranks on the MoRI hardware test
double: one ``/metrics`` with a ``tp_rank`` label per series, ``/status`` with a section per rank,
``/topology`` listing every rank the pod runs, readiness only when every rank is ready, and one pod
condition that turns ready only when every rank has paired."""

from __future__ import annotations

import urllib.error
import urllib.request

import msgspec
import pytest

from dataplane.agent.http import get_json
from dataplane.agent.pod import PodConditions, start_in_process
from dataplane.config import AgentConfig, ListenConfig, ModelConfig, TransferConfig
from dataplane.harness.agent_processes import loopback_pair
from dataplane.transports import mori_double


class Recorder:
    def __init__(self):
        self.reports: list[tuple[bool, str, str]] = []

    def report(self, ready, reason, message):
        self.reports.append((ready, reason, message))


@pytest.fixture
def prefill_pod():
    base = AgentConfig(transfer=TransferConfig(backend="mori"),
                       model=ModelConfig(profile="qwen3-next", pool_pages=16, max_requests=4))
    (cfg, _), _ = loopback_pair(base, prefill_tp=2)
    pod = start_in_process(cfg, [0, 1], transport_sdk=mori_double)
    yield pod
    pod.stop()


def test_one_endpoint_set_serves_every_rank(prefill_pod):
    pod, key = prefill_pod, prefill_pod.key
    url = f"http://127.0.0.1:{pod.ports['metrics_port']}"
    topo = get_json(f"http://127.0.0.1:{pod.ports['bootstrap_port']}/topology", key=key)
    assert topo["tp_size"] == 2 and [r["rank"] for r in topo["ranks"]] == [0, 1]
    ports = [topo["ranks"][r]["control_port"] for r in (0, 1)]
    assert ports == [pod.ports["ranks"][str(r)]["control_port"] for r in (0, 1)] and len(set(ports)) == 2
    text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
    for r in ("0", "1"):
        assert f'pdpair_agent_inflight_rooms{{role="prefill",tp_rank="{r}"}} 0.0' in text
    assert text.count("# TYPE pdpair_agent_inflight_rooms gauge") == 1  # one family, two series
    st = get_json(url + "/status", key=key)
    assert sorted(st["ranks"]) == ["0", "1"] and st["tp_size"] == 2 and not st["ready"]
    assert st["ranks"]["1"]["agent"] != st["ranks"]["0"]["agent"]
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + "/readyz", timeout=2)
    assert err.value.code == 503
    assert b"rank 0: no paired peer; rank 1: no paired peer" in err.value.read()
    public = get_json(url + "/status")  # unsigned: each rank's section without addresses or ids
    assert "agent" not in public["ranks"]["1"] and "agent" not in public


def test_a_detached_rank_leaves_the_topology_and_the_pod_unready(prefill_pod):
    pod = prefill_pod
    pod.detach(1, "engine disconnected")
    topo = get_json(f"http://127.0.0.1:{pod.ports['bootstrap_port']}/topology", key=pod.key)
    assert [r["rank"] for r in topo["ranks"]] == [0]
    st = pod.snapshot()
    assert st["ranks"]["1"] == {"attached": False}
    assert pod.waiting() == ["rank 0: no paired peer", "rank 1: no engine attached"]


def test_the_pod_condition_is_ready_only_when_every_rank_is():
    rec = Recorder()
    conditions = PodConditions(rec, [0, 1])
    rank0, rank1 = conditions.for_rank(0), conditions.for_rank(1)
    rank0.report(True, "Paired", "prefill paired with decode-a")
    assert rec.reports == [(False, "NoEngine", "rank 1: not started")]
    rank1.report(True, "Paired", "prefill paired with decode-b")
    assert rec.reports[-1] == (True, "Paired", "every rank paired (2)")
    rank1.report(False, "NoPeer", "decode-b down: heartbeat lost")
    assert rec.reports[-1] == (False, "NoPeer", "rank 1: decode-b down: heartbeat lost")
    rank0.report(False, "NoPeer", "decode-a down")  # still not ready: nothing new to report
    assert len(rec.reports) == 3


def test_fixed_ports_move_up_by_the_rank():
    cfg = AgentConfig(listen=ListenConfig(control_port=8999, lane_port=9100, metrics_port=9400))
    ranks = [cfg.for_rank(r).listen for r in range(3)]
    assert [(x.control_port, x.lane_port, x.metrics_port) for x in ranks] == [
        (8999, 9100, 9400), (9000, 9101, 9400), (9001, 9102, 9400)]
    free = msgspec.structs.replace(cfg, listen=ListenConfig(control_port=0, lane_port=0))
    assert free.for_rank(2).listen.control_port == 0


@pytest.mark.parametrize(("role", "tp", "dp", "match"), [
    ("decode", 3, 1, "tpSize must be a power of two from 1 to 64"),
    ("decode", 2, 4, "dpSize must divide tpSize"),
    ("prefill", 2, 2, "DP attention is served on decode only"),
])
def test_rank_sizes_an_agent_cannot_serve_are_named(role, tp, dp, match):
    from dataplane.config import RoleConfig
    from dataplane.errors import BadInput

    cfg = AgentConfig(role=role, **{role: RoleConfig(tp_size=tp, dp_size=dp)})
    with pytest.raises(BadInput, match=match):
        cfg.check_ranks()


def test_dp_attention_gives_each_rank_its_attention_groups_schema_view():
    from dataplane.config import RoleConfig

    cfg = AgentConfig(role="decode", decode=RoleConfig(tp_size=8, dp_size=4))
    views = [cfg.for_rank(r).attention_view() for r in range(8)]
    assert [(v.tp_size, v.tp_rank) for v in views] == [(2, r % 2) for r in range(8)]
