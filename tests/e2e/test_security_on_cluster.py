"""The operator's side of peer authentication and isolation on the real control plane: the pairing Secret
made once, kept across reconciles and mounted into agent containers only; the NetworkPolicy the API
server accepts, following the spec; specs the CRD's CEL rules refuse; ``InvalidSpec`` instead of pods;
``PeersRefused`` from the agents' ``pdpair.io/PeerRefusals`` reports."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import yaml
from operator_support import (
    condition,
    get,
    pdpair,
    pdpair_yaml,
    pods,
)

from dataplane.harness.waiting import wait_for
from devcluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PEER_REFUSALS = "pdpair.io/PeerRefusals"


def apply(cluster: Cluster, ns: str, text: str, check: bool = True) -> Any:
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=text, check=check)


def secrets(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return list(get(cluster, "secrets", ns, "-l", f"pdpair.io/name={name}")["items"])


def live_pods(cluster: Cluster, ns: str, name: str, count: int) -> list[dict[str, Any]] | None:
    items = [p for p in pods(cluster, ns, name) if not p["metadata"].get("deletionTimestamp")]
    return items if len(items) == count else None


def test_pairing_secret_is_made_once_kept_and_mounted_into_agents_only(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("keyed", 1, 1, engine={"mode": "sidecar"}))
    [secret] = wait_for("the pairing Secret", lambda: secrets(cluster, ns, "keyed"), timeout=60)
    owner = pdpair(cluster, ns, "keyed")["metadata"]["uid"]
    assert secret["metadata"]["name"] == "keyed-pairing" and secret["immutable"] is True
    assert [(r["uid"], r["controller"]) for r in secret["metadata"]["ownerReferences"]] == [(owner, True)]
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) == 32

    for pod in wait_for("2 pods", lambda: live_pods(cluster, ns, "keyed", 2), timeout=90):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["pairing"]["secret"]["secretName"] == "keyed-pairing"
        assert volumes["pairing"]["secret"]["defaultMode"] == 0o400
        mounted = {c["name"]: [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "pairing"]
                   for c in pod["spec"]["containers"]}
        assert mounted == {"agent": ["/etc/pdpair/pairing"], "engine": []}
    [cm] = get(cluster, "configmaps", ns, "-l", "pdpair.io/name=keyed")["items"]
    for role in ("prefill", "decode"):
        auth = yaml.safe_load(cm["data"][f"{role}.yaml"])["auth"]
        assert auth == {"keyFile": "/etc/pdpair/pairing/key", "allowPlainPeers": False}

    # Reconciles (a scale-up patches the ConfigMap and adds pods; an annotation is one more pass)
    # leave the Secret as it was.
    apply(cluster, ns, pdpair_yaml("keyed", 2, 2, engine={"mode": "sidecar"}))
    cluster.kubectl("annotate", "pdpair", "keyed", "-n", ns, "touched=1")
    wait_for("4 pods", lambda: live_pods(cluster, ns, "keyed", 4), timeout=90)
    time.sleep(2)
    [after] = secrets(cluster, ns, "keyed")
    assert after["metadata"]["uid"] == secret["metadata"]["uid"]
    assert base64.b64decode(after["data"]["key"]) == key

    # A deleted Secret is made again, with a new key.
    cluster.kubectl("delete", "secret", "keyed-pairing", "-n", ns)

    def remade() -> dict[str, Any] | None:
        found = secrets(cluster, ns, "keyed")
        return found[0] if found and found[0]["metadata"]["uid"] != secret["metadata"]["uid"] else None

    again = wait_for("a new pairing Secret", remade, timeout=60)
    assert base64.b64decode(again["data"]["key"]) != key


def test_network_policy_is_accepted_and_follows_the_spec(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("fenced", 1, 1))
    policy = wait_for("the NetworkPolicy", lambda: get(
        cluster, "networkpolicies", ns, "-l", "pdpair.io/name=fenced")["items"], timeout=60)[0]
    spec = policy["spec"]
    own = {"matchLabels": {"pdpair.io/child": "pod", "pdpair.io/name": "fenced"}}
    assert spec["podSelector"] == own and spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"][0]["from"] == [{"podSelector": own}]
    assert {"port": 20000, "endPort": 20999, "protocol": "TCP"} in spec["ingress"][0]["ports"]
    assert spec["ingress"][1]["ports"] == [{"port": 9400, "protocol": "TCP"}]
    dry = cluster.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=json.dumps(
        {k: v for k, v in policy.items() if k in ("apiVersion", "kind", "spec")}
        | {"metadata": {"name": "fenced-dry-run"}}))
    assert "created (server dry run)" in dry.stdout

    running = wait_for("2 pods", lambda: live_pods(cluster, ns, "fenced", 2), timeout=90)
    names = sorted(p["metadata"]["name"] for p in running)
    apply(cluster, ns, pdpair_yaml("fenced", 1, 1, security={"networkPolicy": False}))
    wait_for("the NetworkPolicy gone", lambda: not get(
        cluster, "networkpolicies", ns, "-l", "pdpair.io/name=fenced")["items"], timeout=60)
    assert sorted(p["metadata"]["name"] for p in live_pods(cluster, ns, "fenced", 2) or []) == names


@pytest.mark.parametrize(("patch", "message"), [
    ({"ports": {"control": 9400}}, "ports.bootstrap, metrics, control and lane must all differ"),
    ({"ports": {"control": 9000, "lane": 9001}, "prefill": {"replicas": 1, "tensorParallelSize": 2}},
     "ports.control and ports.lane need one port per rank each"),
    ({"ports": {"control": 8997}, "decode": {"replicas": 1, "tensorParallelSize": 4}},
     "ports.bootstrap and ports.metrics must lie outside the ranks' control and lane ports"),
    ({"ports": {"lane": 19999}, "decode": {"replicas": 1, "tensorParallelSize": 2}},
     "the ranks' control and lane ports (port + rank) must lie outside ports.transfer"),
    ({"ports": {"transfer": {"first": 21000, "last": 20000}}}, "ports.transfer.first must not exceed"),
    ({"ports": {"lane": 20500}}, "must lie outside ports.transfer"),
    ({"model": {"name": "m", "kvItemLen": 64, "components": [
        {"name": "c", "stateType": "swa", "itemLens": [4], "numItems": 8}]}},
     "model.kvLayers must be at least 1"),
    ({"model": {"name": "m", "kvItemLen": 64, "kvLayers": 2, "components": [
        {"name": "c", "stateType": "swa", "itemLens": [4, 4], "numItems": 8, "layerIds": [0]}]}},
     "layerIds needs one entry per itemLens entry"),
    ({"model": {"name": "m", "kvItemLen": 64, "kvLayers": 2, "components": [
        {"name": "c", "stateType": "mamba", "itemLens": [4, 4], "numItems": 8, "tpDims": [0, 1, 1]}]}},
     "tpDims needs one entry per itemLens entry"),
    ({"model": {"name": "m", "profile": "pure-kv", "poolPages": 1 << 24}}, "spec.model.poolPages"),
    ({"model": {"name": "m", "kvItemLen": 1 << 40, "kvLayers": 2, "components": [
        {"name": "c", "stateType": "swa", "itemLens": [4], "numItems": 8}]}}, "spec.model.kvItemLen"),
])
def test_specs_asking_for_the_impossible_are_refused_by_the_crd(cluster: Cluster, ns: str,
                                                                patch: dict[str, Any], message: str) -> None:
    doc = yaml.safe_load(pdpair_yaml("bad", 1, 1))
    doc["spec"].update(patch)
    proc = apply(cluster, ns, yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_a_spec_whose_pools_exceed_the_memory_gets_invalid_spec_and_no_pods(cluster: Cluster,
                                                                             ns: str) -> None:
    # pure-kv's first 4 layers at real size, 64-token pages: 16 GiB a rank
    big = {"name": "meta-llama/Llama-3.1-8B-Instruct", "profile": "pure-kv", "poolPages": 1 << 14}
    small = {"replicas": 1, "resources": {"gpus": 0, "memory": "64Mi"}}
    apply(cluster, ns, pdpair_yaml("huge", 1, 1, model=big, prefill=small, decode=small))

    def invalid() -> dict[str, Any] | None:
        cond = condition(pdpair(cluster, ns, "huge"), "InvalidSpec")
        return cond if cond.get("status") == "True" else None

    cond = wait_for("InvalidSpec=True", invalid, timeout=60)
    assert cond["reason"] == "PoolsExceedMemory" and "more than prefill.resources.memory" in cond["message"]
    time.sleep(2)
    assert pods(cluster, ns, "huge") == [] and secrets(cluster, ns, "huge") == []
    events = get(cluster, "events", ns, "--field-selector", "involvedObject.name=huge")["items"]
    assert any(e["reason"] == "InvalidSpecTrue" and e["type"] == "Warning" for e in events)

    roomy = {"replicas": 1, "resources": {"gpus": 0, "memory": "32Gi"}}
    apply(cluster, ns, pdpair_yaml("huge", 1, 1, model=big, prefill=roomy, decode=roomy))
    wait_for("2 pods once the spec fits", lambda: live_pods(cluster, ns, "huge", 2), timeout=90)
    assert condition(pdpair(cluster, ns, "huge"), "InvalidSpec")["status"] == "False"


def test_agents_refusal_reports_become_peers_refused(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("guarded", 1, 1))
    pod = wait_for("2 pods", lambda: live_pods(cluster, ns, "guarded", 2), timeout=90)[0]["metadata"]["name"]
    wait_for("PeersRefused=False", lambda: condition(pdpair(cluster, ns, "guarded"), "PeersRefused")
             .get("status") == "False", timeout=60)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {"conditions": [{
        "type": PEER_REFUSALS, "status": "True", "reason": "BadMac", "lastTransitionTime": now,
        "message": "unauthenticated=1 bad_mac=7 replay=0 foreign_pdpair=2"}]}}
    cluster.kubectl("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=strategic",
                    "-p", json.dumps(body))

    def refused() -> dict[str, Any] | None:
        cond = condition(pdpair(cluster, ns, "guarded"), "PeersRefused")
        return cond if cond.get("status") == "True" else None

    cond = wait_for("PeersRefused=True", refused, timeout=60)
    assert cond["reason"] == "BadMac"
    assert cond["message"] == f"unauthenticated=1 bad_mac=7 replay=0 foreign_pdpair=2 (reported by {pod})"
