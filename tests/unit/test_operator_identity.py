"""The agents' API identity (``identity.py``): each PDPair's own ServiceAccount and RoleBinding, the pod's
token in the agent container only, the engine's restricted securityContext, ``serviceAccountName`` as an
override; the planner creates them before any pod and follows spec changes."""

from __future__ import annotations

from typing import Any

import msgspec
from operator_world import T0, World, make_owner, make_spec
from pdpair_operator import identity, naming, render
from pdpair_operator.planner import Delete, Observed, plan
from pdpair_operator.spec import generation_hash, parse_spec

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod(**spec: Any) -> dict[str, Any]:
    owner = make_owner(**spec)
    return render.build_pod(owner, generation_hash(owner.spec), "prefill", 0)


def mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def test_pod_runs_as_the_pdpairs_own_account_with_the_token_in_the_agent_only() -> None:
    spec = pod(engine={"mode": "sidecar"})["spec"]
    assert spec["serviceAccountName"] == "demo-agent" and spec["automountServiceAccountToken"] is False
    [volume] = [v for v in spec["volumes"] if v["name"] == "api-token"]
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    assert {"key": "ca.crt", "path": "ca.crt"} in sources[1]["configMap"]["items"]
    agent, engine = spec["containers"]
    assert mounts(agent)["api-token"] == TOKEN_DIR and "api-token" not in mounts(engine)
    assert agent["command"][-2:] == ["--service-account-dir", TOKEN_DIR]
    assert "--service-account-dir" not in engine["command"]


def test_a_named_engine_image_gets_a_restricted_security_context_unless_the_spec_gives_one() -> None:
    engine = pod(engine={"image": "sglang:1"})["spec"]["containers"][1]
    assert engine["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "privileged": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    own = {"runAsNonRoot": True, "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}
    engine = pod(engine={"image": "sglang:1", "securityContext": own})["spec"]["containers"][1]
    assert engine["securityContext"] == own
    synthetic = pod(engine={"mode": "sidecar"})["spec"]["containers"][1]
    assert synthetic["securityContext"]["readOnlyRootFilesystem"] is True  # the agent image's own


def test_service_account_and_role_binding_to_the_agent_cluster_role() -> None:
    owner = make_owner()
    account, binding = render.build_agent_identity(owner, "rel-agent")
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "demo-agent"
    assert account["automountServiceAccountToken"] is False
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "rel-agent"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-agent", "namespace": "ns"}]
    for obj in (account, binding):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "owner-uid"
        assert obj["metadata"]["labels"][naming.LABEL_NAME] == "demo"


def test_planner_makes_the_identity_in_the_wave_before_any_pod() -> None:
    first = World(make_owner(p=1, d=1)).step()
    waves = first.create_waves()
    kinds = [[m["kind"] for m in wave] for wave in waves]
    assert {"ServiceAccount", "RoleBinding"} <= set(kinds[0]) and "Pod" not in kinds[0]
    assert all(k == "Pod" for wave in kinds[1:] for k in wave)
    [binding] = [m for m in waves[0] if m["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == identity.DEFAULT_AGENT_CLUSTER_ROLE


def test_an_override_account_replaces_the_operators_own() -> None:
    world = World(make_owner())
    world.step()
    assert ("ServiceAccount", "demo-agent") in world.children
    world.owner = msgspec.structs.replace(
        world.owner, spec=parse_spec(make_spec(serviceAccountName="team-sa")))
    step = world.step()
    assert {(d.kind, d.name) for d in step.deletes} >= {("ServiceAccount", "demo-agent"),
                                                        ("RoleBinding", "demo-agent")}
    assert not [m for m in step.creates if m["kind"] in ("ServiceAccount", "RoleBinding")]
    pods = [m for m in step.creates if m["kind"] == "Pod"]
    assert pods and {p["spec"]["serviceAccountName"] for p in pods} == {"team-sa"}


def test_a_new_agent_cluster_role_replaces_the_role_binding() -> None:
    """A RoleBinding's roleRef is immutable: the planner deletes it; the next pass creates it anew."""
    world = World(make_owner())
    world.step()
    observed = Observed(tuple(world.pods.values()), tuple(world.children.values()))
    step = plan(world.owner, observed, T0, agent_role="other-agent")
    assert Delete("RoleBinding", "demo-agent") in step.deletes
    assert not [m for m in step.creates if m["kind"] == "RoleBinding"]
    assert not [p for p in step.patches if p.kind == "RoleBinding"]
