"""The operator's side of peer authentication and isolation: the pairing Secret (made once, kept, mounted
into agent containers only), the per-PDPair NetworkPolicy, ``InvalidSpec`` instead of pods for a spec no
agent can serve, and ``PeersRefused`` from the agents' reports."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest
from operator_world import World, make_owner, make_spec
from pdpair_operator import cli, naming, render
from pdpair_operator.observe import PodCondition, PodView, pod_from_body
from pdpair_operator.planner import DEFAULT_SCRAPER, Observed, plan
from pdpair_operator.spec import generation_hash, parse_spec
from pdpair_operator.status import REFUSAL_REASONS, refusal_counts, refusals_condition
from pdpair_operator.validate import BadQuantity, quantity_bytes

from dataplane.config import parse_config


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def of_kind(manifests: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


class Keys:
    """A key source that counts its calls and hands out distinct keys."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return bytes([self.calls]) * 32


def step(world: World, keys: Keys) -> Any:
    result = plan(world.owner, world.observed(), world.now, new_key=keys)
    world.apply(result)
    return result


# ---- the pairing Secret ------------------------------------------------------------------------------
def test_pairing_secret_is_created_once_and_survives_reconciles() -> None:
    world, keys = World(make_owner()), Keys()
    first = step(world, keys)
    [secret] = of_kind(first.creates, "Secret")
    assert secret["metadata"]["name"] == "demo-pairing" and secret["immutable"] is True
    assert base64.b64decode(secret["data"]["key"]) == bytes([1]) * 32
    world.run()
    for _ in range(5):
        again = step(world, keys)
        assert not of_kind(again.creates, "Secret")
        assert not [p for p in again.patches if p.kind == "Secret"]
        assert not [d for d in again.deletes if d.kind == "Secret"]
    assert keys.calls == 1
    stored = world.manifests[("Secret", "demo-pairing")]
    assert base64.b64decode(stored["data"]["key"]) == bytes([1]) * 32


def test_a_rollout_keeps_the_pairing_secret() -> None:
    world, keys = World(make_owner()), Keys()
    step(world, keys)
    world.run()
    step(world, keys)
    world.spec_change(image="img:2")
    for _ in range(6):
        result = step(world, keys)
        world.run()
        assert not of_kind(result.creates, "Secret") and not [d for d in result.deletes if d.kind == "Secret"]
    assert set(world.by_gen()) == {generation_hash(world.owner.spec)}
    assert keys.calls == 1


def test_a_deleted_pairing_secret_is_made_again_with_a_fresh_key() -> None:
    world, keys = World(make_owner()), Keys()
    step(world, keys)
    del world.children[("Secret", "demo-pairing")]
    del world.manifests[("Secret", "demo-pairing")]
    [secret] = of_kind(step(world, keys).creates, "Secret")
    assert base64.b64decode(secret["data"]["key"]) == bytes([2]) * 32


def _containers(**spec: Any) -> dict[str, dict[str, Any]]:
    owner = make_owner(**spec)
    pod = render.build_pod(owner, generation_hash(owner.spec), "decode", 0)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["pairing"]["secret"] == {
        "secretName": "demo-pairing", "defaultMode": 0o400, "items": [{"key": "key", "path": "key"}]}
    return {c["name"]: c for c in pod["spec"]["containers"]}


@pytest.mark.parametrize("engine", [{}, {"mode": "sidecar"}, {"image": "sglang:1", "command": ["serve"]}])
def test_the_key_is_mounted_read_only_into_the_agent_container_only(engine: dict[str, Any]) -> None:
    containers = _containers(engine=engine)
    agent = containers.pop("agent")
    assert {"name": "pairing", "mountPath": "/etc/pdpair/pairing", "readOnly": True} in agent["volumeMounts"]
    for other in containers.values():
        assert all(m["name"] != "pairing" for m in other["volumeMounts"]), other["name"]
        assert all(m["mountPath"] != naming.PAIRING_DIR for m in other["volumeMounts"])


