"""Rendering: owner references, labels, security context, probes, readiness gate, agent config."""

from __future__ import annotations

from typing import Any

import pytest
from operator_world import make_owner
from pdpair_operator import naming, render
from pdpair_operator.spec import generation_hash

from dataplane.config import parse_config


def all_children(backend: str = "nixl") -> list[dict[str, Any]]:
    owner = make_owner(backend=backend)
    gen = generation_hash(owner.spec)
    return [
        render.build_pod(owner, gen, "prefill", 0), render.build_pod(owner, gen, "decode", 3),
        render.build_config_map(owner, gen), render.build_bootstrap_service(owner, gen),
        render.build_headless_service(owner), render.build_metrics_service(owner),
    ]


def test_every_child_has_a_controller_owner_reference_and_owner_labels() -> None:
    for child in all_children():
        [ref] = child["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "pdpair.io/v1alpha1", "kind": "PDPair", "name": "demo",
                       "uid": "owner-uid", "controller": True, "blockOwnerDeletion": True}
        assert child["metadata"]["labels"][naming.LABEL_NAME] == "demo"
        assert child["metadata"]["namespace"] == "ns"
        assert child["metadata"]["annotations"][naming.ANNOTATION_RENDER_HASH]


def test_pod_labels_name_role_index_and_generation() -> None:
    owner = make_owner()
    gen = generation_hash(owner.spec)
    pod = render.build_pod(owner, gen, "decode", 3)
    labels = pod["metadata"]["labels"]
    assert pod["metadata"]["name"] == f"demo-{gen}-decode-3"
    assert (labels[naming.LABEL_ROLE], labels[naming.LABEL_INDEX], labels[naming.LABEL_GENERATION]) == (
        "decode", "3", gen)


def test_pod_runs_the_agent_with_downward_api_env_probe_and_gate() -> None:
    pod = all_children()[0]
    spec = pod["spec"]
    [container] = spec["containers"]
    assert container["command"][:4] == ["pdpair-agent", "run", "--role", "prefill"]
    assert "$(POD_IP)" in container["command"] and "--tp-rank" not in container["command"]  # every rank
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_IP"] == "status.podIP" and env["POD_NAME"] == "metadata.name"
    assert env["POD_NAMESPACE"] == "metadata.namespace"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert spec["readinessGates"] == [{"conditionType": "pdpair.io/TransferReady"}]
    assert spec["restartPolicy"] == "Never"
    [cfg] = [v for v in spec["volumes"] if v["name"] == "agent-config"]
    assert cfg["configMap"]["items"] == [{"key": "prefill.yaml", "path": "agent.yaml"}]