@pytest.mark.parametrize(("security", "plain"), [({}, False), ({"allowPlainSglangPeers": True}, True)])
def test_agent_config_names_the_mounted_key_and_the_plain_peer_choice(security: dict[str, Any],
                                                                      plain: bool) -> None:
    owner = make_owner(security=security)
    cm = render.build_config_map(owner, generation_hash(owner.spec))
    for role in ("prefill", "decode"):
        cfg = parse_config(cm["data"][f"{role}.yaml"])
        assert cfg.auth.key_file == "/etc/pdpair/pairing/key"
        assert cfg.auth.allow_plain_peers is plain
        assert (cfg.listen.control_port, cfg.listen.lane_port) == (8999, 9100)


def test_allowing_plain_peers_is_a_new_generation_but_the_policy_switch_is_not() -> None:
    base = parse_spec(make_spec())
    plain = parse_spec(make_spec(security={"allowPlainSglangPeers": True}))
    no_policy = parse_spec(make_spec(security={"networkPolicy": False}))
    assert generation_hash(plain) != generation_hash(base)
    assert generation_hash(no_policy) == generation_hash(base)


# ---- the NetworkPolicy -------------------------------------------------------------------------------
def test_network_policy_admits_the_pdpairs_pods_to_its_ports_and_the_scraper_to_metrics() -> None:
    owner = make_owner(ports={"bootstrap": 7000, "metrics": 7001, "control": 7002, "lane": 7003,
                              "transfer": {"first": 30000, "last": 30099}})
    [policy] = of_kind(plan(owner, Observed(), World(owner).now, new_key=Keys()).creates, "NetworkPolicy")
    spec = policy["spec"]
    own = {"matchLabels": {"pdpair.io/name": "demo", "pdpair.io/child": "pod"}}
    assert spec["podSelector"] == own and spec["policyTypes"] == ["Ingress"]
    peers, scraper = spec["ingress"]
    assert peers["from"] == [{"podSelector": own}]
    assert peers["ports"] == [{"protocol": "TCP", "port": 7000}, {"protocol": "TCP", "port": 7002},
                              {"protocol": "TCP", "port": 7003},
                              {"protocol": "TCP", "port": 30000, "endPort": 30099}]
    assert scraper == {"from": [DEFAULT_SCRAPER], "ports": [{"protocol": "TCP", "port": 7001}]}


def test_network_policy_uses_the_configured_scraper() -> None:
    owner = make_owner()
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    [policy] = of_kind(plan(owner, Observed(), World(owner).now, scraper=scraper, new_key=Keys()).creates,
                       "NetworkPolicy")
    assert policy["spec"]["ingress"][1]["from"] == [scraper]


def test_network_policy_follows_port_changes_and_goes_when_turned_off() -> None:
    world, keys = World(make_owner()), Keys()
    step(world, keys)
    world.run()
    step(world, keys)
    world.spec_change(ports={"lane": 9200})
    [patch] = [p for p in step(world, keys).patches if p.kind == "NetworkPolicy"]
    assert {"protocol": "TCP", "port": 9200} in patch.body["spec"]["ingress"][0]["ports"]
    world.spec_change(ports={"lane": 9200}, security={"networkPolicy": False})
    result = step(world, keys)
    assert [(d.kind, d.name) for d in result.deletes] == [("NetworkPolicy", "demo-isolation")]
    assert not of_kind(step(world, keys).creates, "NetworkPolicy")


@pytest.mark.parametrize(("backend", "expected"), [("nixl", "20000-20999"), ("mori", None)])
def test_ucx_picks_transfer_ports_from_the_range_the_policy_admits(backend: str,
                                                                   expected: str | None) -> None:
    agent = _containers(backend=backend)["agent"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env.get("UCX_TCP_PORT_RANGE") == expected


# ---- InvalidSpec ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    ("64Gi", 64 << 30), ("500M", 500 * 10**6), ("1e9", 10**9), ("1.5Ki", 1536), ("100m", 1), ("7", 7)])
def test_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "Gi", "12 GB", "1Gb", "-1Gi", "1e9999"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(BadQuantity):
        quantity_bytes(text)


BIG_MODEL = {"name": "m", "profile": "qwen3-next", "poolPages": 1 << 20}


@pytest.mark.parametrize(("spec", "reason", "words"), [
    ({"model": BIG_MODEL, "prefill": {"replicas": 1, "resources": {"memory": "1Gi"}}},
     "PoolsExceedMemory",
     ["prefill", "more than prefill.resources.memory (1.00 GiB = 1073741824 bytes)", "model.poolPages"]),
    ({"model": BIG_MODEL,
      "engine": {"mode": "sidecar", "resources": {"memory": "512Mi", "hugePages": "512Mi"}}},
     "PoolsExceedMemory", ["engine.resources.memory + hugePages (1.00 GiB = 1073741824 bytes)"]),
    ({"prefill": {"replicas": 1, "resources": {"memory": "lots"}}}, "BadQuantity", ["'lots'", "64Gi"]),
    ({"model": {"name": "m", "kvItemLen": 64, "kvLayers": 2, "components": [
        {"name": "c", "stateType": "swa", "itemLens": [4, 4], "numItems": 8, "layerIds": [1]}]}},
     "AgentConfigRejected", ["layerIds has 1 entries for 2 itemLens"]),
    ({"transfer": {"backend": "nixl", "spinMicroseconds": 10**7}}, "AgentConfigRejected",
     ["spinMicroseconds"]),
])
def test_a_spec_no_agent_can_serve_gets_invalid_spec_and_no_children(spec: dict[str, Any], reason: str,
                                                                      words: list[str]) -> None:
    owner = make_owner(**spec)
    result = plan(owner, Observed(), World(owner).now, new_key=Keys())
    assert (result.creates, result.patches, result.deletes) == ((), (), ())
    assert result.status is not None
    invalid = cond(result.status, "InvalidSpec")
    assert (invalid["status"], invalid["reason"]) == ("True", reason)
    for word in words:
        assert word in invalid["message"], invalid["message"]
    assert "\n" not in invalid["message"]
    assert (cond(result.status, "Ready")["status"], cond(result.status, "Ready")["reason"]) == (
        "False", "InvalidSpec")
    assert ("Warning", "InvalidSpecTrue") in [(e.type, e.reason) for e in result.events]


def test_pools_that_fit_are_valid() -> None:
    owner = make_owner(prefill={"replicas": 1, "resources": {"memory": "64Gi"}})
    result = plan(owner, Observed(), World(owner).now, new_key=Keys())
    assert result.status is not None and cond(result.status, "InvalidSpec")["status"] == "False"
    assert len(of_kind(result.creates, "Pod")) == 2


def test_an_invalid_change_leaves_the_serving_generation_alone() -> None:
    world, keys = World(make_owner()), Keys()
    step(world, keys)
    world.run()
    step(world, keys)
    serving_pods = dict(world.pods)
    world.owner = msgspec.structs.replace(world.owner, generation=2, spec=parse_spec(make_spec(
        model=BIG_MODEL, prefill={"replicas": 1, "resources": {"memory": "1Gi"}})))
    result = step(world, keys)
    assert (result.creates, result.deletes, result.patches) == ((), (), ())
    assert world.pods == serving_pods
    assert cond(world.owner.status, "InvalidSpec")["status"] == "True"
    world.spec_change()
    step(world, keys)
    assert cond(world.owner.status, "InvalidSpec") | {"lastTransitionTime": ""} == {
        "type": "InvalidSpec", "status": "False", "reason": "Valid", "message": "",
        "lastTransitionTime": "", "observedGeneration": 3}


# ---- PeersRefused ----------------------------------------------------------------------------------------
def _pod(name: str, message: str | None, status: str = "True", deleting: bool = False) -> PodView:
    report = None if message is None else PodCondition(status, "BadMac", message)
    return PodView(name, "prefill", 0, "g", refusals=report, deleting=deleting)


def test_refusal_counts_read_the_agents_message_and_nothing_else() -> None:
    assert refusal_counts("unauthenticated=1 bad_mac=22 replay=0 foreign_pdpair=4") == {
        "unauthenticated": 1, "bad_mac": 22, "replay": 0, "foreign_pdpair": 4}
    hostile = "bad_mac=-3 replay=1e9 foreign_pdpair=\u00b2 unauthenticated=" + "9" * 40
    assert refusal_counts(hostile) == dict.fromkeys(REFUSAL_REASONS, 0)


@pytest.mark.parametrize(("pods", "status", "reason", "summary"), [
    ([], "False", "None", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=0"),
    ([_pod("a", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=0", status="False")],
     "False", "None", "unauthenticated=0"),
    ([_pod("a", "unauthenticated=2 bad_mac=3 replay=0 foreign_pdpair=0")],
     "True", "BadMac", "unauthenticated=2 bad_mac=3 replay=0 foreign_pdpair=0 (reported by a)"),
    ([_pod("a", "unauthenticated=2 bad_mac=3 replay=0 foreign_pdpair=0"),
      _pod("b", "unauthenticated=5 bad_mac=0 replay=1 foreign_pdpair=0")],
     "True", "Unauthenticated", "unauthenticated=7 bad_mac=3 replay=1 foreign_pdpair=0 (reported by a, b)"),
    ([_pod("a", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=9", deleting=True)],
     "False", "None", ""),
    ([_pod("a", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=9")], "True", "ForeignPdpair", ""),
    ([_pod("a", "unauthenticated=0 bad_mac=0 replay=4 foreign_pdpair=0")], "True", "Replay", ""),
    ([_pod("a", "garbage")], "True", "Unknown", "unauthenticated=0 bad_mac=0 replay=0 foreign_pdpair=0"),
])
def test_peers_refused_sums_the_agents_reports(pods: list[PodView], status: str, reason: str,
                                               summary: str) -> None:
    got = refusals_condition(pods)
    assert (got.type, got.status, got.reason) == ("PeersRefused", status, reason)
    assert summary in got.message


def test_peers_refused_reaches_the_pdpair_status_from_the_pod_condition() -> None:
    world, keys = World(make_owner()), Keys()
    step(world, keys)
    world.run()
    step(world, keys)
    assert cond(world.owner.status, "PeersRefused")["status"] == "False"
    name = next(n for n, p in world.pods.items() if p.role == "prefill")
    body = {"metadata": {"name": name, "labels": {naming.LABEL_ROLE: "prefill", naming.LABEL_INDEX: "0",
                                                  naming.LABEL_GENERATION: world.pods[name].generation}},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": naming.TRANSFER_READY, "status": "True", "reason": "HandshakeComplete"},
                {"type": naming.PEER_REFUSALS, "status": "True", "reason": "Unauthenticated",
                 "message": "unauthenticated=3 bad_mac=0 replay=0 foreign_pdpair=0"}]}}
    world.pods[name] = pod_from_body(body)
    result = step(world, keys)
    refused = cond(world.owner.status, "PeersRefused")
    assert (refused["status"], refused["reason"]) == ("True", "Unauthenticated")
    assert refused["message"].startswith("unauthenticated=3 bad_mac=0 replay=0 foreign_pdpair=0")
    assert ("Warning", "PeersRefusedTrue") in [(e.type, e.reason) for e in result.events]
    assert cond(world.owner.status, "Ready")["status"] == "True"


# ---- the operator's flag ---------------------------------------------------------------------------------
def test_metrics_scraper_flag() -> None:
    peer = '{"podSelector": {"matchLabels": {"a": "b"}}}'
    args = cli.build_parser().parse_args(["--metrics-scraper", peer])
    assert cli.options_from(args).metrics_scraper == {"podSelector": {"matchLabels": {"a": "b"}}}
    assert cli.options_from(cli.build_parser().parse_args([])).metrics_scraper is None


@pytest.mark.parametrize("bad", ["{", "[]", "{}", '{"ipBlock": {"cidr": "0.0.0.0/0"}}', '{"podSelector": 1}'])
def test_metrics_scraper_flag_refuses_what_is_not_a_selector_peer(bad: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--metrics-scraper", bad])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--metrics-scraper" in err and "Traceback" not in err


def test_network_policy_admits_one_control_and_lane_port_per_rank() -> None:
    owner = make_owner(prefill={"replicas": 1, "tensorParallelSize": 4},
                       decode={"replicas": 1, "tensorParallelSize": 2})
    [policy] = of_kind(plan(owner, Observed(), World(owner).now, new_key=Keys()).creates, "NetworkPolicy")
    peers, _ = policy["spec"]["ingress"]
    assert {"protocol": "TCP", "port": 8999, "endPort": 9002} in peers["ports"]  # control + rank, 4 ranks
    assert {"protocol": "TCP", "port": 9100, "endPort": 9103} in peers["ports"]  # lane + rank
    prefill = parse_config(render.build_config_map(owner, "g")["data"]["prefill.yaml"])
    assert [prefill.for_rank(r).listen.control_port for r in range(4)] == [8999, 9000, 9001, 9002]