@pytest.mark.parametrize(("backend", "caps"), [("nixl", None), ("mori", ["IPC_LOCK"])])
def test_security_context_is_restrictive_with_only_rdma_caps_for_mori(backend: str, caps: Any) -> None:
    pod = all_children(backend)[0]
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["capabilities"].get("add") == caps
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_gpu_and_rdma_resources() -> None:
    owner = make_owner(prefill={"replicas": 1, "tensorParallelSize": 4,
                                "resources": {"gpuResourceName": "amd.com/gpu",
                                              "rdma": {"resourceName": "rdma/hca", "count": 1}}})
    pod = render.build_pod(owner, "g", "prefill", 0)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["amd.com/gpu"], limits["rdma/hca"]) == ("4", "1")
    none = render.build_pod(make_owner(decode={"replicas": 1, "resources": {"gpus": 0}}), "g", "decode", 0)
    assert set(none["spec"]["containers"][0]["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}


def test_agent_config_carries_generation_and_decode_finds_its_generations_bootstrap() -> None:
    owner = make_owner(p=2, d=3)
    gen = generation_hash(owner.spec)
    cm = render.build_config_map(owner, gen)
    decode = parse_config(cm["data"]["decode.yaml"])
    prefill = parse_config(cm["data"]["prefill.yaml"])
    assert (decode.role, prefill.role) == ("decode", "prefill")
    assert decode.identity.generation == gen == prefill.identity.generation
    assert decode.peer.bootstrap_host == f"demo-bootstrap-{gen}.ns.svc"
    assert (decode.prefill.replicas, decode.decode.replicas) == (2, 3)
    assert decode.model.profile == "qwen3-next"


def test_bootstrap_service_selects_only_its_generations_prefill_and_publishes_not_ready() -> None:
    svc = render.build_bootstrap_service(make_owner(), "abc")
    assert svc["spec"]["selector"] == {naming.LABEL_NAME: "demo", naming.LABEL_KIND: "pod",
                                       naming.LABEL_ROLE: "prefill", naming.LABEL_GENERATION: "abc"}
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["sessionAffinity"] == "ClientIP", "each decode stays on one prefill pod"


def test_generation_hash_ignores_replicas_and_strategy_but_not_image() -> None:
    base = generation_hash(make_owner(p=1, d=1).spec)
    assert generation_hash(make_owner(p=5, d=2, strategy="Recreate").spec) == base
    assert generation_hash(make_owner(image="img:2").spec) != base


def test_reasonless_gate_condition_is_not_an_agent_report() -> None:
    from pdpair_operator.observe import pod_from_body

    def body(reason: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "labels": {naming.LABEL_ROLE: "decode"}},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": naming.TRANSFER_READY, "status": "True", "reason": reason}]}}

    assert pod_from_body(body("")).transfer is None
    assert not pod_from_body(body("")).serving
    assert pod_from_body(body("HandshakeComplete")).serving


def test_transfer_settings_reach_both_roles_agent_config() -> None:
    owner = make_owner(
        transfer={"backend": "nixl", "spinMicroseconds": 250, "heartbeatMisses": 7, "coalesceBytes": 4096}
    )
    cm = render.build_config_map(owner, generation_hash(owner.spec))
    for role in ("prefill", "decode"):
        cfg = parse_config(cm["data"][f"{role}.yaml"])
        assert (cfg.transfer.spin_microseconds, cfg.transfer.heartbeat_misses) == (250, 7)
        assert cfg.transfer.coalesce_bytes == 4096
        assert cfg.listen.lanes


def test_each_role_renders_its_engines_tp_and_dp_for_one_agent_per_pod() -> None:
    """The agent serves every rank of its pod: its config carries the role's TP and DP sizes, and
    the command names no rank."""
    owner = make_owner(prefill={"replicas": 1, "tensorParallelSize": 4},
                       decode={"replicas": 2, "tensorParallelSize": 8, "dataParallelSize": 4})
    cm = render.build_config_map(owner, "g")
    for role in ("prefill", "decode"):
        cfg = parse_config(cm["data"][f"{role}.yaml"])
        cfg.check_ranks()
        assert (cfg.prefill.tp_size, cfg.prefill.dp_size) == (4, 1)
        assert (cfg.decode.tp_size, cfg.decode.dp_size) == (8, 4)
    decode = parse_config(cm["data"]["decode.yaml"])
    assert (decode.tp_size, decode.dp_size, decode.attention_view().tp_size) == (8, 4, 2)
    pod = render.build_pod(owner, "g", "decode", 0)
    assert "--tp-rank" not in pod["spec"]["containers"][0]["command"]


def test_an_invalid_dp_size_is_an_invalid_spec_not_a_crashing_pod() -> None:
    from pdpair_operator.validate import invalid_reason

    owner = make_owner(decode={"replicas": 1, "tensorParallelSize": 2, "dataParallelSize": 4})
    reason, message = invalid_reason(owner, "g") or ("", "")
    assert reason == "AgentConfigRejected" and "dpSize must divide tpSize" in message
    prefill_dp = make_owner(prefill={"replicas": 1, "tensorParallelSize": 2, "dataParallelSize": 2})
    assert "DP attention is served on decode only" in (invalid_reason(prefill_dp, "g") or ("", ""))[1]
